//! Resource usage of containers and pods, read from their cgroups (for the agent's
//! `/stats/summary` and metrics).

use serde::{Deserialize, Serialize};

/// CPU usage of a cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuUsage {
    /// Cumulative CPU time (`cpu.stat` usage_usec, in nanoseconds).
    pub usage_core_nano_seconds: u64,
    /// Average use since the runtime's previous sample of this cgroup (at least a second
    /// earlier), in billionths of a core; None until there are two samples.
    pub usage_nano_cores: Option<u64>,
}

/// Memory usage of a cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryUsage {
    /// `memory.current`.
    pub usage_bytes: u64,
    /// Usage minus inactive file pages (what eviction and `kubectl top` use).
    pub working_set_bytes: u64,
    /// Anonymous memory (`memory.stat` anon).
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// `memory.max` minus the working set, when there is a limit.
    pub available_bytes: Option<u64>,
}

/// Traffic of a pod's interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUsage {
    pub interface: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// One container's usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub id: String,
    pub name: String,
    /// When it was read (RFC 3339).
    pub timestamp: String,
    pub cpu: CpuUsage,
    pub memory: MemoryUsage,
    /// Bytes of its writable layer (the overlay's upper directory, as `du` counts them); only
    /// when the request asked for disk usage.
    #[serde(default)]
    pub writable_layer_bytes: Option<u64>,
    /// Bytes of its logs (every file of its log directory, rotated ones and earlier restarts'
    /// included, as the kubelet counts them); only when the request asked for disk usage.
    #[serde(default)]
    pub logs_bytes: Option<u64>,
}

/// One pod's usage: its slice (every container and the pause process), its interface and its
/// running containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub sandbox_id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub timestamp: String,
    pub cpu: CpuUsage,
    pub memory: MemoryUsage,
    pub network: Option<NetworkUsage>,
    pub containers: Vec<ContainerStats>,
    /// Tasks in the pod's cgroup (`pids.current`; CRI's `process_count`), None when unreadable.
    #[serde(default)]
    pub process_count: Option<u64>,
}
