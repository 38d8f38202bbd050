//! The Job decision (docs/SEEDS-SPEC.md CTL-29..CTL-33), pure functions of the cached Job and
//! its pods, in upstream's order (`syncJob`):
//!
//! 1. [`Sync::new`] counts what the pods say (active, ready, terminating, newly finished);
//! 2. [`Sync::decide`] picks the finish condition (podFailurePolicy, backoffLimit,
//!    activeDeadlineSeconds, failed indexes, successPolicy, completions) or manages the pods
//!    (create with back-off, delete surplus or on suspend);
//! 3. [`Sync::track`] adds newly finished pods to `status.uncountedTerminatedPods` (written
//!    first) and lists the pods whose `batch.kubernetes.io/job-tracking` finalizer can go;
//! 4. [`Sync::settle`] moves the pods whose finalizer is gone into the counters and, once nothing
//!    is uncounted or terminating, sets `Complete` or `Failed`.
//!
//! The module around it performs the API writes between the steps.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::indexes::Intervals;
use super::policy::{
    Action, BackoffRecord, COMPLETION_INDEX, INDEX_FAILURE_COUNT, INDEX_IGNORED_FAILURE_COUNT,
    TRACKING_FINALIZER, backoff_remaining, completion_index, finished_at, has_finalizer,
    index_absolute_failure_count, index_failure_count, is_pod_failed, is_terminating, match_failure_policy,
    match_success_policy, only_replace_failed, phase, uid,
};
use crate::controllers::podutil::{controller_owner, is_active, is_ready, ready_since};
use crate::events::Kind;

/// Most pods created or deleted in one sync (upstream's `MaxPodCreateDeletePerSync`).
pub const MAX_CREATE_DELETE: usize = 500;
/// Most pods added to `status.uncountedTerminatedPods` in one sync (`MaxUncountedPods`).
pub const MAX_UNCOUNTED: usize = 500;
/// The controller a Job without `spec.managedBy` belongs to.
pub const MANAGED_BY: &str = "kubernetes.io/job-controller";
/// The environment variable holding the completion index.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// Longest generateName prefix (upstream's `names.MaxGeneratedNameLength`: 63 − 5 random).
const MAX_GENERATED_NAME: usize = 58;

/// Why a Job is not synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// It finished already.
    Finished,
    /// `spec.managedBy` names another controller.
    ManagedElsewhere(String),
    /// `spec.completionMode` is neither NonIndexed nor Indexed.
    UnknownCompletionMode,
}

/// An event to record about the Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub reason: String,
    pub message: String,
}

fn event(kind: Kind, reason: &str, message: &str) -> Event {
    Event {
        kind,
        reason: reason.into(),
        message: message.into(),
    }
}

/// A pod to create: its completion index (Indexed Jobs) and, with backoffLimitPerIndex, the
/// failure counts it inherits from the pod it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPod {
    pub index: Option<i32>,
    pub failure_counts: Option<(i32, i32)>,
}

/// The pod writes of step 2.
#[derive(Debug, Default)]
pub struct Actions {
    /// The Job is finishing: delete its active pods (finalizers stay until they are counted).
    pub delete_keeping_finalizer: Vec<Arc<Pod>>,
    /// Surplus pods or a suspended Job: remove the finalizer, then delete.
    pub delete: Vec<Arc<Pod>>,
    pub create: Vec<NewPod>,
    /// Sync again after this (back-off, activeDeadlineSeconds).
    pub requeue: Option<Duration>,
    pub events: Vec<Event>,
}

/// What step 3 asks for.
#[derive(Debug, Default)]
pub struct Flush {
    /// Write the status (new uncounted pods, interim conditions) before removing finalizers.
    pub write_status: bool,
    /// Pods whose tracking finalizer can go.
    pub remove_finalizers: Vec<Arc<Pod>>,
}

/// What step 4 decided.
#[derive(Debug, Default)]
pub struct Settled {
    pub write_status: bool,
    /// Events once the status is written (Completed, BackoffLimitExceeded, ...).
    pub events: Vec<Event>,
}

pub fn condition(type_: &str, status: &str, reason: &str, message: &str, now: DateTime<Utc>) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

fn find<'a>(conds: &'a [JobCondition], type_: &str) -> Option<&'a JobCondition> {
    conds.iter().find(|c| c.type_ == type_)
}

fn is_true(conds: &[JobCondition], type_: &str) -> bool {
    find(conds, type_).is_some_and(|c| c.status == "True")
}

/// Sets the condition `type_`; a missing condition is not added as False. Returns whether the
/// list changed.
fn ensure(
    conds: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
) -> bool {
    if let Some(c) = conds.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status || c.reason.as_deref() != Some(reason) || c.message.as_deref() != Some(message)
        {
            *c = condition(type_, status, reason, message, now);
            return true;
        }
        return false;
    }
    if status != "False" {
        conds.push(condition(type_, status, reason, message, now));
        return true;
    }
    false
}

/// `Complete` or `Failed` if the Job finished.
pub fn finished_type(job: &Job) -> Option<&'static str> {
    let conds = job.status.as_ref()?.conditions.as_deref()?;
    ["Complete", "Failed"].into_iter().find(|t| is_true(conds, t))
}

/// When the Job finished (its Complete/Failed condition's transition).
pub fn finish_time(job: &Job) -> Option<DateTime<Utc>> {
    let conds = job.status.as_ref()?.conditions.as_deref()?;
    conds
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

fn is_indexed(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()) == Some("Indexed")
}

/// One sync of one Job, step by step (see the module doc).
#[derive(Debug)]
pub struct Sync {
    /// The Job with the status being built.
    pub job: Job,
    pods: Vec<Arc<Pod>>,
    active: Vec<Arc<Pod>>,
    /// The finish condition chosen (interim FailureTarget/SuccessCriteriaMet, then final).
    pub finished: Option<JobCondition>,
    prev_succeeded_ix: Intervals,
    succeeded_ix: Intervals,
    failed_ix: Option<Intervals>,
    uncounted_succeeded: HashSet<String>,
    uncounted_failed: HashSet<String>,
    expected_rm: HashSet<String>,
    delayed: HashMap<i32, Arc<Pod>>,
    terminating: i32,
    ready: i32,
    succeeded: i32,
    failed: i32,
    /// The back-off record after this sync's newly finished pods (kept once the status is
    /// written).
    pub new_backoff: BackoffRecord,
    now: DateTime<Utc>,
    /// Status fields changed in step 2 (active, ready, terminating, suspension).
    dirty: bool,
    reached_max_uncounted: bool,
    satisfied: bool,
    active_count: i32,
}

impl Sync {
    /// Step 1: what `pods` (the Job's own, from the cache) say. `expected_rm` are pods whose
    /// finalizer this controller removed but the cache still shows; `backoff` the Job's record.
    pub fn new(
        job: &Job,
        pods: Vec<Arc<Pod>>,
        expected_rm: HashSet<String>,
        backoff: &BackoffRecord,
        now: DateTime<Utc>,
    ) -> Result<Self, Skip> {
        if finished_type(job).is_some() {
            return Err(Skip::Finished);
        }
        let spec = job.spec.clone().unwrap_or_default();
        if let Some(m) = spec.managed_by.as_deref().filter(|m| *m != MANAGED_BY) {
            return Err(Skip::ManagedElsewhere(m.into()));
        }
        if !matches!(
            spec.completion_mode.as_deref(),
            None | Some("NonIndexed" | "Indexed")
        ) {
            return Err(Skip::UnknownCompletionMode);
        }
        let mut job = job.clone();
        let status = job.status.get_or_insert_with(JobStatus::default);
        let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
        let uncounted_succeeded: HashSet<String> =
            uncounted.succeeded.unwrap_or_default().into_iter().collect();
        let uncounted_failed: HashSet<String> = uncounted.failed.unwrap_or_default().into_iter().collect();
        let active: Vec<Arc<Pod>> = pods.iter().filter(|p| is_active(p)).cloned().collect();
        let terminating = pods.iter().filter(|p| is_terminating(p)).count() as i32;
        let ready = active.iter().filter(|p| is_ready(p)).count() as i32;
        let mut s = Self {
            job,
            active,
            finished: None,
            prev_succeeded_ix: Intervals::default(),
            succeeded_ix: Intervals::default(),
            failed_ix: None,
            uncounted_succeeded,
            uncounted_failed,
            expected_rm,
            delayed: HashMap::new(),
            terminating,
            ready,
            succeeded: 0,
            failed: 0,
            new_backoff: BackoffRecord::default(),
            now,
            dirty: false,
            reached_max_uncounted: false,
            satisfied: true,
            active_count: 0,
            pods,
        };
        s.active_count = s.active.len() as i32;
        let new_succeeded: Vec<&Pod> = s
            .valid_uncounted_pods(&s.uncounted_succeeded)
            .filter(|p| phase(p) == "Succeeded")
            .collect();
        let new_failed: Vec<&Pod> = s
            .valid_uncounted_pods(&s.uncounted_failed)
            .filter(|p| is_pod_failed(p, &s.job))
            .collect();
        let policy = spec.pod_failure_policy.as_ref();
        let counted_failures = new_failed
            .iter()
            .filter(|p| match_failure_policy(policy, p).counts)
            .count() as i32;
        let st = s.status();
        let succeeded =
            st.succeeded.unwrap_or(0) + new_succeeded.len() as i32 + s.uncounted_succeeded.len() as i32;
        let failed = st.failed.unwrap_or(0) + counted_failures + s.uncounted_failed.len() as i32;
        let new_backoff = backoff.after(&new_succeeded, &new_failed);
        s.succeeded = succeeded;
        s.failed = failed;
        s.new_backoff = new_backoff;
        Ok(s)
    }

    fn status(&self) -> &JobStatus {
        self.job.status.as_ref().expect("set in new")
    }

    fn status_mut(&mut self) -> &mut JobStatus {
        self.job.status.get_or_insert_with(JobStatus::default)
    }

    fn spec(&self) -> k8s_openapi::api::batch::v1::JobSpec {
        self.job.spec.clone().unwrap_or_default()
    }

    fn completions(&self) -> i32 {
        self.job.spec.as_ref().and_then(|s| s.completions).unwrap_or(0)
    }

    /// Pods still holding the finalizer, not in `uncounted`, not expected to lose the finalizer,
    /// and (Indexed) with a valid index: finished pods not yet accounted for.
    fn valid_uncounted_pods<'a>(
        &'a self,
        uncounted: &'a HashSet<String>,
    ) -> impl Iterator<Item = &'a Pod> + 'a {
        let indexed = is_indexed(&self.job);
        let completions = self.completions();
        self.pods.iter().map(|p| &**p).filter(move |p| {
            has_finalizer(p)
                && !uncounted.contains(uid(p))
                && !self.expected_rm.contains(uid(p))
                && (!indexed || completion_index(p).is_some_and(|i| i < completions))
        })
    }

    fn failure(&self, reason: &str, message: &str) -> JobCondition {
        condition("FailureTarget", "True", reason, message, self.now)
    }

    /// Step 2. `satisfied`: no pod creation or deletion of this controller is still on its way
    /// to the cache.
    pub fn decide(&mut self, satisfied: bool) -> Actions {
        let mut actions = Actions::default();
        self.satisfied = satisfied;
        let spec = self.spec();
        let suspended = is_suspended(&self.job);
        if self.status().start_time.is_none() && !suspended {
            self.status_mut().start_time = Some(Time(self.now));
        }
        let conds = self.status().conditions.clone().unwrap_or_default();
        self.finished = find(&conds, "SuccessCriteriaMet")
            .filter(|c| c.status == "True")
            .cloned();
        if self.finished.is_none() {
            if let Some(target) = find(&conds, "FailureTarget").filter(|c| c.status == "True") {
                self.finished = Some(condition(
                    "Failed",
                    "True",
                    target.reason.as_deref().unwrap_or_default(),
                    target.message.as_deref().unwrap_or_default(),
                    self.now,
                ));
            } else if let Some(message) = self.fail_job_message() {
                self.finished = Some(self.failure("PodFailurePolicy", &message));
            }
        }
        if self.finished.is_none() {
            let limit = spec.backoff_limit.unwrap_or(6);
            if self.failed > limit || self.past_backoff_limit_on_failure(limit) {
                self.finished = Some(self.failure(
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                ));
            } else if let Some(left) = self.deadline_left() {
                if left.is_zero() {
                    self.finished = Some(self.failure(
                        "DeadlineExceeded",
                        "Job was active longer than specified deadline",
                    ));
                } else {
                    actions.requeue = Some(left);
                }
            }
        }
        if is_indexed(&self.job) {
            self.index_counts();
        }
        if let Some(_finishing) = &self.finished {
            // Every active pod goes; the Job is finished once they are gone.
            actions.delete_keeping_finalizer = self.active.clone();
            if !satisfied {
                self.finished = None;
            }
            let deleted = self.active.len() as i32;
            let deleted_ready = self.active.iter().filter(|p| is_ready(p)).count() as i32;
            self.active_count -= deleted;
            self.terminating += deleted;
            self.ready -= deleted_ready;
        } else {
            let mut managed = false;
            if satisfied && self.job.metadata.deletion_timestamp.is_none() {
                self.manage(&mut actions);
                managed = true;
            }
            let complete = match spec.completions {
                None => self.succeeded > 0 && self.active_count == 0,
                Some(c) => self.succeeded >= c && self.active_count == 0,
            };
            if complete {
                self.finished = Some(condition(
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    self.now,
                ));
            } else if managed {
                self.suspension(suspended, &mut actions);
            }
        }
        let st = self.status();
        let active = (self.active_count > 0).then_some(self.active_count);
        if st.active != active || st.ready != Some(self.ready) || st.terminating != Some(self.terminating) {
            self.dirty = true;
        }
        let (ready, terminating) = (self.ready, self.terminating);
        let st = self.status_mut();
        st.active = active;
        st.ready = Some(ready);
        st.terminating = Some(terminating);
        actions
    }

    /// Adjusts the counts for writes of step 2 that failed: creations that did not happen, and
    /// whether every deletion of a finishing Job went through.
    pub fn outcome(&mut self, failed_creates: i32, all_finishing_deletes_done: bool) {
        if failed_creates > 0 {
            self.active_count -= failed_creates;
            let active = (self.active_count > 0).then_some(self.active_count);
            self.status_mut().active = active;
        }
        if !all_finishing_deletes_done
            && self
                .finished
                .as_ref()
                .is_some_and(|c| c.type_ != "SuccessCriteriaMet")
        {
            self.finished = None;
        }
    }

    fn fail_job_message(&self) -> Option<String> {
        let policy = self.job.spec.as_ref()?.pod_failure_policy.as_ref()?;
        self.pods
            .iter()
            .filter(|p| is_pod_failed(p, &self.job))
            .find_map(|p| match_failure_policy(Some(policy), p).fail_job)
    }

    /// With restartPolicy OnFailure, container restarts of running pods count against the limit.
    fn past_backoff_limit_on_failure(&self, limit: i32) -> bool {
        let restart = self
            .job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.restart_policy.as_deref());
        if restart != Some("OnFailure") {
            return false;
        }
        let restarts: i32 = self
            .pods
            .iter()
            .filter(|p| matches!(phase(p), "Running" | "Pending"))
            .filter_map(|p| p.status.as_ref())
            .flat_map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
            })
            .map(|c| c.restart_count)
            .sum();
        if limit == 0 {
            restarts > 0
        } else {
            restarts >= limit
        }
    }

    /// Time left before activeDeadlineSeconds (None without a deadline, or while suspended).
    fn deadline_left(&self) -> Option<Duration> {
        let ads = self.job.spec.as_ref()?.active_deadline_seconds?;
        if is_suspended(&self.job) {
            return None;
        }
        let start = self.status().start_time.as_ref()?.0;
        let allowed = Duration::from_secs(u64::try_from(ads).unwrap_or(0));
        let elapsed = (self.now - start).to_std().unwrap_or(Duration::ZERO);
        Some(allowed.saturating_sub(elapsed))
    }

    /// Indexed Jobs: succeeded and failed indexes, and the failure conditions they imply.
    fn index_counts(&mut self) {
        let completions = self.completions();
        let st = self.status().clone();
        self.prev_succeeded_ix =
            Intervals::parse(st.completed_indexes.as_deref().unwrap_or_default(), completions);
        let mut new: Vec<i32> = self
            .pods
            .iter()
            .filter(|p| phase(p) == "Succeeded" && has_finalizer(p))
            .filter_map(|p| completion_index(p))
            .filter(|i| *i < completions)
            .collect();
        new.sort_unstable();
        new.dedup();
        self.succeeded_ix = self.prev_succeeded_ix.with(&new);
        self.succeeded = self.succeeded_ix.total();
        let spec = self.spec();
        if let Some(per_index) = spec.backoff_limit_per_index {
            let prev = Intervals::parse(st.failed_indexes.as_deref().unwrap_or_default(), completions);
            let mut failed: Vec<i32> = self
                .pods
                .iter()
                .filter(|p| has_finalizer(p))
                .filter(|p| self.index_failed(p, per_index))
                .filter_map(|p| completion_index(p))
                .filter(|i| *i < completions)
                .collect();
            failed.sort_unstable();
            failed.dedup();
            let failed_ix = prev.with(&failed);
            if self.finished.is_none() {
                if spec.max_failed_indexes.is_some_and(|m| failed_ix.total() > m) {
                    self.finished = Some(self.failure(
                        "MaxFailedIndexesExceeded",
                        "Job has exceeded the specified maximal number of failed indexes",
                    ));
                } else if failed_ix.total() > 0
                    && failed_ix.total() + self.succeeded_ix.total() >= completions
                {
                    self.finished = Some(self.failure("FailedIndexes", "Job has failed indexes"));
                }
            }
            self.failed_ix = Some(failed_ix);
            self.delayed = self.pods_with_delayed_deletion();
        }
        if self.finished.is_none()
            && let Some(message) =
                match_success_policy(spec.success_policy.as_ref(), completions, &self.succeeded_ix)
        {
            self.finished = Some(condition(
                "SuccessCriteriaMet",
                "True",
                "SuccessPolicy",
                &message,
                self.now,
            ));
        }
    }

    /// A failed pod that fails its index: a FailIndex rule, or a counted failure with the index's
    /// failures at backoffLimitPerIndex.
    fn index_failed(&self, p: &Pod, per_index: i32) -> bool {
        if !is_pod_failed(p, &self.job) {
            return false;
        }
        let verdict = match_failure_policy(
            self.job.spec.as_ref().and_then(|s| s.pod_failure_policy.as_ref()),
            p,
        );
        if verdict.action == Some(Action::FailIndex) {
            return true;
        }
        verdict.counts && index_failure_count(p) >= per_index
    }

    /// For each index waiting for a replacement, the last failed pod, kept (its finalizer stays)
    /// until the replacement inherits its failure count.
    fn pods_with_delayed_deletion(&self) -> HashMap<i32, Arc<Pod>> {
        let completions = self.completions();
        let active: HashSet<i32> = self.active.iter().filter_map(|p| completion_index(p)).collect();
        let failed_ix = self.failed_ix.clone().unwrap_or_default();
        let mut out: HashMap<i32, Arc<Pod>> = HashMap::new();
        for p in &self.pods {
            if !has_finalizer(p) || self.expected_rm.contains(uid(p)) || !is_pod_failed(p, &self.job) {
                continue;
            }
            let Some(ix) = completion_index(p).filter(|i| *i < completions) else {
                continue;
            };
            if self.succeeded_ix.has(ix) || failed_ix.has(ix) || active.contains(&ix) {
                continue;
            }
            match out.get(&ix) {
                Some(last)
                    if !(index_absolute_failure_count(last) <= index_absolute_failure_count(p)
                        && finished_at(p) >= finished_at(last)) => {}
                _ => {
                    out.insert(ix, p.clone());
                }
            }
        }
        out
    }

    /// upstream's `manageJob`: delete on suspend or surplus, else create what is missing
    /// (after the failure back-off).
    fn manage(&mut self, actions: &mut Actions) {
        let spec = self.spec();
        if is_suspended(&self.job) {
            let victims = self.removal_candidates(self.active.len());
            self.take_deleted(&victims);
            actions.delete = victims;
            return;
        }
        let parallelism = spec.parallelism.unwrap_or(1);
        let want = match spec.completions {
            None if self.succeeded > 0 => self.active_count,
            None => parallelism,
            Some(c) => (c - self.succeeded).min(parallelism).max(0),
        };
        let surplus = usize::try_from(self.active_count - want).unwrap_or(0);
        let mut victims = self.removal_candidates(surplus);
        victims.truncate(MAX_CREATE_DELETE);
        if !victims.is_empty() {
            self.take_deleted(&victims);
            actions.delete = victims;
            return;
        }
        let terminating = if only_replace_failed(&self.job) {
            self.terminating
        } else {
            0
        };
        let diff = want - terminating - self.active_count;
        if diff <= 0 {
            return;
        }
        let per_index = spec.backoff_limit_per_index.is_some();
        if !per_index {
            let left = self.new_backoff.remaining(self.now);
            if !left.is_zero() {
                actions.requeue = Some(actions.requeue.map_or(left, |r| r.min(left)));
                return;
            }
        }
        let diff = usize::try_from(diff).unwrap_or(0).min(MAX_CREATE_DELETE);
        let create: Vec<NewPod> = if is_indexed(&self.job) {
            let mut indexes = self.first_pending_indexes(diff);
            if per_index {
                let mut soonest: Option<Duration> = None;
                indexes.retain(|ix| {
                    let left = self.index_backoff_left(*ix);
                    if !left.is_zero() {
                        soonest = Some(soonest.map_or(left, |s| s.min(left)));
                    }
                    left.is_zero()
                });
                if indexes.is_empty() {
                    if let Some(s) = soonest {
                        actions.requeue = Some(actions.requeue.map_or(s, |r| r.min(s)));
                    }
                    return;
                }
            }
            indexes
                .into_iter()
                .map(|ix| NewPod {
                    index: Some(ix),
                    failure_counts: per_index.then(|| self.inherited_failure_counts(ix)),
                })
                .collect()
        } else {
            vec![
                NewPod {
                    index: None,
                    failure_counts: None,
                };
                diff
            ]
        };
        self.active_count += create.len() as i32;
        actions.create = create;
    }

    fn take_deleted(&mut self, victims: &[Arc<Pod>]) {
        let n = victims.len() as i32;
        self.active_count -= n;
        self.terminating += n;
        self.ready -= victims.iter().filter(|p| is_ready(p)).count() as i32;
    }

    /// Per-index back-off: the index's last failed pod and its failure count.
    fn index_backoff_left(&self, ix: i32) -> Duration {
        match self.delayed.get(&ix) {
            None => Duration::ZERO,
            Some(p) => backoff_remaining(
                index_absolute_failure_count(p) + 1,
                Some(finished_at(p)),
                self.now,
            ),
        }
    }

    /// The failure counts a replacement in index `ix` carries.
    fn inherited_failure_counts(&self, ix: i32) -> (i32, i32) {
        let Some(p) = self.delayed.get(&ix) else {
            return (0, 0);
        };
        let (mut failed, mut ignored) = (
            index_failure_count(p),
            super::policy::index_absolute_failure_count(p) - index_failure_count(p),
        );
        let policy = self.job.spec.as_ref().and_then(|s| s.pod_failure_policy.as_ref());
        if match_failure_policy(policy, p).counts {
            failed += 1;
        } else {
            ignored += 1;
        }
        (failed, ignored)
    }

    /// Indexes below `completions` with no active, succeeded or failed pod (nor, when only failed
    /// pods are replaced, a terminating one), lowest first.
    fn first_pending_indexes(&self, count: usize) -> Vec<i32> {
        let completions = self.completions();
        let mut taken: Vec<i32> = self.active.iter().filter_map(|p| completion_index(p)).collect();
        if only_replace_failed(&self.job) {
            taken.extend(
                self.pods
                    .iter()
                    .filter(|p| is_terminating(p))
                    .filter_map(|p| completion_index(p)),
            );
        }
        taken.sort_unstable();
        taken.dedup();
        let mut busy = self.succeeded_ix.with(&taken);
        if let Some(f) = &self.failed_ix {
            busy = busy.merge(f);
        }
        let mut out = Vec::with_capacity(count);
        let mut ix = 0;
        while ix < completions && out.len() < count {
            if !busy.has(ix) {
                out.push(ix);
            }
            ix += 1;
        }
        out
    }

    /// At least `n` active pods to remove: (Indexed) pods without a valid index or repeating
    /// one, then in upstream's `ActivePods` order (earlier stages first).
    fn removal_candidates(&self, n: usize) -> Vec<Arc<Pod>> {
        let mut rm: Vec<Arc<Pod>> = Vec::new();
        let mut left: Vec<Arc<Pod>> = Vec::new();
        if is_indexed(&self.job) {
            let completions = self.completions();
            let mut by_index: HashMap<i32, Vec<Arc<Pod>>> = HashMap::new();
            for p in &self.active {
                match completion_index(p).filter(|i| *i < completions) {
                    Some(ix) => by_index.entry(ix).or_default().push(p.clone()),
                    None => rm.push(p.clone()),
                }
            }
            let mut indexes: Vec<i32> = by_index.keys().copied().collect();
            indexes.sort_unstable();
            for ix in indexes {
                let mut same = by_index.remove(&ix).unwrap_or_default();
                same.sort_by(|a, b| remove_first(a, b));
                if let Some(keep) = same.pop() {
                    left.push(keep);
                }
                rm.extend(same);
            }
        } else {
            left = self.active.clone();
        }
        if rm.len() < n {
            left.sort_by(|a, b| remove_first(a, b));
            let more = n - rm.len();
            rm.extend(left.into_iter().take(more));
        }
        rm
    }

    /// Suspended / resumed condition and events (only when pods were managed this sync).
    fn suspension(&mut self, suspended: bool, actions: &mut Actions) {
        let now = self.now;
        let conds = self.status_mut().conditions.get_or_insert_with(Vec::new);
        if suspended {
            if ensure(conds, "Suspended", "True", "JobSuspended", "Job suspended", now) {
                self.dirty = true;
                actions
                    .events
                    .push(event(Kind::Normal, "Suspended", "Job suspended"));
            }
        } else if ensure(conds, "Suspended", "False", "JobResumed", "Job resumed", now) {
            self.dirty = true;
            actions.events.push(event(Kind::Normal, "Resumed", "Job resumed"));
            // activeDeadlineSeconds counts the time the Job is continuously active.
            self.status_mut().start_time = Some(Time(now));
        }
        if self.status().conditions.as_ref().is_some_and(Vec::is_empty) {
            self.status_mut().conditions = None;
        }
    }

    /// Step 3 (upstream's `trackJobStatusAndRemoveFinalizers` up to the first write).
    pub fn track(&mut self) -> Flush {
        let mut flush = Flush {
            write_status: self.dirty,
            remove_finalizers: Vec::new(),
        };
        let indexed = is_indexed(&self.job);
        let completions = self.completions();
        let with_finalizer: HashSet<String> = self
            .pods
            .iter()
            .filter(|p| has_finalizer(p) && !self.expected_rm.contains(uid(p)))
            .map(|p| uid(p).to_string())
            .collect();
        if self.count_finalized(&with_finalizer) {
            flush.write_status = true;
        }
        let mut pods = self.pods.clone();
        if indexed {
            pods.sort_by_key(|p| completion_index(p).map_or(-1, i64::from));
        }
        let policy = self.job.spec.as_ref().and_then(|s| s.pod_failure_policy.clone());
        let failing = self
            .finished
            .as_ref()
            .is_some_and(|c| c.type_ != "SuccessCriteriaMet");
        let mut new_succeeded_ix: Vec<i32> = Vec::new();
        let mut uncounted = self
            .status()
            .uncounted_terminated_pods
            .clone()
            .unwrap_or_default();
        let mut unc_succeeded = uncounted.succeeded.take().unwrap_or_default();
        let mut unc_failed = uncounted.failed.take().unwrap_or_default();
        for p in &pods {
            let id = uid(p);
            if !has_finalizer(p) || self.expected_rm.contains(id) {
                continue;
            }
            let failed = is_pod_failed(p, &self.job);
            if !self.can_remove_finalizer(p, failed) {
                continue;
            }
            flush.remove_finalizers.push(p.clone());
            if phase(p) == "Succeeded" && !self.uncounted_failed.contains(id) {
                if indexed {
                    if let Some(ix) = completion_index(p).filter(|i| *i < completions)
                        && !self.prev_succeeded_ix.has(ix)
                    {
                        new_succeeded_ix.push(ix);
                        flush.write_status = true;
                    }
                } else if !self.uncounted_succeeded.contains(id) {
                    unc_succeeded.push(id.to_string());
                    self.uncounted_succeeded.insert(id.to_string());
                    flush.write_status = true;
                }
            } else if (failed || failing)
                && !self.uncounted_failed.contains(id)
                && (!indexed || completion_index(p).is_some_and(|i| i < completions))
                && match_failure_policy(policy.as_ref(), p).counts
            {
                unc_failed.push(id.to_string());
                self.uncounted_failed.insert(id.to_string());
                flush.write_status = true;
            }
            if new_succeeded_ix.len() + unc_succeeded.len() + unc_failed.len() >= MAX_UNCOUNTED {
                self.reached_max_uncounted = true;
                break;
            }
        }
        self.set_uncounted(unc_succeeded, unc_failed);
        if indexed {
            new_succeeded_ix.sort_unstable();
            new_succeeded_ix.dedup();
            self.succeeded_ix = self.succeeded_ix.with(&new_succeeded_ix);
            let completed = self.succeeded_ix.to_string();
            let total = self.succeeded_ix.total();
            let failed_ix = self.failed_ix.as_ref().map(ToString::to_string);
            let st = self.status_mut();
            if st.completed_indexes.as_deref().unwrap_or_default() != completed {
                flush.write_status = true;
            }
            st.completed_indexes = (!completed.is_empty()).then_some(completed);
            st.succeeded = (total > 0).then_some(total);
            if st.failed_indexes != failed_ix {
                st.failed_indexes = failed_ix;
                flush.write_status = true;
            }
        }
        // Interim conditions are written before any finalizer goes.
        if let Some(c) = self.finished.clone() {
            let conds = self.status_mut().conditions.get_or_insert_with(Vec::new);
            match c.type_.as_str() {
                "FailureTarget" => {
                    conds.push(c.clone());
                    flush.write_status = true;
                    self.finished = Some(condition(
                        "Failed",
                        "True",
                        reason_of(&c),
                        message_of(&c),
                        self.now,
                    ));
                }
                "SuccessCriteriaMet" => {
                    if !is_true(conds, "SuccessCriteriaMet") {
                        conds.push(c.clone());
                        flush.write_status = true;
                    }
                    self.finished = Some(condition(
                        "Complete",
                        "True",
                        reason_of(&c),
                        message_of(&c),
                        self.now,
                    ));
                }
                _ => {}
            }
        }
        flush
    }

    fn can_remove_finalizer(&self, p: &Pod, failed: bool) -> bool {
        if self.job.metadata.deletion_timestamp.is_some()
            || self.finished.is_some()
            || phase(p) == "Succeeded"
        {
            return true;
        }
        if !failed {
            return false;
        }
        if self.failed_ix.is_some()
            && let Some(ix) = completion_index(p)
            && self.delayed.get(&ix).is_some_and(|d| uid(d) == uid(p))
        {
            return false;
        }
        true
    }

    fn set_uncounted(&mut self, succeeded: Vec<String>, failed: Vec<String>) {
        let st = self.status_mut();
        st.uncounted_terminated_pods = Some(UncountedTerminatedPods {
            succeeded: (!succeeded.is_empty()).then_some(succeeded),
            failed: (!failed.is_empty()).then_some(failed),
        });
    }

    /// Moves the uncounted pods not in `with_finalizer` (their finalizer is gone) into the
    /// counters. Returns whether anything moved.
    fn count_finalized(&mut self, with_finalizer: &HashSet<String>) -> bool {
        let u = self
            .status()
            .uncounted_terminated_pods
            .clone()
            .unwrap_or_default();
        let (s, f) = (u.succeeded.unwrap_or_default(), u.failed.unwrap_or_default());
        let (s_keep, s_done): (Vec<String>, Vec<String>) =
            s.into_iter().partition(|id| with_finalizer.contains(id));
        let (f_keep, f_done): (Vec<String>, Vec<String>) =
            f.into_iter().partition(|id| with_finalizer.contains(id));
        if s_done.is_empty() && f_done.is_empty() {
            return false;
        }
        let st = self.status_mut();
        let succeeded = st.succeeded.unwrap_or(0) + s_done.len() as i32;
        let failed = st.failed.unwrap_or(0) + f_done.len() as i32;
        st.succeeded = (succeeded > 0).then_some(succeeded);
        st.failed = (failed > 0).then_some(failed);
        self.set_uncounted(s_keep, f_keep);
        true
    }

    /// Step 4: `still_with_finalizer` are the pods that kept their finalizer (removal not done
    /// or failed). Counts the others and finishes the Job when nothing is left uncounted or
    /// terminating.
    pub fn settle(&mut self, still_with_finalizer: &HashSet<String>) -> Settled {
        let mut out = Settled::default();
        if self.count_finalized(still_with_finalizer) {
            out.write_status = true;
        }
        let Some(fin) = self.finished.clone() else {
            return out;
        };
        if self.reached_max_uncounted {
            return out;
        }
        let u = self
            .status()
            .uncounted_terminated_pods
            .clone()
            .unwrap_or_default();
        if u.succeeded.is_some_and(|v| !v.is_empty()) || u.failed.is_some_and(|v| !v.is_empty()) {
            return out;
        }
        if self.terminating > 0 {
            return out;
        }
        let now = self.now;
        let conds = self.status_mut().conditions.get_or_insert_with(Vec::new);
        ensure(conds, &fin.type_, "True", reason_of(&fin), message_of(&fin), now);
        if fin.type_ == "Complete" {
            self.status_mut().completion_time = Some(Time(now));
            let completions = self.completions();
            let succeeded = self.status().succeeded.unwrap_or(0);
            if self.job.spec.as_ref().and_then(|s| s.completions).is_some() && succeeded > completions {
                out.events.push(event(
                    Kind::Warning,
                    "TooManySucceededPods",
                    "Too many succeeded pods running after completion count reached",
                ));
            }
            out.events.push(event(Kind::Normal, "Completed", "Job completed"));
        } else {
            out.events
                .push(event(Kind::Warning, reason_of(&fin), message_of(&fin)));
        }
        out.write_status = true;
        out
    }
}

fn reason_of(c: &JobCondition) -> &str {
    c.reason.as_deref().unwrap_or_default()
}

fn message_of(c: &JobCondition) -> &str {
    c.message.as_deref().unwrap_or_default()
}

fn stage(p: &Pod) -> u8 {
    match phase(p) {
        "Pending" | "" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 3,
    }
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0)
}

/// `a` before `b` when `a` should be removed first (upstream's `controller.ActivePods`):
/// unscheduled, Pending < Unknown < Running, not ready, ready for less time, more restarts, newer.
fn remove_first(a: &Pod, b: &Pod) -> Ordering {
    let node = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let (na, nb) = (node(a).is_empty(), node(b).is_empty());
    if na != nb {
        return if na { Ordering::Less } else { Ordering::Greater };
    }
    let o = stage(a).cmp(&stage(b));
    if o != Ordering::Equal {
        return o;
    }
    let (ra, rb) = (is_ready(a), is_ready(b));
    if ra != rb {
        return if ra { Ordering::Greater } else { Ordering::Less };
    }
    if ra && rb {
        let o = ready_since(b).cmp(&ready_since(a));
        if o != Ordering::Equal {
            return o;
        }
    }
    let o = restarts(b).cmp(&restarts(a));
    if o != Ordering::Equal {
        return o;
    }
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(b).cmp(&created(a))
}

/// The generateName of a pod: `<job>-` or, Indexed, `<job>-<index>-` (trimmed to 58 characters
/// keeping the index).
pub fn generate_name(job: &str, index: Option<i32>) -> String {
    let suffix = match index {
        Some(ix) => format!("-{ix}-"),
        None => "-".into(),
    };
    let mut base = job.to_string();
    let room = MAX_GENERATED_NAME.saturating_sub(suffix.len());
    if base.len() > room {
        let mut cut = room;
        while !base.is_char_boundary(cut) {
            cut -= 1;
        }
        base.truncate(cut);
    }
    format!("{base}{suffix}")
}

/// The pod the Job creates for `new`: the template's metadata and spec, the Job's labels
/// (`batch.kubernetes.io/controller-uid`, `batch.kubernetes.io/job-name` and their legacy
/// forms, which upstream's API server adds to the template), the tracking finalizer, and for
/// Indexed Jobs the completion index (annotation, label, `JOB_COMPLETION_INDEX`, hostname
/// `<job>-<index>`) and the inherited failure counts.
pub fn pod_for(job: &Job, new: &NewPod) -> Pod {
    let name = job.metadata.name.clone().unwrap_or_default();
    let job_uid = job.metadata.uid.clone().unwrap_or_default();
    let template = job.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let tm = template.metadata.clone().unwrap_or_default();
    let mut labels = tm.labels.unwrap_or_default();
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &job_uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &job_uid),
        ("job-name", &name),
    ] {
        labels.entry(k.to_string()).or_insert_with(|| v.clone());
    }
    let mut annotations = tm.annotations.unwrap_or_default();
    let mut finalizers = tm.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    let mut spec = template.spec.unwrap_or_default();
    if let Some(ix) = new.index {
        annotations.insert(COMPLETION_INDEX.into(), ix.to_string());
        labels.insert(COMPLETION_INDEX.into(), ix.to_string());
        spec.hostname = Some(format!("{name}-{ix}"));
        let env = EnvVar {
            name: COMPLETION_INDEX_ENV.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: format!("metadata.labels['{COMPLETION_INDEX}']"),
                }),
                ..EnvVarSource::default()
            }),
        };
        for c in spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(spec.containers.iter_mut())
        {
            let list = c.env.get_or_insert_with(Vec::new);
            if !list.iter().any(|e| e.name == COMPLETION_INDEX_ENV) {
                list.push(env.clone());
            }
        }
    }
    if let Some((failed, ignored)) = new.failure_counts {
        annotations.insert(INDEX_FAILURE_COUNT.into(), failed.to_string());
        if ignored > 0 {
            annotations.insert(INDEX_IGNORED_FAILURE_COUNT.into(), ignored.to_string());
        }
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name(&name, new.index)),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            finalizers: Some(finalizers),
            owner_references: Some(vec![controller_owner("batch/v1", "Job", &job.metadata)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}
