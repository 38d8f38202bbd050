//! PodTopologySpread (docs/SEEDS-SPEC.md SCH-10): `DoNotSchedule` constraints filter (skew =
//! matching pods in the node's domain + self − the emptiest domain; a node missing the key is
//! filtered out), `ScheduleAnyway` constraints score. A pod with no constraints of its own that is
//! selected by a Service, ReplicaSet or StatefulSet gets the system defaults: hostname maxSkew 3
//! and zone maxSkew 5, both ScheduleAnyway.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kcore::labels::{node_matches_pod, optional_selector_matches};
use kcore::taints::first_untolerated;

use super::{Code, Plugin, Rejection, reasons};
use crate::scheduler::cache::{Cache, NodeInfo};
use crate::scheduler::pod::PodInfo;

pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub const ZONE: &str = "topology.kubernetes.io/zone";

type Pair = (String, String);

/// One constraint, with `matchLabelKeys` folded into its selector.
#[derive(Debug, Clone)]
pub struct Constraint {
    pub key: String,
    pub max_skew: i64,
    pub min_domains: usize,
    pub selector: Option<LabelSelector>,
    /// Only nodes matching the pod's node affinity count (`nodeAffinityPolicy: Honor`, the
    /// default).
    pub honor_affinity: bool,
    /// Only nodes whose taints the pod tolerates count (`nodeTaintsPolicy: Honor`; default
    /// Ignore).
    pub honor_taints: bool,
}

impl Constraint {
    fn new(c: &TopologySpreadConstraint, pod: &PodInfo) -> Self {
        let mut selector = c.label_selector.clone();
        if let Some(sel) = selector.as_mut() {
            for k in c.match_label_keys.iter().flatten() {
                if let Some(v) = pod.labels.get(k) {
                    sel.match_expressions
                        .get_or_insert_with(Vec::new)
                        .push(LabelSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        });
                }
            }
        }
        Self {
            key: c.topology_key.clone(),
            max_skew: i64::from(c.max_skew),
            min_domains: c.min_domains.and_then(|m| usize::try_from(m).ok()).unwrap_or(1),
            selector,
            honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        }
    }

    fn system_default(key: &str, max_skew: i64, selector: &LabelSelector) -> Self {
        Self {
            key: key.into(),
            max_skew,
            min_domains: 1,
            selector: Some(selector.clone()),
            honor_affinity: true,
            honor_taints: false,
        }
    }

    fn counts_node(&self, pod: &PodInfo, node: &NodeInfo) -> bool {
        (!self.honor_affinity || pod.spec().is_none_or(|s| node_matches_pod(s, node.view())))
            && (!self.honor_taints
                || first_untolerated(&node.taints, &pod.tolerations, &["NoSchedule", "NoExecute"]).is_none())
    }

    /// Pods on `node` in the pod's namespace that the constraint selects (terminating ones
    /// excluded).
    fn matching_pods(&self, pod: &PodInfo, node: &NodeInfo) -> i64 {
        node.pods
            .iter()
            .filter(|p| !p.terminating && p.namespace == pod.namespace)
            .filter(|p| optional_selector_matches(self.selector.as_ref(), &p.labels))
            .count() as i64
    }
}

fn has_all_keys(node: &NodeInfo, constraints: &[Constraint]) -> bool {
    constraints.iter().all(|c| node.labels.contains_key(&c.key))
}

/// Per-cycle state of the filter.
#[derive(Debug, Default)]
pub struct SpreadState {
    constraints: Vec<Constraint>,
    counts: HashMap<Pair, i64>,
    /// Per key: (domains, fewest matching pods in a domain).
    domains: HashMap<String, (usize, i64)>,
}

impl SpreadState {
    pub fn compute(pod: &PodInfo, cache: &Cache) -> Self {
        let constraints: Vec<Constraint> = pod
            .spread
            .iter()
            .filter(|c| c.when_unsatisfiable == "DoNotSchedule")
            .map(|c| Constraint::new(c, pod))
            .collect();
        let mut s = Self {
            constraints,
            ..Self::default()
        };
        if s.constraints.is_empty() {
            return s;
        }
        for node in cache.nodes() {
            if !has_all_keys(node, &s.constraints) {
                continue;
            }
            for c in &s.constraints {
                if !c.counts_node(pod, node) {
                    continue;
                }
                let pair = (c.key.clone(), node.labels[&c.key].clone());
                *s.counts.entry(pair).or_default() += c.matching_pods(pod, node);
            }
        }
        for ((key, _), n) in &s.counts {
            let e = s.domains.entry(key.clone()).or_insert((0, i64::MAX));
            e.0 += 1;
            e.1 = e.1.min(*n);
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.constraints.is_empty()
    }

    /// The filter.
    pub fn filter(&self, pod: &PodInfo, node: &NodeInfo) -> Option<Rejection> {
        for c in &self.constraints {
            let Some(value) = node.labels.get(&c.key) else {
                return Some(Rejection::new(
                    Plugin::PodTopologySpread,
                    Code::UnschedulableAndUnresolvable,
                    reasons::SPREAD_MISSING_LABEL,
                ));
            };
            let min = match self.domains.get(&c.key) {
                Some((n, _)) if *n < c.min_domains => 0,
                Some((_, min)) => *min,
                None => 0,
            };
            let own = i64::from(optional_selector_matches(c.selector.as_ref(), &pod.labels));
            let here = self
                .counts
                .get(&(c.key.clone(), value.clone()))
                .copied()
                .unwrap_or(0);
            if here + own - min > c.max_skew {
                return Some(Rejection::new(
                    Plugin::PodTopologySpread,
                    Code::Unschedulable,
                    reasons::SPREAD,
                ));
            }
        }
        None
    }
}

/// Per-cycle state of the score.
#[derive(Debug, Default)]
pub struct SpreadScores {
    constraints: Vec<Constraint>,
    counts: HashMap<Pair, i64>,
    weights: Vec<f64>,
    ignored: HashSet<String>,
}

impl SpreadScores {
    /// `feasible` are the nodes that passed the filters; `default_selector` is the union of the
    /// selectors of the Services, ReplicaSet or StatefulSet selecting the pod (system defaults).
    pub fn compute(
        pod: &PodInfo,
        cache: &Cache,
        feasible: &[&NodeInfo],
        default_selector: Option<&LabelSelector>,
    ) -> Self {
        let own: Vec<Constraint> = pod
            .spread
            .iter()
            .filter(|c| c.when_unsatisfiable == "ScheduleAnyway")
            .map(|c| Constraint::new(c, pod))
            .collect();
        let system_defaulted = pod.spread.is_empty();
        let constraints = if system_defaulted {
            match default_selector {
                Some(sel) => vec![
                    Constraint::system_default(HOSTNAME, 3, sel),
                    Constraint::system_default(ZONE, 5, sel),
                ],
                None => Vec::new(),
            }
        } else {
            own
        };
        let mut s = Self {
            constraints,
            ..Self::default()
        };
        if s.constraints.is_empty() {
            return s;
        }
        let require_all = !system_defaulted;
        let mut sizes = vec![0usize; s.constraints.len()];
        for node in feasible {
            if require_all && !has_all_keys(node, &s.constraints) {
                s.ignored.insert(node.name.clone());
                continue;
            }
            for (i, c) in s.constraints.iter().enumerate() {
                if c.key == HOSTNAME {
                    continue;
                }
                if let Some(v) = node.labels.get(&c.key)
                    && let std::collections::hash_map::Entry::Vacant(e) =
                        s.counts.entry((c.key.clone(), v.clone()))
                {
                    e.insert(0);
                    sizes[i] += 1;
                }
            }
        }
        for (i, c) in s.constraints.iter().enumerate() {
            if c.key == HOSTNAME {
                sizes[i] = feasible.len() - s.ignored.len();
            }
        }
        s.weights = sizes.iter().map(|n| ((*n + 2) as f64).ln()).collect();
        for node in cache.nodes() {
            if !has_all_keys(node, &s.constraints) {
                continue;
            }
            for c in &s.constraints {
                if c.key == HOSTNAME || !c.counts_node(pod, node) {
                    continue;
                }
                let pair = (c.key.clone(), node.labels[&c.key].clone());
                if s.counts.contains_key(&pair) {
                    let n = c.matching_pods(pod, node);
                    if let Some(e) = s.counts.get_mut(&pair) {
                        *e += n;
                    }
                }
            }
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.constraints.is_empty()
    }

    /// The raw score of a node (None: the node is ignored and scores 0 after normalisation).
    pub fn score(&self, pod: &PodInfo, node: &NodeInfo) -> Option<i64> {
        if self.ignored.contains(&node.name) {
            return None;
        }
        let mut score = 0.0;
        for (i, c) in self.constraints.iter().enumerate() {
            let Some(v) = node.labels.get(&c.key) else {
                continue;
            };
            let count = if c.key == HOSTNAME {
                c.matching_pods(pod, node)
            } else {
                self.counts.get(&(c.key.clone(), v.clone())).copied().unwrap_or(0)
            };
            score += count as f64 * self.weights[i] + (c.max_skew - 1) as f64;
        }
        Some(score.round() as i64)
    }
}

/// PodTopologySpread's normalisation: fewer matching pods is better; ignored nodes get 0.
pub fn normalize(scores: &mut [Option<i64>]) -> Vec<i64> {
    let present = scores.iter().flatten();
    let (min, max) = present.fold((i64::MAX, 0i64), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    scores
        .iter()
        .map(|s| match s {
            None => 0,
            Some(_) if max == 0 => 100,
            Some(v) => 100 * (max + min - v) / max,
        })
        .collect()
}
