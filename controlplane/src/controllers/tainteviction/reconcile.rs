//! The taint eviction decision (docs/SEEDS-SPEC.md CTL-40), a pure function of a pod, its
//! node's NoExecute taints, the eviction already planned for the pod and the time: evict now
//! (a taint it does not tolerate), at the end of the shortest `tolerationSeconds` of the
//! tolerations it uses, never (tolerated for ever), or cancel what was planned (the taints or
//! the pod's tolerations changed in time).

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};
use kcore::taints::tolerates;

/// The eviction planned for one pod (upstream's timed worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planned {
    /// Delete at `fire`; planned at `created`.
    At {
        created: DateTime<Utc>,
        fire: DateTime<Utc>,
    },
    /// Deleted: not planned again until cancelled (the taints or tolerations change).
    Done,
}

/// What to do with a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep what is planned (or that nothing is).
    Keep,
    /// Forget the planned eviction (a `Cancelling deletion` event when one was pending).
    Cancel,
    /// Delete the pod now; `cancelled` when a pending eviction was replaced by this one.
    Evict { cancelled: bool },
    /// Delete the pod at `fire` (requeue until then).
    Wait {
        created: DateTime<Utc>,
        fire: DateTime<Utc>,
    },
}

/// A node's NoExecute taints.
pub fn noexecute(taints: &[Taint]) -> Vec<Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .cloned()
        .collect()
}

/// The tolerations used for each taint, or None when a taint is not tolerated (upstream's
/// `GetMatchingTolerations`).
pub fn matching_tolerations<'a>(
    taints: &[Taint],
    tolerations: &'a [Toleration],
) -> Option<Vec<&'a Toleration>> {
    taints
        .iter()
        .map(|taint| tolerations.iter().find(|t| tolerates(t, taint)))
        .collect()
}

/// How long the used tolerations allow: the shortest `tolerationSeconds` (zero or less: none;
/// no tolerations used: none), None when they all tolerate for ever.
pub fn toleration_time(used: &[&Toleration]) -> Option<Duration> {
    if used.is_empty() {
        return Some(Duration::zero());
    }
    let mut min: Option<i64> = None;
    for t in used {
        if let Some(s) = t.toleration_seconds {
            if s <= 0 {
                return Some(Duration::zero());
            }
            min = Some(min.map_or(s, |m| m.min(s)));
        }
    }
    min.map(Duration::seconds)
}

/// The decision for `pod` given its node's taints (None: the node is not known) and what is
/// planned (upstream's `processPodOnNode`). A pending eviction keeps its time when the pod is
/// seen again; once done it is not repeated until cancelled.
pub fn decide(
    pod: &Pod,
    node_taints: Option<&[Taint]>,
    planned: Option<Planned>,
    now: DateTime<Utc>,
) -> Decision {
    let Some(node_taints) = node_taints else {
        // The node is gone (or not seen yet): what was planned still happens, as upstream's
        // timed worker still fires.
        return match planned {
            Some(Planned::At { fire, .. }) if fire <= now => Decision::Evict { cancelled: false },
            Some(Planned::At { created, fire }) => Decision::Wait { created, fire },
            _ => Decision::Keep,
        };
    };
    let taints = noexecute(node_taints);
    if taints.is_empty() {
        return if planned.is_some() {
            Decision::Cancel
        } else {
            Decision::Keep
        };
    }
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let Some(used) = matching_tolerations(&taints, tolerations) else {
        return match planned {
            Some(Planned::Done) => Decision::Keep,
            Some(Planned::At { .. }) => Decision::Evict { cancelled: true },
            None => Decision::Evict { cancelled: false },
        };
    };
    let Some(allowed) = toleration_time(&used) else {
        return if planned.is_some() {
            Decision::Cancel
        } else {
            Decision::Keep
        };
    };
    match planned {
        Some(Planned::Done) => Decision::Keep,
        Some(Planned::At { fire, .. }) if fire <= now => Decision::Evict { cancelled: false },
        Some(Planned::At { created, fire }) => Decision::Wait { created, fire },
        None if allowed <= Duration::zero() => Decision::Evict { cancelled: false },
        None => Decision::Wait {
            created: now,
            fire: now + allowed,
        },
    }
}
