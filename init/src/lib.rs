//! PID 1 of the node OS and the entry of every role of the node binary.
//!
//! Boot order (each step logged to the console and /dev/kmsg): early mounts, kernel modules, the
//! move off the initramfs, cgroup2, machine config, hostname, network, then supervision of the
//! node's services until a shutdown request, then an orderly poweroff or reboot.

#![deny(unsafe_code)]

pub mod config;
pub mod dhcp;
pub mod log;
pub mod modules;
pub mod mounts;
pub mod network;
pub mod supervisor;
// The one module with `unsafe` (each block has a `// SAFETY:` comment).
#[allow(unsafe_code)]
pub mod sys;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use config::{MachineConfig, OnReady};
use supervisor::{ServiceSpec, Shutdown, Supervisor};

/// How PID 1 runs the node binary for its services. After the move to the tmpfs root the binary
/// is no longer on the root (it stays on the initramfs, which PID 1 itself runs from), and the
/// magic link still opens it, so nothing has to be copied.
pub const NODE_BIN: &str = "/proc/self/exe";

/// Where test programs appended to the initramfs live (kept across the move to the tmpfs root;
/// absent from production images).
pub const TEST_FILES: &str = "usr/lib/nodeos-test";

/// Runs PID 1. Never returns: the machine powers off or reboots at the end.
pub fn run_pid1() -> ! {
    // First of all, before any thread exists: PID 1's signals go to its signalfd only.
    let masked = supervisor::block_handled_signals();
    log::install("init", "info");
    if let Err(e) = masked {
        tracing::error!(error = %e, "cannot block signals");
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        boot_ms = sys::boot_ms(),
        "starting"
    );
    let action = match std::panic::catch_unwind(boot_and_supervise) {
        Ok(action) => action,
        Err(_) => {
            tracing::error!("init panicked; powering off to avoid a kernel panic");
            Shutdown::Poweroff
        }
    };
    finish(action)
}

fn boot_and_supervise() -> Shutdown {
    if let Err(e) = mounts::mount_early() {
        // Without /proc and /sys nothing else works; say why and halt.
        tracing::error!(error = %e, "early mounts failed; halting");
        return Shutdown::Poweroff;
    }
    // Ctrl-alt-del becomes SIGINT to PID 1 instead of an immediate reboot.
    if let Err(e) = nix::sys::reboot::set_cad_enabled(false) {
        tracing::warn!(error = %e, "cannot take over ctrl-alt-del");
    }
    let (report, _background) = modules::load(Path::new(modules::LOAD_LIST));
    tracing::info!(
        loaded = report.loaded,
        builtin_or_loaded = report.already,
        failed = report.failed,
        ms = report.millis as u64,
        boot_ms = sys::boot_ms(),
        "modules"
    );
    if mounts::root_is_initramfs() {
        match mounts::switch_to_tmpfs(&["etc", TEST_FILES]) {
            Ok(()) => tracing::info!(boot_ms = sys::boot_ms(), "root moved to tmpfs"),
            Err(e) => {
                tracing::error!(error = %e, "cannot move root to tmpfs; containers will not be able to pivot_root")
            }
        }
    }
    match mounts::mount_cgroup2() {
        Ok(ctl) => tracing::info!(subtree_control = %ctl, boot_ms = sys::boot_ms(), "cgroup2 mounted"),
        Err(e) => tracing::error!(error = %e, "cgroup2 setup failed"),
    }
    let cfg = load_config();
    let containers = Path::new(runtime::server::STATE_DIR).join("containers");
    let binds = [
        ("containers", containers.as_path()),
        ("logs", Path::new(agent::logs::PODS_LOG_ROOT)),
        ("pods", Path::new(agent::pods::PODS_ROOT)),
    ];
    for (what, root, size, binds) in [
        (
            "ephemeral storage",
            kcore::allocatable::EPHEMERAL_ROOT,
            &cfg.ephemeral_size,
            &binds[..],
        ),
        ("image storage", runtime::IMAGE_ROOT, &cfg.image_size, &[]),
    ] {
        match mounts::mount_sized(root, size, binds) {
            Ok(()) => tracing::info!(size = %size, root, "{what} mounted"),
            Err(e) => {
                tracing::error!(error = %e, root, "{what} not mounted; it is written to the root file system")
            }
        }
    }
    let configured = network::configure(&cfg);
    let hostname = network::choose_hostname(&cfg, &configured);
    match nix::unistd::sethostname(&hostname) {
        Ok(()) => tracing::info!(hostname = %hostname, boot_ms = sys::boot_ms(), "hostname set"),
        Err(e) => tracing::warn!(hostname = %hostname, error = %e, "cannot set hostname"),
    }
    let _ = std::fs::write("/etc/hostname", format!("{hostname}\n"));
    let _ = std::fs::write(
        "/etc/hosts",
        format!("127.0.0.1 localhost\n::1 localhost\n127.0.1.1 {hostname}\n"),
    );

    write_agent_config(&cfg, &hostname, &configured);
    let mut sup = match Supervisor::new() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the supervisor; halting");
            return Shutdown::Poweroff;
        }
    };
    let program = NODE_BIN.to_string();
    let service = |name: &str, oneshot| ServiceSpec {
        name: name.into(),
        program: program.clone(),
        args: vec![name.into()],
        oneshot,
        kill: None,
        pass_fds: Vec::new(),
        env: Vec::new(),
    };
    // Where the runtime parks its containers' pipes and terminals so they outlive its restarts
    // (runtime::server::fdstore): PID 1 holds both ends for the machine's life.
    let fd_store = runtime::server::fdstore::pair()
        .inspect_err(|e| tracing::error!(error = %e, "no fd store: container stdio will not survive a runtime restart"))
        .ok();
    let mut runtime_service = service("runtime", false);
    if let Some((a, b)) = &fd_store {
        runtime_service.pass_fds = vec![a.as_raw_fd(), b.as_raw_fd()];
        runtime_service.env = vec![(
            runtime::server::fdstore::ENV.into(),
            format!("{},{}", a.as_raw_fd(), b.as_raw_fd()),
        )];
    }
    let schedule = |k: config::KillDoc| supervisor::KillSchedule {
        after: Duration::from_secs(u64::from(k.after_seconds)),
        times: k.times,
    };
    runtime_service.kill = cfg.kill_runtime.map(schedule);
    sup.add(runtime_service);
    sup.add(ServiceSpec {
        kill: cfg.kill_agent.map(schedule),
        ..service("agent", false)
    });
    if cfg.crash_service {
        sup.add(service("crashtest", false));
    }
    if let Some((prog, args)) = cfg.test_command.split_first() {
        sup.add(ServiceSpec {
            name: "test".into(),
            program: prog.clone(),
            args: args.to_vec(),
            oneshot: true,
            kill: None,
            pass_fds: Vec::new(),
            env: Vec::new(),
        });
    }
    tracing::info!(
        boot_ms = sys::boot_ms(),
        power_buttons = sup.power_buttons(),
        "ready"
    );
    let immediate = match cfg.on_ready {
        OnReady::Run => None,
        OnReady::Poweroff => Some(Shutdown::Poweroff),
        OnReady::Reboot => Some(Shutdown::Reboot),
    };
    let action = sup.run(immediate);
    // Graceful node shutdown first: the agent stops the pods through the runtime, which keeps
    // running until the agent is done.
    let pods_grace = agent::settings::ShutdownGracePeriod::total(&cfg.node_shutdown);
    let agent_wait = Duration::from_secs(pods_grace) + AGENT_SHUTDOWN_SLACK;
    tracing::info!(grace_s = pods_grace, "node shutdown: the agent stops the pods");
    sup.stop_one("agent", agent::NODE_SHUTDOWN_SIGNAL, agent_wait);
    tracing::info!(action = ?action, grace_s = cfg.shutdown_grace_seconds, "stopping services");
    sup.stop_all(Duration::from_secs(u64::from(cfg.shutdown_grace_seconds)));
    action
}

/// What the agent gets beyond the pods' grace periods to report and exit at shutdown.
const AGENT_SHUTDOWN_SLACK: Duration = Duration::from_secs(10);

/// Writes the agent's settings ([`agent::settings::PATH`]).
fn write_agent_config(cfg: &MachineConfig, hostname: &str, configured: &[network::Configured]) {
    let settings = agent::settings::AgentSettings {
        node_name: hostname.to_string(),
        node_ip: configured.first().map(|c| c.address.to_string()),
        control_plane: cfg.control_plane.clone().map(|cp| agent::settings::ControlPlane {
            server: cp.server,
            ca_pem: cp.ca_pem,
            bootstrap_token: cp.bootstrap_token,
            kubelet_endpoint: cp.kubelet_endpoint.map(|e| e.to_string()),
        }),
        insecure_registries: cfg.insecure_registries.clone(),
        shutdown_grace_period_by_pod_priority: cfg.node_shutdown.clone(),
        eviction: cfg.eviction.clone(),
        image_gc: cfg.image_gc,
    };
    if let Err(e) = settings.write(Path::new(agent::settings::PATH)) {
        tracing::error!(error = %e, "cannot write the agent's settings");
    }
}

/// Reads the machine config; a bad config is reported and the safe default is used.
fn load_config() -> MachineConfig {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let fw_cfg = match config::read_fw_cfg(Path::new(config::FW_CFG_PATH)) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(error = %e, "machine config unreadable; using safe defaults");
            return MachineConfig::default();
        }
    };
    match config::load(fw_cfg.as_deref(), &cmdline) {
        Ok(Some(cfg)) => {
            tracing::info!(hostname = ?cfg.hostname, interfaces = cfg.interfaces.len(), on_ready = ?cfg.on_ready,
                boot_ms = sys::boot_ms(), "machine config loaded");
            cfg
        }
        Ok(None) => {
            tracing::info!("no machine config; using defaults (DHCP on every interface)");
            MachineConfig::default()
        }
        Err(e) => {
            tracing::error!(error = %e, "machine config rejected; using safe defaults (DHCP on every interface)");
            MachineConfig::default()
        }
    }
}

/// sync, unmount, sync, reboot(2). Never returns.
fn finish(action: Shutdown) -> ! {
    nix::unistd::sync();
    let n = mounts::unmount_all();
    nix::unistd::sync();
    tracing::info!(action = ?action, unmounted = n, "going down");
    let cmd = match action {
        Shutdown::Poweroff => nix::sys::reboot::RebootMode::RB_POWER_OFF,
        Shutdown::Reboot => nix::sys::reboot::RebootMode::RB_AUTOBOOT,
    };
    loop {
        let err = nix::sys::reboot::reboot(cmd);
        tracing::error!(error = ?err, "reboot(2) failed; retrying");
        std::thread::sleep(Duration::from_secs(5));
    }
}
