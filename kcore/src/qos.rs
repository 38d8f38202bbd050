//! A pod's QoS class, its containers' `oom_score_adj` and its cgroup values: Kubernetes policy,
//! decided here once for the API server (which writes `status.qosClass` at creation) and the
//! agent (which hands the runtime numbers, as the kubelet does over CRI).
//!
//! The rules are upstream's (docs/SEEDS-SPEC.md NODE-36, NODE-44, NODE-45):
//! - **QoS** (`ComputePodQOS`): only cpu and memory count, and only quantities above zero,
//!   compared by value (`1` equals `1000m`). With pod-level `spec.resources` (cpu or memory set)
//!   the pod's own requests and limits decide; otherwise every container, init containers
//!   included: BestEffort when nothing is requested or limited; Guaranteed when every container
//!   limits both cpu and memory and the summed requests equal the summed limits; Burstable
//!   otherwise. `GetPodQOS` prefers the class already in `status.qosClass`.
//! - **`oom_score_adj`** (`GetContainerOOMScoreAdjust`): node-critical pods and Guaranteed pods
//!   −997, BestEffort 1000, Burstable `1000 − 1000 × memoryRequest / nodeMemory` (plus the pod-level
//!   memory request not allotted to containers, spread evenly over them), a sidecar never above the
//!   smallest regular container's score, then clamped to [3, 999]. (The pause process's −998 is
//!   the runtime's own choice, as containerd's.)
//! - **Pod cgroup** (`ResourceConfigForPod`): weight from the pod's effective cpu request; a
//!   Guaranteed pod's slice is limited by its cpu and memory limits; a Burstable pod's only for a
//!   resource every container (init containers included) limits, or the pod itself does; a
//!   BestEffort pod's gets the minimum weight and no limits.
//!
//! Pod-level resources are honoured as with the `PodLevelResources` gate on (NODE-44).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;
use crate::resources;

/// `oom_score_adj` of Guaranteed and node-critical containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
/// `oom_score_adj` of the node's own daemons, the agent and the runtime (the kubelet's
/// `KubeletOOMScoreAdj`, and what containerd's packaging gives containerd): under memory
/// pressure the kernel kills pods' processes, pause (−998) and critical pods (−997) last, and
/// the daemons that would restart them never first.
pub const NODE_DAEMON_OOM_SCORE_ADJ: i32 = -999;
/// `oom_score_adj` of BestEffort containers.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i32 = 1000;
/// Priorities from here up are critical (`system-cluster-critical` is 2,000,000,000).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The priority class of pods the node needs to work at all.
pub const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The `status.qosClass` value.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    /// A `status.qosClass` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Guaranteed" => Some(QosClass::Guaranteed),
            "Burstable" => Some(QosClass::Burstable),
            "BestEffort" => Some(QosClass::BestEffort),
            _ => None,
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resources QoS looks at.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Sums of cpu and memory above zero, in billionths.
#[derive(Debug, Default)]
struct Sums {
    cpu: Option<u128>,
    memory: Option<u128>,
}

impl Sums {
    fn slot(&mut self, name: &str) -> Option<&mut Option<u128>> {
        match name {
            "cpu" => Some(&mut self.cpu),
            "memory" => Some(&mut self.memory),
            _ => None,
        }
    }

    /// Adds the positive cpu and memory quantities of `list`; returns which resources it had.
    fn add(&mut self, list: Option<&BTreeMap<String, Quantity>>) -> [bool; 2] {
        let mut found = [false; 2];
        for (name, q) in list.into_iter().flatten() {
            let Some(v) = quantity::nanos(&q.0).filter(|v| *v > 0) else {
                continue;
            };
            if let Some(slot) = self.slot(name) {
                *slot = Some(slot.unwrap_or(0).saturating_add(v));
                found[usize::from(name == "memory")] = true;
            }
        }
        found
    }

    fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }

    fn len(&self) -> usize {
        usize::from(self.cpu.is_some()) + usize::from(self.memory.is_some())
    }
}

/// Whether pod-level `spec.resources` sets cpu or memory (upstream's `IsPodLevelResourcesSet`).
pub fn pod_level_resources_set(spec: &PodSpec) -> bool {
    spec.resources.as_ref().is_some_and(|r| {
        [r.requests.as_ref(), r.limits.as_ref()]
            .into_iter()
            .flatten()
            .any(|l| l.keys().any(|k| QOS_RESOURCES.contains(&k.as_str())))
    })
}

/// Whether pod-level requests set cpu or memory (upstream's `IsPodLevelRequestsSet`).
fn pod_level_requests_set(spec: &PodSpec) -> bool {
    spec.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|l| l.keys().any(|k| QOS_RESOURCES.contains(&k.as_str())))
}

/// The QoS class of a pod spec (upstream's `ComputePodQOS`).
pub fn compute_qos_class(spec: &PodSpec) -> QosClass {
    let mut requests = Sums::default();
    let mut limits = Sums::default();
    let mut guaranteed = true;
    let mut account = |r: Option<&ResourceRequirements>, limits_must_be_complete: bool| {
        requests.add(r.and_then(|r| r.requests.as_ref()));
        let l = r.and_then(|r| r.limits.as_ref());
        let found = limits.add(l);
        let has_limits = l.is_some_and(|l| !l.is_empty());
        if (limits_must_be_complete || has_limits) && found != [true, true] {
            guaranteed = false;
        }
    };
    if pod_level_resources_set(spec) {
        // The pod's own limits must cover cpu and memory when it has any.
        account(spec.resources.as_ref(), false);
    } else {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            account(c.resources.as_ref(), true);
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    let equal = |r: Option<u128>, l: Option<u128>| r.is_none() || r == l;
    if guaranteed
        && equal(requests.cpu, limits.cpu)
        && equal(requests.memory, limits.memory)
        && requests.len() == limits.len()
    {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The QoS class of a pod: `status.qosClass` when the API set it, else computed (upstream's
/// `GetPodQOS`).
pub fn pod_qos_class(pod: &Pod) -> QosClass {
    pod.status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .and_then(QosClass::parse)
        .unwrap_or_else(|| pod.spec.as_ref().map_or(QosClass::BestEffort, compute_qos_class))
}

/// Static pods (from a file, not the API) and mirror pods are critical by origin.
fn is_static_or_mirror(pod: &Pod) -> bool {
    let Some(a) = pod.metadata.annotations.as_ref() else {
        return false;
    };
    a.get("kubernetes.io/config.source").is_some_and(|s| s != "api")
        || a.contains_key("kubernetes.io/config.mirror")
}

/// Critical pods: static, mirror, or of a critical priority (upstream's `IsCriticalPod`).
pub fn is_critical_pod(pod: &Pod) -> bool {
    is_static_or_mirror(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Critical pods of class `system-node-critical` (upstream's `IsNodeCriticalPod`).
pub fn is_node_critical_pod(pod: &Pod) -> bool {
    is_critical_pod(pod)
        && pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()) == Some(SYSTEM_NODE_CRITICAL)
}

fn memory_request(c: &Container) -> i128 {
    crate::resources::container_request(c, "memory")
        .and_then(|q| quantity::bytes(&q.0))
        .map_or(0, i128::from)
}

/// The pod-level memory request not allotted to containers, per container (upstream's
/// `remainingPodMemReqPerContainer`).
fn unallotted_memory_per_container(spec: &PodSpec) -> i128 {
    let pod_memory = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .and_then(|q| quantity::bytes(&q.0))
        .unwrap_or(0);
    if pod_memory == 0 {
        return 0;
    }
    let containers = spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len);
    let allotted = resources::aggregate_container_requests(spec).memory;
    (i128::from(pod_memory) - i128::from(allotted)) / i128::try_from(containers.max(1)).unwrap_or(1)
}

/// `oom_score_adj` of `container` of `pod` on a node with `memory_capacity` bytes (upstream's
/// `GetContainerOOMScoreAdjust`).
pub fn container_oom_score_adj(pod: &Pod, container: &Container, memory_capacity: u64) -> i32 {
    if is_node_critical_pod(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod_qos_class(pod) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    let Some(spec) = pod.spec.as_ref() else {
        return BEST_EFFORT_OOM_SCORE_ADJ - 1;
    };
    let capacity = i128::from(memory_capacity.max(1));
    let extra = if pod_level_requests_set(spec) {
        unallotted_memory_per_container(spec)
    } else {
        0
    };
    let score = |request: i128| 1000 - (1000 * (request + extra)) / capacity;
    let mut adj = score(memory_request(container));
    // A sidecar is killed no later than the regular container that requests least.
    let is_sidecar = container.restart_policy.as_deref() == Some("Always")
        && spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == container.name);
    if is_sidecar && let Some(min) = spec.containers.iter().map(memory_request).min() {
        adj = adj.min(score(min));
    }
    // Above Guaranteed pods using all their memory (1000 − 997), below BestEffort.
    let floor = i128::from(1000 + GUARANTEED_OOM_SCORE_ADJ);
    let adj = if adj < floor {
        floor
    } else if adj == i128::from(BEST_EFFORT_OOM_SCORE_ADJ) {
        adj - 1
    } else {
        adj
    };
    i32::try_from(adj).unwrap_or(BEST_EFFORT_OOM_SCORE_ADJ - 1)
}

/// A pod's cgroup values in Kubernetes units (the runtime turns them into file values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCgroup {
    pub qos: QosClass,
    /// The pod's effective cpu request (millicores); 0 for BestEffort pods (minimum weight).
    pub cpu_request_milli: u64,
    /// The pod's cpu limit (millicores) when its slice gets one.
    pub cpu_limit_milli: Option<u64>,
    /// The pod's memory limit (bytes) when its slice gets one.
    pub memory_limit: Option<u64>,
}

/// The pod slice's values (upstream's `ResourceConfigForPod`, cpu quota enforced).
pub fn pod_cgroup(pod: &Pod) -> PodCgroup {
    let qos = pod_qos_class(pod);
    let Some(spec) = pod.spec.as_ref() else {
        return PodCgroup {
            qos,
            cpu_request_milli: 0,
            cpu_limit_milli: None,
            memory_limit: None,
        };
    };
    let requests = resources::pod_requests(spec);
    let limits = resources::pod_limits(spec);
    // Every container (init containers included) limits the resource, or the pod itself does.
    let declared = |res: &str| {
        let limit_of = |r: Option<&ResourceRequirements>| {
            r.and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(res))
                .and_then(|q| quantity::nanos(&q.0))
                .is_some_and(|v| v > 0)
        };
        let all_containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .all(|c| limit_of(c.resources.as_ref()));
        all_containers || (pod_level_resources_set(spec) && limit_of(spec.resources.as_ref()))
    };
    match qos {
        QosClass::Guaranteed => PodCgroup {
            qos,
            cpu_request_milli: requests.milli_cpu,
            cpu_limit_milli: Some(limits.milli_cpu),
            memory_limit: Some(limits.memory),
        },
        QosClass::Burstable => PodCgroup {
            qos,
            cpu_request_milli: requests.milli_cpu,
            cpu_limit_milli: declared("cpu").then_some(limits.milli_cpu),
            memory_limit: declared("memory").then_some(limits.memory),
        },
        QosClass::BestEffort => PodCgroup {
            qos,
            cpu_request_milli: 0,
            cpu_limit_milli: None,
            memory_limit: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const MI: u64 = 1 << 20;
    /// The seeds' node: 8125292Ki.
    const NODE: u64 = 8_320_299_008;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    fn ctr(name: &str, requests: Value, limits: Value) -> Value {
        json!({"name": name, "image": "x", "resources": {"requests": requests, "limits": limits}})
    }

    fn qos(spec: Value) -> QosClass {
        compute_qos_class(pod(spec).spec.as_ref().expect("spec"))
    }

    #[test]
    fn qos_classes_as_upstream() {
        let cases = [
            (
                "no resources",
                json!({"containers": [{"name": "a", "image": "x"}]}),
                QosClass::BestEffort,
            ),
            (
                "zero quantities count as absent",
                json!({"containers": [ctr("a", json!({"cpu": "0"}), json!({"memory": "0"}))]}),
                QosClass::BestEffort,
            ),
            (
                "equal by value: 1 and 1000m",
                json!({"containers": [ctr("a", json!({"cpu": "1", "memory": "1Gi"}),
                                              json!({"cpu": "1000m", "memory": "1073741824"}))]}),
                QosClass::Guaranteed,
            ),
            (
                "requests below limits",
                json!({"containers": [ctr("a", json!({"cpu": "500m", "memory": "1Gi"}),
                                              json!({"cpu": "1", "memory": "1Gi"}))]}),
                QosClass::Burstable,
            ),
            (
                "CoreDNS: no cpu limit",
                json!({"containers": [ctr("coredns", json!({"cpu": "100m", "memory": "70Mi"}),
                                              json!({"memory": "170Mi"}))]}),
                QosClass::Burstable,
            ),
            (
                "limits without requests (not defaulted) are Burstable",
                json!({"containers": [ctr("a", json!({}), json!({"cpu": "1", "memory": "1Gi"}))]}),
                QosClass::Burstable,
            ),
            (
                "an init container without limits",
                json!({"containers": [ctr("a", json!({"cpu": "1", "memory": "1Gi"}), json!({"cpu": "1", "memory": "1Gi"}))],
                       "initContainers": [{"name": "i", "image": "x"}]}),
                QosClass::Burstable,
            ),
            (
                "init containers count in the sums",
                json!({"containers": [ctr("a", json!({"cpu": "1", "memory": "1Gi"}), json!({"cpu": "1", "memory": "1Gi"}))],
                       "initContainers": [ctr("i", json!({"cpu": "2", "memory": "1Gi"}), json!({"cpu": "2", "memory": "1Gi"}))]}),
                QosClass::Guaranteed,
            ),
            (
                "a request only in an init container",
                json!({"containers": [{"name": "a", "image": "x"}],
                       "initContainers": [ctr("i", json!({"memory": "1Mi"}), json!({}))]}),
                QosClass::Burstable,
            ),
            (
                "other resources do not count",
                json!({"containers": [ctr("a", json!({"ephemeral-storage": "1Gi"}), json!({"example.com/gpu": "1"}))]}),
                QosClass::BestEffort,
            ),
            (
                "pod-level resources decide",
                json!({"containers": [{"name": "a", "image": "x"}],
                       "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}}),
                QosClass::Guaranteed,
            ),
            (
                "pod-level limits without memory",
                json!({"containers": [ctr("a", json!({"cpu": "1", "memory": "1Gi"}), json!({"cpu": "1", "memory": "1Gi"}))],
                       "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}),
                QosClass::Burstable,
            ),
            (
                "pod-level requests only",
                json!({"containers": [{"name": "a", "image": "x"}], "resources": {"requests": {"memory": "1Gi"}}}),
                QosClass::Burstable,
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(qos(spec), want, "{name}");
        }
    }

    #[test]
    fn status_class_wins() {
        let mut p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
        assert_eq!(pod_qos_class(&p), QosClass::BestEffort);
        p.status = Some(serde_json::from_value(json!({"qosClass": "Burstable"})).expect("status"));
        assert_eq!(pod_qos_class(&p), QosClass::Burstable);
        assert_eq!(
            QosClass::parse(QosClass::Guaranteed.as_str()),
            Some(QosClass::Guaranteed)
        );
    }

    fn adj(spec: Value, container: usize) -> i32 {
        let p = pod(spec);
        let s = p.spec.as_ref().expect("spec");
        let all: Vec<&Container> = s
            .containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .collect();
        container_oom_score_adj(&p, all[container], NODE)
    }

    #[test]
    fn oom_scores_of_nodes_45() {
        let coredns = ctr(
            "coredns",
            json!({"cpu": "100m", "memory": "70Mi"}),
            json!({"memory": "170Mi"}),
        );
        assert_eq!(adj(json!({"containers": [coredns]}), 0), 992, "CoreDNS");
        let g = ctr(
            "g",
            json!({"cpu": "1", "memory": "1Gi"}),
            json!({"cpu": "1", "memory": "1Gi"}),
        );
        assert_eq!(adj(json!({"containers": [g]}), 0), -997);
        assert_eq!(adj(json!({"containers": [{"name": "a", "image": "x"}]}), 0), 1000);
        let cpu_only = ctr("a", json!({"cpu": "1"}), json!({}));
        assert_eq!(
            adj(json!({"containers": [cpu_only]}), 0),
            999,
            "Burstable never 1000"
        );
        let huge = ctr("a", json!({"memory": "16Gi"}), json!({}));
        assert_eq!(adj(json!({"containers": [huge]}), 0), 3, "never below 3");
        // kindnet: Burstable, but system-node-critical with its priority.
        let kindnet = json!({"containers": [ctr("kindnet", json!({"cpu": "100m", "memory": "50Mi"}), json!({"memory": "50Mi"}))],
                             "priorityClassName": "system-node-critical", "priority": 2_000_001_000});
        assert_eq!(adj(kindnet.clone(), 0), -997);
        let mut no_priority = kindnet;
        no_priority.as_object_mut().expect("object").remove("priority");
        assert_eq!(adj(no_priority, 0), 994, "the class name alone is not critical");
    }

    #[test]
    fn sidecars_and_pod_level_memory_in_oom_scores() {
        let app = ctr("app", json!({"memory": "1Gi"}), json!({}));
        let mut sidecar = ctr("proxy", json!({"memory": "10Mi"}), json!({}));
        sidecar["restartPolicy"] = json!("Always");
        let spec = json!({"containers": [app], "initContainers": [sidecar]});
        let score = |bytes: u64| 1000 - (1000 * bytes / NODE) as i32;
        let app_adj = adj(spec.clone(), 0);
        assert_eq!(app_adj, score(1 << 30));
        assert_eq!(adj(spec, 1), app_adj, "the sidecar is not spared over the app");
        // 2 GiB for the pod, 1 GiB allotted: the other GiB is spread over the two containers.
        let spec = json!({"containers": [ctr("a", json!({"memory": "1Gi"}), json!({})), {"name": "b", "image": "x"}],
                          "resources": {"requests": {"memory": "2Gi"}}});
        let half = (1u64 << 30) / 2;
        assert_eq!(adj(spec.clone(), 1), score(half));
        assert_eq!(adj(spec, 0), score((1 << 30) + half));
    }

    #[test]
    fn pod_cgroups_as_resource_config_for_pod() {
        let coredns = pod(
            json!({"containers": [ctr("coredns", json!({"cpu": "100m", "memory": "70Mi"}), json!({"memory": "170Mi"}))]}),
        );
        assert_eq!(
            pod_cgroup(&coredns),
            PodCgroup {
                qos: QosClass::Burstable,
                cpu_request_milli: 100,
                cpu_limit_milli: None,
                memory_limit: Some(170 * MI)
            }
        );
        let g = ctr(
            "g",
            json!({"cpu": "500m", "memory": "64Mi"}),
            json!({"cpu": "500m", "memory": "64Mi"}),
        );
        let two =
            pod(json!({"containers": [g.clone(), {"name": "h", "image": "x", "resources": g["resources"]}]}));
        assert_eq!(
            pod_cgroup(&two),
            PodCgroup {
                qos: QosClass::Guaranteed,
                cpu_request_milli: 1000,
                cpu_limit_milli: Some(1000),
                memory_limit: Some(128 * MI)
            }
        );
        let mixed = pod(
            json!({"containers": [g, ctr("c", json!({"cpu": "100m", "memory": "70Mi"}), json!({"memory": "170Mi"}))]}),
        );
        let m = pod_cgroup(&mixed);
        assert_eq!(
            (m.cpu_limit_milli, m.memory_limit),
            (None, Some(234 * MI)),
            "one container without a cpu limit"
        );
        let be = pod(json!({"containers": [{"name": "a", "image": "x"}], "overhead": {"cpu": "250m"}}));
        assert_eq!(
            pod_cgroup(&be).cpu_request_milli,
            0,
            "BestEffort gets the minimum weight"
        );
        // An init container that needs more than the app sets the pod's request.
        let init = pod(
            json!({"containers": [ctr("a", json!({"cpu": "100m"}), json!({}))],
                              "initContainers": [ctr("i", json!({"cpu": "2"}), json!({}))]}),
        );
        assert_eq!(pod_cgroup(&init).cpu_request_milli, 2000);
        // Pod-level limits make the slice limited although the containers are not.
        let pl = pod(
            json!({"containers": [ctr("a", json!({"cpu": "100m"}), json!({}))],
                            "resources": {"limits": {"memory": "1Gi"}}}),
        );
        assert_eq!(pod_cgroup(&pl).memory_limit, Some(1 << 30));
    }
}
