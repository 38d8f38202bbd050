//! What a pod asks of a node: the effective pod request of docs/SEEDS-SPEC.md SCH-4
//! (`max(Σ main containers + Σ sidecars, max over init step i of (init_i + Σ sidecars started
//! before i))`, plus pod overhead; pod-level `spec.resources` replaces the container sum for cpu and
//! memory), and the "non-zero" variant the scheduler's scores use (a container without a cpu or
//! memory request counts as 100m / 200 MiB, SCH-3).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Default cpu a container without a cpu request weighs in scores (millicores).
pub const DEFAULT_MILLI_CPU_REQUEST: u64 = 100;
/// Default memory a container without a memory request weighs in scores (bytes).
pub const DEFAULT_MEMORY_REQUEST: u64 = 200 << 20;

/// Amounts of the resources a node offers and pods request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: u64,
    pub memory: u64,
    pub ephemeral_storage: u64,
    /// Extended resources and hugepages, by name (integer units; hugepages in bytes).
    pub scalar: BTreeMap<String, u64>,
}

impl Resources {
    /// The amounts of a resource list (`requests`, `allocatable`, `overhead`). Quantities that
    /// do not parse count as zero (the API validates them).
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Self {
        let mut r = Self::default();
        for (name, q) in list.into_iter().flatten() {
            match name.as_str() {
                "cpu" => r.milli_cpu = quantity::cpu_milli(&q.0).unwrap_or(0),
                "memory" => r.memory = quantity::bytes(&q.0).unwrap_or(0),
                "ephemeral-storage" => r.ephemeral_storage = quantity::bytes(&q.0).unwrap_or(0),
                "pods" => {}
                other if is_scalar(other) => {
                    r.scalar
                        .insert(other.to_string(), quantity::bytes(&q.0).unwrap_or(0));
                }
                _ => {}
            }
        }
        r
    }

    /// Adds `other` to these amounts.
    pub fn add(&mut self, other: &Self) {
        self.milli_cpu = self.milli_cpu.saturating_add(other.milli_cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_add(other.ephemeral_storage);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = e.saturating_add(*v);
        }
    }

    /// Subtracts `other` (not below zero).
    pub fn sub(&mut self, other: &Self) {
        self.milli_cpu = self.milli_cpu.saturating_sub(other.milli_cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_sub(other.ephemeral_storage);
        for (k, v) in &other.scalar {
            if let Some(e) = self.scalar.get_mut(k) {
                *e = e.saturating_sub(*v);
            }
        }
    }

    /// Raises each amount to `other`'s where that is larger.
    pub fn max_with(&mut self, other: &Self) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }

    /// Whether every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.milli_cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.scalar.values().all(|v| *v == 0)
    }
}

/// Extended resources (`example.com/gpu`) and hugepages are accounted by name.
fn is_scalar(name: &str) -> bool {
    name.starts_with("hugepages-") || (name.contains('/') && !name.starts_with("kubernetes.io/"))
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// How a container's missing requests are filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    Zero,
    /// 100m cpu / 200 MiB memory (scores only).
    NonZero,
}

/// The quantity a container requests of `resource`, as written.
pub fn container_request<'a>(c: &'a Container, resource: &str) -> Option<&'a Quantity> {
    c.resources.as_ref()?.requests.as_ref()?.get(resource)
}

fn container_requests(c: &Container, missing: Missing) -> Resources {
    let list = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let mut r = Resources::from_list(list);
    if missing == Missing::NonZero {
        let has = |k: &str| list.is_some_and(|l| l.contains_key(k));
        if !has("cpu") {
            r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
        }
        if !has("memory") {
            r.memory = DEFAULT_MEMORY_REQUEST;
        }
    }
    r
}

/// `max(Σ main + Σ sidecars, max over init step i of (init_i + Σ sidecars started before i))` of
/// one per-container amount (requests or limits).
fn aggregate(spec: &PodSpec, amount: impl Fn(&Container) -> Resources) -> Resources {
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&amount(c));
    }
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let own = amount(c);
        let step = if is_sidecar(c) {
            total.add(&own);
            sidecars.add(&own);
            sidecars.clone()
        } else {
            let mut step = own;
            step.add(&sidecars);
            step
        };
        init_peak.max_with(&step);
    }
    total.max_with(&init_peak);
    total
}

/// Pod-level `spec.resources` `requests` or `limits` (cpu and memory are the supported ones).
fn pod_level(spec: &PodSpec, limits: bool) -> Option<&BTreeMap<String, Quantity>> {
    let r = spec.resources.as_ref()?;
    if limits {
        r.limits.as_ref()
    } else {
        r.requests.as_ref()
    }
}

/// Replaces the cpu and memory of `amounts` with the pod-level values that are set.
fn apply_pod_level(amounts: &mut Resources, list: Option<&BTreeMap<String, Quantity>>) {
    let Some(list) = list else { return };
    let p = Resources::from_list(Some(list));
    if list.contains_key("cpu") {
        amounts.milli_cpu = p.milli_cpu;
    }
    if list.contains_key("memory") {
        amounts.memory = p.memory;
    }
}

fn requests(spec: &PodSpec, missing: Missing) -> Resources {
    let mut reqs = aggregate(spec, |c| container_requests(c, missing));
    // Pod-level requests set a shared budget for cpu and memory.
    apply_pod_level(&mut reqs, pod_level(spec, false));
    reqs.add(&Resources::from_list(spec.overhead.as_ref()));
    reqs
}

/// The containers' share of the pod's request, without pod-level resources and overhead
/// (upstream's `AggregateContainerRequests`).
pub fn aggregate_container_requests(spec: &PodSpec) -> Resources {
    aggregate(spec, |c| container_requests(c, Missing::Zero))
}

/// The pod's limits (upstream's `PodLimits`): the containers' aggregate, pod-level limits in
/// place of it for cpu and memory, and the overhead added to every limit that is set.
pub fn pod_limits(spec: &PodSpec) -> Resources {
    let mut limits = aggregate(spec, |c| {
        Resources::from_list(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
    });
    apply_pod_level(&mut limits, pod_level(spec, true));
    let overhead = Resources::from_list(spec.overhead.as_ref());
    for (limit, extra) in [
        (&mut limits.milli_cpu, overhead.milli_cpu),
        (&mut limits.memory, overhead.memory),
        (&mut limits.ephemeral_storage, overhead.ephemeral_storage),
    ] {
        if *limit > 0 {
            *limit = limit.saturating_add(extra);
        }
    }
    limits
}

/// The effective request of a pod (what the scheduler's fit filter and node admission check).
pub fn pod_requests(spec: &PodSpec) -> Resources {
    requests(spec, Missing::Zero)
}

/// The request the scheduler's scores use: missing container cpu/memory requests count as
/// [`DEFAULT_MILLI_CPU_REQUEST`] / [`DEFAULT_MEMORY_REQUEST`].
pub fn pod_nonzero_requests(spec: &PodSpec) -> Resources {
    requests(spec, Missing::NonZero)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).expect("spec")
    }

    fn c(name: &str, cpu: &str, mem: &str) -> serde_json::Value {
        json!({"name": name, "image": "x", "resources": {"requests": {"cpu": cpu, "memory": mem}}})
    }

    #[test]
    fn billing_example_of_sch_4() {
        // app 250m/128Mi + sidecar 50m/64Mi = 300m and 192 MiB.
        let mut sidecar = c("proxy", "50m", "64Mi");
        sidecar["restartPolicy"] = json!("Always");
        let s = spec(json!({"containers": [c("app", "250m", "128Mi")], "initContainers": [sidecar.clone()]}));
        let r = pod_requests(&s);
        assert_eq!((r.milli_cpu, r.memory), (300, 192 << 20));
        // A `migrate` init container asking 2 GiB makes the pod count as 2 GiB (plus the sidecar
        // started before it, if any: here it runs first).
        let s = spec(json!({"containers": [c("app", "250m", "128Mi")],
                            "initContainers": [c("migrate", "100m", "2Gi"), sidecar]}));
        let r = pod_requests(&s);
        assert_eq!((r.milli_cpu, r.memory), (300, 2 << 30));
    }

    #[test]
    fn sidecars_before_an_init_step_count_with_it() {
        let mut sc = c("sc", "100m", "100Mi");
        sc["restartPolicy"] = json!("Always");
        let s = spec(json!({"containers": [c("app", "100m", "100Mi")],
                            "initContainers": [sc, c("late", "500m", "1Gi")]}));
        let r = pod_requests(&s);
        assert_eq!(r.milli_cpu, 600, "late init 500m + sidecar 100m");
        assert_eq!(r.memory, (1 << 30) + (100 << 20));
    }

    #[test]
    fn overhead_pod_level_and_defaults() {
        let s = spec(json!({"containers": [c("a", "1", "1Gi"), c("b", "1", "1Gi")],
                            "overhead": {"cpu": "250m", "memory": "120Mi"},
                            "resources": {"requests": {"cpu": "1500m"}}}));
        let r = pod_requests(&s);
        assert_eq!(
            r.milli_cpu, 1750,
            "pod-level cpu replaces the sum, overhead added"
        );
        assert_eq!(r.memory, (2 << 30) + (120 << 20));
        let none = spec(
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x", "resources": {"requests": {"cpu": "0"}}}]}),
        );
        assert!(
            pod_requests(&none).is_zero(),
            "a pod without requests weighs zero in Filter"
        );
        let nz = pod_nonzero_requests(&none);
        assert_eq!(
            nz.milli_cpu, 100,
            "100m for the container without a cpu request, 0 kept"
        );
        assert_eq!(nz.memory, 2 * (200 << 20));
    }

    #[test]
    fn limits_aggregate_like_requests() {
        let lim = |name: &str, cpu: &str, mem: &str| json!({"name": name, "image": "x", "resources": {"limits": {"cpu": cpu, "memory": mem}}});
        let s = spec(
            json!({"containers": [lim("a", "500m", "64Mi"), lim("b", "500m", "64Mi")],
                            "initContainers": [lim("init", "2", "32Mi")],
                            "overhead": {"cpu": "100m"}}),
        );
        let l = pod_limits(&s);
        assert_eq!(
            l.milli_cpu, 2100,
            "the init container's 2 cpus, plus the overhead"
        );
        assert_eq!(l.memory, 128 << 20);
        let a = aggregate_container_requests(&spec(
            json!({"containers": [c("a", "1", "1Gi")], "resources": {"requests": {"memory": "4Gi"}}}),
        ));
        assert_eq!(
            a.memory,
            1 << 30,
            "pod-level requests are not the containers' share"
        );
    }

    #[test]
    fn scalar_resources() {
        let s = spec(
            json!({"containers": [{"name": "a", "image": "x", "resources": {"requests": {
            "example.com/gpu": "2", "hugepages-2Mi": "4Mi", "kubernetes.io/x": "1"}}}]}),
        );
        let r = pod_requests(&s);
        assert_eq!(r.scalar.get("example.com/gpu"), Some(&2));
        assert_eq!(r.scalar.get("hugepages-2Mi"), Some(&(4 << 20)));
        assert_eq!(r.scalar.len(), 2);
    }
}
