//! What a finished pod means for its Job: failure or success (podReplacementPolicy), the
//! podFailurePolicy rule it matches (FailJob / FailIndex / Ignore / Count), the successPolicy,
//! and the pod failure back-off (10 s doubling, capped at 10 minutes: docs/SEEDS-SPEC.md CTL-30,
//! Appendix A C4 follows the code's `MaxJobPodFailureBackOff`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::{Job, PodFailurePolicy, SuccessPolicy};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::indexes::Intervals;

/// The finalizer that keeps a finished pod until the Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Annotation and label with a pod's completion index (Indexed Jobs).
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Failures counted so far in a pod's index (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// Failures of a pod's index that an Ignore rule did not count.
pub const INDEX_IGNORED_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-ignored-failure-count";

/// First delay before a failed pod is replaced.
pub const BACKOFF_BASE: Duration = Duration::from_secs(10);
/// Longest delay before a failed pod is replaced.
pub const BACKOFF_MAX: Duration = Duration::from_secs(600);

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

pub fn has_finalizer(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

pub fn uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The pod's completion index (a non-negative number in the annotation).
pub fn completion_index(p: &Pod) -> Option<i32> {
    annotation(p, COMPLETION_INDEX)?
        .parse::<i32>()
        .ok()
        .filter(|i| *i >= 0)
}

fn count_annotation(p: &Pod, key: &str) -> i32 {
    annotation(p, key)
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|v| *v >= 0)
        .unwrap_or(0)
}

/// Failures counted for the pod's index before this pod.
pub fn index_failure_count(p: &Pod) -> i32 {
    count_annotation(p, INDEX_FAILURE_COUNT)
}

/// Failures of the pod's index before this pod, counted or not.
pub fn index_absolute_failure_count(p: &Pod) -> i32 {
    count_annotation(p, INDEX_FAILURE_COUNT).saturating_add(count_annotation(p, INDEX_IGNORED_FAILURE_COUNT))
}

/// Only failed pods are replaced (not terminating ones): `podReplacementPolicy: Failed`, which a
/// podFailurePolicy implies.
pub fn only_replace_failed(job: &Job) -> bool {
    let spec = job.spec.as_ref();
    spec.and_then(|s| s.pod_replacement_policy.as_deref()) == Some("Failed")
        || spec.is_some_and(|s| s.pod_failure_policy.is_some())
}

/// Failed, or (unless only failed pods are replaced) deleted before it succeeded.
pub fn is_pod_failed(p: &Pod, job: &Job) -> bool {
    match phase(p) {
        "Failed" => true,
        "Succeeded" => false,
        _ => !only_replace_failed(job) && p.metadata.deletion_timestamp.is_some(),
    }
}

/// Being deleted and not finished (upstream's `CountTerminatingPods`).
pub fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some() && !matches!(phase(p), "Failed" | "Succeeded")
}

/// The podFailurePolicy action a failed pod matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    FailJob,
    FailIndex,
    Ignore,
    Count,
}

/// What the podFailurePolicy says about a failed pod: a FailJob message, whether the failure
/// counts towards the back-off limits, and the action matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub fail_job: Option<String>,
    pub counts: bool,
    pub action: Option<Action>,
}

impl Verdict {
    const COUNTED: Verdict = Verdict {
        fail_job: None,
        counts: true,
        action: None,
    };
}

/// The first rule the failed pod matches (upstream's `matchPodFailurePolicy`).
pub fn match_failure_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> Verdict {
    let Some(policy) = policy else {
        return Verdict::COUNTED;
    };
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    for (index, rule) in policy.rules.iter().enumerate() {
        let matched_message = if let Some(req) = &rule.on_exit_codes {
            let matching = |list: &Option<Vec<ContainerStatus>>| {
                list.iter().flatten().find_map(|c| {
                    let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
                    let name_ok = req.container_name.as_ref().is_none_or(|n| *n == c.name);
                    let op_ok = match req.operator.as_str() {
                        "In" => req.values.contains(&code),
                        "NotIn" => !req.values.contains(&code),
                        _ => false,
                    };
                    (name_ok && code != 0 && op_ok).then(|| (c.name.clone(), code))
                })
            };
            matching(&status.container_statuses)
                .or_else(|| matching(&status.init_container_statuses))
                .map(|(container, code)| {
                    format!(
                        "Container {container} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                        rule.action
                    )
                })
        } else if let Some(patterns) = &rule.on_pod_conditions {
            status.conditions.iter().flatten().find_map(|c| {
                patterns
                    .iter()
                    .any(|p| p.type_ == c.type_ && p.status == c.status)
                    .then(|| {
                        format!(
                            "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                            c.type_, rule.action
                        )
                    })
            })
        } else {
            None
        };
        let Some(message) = matched_message else {
            continue;
        };
        let (fail_job, counts, action) = match rule.action.as_str() {
            "Ignore" => (None, false, Action::Ignore),
            "FailIndex" => (None, true, Action::FailIndex),
            "Count" => (None, true, Action::Count),
            "FailJob" => (Some(message), true, Action::FailJob),
            _ => continue,
        };
        return Verdict {
            fail_job,
            counts,
            action: Some(action),
        };
    }
    Verdict::COUNTED
}

/// The successPolicy rule met by the succeeded indexes, as the condition message
/// (`Matched rules at index N`).
pub fn match_success_policy(
    policy: Option<&SuccessPolicy>,
    completions: i32,
    succeeded: &Intervals,
) -> Option<String> {
    let policy = policy?;
    if succeeded.is_empty() {
        return None;
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        let met = match (&rule.succeeded_indexes, rule.succeeded_count) {
            (Some(ixs), count) => {
                let required = Intervals::parse(ixs, completions);
                if required.is_empty() {
                    continue;
                }
                let have = required.overlap(succeeded);
                have == required.total() || count.is_some_and(|c| have >= c)
            }
            (None, Some(count)) => succeeded.total() >= count,
            (None, None) => false,
        };
        if met {
            return Some(format!("Matched rules at index {index}"));
        }
    }
    None
}

/// When a finished pod finished (upstream's `getFinishedTime`): its containers' last finish, the
/// time it stopped being Ready, its deletion, else its creation.
pub fn finished_at(p: &Pod) -> DateTime<Utc> {
    let status = p.status.clone().unwrap_or_default();
    let containers = status.container_statuses.unwrap_or_default();
    if !containers.is_empty() {
        let finishes: Option<Vec<DateTime<Utc>>> = containers
            .iter()
            .map(|c| Some(c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref()?.0))
            .collect();
        if let Some(t) = finishes.and_then(|f| f.into_iter().max()) {
            return t;
        }
    }
    if let Some(t) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref())
    {
        return t.0;
    }
    if let Some(t) = &p.metadata.deletion_timestamp {
        let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
        return t.0 - chrono::Duration::seconds(grace);
    }
    p.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The delay after `failures` consecutive failures: 10 s, 20 s, 40 s, ... up to 10 minutes.
pub fn backoff_delay(failures: i32) -> Duration {
    if failures <= 0 {
        return Duration::ZERO;
    }
    let mut d = BACKOFF_BASE;
    for _ in 1..failures {
        d *= 2;
        if d >= BACKOFF_MAX {
            return BACKOFF_MAX;
        }
    }
    d
}

/// How long to wait before replacing after `failures` failures, the last at `last`.
pub fn backoff_remaining(failures: i32, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Duration {
    let Some(last) = last else {
        return Duration::ZERO;
    };
    let delay = backoff_delay(failures);
    let elapsed = (now - last).to_std().unwrap_or(Duration::ZERO);
    delay.saturating_sub(elapsed)
}

/// Consecutive pod failures of one Job since its last success (kept in memory, as upstream).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BackoffRecord {
    pub failures_after_last_success: i32,
    pub last_failure: Option<DateTime<Utc>>,
}

impl BackoffRecord {
    /// The record after the newly finished pods.
    pub fn after(&self, succeeded: &[&Pod], failed: &[&Pod]) -> Self {
        let mut failed_times: Vec<DateTime<Utc>> = failed.iter().map(|p| finished_at(p)).collect();
        failed_times.sort();
        let last_success = succeeded.iter().map(|p| finished_at(p)).max();
        match last_success {
            None if failed_times.is_empty() => self.clone(),
            None => Self {
                failures_after_last_success: self.failures_after_last_success
                    + i32::try_from(failed_times.len()).unwrap_or(i32::MAX),
                last_failure: failed_times.last().copied(),
            },
            Some(success) => {
                let after: Vec<_> = failed_times.iter().filter(|t| **t > success).collect();
                Self {
                    failures_after_last_success: i32::try_from(after.len()).unwrap_or(i32::MAX),
                    last_failure: after.last().map(|t| **t),
                }
            }
        }
    }

    /// Time left before a replacement may be created.
    pub fn remaining(&self, now: DateTime<Utc>) -> Duration {
        backoff_remaining(self.failures_after_last_success, self.last_failure, now)
    }
}
