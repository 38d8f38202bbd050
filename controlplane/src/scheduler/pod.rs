//! What the scheduler precomputes once per pod version: requests (SCH-4), priority, host ports,
//! tolerations, affinity terms and spread constraints, so that filters and scores read fields
//! instead of walking the pod for every node.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, PodSpec, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kcore::labels::{Labels, labels_of, selector_matches};
use kcore::resources::{Resources, pod_nonzero_requests, pod_requests};

/// Priority of `system-cluster-critical`.
pub const SYSTEM_CLUSTER_CRITICAL: i32 = 2_000_000_000;
/// Priority of `system-node-critical`.
pub const SYSTEM_NODE_CRITICAL: i32 = 2_000_001_000;

/// The scheduler upstream pods name in `spec.schedulerName` by default.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// A host port a pod asks for: `(hostIP, protocol, port)`; hostIP `0.0.0.0` means all.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    /// Whether two host ports cannot both be bound on one node.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// A pod (anti-)affinity term, with its namespaces resolved (`namespaces` and
/// `namespaceSelector` empty → the pod's own namespace) and `matchLabelKeys` /
/// `mismatchLabelKeys` folded into the selector with the pod's own label values.
#[derive(Debug, Clone)]
pub struct AffinityTerm {
    pub selector: Option<LabelSelector>,
    pub namespaces: BTreeSet<String>,
    pub namespace_selector: Option<LabelSelector>,
    pub topology_key: String,
}

impl AffinityTerm {
    fn new(t: &PodAffinityTerm, pod_ns: &str, pod_labels: &Labels) -> Self {
        let mut namespaces: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
        if namespaces.is_empty() && t.namespace_selector.is_none() {
            namespaces.insert(pod_ns.to_string());
        }
        let mut selector = t.label_selector.clone();
        if let Some(sel) = selector.as_mut() {
            let mut extra = Vec::new();
            for (keys, op) in [(&t.match_label_keys, "In"), (&t.mismatch_label_keys, "NotIn")] {
                for k in keys.iter().flatten() {
                    if let Some(v) = pod_labels.get(k) {
                        extra.push(LabelSelectorRequirement {
                            key: k.clone(),
                            operator: op.into(),
                            values: Some(vec![v.clone()]),
                        });
                    }
                }
            }
            if !extra.is_empty() {
                sel.match_expressions.get_or_insert_with(Vec::new).extend(extra);
            }
        }
        Self {
            selector,
            namespaces,
            namespace_selector: t.namespace_selector.clone(),
            topology_key: t.topology_key.clone(),
        }
    }

    /// Whether `pod` is selected by this term (`ns_labels` gives a namespace's labels).
    pub fn matches(&self, pod: &PodInfo, ns_labels: &dyn Fn(&str) -> Option<Labels>) -> bool {
        let in_ns = self.namespaces.contains(&pod.namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| ns_labels(&pod.namespace).is_some_and(|l| selector_matches(s, &l)));
        in_ns
            && self
                .selector
                .as_ref()
                .is_some_and(|s| selector_matches(s, &pod.labels))
    }
}

/// A weighted (preferred) term.
#[derive(Debug, Clone)]
pub struct WeightedTerm {
    pub weight: i32,
    pub term: AffinityTerm,
}

/// The scheduler's view of one pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// The object, while the pod waits to be scheduled (its node affinity, images, owner and
    /// conditions are read from it); `None` once it is bound ([`PodInfo::placed`]).
    pub pod: Option<Arc<Pod>>,
    pub uid: String,
    pub resource_version: Option<String>,
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub node_name: Option<String>,
    pub scheduler_name: String,
    pub priority: i32,
    pub preempt_never: bool,
    pub requests: Resources,
    pub nonzero: Resources,
    pub host_ports: Vec<HostPort>,
    pub tolerations: Vec<Toleration>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<WeightedTerm>,
    pub preferred_anti_affinity: Vec<WeightedTerm>,
    pub spread: Vec<TopologySpreadConstraint>,
    pub images: Vec<String>,
    pub gated: bool,
    pub terminating: bool,
    /// `status.phase` is Succeeded or Failed: the pod holds no resources.
    pub finished: bool,
    pub nominated_node: Option<String>,
    /// Start time (or creation) in seconds, for preemption's tie-break.
    pub start_seconds: i64,
}

impl PodInfo {
    /// The scheduler's view of `pod`; `class_priority` resolves a `priorityClassName` when
    /// admission did not set `spec.priority` (None: unknown class, priority 0).
    pub fn new(pod: Arc<Pod>, class_priority: &dyn Fn(&str) -> Option<(i32, bool)>) -> Self {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let labels = labels_of(&meta.labels).clone();
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let class = spec.priority_class_name.as_deref().and_then(class_priority);
        let builtin = match spec.priority_class_name.as_deref() {
            Some("system-node-critical") => SYSTEM_NODE_CRITICAL,
            Some("system-cluster-critical") => SYSTEM_CLUSTER_CRITICAL,
            _ => 0,
        };
        let priority = spec.priority.or(class.map(|c| c.0)).unwrap_or(builtin);
        let preempt_never = spec
            .preemption_policy
            .as_deref()
            .map(|p| p == "Never")
            .unwrap_or_else(|| class.is_some_and(|c| c.1));
        let mut host_ports = Vec::new();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|hp| *hp > 0) {
                    host_ports.push(HostPort {
                        ip: p
                            .host_ip
                            .clone()
                            .filter(|i| !i.is_empty())
                            .unwrap_or_else(|| "0.0.0.0".into()),
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        port: hp,
                    });
                }
            }
        }
        let affinity = spec.affinity.as_ref();
        let pa = affinity.and_then(|a| a.pod_affinity.as_ref());
        let paa = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let term = |t: &PodAffinityTerm| AffinityTerm::new(t, &namespace, &labels);
        let required_affinity = pa
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .map(term)
            .collect();
        let required_anti_affinity = paa
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .map(term)
            .collect();
        let preferred_affinity = pa
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .map(|w| WeightedTerm {
                weight: w.weight,
                term: term(&w.pod_affinity_term),
            })
            .collect();
        let preferred_anti_affinity = paa
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .map(|w| WeightedTerm {
                weight: w.weight,
                term: term(&w.pod_affinity_term),
            })
            .collect();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
        let start = status
            .and_then(|s| s.start_time.as_ref())
            .or(meta.creation_timestamp.as_ref())
            .map(|t| t.0.timestamp())
            .unwrap_or(0);
        Self {
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            name: meta.name.clone().unwrap_or_default(),
            node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
            scheduler_name: spec
                .scheduler_name
                .clone()
                .unwrap_or_else(|| DEFAULT_SCHEDULER.into()),
            priority,
            preempt_never,
            requests: pod_requests(&spec),
            nonzero: pod_nonzero_requests(&spec),
            host_ports,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            required_affinity,
            required_anti_affinity,
            preferred_affinity,
            preferred_anti_affinity,
            spread: spec.topology_spread_constraints.clone().unwrap_or_default(),
            images: spec.containers.iter().filter_map(|c| c.image.clone()).collect(),
            gated: spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()),
            terminating: meta.deletion_timestamp.is_some(),
            finished: matches!(phase, "Succeeded" | "Failed"),
            nominated_node: status
                .and_then(|s| s.nominated_node_name.clone())
                .filter(|n| !n.is_empty()),
            start_seconds: start,
            namespace,
            labels,
            pod: Some(pod),
        }
    }

    /// What the cache keeps of a bound pod: this view without the object. Pods already on a
    /// node are read only through the fields above (requests, ports, labels, affinity terms,
    /// priority, identity); dropping the objects of the 10,000 bound pods of `bench scheduler`
    /// took the control plane's RSS from 492 to 425 MB.
    pub fn placed(mut self) -> Self {
        self.pod = None;
        self
    }

    /// The pod's spec (`None` once it is bound, see [`PodInfo::placed`]).
    pub fn spec(&self) -> Option<&PodSpec> {
        self.pod.as_deref().and_then(|p| p.spec.as_ref())
    }

    /// The pod as the object of an event.
    pub fn involved(&self) -> crate::events::Involved {
        crate::events::Involved {
            api_version: <Pod as k8s_openapi::Resource>::API_VERSION.into(),
            kind: <Pod as k8s_openapi::Resource>::KIND.into(),
            namespace: Some(self.namespace.clone()),
            name: self.name.clone(),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod has any inter-pod (anti-)affinity of its own.
    pub fn has_affinity(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn pod(v: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(v).expect("pod"))
    }

    #[test]
    fn precomputes_what_filters_read() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web", "v": "2"}},
            "spec": {"priorityClassName": "system-node-critical",
                "containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 8080}]}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["v"], "topologyKey": "kubernetes.io/hostname"}]}}}
        }));
        let info = PodInfo::new(p, &|_| None);
        assert_eq!(info.priority, SYSTEM_NODE_CRITICAL);
        assert_eq!(
            info.host_ports,
            vec![HostPort {
                ip: "0.0.0.0".into(),
                protocol: "TCP".into(),
                port: 8080
            }]
        );
        let t = &info.required_anti_affinity[0];
        assert!(t.namespaces.contains("ns"));
        assert!(t.matches(&info, &|_| None), "matches itself (app=web, v=2)");
        let other = PodInfo::new(
            pod(
                json!({"metadata": {"name": "o", "namespace": "ns", "labels": {"app": "web", "v": "1"}},
                       "spec": {"containers": []}}),
            ),
            &|_| None,
        );
        assert!(!t.matches(&other, &|_| None), "matchLabelKeys pins v=2");
    }

    #[test]
    fn host_port_conflicts() {
        let hp = |ip: &str, proto: &str, port| HostPort {
            ip: ip.into(),
            protocol: proto.into(),
            port,
        };
        assert!(hp("0.0.0.0", "TCP", 80).conflicts(&hp("10.0.0.1", "TCP", 80)));
        assert!(!hp("10.0.0.2", "TCP", 80).conflicts(&hp("10.0.0.1", "TCP", 80)));
        assert!(!hp("0.0.0.0", "UDP", 80).conflicts(&hp("0.0.0.0", "TCP", 80)));
        assert!(!hp("0.0.0.0", "TCP", 81).conflicts(&hp("0.0.0.0", "TCP", 80)));
    }
}
