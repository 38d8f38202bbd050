//! One pass over an HPA (docs/SEEDS-SPEC.md CTL-49..CTL-51; upstream `reconcileAutoscaler`):
//! from the target's scale, the pods it selects and their samples, the replica count to set,
//! the status to write and the events to record. Pure: the caller reads and writes the API.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus, MetricTarget, MetricValueStatus,
    PodsMetricStatus, ResourceMetricSource, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::behavior::{History, normalize};
use super::calculator::{PodMetrics, Timing, Tolerances, milli_value, plain_replicas, resource_replicas};
use super::metrics::{MetricsError, PodMetricsList, pod_samples};
use crate::api::object::selector::{Requirement, matches_with, parse_label_selector};
use crate::events::Kind;

/// CPU utilization the API gives an HPA that names no metric (upstream's
/// `DefaultCPUUtilization`).
pub const DEFAULT_CPU_UTILIZATION: i32 = 80;

/// What the target's `/scale` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleView {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.selector`.
    pub selector: Option<String>,
}

/// What a pass reads besides the HPA and its history.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub scale: ScaleView,
    /// Pods of the HPA's namespace (the pass keeps those the scale's selector selects).
    pub pods: &'a [&'a Pod],
    /// The resource metrics API's answer for the selector (the error text as the client
    /// reports it).
    pub resource_metrics: &'a Result<PodMetricsList, String>,
    /// Samples of pods metrics by metric name, from a custom metrics API (none served here).
    pub pods_metrics: &'a BTreeMap<String, Result<PodMetrics, String>>,
    pub timing: Timing,
}

/// An event to record about the HPA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HpaEvent {
    pub kind: Kind,
    pub reason: &'static str,
    pub message: String,
}

/// A scale change to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescale {
    pub desired: i32,
    pub reason: String,
}

/// The outcome of a pass: the status to write (final unless `rescale` is set: then
/// [`Plan::rescaled`] finishes it), the change to make, the events, and the error the pass ends
/// with (retried with back-off).
#[derive(Debug, Clone)]
pub struct Plan {
    pub status: HorizontalPodAutoscalerStatus,
    pub rescale: Option<Rescale>,
    pub events: Vec<HpaEvent>,
    pub error: Option<String>,
    current: i32,
    metrics: Option<Vec<MetricStatus>>,
}

fn event(kind: Kind, reason: &'static str, message: impl Into<String>) -> HpaEvent {
    HpaEvent {
        kind,
        reason,
        message: message.into(),
    }
}

/// Sets a condition; its transition time moves only when its status changes (upstream's
/// `setConditionInList`).
pub fn set_condition(
    status: &mut HorizontalPodAutoscalerStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
) {
    let value = if value { "True" } else { "False" };
    let conds = status.conditions.get_or_insert_with(Vec::new);
    let i = match conds.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conds.push(HorizontalPodAutoscalerCondition {
                type_: type_.into(),
                ..Default::default()
            });
            conds.len() - 1
        }
    };
    let c = &mut conds[i];
    if c.status != value {
        c.last_transition_time = Some(Time(now));
    }
    c.status = value.into();
    c.reason = Some(reason.into());
    c.message = Some(message.into());
}

/// The status with the counts and metrics of this pass (upstream's `setStatus`).
fn with_counts(
    hpa: &HorizontalPodAutoscaler,
    old: &HorizontalPodAutoscalerStatus,
    current: i32,
    desired: i32,
    metrics: Option<Vec<MetricStatus>>,
    rescaled_at: Option<DateTime<Utc>>,
) -> HorizontalPodAutoscalerStatus {
    HorizontalPodAutoscalerStatus {
        // `omitempty` upstream: a zero is not written.
        current_replicas: (current != 0).then_some(current),
        desired_replicas: desired,
        last_scale_time: rescaled_at.map(Time).or_else(|| old.last_scale_time.clone()),
        current_metrics: metrics,
        conditions: old.conditions.clone(),
        observed_generation: hpa.metadata.generation.or(old.observed_generation),
    }
}

/// A Go `labels.Selector` over pod labels.
fn selects(reqs: &[Requirement], pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    matches_with(reqs, |k| labels.and_then(|l| l.get(k)).map(String::as_str))
}

/// The metrics of an HPA, with the API's default when it names none.
pub fn metric_specs(hpa: &HorizontalPodAutoscaler) -> Vec<MetricSpec> {
    match hpa.spec.as_ref().and_then(|s| s.metrics.clone()) {
        Some(m) if !m.is_empty() => m,
        _ => vec![MetricSpec {
            type_: "Resource".into(),
            resource: Some(ResourceMetricSource {
                name: "cpu".into(),
                target: MetricTarget {
                    type_: "Utilization".into(),
                    average_utilization: Some(DEFAULT_CPU_UTILIZATION),
                    ..Default::default()
                },
            }),
            ..Default::default()
        }],
    }
}

/// A milli-value as `resource.NewMilliQuantity(v, DecimalSI)` prints it.
pub fn milli_quantity(v: i64) -> Quantity {
    if v % 1000 != 0 {
        return Quantity(format!("{v}m"));
    }
    let mut n = v / 1000;
    let mut suffix = 0;
    const SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    while n != 0 && n % 1000 == 0 && suffix + 1 < SUFFIXES.len() {
        n /= 1000;
        suffix += 1;
    }
    Quantity(format!("{n}{}", SUFFIXES[suffix]))
}

/// One metric's proposal: (replicas, name used in the rescale reason, its status).
type Proposal = (i32, String, MetricStatus);

/// Why one metric gave no proposal: the `ScalingActive` reason, the condition's error, and the
/// error of the metric (upstream's `computeReplicasForMetric`).
#[derive(Debug, Clone)]
struct MetricFailure {
    reason: &'static str,
    condition_error: String,
    error: String,
}

fn fail(reason: &'static str, inner: String, outer: impl FnOnce(&str) -> String) -> MetricFailure {
    MetricFailure {
        reason,
        error: outer(&inner),
        condition_error: inner,
    }
}

/// A utilization or average-value proposal of a resource over all containers or one.
fn resource_proposal(
    current: i32,
    resource: &str,
    container: Option<&str>,
    target: &MetricTarget,
    pods: &[&Pod],
    inputs: &Inputs<'_>,
    tolerances: Tolerances,
) -> Result<(i32, String, MetricValueStatus), String> {
    let samples = || -> Result<PodMetrics, String> {
        let list = inputs
            .resource_metrics
            .as_ref()
            .map_err(|e| MetricsError::Fetch(e.clone()).to_string())?;
        pod_samples(list, resource, container).map_err(|e| e.to_string())
    };
    let unavailable = |e: String| format!("unable to get metrics for resource {resource}: {e}");
    if let Some(value) = &target.average_value {
        let target_milli = milli_value(&value.0).unwrap_or(0);
        let samples = samples()
            .map_err(unavailable)
            .map_err(|e| format!("failed to get {resource} utilization: {e}"))?;
        let (replicas, usage) = plain_replicas(
            current,
            target_milli,
            Some(resource),
            tolerances,
            pods,
            samples,
            &inputs.timing,
        )
        .map_err(|e| format!("failed to get {resource} utilization: {e}"))?;
        let status = MetricValueStatus {
            average_value: Some(milli_quantity(usage)),
            ..Default::default()
        };
        return Ok((replicas, format!("{resource} resource"), status));
    }
    let Some(target_utilization) = target.average_utilization else {
        return Err(
            "invalid resource metric source: neither an average utilization target nor an average value target was set"
                .into(),
        );
    };
    let samples = samples()
        .map_err(unavailable)
        .map_err(|e| format!("failed to get {resource} utilization: {e}"))?;
    let u = resource_replicas(
        current,
        target_utilization,
        resource,
        container,
        tolerances,
        pods,
        samples,
        &inputs.timing,
    )
    .map_err(|e| format!("failed to get {resource} utilization: {e}"))?;
    let name = match container {
        Some(_) => format!("{resource} container resource utilization (percentage of request)"),
        None => format!("{resource} resource utilization (percentage of request)"),
    };
    let status = MetricValueStatus {
        average_utilization: Some(u.utilization),
        average_value: Some(milli_quantity(u.raw)),
        ..Default::default()
    };
    Ok((u.replicas, name, status))
}

/// One metric's proposal (upstream's `computeReplicasForMetric`).
fn metric_proposal(
    spec: &MetricSpec,
    current: i32,
    pods: &[&Pod],
    inputs: &Inputs<'_>,
    tolerances: Tolerances,
    namespace: &str,
) -> Result<Proposal, MetricFailure> {
    match spec.type_.as_str() {
        "Resource" => {
            let Some(r) = &spec.resource else {
                return Err(fail(
                    "FailedGetResourceMetric",
                    "invalid resource metric source".into(),
                    |e| format!("failed to get resource metric value: {e}"),
                ));
            };
            let (replicas, name, current_value) = resource_proposal(
                current, &r.name, None, &r.target, pods, inputs, tolerances,
            )
            .map_err(|e| {
                fail("FailedGetResourceMetric", e, |e| {
                    format!("failed to get {} resource metric value: {e}", r.name)
                })
            })?;
            let status = MetricStatus {
                type_: "Resource".into(),
                resource: Some(ResourceMetricStatus {
                    name: r.name.clone(),
                    current: current_value,
                }),
                ..Default::default()
            };
            Ok((replicas, name, status))
        }
        "ContainerResource" => {
            let Some(r) = &spec.container_resource else {
                return Err(fail(
                    "FailedGetContainerResourceMetric",
                    "invalid container resource metric source".into(),
                    |e| format!("failed to get container metric value: {e}"),
                ));
            };
            let (replicas, name, current_value) = resource_proposal(
                current,
                &r.name,
                Some(&r.container),
                &r.target,
                pods,
                inputs,
                tolerances,
            )
            .map_err(|e| {
                fail("FailedGetContainerResourceMetric", e, |e| {
                    format!("failed to get {} container metric value: {e}", r.container)
                })
            })?;
            let status = MetricStatus {
                type_: "ContainerResource".into(),
                container_resource: Some(ContainerResourceMetricStatus {
                    name: r.name.clone(),
                    container: r.container.clone(),
                    current: current_value,
                }),
                ..Default::default()
            };
            Ok((replicas, name, status))
        }
        "Pods" => {
            let outer = |e: &str| format!("failed to get pods metric value: {e}");
            let Some(p) = &spec.pods else {
                return Err(fail(
                    "FailedGetPodsMetric",
                    "invalid pods metric source".into(),
                    outer,
                ));
            };
            let metric = &p.metric.name;
            let target = p
                .target
                .average_value
                .as_ref()
                .and_then(|q| milli_value(&q.0))
                .unwrap_or(0);
            let samples = match inputs.pods_metrics.get(metric) {
                Some(Ok(s)) => s.clone(),
                Some(Err(e)) => {
                    return Err(fail(
                        "FailedGetPodsMetric",
                        format!("unable to get metric {metric}: {e}"),
                        outer,
                    ));
                }
                None => {
                    return Err(fail(
                        "FailedGetPodsMetric",
                        format!(
                            "unable to get metric {metric}: unable to fetch metrics from custom metrics API: \
                             no custom metrics API (custom.metrics.k8s.io) registered"
                        ),
                        outer,
                    ));
                }
            };
            let (replicas, usage) =
                plain_replicas(current, target, None, tolerances, pods, samples, &inputs.timing)
                    .map_err(|e| fail("FailedGetPodsMetric", e.to_string(), outer))?;
            let status = MetricStatus {
                type_: "Pods".into(),
                pods: Some(PodsMetricStatus {
                    metric: p.metric.clone(),
                    current: MetricValueStatus {
                        average_value: Some(milli_quantity(usage)),
                        ..Default::default()
                    },
                }),
                ..Default::default()
            };
            Ok((replicas, format!("pods metric {metric}"), status))
        }
        "Object" => {
            let (metric, kind, name) = spec
                .object
                .as_ref()
                .map(|o| {
                    (
                        o.metric.name.as_str(),
                        o.described_object.kind.as_str(),
                        o.described_object.name.as_str(),
                    )
                })
                .unwrap_or_default();
            Err(fail(
                "FailedGetObjectMetric",
                format!(
                    "unable to get metric {metric}: unable to fetch metrics from custom metrics API: no custom \
                     metrics API (custom.metrics.k8s.io) registered on {kind} {namespace}/{name}"
                ),
                |e| format!("failed to get object metric value: {e}"),
            ))
        }
        "External" => {
            let metric = spec
                .external
                .as_ref()
                .map(|e| e.metric.name.as_str())
                .unwrap_or_default();
            Err(fail(
                "FailedGetExternalMetric",
                format!(
                    "unable to get external metric {namespace}/{metric}: unable to fetch metrics from external \
                     metrics API: no external metrics API (external.metrics.k8s.io) registered"
                ),
                |e| format!("failed to get {metric} external metric value: {e}"),
            ))
        }
        other => Err(fail(
            "InvalidMetricSourceType",
            format!("unknown metric source type {other:?}"),
            |e| e.to_string(),
        )),
    }
}

/// The largest proposal over the metrics (upstream's `computeReplicasForMetrics`); `Err` when
/// no count can be used: all metrics failed, or some failed and the others would scale down.
#[allow(clippy::type_complexity)]
fn metrics_proposal(
    hpa: &HorizontalPodAutoscaler,
    status: &mut HorizontalPodAutoscalerStatus,
    events: &mut Vec<HpaEvent>,
    inputs: &Inputs<'_>,
    tolerances: Tolerances,
    now: DateTime<Utc>,
) -> (
    Result<(i32, String), String>,
    Option<Vec<MetricStatus>>,
    Option<String>,
) {
    let namespace = hpa.metadata.namespace.as_deref().unwrap_or_default();
    let selector = inputs.scale.selector.as_deref().unwrap_or_default();
    if selector.is_empty() {
        events.push(event(Kind::Warning, "SelectorRequired", "selector is required"));
        set_condition(
            status,
            "ScalingActive",
            false,
            "InvalidSelector",
            "the HPA target's scale is missing a selector",
            now,
        );
        return (Err("selector is required".into()), None, None);
    }
    let reqs = match parse_label_selector(selector) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("couldn't convert selector into a corresponding internal selector object: {e}");
            events.push(event(Kind::Warning, "InvalidSelector", msg.clone()));
            set_condition(status, "ScalingActive", false, "InvalidSelector", &msg, now);
            return (Err(msg), None, None);
        }
    };
    let pods: Vec<&Pod> = inputs
        .pods
        .iter()
        .copied()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace) && selects(&reqs, p))
        .collect();
    let specs = metric_specs(hpa);
    let current = inputs.scale.replicas;
    let mut statuses = vec![MetricStatus::default(); specs.len()];
    let mut best: Option<(i32, String)> = None;
    let mut invalid = 0usize;
    let mut first: Option<MetricFailure> = None;
    for (i, spec) in specs.iter().enumerate() {
        match metric_proposal(spec, current, &pods, inputs, tolerances, namespace) {
            Ok((replicas, name, st)) => {
                statuses[i] = st;
                if best.as_ref().is_none_or(|(r, _)| *r == 0 || replicas > *r) {
                    best = Some((replicas, name));
                }
            }
            Err(f) => {
                // Every failed metric is recorded and reported as it happens.
                events.push(event(Kind::Warning, f.reason, f.condition_error.clone()));
                if first.is_none() {
                    first = Some(f);
                }
                invalid += 1;
            }
        }
    }
    let (replicas, name) = best.unwrap_or((0, String::new()));
    let error = first.as_ref().map(|f| {
        format!(
            "invalid metrics ({invalid} invalid out of {}), first error is: {}",
            specs.len(),
            f.error
        )
    });
    if let Some(f) = &first
        && (invalid >= specs.len() || replicas < current)
    {
        set_condition(
            status,
            "ScalingActive",
            false,
            f.reason,
            &format!(
                "the HPA was unable to compute the replica count: {}",
                f.condition_error
            ),
            now,
        );
        return (Err(error.unwrap_or_default()), Some(statuses), None);
    }
    set_condition(
        status,
        "ScalingActive",
        true,
        "ValidMetricFound",
        &format!("the HPA was able to successfully calculate a replica count from {name}"),
        now,
    );
    (Ok((replicas, name)), Some(statuses), error)
}

/// The target's scale could not be read: `AbleToScale` False (upstream's `FailedGetScale`).
pub fn scale_unavailable(hpa: &HorizontalPodAutoscaler, error: &str, now: DateTime<Utc>) -> Plan {
    let mut status = hpa.status.clone().unwrap_or_default();
    set_condition(
        &mut status,
        "AbleToScale",
        false,
        "FailedGetScale",
        &format!("the HPA controller was unable to get the target's current scale: {error}"),
        now,
    );
    let current = status.current_replicas.unwrap_or(0);
    let metrics = status.current_metrics.clone();
    Plan {
        status,
        rescale: None,
        events: vec![event(Kind::Warning, "FailedGetScale", error)],
        error: Some(error.into()),
        current,
        metrics,
    }
}

/// One pass over `hpa` (upstream's `reconcileAutoscaler` up to the scale update).
pub fn plan(hpa: &HorizontalPodAutoscaler, history: &mut History, inputs: &Inputs<'_>) -> Plan {
    let now = inputs.timing.now;
    let old = hpa.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let mut events = Vec::new();
    set_condition(
        &mut status,
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale",
        now,
    );
    let spec = hpa.spec.clone().unwrap_or_default();
    let current = inputs.scale.replicas;
    history.record_initial(current, now);
    let min = spec.min_replicas.unwrap_or(1);
    let max = spec.max_replicas;
    let mut error = None;
    let mut metrics = None;
    let (desired, reason) = if current == 0 && min != 0 {
        set_condition(
            &mut status,
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
            now,
        );
        (None, String::new())
    } else if current > max {
        (
            Some(max),
            "Current number of replicas above Spec.MaxReplicas".to_string(),
        )
    } else if current < min {
        (
            Some(min),
            "Current number of replicas below Spec.MinReplicas".to_string(),
        )
    } else {
        // `behavior.scale{Up,Down}.tolerance` is not in this API version: the flag's value.
        let tolerances = Tolerances::default();
        let (proposal, statuses, partial) =
            metrics_proposal(hpa, &mut status, &mut events, inputs, tolerances, now);
        metrics = statuses;
        let (proposed, name) = match proposal {
            Ok(p) => p,
            Err(e) => {
                events.push(event(Kind::Warning, "FailedComputeMetricsReplicas", e.clone()));
                let status = with_counts(hpa, &status, current, old.desired_replicas, metrics.clone(), None);
                return Plan {
                    status,
                    rescale: None,
                    events,
                    error: Some(e),
                    current,
                    metrics,
                };
            }
        };
        error = partial;
        let reason = if proposed > current {
            format!("{name} above target")
        } else if proposed < current {
            "All metrics below target".to_string()
        } else {
            String::new()
        };
        let n = normalize(history, spec.behavior.as_ref(), current, proposed, min, max, now);
        set_condition(
            &mut status,
            "AbleToScale",
            true,
            n.able_to_scale.reason,
            n.able_to_scale.message,
            now,
        );
        set_condition(
            &mut status,
            "ScalingLimited",
            n.limited,
            n.scaling_limited.reason,
            n.scaling_limited.message,
            now,
        );
        (Some(n.replicas), reason)
    };
    match desired {
        Some(d) if d != current => Plan {
            status,
            rescale: Some(Rescale { desired: d, reason }),
            events,
            error,
            current,
            metrics,
        },
        _ => Plan {
            status: with_counts(hpa, &status, current, current, metrics.clone(), None),
            rescale: None,
            events,
            error,
            current,
            metrics,
        },
    }
}

impl Plan {
    /// Finishes a pass that changed the scale: `result` is the scale update's outcome.
    pub fn rescaled(
        mut self,
        hpa: &HorizontalPodAutoscaler,
        history: &mut History,
        result: Result<(), String>,
        now: DateTime<Utc>,
    ) -> Plan {
        let Some(r) = self.rescale.clone() else {
            return self;
        };
        match result {
            Ok(()) => {
                set_condition(
                    &mut self.status,
                    "AbleToScale",
                    true,
                    "SucceededRescale",
                    &format!(
                        "the HPA controller was able to update the target scale to {}",
                        r.desired
                    ),
                    now,
                );
                self.events.push(event(
                    Kind::Normal,
                    "SuccessfulRescale",
                    format!("New size: {}; reason: {}", r.desired, r.reason),
                ));
                let behavior = hpa.spec.as_ref().and_then(|s| s.behavior.as_ref());
                history.store_scale_event(behavior, self.current, r.desired, now);
                self.status = with_counts(
                    hpa,
                    &self.status,
                    self.current,
                    r.desired,
                    self.metrics.clone(),
                    Some(now),
                );
            }
            Err(e) => {
                self.events.push(event(
                    Kind::Warning,
                    "FailedRescale",
                    format!("New size: {}; reason: {}; error: {e}", r.desired, r.reason),
                ));
                set_condition(
                    &mut self.status,
                    "AbleToScale",
                    false,
                    "FailedUpdateScale",
                    &format!("the HPA controller was unable to update the target scale: {e}"),
                    now,
                );
                let desired = hpa.status.as_ref().map(|s| s.desired_replicas).unwrap_or(0);
                self.status = with_counts(
                    hpa,
                    &self.status,
                    self.current,
                    desired,
                    self.metrics.clone(),
                    None,
                );
                self.error = Some(e);
            }
        }
        self
    }
}
