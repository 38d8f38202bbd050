//! The node failing a pod on its own (docs/SEEDS-SPEC.md NODE-49, NODE-50; API-27): past its
//! `activeDeadlineSeconds`, or over a local-storage limit. Pure decisions; the worker measures,
//! asks, and then fails the pod (phase `Failed` with this reason and message, its containers
//! stopped, an event).
//!
//! Local storage is checked as the kubelet's eviction manager checks it, in its order: an
//! `emptyDir` (disk-backed) over its `sizeLimit`; the pod's usage (every container's writable
//! layer and logs, plus its disk-backed emptyDirs) over the sum of its containers'
//! `ephemeral-storage` limits; a container's writable layer and logs over its own limit. The
//! texts are upstream's, trailing space included. Memory-backed emptyDirs are tmpfs and count as
//! memory, not here.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, PodSpec};

/// Why the node failed a pod: the pod's `status.reason` and `status.message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailure {
    pub reason: &'static str,
    pub message: String,
    /// The containers' grace period, when the node overrides the pod's own.
    pub grace: Option<u64>,
    /// Whether the pod gets the `DisruptionTarget` condition (reason `TerminationByKubelet`,
    /// this message): node shutdown and node-pressure eviction, not deadlines or local-storage
    /// limits (upstream passes no condition for those).
    pub disruption: bool,
}

pub const DEADLINE_REASON: &str = "DeadlineExceeded";
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
pub const EVICTED_REASON: &str = "Evicted";

/// How often local storage is measured (the kubelet's eviction loop).
pub const STORAGE_CHECK: Duration = Duration::from_secs(10);

/// When the pod's `activeDeadlineSeconds` (counted from its `startTime`) runs out.
pub fn active_deadline(spec: &PodSpec, start: Option<SystemTime>) -> Option<SystemTime> {
    let secs = u64::try_from(spec.active_deadline_seconds?).ok()?;
    Some(start? + Duration::from_secs(secs))
}

/// The failure for a pod past its deadline at `now`.
pub fn deadline_failure(spec: &PodSpec, start: Option<SystemTime>, now: SystemTime) -> Option<PodFailure> {
    (active_deadline(spec, start)? <= now).then(|| PodFailure {
        reason: DEADLINE_REASON,
        message: DEADLINE_MESSAGE.into(),
        grace: None,
        disruption: false,
    })
}

/// What a pod uses of the node's disk: each running container's writable layer plus logs (by
/// name), each disk-backed emptyDir (by volume name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageUsage {
    pub containers: BTreeMap<String, u64>,
    pub empty_dirs: BTreeMap<String, u64>,
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers.iter().flatten().chain(&spec.containers)
}

fn storage_limit(c: &Container) -> Option<&str> {
    let q = c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage")?;
    Some(q.0.as_str())
}

/// The disk-backed emptyDirs (memory-backed ones are tmpfs and count as memory).
pub fn disk_empty_dirs(spec: &PodSpec) -> impl Iterator<Item = (&str, &EmptyDirVolumeSource)> {
    spec.volumes.iter().flatten().filter_map(|v| {
        let e = v.empty_dir.as_ref()?;
        (e.medium.as_deref() != Some("Memory")).then_some((v.name.as_str(), e))
    })
}

/// The disk-backed emptyDirs with a `sizeLimit`: (volume name, limit text).
fn sized_empty_dirs(spec: &PodSpec) -> impl Iterator<Item = (&str, &str)> {
    disk_empty_dirs(spec).filter_map(|(name, e)| Some((name, e.size_limit.as_ref()?.0.as_str())))
}

/// Whether anything of the pod is limited, i.e. whether measuring it is worth the walk.
pub fn watches_local_storage(spec: &PodSpec) -> bool {
    all_containers(spec).any(|c| storage_limit(c).is_some()) || sized_empty_dirs(spec).next().is_some()
}

/// A quantity as upstream prints it (`%q` of `Quantity.String()`): canonical, keeping binary
/// or decimal suffixes as written.
fn canonical(text: &str) -> Option<String> {
    Some(kcore::quantity::format_bytes(
        kcore::quantity::bytes(text)?,
        kcore::quantity::is_binary(text),
    ))
}

/// The eviction for a pod over a local-storage limit, if any.
pub fn local_storage_failure(spec: &PodSpec, usage: &StorageUsage) -> Option<PodFailure> {
    let evicted = |message: String| {
        // An evicted pod's containers get no grace beyond the minimum (the kubelet's override).
        Some(PodFailure {
            reason: EVICTED_REASON,
            message,
            grace: Some(0),
            disruption: false,
        })
    };
    for (name, limit) in sized_empty_dirs(spec) {
        let (Some(used), Some(max)) = (usage.empty_dirs.get(name), kcore::quantity::bytes(limit)) else {
            continue;
        };
        if max > 0 && *used > max {
            let limit = canonical(limit)?;
            return evicted(format!(
                "Usage of EmptyDir volume {name:?} exceeds the limit {limit:?}. "
            ));
        }
    }
    let pod_limit = kcore::resources::pod_limits(spec).ephemeral_storage;
    if pod_limit > 0 {
        let used: u64 = usage.containers.values().sum::<u64>() + usage.empty_dirs.values().sum::<u64>();
        if used > pod_limit {
            let binary = all_containers(spec)
                .filter_map(storage_limit)
                .next()
                .is_none_or(kcore::quantity::is_binary);
            let limit = kcore::quantity::format_bytes(pod_limit, binary);
            return evicted(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "
            ));
        }
    }
    for c in all_containers(spec) {
        let (Some(limit), Some(used)) = (storage_limit(c), usage.containers.get(&c.name)) else {
            continue;
        };
        if kcore::quantity::bytes(limit).is_some_and(|max| *used > max) {
            let limit = canonical(limit)?;
            return evicted(format!(
                "Container {} exceeded its local ephemeral storage limit {limit:?}. ",
                c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).expect("spec")
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    #[test]
    fn the_deadline_counts_from_the_start() {
        let s = spec(serde_json::json!({"containers": [], "activeDeadlineSeconds": 30}));
        assert_eq!(active_deadline(&s, Some(at(0))), Some(at(30)));
        assert_eq!(deadline_failure(&s, Some(at(0)), at(29)), None);
        let f = deadline_failure(&s, Some(at(0)), at(30)).expect("past");
        assert_eq!(
            (f.reason, f.message.as_str()),
            (DEADLINE_REASON, DEADLINE_MESSAGE)
        );
        assert_eq!(deadline_failure(&s, None, at(100)), None, "not started");
        let none = spec(serde_json::json!({"containers": []}));
        assert_eq!(active_deadline(&none, Some(at(0))), None);
    }

    #[test]
    fn local_storage_limits_in_upstreams_order_and_words() {
        let s = spec(serde_json::json!({
            "containers": [
                {"name": "app", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
                {"name": "side", "resources": {"limits": {"ephemeral-storage": "512Mi"}}},
                {"name": "free"},
            ],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}},
                {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "plain", "emptyDir": {}},
            ],
        }));
        assert!(watches_local_storage(&s));
        let usage = |app: u64, side: u64, free: u64, scratch: u64, ram: u64| StorageUsage {
            containers: [("app", app), ("side", side), ("free", free)]
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            empty_dirs: [("scratch", scratch), ("ram", ram)]
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
        };
        const MI: u64 = 1 << 20;
        let message = |u: StorageUsage| local_storage_failure(&s, &u).map(|f| (f.reason, f.message));
        let evicted = |m: &str| Some((EVICTED_REASON, m.to_string()));
        // Within every limit (a Memory emptyDir over its sizeLimit is memory, not disk).
        assert_eq!(
            message(usage(100 * MI, 100 * MI, 100 * MI, 5 * MI, 50 * MI)),
            None
        );
        // The emptyDir first, even when a container is over too.
        assert_eq!(
            message(usage(2048 * MI, 0, 0, 11 * MI, 0)),
            evicted("Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". ")
        );
        // The pod's total (containers without a limit count too) before any container.
        assert_eq!(
            message(usage(1000 * MI, 500 * MI, 100 * MI, 0, 0)),
            evicted("Pod ephemeral local storage usage exceeds the total limit of containers 1536Mi. ")
        );
        // One container over its own limit, the pod within its total.
        assert_eq!(
            message(usage(10 * MI, 600 * MI, 0, 0, 0)),
            evicted("Container side exceeded its local ephemeral storage limit \"512Mi\". ")
        );
        let unlimited = spec(
            serde_json::json!({"containers": [{"name": "a"}], "volumes": [{"name": "v", "emptyDir": {}}]}),
        );
        assert!(!watches_local_storage(&unlimited));
        assert_eq!(
            local_storage_failure(&unlimited, &usage(u64::MAX / 4, 0, 0, 0, 0)),
            None
        );
    }
}
