//! InterPodAffinity: required affinity and anti-affinity of the incoming pod, the required
//! anti-affinity of pods already placed (filter), and the preferred terms of both sides (score).
//! Counts are per topology pair (`key=value` of a node label), computed once per cycle.

use std::collections::HashMap;

use super::{Code, Plugin, Rejection, reasons};
use crate::scheduler::cache::{Cache, NodeInfo};
use crate::scheduler::pod::{AffinityTerm, PodInfo};

type Pair = (String, String);

/// Per-cycle state of the filter.
#[derive(Debug, Default)]
pub struct AffinityState {
    /// Pairs where a placed pod's required anti-affinity matches the incoming pod.
    existing_anti: HashMap<Pair, i64>,
    /// Pairs with a placed pod matching all of the incoming pod's required affinity terms.
    affinity: HashMap<Pair, i64>,
    /// Pairs with a placed pod matching one of the incoming pod's required anti-affinity terms.
    anti: HashMap<Pair, i64>,
}

fn pair_of(node: &NodeInfo, key: &str) -> Option<Pair> {
    node.labels.get(key).map(|v| (key.to_string(), v.clone()))
}

impl AffinityState {
    /// Counts over every placed pod; cheap when neither side has affinity.
    pub fn compute(pod: &PodInfo, cache: &Cache) -> Self {
        let mut s = Self::default();
        let ns = |n: &str| cache.namespace_labels(n);
        let own = !pod.required_affinity.is_empty() || !pod.required_anti_affinity.is_empty();
        let placed: Box<dyn Iterator<Item = (&std::sync::Arc<PodInfo>, &NodeInfo)>> = if own {
            Box::new(
                cache
                    .nodes()
                    .iter()
                    .flat_map(|n| n.pods.iter().map(move |p| (p, n))),
            )
        } else {
            Box::new(cache.placed_with_affinity())
        };
        {
            for (existing, node) in placed {
                if existing.terminating {
                    continue;
                }
                for t in &existing.required_anti_affinity {
                    if t.matches(pod, &ns)
                        && let Some(p) = pair_of(node, &t.topology_key)
                    {
                        *s.existing_anti.entry(p).or_default() += 1;
                    }
                }
                if !own {
                    continue;
                }
                if !pod.required_affinity.is_empty()
                    && pod.required_affinity.iter().all(|t| t.matches(existing, &ns))
                {
                    for t in &pod.required_affinity {
                        if let Some(p) = pair_of(node, &t.topology_key) {
                            *s.affinity.entry(p).or_default() += 1;
                        }
                    }
                }
                for t in &pod.required_anti_affinity {
                    if t.matches(existing, &ns)
                        && let Some(p) = pair_of(node, &t.topology_key)
                    {
                        *s.anti.entry(p).or_default() += 1;
                    }
                }
            }
        }
        s
    }
}

fn matches_own_terms(pod: &PodInfo, terms: &[AffinityTerm], cache: &Cache) -> bool {
    let ns = |n: &str| cache.namespace_labels(n);
    terms.iter().all(|t| t.matches(pod, &ns))
}

/// The filter.
pub fn filter(pod: &PodInfo, node: &NodeInfo, state: &AffinityState, cache: &Cache) -> Option<Rejection> {
    // Required affinity: every term's topology exists on the node with a matching pod in it; the
    // first pod of a group that matches its own terms may go anywhere with the topologies.
    if !pod.required_affinity.is_empty() {
        let mut pods_exist = true;
        for t in &pod.required_affinity {
            match pair_of(node, &t.topology_key) {
                Some(p) => {
                    if state.affinity.get(&p).copied().unwrap_or(0) <= 0 {
                        pods_exist = false;
                    }
                }
                None => return Some(reject(Code::UnschedulableAndUnresolvable, reasons::AFFINITY)),
            }
        }
        let first_of_group =
            state.affinity.is_empty() && matches_own_terms(pod, &pod.required_affinity, cache);
        if !(pods_exist || first_of_group) {
            return Some(reject(Code::UnschedulableAndUnresolvable, reasons::AFFINITY));
        }
    }
    if !state.anti.is_empty() {
        for t in &pod.required_anti_affinity {
            if let Some(p) = pair_of(node, &t.topology_key)
                && state.anti.get(&p).copied().unwrap_or(0) > 0
            {
                return Some(reject(Code::Unschedulable, reasons::ANTI_AFFINITY));
            }
        }
    }
    if !state.existing_anti.is_empty() {
        for (k, v) in &node.labels {
            if state
                .existing_anti
                .get(&(k.clone(), v.clone()))
                .copied()
                .unwrap_or(0)
                > 0
            {
                return Some(reject(Code::Unschedulable, reasons::EXISTING_ANTI_AFFINITY));
            }
        }
    }
    None
}

fn reject(code: Code, reason: &str) -> Rejection {
    Rejection::new(Plugin::InterPodAffinity, code, reason)
}

/// Per-cycle state of the score: topology key → value → summed weight.
#[derive(Debug, Default)]
pub struct AffinityScores {
    by_topology: HashMap<String, HashMap<String, i64>>,
}

/// Upstream's `hardPodAffinityWeight`: placed pods' required affinity counts with this weight.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

impl AffinityScores {
    pub fn compute(pod: &PodInfo, cache: &Cache) -> Self {
        let mut s = Self::default();
        let ns = |n: &str| cache.namespace_labels(n);
        let incoming_prefers = !pod.preferred_affinity.is_empty() || !pod.preferred_anti_affinity.is_empty();
        let mut add = |node: &NodeInfo, key: &str, w: i64| {
            if let Some(v) = node.labels.get(key) {
                *s.by_topology
                    .entry(key.to_string())
                    .or_default()
                    .entry(v.clone())
                    .or_default() += w;
            }
        };
        let placed: Box<dyn Iterator<Item = (&std::sync::Arc<PodInfo>, &NodeInfo)>> = if incoming_prefers {
            Box::new(
                cache
                    .nodes()
                    .iter()
                    .flat_map(|n| n.pods.iter().map(move |p| (p, n))),
            )
        } else {
            Box::new(cache.placed_with_affinity())
        };
        {
            for (existing, node) in placed {
                for w in &pod.preferred_affinity {
                    if w.term.matches(existing, &ns) {
                        add(node, &w.term.topology_key, i64::from(w.weight));
                    }
                }
                for w in &pod.preferred_anti_affinity {
                    if w.term.matches(existing, &ns) {
                        add(node, &w.term.topology_key, -i64::from(w.weight));
                    }
                }
                for t in &existing.required_affinity {
                    if t.matches(pod, &ns) {
                        add(node, &t.topology_key, HARD_POD_AFFINITY_WEIGHT);
                    }
                }
                for w in &existing.preferred_affinity {
                    if w.term.matches(pod, &ns) {
                        add(node, &w.term.topology_key, i64::from(w.weight));
                    }
                }
                for w in &existing.preferred_anti_affinity {
                    if w.term.matches(pod, &ns) {
                        add(node, &w.term.topology_key, -i64::from(w.weight));
                    }
                }
            }
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.by_topology.is_empty()
    }

    /// The raw score of a node (normalised by [`normalize_min_max`]).
    pub fn score(&self, node: &NodeInfo) -> i64 {
        self.by_topology
            .iter()
            .filter_map(|(k, values)| node.labels.get(k).and_then(|v| values.get(v)))
            .sum()
    }
}

/// InterPodAffinity's normalisation: min-max to 0..=100 (all 0 when every node scores alike).
pub fn normalize_min_max(scores: &mut [i64]) {
    let (min, max) = scores
        .iter()
        .fold((i64::MAX, i64::MIN), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    let diff = max.saturating_sub(min);
    for s in scores.iter_mut() {
        *s = if diff > 0 { 100 * (*s - min) / diff } else { 0 };
    }
}
