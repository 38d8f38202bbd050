//! Resource usage of containers (their scope) and pods (their slice and interface), read from
//! cgroup v2 files when asked. The CPU rate is the average since this cgroup's previous sample
//! (at least [`MIN_SAMPLE_INTERVAL`] earlier), as containerd derives `usage_nano_cores`.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use kcore::summary::disk_usage;
use runtime_api::{ContainerStats, CpuUsage, MemoryUsage, NetworkUsage, PodStats};

use super::Runtime;
use super::errors::RuntimeError;
use super::state::now;

/// Samples closer together than this keep the previous rate (a noisy rate from a short window
/// helps nobody).
pub(super) const MIN_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// A cgroup's last CPU reading.
#[derive(Debug, Clone, Copy)]
pub(super) struct CpuSample {
    at: Instant,
    usage_ns: u64,
    rate: Option<u64>,
}

/// `key value` lines (`cpu.stat`, `memory.stat`).
fn flat_keyed(text: &str) -> BTreeMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// The next sample and rate of a cgroup whose cumulative usage is `usage_ns` at `at`.
fn next_sample(prev: Option<CpuSample>, at: Instant, usage_ns: u64) -> CpuSample {
    match prev {
        Some(p) if at.saturating_duration_since(p.at) < MIN_SAMPLE_INTERVAL => p,
        Some(p) => {
            let elapsed = at.saturating_duration_since(p.at).as_nanos();
            let used = u128::from(usage_ns.saturating_sub(p.usage_ns));
            CpuSample {
                at,
                usage_ns,
                rate: u64::try_from(used * 1_000_000_000 / elapsed.max(1)).ok(),
            }
        }
        None => CpuSample {
            at,
            usage_ns,
            rate: None,
        },
    }
}

/// Memory usage from `memory.current`, `memory.stat` and `memory.max` (cadvisor's working set:
/// usage minus inactive file pages).
fn memory_usage(current: u64, stat: &BTreeMap<&str, u64>, max: &str) -> MemoryUsage {
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    let working_set = current.saturating_sub(get("inactive_file"));
    MemoryUsage {
        usage_bytes: current,
        working_set_bytes: working_set,
        rss_bytes: get("anon"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        available_bytes: max.parse::<u64>().ok().map(|m| m.saturating_sub(working_set)),
    }
}

/// The `eth0` line of a network namespace's `/proc/<pid>/net/dev`.
fn interface_usage(net_dev: &str, name: &str) -> Option<NetworkUsage> {
    net_dev.lines().find_map(|l| {
        let (iface, rest) = l.split_once(':')?;
        if iface.trim() != name {
            return None;
        }
        let f: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        (f.len() >= 16).then(|| NetworkUsage {
            interface: name.into(),
            rx_bytes: f[0],
            rx_errors: f[2],
            tx_bytes: f[8],
            tx_errors: f[10],
        })
    })
}

impl Runtime {
    /// CPU and memory of one cgroup (a path under the cgroup root).
    fn cgroup_usage(&mut self, cgroup: &str) -> Result<(CpuUsage, MemoryUsage), RuntimeError> {
        let cpu = self.tree.read(cgroup, "cpu.stat")?;
        let usage_ns = flat_keyed(&cpu).get("usage_usec").copied().unwrap_or(0) * 1000;
        let sample = next_sample(self.cpu_samples.get(cgroup).copied(), Instant::now(), usage_ns);
        self.cpu_samples.insert(cgroup.to_string(), sample);
        let current = self.tree.read(cgroup, "memory.current")?.parse().unwrap_or(0);
        let stat = self.tree.read(cgroup, "memory.stat")?;
        let max = self
            .tree
            .read(cgroup, "memory.max")
            .unwrap_or_else(|_| "max".into());
        Ok((
            CpuUsage {
                usage_core_nano_seconds: usage_ns,
                usage_nano_cores: sample.rate,
            },
            memory_usage(current, &flat_keyed(&stat), &max),
        ))
    }

    /// Forgets the CPU samples of `cgroup` and everything under it.
    pub(super) fn forget_samples(&mut self, cgroup: &str) {
        self.cpu_samples
            .retain(|k, _| !(k == cgroup || k.starts_with(&format!("{cgroup}/"))));
    }

    /// A running container's usage; `disk` also walks its writable layer and logs.
    pub(super) fn container_stats(&mut self, id: &str, disk: bool) -> Result<ContainerStats, RuntimeError> {
        let c = self.container(id)?;
        if c.run.is_none() {
            return Err(RuntimeError::Conflict(format!("container {id} is not running")));
        }
        let (id, name, cgroup) = (
            c.rec.status.id.clone(),
            c.rec.status.name.clone(),
            c.rec.status.cgroup.clone(),
        );
        let writable_layer_bytes = disk.then(|| disk_usage(&c.dir.join("upper")));
        let logs_bytes = disk.then(|| {
            c.rec
                .status
                .log_path
                .as_deref()
                .and_then(Path::parent)
                .map_or(0, disk_usage)
        });
        let (cpu, memory) = self.cgroup_usage(&cgroup)?;
        Ok(ContainerStats {
            id,
            name,
            timestamp: now(),
            cpu,
            memory,
            writable_layer_bytes,
            logs_bytes,
        })
    }

    pub(super) fn pod_stats(&mut self, sandbox_id: &str, disk: bool) -> Result<PodStats, RuntimeError> {
        let sb = self.sandbox(sandbox_id)?;
        if !sb.rec.status.ready {
            return Err(RuntimeError::Conflict(format!(
                "sandbox {sandbox_id} is not ready"
            )));
        }
        let st = sb.rec.status.clone();
        let network = st.pause_pid.and_then(|p| {
            let text = fs::read_to_string(format!("/proc/{p}/net/dev")).ok()?;
            interface_usage(&text, "eth0")
        });
        let (cpu, memory) = self.cgroup_usage(&st.cgroup)?;
        let process_count = self
            .tree
            .read(&st.cgroup, "pids.current")
            .ok()
            .and_then(|n| n.trim().parse().ok());
        let mut containers = Vec::new();
        for cid in self.containers_of(sandbox_id) {
            match self.container_stats(&cid, disk) {
                Ok(s) => containers.push(s),
                Err(RuntimeError::Conflict(_)) => {}
                Err(e) => tracing::debug!(container = %cid, error = %e, "no stats"),
            }
        }
        Ok(PodStats {
            sandbox_id: st.id,
            name: st.name,
            namespace: st.namespace,
            uid: st.uid,
            timestamp: now(),
            cpu,
            memory,
            network,
            containers,
            process_count,
        })
    }

    /// Every ready sandbox's stats (one that cannot be read is left out).
    pub(super) fn list_pod_stats(&mut self) -> Vec<PodStats> {
        let ids: Vec<String> = self
            .sandboxes
            .values()
            .filter(|s| s.rec.status.ready)
            .map(|s| s.rec.status.id.clone())
            .collect();
        ids.iter()
            .filter_map(|id| match self.pod_stats(id, false) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!(sandbox = %id, error = %e, "no stats");
                    None
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_rate_between_samples() {
        let t0 = Instant::now();
        let first = next_sample(None, t0, 5_000_000_000);
        assert_eq!(first.rate, None, "one sample has no rate");
        let early = next_sample(Some(first), t0 + Duration::from_millis(300), 5_100_000_000);
        assert_eq!(
            early.usage_ns, 5_000_000_000,
            "too soon: the previous sample stays"
        );
        // Half a core for two seconds.
        let s = next_sample(Some(first), t0 + Duration::from_secs(2), 6_000_000_000);
        assert_eq!(s.rate, Some(500_000_000));
        let reset = next_sample(Some(s), t0 + Duration::from_secs(3), 1);
        assert_eq!(reset.rate, Some(0), "a counter that went back counts as idle");
    }

    #[test]
    fn memory_working_set_and_available() {
        let stat = "anon 1000\nfile 5000\ninactive_file 3000\npgfault 7\npgmajfault 1\n";
        let m = memory_usage(10_000, &flat_keyed(stat), "16000");
        assert_eq!(
            m,
            MemoryUsage {
                usage_bytes: 10_000,
                working_set_bytes: 7_000,
                rss_bytes: 1000,
                page_faults: 7,
                major_page_faults: 1,
                available_bytes: Some(9_000),
            }
        );
        assert_eq!(memory_usage(10, &flat_keyed(stat), "max").working_set_bytes, 0);
        assert_eq!(memory_usage(10, &flat_keyed(stat), "max").available_bytes, None);
    }

    #[test]
    fn pod_interface_counters() {
        let dev = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0:    1296      16    1    0    0     0          0         0      936      12    2    0    0     0       0          0
";
        assert_eq!(
            interface_usage(dev, "eth0"),
            Some(NetworkUsage {
                interface: "eth0".into(),
                rx_bytes: 1296,
                rx_errors: 1,
                tx_bytes: 936,
                tx_errors: 2
            })
        );
        assert_eq!(interface_usage(dev, "eth1"), None);
    }
}
