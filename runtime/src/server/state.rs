//! What the runtime keeps: sandbox and container records, persisted on every change under
//! `<state>/{sandboxes,containers}/<id>/state.json`, and re-adopted when the runtime restarts.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use nix::sys::wait::WaitStatus;
use runtime_api::{ContainerStatus, QosClass, SandboxConfig, SandboxStatus, SeccompProfile, State};
use serde::{Deserialize, Serialize};

use super::Runtime;
use super::errors::{RuntimeError, io_ctx};
use crate::logs::LogWriter;

/// What is persisted per sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SandboxRecord {
    pub status: SandboxStatus,
    pub config: SandboxConfig,
    /// Start time of the pause process (/proc/<pid>/stat field 22): tells it from a later
    /// process that reused its pid.
    #[serde(default)]
    pub start_time: Option<u64>,
}

/// What is persisted per container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ContainerRecord {
    pub status: ContainerStatus,
    pub profile: SeccompProfile,
    /// Whether the overlay root is mounted at `<dir>/rootfs`.
    pub mounted: bool,
    /// Start time of the container process (see [`SandboxRecord::start_time`]).
    #[serde(default)]
    pub start_time: Option<u64>,
    /// The image layers its root is made of (kept while it exists, whatever the image record).
    #[serde(default)]
    pub layers: Vec<String>,
}

pub(super) struct Sandbox {
    pub rec: SandboxRecord,
    pub dir: PathBuf,
    pub pidfd: Option<OwnedFd>,
}

/// A container process the runtime watches.
pub(super) struct Running {
    pub pidfd: OwnedFd,
    /// stdout and stderr read ends (None once closed); with a terminal, its master and None.
    pub pipes: [Option<OwnedFd>; 2],
    pub log: Option<LogWriter>,
    /// What `Attach` hands out: the stdin pipe's write end, or a second descriptor of the
    /// terminal's master (None: no stdin, or a `stdinOnce` one already taken).
    pub input: Option<OwnedFd>,
    pub stdin_once: bool,
    pub tty: bool,
}

pub(super) struct Ctr {
    pub rec: ContainerRecord,
    pub dir: PathBuf,
    pub run: Option<Running>,
    pub kill_at: Option<Instant>,
    /// Connections waiting for this container to exit (StopContainer, WaitContainer).
    pub waiters: Vec<u64>,
}

pub(super) fn now() -> String {
    kcore::time::rfc3339(SystemTime::now())
}

/// 128 random bits as hex.
pub(super) fn new_id() -> Result<String, RuntimeError> {
    let mut b = [0u8; 16];
    let mut f = fs::File::open("/dev/urandom").map_err(io_ctx("/dev/urandom"))?;
    io::Read::read_exact(&mut f, &mut b).map_err(io_ctx("/dev/urandom"))?;
    Ok(crate::image::registry::hex(&b))
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), RuntimeError> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec_pretty(v).map_err(|e| RuntimeError::Io {
        what: path.display().to_string(),
        source: e.into(),
    })?;
    fs::write(&tmp, bytes)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(io_ctx(path.display().to_string()))
}

/// The machine's CPUs (millicores) and memory (bytes), for the kubepods slice.
pub(super) fn node_capacity() -> (u64, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()))
        })
        .unwrap_or(0)
        * 1024;
    (cpus * 1000, mem)
}

/// Exit code and signal of a process that ended.
pub(super) fn exit_of(status: WaitStatus) -> Option<(i32, Option<i32>)> {
    match status {
        WaitStatus::Exited(_, code) => Some((code, None)),
        WaitStatus::Signaled(_, sig, _) => Some((128 + sig as i32, Some(sig as i32))),
        _ => None,
    }
}

/// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
pub(super) fn proc_start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: count from the last ')'.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A pidfd for a recorded process, if that process (same pid, same start time) still runs.
pub(super) fn reattach(pid: i32, start_time: Option<u64>) -> Option<OwnedFd> {
    let fd = crate::sys::pidfd_open(pid).ok()?;
    (start_time.is_none() || proc_start_time(pid) == start_time).then_some(fd)
}

/// Every `<dir>/<entry>/state.json` that parses as `T` (unreadable ones are skipped).
fn read_records<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<(PathBuf, T)> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let rec = serde_json::from_slice(&fs::read(e.path().join("state.json")).ok()?).ok()?;
            Some((e.path(), rec))
        })
        .collect()
}

impl Runtime {
    /// Re-adopts the recorded sandboxes and containers: live processes are watched again, dead
    /// ones are recorded as exited with an unknown code.
    pub(super) fn reload(&mut self) {
        for (dir, rec) in read_records::<SandboxRecord>(&self.opts.state_dir.join("sandboxes")) {
            let pidfd = rec.status.pause_pid.and_then(|p| reattach(p, rec.start_time));
            let mut sb = Sandbox { rec, dir, pidfd };
            if sb.pidfd.is_none() {
                sb.rec.status.ready = false;
            }
            tracing::info!(sandbox = %sb.rec.status.id, ready = sb.rec.status.ready, "sandbox re-adopted");
            self.sandboxes.insert(sb.rec.status.id.clone(), sb);
        }
        for (dir, rec) in read_records::<ContainerRecord>(&self.opts.state_dir.join("containers")) {
            let mut c = Ctr {
                rec,
                dir,
                run: None,
                kill_at: None,
                waiters: Vec::new(),
            };
            if matches!(c.rec.status.state, State::Running | State::Created) {
                match c.rec.status.pid.map(|p| reattach(p, c.rec.start_time).ok_or(())) {
                    Some(Ok(pidfd)) => {
                        c.run = Some(Running {
                            pidfd,
                            pipes: [None, None],
                            log: None,
                            input: None,
                            stdin_once: false,
                            tty: false,
                        })
                    }
                    _ => {
                        c.rec.status.state = State::Exited;
                        c.rec.status.reason = Some("Unknown".into());
                        c.rec.status.finished_at.get_or_insert_with(now);
                    }
                }
            }
            tracing::info!(container = %c.rec.status.id, state = ?c.rec.status.state, "container re-adopted");
            self.containers.insert(c.rec.status.id.clone(), c);
        }
    }

    pub(super) fn persist_sandbox(&self, id: &str) {
        if let Some(sb) = self.sandboxes.get(id)
            && let Err(e) = write_json(&sb.dir.join("state.json"), &sb.rec)
        {
            tracing::error!(sandbox = id, error = %e, "cannot persist sandbox state");
        }
    }

    pub(super) fn persist_container(&self, id: &str) {
        if let Some(c) = self.containers.get(id)
            && let Err(e) = write_json(&c.dir.join("state.json"), &c.rec)
        {
            tracing::error!(container = id, error = %e, "cannot persist container state");
        }
    }

    /// The Burstable slice's weight follows the Burstable pods' CPU requests (NODE-39), as the
    /// agent gave them.
    pub(super) fn update_burstable(&self) -> Result<(), RuntimeError> {
        let sum: u64 = self
            .sandboxes
            .values()
            .filter(|s| s.rec.status.qos == QosClass::Burstable)
            .map(|s| s.rec.config.resources.cpu_request_milli)
            .sum();
        Ok(self.tree.set_burstable_requests(sum)?)
    }

    pub(super) fn container(&self, id: &str) -> Result<&Ctr, RuntimeError> {
        self.containers
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))
    }

    pub(super) fn sandbox(&self, id: &str) -> Result<&Sandbox, RuntimeError> {
        self.sandboxes
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("sandbox {id} not found")))
    }

    /// Ids of the containers of one sandbox.
    pub(super) fn containers_of(&self, sandbox_id: &str) -> Vec<String> {
        self.containers
            .values()
            .filter(|c| c.rec.status.sandbox_id == sandbox_id)
            .map(|c| c.rec.status.id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reattach_checks_the_start_time() {
        let me = std::process::id() as i32;
        let t = proc_start_time(me).expect("own start time");
        assert_eq!(proc_start_time(me), Some(t), "stable");
        assert!(reattach(me, Some(t)).is_some());
        assert!(
            reattach(me, Some(t + 1)).is_none(),
            "a reused pid is not re-adopted"
        );
        assert!(reattach(i32::MAX, None).is_none(), "no such process");
    }

    #[test]
    fn records_of_an_older_runtime_still_load() {
        // Written before the agent handed the runtime its pod cgroup values: no `resources`.
        let old = r#"{"status": {"id": "s", "name": "p", "namespace": "default", "uid": "u", "attempt": 0,
            "ready": true, "pausePid": 1, "ip": null, "cgroup": "/kubepods.slice/x", "qos": "Burstable",
            "createdAt": "2025-01-01T00:00:00Z"},
            "config": {"name": "p", "namespace": "default", "uid": "u", "containers": [{"cpuRequest": 100}]}}"#;
        let rec: SandboxRecord = serde_json::from_str(old).expect("loads");
        assert_eq!(rec.status.qos, QosClass::Burstable);
        assert_eq!(rec.config.resources.cpu_request_milli, 0);
    }
}
