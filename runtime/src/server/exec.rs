//! Processes run in a running container (libcontainer's tenant builder): `Exec` with the
//! client's stdio (pipes or a terminal it passed), and `ExecSync`, whose output the runtime
//! captures and returns with the exit code (exec probes), killed at its timeout.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use runtime_api::{ErrorKind, ExecSyncResult, Reply, ReplyError, State};

use super::Runtime;
use super::container::set_nonblocking;
use super::errors::{RuntimeError, errno_ctx, io_ctx, lc_err};
use super::state::{exit_of, new_id};
use crate::seccomp::SeccompExecutor;

/// A process started by `Exec` or `ExecSync`.
pub(super) struct ExecProc {
    pid: Pid,
    pub pidfd: Option<OwnedFd>,
    exit: Option<i32>,
    /// Connections waiting for the exit code (`WaitExec`).
    waiters: Vec<u64>,
    /// `ExecSync`: the output the runtime reads, and who gets it.
    pub capture: Option<Capture>,
}

/// What an `ExecSync` collects.
pub(super) struct Capture {
    conn: u64,
    /// stdout and stderr read ends (None once closed).
    pub pipes: [Option<OwnedFd>; 2],
    out: [Vec<u8>; 2],
    deadline: Option<Instant>,
    timeout_seconds: u64,
    timed_out: bool,
}

impl Runtime {
    /// Starts `command` in container `id` with `stdio` (in, out, err); returns the exec id.
    pub(super) fn exec(
        &mut self,
        id: &str,
        command: Vec<String>,
        mut stdio: Vec<OwnedFd>,
    ) -> Result<String, RuntimeError> {
        let (err, out, inp) = (stdio.pop(), stdio.pop(), stdio.pop());
        let (Some(inp), Some(out), Some(err)) = (inp, out, err) else {
            return Err(RuntimeError::Invalid("exec needs three file descriptors".into()));
        };
        let pid = self.spawn_in(id, command, [inp, out, err])?;
        let exec_id = new_id()?;
        let pidfd = crate::sys::pidfd_open(pid.as_raw()).map_err(io_ctx("pidfd of the exec"))?;
        self.execs.insert(
            exec_id.clone(),
            ExecProc {
                pid,
                pidfd: Some(pidfd),
                exit: None,
                waiters: Vec::new(),
                capture: None,
            },
        );
        Ok(exec_id)
    }

    /// `WaitExec`: the exit code now, or `None` when `conn` waits for it.
    pub(super) fn wait_exec(&mut self, conn: u64, exec_id: &str) -> Result<Option<i32>, RuntimeError> {
        let e = self
            .execs
            .get_mut(exec_id)
            .filter(|e| e.capture.is_none())
            .ok_or_else(|| RuntimeError::NotFound(format!("exec {exec_id} not found")))?;
        match e.exit {
            Some(code) => {
                self.execs.remove(exec_id);
                Ok(Some(code))
            }
            None => {
                e.waiters.push(conn);
                Ok(None)
            }
        }
    }

    /// `ExecSync`: starts the command with stdin from /dev/null and its output into pipes the
    /// runtime reads; `conn` gets the reply when it exits.
    pub(super) fn exec_sync(
        &mut self,
        conn: u64,
        id: &str,
        command: Vec<String>,
        timeout_seconds: u64,
    ) -> Result<(), RuntimeError> {
        let stdin = OwnedFd::from(fs::File::open("/dev/null").map_err(io_ctx("/dev/null"))?);
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
        let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
        for r in [&out_r, &err_r] {
            set_nonblocking(r)?;
        }
        let pid = self.spawn_in(id, command, [stdin, out_w, err_w])?;
        let exec_id = new_id()?;
        let pidfd = crate::sys::pidfd_open(pid.as_raw()).map_err(io_ctx("pidfd of the exec"))?;
        let deadline = (timeout_seconds > 0).then(|| Instant::now() + Duration::from_secs(timeout_seconds));
        self.execs.insert(
            exec_id,
            ExecProc {
                pid,
                pidfd: Some(pidfd),
                exit: None,
                waiters: Vec::new(),
                capture: Some(Capture {
                    conn,
                    pipes: [Some(out_r), Some(err_r)],
                    out: [Vec::new(), Vec::new()],
                    deadline,
                    timeout_seconds,
                    timed_out: false,
                }),
            },
        );
        Ok(())
    }

    /// Starts a process in running container `id` with the given stdio.
    fn spawn_in(&mut self, id: &str, command: Vec<String>, stdio: [OwnedFd; 3]) -> Result<Pid, RuntimeError> {
        let c = self.container(id)?;
        if c.rec.status.state != State::Running {
            return Err(RuntimeError::Conflict(format!("container {id} is not running")));
        }
        if command.is_empty() {
            return Err(RuntimeError::Invalid("exec needs a command".into()));
        }
        let [inp, out, err] = stdio;
        // The exec runs at its container's score (NODE-45), not the runtime's.
        let adj = c
            .rec
            .status
            .pid
            .and_then(|pid| crate::sys::oom_score_adj(pid).ok());
        let started = crate::sys::with_child_oom_score(adj, || {
            crate::sys::closing_sockets_on_failure(|| {
                ContainerBuilder::new(id.to_string(), SyscallType::default())
                    .with_root_path(&self.youki_root)
                    .map_err(lc_err("container state root"))?
                    .with_executor(SeccompExecutor {
                        profile: c.rec.profile,
                    })
                    .with_stdin(inp)
                    .with_stdout(out)
                    .with_stderr(err)
                    .as_tenant()
                    .with_container_args(command)
                    .with_detach(true)
                    .build()
                    .map_err(lc_err(format!("exec in container {id}")))
            })
        });
        if started.is_err() {
            self.strays = true;
            self.reap_strays();
        }
        started
    }

    /// Reaps the runtime's children that it does not track, after a failed exec or create
    /// (libcontainer may leave a process it started and never returned the pid of: a tenant
    /// whose setup failed). Such a zombie in a container's pid namespace keeps the namespace's
    /// init from finishing its exit (the kernel waits until every task of the namespace is
    /// reaped), so the container would never be reported exited and its stop would hang.
    /// Returns whether untracked children are still alive (look again later).
    pub(super) fn reap_strays(&mut self) -> bool {
        if !self.strays {
            return false;
        }
        // A build's new process becomes the runtime's child when its helper ends, before the
        // runtime has recorded it: nothing is reaped as a stray while builds run.
        if !self.builds.is_empty() {
            return true;
        }
        let me = std::process::id();
        let listed = fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default();
        let tracked: std::collections::BTreeSet<i32> = self
            .containers
            .values()
            .filter(|c| c.run.is_some())
            .filter_map(|c| c.rec.status.pid)
            .chain(self.execs.values().map(|e| e.pid.as_raw()))
            .chain(self.sandboxes.values().filter_map(|s| s.rec.status.pause_pid))
            .chain(self.pulls.values().map(|p| p.pid.as_raw()))
            .collect();
        let mut alive = false;
        for pid in listed.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if tracked.contains(&pid) {
                continue;
            }
            match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => alive = true,
                Ok(status) => tracing::info!(pid, ?status, "reaped an untracked child"),
                Err(_) => {}
            }
        }
        self.strays = alive;
        alive
    }

    /// An exec's process ended: its exit code goes to whoever waits (or is kept until asked).
    pub(super) fn on_exec_exit(&mut self, exec_id: &str) {
        let Some(e) = self.execs.get_mut(exec_id) else {
            return;
        };
        let code = match waitpid(e.pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return,
            Ok(s) => exit_of(s).map_or(255, |x| x.0),
            Err(_) => 255,
        };
        e.exit = Some(code);
        e.pidfd = None;
        if let Some(mut cap) = e.capture.take() {
            self.execs.remove(exec_id);
            for idx in 0..2 {
                read_capture(&mut cap, idx);
            }
            let reply = if cap.timed_out {
                Reply::Error(ReplyError::new(
                    ErrorKind::DeadlineExceeded,
                    format!("command timed out after {}s", cap.timeout_seconds),
                ))
            } else {
                let [stdout, stderr] = cap.out;
                Reply::ExecSync {
                    outcome: ExecSyncResult {
                        exit_code: code,
                        stdout,
                        stderr,
                    },
                }
            };
            self.outbox.push((cap.conn, reply));
            return;
        }
        let waiters = std::mem::take(&mut e.waiters);
        if !waiters.is_empty() {
            self.execs.remove(exec_id);
        }
        for conn in waiters {
            self.outbox.push((conn, Reply::ExecExit { exit_code: code }));
        }
    }

    /// Output of an `ExecSync` is readable.
    pub(super) fn on_exec_output(&mut self, exec_id: &str, idx: usize) {
        if let Some(cap) = self.execs.get_mut(exec_id).and_then(|e| e.capture.as_mut())
            && !read_capture(cap, idx)
        {
            cap.pipes[idx] = None;
        }
    }

    /// SIGKILL for `ExecSync` processes past their timeout; the next deadline.
    pub(super) fn exec_deadlines(&mut self, now: Instant) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for e in self.execs.values_mut() {
            let Some(cap) = e.capture.as_mut() else { continue };
            let Some(at) = cap.deadline else { continue };
            if at <= now {
                let _ = kill(e.pid, Signal::SIGKILL);
                cap.timed_out = true;
                cap.deadline = None;
            } else {
                let d = at - now;
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        next
    }
}

/// Reads what is available from one captured pipe (keeping at most
/// [`ExecSyncResult::MAX_OUTPUT`] bytes); false on EOF/error.
fn read_capture(cap: &mut Capture, idx: usize) -> bool {
    let Some(fd) = cap.pipes[idx].as_ref() else {
        return false;
    };
    let mut buf = [0u8; 16 * 1024];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => return false,
            Ok(n) => {
                let keep = ExecSyncResult::MAX_OUTPUT
                    .saturating_sub(cap.out[idx].len())
                    .min(n);
                cap.out[idx].extend_from_slice(&buf[..keep]);
            }
            Err(Errno::EAGAIN) => return true,
            Err(Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
}
