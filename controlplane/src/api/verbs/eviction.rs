//! `pods/<name>/eviction` with PodDisruptionBudgets (docs/SEEDS-SPEC.md CTL-46, API-58), as
//! upstream's `EvictionREST.Create`: pods that are Pending, finished or already being deleted
//! go at once; otherwise the one budget whose selector matches the pod must allow a disruption,
//! which is charged to the budget's status (`disruptionsAllowed` down by one, the pod in
//! `disruptedPods`) with a compare-and-swap write before the pod is deleted, so concurrent
//! evictions cannot overdraw it. Every evicted pod gets the `DisruptionTarget` condition
//! (`EvictionByEvictionAPI`) in the write before its deletion.
//!
//! The budget's numbers are the status the disruption controller keeps, once it has written
//! one (`observedGeneration` set); a status older than the budget's spec is a 429 until the
//! controller catches up. Before the controller's first status (or without the controller),
//! the eviction computes the budget from the pods it covers (healthy = Ready and not being
//! deleted, not disrupted in the last two minutes; expected = the covered pods that have not
//! finished), and leaves `observedGeneration` unset so the controller's status takes over.

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

/// Most pods a budget's `disruptedPods` may hold before evictions are refused (upstream's
/// `MaxDisruptedPodSize`).
const MAX_DISRUPTED_PODS: usize = 2000;

/// Upstream's 429 with a `DisruptionBudget` cause.
fn too_many(cause: String, retry_after: Option<u32>) -> ApiError {
    let mut details = json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]});
    if let Some(s) = retry_after {
        details["retryAfterSeconds"] = json!(s);
    }
    ApiError {
        code: 429,
        reason: "TooManyRequests",
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        details: Some(details),
    }
}

fn too_many_requests(pdb_name: &str, desired: i64, current: i64) -> ApiError {
    too_many(
        format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {current} currently"),
        None,
    )
}

/// The budget's status is older than its spec, or a delete raced with the pod becoming ready.
fn still_processing(pdb_name: &str) -> ApiError {
    too_many(
        format!("The disruption budget {pdb_name} is still being processed by the server."),
        Some(10),
    )
}

fn forbidden(pdb_name: &str, why: &str) -> ApiError {
    ApiError {
        code: 403,
        reason: "Forbidden",
        message: format!("poddisruptionbudget.policy \"{pdb_name}\" is forbidden: {why}"),
        details: Some(json!({"name": pdb_name, "group": "policy", "kind": "poddisruptionbudget"})),
    }
}

/// Pending, finished or already being deleted: evicted without looking at budgets (upstream's
/// `canIgnorePDB`).
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Pending" | "Succeeded" | "Failed")
    ) || pod["metadata"]["deletionTimestamp"].is_string()
}

/// Whether the deletion must not race with the pod becoming ready (upstream's
/// `shouldEnforceResourceVersion`): not finished, not being deleted.
fn enforce_revision(pod: &Value) -> bool {
    !matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
        && !pod["metadata"]["deletionTimestamp"].is_string()
}

/// Sets `DisruptionTarget` True (`EvictionByEvictionAPI`) as upstream's `UpdatePodCondition`
/// does; returns whether the pod changed.
fn set_disruption_target(pod: &mut Value, now: &str) -> bool {
    let want = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                      "message": "Eviction API: evicting", "lastTransitionTime": now});
    if !pod["status"]["conditions"].is_array() {
        pod["status"]["conditions"] = json!([]);
    }
    let Some(conditions) = pod["status"]["conditions"].as_array_mut() else {
        return false;
    };
    match conditions.iter_mut().find(|c| c["type"] == "DisruptionTarget") {
        Some(c) => {
            if c["status"] == want["status"]
                && c["reason"] == want["reason"]
                && c["message"] == want["message"]
            {
                return false;
            }
            let keep = c["status"] == "True";
            let transition = c["lastTransitionTime"].clone();
            *c = want;
            if keep && !transition.is_null() {
                c["lastTransitionTime"] = transition;
            }
        }
        None => conditions.insert(0, want),
    }
    true
}

/// What the budget check allows.
enum Verdict {
    /// Delete the pod; with `revision`, only if it did not change since it was read.
    Delete { enforce: bool, pdb: Option<String> },
    /// The budget changed under us: look again.
    Retry,
}

impl Api {
    /// `POST pods/<name>/eviction`.
    pub(crate) async fn evict(&self, t: &Target) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        for _ in 0..5 {
            let (pod, rev) = self.read_object(t.res, Some(&ns), &name).await?;
            crate::api::authz::node_restriction(t.res, None, crate::api::authz::node::Write::Evict(&pod))?;
            let verdict = if can_ignore_budget(&pod) {
                Verdict::Delete {
                    enforce: enforce_revision(&pod),
                    pdb: None,
                }
            } else {
                self.check_budget(t.res, &ns, &pod).await?
            };
            let Verdict::Delete { enforce, pdb } = verdict else {
                continue; // the budget changed under us: look again
            };
            match self.mark_and_delete(t, &ns, &name, enforce.then_some(rev)).await {
                Ok(()) => return Ok(status::success(201)),
                // The pod changed since the budget was checked: a client retry decides again.
                Err(e) if e.code == 409 && enforce => match pdb {
                    Some(p) => return Err(still_processing(&p)),
                    None => continue,
                },
                Err(e) => return Err(e),
            }
        }
        Err(ApiError::conflict(t.res, &name))
    }

    /// Adds the `DisruptionTarget` condition and deletes the pod (upstream's
    /// `addConditionAndDeletePod`); with `revision`, a pod changed since then is a conflict.
    async fn mark_and_delete(
        &self,
        t: &Target,
        ns: &str,
        name: &str,
        revision: Option<i64>,
    ) -> Result<(), ApiError> {
        let (mut pod, rev) = self.read_object(t.res, Some(ns), name).await?;
        if revision.is_some_and(|r| r != rev) {
            return Err(ApiError::conflict(t.res, name));
        }
        let mut current = rev;
        if set_disruption_target(&mut pod, &kcore::time::rfc3339(SystemTime::now())) {
            let stored = self
                .put_at(t.res, t.res.key(Some(ns), name), pod, rev, name)
                .await?;
            current = stored["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(rev);
        }
        let opts = match revision {
            Some(_) => json!({"preconditions": {"resourceVersion": current.to_string()}}),
            None => Value::Null,
        };
        self.delete(t, &opts, &Query::default()).await.map(drop)
    }

    /// The verdict of the one budget covering `pod` (none: delete; more: refused).
    async fn check_budget(&self, pods_res: &Resource, ns: &str, pod: &Value) -> Result<Verdict, ApiError> {
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
        let (pdb, rev, reqs) = match matching.len() {
            0 => {
                return Ok(Verdict::Delete {
                    enforce: false,
                    pdb: None,
                });
            }
            1 => matching.remove(0),
            _ => {
                return Err(ApiError {
                    code: 500,
                    reason: "",
                    message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
                    details: None,
                });
            }
        };
        let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if pdb["status"]["observedGeneration"].is_i64() || pdb["status"]["observedGeneration"].is_u64() {
            return self.charge_status(ns, pod, pdb, rev, pdb_name).await;
        }
        let charged = self.charge_computed(pods_res, ns, pod, pdb, rev, &reqs).await?;
        Ok(match charged {
            Some(enforce) => Verdict::Delete {
                enforce,
                pdb: Some(pdb_name),
            },
            None => Verdict::Retry,
        })
    }

    /// The budget from the controller's status (upstream's `checkAndDecrement`).
    async fn charge_status(
        &self,
        ns: &str,
        pod: &Value,
        mut pdb: Value,
        rev: i64,
        pdb_name: String,
    ) -> Result<Verdict, ApiError> {
        let st = &pdb["status"];
        let num = |k: &str| st[k].as_i64().unwrap_or(0);
        let (current, desired) = (num("currentHealthy"), num("desiredHealthy"));
        if !is_ready(pod) {
            // An unhealthy pod does not count: it goes with AlwaysAllow, or (IfHealthyBudget,
            // the default) while the budget holds.
            let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
            if always || (current >= desired && desired > 0) {
                return Ok(Verdict::Delete {
                    enforce: true,
                    pdb: Some(pdb_name),
                });
            }
        }
        if num("observedGeneration") < pdb["metadata"]["generation"].as_i64().unwrap_or(0) {
            return Err(still_processing(&pdb_name));
        }
        let allowed = num("disruptionsAllowed");
        if allowed < 0 {
            return Err(forbidden(&pdb_name, "pdb disruptions allowed is negative"));
        }
        let disrupted = st["disruptedPods"].as_object().map_or(0, serde_json::Map::len);
        if disrupted > MAX_DISRUPTED_PODS {
            return Err(forbidden(
                &pdb_name,
                "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
            ));
        }
        if allowed == 0 {
            return Err(too_many_requests(&pdb_name, desired, current));
        }
        let now = kcore::time::rfc3339(SystemTime::now());
        pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if allowed - 1 == 0 {
            let generation = pdb["status"]["observedGeneration"].clone();
            set_insufficient(&mut pdb["status"], &now, generation);
        }
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        if !pdb["status"]["disruptedPods"].is_object() {
            pdb["status"]["disruptedPods"] = json!({});
        }
        pdb["status"]["disruptedPods"][pod_name] = json!(now);
        let pdbs = registry::find("policy", "v1", "poddisruptionbudgets")
            .ok_or_else(|| ApiError::internal("poddisruptionbudgets not served"))?;
        let key = pdbs.key(Some(ns), &pdb_name);
        match self.put_at(pdbs, key, pdb, rev, &pdb_name).await {
            Ok(_) => Ok(Verdict::Delete {
                enforce: false,
                pdb: Some(pdb_name),
            }),
            Err(e) if e.code == 409 => Ok(Verdict::Retry),
            Err(e) => Err(e),
        }
    }

    /// The budget computed from the pods it covers, before the controller wrote a status;
    /// Some(enforce the pod's revision) to delete, None when its write lost a race (retry).
    async fn charge_computed(
        &self,
        pods_res: &Resource,
        ns: &str,
        pod: &Value,
        mut pdb: Value,
        rev: i64,
        reqs: &[crate::api::object::selector::Requirement],
    ) -> Result<Option<bool>, ApiError> {
        let covered: Vec<Value> = self
            .store
            .list(&pods_res.namespace_prefix(ns), None, 0)
            .await
            .map_err(store_err)?
            .items
            .iter()
            .filter_map(|kv| decode(kv).ok())
            .filter(|p| labels_match(reqs, Some(&p["metadata"]["labels"])))
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
                return Ok(Some(true));
            }
            return Err(too_many_requests(&pdb_name, b.desired_healthy, b.current_healthy));
        }
        if b.allowed() <= 0 {
            return Err(too_many_requests(&pdb_name, b.desired_healthy, b.current_healthy));
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
        // No observedGeneration: this is not the controller's status, and the next eviction
        // computes again until the controller has written one.
        pdb["status"] = json!({
            "disruptionsAllowed": b.allowed() - 1,
            "currentHealthy": b.current_healthy,
            "desiredHealthy": b.desired_healthy,
            "expectedPods": b.expected,
            "disruptedPods": disrupted,
        });
        let pdbs = registry::find("policy", "v1", "poddisruptionbudgets")
            .ok_or_else(|| ApiError::internal("poddisruptionbudgets not served"))?;
        let key = pdbs.key(Some(ns), &pdb_name);
        match self.put_at(pdbs, key, pdb, rev, &pdb_name).await {
            Ok(_) => Ok(Some(false)),
            Err(e) if e.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// `DisruptionAllowed` False (`InsufficientPods`), the transition time moving only with the
/// status (upstream's `UpdateDisruptionAllowedCondition` after the last allowed disruption).
fn set_insufficient(status: &mut Value, now: &str, generation: Value) {
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let Some(conditions) = status["conditions"].as_array_mut() else {
        return;
    };
    let want = json!({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                      "message": "", "observedGeneration": generation, "lastTransitionTime": now});
    match conditions.iter_mut().find(|c| c["type"] == "DisruptionAllowed") {
        Some(c) => {
            let transition = c["lastTransitionTime"].clone();
            let same_status = c["status"] == "False";
            *c = want;
            if same_status && !transition.is_null() {
                c["lastTransitionTime"] = transition;
            }
        }
        None => conditions.push(want),
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
