//! Plugins on node properties: NodeUnschedulable, TaintToleration (filter: NoSchedule
//! and NoExecute; score: PreferNoSchedule), NodeAffinity (filter: nodeSelector and required
//! terms; score: preferred terms), NodePorts, ImageLocality.

use kcore::labels::{node_matches_pod, node_selector_term_matches};
use kcore::taints::{first_untolerated, tolerates};

use super::{Code, Plugin, Rejection, reasons};
use crate::scheduler::cache::{Cache, NodeInfo};
use crate::scheduler::pod::PodInfo;

/// Tolerated by every pod for `spec.unschedulable` nodes (upstream: the
/// `node.kubernetes.io/unschedulable:NoSchedule` toleration lets DaemonSet pods through).
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

pub fn node_unschedulable(pod: &PodInfo, node: &NodeInfo) -> Option<Rejection> {
    if !node.unschedulable {
        return None;
    }
    let taint = k8s_openapi::api::core::v1::Taint {
        key: UNSCHEDULABLE_TAINT.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    if pod.tolerations.iter().any(|t| tolerates(t, &taint)) {
        return None;
    }
    Some(Rejection::new(
        Plugin::NodeUnschedulable,
        Code::UnschedulableAndUnresolvable,
        reasons::UNSCHEDULABLE,
    ))
}

pub fn taint_toleration(pod: &PodInfo, node: &NodeInfo) -> Option<Rejection> {
    first_untolerated(&node.taints, &pod.tolerations, &["NoSchedule", "NoExecute"]).map(|_| {
        Rejection::new(
            Plugin::TaintToleration,
            Code::UnschedulableAndUnresolvable,
            reasons::UNTOLERATED_TAINT,
        )
    })
}

pub fn node_affinity(pod: &PodInfo, node: &NodeInfo) -> Option<Rejection> {
    let spec = pod.spec()?;
    (!node_matches_pod(spec, node.view())).then(|| {
        Rejection::new(
            Plugin::NodeAffinity,
            Code::UnschedulableAndUnresolvable,
            reasons::NODE_AFFINITY,
        )
    })
}

pub fn node_ports(pod: &PodInfo, node: &NodeInfo) -> Option<Rejection> {
    let clash = pod
        .host_ports
        .iter()
        .any(|want| node.used_ports.iter().any(|used| used.conflicts(want)));
    clash.then(|| Rejection::new(Plugin::NodePorts, Code::Unschedulable, reasons::NODE_PORTS))
}

/// TaintToleration score before normalisation: PreferNoSchedule taints the pod does not
/// tolerate (normalised in reverse: fewer is better).
pub fn prefer_no_schedule_count(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let tolerations: Vec<_> = pod
        .tolerations
        .iter()
        .filter(|t| {
            t.effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "PreferNoSchedule")
        })
        .collect();
    node.taints
        .iter()
        .filter(|t| t.effect == "PreferNoSchedule")
        .filter(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
        .count() as i64
}

/// NodeAffinity score before normalisation: the weights of the preferred terms the node matches.
pub fn preferred_node_affinity(pod: &PodInfo, node: &NodeInfo) -> i64 {
    pod.spec()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.preferred_during_scheduling_ignored_during_execution.as_ref())
        .into_iter()
        .flatten()
        .filter(|p| node_selector_term_matches(&p.preference, node.view()))
        .map(|p| i64::from(p.weight))
        .sum()
}

const MB: i64 = 1024 * 1024;
const MIN_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

/// `busybox` → `busybox:latest` (what node status reports), as upstream normalises.
fn normalized_image(name: &str) -> String {
    let colon = name.rfind(':');
    let slash = name.rfind('/');
    if name.contains('@') || colon.is_some_and(|c| slash.is_none_or(|s| c > s)) {
        name.to_string()
    } else {
        format!("{name}:latest")
    }
}

/// ImageLocality: bytes of the pod's images already on the node, each scaled by the share of
/// nodes that have it, mapped to 0-100 between 23 MB and 1000 MB per container.
pub fn image_locality(pod: &PodInfo, node: &NodeInfo, cache: &Cache) -> i64 {
    let total_nodes = cache.nodes().len().max(1) as f64;
    let spec = pod.spec();
    let images = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
        .filter_map(|c| c.image.as_deref());
    let mut containers = 0i64;
    let mut sum = 0i64;
    for image in images {
        containers += 1;
        let name = normalized_image(image);
        if let Some(size) = node.images.get(&name) {
            let spread = cache.image_node_count(&name) as f64 / total_nodes;
            sum += (*size as f64 * spread) as i64;
        }
    }
    let max = MAX_CONTAINER_THRESHOLD * containers.max(1);
    let clamped = sum.clamp(MIN_THRESHOLD, max);
    100 * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_normalised_like_upstream() {
        assert_eq!(normalized_image("busybox"), "busybox:latest");
        assert_eq!(
            normalized_image("registry:5000/busybox"),
            "registry:5000/busybox:latest"
        );
        assert_eq!(normalized_image("busybox:1.36"), "busybox:1.36");
        assert_eq!(normalized_image("busybox@sha256:ab"), "busybox@sha256:ab");
    }
}
