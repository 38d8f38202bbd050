//! PID 1's main loop: supervises the node's services with exponential back-off, reaps every
//! zombie, and turns shutdown requests (ctrl-alt-del, ACPI/GPIO power button, signals, the machine
//! config) into an orderly poweroff or reboot.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

/// First restart delay after a crash.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Restart delays double up to this cap.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A service that ran this long before exiting starts over at [`BACKOFF_INITIAL`].
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

/// Linux input event code of the power key, and the key event type.
const KEY_POWER: u16 = 116;
const EV_KEY: u16 = 1;

/// How the machine should go down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    Poweroff,
    Reboot,
}

impl Shutdown {
    fn name(self) -> &'static str {
        match self {
            Shutdown::Poweroff => "poweroff",
            Shutdown::Reboot => "reboot",
        }
    }
}

/// A service: the node binary run with `args`.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    pub name: String,
    pub program: String,
    pub args: Vec<String>,
    /// Run once; its exit powers the machine off (test commands).
    pub oneshot: bool,
    /// Test switch (machine config `debug.killAgent`, `debug.killRuntime`): SIGKILL the service
    /// this long after each start, this many times, as a crash or `kill -9` would.
    pub kill: Option<KillSchedule>,
    /// Descriptors of PID 1 that this service (alone) inherits, under the same numbers, with
    /// the environment variables that name them. PID 1 keeps them open.
    pub pass_fds: Vec<RawFd>,
    pub env: Vec<(String, String)>,
}

/// When the supervisor kills a service on purpose (restart-safety tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillSchedule {
    pub after: Duration,
    pub times: u32,
}

#[derive(Debug)]
enum ServiceState {
    Running {
        pid: Pid,
        since: Instant,
    },
    Waiting {
        until: Instant,
    },
    /// Stopped for shutdown; never restarted.
    Stopped,
}

#[derive(Debug)]
struct Service {
    spec: ServiceSpec,
    state: ServiceState,
    backoff: Backoff,
    restarts: u32,
    /// Kills done so far per [`ServiceSpec::kill`], and the process last killed (it is killed
    /// once, then waited for).
    killed: u32,
    killed_pid: Option<Pid>,
}

/// Exponential back-off: initial, doubling, capped, reset after a long enough run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_INITIAL,
        }
    }
}

impl Backoff {
    /// The delay before the next restart, given how long the service ran; advances the state.
    pub fn on_exit(&mut self, ran: Duration) -> Duration {
        if ran >= BACKOFF_RESET_AFTER {
            self.next = BACKOFF_INITIAL;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
}

/// When a running service is next killed per its [`KillSchedule`], if it is.
fn kill_due(svc: &Service) -> Option<Instant> {
    let k = svc.spec.kill?;
    match svc.state {
        ServiceState::Running { since, pid } if svc.killed < k.times && svc.killed_pid != Some(pid) => {
            Some(since + k.after)
        }
        _ => None,
    }
}

/// Describes a wait status the way the console shows it.
pub fn describe(status: WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("status={code}"),
        WaitStatus::Signaled(_, sig, core) => format!("signal={sig}{}", if core { " core=true" } else { "" }),
        other => format!("{other:?}"),
    }
}

/// The supervisor and its event sources.
#[derive(Debug)]
pub struct Supervisor {
    services: Vec<Service>,
    signals: SignalFd,
    inputs: Vec<File>,
    /// Set by [`Supervisor::stop_all`]: exits are final, nothing restarts.
    stopping: bool,
    /// A shutdown a service's exit asked for (a finished oneshot).
    pending: Option<Shutdown>,
}

/// Errors that stop supervision from starting at all.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot block signals: {0}")]
    Mask(nix::Error),
    #[error("cannot create signalfd: {0}")]
    SignalFd(nix::Error),
}

/// Blocks the signals PID 1 handles in the calling thread; threads created afterwards inherit
/// the mask. Must run before PID 1 starts any thread: a thread with SIGINT unblocked would take
/// the kernel's ctrl-alt-del SIGINT, whose default action kills init (a kernel panic; seen).
pub fn block_handled_signals() -> Result<(), SupervisorError> {
    handled_signals().thread_block().map_err(SupervisorError::Mask)
}

fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGPWR,
    ] {
        set.add(s);
    }
    set
}

impl Supervisor {
    /// Takes the handled signals through a signalfd (children get a clean mask from `Command`),
    /// opens the input devices that can carry a power-button press, and starts no service yet.
    pub fn new() -> Result<Self, SupervisorError> {
        let set = handled_signals();
        block_handled_signals()?;
        let signals = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(SupervisorError::SignalFd)?;
        Ok(Self {
            services: Vec::new(),
            stopping: false,
            pending: None,
            signals,
            inputs: open_power_buttons(),
        })
    }

    /// Adds and starts a service.
    pub fn add(&mut self, spec: ServiceSpec) {
        let mut svc = Service {
            spec,
            state: ServiceState::Waiting {
                until: Instant::now(),
            },
            backoff: Backoff::default(),
            restarts: 0,
            killed: 0,
            killed_pid: None,
        };
        start(&mut svc);
        self.services.push(svc);
    }

    /// Number of power-button input devices being watched.
    pub fn power_buttons(&self) -> usize {
        self.inputs.len()
    }

    /// Runs until a shutdown is requested; returns which one. `immediate` requests one at once
    /// (the machine config's `onReady`).
    pub fn run(&mut self, immediate: Option<Shutdown>) -> Shutdown {
        if let Some(s) = immediate {
            tracing::info!(action = s.name(), "shutdown requested by machine config onReady");
            return s;
        }
        loop {
            let now = Instant::now();
            for svc in &mut self.services {
                if let ServiceState::Waiting { until } = svc.state
                    && until <= now
                {
                    start(svc);
                }
            }
            for svc in &mut self.services {
                if let Some(at) = kill_due(svc)
                    && at <= now
                    && let ServiceState::Running { pid, .. } = svc.state
                {
                    svc.killed += 1;
                    svc.killed_pid = Some(pid);
                    tracing::warn!(service = %svc.spec.name, kill = svc.killed, "killing the service (debug.killAgent/killRuntime)");
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
            let next_wake = self
                .services
                .iter()
                .filter_map(|s| match s.state {
                    ServiceState::Waiting { until } => Some(until.saturating_duration_since(now)),
                    ServiceState::Running { .. } => kill_due(s).map(|at| at.saturating_duration_since(now)),
                    ServiceState::Stopped => None,
                })
                .min();
            let timeout = match next_wake {
                Some(d) => {
                    PollTimeout::try_from(d.as_millis().min(60_000) as i32 + 1).unwrap_or(PollTimeout::MAX)
                }
                None => PollTimeout::NONE,
            };
            let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
            fds.extend(
                self.inputs
                    .iter()
                    .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN)),
            );
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "poll failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
                .collect();
            drop(fds);
            if ready.first() == Some(&true)
                && let Some(s) = self.drain_signals()
            {
                return s;
            }
            for (i, is_ready) in ready.iter().enumerate().skip(1) {
                if *is_ready && power_key_pressed(&mut self.inputs[i - 1]) {
                    tracing::info!("power button pressed");
                    return Shutdown::Poweroff;
                }
            }
        }
    }

    fn drain_signals(&mut self) -> Option<Shutdown> {
        let mut request = None;
        while let Ok(Some(info)) = self.signals.read_signal() {
            let sig = Signal::try_from(info.ssi_signo as i32).ok();
            match sig {
                Some(Signal::SIGCHLD) => self.reap(),
                Some(Signal::SIGINT) => {
                    tracing::info!("ctrl-alt-del");
                    request = Some(Shutdown::Reboot);
                }
                Some(Signal::SIGTERM) => {
                    tracing::info!("SIGTERM: reboot requested");
                    request = Some(Shutdown::Reboot);
                }
                Some(Signal::SIGUSR1 | Signal::SIGUSR2 | Signal::SIGPWR) => {
                    tracing::info!(signal = ?sig, "poweroff requested");
                    request = Some(Shutdown::Poweroff);
                }
                _ => {}
            }
        }
        // Children may exit between reads: reap once more whatever the signals said.
        self.reap();
        request.or(self.pending.take())
    }

    /// Reaps every exited child; schedules restarts of services.
    fn reap(&mut self) {
        loop {
            // Looked at first without reaping (WNOWAIT): an orphan's start time is read while it
            // is a zombie, to record its exit for the runtime.
            let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            let Some(pid) = waitid(Id::All, peek).ok().and_then(|s| s.pid()) else {
                return;
            };
            let started = runtime::server::orphans::start_time(pid.as_raw());
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(status) => self.on_child_exit(pid, status, started),
            }
        }
    }

    fn on_child_exit(&mut self, pid: Pid, status: WaitStatus, started: Option<u64>) {
        let Some(svc) = self
            .services
            .iter_mut()
            .find(|s| matches!(s.state, ServiceState::Running { pid: p, .. } if p == pid))
        else {
            tracing::debug!(pid = pid.as_raw(), status = %describe(status), "reaped orphan");
            // A container or pause process a restarted runtime re-adopted: its exit is the
            // runtime's to report (runtime::server::orphans).
            let exit = runtime::server::orphans::exit_of(status);
            if let (Some(t), Some((code, signal))) = (started, exit)
                && let Err(e) = runtime::server::orphans::record(
                    std::path::Path::new(runtime::server::orphans::PATH),
                    pid.as_raw(),
                    t,
                    code,
                    signal,
                )
            {
                tracing::warn!(pid = pid.as_raw(), error = %e, "cannot record an orphan's exit");
            }
            return;
        };
        if self.stopping {
            tracing::info!(service = %svc.spec.name, status = %describe(status), "service stopped");
            svc.state = ServiceState::Stopped;
            return;
        }
        if svc.spec.oneshot {
            tracing::info!(service = %svc.spec.name, status = %describe(status), "oneshot finished; powering off");
            svc.state = ServiceState::Stopped;
            self.pending = Some(Shutdown::Poweroff);
            return;
        }
        let ran = match svc.state {
            ServiceState::Running { since, .. } => since.elapsed(),
            ServiceState::Waiting { .. } | ServiceState::Stopped => Duration::ZERO,
        };
        let delay = svc.backoff.on_exit(ran);
        svc.restarts += 1;
        tracing::warn!(service = %svc.spec.name, status = %describe(status), ran_ms = ran.as_millis() as u64,
            restarts = svc.restarts, restart_in_ms = delay.as_millis() as u64, "service exited");
        svc.state = ServiceState::Waiting {
            until: Instant::now() + delay,
        };
    }

    /// Sends `signal` to the service `name` and waits up to `wait` for it to exit; it is not
    /// restarted (a shutdown is under way). Returns whether it exited in time.
    pub fn stop_one(&mut self, name: &str, signal: Signal, wait: Duration) -> bool {
        self.stopping = true;
        let Some(pid) = self.services.iter().find_map(|s| match s.state {
            ServiceState::Running { pid, .. } if s.spec.name == name => Some(pid),
            _ => None,
        }) else {
            return true;
        };
        let _ = kill(pid, signal);
        let running = |sup: &Self| {
            sup.services
                .iter()
                .any(|s| matches!(s.state, ServiceState::Running { pid: p, .. } if p == pid))
        };
        let exited = self.wait_while(wait, running);
        if !exited {
            tracing::warn!(
                service = name,
                wait_ms = wait.as_millis() as u64,
                "the service did not exit in time"
            );
        }
        exited
    }

    /// Reaps children until `busy` is false or `wait` is over; returns whether `busy` ended.
    fn wait_while(&mut self, wait: Duration, busy: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && busy(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = [PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
            let _ = poll(
                &mut fds,
                PollTimeout::try_from(left.as_millis().min(1000) as i32).unwrap_or(PollTimeout::MAX),
            );
            while let Ok(Some(_)) = self.signals.read_signal() {}
            self.reap();
        }
        !busy(self)
    }

    /// Orderly stop: SIGTERM to every service, wait up to `grace`, then SIGKILL everything left.
    pub fn stop_all(&mut self, grace: Duration) {
        self.stopping = true;
        for svc in &self.services {
            if let ServiceState::Running { pid, .. } = svc.state {
                let _ = kill(pid, Signal::SIGTERM);
            }
        }
        self.wait_while(grace, Self::any_running);
        let left: Vec<&str> = self
            .services
            .iter()
            .filter(|s| matches!(s.state, ServiceState::Running { .. }))
            .map(|s| s.spec.name.as_str())
            .collect();
        if !left.is_empty() {
            tracing::warn!(services = ?left, grace_ms = grace.as_millis() as u64, "grace period over; killing");
        }
        // Everything but PID 1 itself.
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Err(Errno::ECHILD) => break,
                Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(10)),
                _ => {}
            }
        }
    }

    fn any_running(&self) -> bool {
        self.services
            .iter()
            .any(|s| matches!(s.state, ServiceState::Running { .. }))
    }
}

/// The service's command. PID 1 blocks the signals it handles and a child inherits that mask
/// through exec (seen: the agent ignored SIGTERM); every role of the node binary therefore clears
/// its mask first thing in `main`. Doing it here with `pre_exec` would force fork() instead of
/// posix_spawn and cost ~40 ms of boot under TCG (measured).
fn command(spec: &ServiceSpec) -> Command {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args);
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Sets or clears close-on-exec on a descriptor PID 1 keeps for a service.
fn set_cloexec(fd: RawFd, on: bool) {
    let flag = if on { FdFlag::FD_CLOEXEC } else { FdFlag::empty() };
    if let Err(e) = fcntl(fd, FcntlArg::F_SETFD(flag)) {
        tracing::warn!(fd, error = %e, "cannot change close-on-exec");
    }
}

fn start(svc: &mut Service) {
    // The passed descriptors are inheritable only while this service is spawned (PID 1 spawns
    // from one thread), so no other service gets them.
    for fd in &svc.spec.pass_fds {
        set_cloexec(*fd, false);
    }
    let spawned = command(&svc.spec).spawn();
    for fd in &svc.spec.pass_fds {
        set_cloexec(*fd, true);
    }
    match spawned {
        Ok(child) => {
            let pid = Pid::from_raw(child.id() as i32);
            tracing::info!(service = %svc.spec.name, pid = pid.as_raw(), boot_ms = crate::sys::boot_ms(), "service started");
            // The child is reaped by the supervisor's waitpid(-1), never through `Child`.
            drop(child);
            svc.state = ServiceState::Running {
                pid,
                since: Instant::now(),
            };
        }
        Err(e) => {
            let delay = svc.backoff.on_exit(Duration::ZERO);
            tracing::error!(service = %svc.spec.name, error = %e, restart_in_ms = delay.as_millis() as u64,
                "service failed to start");
            svc.state = ServiceState::Waiting {
                until: Instant::now() + delay,
            };
        }
    }
}

/// Opens the input devices that report a power key (ACPI power button on x86, gpio-keys on arm64).
fn open_power_buttons() -> Vec<File> {
    let Ok(rd) = std::fs::read_dir("/sys/class/input") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("event") {
            continue;
        }
        // capabilities/key is a hex bitmap, most significant word first; bit 116 is KEY_POWER.
        let caps = std::fs::read_to_string(e.path().join("device/capabilities/key")).unwrap_or_default();
        if !has_key(&caps, KEY_POWER) {
            continue;
        }
        let path = format!("/dev/input/{name}");
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => out.push(f),
            Err(e) => tracing::warn!(device = %path, error = %e, "cannot open power button"),
        }
    }
    out
}

/// Whether a sysfs key-capability bitmap (space-separated hex words, most significant first)
/// has `code` set.
pub fn has_key(caps: &str, code: u16) -> bool {
    let words: Vec<&str> = caps.split_whitespace().collect();
    let bits = usize::BITS as usize;
    let idx = code as usize / bits;
    if idx >= words.len() {
        return false;
    }
    let word = words[words.len() - 1 - idx];
    usize::from_str_radix(word, 16)
        .map(|w| w & (1 << (code as usize % bits)) != 0)
        .unwrap_or(false)
}

/// Reads pending input events; true if one was a power-key press.
fn power_key_pressed(dev: &mut File) -> bool {
    // struct input_event on 64-bit Linux: timeval (16 bytes), type u16, code u16, value i32.
    const SIZE: usize = 24;
    let mut buf = [0u8; SIZE * 16];
    let mut pressed = false;
    while let Ok(n) = dev.read(&mut buf) {
        if n == 0 {
            break;
        }
        for ev in buf[..n].chunks_exact(SIZE) {
            let ty = u16::from_ne_bytes([ev[16], ev[17]]);
            let code = u16::from_ne_bytes([ev[18], ev[19]]);
            let value = i32::from_ne_bytes([ev[20], ev[21], ev[22], ev[23]]);
            if ty == EV_KEY && code == KEY_POWER && value == 1 {
                pressed = true;
            }
        }
    }
    pressed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(200);
        let delays: Vec<u128> = (0..12).map(|_| b.on_exit(quick).as_millis()).collect();
        assert_eq!(&delays[..5], &[100, 200, 400, 800, 1600]);
        assert_eq!(*delays.last().unwrap_or(&0), BACKOFF_MAX.as_millis());
        assert_eq!(b.on_exit(BACKOFF_RESET_AFTER), BACKOFF_INITIAL);
        assert_eq!(b.on_exit(quick), BACKOFF_INITIAL * 2);
    }

    #[test]
    fn power_key_bit_is_found() {
        // A typical ACPI power button: "10000000000000 0" has bit 116 set (word 1, bit 52).
        assert!(has_key("10000000000000 0", KEY_POWER));
        assert!(!has_key("0", KEY_POWER));
        assert!(!has_key("", KEY_POWER));
    }
}
