//! NodeResourcesFit (filter: requests against allocatable minus what the node's pods request,
//! pod count; score: least allocated) and NodeResourcesBalancedAllocation (score).

use kcore::resources::Resources;

use super::{Code, Plugin, Rejection, reasons};
use crate::scheduler::cache::NodeInfo;
use crate::scheduler::pod::PodInfo;

/// The fit filter. `extra` is what pods nominated to the node (by preemption, with at least the
/// pod's priority) already claim there.
pub fn fit(pod: &PodInfo, node: &NodeInfo, extra: &Resources, extra_pods: usize) -> Option<Rejection> {
    let mut reasons_out = Vec::new();
    if node.pods.len() + extra_pods + 1 > node.allowed_pods {
        reasons_out.push(reasons::TOO_MANY_PODS.to_string());
    }
    let req = &pod.requests;
    if !req.is_zero() {
        let used = |a: u64, b: u64| a.saturating_add(b);
        let alloc = &node.allocatable;
        let have = &node.requested;
        if req.milli_cpu > 0
            && req.milli_cpu
                > alloc
                    .milli_cpu
                    .saturating_sub(used(have.milli_cpu, extra.milli_cpu))
        {
            reasons_out.push("Insufficient cpu".into());
        }
        if req.memory > 0 && req.memory > alloc.memory.saturating_sub(used(have.memory, extra.memory)) {
            reasons_out.push("Insufficient memory".into());
        }
        if req.ephemeral_storage > 0
            && req.ephemeral_storage
                > alloc
                    .ephemeral_storage
                    .saturating_sub(used(have.ephemeral_storage, extra.ephemeral_storage))
        {
            reasons_out.push("Insufficient ephemeral-storage".into());
        }
        for (name, want) in &req.scalar {
            if *want == 0 {
                continue;
            }
            let cap = alloc.scalar.get(name).copied().unwrap_or(0);
            let taken = used(
                have.scalar.get(name).copied().unwrap_or(0),
                extra.scalar.get(name).copied().unwrap_or(0),
            );
            if *want > cap.saturating_sub(taken) {
                reasons_out.push(format!("Insufficient {name}"));
            }
        }
    }
    (!reasons_out.is_empty()).then_some(Rejection {
        plugin: Plugin::NodeResourcesFit,
        code: Code::Unschedulable,
        reasons: reasons_out,
    })
}

fn least_requested(requested: u64, capacity: u64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    ((capacity - requested) * 100 / capacity) as i64
}

/// Least allocated (cpu and memory, weight 1 each), with the non-zero defaults for requests.
pub fn least_allocated(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let cpu = least_requested(
        node.nonzero_requested.milli_cpu + pod.nonzero.milli_cpu,
        node.allocatable.milli_cpu,
    );
    let mem = least_requested(
        node.nonzero_requested.memory + pod.nonzero.memory,
        node.allocatable.memory,
    );
    (cpu + mem) / 2
}

/// Balanced allocation: 100 × (1 − std of the cpu and memory fractions), with actual requests.
pub fn balanced_allocation(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let frac = |req: u64, cap: u64| {
        if cap == 0 {
            0.0
        } else {
            (req as f64 / cap as f64).min(1.0)
        }
    };
    let cpu = frac(
        node.requested.milli_cpu + pod.requests.milli_cpu,
        node.allocatable.milli_cpu,
    );
    let mem = frac(
        node.requested.memory + pod.requests.memory,
        node.allocatable.memory,
    );
    let std = ((cpu - mem) / 2.0).abs();
    ((1.0 - std) * 100.0) as i64
}
