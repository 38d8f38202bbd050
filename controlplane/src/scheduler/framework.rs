//! One scheduling cycle as a pure function of the pod and the cache (docs/SEEDS-SPEC.md SCH-2):
//! filter nodes from a rotating start until enough feasible ones are found
//! (`percentageOfNodesToScore`), score them with the weighted plugins, pick the best with a random
//! tie-break; or explain why no node fits, in upstream's words.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kcore::resources::Resources;

use super::cache::{Cache, NodeInfo, Nominations};
use super::plugins::interpod::{self, AffinityScores, AffinityState};
use super::plugins::spread::{self, SpreadScores, SpreadState};
use super::plugins::{Plugin, Rejection, fit, node, normalize_by_max};
use super::pod::PodInfo;

/// Below this many nodes every node is evaluated.
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// The adaptive percentage never goes below this.
pub const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;

/// How many feasible nodes a cycle looks for among `all` nodes: `percentage` of them, or when 0
/// the adaptive `50 − all/125` percent floored at 5 %, never fewer than 100 nodes
/// (1,000 nodes → 420).
pub fn num_feasible_nodes_to_find(all: usize, percentage: u32) -> usize {
    if all < MIN_FEASIBLE_NODES_TO_FIND {
        return all;
    }
    let mut pct = percentage as usize;
    if pct == 0 {
        pct = 50usize
            .saturating_sub(all / 125)
            .max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND);
    }
    (all * pct.min(100) / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// What a cycle reads besides the pod.
#[derive(Debug)]
pub struct CycleInput<'a> {
    pub cache: &'a Cache,
    pub nominations: &'a Nominations,
    /// Selector of the Services/ReplicaSet/StatefulSet selecting the pod (default spreading).
    pub default_selector: Option<LabelSelector>,
    /// 0: adaptive.
    pub percentage_of_nodes_to_score: u32,
}

/// Per-cycle state of the filters that look beyond one node.
#[derive(Debug, Default)]
pub struct FilterState {
    pub affinity: AffinityState,
    pub spread: SpreadState,
}

impl FilterState {
    pub fn compute(pod: &PodInfo, cache: &Cache) -> Self {
        Self {
            affinity: AffinityState::compute(pod, cache),
            spread: SpreadState::compute(pod, cache),
        }
    }
}

/// Runs the filters in order on one node; the first rejection decides.
pub fn run_filters(
    pod: &PodInfo,
    node: &NodeInfo,
    state: &FilterState,
    cache: &Cache,
    nominations: &Nominations,
) -> Option<Rejection> {
    if let Some(r) = node::node_unschedulable(pod, node)
        .or_else(|| node::taint_toleration(pod, node))
        .or_else(|| node::node_affinity(pod, node))
        .or_else(|| node::node_ports(pod, node))
    {
        return Some(r);
    }
    let mut extra = Resources::default();
    let mut extra_pods = 0;
    for n in nominations.on_node(&node.name, pod.priority, &pod.uid) {
        extra.add(&n.requests);
        extra_pods += 1;
    }
    fit::fit(pod, node, &extra, extra_pods)
        .or_else(|| {
            (!state.spread.is_empty())
                .then(|| state.spread.filter(pod, node))
                .flatten()
        })
        .or_else(|| interpod::filter(pod, node, &state.affinity, cache))
}

/// A node was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    pub node: String,
    /// Nodes the filters ran on (the next cycle starts after them).
    pub evaluated: usize,
    /// Feasible nodes that reached scoring.
    pub feasible: usize,
}

/// Why no node fits: every node's rejection, and the message parts upstream prints.
#[derive(Debug, Clone, Default)]
pub struct FitError {
    pub num_all_nodes: usize,
    pub rejections: Vec<(String, Rejection)>,
    /// Appended after the histogram (preemption's outcome).
    pub post_filter_msg: Option<String>,
}

/// The message when the cluster has no nodes at all.
pub const NO_NODES: &str = "no nodes available to schedule pods";

impl FitError {
    /// `0/N nodes are available: <count> <reason>, ... .` with the reasons counted and sorted as
    /// upstream sorts them (as strings, count first), then preemption's part.
    pub fn message(&self) -> String {
        if self.num_all_nodes == 0 {
            return NO_NODES.to_string();
        }
        let mut msg = format!("0/{} nodes are available:", self.num_all_nodes);
        let hist = histogram(self.rejections.iter().map(|(_, r)| r));
        if !hist.is_empty() {
            msg.push_str(&format!(" {}.", hist.join(", ")));
        }
        if let Some(post) = &self.post_filter_msg {
            msg.push(' ');
            msg.push_str(post);
        }
        msg
    }

    /// The plugins that rejected some node (the cluster events that may help are theirs).
    pub fn plugins(&self) -> Vec<Plugin> {
        let mut p: Vec<Plugin> = self.rejections.iter().map(|(_, r)| r.plugin).collect();
        p.sort();
        p.dedup();
        p
    }
}

/// `"<count> <reason>"` for each reason, sorted as strings.
pub fn histogram<'a>(rejections: impl Iterator<Item = &'a Rejection>) -> Vec<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rejections {
        for reason in &r.reasons {
            *counts.entry(reason.as_str()).or_default() += 1;
        }
    }
    let mut out: Vec<String> = counts.into_iter().map(|(r, n)| format!("{n} {r}")).collect();
    out.sort();
    out
}

/// Score weights of the default profile.
const W_TAINT: i64 = 3;
const W_NODE_AFFINITY: i64 = 2;
const W_INTERPOD: i64 = 2;
const W_SPREAD: i64 = 2;
const W_LEAST_ALLOCATED: i64 = 1;
const W_BALANCED: i64 = 1;
const W_IMAGE: i64 = 1;

/// Weighted total score of each feasible node, in the order given.
pub fn score(pod: &PodInfo, feasible: &[&NodeInfo], input: &CycleInput<'_>) -> Vec<i64> {
    let cache = input.cache;
    let n = feasible.len();
    let mut total = vec![0i64; n];
    let mut add = |scores: &[i64], weight: i64| {
        for (t, s) in total.iter_mut().zip(scores) {
            *t += s * weight;
        }
    };
    let mut taints: Vec<i64> = feasible
        .iter()
        .map(|nd| node::prefer_no_schedule_count(pod, nd))
        .collect();
    normalize_by_max(&mut taints, true);
    add(&taints, W_TAINT);
    let mut affinity: Vec<i64> = feasible
        .iter()
        .map(|nd| node::preferred_node_affinity(pod, nd))
        .collect();
    normalize_by_max(&mut affinity, false);
    add(&affinity, W_NODE_AFFINITY);
    let interpod_scores = AffinityScores::compute(pod, cache);
    if !interpod_scores.is_empty() {
        let mut s: Vec<i64> = feasible.iter().map(|nd| interpod_scores.score(nd)).collect();
        interpod::normalize_min_max(&mut s);
        add(&s, W_INTERPOD);
    }
    let spread_scores = SpreadScores::compute(pod, cache, feasible, input.default_selector.as_ref());
    if !spread_scores.is_empty() {
        let mut raw: Vec<Option<i64>> = feasible.iter().map(|nd| spread_scores.score(pod, nd)).collect();
        add(&spread::normalize(&mut raw), W_SPREAD);
    }
    let least: Vec<i64> = feasible.iter().map(|nd| fit::least_allocated(pod, nd)).collect();
    add(&least, W_LEAST_ALLOCATED);
    let balanced: Vec<i64> = feasible
        .iter()
        .map(|nd| fit::balanced_allocation(pod, nd))
        .collect();
    add(&balanced, W_BALANCED);
    let image: Vec<i64> = feasible
        .iter()
        .map(|nd| node::image_locality(pod, nd, cache))
        .collect();
    add(&image, W_IMAGE);
    total
}

/// One scheduling cycle. `start` is where the filters begin in the node list (it rotates from
/// cycle to cycle); `random` gives the tie-break's random numbers.
pub fn schedule(
    pod: &PodInfo,
    input: &CycleInput<'_>,
    start: usize,
    random: &mut dyn FnMut() -> u64,
) -> Result<Scheduled, FitError> {
    let nodes = input.cache.nodes();
    let all = nodes.len();
    let state = FilterState::compute(pod, input.cache);
    // A nominated node (from an earlier preemption) is tried first and taken if it fits.
    if let Some(nominated) = pod.nominated_node.as_deref().and_then(|n| input.cache.node(n))
        && run_filters(pod, nominated, &state, input.cache, input.nominations).is_none()
    {
        return Ok(Scheduled {
            node: nominated.name.clone(),
            evaluated: 0,
            feasible: 1,
        });
    }
    let want = num_feasible_nodes_to_find(all, input.percentage_of_nodes_to_score);
    let mut feasible: Vec<&NodeInfo> = Vec::new();
    let mut rejections = Vec::new();
    let mut evaluated = 0;
    for i in 0..all {
        if feasible.len() >= want {
            break;
        }
        let node = &nodes[(start + i) % all];
        evaluated += 1;
        match run_filters(pod, node, &state, input.cache, input.nominations) {
            None => feasible.push(node),
            Some(r) => rejections.push((node.name.clone(), r)),
        }
    }
    if feasible.is_empty() {
        return Err(FitError {
            num_all_nodes: all,
            rejections,
            post_filter_msg: None,
        });
    }
    if feasible.len() == 1 {
        return Ok(Scheduled {
            node: feasible[0].name.clone(),
            evaluated,
            feasible: 1,
        });
    }
    let totals = score(pod, &feasible, input);
    // Highest total wins; ties are broken at random (reservoir sampling over the tied nodes).
    let mut best = i64::MIN;
    let mut tied = 0u64;
    let mut pick = 0usize;
    for (i, s) in totals.iter().enumerate() {
        if *s > best {
            best = *s;
            tied = 1;
            pick = i;
        } else if *s == best {
            tied += 1;
            if random().is_multiple_of(tied) {
                pick = i;
            }
        }
    }
    Ok(Scheduled {
        node: feasible[pick].name.clone(),
        evaluated,
        feasible: feasible.len(),
    })
}
