//! Containers: create (overlay root, spec, libcontainer), start, stop with a grace period, exit
//! and its reason, removal; their output into the CRI log.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use runtime_api::{ContainerConfig, ContainerStatus, ErrorKind, Reply, ReplyError, State};

use super::Runtime;
use super::build::Then;
use super::errors::{RuntimeError, errno_ctx, io_ctx, lc_err};
use super::state::{ContainerRecord, Ctr, Running, exit_of, new_id, now, proc_start_time};
use crate::cgroups;
use crate::logs::{LogWriter, Stream};
use crate::seccomp::SeccompExecutor;
use crate::spec;

impl Runtime {
    /// `CreateContainer`: prepares the container and starts its build (see `build`); the reply
    /// comes when the build ends ([`Runtime::finish_container`]).
    pub(super) fn create_container(
        &mut self,
        conn: u64,
        sandbox_id: &str,
        config: ContainerConfig,
    ) -> Result<(), RuntimeError> {
        let sb = self.sandbox(sandbox_id)?;
        if !sb.rec.status.ready {
            return Err(RuntimeError::Conflict(format!(
                "sandbox {sandbox_id} is not ready"
            )));
        }
        validate_container(&config)?;
        let invalid =
            |e: &dyn std::fmt::Display| RuntimeError::Invalid(format!("container {}: {e}", config.name));
        let (caps, devices) = if config.privileged {
            let devices =
                spec::host_devices(Path::new("/dev")).map_err(io_ctx("listing the node's devices"))?;
            (spec::privileged_capabilities(), devices)
        } else {
            let caps = spec::capabilities(&config.capabilities_add, &config.capabilities_drop)
                .map_err(|e| invalid(&e))?;
            (caps, Vec::new())
        };
        let profile = spec::effective_profile(&config).map_err(|e| invalid(&e))?;
        let image = self.images.get(&config.image)?.ok_or_else(|| {
            RuntimeError::NotFound(format!("image {} is not present on this node", config.image))
        })?;
        let id = new_id()?;
        let dir = self.opts.state_dir.join("containers").join(&id);
        let log_path = match (&sb.rec.config.log_directory, &config.log_path) {
            (Some(d), Some(p)) => Some(d.join(p)),
            (Some(d), None) => Some(d.join(&config.name).join("0.log")),
            (None, _) => None,
        };
        let cgroup = cgroups::container_scope(&sb.rec.status.cgroup, &id);
        let paths = spec::SandboxPaths {
            pause_pid: sb.rec.status.pause_pid.unwrap_or(0),
            share_pid: sb.rec.config.share_process_namespace,
            host: sb.rec.config.host,
            target_pid: self.target_pid(sandbox_id, config.target_container_id.as_deref())?,
            hosts: sb.dir.join("hosts").display().to_string(),
            hostname: sb.dir.join("hostname").display().to_string(),
            resolv_conf: sb.dir.join("resolv.conf").display().to_string(),
            shm: sb.dir.join("shm").display().to_string(),
        };
        let status = ContainerStatus {
            id: id.clone(),
            sandbox_id: sandbox_id.into(),
            name: config.name.clone(),
            image: image.reference.clone(),
            state: State::Created,
            pid: None,
            created_at: now(),
            started_at: None,
            finished_at: None,
            exit_code: None,
            signal: None,
            reason: None,
            cgroup: cgroup.clone(),
            log_path: log_path.clone(),
        };
        let lower = self.images.lower_dirs(&image);
        let rootfs = dir.join("rootfs");
        self.tree.create_scope(&cgroup)?;
        let youki_root = self.youki_root.clone();
        let started = (|| -> Result<(), RuntimeError> {
            for d in ["rootfs", "upper", "work"] {
                fs::create_dir_all(dir.join(d)).map_err(io_ctx(format!("creating {d}")))?;
            }
            let lowerdir: Vec<String> = lower.iter().map(|p| p.display().to_string()).collect();
            let opts = format!(
                "lowerdir={},upperdir={},workdir={}",
                lowerdir.join(":"),
                dir.join("upper").display(),
                dir.join("work").display()
            );
            mount(
                Some("overlay"),
                &rootfs,
                Some("overlay"),
                MsFlags::empty(),
                Some(opts.as_str()),
            )
            .map_err(errno_ctx("mounting the overlay root"))?;
            let user = resolve_user(&config, &image.config, &rootfs)?;
            let s = spec::container(
                &config,
                &image.config,
                &paths,
                &cgroup,
                config.oom_score_adj,
                spec::Privileges {
                    user,
                    caps: &caps,
                    devices: &devices,
                    profile,
                },
            );
            fs::write(dir.join("config.json"), s.to_string())
                .map_err(io_ctx("writing the container spec"))?;
            let (out_r, out_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
            let (err_r, err_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
            for r in [&out_r, &err_r] {
                set_nonblocking(r)?;
            }
            let (stdin, input) = if config.stdin && !config.tty {
                let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
                (r, Some(w))
            } else {
                let null = fs::File::open("/dev/null").map_err(io_ctx("/dev/null"))?;
                (OwnedFd::from(null), None)
            };
            // A terminal is made inside the container (its devpts) by libcontainer, which sends
            // the master back over a socket of ours, as runc does for containerd.
            let console = config.tty.then(|| console_socket(&dir)).transpose()?;
            let console_path = console.as_ref().map(|(_, path)| path.clone());
            let output = match console {
                Some((listener, path)) => Output::Terminal(listener, path),
                None => Output::Pipes(out_r, err_r),
            };
            let name = config.name.clone();
            let pending = PendingContainer {
                status,
                dir: dir.clone(),
                profile,
                layers: image.layers.clone(),
                log: log_path.map(|p| {
                    (
                        p,
                        config.log_max_size.unwrap_or(self.opts.log_max_size),
                        config.log_max_files.unwrap_or(self.opts.log_max_files),
                    )
                }),
                output,
                input,
                stdin: config.stdin,
                stdin_once: config.stdin_once,
                tty: config.tty,
            };
            let build_id = id.clone();
            let dir = dir.clone();
            self.start_build(conn, Then::Container(Box::new(pending)), move || {
                let b = ContainerBuilder::new(build_id, SyscallType::default())
                    .with_root_path(&youki_root)
                    .map_err(lc_err("container state root"))?
                    .with_executor(SeccompExecutor { profile });
                let b = match &console_path {
                    Some(path) => b.with_console_socket(Some(path)),
                    None => b.with_stdin(stdin).with_stdout(out_w).with_stderr(err_w),
                };
                let c = b
                    .validate_id()
                    .map_err(lc_err("container id"))?
                    .as_init(&dir)
                    .with_systemd(false)
                    .with_detach(true)
                    .build()
                    .map_err(lc_err(format!("creating container {name}")))?;
                c.pid()
                    .map(|p| p.as_raw())
                    .ok_or_else(|| RuntimeError::Container {
                        what: format!("creating container {name}"),
                        detail: "no pid".into(),
                    })
            })
        })();
        if started.is_err() {
            let _ = umount2(&rootfs, MntFlags::MNT_DETACH);
            let _ = fs::remove_dir_all(&dir);
            self.tree.remove_scope(&cgroup);
        }
        started
    }

    /// Completes a container once its build helper ended with `built` (its process's pid).
    pub(super) fn finish_container(
        &mut self,
        p: PendingContainer,
        built: Result<i32, RuntimeError>,
    ) -> Result<ContainerStatus, RuntimeError> {
        let PendingContainer {
            mut status,
            dir,
            profile,
            layers,
            log,
            output,
            mut input,
            stdin,
            stdin_once,
            tty,
        } = p;
        let id = status.id.clone();
        let ran = built.and_then(|pid| {
            // Its pod may have been removed while the build ran.
            if !self.sandboxes.contains_key(&status.sandbox_id) {
                return Err(RuntimeError::NotFound(format!(
                    "sandbox {} was removed while container {} was created",
                    status.sandbox_id, status.name
                )));
            }
            let pipes = match output {
                Output::Terminal(listener, path) => {
                    let master = receive_terminal(&listener);
                    let _ = fs::remove_file(&path);
                    let master = master?;
                    set_nonblocking(&master)?;
                    // Input (and so the window size) only for a container that asked for stdin.
                    if stdin {
                        input = Some(master.try_clone().map_err(io_ctx("terminal master"))?);
                    }
                    [Some(master), None]
                }
                Output::Pipes(out_r, err_r) => [Some(out_r), Some(err_r)],
            };
            let pidfd = crate::sys::pidfd_open(pid).map_err(io_ctx("pidfd of the container"))?;
            let log = match &log {
                Some((p, size, files)) => {
                    Some(LogWriter::open(p, *size, *files).map_err(io_ctx(format!("log {}", p.display())))?)
                }
                None => None,
            };
            Ok((
                pid,
                Running {
                    pidfd,
                    pipes,
                    log,
                    input,
                    stdin_once,
                    tty,
                },
            ))
        });
        match ran {
            Ok((pid, run)) => {
                status.pid = Some(pid);
                let c = Ctr {
                    rec: ContainerRecord {
                        status: status.clone(),
                        profile,
                        mounted: true,
                        start_time: proc_start_time(pid),
                        layers,
                    },
                    dir,
                    run: Some(run),
                    kill_at: None,
                    waiters: Vec::new(),
                };
                self.containers.insert(id.clone(), c);
                self.persist_container(&id);
                self.park_stdio(&id);
                tracing::info!(container = %id, name = %status.name, pid, "container created");
                Ok(status)
            }
            Err(e) => {
                // libcontainer may have left a process of the failed create behind.
                self.strays = true;
                if let Ok(mut c) = Container::load(self.youki_root.join(&id)) {
                    let _ = c.delete(true);
                }
                let _ = umount2(&dir.join("rootfs"), MntFlags::MNT_DETACH);
                let _ = fs::remove_dir_all(&dir);
                self.tree.remove_scope(&status.cgroup);
                // A pod removed meanwhile could not remove its slice, which held this one.
                if !self.sandboxes.contains_key(&status.sandbox_id)
                    && let Some((slice, _)) = status.cgroup.rsplit_once('/')
                    && let Err(e) = self.tree.remove_pod(slice)
                {
                    tracing::warn!(container = %id, error = %e, "pod cgroup not removed");
                }
                Err(e)
            }
        }
    }

    pub(super) fn start_container(&mut self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let c = self
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))?;
        if c.rec.status.state != State::Created {
            return Err(RuntimeError::Conflict(format!(
                "container {id} is {:?}, not Created",
                c.rec.status.state
            )));
        }
        let mut lc = Container::load(self.youki_root.join(id)).map_err(lc_err("loading container state"))?;
        lc.start()
            .map_err(lc_err(format!("starting container {}", c.rec.status.name)))?;
        c.rec.status.state = State::Running;
        c.rec.status.started_at = Some(now());
        let status = c.rec.status.clone();
        self.persist_container(id);
        Ok(status)
    }

    /// Sends SIGTERM and schedules SIGKILL; returns whether the caller must wait for the exit.
    pub(super) fn stop_container(&mut self, id: &str, timeout_seconds: u64) -> Result<bool, RuntimeError> {
        let c = self
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))?;
        let (Some(pid), Some(_)) = (c.rec.status.pid, c.run.as_ref()) else {
            return Ok(false);
        };
        if c.rec.status.state == State::Exited {
            return Ok(false);
        }
        let sig = if timeout_seconds == 0 || c.rec.status.state == State::Created {
            Signal::SIGKILL
        } else {
            Signal::SIGTERM
        };
        let _ = kill(Pid::from_raw(pid), sig);
        let deadline = Instant::now() + Duration::from_secs(timeout_seconds);
        c.kill_at = Some(c.kill_at.map_or(deadline, |d| d.min(deadline)));
        Ok(true)
    }

    /// SIGKILL and wait (used by sandbox stop and removal).
    pub(super) fn kill_and_reap(&mut self, id: &str) {
        let Some(c) = self.containers.get(id) else { return };
        if let (Some(pid), Some(run)) = (c.rec.status.pid, c.run.as_ref()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let status = match waitpid(Pid::from_raw(pid), None) {
                Ok(s) => exit_of(s),
                Err(_) => {
                    // Re-adopted, so not our child: its pidfd turns readable once it ended.
                    let mut fds = [PollFd::new(run.pidfd.as_fd(), PollFlags::POLLIN)];
                    let _ = poll(&mut fds, PollTimeout::from(10_000u16));
                    self.orphan_exit(id, pid)
                }
            };
            self.on_exit(id, status);
        }
    }

    pub(super) fn remove_container(&mut self, id: &str) -> Result<(), RuntimeError> {
        self.container(id)?;
        self.kill_and_reap(id);
        let Some(c) = self.containers.remove(id) else {
            return Ok(());
        };
        if let Ok(mut lc) = Container::load(self.youki_root.join(id)) {
            lc.delete(true)
                .map_err(lc_err(format!("deleting container {id}")))?;
        }
        let rootfs = c.dir.join("rootfs");
        if c.rec.mounted {
            match umount2(&rootfs, MntFlags::MNT_DETACH) {
                Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => {}
                Err(e) => return Err(errno_ctx("unmounting the container root")(e)),
            }
        }
        fs::remove_dir_all(&c.dir).map_err(io_ctx(format!("removing {}", c.dir.display())))?;
        let _ = fs::remove_dir(self.tree.path(&c.rec.status.cgroup));
        self.forget_samples(&c.rec.status.cgroup);
        for conn in c.waiters {
            self.outbox.push((
                conn,
                Reply::Error(ReplyError::new(
                    ErrorKind::NotFound,
                    format!("container {id} was removed"),
                )),
            ));
        }
        tracing::info!(container = id, "container removed");
        Ok(())
    }

    /// `Attach`: whether container `id` runs on a terminal, and its input if it has one to give
    /// (a `stdinOnce` container's is given away once; otherwise a copy each time).
    pub(super) fn attach(&mut self, id: &str) -> Result<(bool, Option<OwnedFd>), RuntimeError> {
        let c = self
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))?;
        let run = match c.run.as_mut() {
            Some(run) if c.rec.status.state == State::Running => run,
            _ => return Err(RuntimeError::Conflict(format!("container {id} is not running"))),
        };
        let tty = run.tty;
        if !run.stdin_once {
            let input = run.input.as_ref().map(|fd| fd.try_clone());
            return Ok((tty, input.transpose().map_err(io_ctx("container input"))?));
        }
        let input = run.input.take();
        if input.is_some() {
            // Its parked copy goes before the client has it, or the client's close would not be
            // the container's EOF.
            self.stdio_changed();
            self.compact_fd_store();
        }
        Ok((tty, input))
    }

    /// The pid of running container `target` of sandbox `sandbox_id`, whose pid namespace a new
    /// container joins.
    fn target_pid(&self, sandbox_id: &str, target: Option<&str>) -> Result<Option<i32>, RuntimeError> {
        let Some(target) = target else { return Ok(None) };
        let c = self.container(target)?;
        if c.rec.status.sandbox_id != sandbox_id {
            return Err(RuntimeError::Invalid(format!(
                "target container {target} is not in sandbox {sandbox_id}"
            )));
        }
        match (c.rec.status.state, c.rec.status.pid) {
            (State::Running, Some(pid)) => Ok(Some(pid)),
            _ => Err(RuntimeError::Conflict(format!(
                "target container {target} is not running"
            ))),
        }
    }

    pub(super) fn status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.container(id).map(|c| c.rec.status.clone())
    }

    /// The container's process ended: reaps it (if it is ours) and records the exit.
    pub(super) fn on_container_exit(&mut self, id: &str) {
        let Some(pid) = self.containers.get(id).and_then(|c| c.rec.status.pid) else {
            return;
        };
        let status = match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return,
            Ok(s) => exit_of(s),
            Err(_) => self.orphan_exit(id, pid),
        };
        self.on_exit(id, status);
    }

    /// The exit of a re-adopted container, which PID 1 reaped (see [`super::orphans`]): looked
    /// for during up to 200 ms, as PID 1 records it right after the pidfd said it ended.
    fn orphan_exit(&self, id: &str, pid: i32) -> Option<(i32, Option<i32>)> {
        let started = self.containers.get(id)?.rec.start_time?;
        for _ in 0..20 {
            if let Some(exit) = super::orphans::lookup(&self.opts.orphan_exits, pid, started) {
                return Some(exit);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(
            container = id,
            pid,
            "exit of a re-adopted container not recorded by PID 1"
        );
        None
    }

    /// Records an exit (status None: not our child any more, code unknown).
    fn on_exit(&mut self, id: &str, status: Option<(i32, Option<i32>)>) {
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        if let Some(mut run) = c.run.take() {
            drain_pipes(&mut run);
            if let Some(log) = run.log.as_mut()
                && let Err(e) = log.flush_partial()
            {
                tracing::warn!(container = id, error = %e, "log flush failed");
            }
        }
        let oom = self.tree.oom_killed(&c.rec.status.cgroup);
        let st = &mut c.rec.status;
        st.state = State::Exited;
        st.finished_at = Some(now());
        match status {
            Some((code, signal)) => {
                st.exit_code = Some(code);
                st.signal = signal;
                st.reason = Some(
                    if oom {
                        "OOMKilled"
                    } else if code == 0 {
                        "Completed"
                    } else {
                        "Error"
                    }
                    .into(),
                );
            }
            None => st.reason = Some(if oom { "OOMKilled" } else { "Unknown" }.into()),
        }
        c.kill_at = None;
        let reply = Reply::Container { status: st.clone() };
        tracing::info!(container = id, exit_code = ?st.exit_code, reason = ?st.reason, "container exited");
        for conn in std::mem::take(&mut c.waiters) {
            self.outbox.push((conn, reply.clone()));
        }
        self.persist_container(id);
        self.stdio_changed();
    }

    /// SIGKILL for containers whose stop grace period ran out; the next deadline.
    pub(super) fn container_deadlines(&mut self, now: Instant) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for c in self.containers.values_mut() {
            let Some(at) = c.kill_at else { continue };
            if at <= now {
                if let Some(pid) = c.rec.status.pid {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                c.kill_at = None;
            } else {
                let d = at - now;
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        next
    }

    /// Output of a container is readable.
    pub(super) fn on_container_output(&mut self, id: &str, idx: usize) {
        let Some(run) = self.containers.get_mut(id).and_then(|c| c.run.as_mut()) else {
            return;
        };
        if !read_pipe(run, idx) {
            run.pipes[idx] = None;
        }
    }
}

/// A container whose build runs in a helper (see `build`).
pub(super) struct PendingContainer {
    /// The status to report, its pid filled in once the process exists.
    status: ContainerStatus,
    dir: PathBuf,
    profile: runtime_api::SeccompProfile,
    layers: Vec<String>,
    /// The CRI log: its path, size limit and number of files.
    log: Option<(PathBuf, u64, usize)>,
    output: Output,
    /// The write end of the stdin pipe.
    input: Option<OwnedFd>,
    stdin: bool,
    stdin_once: bool,
    tty: bool,
}

/// Where a container's output will be read.
enum Output {
    /// The read ends of its stdout and stderr.
    Pipes(OwnedFd, OwnedFd),
    /// The console socket libcontainer sends the terminal's master through, and its path.
    Terminal(UnixListener, PathBuf),
}

/// A listening socket in the container's directory for libcontainer to send the terminal's
/// master through (`console.sock`), and its path.
fn console_socket(dir: &Path) -> Result<(UnixListener, PathBuf), RuntimeError> {
    let path = dir.join("console.sock");
    let _ = fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(io_ctx("the console socket"))?;
    Ok((listener, path))
}

/// The terminal master libcontainer sent: its connection was made before the container's
/// process was cloned and the descriptor written before `build` returned, so nothing here
/// waits long (the timeouts guard against a libcontainer that did neither).
fn receive_terminal(listener: &UnixListener) -> Result<OwnedFd, RuntimeError> {
    let gone = |what: &str| RuntimeError::Container {
        what: "creating the container's terminal".into(),
        detail: what.into(),
    };
    listener
        .set_nonblocking(true)
        .map_err(io_ctx("the console socket"))?;
    let (conn, _) = listener
        .accept()
        .map_err(|e| gone(&format!("libcontainer did not connect: {e}")))?;
    conn.set_nonblocking(false)
        .and_then(|()| conn.set_read_timeout(Some(Duration::from_secs(5))))
        .map_err(io_ctx("the console socket"))?;
    let (mut buf, mut fds) = (Vec::new(), Vec::new());
    while fds.is_empty() {
        match runtime_api::recv_some(conn.as_raw_fd(), &mut buf, &mut fds) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(gone(&format!("no terminal received: {e}"))),
        }
    }
    fds.pop().ok_or_else(|| gone("no terminal received"))
}

pub(super) fn set_nonblocking(fd: &impl std::os::fd::AsFd) -> Result<(), RuntimeError> {
    runtime_api::pty::set_nonblocking(fd.as_fd()).map_err(io_ctx("non-blocking pipe"))
}

/// Reads what is available from one output pipe into the log; false on EOF/error.
fn read_pipe(run: &mut Running, idx: usize) -> bool {
    let Some(fd) = run.pipes[idx].as_ref() else {
        return false;
    };
    let mut buf = [0u8; 64 * 1024];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => return false,
            Ok(n) => {
                if let Some(log) = run.log.as_mut() {
                    let stream = if idx == 0 { Stream::Stdout } else { Stream::Stderr };
                    if let Err(e) = log.write(stream, &buf[..n]) {
                        tracing::warn!(error = %e, "container log write failed");
                    }
                }
            }
            Err(Errno::EAGAIN) => {
                // A terminal's prompt and echo are whole only without their newline: written as
                // partial records now, so an attached client sees them as they come.
                if run.tty
                    && let Some(log) = run.log.as_mut()
                    && let Err(e) = log.flush_partial()
                {
                    tracing::warn!(error = %e, "container log write failed");
                }
                return true;
            }
            Err(Errno::EINTR) => {}
            // EIO: a terminal whose other side is closed everywhere (the process ended).
            Err(_) => return false,
        }
    }
}

fn drain_pipes(run: &mut Running) {
    for idx in 0..2 {
        read_pipe(run, idx);
        run.pipes[idx] = None;
    }
}

/// The container's uid/gid: runAsUser/runAsGroup, else the image's `User` (numeric, or a name
/// looked up in the image's /etc/passwd without following symlinks), else root.
fn resolve_user(
    cfg: &ContainerConfig,
    image: &crate::image::store::ImageConfig,
    rootfs: &Path,
) -> Result<(u32, u32), RuntimeError> {
    let (mut uid, mut gid) = (0, None);
    if !image.user.is_empty() {
        match spec::numeric_user(&image.user) {
            Some((u, g)) => (uid, gid) = (u, g),
            None => {
                let name = image.user.split(':').next().unwrap_or("");
                let (u, g) = lookup_passwd(rootfs, name).ok_or_else(|| {
                    RuntimeError::Invalid(format!("image user {name:?} is not in the image's /etc/passwd"))
                })?;
                (uid, gid) = (u, Some(g));
            }
        }
    }
    if let Some(u) = cfg.run_as_user {
        uid = u;
        gid = gid.or(Some(u));
    }
    let gid = cfg.run_as_group.or(gid).unwrap_or(0);
    Ok((uid, gid))
}

fn lookup_passwd(rootfs: &Path, name: &str) -> Option<(u32, u32)> {
    let etc = rootfs.join("etc");
    let passwd = etc.join("passwd");
    if !fs::symlink_metadata(&etc).ok()?.is_dir() || !fs::symlink_metadata(&passwd).ok()?.is_file() {
        return None;
    }
    let text = fs::read_to_string(passwd).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[0] == name)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

/// A relative path of plain components (no `..`, not absolute).
fn is_plain_relative(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Request fields end up in paths (logs, mounts): anything that could leave its directory is
/// refused before anything is created.
fn validate_container(c: &ContainerConfig) -> Result<(), RuntimeError> {
    let bad = |m: String| Err(RuntimeError::Invalid(m));
    if !kcore::names::is_dns1123_label(&c.name) {
        return bad(format!(
            "invalid container name {:?}: a DNS-1123 label is required",
            c.name
        ));
    }
    if c.log_path.as_deref().is_some_and(|p| !is_plain_relative(p)) {
        return bad(format!(
            "invalid log path {:?}: relative, without '..'",
            c.log_path
        ));
    }
    for m in &c.mounts {
        if !m.host_path.is_absolute()
            || m.host_path
                .components()
                .any(|x| x == std::path::Component::ParentDir)
        {
            return bad(format!(
                "mount source {:?} must be an absolute path without '..'",
                m.host_path
            ));
        }
        if !m.container_path.starts_with('/') || m.container_path.split('/').any(|x| x == "..") {
            return bad(format!(
                "mount destination {:?} must be an absolute path without '..'",
                m.container_path
            ));
        }
        if !m.host_path.exists() {
            return bad(format!("mount source {} does not exist", m.host_path.display()));
        }
    }
    if c.env.iter().any(|e| !e.contains('=') || e.starts_with('=')) {
        return bad("environment entries must be NAME=value".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_requests_that_would_leave_their_directories_are_refused() {
        let c = ContainerConfig {
            name: "app".into(),
            ..Default::default()
        };
        assert!(validate_container(&c).is_ok());
        for name in ["", "App", "a/b", "../x", "-a", &"a".repeat(64)] {
            assert!(
                validate_container(&ContainerConfig {
                    name: name.into(),
                    ..c.clone()
                })
                .is_err(),
                "{name:?}"
            );
        }
        assert!(
            validate_container(&ContainerConfig {
                log_path: Some("../../etc/passwd".into()),
                ..c.clone()
            })
            .is_err()
        );
        assert!(
            validate_container(&ContainerConfig {
                log_path: Some("app/0.log".into()),
                ..c.clone()
            })
            .is_ok()
        );
        let mount = |h: &str, d: &str| runtime_api::Mount {
            host_path: h.into(),
            container_path: d.into(),
            read_only: false,
        };
        for (h, d) in [
            ("tmp", "/x"),
            ("/tmp/../etc", "/x"),
            ("/tmp", "x"),
            ("/tmp", "/a/../../b"),
            ("/nonexistent-path", "/x"),
        ] {
            assert!(
                validate_container(&ContainerConfig {
                    mounts: vec![mount(h, d)],
                    ..c.clone()
                })
                .is_err(),
                "{h} {d}"
            );
        }
        assert!(
            validate_container(&ContainerConfig {
                mounts: vec![mount("/tmp", "/data")],
                ..c.clone()
            })
            .is_ok()
        );
        assert!(
            validate_container(&ContainerConfig {
                env: vec!["NOEQUALS".into()],
                ..c
            })
            .is_err()
        );
    }
}
