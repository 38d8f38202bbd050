//! The PodDisruptionBudget status (docs/SEEDS-SPEC.md CTL-44, CTL-45), a pure function of the
//! budget, the pods it selects, the scale of their controllers and the time (upstream's
//! `trySync`): expected pods (the owners' replicas through controller references; the pods
//! themselves for an integer `minAvailable`), desired and current healthy pods, disruptions
//! allowed, the pods recently disrupted through the eviction API (counted as gone for two
//! minutes), the `DisruptionAllowed` condition, and `observedGeneration`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kcore::labels::{labels_of, selector_matches};

use crate::controllers::podutil::is_ready;

/// How long a pod in `disruptedPods` counts as gone before its deletion is seen (upstream's
/// `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a `DisruptionTarget` condition may stand on a pod that is not being deleted
/// (upstream's `stalePodDisruptionTimeout`).
pub const STALE_DISRUPTION_TIMEOUT: Duration = Duration::from_secs(120);
/// The condition the controller keeps.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";

/// Why a budget's expected pod count cannot be known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PdbError {
    #[error("invalid value for IntOrString: invalid type: string is not a percentage")]
    NotPercentage,
    #[error("invalid value {0:?}: strconv.Atoi: parsing {1:?}: invalid syntax")]
    BadPercentage(String, String),
    #[error("found no controllers for pod {0:?}")]
    NoController(String),
    #[error("{0}")]
    Finder(String),
}

/// What a pod's controller reference resolved to (keyed by the reference's uid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scale {
    /// The controller that counts (a Deployment for the pods of its ReplicaSets), and its
    /// replicas.
    Found { uid: String, replicas: i32 },
    /// Nothing with that uid.
    Missing,
    /// The lookup failed.
    Failed(String),
}

/// Expected and desired healthy pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub expected: i32,
    pub desired: i32,
    /// Selected pods without a controller (only counted for an integer `minAvailable`).
    pub unmanaged: Vec<String>,
}

/// `v` as a count of `total` (upstream's `GetScaledValueFromIntOrPercent`, rounding up).
pub fn scaled(v: &IntOrString, total: i32) -> Result<i32, PdbError> {
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let pct = s.strip_suffix('%').ok_or(PdbError::NotPercentage)?;
            let pct: i64 = pct
                .parse()
                .map_err(|_| PdbError::BadPercentage(s.clone(), pct.to_string()))?;
            let n = (pct * i64::from(total) + 99).div_euclid(100);
            Ok(i32::try_from(n).unwrap_or(i32::MAX))
        }
    }
}

/// The pods of `namespace` a budget selects: a missing selector selects none, an empty one all.
pub fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    pod.metadata.namespace == pdb.metadata.namespace
        && pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|sel| selector_matches(sel, labels_of(&pod.metadata.labels)))
}

/// The controller reference of a pod.
pub fn controller_of(p: &Pod) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// The expected pod count from the controllers' scale (upstream's `getExpectedScale`).
fn expected_scale(
    pods: &[Arc<Pod>],
    scales: &HashMap<String, Scale>,
) -> Result<(i32, Vec<String>), PdbError> {
    let mut by_controller: HashMap<&str, i32> = HashMap::new();
    let mut unmanaged = Vec::new();
    for p in pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let Some(r) = controller_of(p) else {
            unmanaged.push(name);
            continue;
        };
        match scales.get(&r.uid) {
            Some(Scale::Found { uid, replicas }) => {
                by_controller.insert(uid, *replicas);
            }
            Some(Scale::Failed(e)) => return Err(PdbError::Finder(e.clone())),
            Some(Scale::Missing) | None => return Err(PdbError::NoController(name)),
        }
    }
    Ok((by_controller.values().sum(), unmanaged))
}

/// Expected and desired healthy pods (upstream's `getExpectedPodCount`).
pub fn expected_pods(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    scales: &HashMap<String, Scale>,
) -> Result<Expected, PdbError> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let mut out = Expected {
        expected: 0,
        desired: 0,
        unmanaged: Vec::new(),
    };
    if let Some(max) = &spec.max_unavailable {
        let (expected, unmanaged) = expected_scale(pods, scales)?;
        let max = scaled(max, expected)?;
        out = Expected {
            expected,
            desired: (expected - max).max(0),
            unmanaged,
        };
    } else if let Some(min) = &spec.min_available {
        match min {
            IntOrString::Int(i) => {
                out.desired = *i;
                out.expected = i32::try_from(pods.len()).unwrap_or(i32::MAX);
            }
            IntOrString::String(_) => {
                let (expected, unmanaged) = expected_scale(pods, scales)?;
                out = Expected {
                    expected,
                    desired: scaled(min, expected)?,
                    unmanaged,
                };
            }
        }
    }
    Ok(out)
}

fn timeout() -> chrono::Duration {
    chrono::Duration::from_std(DELETION_TIMEOUT).unwrap_or(chrono::Duration::MAX)
}

/// Pending disruptions, when to look again, and the pods whose deletion did not happen.
pub type Disrupted = (BTreeMap<String, Time>, Option<DateTime<Utc>>, Vec<Arc<Pod>>);

/// The budget's `disruptedPods` still pending (the pod exists, is not being deleted yet, and
/// was disrupted less than two minutes ago), when to look again, and the pods that were
/// expected to be deleted but were not (upstream's `buildDisruptedPodMap`).
pub fn disrupted_pods(pdb: &PodDisruptionBudget, pods: &[Arc<Pod>], now: DateTime<Utc>) -> Disrupted {
    let mut kept = BTreeMap::new();
    let mut recheck: Option<DateTime<Utc>> = None;
    let mut not_deleted = Vec::new();
    let Some(old) = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()) else {
        return (kept, recheck, not_deleted);
    };
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let Some(at) = old.get(&name) else { continue };
        let expected = at.0 + timeout();
        if expected < now {
            not_deleted.push(p.clone());
        } else {
            recheck = Some(recheck.map_or(expected, |r| r.min(expected)));
            kept.insert(name, at.clone());
        }
    }
    (kept, recheck, not_deleted)
}

/// Ready pods not being deleted and not recently disrupted (upstream's `countHealthyPods`).
pub fn current_healthy(pods: &[Arc<Pod>], disrupted: &BTreeMap<String, Time>, now: DateTime<Utc>) -> i32 {
    let n = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            disrupted
                .get(p.metadata.name.as_deref().unwrap_or_default())
                .is_none_or(|t| t.0 + timeout() <= now)
        })
        .filter(|p| is_ready(p))
        .count();
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Sets condition `type_` (upstream's `meta.SetStatusCondition`: the transition time moves
/// only with the status).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: DateTime<Utc>,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.status = status.into();
                c.last_transition_time = Time(now);
            }
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation,
            last_transition_time: Time(now),
        }),
    }
}

/// `DisruptionAllowed` from `disruptionsAllowed` (upstream's `UpdateDisruptionAllowedCondition`).
pub fn update_allowed_condition(status: &mut PodDisruptionBudgetStatus, now: DateTime<Utc>) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let (s, reason) = if status.disruptions_allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    set_condition(
        conditions,
        DISRUPTION_ALLOWED,
        s,
        reason,
        "",
        status.observed_generation,
        now,
    );
}

fn conditions_up_to_date(pdb: &PodDisruptionBudget) -> bool {
    let Some(st) = pdb.status.as_ref() else {
        return false;
    };
    let Some(c) = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_ALLOWED)
    else {
        return false;
    };
    if st.observed_generation != pdb.metadata.generation {
        return false;
    }
    if st.disruptions_allowed > 0 {
        c.status == "True" && c.reason == "SufficientPods"
    } else {
        c.status == "False" && c.reason == "InsufficientPods"
    }
}

/// The status to write, or None when the budget already has it (upstream's
/// `updatePdbStatus`). No disruption is allowed while no pod is expected, so a budget whose
/// first pods appear before this controller saw them is safe.
pub fn next_status(
    pdb: &PodDisruptionBudget,
    current: i32,
    desired: i32,
    expected: i32,
    disrupted: BTreeMap<String, Time>,
    now: DateTime<Utc>,
) -> Option<PodDisruptionBudgetStatus> {
    let mut allowed = current - desired;
    if expected <= 0 || allowed <= 0 {
        allowed = 0;
    }
    let old = pdb.status.clone().unwrap_or_default();
    let same_disrupted = old.disrupted_pods.clone().unwrap_or_default() == disrupted;
    if old.current_healthy == current
        && old.desired_healthy == desired
        && old.expected_pods == expected
        && old.disruptions_allowed == allowed
        && same_disrupted
        && old.observed_generation == pdb.metadata.generation
        && conditions_up_to_date(pdb)
    {
        return None;
    }
    let mut status = PodDisruptionBudgetStatus {
        current_healthy: current,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: Some(disrupted),
        observed_generation: pdb.metadata.generation,
        conditions: old.conditions,
    };
    update_allowed_condition(&mut status, now);
    Some(status)
}

/// The status after a failed sync (upstream's `failSafe`): no disruption allowed, and
/// `DisruptionAllowed` False with reason `SyncFailed` and the error.
pub fn fail_safe_status(
    pdb: &PodDisruptionBudget,
    error: &str,
    now: DateTime<Utc>,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    let generation = status.observed_generation;
    set_condition(
        status.conditions.get_or_insert_with(Vec::new),
        DISRUPTION_ALLOWED,
        "False",
        "SyncFailed",
        error,
        generation,
        now,
    );
    status
}

/// How long until a pod's `DisruptionTarget` condition is stale (zero: now), or None when it
/// has none to clear: not being deleted, True, not set by the kubelet, not finished (upstream's
/// `nonTerminatingPodHasStaleDisruptionCondition`).
pub fn stale_disruption_in(pod: &Pod, now: DateTime<Utc>) -> Option<Duration> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let c = status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")?;
    if c.status != "True" || c.reason.as_deref() == Some("TerminationByKubelet") {
        return None;
    }
    let since = c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now);
    let stale_at =
        since + chrono::Duration::from_std(STALE_DISRUPTION_TIMEOUT).unwrap_or(chrono::Duration::MAX);
    Some((stale_at - now).to_std().unwrap_or(Duration::ZERO))
}

/// A label selector as Go's `%v` prints it (the text of upstream's `UnmanagedPods` event).
pub fn go_selector(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else {
        return "nil".into();
    };
    let labels: String = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {v},"))
        .collect();
    let exprs: String = sel
        .match_expressions
        .iter()
        .flatten()
        .map(|e| {
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                e.key,
                e.operator,
                e.values.as_deref().unwrap_or_default().join(" ")
            )
        })
        .collect();
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}"
    )
}
