//! Container builds in forked helper children, so the loop goes on serving while libcontainer
//! sets a container up.
//!
//! A libcontainer build blocks its caller until the container's init process is ready: 60-90 ms
//! per build under TCG, nearly all of it waiting for libcontainer's own children (the
//! intermediate and init processes) and, for a sandbox, 15-20 ms more of rtnetlink calls for its
//! veth. Done on the loop's one thread, the builds of pods created together ran one after the
//! other, and the second vCPU of a node stayed idle (measured in `bench pods`, 30 pods at once
//! on a 2-vCPU node: 6.2 s to the last pod Running, the runtime ~190 ms per pod, half of the
//! node's CPU time idle).
//!
//! So the loop prepares what a build needs (directories, mounts, spec, cgroup slice, pipes),
//! then forks a helper that runs the build (for a sandbox also the pause process's start and its
//! network), writes the new process's pid or the error into a pipe and `_exit`s. The runtime is
//! a child subreaper: when the helper exits, the container's init process (libcontainer clones
//! it as the helper's child) is re-parented to the runtime, which reaps and watches it as before.
//! The reply goes out when the helper has ended ([`Runtime::on_build_exit`]). The fork is cheap:
//! the runtime holds about 1 MB of anonymous memory, and a fork, `_exit` and wait of it took
//! ~3 ms in a node VM. At most [`in_flight`] builds run at once; later build requests wait in
//! their connections.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};
use runtime_api::{ErrorKind, Reply, ReplyError};
use serde::{Deserialize, Serialize};

use super::Runtime;
use super::container::PendingContainer;
use super::errors::{RuntimeError, errno_ctx, io_ctx};
use super::sandbox::PendingSandbox;

/// How many builds run at once: two per CPU (a build waits part of its time, on its children
/// and on the kernel), at least two. Counted once: the loop asks on every turn, and the
/// standard library's count reads the process's cgroup files each time (a sampling profiler
/// found it among the runtime's busiest callers of `open`).
pub(super) fn in_flight() -> usize {
    static IN_FLIGHT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *IN_FLIGHT.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from).max(1) * 2)
}

/// A build running in a helper child.
pub(super) struct Build {
    helper: Pid,
    /// Readable once the helper has ended (None: the helper could not be given one, and was
    /// waited for at once).
    pub pidfd: Option<OwnedFd>,
    /// The read end of the helper's result pipe.
    out: OwnedFd,
    /// The connection the reply goes to.
    conn: u64,
    pub then: Then,
}

/// What completes a build once its helper has ended.
pub(super) enum Then {
    Sandbox(Box<PendingSandbox>),
    Container(Box<PendingContainer>),
}

/// The helper's report: the new process's pid, or why there is none.
#[derive(Debug, Serialize, Deserialize)]
enum Outcome {
    Pid(i32),
    Failed(ReplyError),
}

impl Runtime {
    /// Whether as many builds run as may.
    pub(super) fn builds_full(&self) -> bool {
        self.builds.len() >= in_flight()
    }

    /// Forks a helper that runs `work` (a libcontainer build and what must follow it in the
    /// same process) and records the build; its reply goes to `conn` once the helper ended.
    /// `work`'s captures are dropped here, in the runtime, right after the fork: descriptors
    /// that only the new container must hold (its stdio's other ends) stay open only there.
    pub(super) fn start_build(
        &mut self,
        conn: u64,
        then: Then,
        work: impl FnOnce() -> Result<i32, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
        match crate::sys::fork().map_err(io_ctx("forking the build helper"))? {
            ForkResult::Child => {
                drop(out_r);
                let outcome = match work() {
                    Ok(pid) => Outcome::Pid(pid),
                    Err(e) => Outcome::Failed(e.to_reply()),
                };
                let mut line = serde_json::to_vec(&outcome).unwrap_or_default();
                line.push(b'\n');
                let ok = std::fs::File::from(out_w).write_all(&line).is_ok();
                crate::sys::exit_child(if ok { 0 } else { 1 })
            }
            ForkResult::Parent { child } => {
                drop(out_w);
                drop(work);
                // The container's init process holds a copy of the write end until it execs.
                let nonblocking = super::container::set_nonblocking(&out_r);
                let pidfd = crate::sys::pidfd_open(child.as_raw())
                    .inspect_err(
                        |e| tracing::warn!(error = %e, "no pidfd for a build helper: waiting for it"),
                    )
                    .ok();
                let waited = pidfd.is_none() || nonblocking.is_err();
                let token = self.next_build;
                self.next_build += 1;
                self.builds.insert(
                    token,
                    Build {
                        helper: child,
                        pidfd,
                        out: out_r,
                        conn,
                        then,
                    },
                );
                if waited {
                    self.on_build_exit(token);
                }
                Ok(())
            }
        }
    }

    /// A build helper ended: the build is completed with what it reported, and the reply goes
    /// out.
    pub(super) fn on_build_exit(&mut self, token: u64) {
        let Some(b) = self.builds.remove(&token) else {
            return;
        };
        let status = waitpid(b.helper, None);
        // The helper wrote its one line before it exited: it is in the pipe.
        let line = read_line(&b.out);
        let outcome =
            match serde_json::from_slice::<Outcome>(line.split(|c| *c == b'\n').next().unwrap_or_default()) {
                Ok(Outcome::Pid(pid)) => Ok(pid),
                Ok(Outcome::Failed(e)) => Err(RuntimeError::Reported(e)),
                Err(_) => Err(RuntimeError::Reported(ReplyError::new(
                    ErrorKind::Internal,
                    format!("the build helper ended without a result ({status:?})"),
                ))),
            };
        let reply = match b.then {
            Then::Sandbox(p) => self
                .finish_sandbox(*p, outcome)
                .map(|status| Reply::Sandbox { status }),
            Then::Container(p) => self
                .finish_container(*p, outcome)
                .map(|status| Reply::Container { status }),
        };
        self.outbox
            .push((b.conn, reply.unwrap_or_else(|e| Reply::Error(e.to_reply()))));
    }
}

/// The helper's line (or what there is of it) from its pipe.
fn read_line(fd: &OwnedFd) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => return out,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.contains(&b'\n') {
                    return out;
                }
            }
            Err(Errno::EINTR) => {}
            Err(_) => return out,
        }
    }
}
