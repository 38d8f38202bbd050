//! The default profile's plugins (upstream kube-scheduler's names, order and weights): filters
//! return a [`Rejection`] or pass; scores return 0-100 after normalisation.
//!
//! Filter order: NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit,
//! PodTopologySpread, InterPodAffinity (the first rejection decides a node). NodeName has nothing
//! to do here: a pod with `spec.nodeName` is bound already and never queued. Volume plugins are
//! not implemented (no volume binding in this cluster yet).
//! Score weights: TaintToleration 3, NodeAffinity 2, InterPodAffinity 2, PodTopologySpread 2,
//! NodeResourcesFit (least allocated) 1, NodeResourcesBalancedAllocation 1, ImageLocality 1.

pub mod fit;
pub mod interpod;
pub mod node;
pub mod spread;

use std::fmt;

/// The plugins, for rejections and for re-queueing on the cluster events they care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Plugin {
    NodeUnschedulable,
    TaintToleration,
    NodeAffinity,
    NodePorts,
    NodeResourcesFit,
    PodTopologySpread,
    InterPodAffinity,
}

impl fmt::Display for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Whether preemption could help a node that rejected the pod (upstream's `Unschedulable`
/// vs `UnschedulableAndUnresolvable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Unschedulable,
    UnschedulableAndUnresolvable,
}

/// Why a node cannot take the pod: the plugin, whether preemption may help, and the reasons
/// (each counted separately in the `0/N nodes are available: ...` message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub plugin: Plugin,
    pub code: Code,
    pub reasons: Vec<String>,
}

impl Rejection {
    pub fn new(plugin: Plugin, code: Code, reason: impl Into<String>) -> Self {
        Self {
            plugin,
            code,
            reasons: vec![reason.into()],
        }
    }
}

/// Upstream's reason texts (the histogram in FailedScheduling messages).
pub mod reasons {
    pub const UNSCHEDULABLE: &str = "node(s) were unschedulable";
    /// The 1.37 wording (docs/SEEDS-SPEC.md SCH-12); older releases named the taint.
    pub const UNTOLERATED_TAINT: &str = "node(s) had untolerated taint(s)";
    pub const NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
    pub const NODE_PORTS: &str = "node(s) didn't have free ports for the requested pod ports";
    pub const TOO_MANY_PODS: &str = "Too many pods";
    pub const SPREAD_MISSING_LABEL: &str =
        "node(s) didn't match pod topology spread constraints (missing required label)";
    pub const SPREAD: &str = "node(s) didn't match pod topology spread constraints";
    pub const AFFINITY: &str = "node(s) didn't match pod affinity rules";
    pub const ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
    pub const EXISTING_ANTI_AFFINITY: &str = "node(s) didn't satisfy existing pods anti-affinity rules";
}

/// Upstream's `DefaultNormalizeScore`: scale to 0..=100 by the maximum; `reverse` turns "fewer is
/// better" counts into scores.
pub fn normalize_by_max(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    for s in scores.iter_mut() {
        if max == 0 {
            *s = if reverse { 100 } else { 0 };
        } else {
            let v = 100 * *s / max;
            *s = if reverse { 100 - v } else { v };
        }
    }
}
