//! What the runtime keeps: sandbox and container records, persisted on every change under
//! `<state>/{sandboxes,containers}/<id>/state.json`, and re-adopted when the runtime restarts.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use runtime_api::{ContainerStatus, QosClass, SandboxConfig, SandboxStatus, SeccompProfile, State};
use serde::{Deserialize, Serialize};

use super::Runtime;
use super::errors::{RuntimeError, io_ctx};
use super::fdstore::{Kind, LogTarget, Outgoing, Parked};
use crate::logs::{LogWriter, Stream};

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

pub(super) use super::orphans::{exit_of, start_time as proc_start_time};

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

/// What a running container parks: its output read ends (or its terminal's master) and its stdin
/// pipe's write end, with what is needed to log on.
fn outgoing(c: &Ctr) -> Option<Outgoing<'_>> {
    let run = c.run.as_ref()?;
    let mut kinds = Vec::new();
    let mut fds = Vec::new();
    let out = [(Kind::Stdout, Kind::Terminal), (Kind::Stderr, Kind::Stderr)];
    for (pipe, (plain, tty)) in run.pipes.iter().zip(out) {
        if let Some(fd) = pipe {
            kinds.push(if run.tty { tty } else { plain });
            fds.push(fd.as_fd());
        }
    }
    // A terminal's input is a second descriptor of its master: parked once, as the master.
    if let Some(fd) = run.input.as_ref().filter(|_| !run.tty) {
        kinds.push(Kind::Stdin);
        fds.push(fd.as_fd());
    }
    let log = run.log.as_ref().map(|l| {
        let (max_size, max_files) = l.limits();
        LogTarget {
            path: l.path().to_path_buf(),
            max_size,
            max_files,
        }
    });
    let p = Parked {
        id: c.rec.status.id.clone(),
        generation: 0,
        kinds,
        tty: run.tty,
        stdin_once: run.stdin_once,
        input: run.input.is_some(),
        log,
    };
    Some((p, fds))
}

/// Puts restored descriptors back where [`outgoing`] took them from.
fn stdio_into(run: &mut Running, p: Parked, fds: Vec<OwnedFd>) {
    run.tty = p.tty;
    run.stdin_once = p.stdin_once;
    for (kind, fd) in p.kinds.into_iter().zip(fds) {
        match kind {
            Kind::Stdout => run.pipes[0] = Some(fd),
            Kind::Stderr => run.pipes[1] = Some(fd),
            Kind::Stdin => run.input = Some(fd),
            Kind::Terminal => {
                if p.input {
                    run.input = fd.try_clone().ok();
                }
                run.pipes[0] = Some(fd);
            }
        }
    }
    run.log = p
        .log
        .and_then(|l| match LogWriter::open(&l.path, l.max_size, l.max_files) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(path = %l.path.display(), error = %e, "container log not reopened");
                None
            }
        });
}

/// Logs what a container that ended while no runtime ran left in its pipes (at most 1 MiB per
/// stream; the descriptors are non-blocking, so reading stops at EOF or when nothing is left).
fn log_leftovers(id: &str, p: Parked, fds: Vec<OwnedFd>) {
    let Some(l) = p.log else { return };
    let mut log = match LogWriter::open(&l.path, l.max_size, l.max_files) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(container = id, error = %e, "container log not reopened");
            return;
        }
    };
    let mut buf = vec![0u8; 64 * 1024];
    for (kind, fd) in p.kinds.iter().zip(&fds) {
        let stream = match kind {
            Kind::Stdout | Kind::Terminal => Stream::Stdout,
            Kind::Stderr => Stream::Stderr,
            Kind::Stdin => continue,
        };
        for _ in 0..16 {
            match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
                Ok(n) if n > 0 => {
                    if let Err(e) = log.write(stream, &buf[..n]) {
                        tracing::warn!(container = id, error = %e, "container log write failed");
                    }
                }
                _ => break,
            }
        }
    }
    if let Err(e) = log.flush_partial() {
        tracing::warn!(container = id, error = %e, "container log write failed");
    }
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
        self.restore_stdio();
    }

    /// Gives re-adopted containers back their parked pipes and terminals, and logs on.
    fn restore_stdio(&mut self) {
        let Some(store) = self.fd_store.as_mut() else {
            return;
        };
        let mut parked = match store.restore() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "parked container stdio not restored");
                return;
            }
        };
        for (id, c) in &mut self.containers {
            let Some((p, fds)) = parked.remove(id) else {
                continue;
            };
            match c.run.as_mut() {
                Some(run) => {
                    stdio_into(run, p, fds);
                    tracing::info!(container = %id, tty = run.tty, input = run.input.is_some(), "container stdio restored");
                }
                None => log_leftovers(id, p, fds),
            }
        }
        // Entries of containers that ended meanwhile (or are unknown), and duplicates a
        // compaction cut short left, go at the first compaction.
        self.fd_store_stale = true;
    }

    /// Parks a new container's stdio (see [`super::fdstore`]).
    pub(super) fn park_stdio(&mut self, id: &str) {
        let Some(store) = self.fd_store.as_mut() else {
            return;
        };
        let Some(entry) = self.containers.get(id).and_then(outgoing) else {
            return;
        };
        if let Err(e) = store.park(vec![entry]) {
            tracing::warn!(container = id, error = %e, "stdio not parked; it will not survive a runtime restart");
        }
    }

    /// Drops parked descriptors that must go, keeping every running container's.
    pub(super) fn compact_fd_store(&mut self) {
        if !std::mem::take(&mut self.fd_store_stale) {
            return;
        }
        let Some(store) = self.fd_store.as_mut() else {
            return;
        };
        let live: Vec<Outgoing<'_>> = self.containers.values().filter_map(outgoing).collect();
        if let Err(e) = store.compact(live) {
            tracing::warn!(error = %e, "parked container stdio not compacted");
        }
    }

    /// Parked descriptors of a container may have to go (it ended, or its input was taken).
    pub(super) fn stdio_changed(&mut self) {
        self.fd_store_stale = self.fd_store.is_some();
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
    use nix::fcntl::OFlag;
    use std::os::fd::AsRawFd;

    fn running(
        pipes: [Option<OwnedFd>; 2],
        input: Option<OwnedFd>,
        log: Option<LogWriter>,
        tty: bool,
    ) -> Running {
        Running {
            pidfd: crate::sys::pidfd_open(std::process::id() as i32).expect("own pidfd"),
            pipes,
            log,
            input,
            stdin_once: false,
            tty,
        }
    }

    fn ctr(id: &str, run: Running) -> Ctr {
        let rec: ContainerRecord = serde_json::from_value(serde_json::json!({
            "status": {"id": id, "sandboxId": "sb", "name": "app", "image": "busybox:1",
                "state": "Running", "createdAt": "2026-12-04T00:00:00Z", "cgroup": "x"},
            "profile": "Unconfined", "mounted": false
        }))
        .expect("a container record");
        Ctr {
            rec,
            dir: PathBuf::from("/nonexistent"),
            run: Some(run),
            kill_at: None,
            waiters: Vec::new(),
        }
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).expect("pipe")
    }

    #[test]
    fn parked_stdio_comes_back_as_it_was_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogWriter::open(&dir.path().join("0.log"), 1000, 3).expect("log");
        let ((out_r, out_w), (err_r, err_w), (in_r, in_w)) = (pipe(), pipe(), pipe());
        let c = ctr(
            "c1",
            running([Some(out_r), Some(err_r)], Some(in_w), Some(log), false),
        );
        let (p, fds) = outgoing(&c).expect("a running container parks");
        assert_eq!(p.kinds, [Kind::Stdout, Kind::Stderr, Kind::Stdin]);
        assert!(p.input && !p.tty);
        assert_eq!(p.log.as_ref().map(|l| (l.max_size, l.max_files)), Some((1000, 3)));
        let (a, b) = super::super::fdstore::pair().expect("pair");
        let keep = [a.try_clone().expect("dup"), b.try_clone().expect("dup")];
        let mut store = super::super::fdstore::FdStore::new(a, b);
        store.park(vec![(p, fds)]).expect("park");
        drop((c, store));
        let mut store = super::super::fdstore::FdStore::new(
            keep[0].try_clone().expect("dup"),
            keep[1].try_clone().expect("dup"),
        );
        let (p, fds) = store.restore().expect("restore").remove("c1").expect("c1");
        let mut run = running([None, None], None, None, false);
        stdio_into(&mut run, p, fds);
        nix::unistd::write(&out_w, b"out\n").expect("write out");
        nix::unistd::write(&err_w, b"err\n").expect("write err");
        let mut buf = [0u8; 8];
        for (i, want) in [(0, b"out\n"), (1, b"err\n")] {
            let fd = run.pipes[i].as_ref().expect("restored pipe");
            assert_eq!(nix::unistd::read(fd.as_raw_fd(), &mut buf), Ok(4));
            assert_eq!(&buf[..4], want);
        }
        nix::unistd::write(run.input.as_ref().expect("restored input"), b"in\n").expect("write in");
        assert_eq!(nix::unistd::read(in_r.as_raw_fd(), &mut buf), Ok(3));
        assert_eq!(
            run.log.as_ref().map(|l| l.path().to_path_buf()),
            Some(dir.path().join("0.log"))
        );
    }

    #[test]
    fn a_terminal_parks_once_and_gives_input_only_if_asked() {
        let (master, _other) = pipe();
        for asked in [false, true] {
            let input = asked.then(|| master.try_clone().expect("dup"));
            let c = ctr(
                "t",
                running([Some(master.try_clone().expect("dup")), None], input, None, true),
            );
            let (p, fds) = outgoing(&c).expect("parks");
            assert_eq!(
                (p.kinds.as_slice(), p.input, fds.len()),
                ([Kind::Terminal].as_slice(), asked, 1)
            );
            let owned = vec![fds[0].try_clone_to_owned().expect("dup")];
            let mut run = running([None, None], None, None, false);
            stdio_into(&mut run, p, owned);
            assert!(run.tty && run.pipes[0].is_some() && run.pipes[1].is_none());
            assert_eq!(run.input.is_some(), asked);
        }
    }

    #[test]
    fn output_left_by_a_container_that_ended_meanwhile_is_logged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (r, w) = pipe();
        nix::unistd::write(&w, b"last words\nno newline").expect("write");
        drop(w);
        let p = Parked {
            id: "gone".into(),
            generation: 1,
            kinds: vec![Kind::Stdout],
            tty: false,
            stdin_once: false,
            input: false,
            log: Some(LogTarget {
                path: dir.path().join("0.log"),
                max_size: 1 << 20,
                max_files: 2,
            }),
        };
        log_leftovers("gone", p, vec![r]);
        let text = fs::read_to_string(dir.path().join("0.log")).expect("log");
        let lines: Vec<&str> = text.lines().map(|l| l.split(' ').nth(2).unwrap_or("")).collect();
        assert_eq!(lines, ["F", "P"], "{text}");
        assert!(
            text.contains("stdout F last words\n") && text.contains("stdout P no newline\n"),
            "{text}"
        );
    }

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
