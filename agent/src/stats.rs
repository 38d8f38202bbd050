//! `GET /stats/summary`: the kubelet's Summary API, the part metrics-server (and this project's
//! API server, for `metrics.k8s.io`) reads: the node's CPU and memory working set, and each
//! pod's containers' (from the runtime's cgroup readings).
//!
//! The node's figures are the kubelet's (cAdvisor's root container): CPU from the root cgroup's
//! `cpu.stat` `usage_usec` (nanocores averaged since the previous request, none on the first),
//! memory working set = `MemTotal − MemFree − Inactive(file)` from `/proc/meminfo`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use kcore::summary::{ContainerStats, CpuStats, MemoryStats, NodeStats, PodRef, PodStats, Summary};

/// Why the summary could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("the runtime is not reachable: {0}")]
    Runtime(#[from] runtime_api::ClientError),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} has no {1}")]
    Missing(PathBuf, &'static str),
}

/// The node's previous CPU reading (for a rate).
#[derive(Debug)]
pub struct NodeSampler {
    cgroup_root: PathBuf,
    last: Mutex<Option<(Instant, u64)>>,
}

fn read(path: &Path) -> Result<String, StatsError> {
    std::fs::read_to_string(path).map_err(|source| StatsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// `usage_usec` of a `cpu.stat`, in nanoseconds.
pub fn cpu_usage_ns(cpu_stat: &str) -> Option<u64> {
    cpu_stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us.saturating_mul(1_000))
}

/// The working set of `/proc/meminfo`: `MemTotal − MemFree − Inactive(file)`, in bytes.
pub fn working_set_bytes(meminfo: &str) -> Option<u64> {
    let kib = |key: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    let (total, free, inactive) = (kib("MemTotal")?, kib("MemFree")?, kib("Inactive(file)")?);
    Some(total.saturating_sub(free).saturating_sub(inactive) * 1024)
}

/// Billionths of a core used between two readings of cumulative CPU time.
pub fn nano_cores(prev: (Instant, u64), now: (Instant, u64)) -> Option<u64> {
    let elapsed = now.0.checked_duration_since(prev.0)?.as_nanos();
    if elapsed == 0 {
        return None;
    }
    let used = u128::from(now.1.checked_sub(prev.1)?);
    u64::try_from(used * 1_000_000_000 / elapsed).ok()
}

impl NodeSampler {
    pub fn new(cgroup_root: PathBuf) -> Self {
        Self {
            cgroup_root,
            last: Mutex::new(None),
        }
    }

    /// The node's CPU (a rate from the previous call's reading) and memory now.
    fn node(&self, name: &str, time: &str) -> Result<NodeStats, StatsError> {
        let stat_path = self.cgroup_root.join("cpu.stat");
        let usage = cpu_usage_ns(&read(&stat_path)?).ok_or(StatsError::Missing(stat_path, "usage_usec"))?;
        let now = (Instant::now(), usage);
        let rate = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let rate = last.and_then(|prev| nano_cores(prev, now));
            *last = Some(now);
            rate
        };
        let meminfo = Path::new("/proc/meminfo");
        let working_set = working_set_bytes(&read(meminfo)?)
            .ok_or_else(|| StatsError::Missing(meminfo.to_path_buf(), "MemTotal/MemFree/Inactive(file)"))?;
        Ok(NodeStats {
            node_name: name.to_string(),
            cpu: Some(CpuStats {
                time: time.to_string(),
                usage_nano_cores: rate,
            }),
            memory: Some(MemoryStats {
                time: time.to_string(),
                working_set_bytes: Some(working_set),
            }),
        })
    }
}

/// The Summary of a node and the pods the runtime runs.
pub fn summary(
    node: &str,
    sampler: &NodeSampler,
    pods: Vec<runtime_api::PodStats>,
) -> Result<Summary, StatsError> {
    let time = kcore::time::rfc3339(SystemTime::now());
    let node = sampler.node(node, &time)?;
    let pods = pods
        .into_iter()
        .map(|p| PodStats {
            pod_ref: PodRef {
                name: p.name,
                namespace: p.namespace,
                uid: p.uid,
            },
            containers: p
                .containers
                .into_iter()
                .map(|c| ContainerStats {
                    name: c.name,
                    cpu: Some(CpuStats {
                        time: c.timestamp.clone(),
                        usage_nano_cores: c.cpu.usage_nano_cores,
                    }),
                    memory: Some(MemoryStats {
                        time: c.timestamp,
                        working_set_bytes: Some(c.memory.working_set_bytes),
                    }),
                })
                .collect(),
        })
        .collect();
    Ok(Summary { node, pods })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn readings_of_the_kernel_files() {
        let stat = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n";
        assert_eq!(cpu_usage_ns(stat), Some(2_500_000_000));
        assert_eq!(cpu_usage_ns("user_usec 1\n"), None);
        let meminfo = "MemTotal:        2000000 kB\nMemFree:          500000 kB\nMemAvailable:    1200000 kB\n\
                       Active(file):     100000 kB\nInactive(file):   300000 kB\n";
        assert_eq!(working_set_bytes(meminfo), Some(1_200_000 * 1024));
        assert_eq!(working_set_bytes("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn cpu_rate_between_readings() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        // 1 s of CPU in 2 s: half a core.
        assert_eq!(nano_cores((t0, 0), (t1, 1_000_000_000)), Some(500_000_000));
        assert_eq!(nano_cores((t1, 5), (t0, 9)), None);
        assert_eq!(nano_cores((t0, 9), (t1, 5)), None);
        assert_eq!(nano_cores((t0, 0), (t0, 5)), None);
    }
}
