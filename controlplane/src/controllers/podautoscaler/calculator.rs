//! The replica calculator (docs/SEEDS-SPEC.md CTL-50; upstream `replica_calculator.go`): the
//! replica count one per-pod metric asks for, from the pods the target's scale selects and their
//! samples. Pods without a sample, unready pods and pods still starting count in the direction
//! that damps the change; a correction that reverses the direction keeps the current count.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

/// Upstream's `--horizontal-pod-autoscaler-tolerance`.
pub const TOLERANCE: f64 = 0.1;

/// Upstream's `--horizontal-pod-autoscaler-cpu-initialization-period`: a CPU sample of a pod
/// started less than this ago counts only if the pod is ready and the sample's window began
/// after it became ready.
pub const CPU_INITIALIZATION_PERIOD: chrono::Duration = chrono::Duration::minutes(5);

/// Upstream's `--horizontal-pod-autoscaler-initial-readiness-delay`: after the initialization
/// period, an unready pod is ignored for CPU only if it never became ready (its Ready condition
/// last changed within this delay of its start).
pub const INITIAL_READINESS_DELAY: chrono::Duration = chrono::Duration::seconds(30);

/// The band around a usage ratio of 1 in which nothing scales.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    pub down: f64,
    pub up: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Self {
            down: TOLERANCE,
            up: TOLERANCE,
        }
    }
}

impl Tolerances {
    /// Whether `ratio` is close enough to 1 to keep the replica count.
    pub fn within(&self, ratio: f64) -> bool {
        1.0 - self.down <= ratio && ratio <= 1.0 + self.up
    }
}

/// One pod's sample of a metric, in milli-units (millicores, milli-bytes, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMetric {
    pub timestamp: DateTime<Utc>,
    pub window: chrono::Duration,
    pub value: i64,
}

/// Samples by pod name.
pub type PodMetrics = BTreeMap<String, PodMetric>;

/// When the replica count is computed, and the readiness rules for CPU samples.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub now: DateTime<Utc>,
    pub cpu_initialization_period: chrono::Duration,
    pub initial_readiness_delay: chrono::Duration,
}

impl Timing {
    /// Upstream's default periods, at `now`.
    pub fn at(now: DateTime<Utc>) -> Self {
        Self {
            now,
            cpu_initialization_period: CPU_INITIALIZATION_PERIOD,
            initial_readiness_delay: INITIAL_READINESS_DELAY,
        }
    }
}

/// Why no replica count was computed (upstream's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoMetrics,
    #[error("missing request for {resource} in container {container} of Pod {pod}")]
    MissingRequest {
        resource: String,
        container: String,
        pod: String,
    },
    #[error("container {container} not found in Pod {pod}")]
    ContainerNotFound { container: String, pod: String },
    #[error("no metrics returned matched known pods")]
    NoMatchingRequests,
}

/// What a utilization target yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    pub replicas: i32,
    /// Percent of the requests, rounded down.
    pub utilization: i32,
    /// Average usage per pod in milli-units.
    pub raw: i64,
}

/// Pods sorted by how their samples count (upstream's `groupPods`).
#[derive(Debug, Default)]
struct Groups {
    ready: usize,
    unready: BTreeSet<String>,
    missing: BTreeSet<String>,
    ignored: BTreeSet<String>,
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn group_pods(pods: &[&Pod], metrics: &PodMetrics, resource: Option<&str>, timing: &Timing) -> Groups {
    let mut g = Groups::default();
    for p in pods {
        let n = name(p);
        if p.metadata.deletion_timestamp.is_some() || phase(p) == "Failed" {
            g.ignored.insert(n);
            continue;
        }
        if phase(p) == "Pending" {
            g.unready.insert(n);
            continue;
        }
        let Some(metric) = metrics.get(&n) else {
            g.missing.insert(n);
            continue;
        };
        if resource == Some("cpu") && cpu_sample_unready(p, metric, timing) {
            g.unready.insert(n);
            continue;
        }
        g.ready += 1;
    }
    g
}

/// Whether a pod's CPU sample is left out as the sample of a pod not (yet) ready.
fn cpu_sample_unready(p: &Pod, metric: &PodMetric, timing: &Timing) -> bool {
    let status = p.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let start = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
    let (Some(ready), Some(start)) = (ready, start) else {
        return true;
    };
    let transition = ready
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    if start + timing.cpu_initialization_period > timing.now {
        // Still starting: the sample counts once the pod is ready and a whole window was
        // collected after it became so.
        ready.status == "False" || metric.timestamp < transition + metric.window
    } else {
        // Past the initialization period: ignored only if it never became ready.
        ready.status == "False" && start + timing.initial_readiness_delay > transition
    }
}

/// Each pod's request of `resource` in milli-units: one container's, or the sum over its
/// containers and restartable init containers (upstream's `calculateRequests`).
fn pod_requests(
    pods: &[&Pod],
    container: Option<&str>,
    resource: &str,
) -> Result<BTreeMap<String, i64>, CalcError> {
    let mut out = BTreeMap::new();
    for p in pods {
        let spec = p.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let containers = spec
            .map(|s| s.containers.iter())
            .into_iter()
            .flatten()
            .chain(sidecars);
        let mut sum = 0i64;
        let mut found = false;
        for c in containers {
            if container.is_some_and(|want| want != c.name) {
                continue;
            }
            let request = kcore::resources::container_request(c, resource)
                .and_then(|q| milli_value(&q.0))
                .ok_or_else(|| CalcError::MissingRequest {
                    resource: resource.into(),
                    container: c.name.clone(),
                    pod: name(p),
                })?;
            sum = sum.saturating_add(request);
            if container.is_some() {
                found = true;
                break;
            }
        }
        if let (Some(want), false) = (container, found) {
            return Err(CalcError::ContainerNotFound {
                container: want.into(),
                pod: name(p),
            });
        }
        out.insert(name(p), sum);
    }
    Ok(out)
}

/// A quantity in milli-units, rounded up (`resource.Quantity.MilliValue`).
pub fn milli_value(q: &str) -> Option<i64> {
    kcore::quantity::cpu_milli(q).and_then(|v| i64::try_from(v).ok())
}

/// (usage ratio, utilization percent, average usage) over the pods that have both a sample and
/// a request (upstream's `GetResourceUtilizationRatio`; the percent is an integer, as there).
fn utilization_ratio(
    metrics: &PodMetrics,
    requests: &BTreeMap<String, i64>,
    target: i32,
) -> Result<(f64, i32, i64), CalcError> {
    let (mut used, mut requested, mut n) = (0i64, 0i64, 0i64);
    for (pod, m) in metrics {
        let Some(r) = requests.get(pod) else { continue };
        used = used.saturating_add(m.value);
        requested = requested.saturating_add(*r);
        n += 1;
    }
    if requested == 0 {
        return Err(CalcError::NoMatchingRequests);
    }
    let utilization = i32::try_from(used.saturating_mul(100) / requested).unwrap_or(i32::MAX);
    Ok((f64::from(utilization) / f64::from(target), utilization, used / n))
}

/// (usage ratio, average usage) of plain values (upstream's `GetMetricUsageRatio`).
fn usage_ratio(metrics: &PodMetrics, target: i64) -> (f64, i64) {
    let total: i64 = metrics.values().map(|m| m.value).fold(0, i64::saturating_add);
    let n = i64::try_from(metrics.len()).unwrap_or(i64::MAX).max(1);
    let usage = total / n;
    (usage as f64 / target as f64, usage)
}

/// `ceil(x)` as a replica count (saturating).
fn ceil_replicas(x: f64) -> i32 {
    let c = x.ceil();
    if c >= f64::from(i32::MAX) {
        i32::MAX
    } else if c <= 0.0 {
        0
    } else {
        c as i32
    }
}

fn count(n: usize) -> f64 {
    n as f64
}

/// The replica count for a target utilization (percent of the requests) of `resource`, over
/// all containers or one (upstream's `GetResourceReplicas`).
#[allow(clippy::too_many_arguments)]
pub fn resource_replicas(
    current: i32,
    target: i32,
    resource: &str,
    container: Option<&str>,
    tolerances: Tolerances,
    pods: &[&Pod],
    mut metrics: PodMetrics,
    timing: &Timing,
) -> Result<Utilization, CalcError> {
    if pods.is_empty() {
        return Err(CalcError::NoPods);
    }
    let g = group_pods(pods, &metrics, Some(resource), timing);
    metrics.retain(|p, _| !g.ignored.contains(p) && !g.unready.contains(p));
    if metrics.is_empty() {
        return Err(CalcError::NoMetrics);
    }
    let requests = pod_requests(pods, container, resource)?;
    let (ratio, utilization, raw) = utilization_ratio(&metrics, &requests, target)?;
    let keep = |replicas| Utilization {
        replicas,
        utilization,
        raw,
    };
    let up_with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !up_with_unready && g.missing.is_empty() {
        if tolerances.within(ratio) {
            return Ok(keep(current));
        }
        return Ok(keep(ceil_replicas(ratio * count(g.ready))));
    }
    let sample = |value| PodMetric {
        timestamp: timing.now,
        window: chrono::Duration::zero(),
        value,
    };
    if ratio < 1.0 {
        // Scaling down: a pod without a sample uses all it requested (or the target, above 100%).
        let fallback = i64::from(target.max(100));
        for p in &g.missing {
            let request = requests.get(p).copied().unwrap_or(0);
            metrics.insert(p.clone(), sample(request.saturating_mul(fallback) / 100));
        }
    } else if ratio > 1.0 {
        for p in &g.missing {
            metrics.insert(p.clone(), sample(0));
        }
    }
    if up_with_unready {
        for p in &g.unready {
            metrics.insert(p.clone(), sample(0));
        }
    }
    let (new_ratio, _, _) = utilization_ratio(&metrics, &requests, target)?;
    if tolerances.within(new_ratio) || (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0) {
        return Ok(keep(current));
    }
    let replicas = ceil_replicas(new_ratio * count(metrics.len()));
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(keep(current));
    }
    Ok(keep(replicas))
}

/// The replica count for a target average value per pod (milli-units) of a resource or a pods
/// metric (upstream's `calcPlainMetricReplicas`); also returns the average.
pub fn plain_replicas(
    current: i32,
    target: i64,
    resource: Option<&str>,
    tolerances: Tolerances,
    pods: &[&Pod],
    mut metrics: PodMetrics,
    timing: &Timing,
) -> Result<(i32, i64), CalcError> {
    if pods.is_empty() {
        return Err(CalcError::NoPods);
    }
    let g = group_pods(pods, &metrics, resource, timing);
    metrics.retain(|p, _| !g.ignored.contains(p) && !g.unready.contains(p));
    if metrics.is_empty() {
        return Err(CalcError::NoMetrics);
    }
    let (ratio, usage) = usage_ratio(&metrics, target);
    let up_with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !up_with_unready && g.missing.is_empty() {
        if tolerances.within(ratio) {
            return Ok((current, usage));
        }
        return Ok((ceil_replicas(ratio * count(g.ready)), usage));
    }
    let sample = |value| PodMetric {
        timestamp: timing.now,
        window: chrono::Duration::zero(),
        value,
    };
    if ratio < 1.0 {
        // Scaling down: a pod without a sample uses exactly the target.
        for p in &g.missing {
            metrics.insert(p.clone(), sample(target));
        }
    } else if ratio > 1.0 {
        for p in &g.missing {
            metrics.insert(p.clone(), sample(0));
        }
    }
    if up_with_unready {
        for p in &g.unready {
            metrics.insert(p.clone(), sample(0));
        }
    }
    let (new_ratio, _) = usage_ratio(&metrics, target);
    if tolerances.within(new_ratio) || (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0) {
        return Ok((current, usage));
    }
    let replicas = ceil_replicas(new_ratio * count(metrics.len()));
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok((current, usage));
    }
    Ok((replicas, usage))
}
