//! `pods/<name>/eviction` with PodDisruptionBudgets (docs/SEEDS-SPEC.md CTL-46, API-58): pods that are
//! Pending, finished or already being deleted go at once; otherwise the one budget whose
//! selector matches the pod must allow a disruption, which is charged to the budget's status
//! (`disruptionsAllowed` down by one, the pod in `disruptedPods`) with a compare-and-swap write
//! before the pod is deleted, so concurrent evictions cannot overdraw it. There is no disruption
//! controller yet: each eviction computes the budget from the pods it covers (healthy = Ready and
//! not being deleted, not disrupted in the last two minutes; expected = the covered pods that
//! have not finished).

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::object::selector::{labels_match, selector_requirements};
use crate::api::object::stored::{decode, store_err};
use crate::api::registry::{self, Resource};
use crate::api::request::{Query, Target};
use crate::api::status::{self, ApiError};

/// How long a disrupted pod counts as gone before its deletion is seen.
const DISRUPTION_WINDOW_SECS: i64 = 120;

/// What a budget says about one more disruption.
#[derive(Debug, PartialEq, Eq)]
struct Budget {
    expected: i64,
    current_healthy: i64,
    desired_healthy: i64,
}

impl Budget {
    fn allowed(&self) -> i64 {
        (self.current_healthy - self.desired_healthy).max(0)
    }
}

/// `minAvailable`/`maxUnavailable` as a pod count of `expected` (percentages round up).
fn count(v: &Value, expected: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * expected + 99) / 100)
        }
        _ => None,
    }
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn budget(pdb: &Value, pods: &[Value], now: i64) -> Budget {
    let recently_disrupted = |name: &str| {
        pdb["status"]["disruptedPods"][name]
            .as_str()
            .and_then(kcore::time::parse_rfc3339)
            .is_some_and(|t| now - t < DISRUPTION_WINDOW_SECS)
    };
    let live: Vec<&Value> = pods
        .iter()
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .collect();
    let expected = live.len() as i64;
    let current_healthy = live
        .iter()
        .filter(|p| {
            is_ready(p)
                && !p["metadata"]["deletionTimestamp"].is_string()
                && !recently_disrupted(p["metadata"]["name"].as_str().unwrap_or_default())
        })
        .count() as i64;
    let spec = &pdb["spec"];
    let desired_healthy = match (
        count(&spec["minAvailable"], expected),
        count(&spec["maxUnavailable"], expected),
    ) {
        (Some(min), _) => min,
        (None, Some(max)) => (expected - max).max(0),
        (None, None) => expected,
    };
    Budget {
        expected,
        current_healthy,
        desired_healthy,
    }
}

fn too_many_requests(pdb_name: &str, b: &Budget) -> ApiError {
    ApiError {
        code: 429,
        reason: "TooManyRequests",
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        details: Some(json!({"causes": [{
            "reason": "DisruptionBudget",
            "message": format!(
                "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                b.desired_healthy, b.current_healthy
            ),
        }]})),
    }
}

impl Api {
    /// `POST pods/<name>/eviction`.
    pub(crate) async fn evict(&self, t: &Target) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        for _ in 0..5 {
            let (pod, _) = self.read_object(t.res, Some(&ns), &name).await?;
            let exempt = matches!(
                pod["status"]["phase"].as_str(),
                Some("Pending" | "Succeeded" | "Failed")
            ) || pod["metadata"]["deletionTimestamp"].is_string();
            if !exempt && !self.charge_budget(t.res, &ns, &pod).await? {
                continue; // the budget changed under us: look again
            }
            self.delete(t, &Value::Null, &Query::default()).await?;
            return Ok(status::success(201));
        }
        Err(ApiError::conflict(t.res, &name))
    }

    /// Checks and charges the pod's budget; false when its write lost a race (retry).
    async fn charge_budget(&self, pods_res: &Resource, ns: &str, pod: &Value) -> Result<bool, ApiError> {
        let pdbs = registry::find("policy", "v1", "poddisruptionbudgets")
            .ok_or_else(|| ApiError::internal("poddisruptionbudgets not served"))?;
        let page = self
            .store
            .list(&pdbs.namespace_prefix(ns), None, 0)
            .await
            .map_err(store_err)?;
        let labels = &pod["metadata"]["labels"];
        let mut matching = Vec::new();
        for kv in &page.items {
            let pdb = decode(kv)?;
            let reqs = selector_requirements(&pdb["spec"]["selector"]);
            if !reqs.is_empty() && labels_match(&reqs, Some(labels)) {
                matching.push((pdb, kv.mod_revision, reqs));
            }
        }
        let (mut pdb, rev, reqs) = match matching.len() {
            0 => return Ok(true),
            1 => matching.remove(0),
            _ => {
                return Err(ApiError::internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
        };
        let covered: Vec<Value> = self
            .store
            .list(&pods_res.namespace_prefix(ns), None, 0)
            .await
            .map_err(store_err)?
            .items
            .iter()
            .filter_map(|kv| decode(kv).ok())
            .filter(|p| labels_match(&reqs, Some(&p["metadata"]["labels"])))
            .collect();
        let now_t = SystemTime::now();
        let now = kcore::time::unix_seconds(now_t);
        let b = budget(&pdb, &covered, now);
        let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if !is_ready(pod) {
            // An unhealthy pod: AlwaysAllow, or IfHealthyBudget (the default) while the budget holds.
            let policy = pdb["spec"]["unhealthyPodEvictionPolicy"]
                .as_str()
                .unwrap_or("IfHealthyBudget");
            if policy == "AlwaysAllow" || b.current_healthy >= b.desired_healthy {
                return Ok(true);
            }
            return Err(too_many_requests(&pdb_name, &b));
        }
        if b.allowed() <= 0 {
            return Err(too_many_requests(&pdb_name, &b));
        }
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let mut disrupted = pdb["status"]["disruptedPods"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        disrupted.retain(|_, t| {
            t.as_str()
                .and_then(kcore::time::parse_rfc3339)
                .is_some_and(|t| now - t < DISRUPTION_WINDOW_SECS)
        });
        disrupted.insert(pod_name.to_string(), json!(kcore::time::rfc3339(now_t)));
        pdb["status"] = json!({
            "observedGeneration": pdb["metadata"]["generation"].clone(),
            "disruptionsAllowed": b.allowed() - 1,
            "currentHealthy": b.current_healthy,
            "desiredHealthy": b.desired_healthy,
            "expectedPods": b.expected,
            "disruptedPods": disrupted,
        });
        let key = pdbs.key(Some(ns), &pdb_name);
        match self.put_at(pdbs, key, &pdb, rev, &pdb_name).await {
            Ok(_) => Ok(true),
            Err(e) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Value {
        json!({"metadata": {"name": name}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    #[test]
    fn budgets_from_min_available_and_max_unavailable() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", false)];
        let min2 = json!({"spec": {"minAvailable": 2}});
        assert_eq!(
            budget(&min2, &pods, 0),
            Budget {
                expected: 3,
                current_healthy: 2,
                desired_healthy: 2
            }
        );
        let pct = json!({"spec": {"minAvailable": "50%"}});
        assert_eq!(budget(&pct, &pods, 0).desired_healthy, 2, "percentages round up");
        let max1 = json!({"spec": {"maxUnavailable": 1}});
        assert_eq!(budget(&max1, &pods, 0).allowed(), 0);
        let recently =
            json!({"spec": {"minAvailable": 1}, "status": {"disruptedPods": {"a": "1970-01-01T00:01:00Z"}}});
        assert_eq!(
            budget(&recently, &pods, 100).current_healthy,
            1,
            "a disrupted pod is not counted"
        );
        assert_eq!(
            budget(&recently, &pods, 500).current_healthy,
            2,
            "after the window it is again"
        );
    }
}
