//! Preemption (docs/SEEDS-SPEC.md SCH-11), as a pure function: when no node fits, find nodes
//! where removing pods of lower priority makes room, keep as many of those pods as still lets the
//! pod fit (PodDisruptionBudget-violating ones reprieved first, higher priority first), and pick
//! the node with the fewest budget violations, then the lowest-priority victims, the smallest sum
//! of priorities, the fewest victims, the latest-started victims.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kcore::labels::selector_matches;

use super::cache::{Cache, NodeInfo, Nominations};
use super::framework::{FilterState, FitError, histogram, run_filters};
use super::plugins::{Code, Plugin, Rejection};
use super::pod::PodInfo;

pub const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
pub const NO_VICTIMS: &str = "No preemption victims found for incoming pod";

/// A PodDisruptionBudget as preemption reads it.
#[derive(Debug, Clone)]
pub struct Budget {
    pub namespace: String,
    pub selector: Option<LabelSelector>,
    /// Disruptions the budget still allows.
    pub allowed: i32,
    /// Pods whose eviction the API already charged to the budget.
    pub disrupted: BTreeSet<String>,
}

/// A node where preemption makes room, and what it costs.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub node: String,
    /// Highest priority first.
    pub victims: Vec<Arc<PodInfo>>,
    pub violations: usize,
}

/// What preemption concluded.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The pod may not preempt (the text follows `preemption: `).
    NotEligible(String),
    /// No node helps: `0/N nodes are available: ...` over what each node said.
    Unhelpful(String),
    Chosen(Candidate),
}

impl Outcome {
    /// The text appended to FailedScheduling (None when preemption found a node).
    pub fn message(&self) -> Option<String> {
        match self {
            Outcome::NotEligible(m) | Outcome::Unhelpful(m) => Some(format!("preemption: {m}")),
            Outcome::Chosen(_) => None,
        }
    }
}

/// Upstream's `MoreImportantPod`: higher priority, then earlier start.
fn more_important(a: &PodInfo, b: &PodInfo) -> std::cmp::Ordering {
    b.priority
        .cmp(&a.priority)
        .then_with(|| a.start_seconds.cmp(&b.start_seconds))
}

/// Splits victims into those whose eviction would violate a budget and the others, charging the
/// budgets as it goes.
fn split_by_budgets(
    victims: Vec<Arc<PodInfo>>,
    budgets: &[Budget],
) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: Vec<i32> = budgets.iter().map(|b| b.allowed).collect();
    let (mut violating, mut fine) = (Vec::new(), Vec::new());
    for v in victims {
        let mut violated = false;
        if !v.labels.is_empty() {
            for (i, b) in budgets.iter().enumerate() {
                let selects = b.selector.as_ref().is_some_and(|s| {
                    (s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                        || s.match_expressions.as_ref().is_some_and(|m| !m.is_empty()))
                        && selector_matches(s, &v.labels)
                });
                if b.namespace != v.namespace || !selects || b.disrupted.contains(&v.name) {
                    continue;
                }
                allowed[i] -= 1;
                if allowed[i] < 0 {
                    violated = true;
                }
            }
        }
        if violated {
            violating.push(v);
        } else {
            fine.push(v);
        }
    }
    (violating, fine)
}

/// Victims on one node, or why there are none.
fn select_victims(
    pod: &PodInfo,
    node: &NodeInfo,
    state: &FilterState,
    cache: &Cache,
    nominations: &Nominations,
    budgets: &[Budget],
) -> Result<Candidate, Rejection> {
    let mut potential: Vec<Arc<PodInfo>> = node
        .pods
        .iter()
        .filter(|p| p.priority < pod.priority)
        .cloned()
        .collect();
    if potential.is_empty() {
        return Err(Rejection::new(
            Plugin::NodeResourcesFit,
            Code::UnschedulableAndUnresolvable,
            NO_VICTIMS,
        ));
    }
    let uids: Vec<&str> = potential.iter().map(|p| p.uid.as_str()).collect();
    let mut trial = node.without_pods(&uids);
    if let Some(r) = run_filters(pod, &trial, state, cache, nominations) {
        return Err(r);
    }
    potential.sort_by(|a, b| more_important(a, b));
    let (violating, fine) = split_by_budgets(potential, budgets);
    let mut victims = Vec::new();
    let mut violations = 0;
    for (p, is_violating) in violating
        .into_iter()
        .map(|p| (p, true))
        .chain(fine.into_iter().map(|p| (p, false)))
    {
        let with = trial.with_pod(p.clone());
        if run_filters(pod, &with, state, cache, nominations).is_none() {
            trial = with;
        } else {
            if is_violating {
                violations += 1;
            }
            victims.push(p);
        }
    }
    victims.sort_by(|a, b| more_important(a, b));
    Ok(Candidate {
        node: node.name.clone(),
        victims,
        violations,
    })
}

/// Upstream's `pickOneNodeForPreemption` order.
fn pick(candidates: Vec<Candidate>) -> Option<Candidate> {
    candidates.into_iter().min_by(|a, b| {
        let top = |c: &Candidate| c.victims.first().map(|v| v.priority).unwrap_or(i32::MIN);
        let sum = |c: &Candidate| -> i64 {
            c.victims
                .iter()
                .map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1)
                .sum()
        };
        let latest_start = |c: &Candidate| {
            let top = top(c);
            c.victims
                .iter()
                .filter(|v| v.priority == top)
                .map(|v| v.start_seconds)
                .max()
                .unwrap_or(i64::MIN)
        };
        a.violations
            .cmp(&b.violations)
            .then_with(|| top(a).cmp(&top(b)))
            .then_with(|| sum(a).cmp(&sum(b)))
            .then_with(|| a.victims.len().cmp(&b.victims.len()))
            .then_with(|| latest_start(b).cmp(&latest_start(a)))
    })
}

/// Runs preemption for `pod` after the cycle failed with `fit`.
pub fn preempt(
    pod: &PodInfo,
    fit: &FitError,
    cache: &Cache,
    nominations: &Nominations,
    budgets: &[Budget],
) -> Outcome {
    if pod.preempt_never {
        return Outcome::NotEligible("not eligible due to preemptionPolicy=Never.".into());
    }
    if let Some(nominated) = pod.nominated_node.as_deref() {
        let unresolvable = fit
            .rejections
            .iter()
            .any(|(n, r)| n == nominated && r.code == Code::UnschedulableAndUnresolvable);
        let terminating_victim = cache
            .node(nominated)
            .is_some_and(|n| n.pods.iter().any(|p| p.priority < pod.priority && p.terminating));
        if !unresolvable && terminating_victim {
            return Outcome::NotEligible(
                "not eligible due to a terminating pod on the nominated node.".into(),
            );
        }
    }
    let all = cache.nodes().len();
    let potential: Vec<&str> = fit
        .rejections
        .iter()
        .filter(|(_, r)| r.code == Code::Unschedulable)
        .map(|(n, _)| n.as_str())
        .collect();
    let state = FilterState::compute(pod, cache);
    // As upstream: stop after enough candidates (10 % of the nodes, at least 100).
    let enough = (all / 10).max(100);
    let mut candidates = Vec::new();
    let mut statuses: Vec<Rejection> = Vec::new();
    for name in &potential {
        if candidates.len() >= enough {
            break;
        }
        let Some(node) = cache.node(name) else { continue };
        match select_victims(pod, node, &state, cache, nominations, budgets) {
            Ok(c) => candidates.push(c),
            Err(r) => statuses.push(r),
        }
    }
    if let Some(c) = pick(candidates) {
        return Outcome::Chosen(c);
    }
    let not_helpful = Rejection::new(
        Plugin::NodeResourcesFit,
        Code::UnschedulableAndUnresolvable,
        NOT_HELPFUL,
    );
    let absent = all.saturating_sub(statuses.len());
    let all_statuses = statuses.iter().chain(std::iter::repeat_n(&not_helpful, absent));
    Outcome::Unhelpful(format!(
        "0/{all} nodes are available: {}.",
        histogram(all_statuses).join(", ")
    ))
}
