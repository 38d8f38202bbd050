//! The runtime process: the parent of every pause process and container on the node.
//!
//! **Fork safety.** libcontainer `clone3()`s the calling process and runs Rust code (allocation,
//! serde, tracing) in the children; done from a multithreaded process on musl it hung (a lock held
//! by another thread at clone time; docs/RUNTIME-NOTES.md P2). So containers are created here, in a
//! process of the node binary (`nodeos runtime`) that never starts a thread: one `poll(2)` loop
//! over the API socket, the containers' output pipes and a pidfd per process. Being the parent, it
//! also reaps every container and records exit codes, which libcontainer leaves to the caller.
//! Clients (the agent, the in-guest test suite) may be multithreaded; they only talk to the socket.
//!
//! **Restart safety.** Sandboxes, containers and exit codes are written to `<state>/…/state.json`
//! on every change. A client that restarts lists them again and finds everything that was running
//! still running. If the runtime process itself restarts, it reloads the records and re-attaches
//! to live processes through pidfds; their exit codes are then unknown (they were reparented to
//! PID 1) and their output pipes are gone, which is the known limit of having no per-container
//! shim.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::api::{
    ContainerConfig, ContainerStatus, Reply, Request, SandboxConfig, SandboxStatus, State, recv_some,
};
use crate::cgroups::{self, Qos, Tree};
use crate::image::store::ImageStore;
use crate::logs::{LogWriter, Stream};
use crate::net::{self, Cidr};
use crate::seccomp::{Profile, SeccompExecutor};
use crate::spec;

/// Written by init once the background kernel modules (bridge, veth, overlay, ...) are loaded.
pub const MODULES_DONE: &str = "/run/nodeos/modules.done";

/// Settings of the runtime process.
#[derive(Debug, Clone)]
pub struct Options {
    pub socket: PathBuf,
    /// Runtime state (tmpfs): sandboxes, containers, libcontainer's state root.
    pub state_dir: PathBuf,
    pub image_root: PathBuf,
    pub cgroup_root: PathBuf,
    pub log_max_size: u64,
    pub log_max_files: usize,
    /// The node's pod network (the bridge gets its first address).
    pub pod_cidr: Cidr,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            socket: PathBuf::from(crate::api::SOCKET),
            state_dir: PathBuf::from("/run/nodeos/runtime"),
            image_root: PathBuf::from(crate::IMAGE_ROOT),
            cgroup_root: PathBuf::from(cgroups::CGROUP_ROOT),
            log_max_size: crate::logs::DEFAULT_MAX_SIZE,
            log_max_files: crate::logs::DEFAULT_MAX_FILES,
            // The pod CIDR when the node is given none.
            pod_cidr: Cidr {
                addr: std::net::Ipv4Addr::new(10, 244, 0, 0),
                prefix: 24,
            },
        }
    }
}

/// Failures of one operation; they become `Reply::Error` with this text.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{what}: {detail}")]
    Container { what: String, detail: String },
    #[error(transparent)]
    Cgroup(#[from] cgroups::CgroupError),
    #[error(transparent)]
    Image(#[from] crate::image::store::StoreError),
    #[error("{what}: {source}")]
    Network { what: String, source: net::NetlinkError },
}

fn io_ctx(what: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

fn lc_err(what: impl Into<String>) -> impl FnOnce(libcontainer::error::LibcontainerError) -> RuntimeError {
    let what = what.into();
    // libcontainer's Display hides the cause (docs/RUNTIME-NOTES.md P4); Debug keeps the chain.
    move |e| RuntimeError::Container {
        what,
        detail: format!("{e:?}"),
    }
}

fn now() -> String {
    kcore::time::rfc3339(SystemTime::now())
}

/// 128 random bits as hex.
fn new_id() -> Result<String, RuntimeError> {
    let mut b = [0u8; 16];
    let mut f = fs::File::open("/dev/urandom").map_err(io_ctx("/dev/urandom"))?;
    io::Read::read_exact(&mut f, &mut b).map_err(io_ctx("/dev/urandom"))?;
    Ok(crate::image::registry::hex(&b))
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), RuntimeError> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec_pretty(v).map_err(|e| RuntimeError::Invalid(e.to_string()))?;
    fs::write(&tmp, bytes)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(io_ctx(path.display().to_string()))
}

/// What is persisted per sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SandboxRecord {
    status: SandboxStatus,
    config: SandboxConfig,
    /// Start time of the pause process (/proc/<pid>/stat field 22): tells it from a later
    /// process that reused its pid.
    #[serde(default)]
    start_time: Option<u64>,
}

/// What is persisted per container.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ContainerRecord {
    status: ContainerStatus,
    profile: Profile,
    /// Whether the overlay root is mounted at `<dir>/rootfs`.
    mounted: bool,
    /// Start time of the container process (see [`SandboxRecord::start_time`]).
    #[serde(default)]
    start_time: Option<u64>,
}

struct Sandbox {
    rec: SandboxRecord,
    dir: PathBuf,
    pidfd: Option<OwnedFd>,
}

struct Running {
    pidfd: OwnedFd,
    /// stdout and stderr read ends (None once closed).
    pipes: [Option<OwnedFd>; 2],
    log: Option<LogWriter>,
}

struct Ctr {
    rec: ContainerRecord,
    dir: PathBuf,
    run: Option<Running>,
    kill_at: Option<Instant>,
    /// Connections waiting for this container to exit (StopContainer).
    waiters: Vec<u64>,
}

struct ExecProc {
    pid: Pid,
    pidfd: Option<OwnedFd>,
    exit: Option<i32>,
    waiters: Vec<u64>,
}

/// The runtime's state and operations (the poll loop lives in [`serve`]).
pub struct Runtime {
    opts: Options,
    tree: Tree,
    images: ImageStore,
    youki_root: PathBuf,
    pause_root: PathBuf,
    sandboxes: BTreeMap<String, Sandbox>,
    containers: BTreeMap<String, Ctr>,
    execs: BTreeMap<String, ExecProc>,
    /// Deferred replies: (connection, reply).
    outbox: Vec<(u64, Reply)>,
    /// The pod bridge's interface index, once created.
    bridge: Option<u32>,
    /// The machine's memory (bytes), for Burstable oom_score_adj.
    node_memory: u64,
    /// Whether the pause root holds the node binary (prepared at the first sandbox).
    pause_ready: bool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("sandboxes", &self.sandboxes.len())
            .field("containers", &self.containers.len())
            .finish_non_exhaustive()
    }
}

/// The machine's CPUs (millicores) and memory (bytes), for the kubepods slice.
fn node_capacity() -> (u64, u64) {
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

fn exit_of(status: WaitStatus) -> Option<(i32, Option<i32>)> {
    match status {
        WaitStatus::Exited(_, code) => Some((code, None)),
        WaitStatus::Signaled(_, sig, _) => Some((128 + sig as i32, Some(sig as i32))),
        _ => None,
    }
}

impl Runtime {
    /// Prepares directories, the node's cgroup slices and the pause root, then reloads persisted
    /// sandboxes and containers.
    pub fn open(opts: Options) -> Result<Self, RuntimeError> {
        let youki_root = opts.state_dir.join("youki");
        let pause_root = opts.state_dir.join("pause-root");
        for d in [
            &youki_root,
            &opts.state_dir.join("sandboxes"),
            &opts.state_dir.join("containers"),
            &pause_root,
        ] {
            fs::create_dir_all(d).map_err(io_ctx(d.display().to_string()))?;
        }
        let tree = Tree::new(&opts.cgroup_root);
        let (cpu, mem) = node_capacity();
        tree.setup_node(cpu, mem)?;
        let images = ImageStore::open(
            &opts.image_root,
            crate::image::http::Client::new(b"").map_err(|e| RuntimeError::Invalid(e.to_string()))?,
            vec![],
        )?;
        let mut rt = Runtime {
            opts,
            tree,
            images,
            youki_root,
            pause_root,
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            execs: BTreeMap::new(),
            outbox: Vec::new(),
            bridge: None,
            node_memory: mem,
            pause_ready: false,
        };
        rt.reload();
        rt.update_burstable()?;
        Ok(rt)
    }

    fn reload(&mut self) {
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

    fn persist_sandbox(&self, id: &str) {
        if let Some(sb) = self.sandboxes.get(id)
            && let Err(e) = write_json(&sb.dir.join("state.json"), &sb.rec)
        {
            tracing::error!(sandbox = id, error = %e, "cannot persist sandbox state");
        }
    }

    fn persist_container(&self, id: &str) {
        if let Some(c) = self.containers.get(id)
            && let Err(e) = write_json(&c.dir.join("state.json"), &c.rec)
        {
            tracing::error!(container = id, error = %e, "cannot persist container state");
        }
    }

    /// The Burstable slice's weight follows the Burstable pods' CPU requests (NODE-39).
    fn update_burstable(&self) -> Result<(), RuntimeError> {
        let sum: u64 = self
            .sandboxes
            .values()
            .filter(|s| s.rec.status.qos == Qos::Burstable)
            .flat_map(|s| s.rec.config.containers.iter())
            .filter_map(cgroups::Resources::effective_cpu_request)
            .sum();
        Ok(self.tree.set_burstable_requests(sum)?)
    }

    /// Handles one request; `None` means the reply comes later (through the outbox).
    pub fn handle(&mut self, conn: u64, req: Request, fds: &mut Vec<OwnedFd>) -> Option<Reply> {
        let r = match req {
            Request::Version => Ok(Reply::Version {
                version: env!("CARGO_PKG_VERSION").into(),
            }),
            Request::RunSandbox { config } => {
                self.run_sandbox(config).map(|status| Reply::Sandbox { status })
            }
            Request::StopSandbox { id } => self.stop_sandbox(&id).map(|()| Reply::Ok),
            Request::RemoveSandbox { id } => self.remove_sandbox(&id).map(|()| Reply::Ok),
            Request::ListSandboxes => Ok(Reply::Sandboxes {
                items: self.sandboxes.values().map(|s| s.rec.status.clone()).collect(),
            }),
            Request::CreateContainer { sandbox_id, config } => self
                .create_container(&sandbox_id, config)
                .map(|status| Reply::Container { status }),
            Request::StartContainer { id } => self
                .start_container(&id)
                .map(|status| Reply::Container { status }),
            Request::StopContainer { id, timeout_seconds } => match self.stop_container(&id, timeout_seconds)
            {
                Ok(true) => {
                    if let Some(c) = self.containers.get_mut(&id) {
                        c.waiters.push(conn);
                    }
                    return None;
                }
                Ok(false) => self.status(&id).map(|status| Reply::Container { status }),
                Err(e) => Err(e),
            },
            Request::WaitContainer { id } => match self.containers.get_mut(&id) {
                None => Err(RuntimeError::NotFound(format!("container {id} not found"))),
                Some(c) if c.rec.status.state == State::Exited => Ok(Reply::Container {
                    status: c.rec.status.clone(),
                }),
                Some(c) => {
                    c.waiters.push(conn);
                    return None;
                }
            },
            Request::RemoveContainer { id } => self.remove_container(&id).map(|()| Reply::Ok),
            Request::ContainerStatus { id } => self.status(&id).map(|status| Reply::Container { status }),
            Request::ListContainers => Ok(Reply::Containers {
                items: self.containers.values().map(|c| c.rec.status.clone()).collect(),
            }),
            Request::Exec { id, command } => {
                if fds.len() < 3 {
                    Err(RuntimeError::Invalid(
                        "exec needs three file descriptors (stdin, stdout, stderr)".into(),
                    ))
                } else {
                    let stdio: Vec<OwnedFd> = fds.drain(..3).collect();
                    self.exec(&id, command, stdio)
                        .map(|exec_id| Reply::Exec { exec_id })
                }
            }
            Request::WaitExec { exec_id } => match self.execs.get_mut(&exec_id) {
                None => Err(RuntimeError::NotFound(format!("exec {exec_id} not found"))),
                Some(e) => match e.exit {
                    Some(code) => {
                        self.execs.remove(&exec_id);
                        Ok(Reply::ExecExit { exit_code: code })
                    }
                    None => {
                        e.waiters.push(conn);
                        return None;
                    }
                },
            },
        };
        Some(r.unwrap_or_else(|e| Reply::Error {
            message: e.to_string(),
        }))
    }

    fn run_sandbox(&mut self, config: SandboxConfig) -> Result<SandboxStatus, RuntimeError> {
        validate_sandbox(&config)?;
        let id = new_id()?;
        let dir = self.opts.state_dir.join("sandboxes").join(&id);
        let qos = cgroups::qos_class(&config.containers);
        let slice = cgroups::pod_slice(qos, &config.uid);
        let status = SandboxStatus {
            id: id.clone(),
            name: config.name.clone(),
            namespace: config.namespace.clone(),
            uid: config.uid.clone(),
            attempt: config.attempt,
            ready: false,
            pause_pid: None,
            ip: None,
            cgroup: slice.clone(),
            qos,
            created_at: now(),
        };
        let result = self.setup_sandbox(&id, &dir, &config, &slice);
        match result {
            Ok((pid, pidfd, ip)) => {
                let mut status = status;
                status.ready = true;
                status.pause_pid = Some(pid);
                status.ip = Some(ip.to_string());
                self.sandboxes.insert(
                    id.clone(),
                    Sandbox {
                        rec: SandboxRecord {
                            status: status.clone(),
                            config,
                            start_time: proc_start_time(pid),
                        },
                        dir,
                        pidfd: Some(pidfd),
                    },
                );
                self.persist_sandbox(&id);
                self.update_burstable()?;
                tracing::info!(sandbox = %id, pod = %status.name, pid, qos = ?qos, "sandbox running");
                Ok(status)
            }
            Err(e) => {
                self.teardown_sandbox_dir(&id, &dir, &slice);
                Err(e)
            }
        }
    }

    fn setup_sandbox(
        &mut self,
        id: &str,
        dir: &Path,
        config: &SandboxConfig,
        slice: &str,
    ) -> Result<(i32, OwnedFd, std::net::Ipv4Addr), RuntimeError> {
        let hostname = config.hostname.clone().unwrap_or_else(|| config.name.clone());
        let bundle = dir.join("bundle");
        fs::create_dir_all(&bundle).map_err(io_ctx(bundle.display().to_string()))?;
        let shm = dir.join("shm");
        fs::create_dir_all(&shm).map_err(io_ctx(shm.display().to_string()))?;
        mount(
            Some("shm"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=1777,size=65536k"),
        )
        .map_err(|e| RuntimeError::Io {
            what: format!("mounting {}", shm.display()),
            source: e.into(),
        })?;
        let mut hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_string();
        for l in &config.host_entries {
            hosts.push_str(l);
            hosts.push('\n');
        }
        let mut resolv = String::new();
        for s in &config.dns.servers {
            resolv.push_str(&format!("nameserver {s}\n"));
        }
        if !config.dns.searches.is_empty() {
            resolv.push_str(&format!("search {}\n", config.dns.searches.join(" ")));
        }
        if !config.dns.options.is_empty() {
            resolv.push_str(&format!("options {}\n", config.dns.options.join(" ")));
        }
        for (name, content) in [
            ("hosts", hosts),
            ("hostname", format!("{hostname}\n")),
            ("resolv.conf", resolv),
        ] {
            fs::write(dir.join(name), content).map_err(io_ctx(format!("writing {name}")))?;
        }
        self.tree
            .create_pod(slice, &cgroups::pod_slice_values(&config.containers))?;
        let mut spec = spec::sandbox(&hostname, &cgroups::container_scope(slice, id));
        // Prepared on first use, not at startup: no copy of the binary on nodes without pods,
        // and none competing with boot.
        if !self.pause_ready {
            prepare_pause_root(&self.pause_root)?;
            self.pause_ready = true;
        }
        spec["root"]["path"] = serde_json::json!(self.pause_root);
        fs::write(bundle.join("config.json"), spec.to_string())
            .map_err(io_ctx("writing the sandbox spec"))?;
        let devnull = || {
            fs::File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(io_ctx("/dev/null"))
        };
        let mut c = ContainerBuilder::new(id.to_string(), SyscallType::default())
            .with_root_path(&self.youki_root)
            .map_err(lc_err("sandbox state root"))?
            .with_stdin(devnull()?)
            .with_stdout(devnull()?)
            .with_stderr(devnull()?)
            .validate_id()
            .map_err(lc_err("sandbox id"))?
            .as_init(&bundle)
            .with_systemd(false)
            .with_detach(true)
            .build()
            .map_err(lc_err("creating the pause container"))?;
        let pid = c
            .pid()
            .map(|p| p.as_raw())
            .ok_or_else(|| RuntimeError::Invalid("pause container has no pid".into()))?;
        c.start().map_err(lc_err("starting the pause container"))?;
        let pidfd = crate::sys::pidfd_open(pid).map_err(io_ctx("pidfd of the pause process"))?;
        let bridge = self.ensure_bridge()?;
        let used: Vec<std::net::Ipv4Addr> = self
            .sandboxes
            .values()
            .filter_map(|s| s.rec.status.ip.as_deref()?.parse().ok())
            .collect();
        let ip =
            self.opts.pod_cidr.allocate(&used).ok_or_else(|| {
                RuntimeError::Invalid(format!("pod CIDR {} is exhausted", self.opts.pod_cidr))
            })?;
        net::attach(bridge, &self.opts.pod_cidr, id, pid, ip).map_err(|source| RuntimeError::Network {
            what: "pod network".into(),
            source,
        })?;
        Ok((pid, pidfd, ip))
    }

    /// The pod bridge, created on first use: its kernel module loads in the background after
    /// boot, so this waits (up to 30 s) for init's "modules done" marker first.
    fn ensure_bridge(&mut self) -> Result<u32, RuntimeError> {
        if let Some(b) = self.bridge {
            return Ok(b);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(MODULES_DONE).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = fs::write("/proc/sys/net/ipv4/ip_forward", "1");
        let cidr = self.opts.pod_cidr;
        let idx = net::Netlink::open()
            .and_then(|mut nl| nl.ensure_bridge(net::BRIDGE, cidr.gateway(), cidr.prefix))
            .map_err(|source| RuntimeError::Network {
                what: format!("pod bridge {}", net::BRIDGE),
                source,
            })?;
        tracing::info!(bridge = net::BRIDGE, cidr = %self.opts.pod_cidr, "pod network ready");
        self.bridge = Some(idx);
        Ok(idx)
    }

    /// Best-effort removal of everything a sandbox owns on the host.
    fn teardown_sandbox_dir(&mut self, id: &str, dir: &Path, slice: &str) {
        if let Err(e) = net::detach(id) {
            tracing::warn!(sandbox = id, error = %e, "veth not removed");
        }
        if let Ok(mut c) = Container::load(self.youki_root.join(id)) {
            let _ = c.delete(true);
        }
        let _ = umount2(&dir.join("shm"), MntFlags::MNT_DETACH);
        let _ = fs::remove_dir_all(dir);
        if let Err(e) = self.tree.remove_pod(slice) {
            tracing::warn!(sandbox = id, error = %e, "pod cgroup not removed");
        }
    }

    /// Ids of the containers of one sandbox.
    fn containers_of(&self, sandbox_id: &str) -> Vec<String> {
        self.containers
            .values()
            .filter(|c| c.rec.status.sandbox_id == sandbox_id)
            .map(|c| c.rec.status.id.clone())
            .collect()
    }

    fn stop_sandbox(&mut self, id: &str) -> Result<(), RuntimeError> {
        let sb = self
            .sandboxes
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("sandbox {id} not found")))?;
        // Only a pause process we still watch is signalled: once it exited and was reaped its pid
        // may belong to someone else.
        let pause = sb.rec.status.pause_pid.filter(|_| sb.pidfd.is_some());
        let ids = self.containers_of(id);
        for cid in ids {
            self.kill_and_reap(&cid);
        }
        if let Some(p) = pause {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(p), None);
        }
        if let Some(sb) = self.sandboxes.get_mut(id) {
            sb.rec.status.ready = false;
            sb.pidfd = None;
        }
        self.persist_sandbox(id);
        Ok(())
    }

    fn remove_sandbox(&mut self, id: &str) -> Result<(), RuntimeError> {
        self.stop_sandbox(id)?;
        let ids = self.containers_of(id);
        for cid in ids {
            self.remove_container(&cid)?;
        }
        if let Some(sb) = self.sandboxes.remove(id) {
            self.teardown_sandbox_dir(id, &sb.dir, &sb.rec.status.cgroup);
        }
        self.update_burstable()?;
        tracing::info!(sandbox = id, "sandbox removed");
        Ok(())
    }

    fn create_container(
        &mut self,
        sandbox_id: &str,
        config: ContainerConfig,
    ) -> Result<ContainerStatus, RuntimeError> {
        let sb = self
            .sandboxes
            .get(sandbox_id)
            .ok_or_else(|| RuntimeError::NotFound(format!("sandbox {sandbox_id} not found")))?;
        if !sb.rec.status.ready {
            return Err(RuntimeError::Invalid(format!(
                "sandbox {sandbox_id} is not ready"
            )));
        }
        validate_container(&config)?;
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
        let qos = sb.rec.status.qos;
        let mem_request = config.resources.effective_memory_request().unwrap_or(0);
        let oom = cgroups::oom_score_adj(qos, mem_request, self.node_memory, config.node_critical);
        let cgroup = cgroups::container_scope(&sb.rec.status.cgroup, &id);
        let paths = spec::SandboxPaths {
            pause_pid: sb.rec.status.pause_pid.unwrap_or(0),
            share_pid: sb.rec.config.share_process_namespace,
            hosts: sb.dir.join("hosts").display().to_string(),
            hostname: sb.dir.join("hostname").display().to_string(),
            resolv_conf: sb.dir.join("resolv.conf").display().to_string(),
            shm: sb.dir.join("shm").display().to_string(),
        };
        let mut status = ContainerStatus {
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
        let built = (|| -> Result<(i32, Running), RuntimeError> {
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
            .map_err(|e| RuntimeError::Io {
                what: "mounting the overlay root".into(),
                source: e.into(),
            })?;
            let user = resolve_user(&config, &image.config, &rootfs)?;
            let s = spec::container(&config, &image.config, &paths, &cgroup, oom, user);
            fs::write(dir.join("config.json"), s.to_string())
                .map_err(io_ctx("writing the container spec"))?;
            let (out_r, out_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
                    what: "pipe".into(),
                    source: e.into(),
                })?;
            let (err_r, err_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
                    what: "pipe".into(),
                    source: e.into(),
                })?;
            for r in [&out_r, &err_r] {
                nix::fcntl::fcntl(
                    r.as_raw_fd(),
                    nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                )
                .map_err(|e| RuntimeError::Io {
                    what: "pipe".into(),
                    source: e.into(),
                })?;
            }
            let stdin = fs::File::open("/dev/null").map_err(io_ctx("/dev/null"))?;
            let c = ContainerBuilder::new(id.clone(), SyscallType::default())
                .with_root_path(&self.youki_root)
                .map_err(lc_err("container state root"))?
                .with_executor(SeccompExecutor {
                    profile: config.seccomp,
                })
                .with_stdin(stdin)
                .with_stdout(out_w)
                .with_stderr(err_w)
                .validate_id()
                .map_err(lc_err("container id"))?
                .as_init(&dir)
                .with_systemd(false)
                .with_detach(true)
                .build()
                .map_err(lc_err(format!("creating container {}", config.name)))?;
            let pid = c
                .pid()
                .map(|p| p.as_raw())
                .ok_or_else(|| RuntimeError::Invalid("container has no pid".into()))?;
            let pidfd = crate::sys::pidfd_open(pid).map_err(io_ctx("pidfd of the container"))?;
            let log = match &log_path {
                Some(p) => Some(
                    LogWriter::open(
                        p,
                        config.log_max_size.unwrap_or(self.opts.log_max_size),
                        config.log_max_files.unwrap_or(self.opts.log_max_files),
                    )
                    .map_err(io_ctx(format!("log {}", p.display())))?,
                ),
                None => None,
            };
            Ok((
                pid,
                Running {
                    pidfd,
                    pipes: [Some(out_r), Some(err_r)],
                    log,
                },
            ))
        })();
        match built {
            Ok((pid, run)) => {
                status.pid = Some(pid);
                let c = Ctr {
                    rec: ContainerRecord {
                        status: status.clone(),
                        profile: config.seccomp,
                        mounted: true,
                        start_time: proc_start_time(pid),
                    },
                    dir,
                    run: Some(run),
                    kill_at: None,
                    waiters: Vec::new(),
                };
                self.containers.insert(id.clone(), c);
                self.persist_container(&id);
                tracing::info!(container = %id, name = %status.name, pid, "container created");
                Ok(status)
            }
            Err(e) => {
                if let Ok(mut c) = Container::load(self.youki_root.join(&id)) {
                    let _ = c.delete(true);
                }
                let _ = umount2(&rootfs, MntFlags::MNT_DETACH);
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn start_container(&mut self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let c = self
            .containers
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))?;
        if c.rec.status.state != State::Created {
            return Err(RuntimeError::Invalid(format!(
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
    fn stop_container(&mut self, id: &str, timeout_seconds: u64) -> Result<bool, RuntimeError> {
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
    fn kill_and_reap(&mut self, id: &str) {
        let Some(c) = self.containers.get(id) else { return };
        if let (Some(pid), Some(_)) = (c.rec.status.pid, c.run.as_ref()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let status = match waitpid(Pid::from_raw(pid), None) {
                Ok(s) => exit_of(s),
                Err(_) => None,
            };
            self.on_exit(id, status);
        }
    }

    fn remove_container(&mut self, id: &str) -> Result<(), RuntimeError> {
        if !self.containers.contains_key(id) {
            return Err(RuntimeError::NotFound(format!("container {id} not found")));
        }
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
                Err(e) => {
                    return Err(RuntimeError::Io {
                        what: "unmounting the container root".into(),
                        source: e.into(),
                    });
                }
            }
        }
        fs::remove_dir_all(&c.dir).map_err(io_ctx(format!("removing {}", c.dir.display())))?;
        let _ = fs::remove_dir(self.tree.path(&c.rec.status.cgroup));
        for conn in c.waiters {
            self.outbox.push((
                conn,
                Reply::Error {
                    message: format!("container {id} was removed"),
                },
            ));
        }
        tracing::info!(container = id, "container removed");
        Ok(())
    }

    fn status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.containers
            .get(id)
            .map(|c| c.rec.status.clone())
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))
    }

    fn exec(
        &mut self,
        id: &str,
        command: Vec<String>,
        mut stdio: Vec<OwnedFd>,
    ) -> Result<String, RuntimeError> {
        let c = self
            .containers
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id} not found")))?;
        if c.rec.status.state != State::Running {
            return Err(RuntimeError::Invalid(format!("container {id} is not running")));
        }
        if command.is_empty() {
            return Err(RuntimeError::Invalid("exec needs a command".into()));
        }
        let exec_id = new_id()?;
        let (err, out, inp) = (stdio.pop(), stdio.pop(), stdio.pop());
        let (Some(inp), Some(out), Some(err)) = (inp, out, err) else {
            return Err(RuntimeError::Invalid("exec needs three file descriptors".into()));
        };
        let pid = ContainerBuilder::new(id.to_string(), SyscallType::default())
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
            .map_err(lc_err(format!("exec in container {id}")))?;
        let pidfd = crate::sys::pidfd_open(pid.as_raw()).map_err(io_ctx("pidfd of the exec"))?;
        self.execs.insert(
            exec_id.clone(),
            ExecProc {
                pid,
                pidfd: Some(pidfd),
                exit: None,
                waiters: Vec::new(),
            },
        );
        Ok(exec_id)
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
    }

    /// SIGKILL for containers whose stop grace period ran out; the next deadline.
    fn deadlines(&mut self) -> Option<Duration> {
        let now = Instant::now();
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

    fn on_pidfd(&mut self, src: &Source) {
        match src {
            Source::Container(id) => {
                let Some(pid) = self.containers.get(id).and_then(|c| c.rec.status.pid) else {
                    return;
                };
                let status = match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => return,
                    Ok(s) => exit_of(s),
                    Err(_) => None,
                };
                self.on_exit(id, status);
            }
            Source::Exec(id) => {
                let Some(e) = self.execs.get_mut(id) else { return };
                let code = match waitpid(e.pid, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => return,
                    Ok(s) => exit_of(s).map_or(255, |x| x.0),
                    Err(_) => 255,
                };
                e.exit = Some(code);
                e.pidfd = None;
                let waiters = std::mem::take(&mut e.waiters);
                if !waiters.is_empty() {
                    self.execs.remove(id);
                }
                for conn in waiters {
                    self.outbox.push((conn, Reply::ExecExit { exit_code: code }));
                }
            }
            Source::Pause(id) => {
                let Some(sb) = self.sandboxes.get_mut(id) else {
                    return;
                };
                if let Some(p) = sb.rec.status.pause_pid {
                    let _ = waitpid(Pid::from_raw(p), Some(WaitPidFlag::WNOHANG));
                }
                sb.pidfd = None;
                sb.rec.status.ready = false;
                tracing::warn!(sandbox = %id, "pause process exited; sandbox lost");
                self.persist_sandbox(id);
            }
            Source::Pipe(..) | Source::Listener | Source::Conn(_) => {}
        }
    }

    fn on_pipe(&mut self, id: &str, idx: usize) {
        let Some(run) = self.containers.get_mut(id).and_then(|c| c.run.as_mut()) else {
            return;
        };
        if !read_pipe(run, idx) {
            run.pipes[idx] = None;
        }
    }
}

/// A DNS-1123 label (container names; Kubernetes validates them the same way).
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A relative path of plain components (no `..`, not absolute).
fn is_plain_relative(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Request fields end up in paths (cgroups, logs, state): anything that could leave its
/// directory is refused before anything is created.
fn validate_sandbox(c: &SandboxConfig) -> Result<(), RuntimeError> {
    let bad = |m: String| Err(RuntimeError::Invalid(m));
    if c.name.is_empty() || c.name.len() > 253 || c.name.contains(['/', '\0']) {
        return bad(format!("invalid sandbox name {:?}", c.name));
    }
    if c.uid.is_empty() || c.uid.len() > 64 || !c.uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return bad(format!(
            "invalid pod uid {:?}: letters, digits and '-' only",
            c.uid
        ));
    }
    if let Some(h) = &c.hostname
        && (h.is_empty() || h.len() > 63 || h.contains(['/', '\0', ' ']))
    {
        return bad(format!("invalid hostname {h:?}"));
    }
    if c.log_directory
        .as_ref()
        .is_some_and(|d| !d.is_absolute() || d.components().any(|x| x == std::path::Component::ParentDir))
    {
        return bad("the log directory must be an absolute path without '..'".into());
    }
    Ok(())
}

fn validate_container(c: &ContainerConfig) -> Result<(), RuntimeError> {
    let bad = |m: String| Err(RuntimeError::Invalid(m));
    if !is_dns_label(&c.name) {
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

/// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
fn proc_start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: count from the last ')'.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A pidfd for a recorded process, if that process (same pid, same start time) still runs.
fn reattach(pid: i32, start_time: Option<u64>) -> Option<OwnedFd> {
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
            Err(Errno::EAGAIN) => return true,
            Err(Errno::EINTR) => {}
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

/// The pause root: an empty read-only tree whose `/pause` is a copy of the node binary.
///
/// A copy because the binary is not on the root file system: PID 1 runs it from the initramfs,
/// whose files are deleted after the move to the tmpfs root, and the kernel refuses to
/// bind-mount a deleted file (`/proc/self/exe`: ENOENT, seen in the VM). The copy costs the
/// binary's size in tmpfs memory once per boot; every pause process shares its pages.
fn prepare_pause_root(root: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    for d in ["proc", "dev"] {
        fs::create_dir_all(root.join(d)).map_err(io_ctx(format!("pause root {d}")))?;
    }
    let target = root.join("pause");
    let size = fs::metadata("/proc/self/exe")
        .map(|m| m.len())
        .map_err(io_ctx("/proc/self/exe"))?;
    if fs::metadata(&target).map(|m| m.len()).ok() == Some(size) {
        return Ok(());
    }
    let tmp = root.join(".pause.tmp");
    fs::copy("/proc/self/exe", &tmp).map_err(io_ctx("copying the node binary as /pause"))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o555)).map_err(io_ctx("pause permissions"))?;
    fs::rename(&tmp, &target).map_err(io_ctx("pause root"))
}

/// What a polled descriptor belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Listener,
    Conn(u64),
    Pipe(String, usize),
    Container(String),
    Exec(String),
    Pause(String),
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
}

fn send_reply(conns: &mut BTreeMap<u64, Conn>, id: u64, reply: &Reply) {
    let Some(c) = conns.get_mut(&id) else { return };
    let mut line = serde_json::to_vec(reply)
        .unwrap_or_else(|_| b"{\"result\":\"error\",\"message\":\"encoding\"}".to_vec());
    line.push(b'\n');
    if c.stream.write_all(&line).is_err() {
        conns.remove(&id);
    }
}

/// Runs the runtime until the process is killed.
pub fn serve(opts: Options) -> Result<(), RuntimeError> {
    let socket = opts.socket.clone();
    let mut rt = Runtime::open(opts)?;
    if let Some(dir) = socket.parent() {
        fs::create_dir_all(dir).map_err(io_ctx(dir.display().to_string()))?;
    }
    let _ = fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).map_err(io_ctx(format!("listening on {}", socket.display())))?;
    listener.set_nonblocking(true).map_err(io_ctx("listener"))?;
    tracing::info!(socket = %socket.display(), "runtime ready");
    let mut conns: BTreeMap<u64, Conn> = BTreeMap::new();
    let mut next_conn = 0u64;
    loop {
        let timeout = rt.deadlines();
        let mut srcs: Vec<Source> = vec![Source::Listener];
        let mut borrowed: Vec<BorrowedFd<'_>> = vec![listener.as_fd()];
        for (id, c) in &conns {
            srcs.push(Source::Conn(*id));
            borrowed.push(c.stream.as_fd());
        }
        for (id, c) in &rt.containers {
            if let Some(run) = &c.run {
                srcs.push(Source::Container(id.clone()));
                borrowed.push(run.pidfd.as_fd());
                for (i, p) in run.pipes.iter().enumerate() {
                    if let Some(p) = p {
                        srcs.push(Source::Pipe(id.clone(), i));
                        borrowed.push(p.as_fd());
                    }
                }
            }
        }
        for (id, e) in &rt.execs {
            if let Some(p) = &e.pidfd {
                srcs.push(Source::Exec(id.clone()));
                borrowed.push(p.as_fd());
            }
        }
        for (id, s) in &rt.sandboxes {
            if let Some(p) = &s.pidfd {
                srcs.push(Source::Pause(id.clone()));
                borrowed.push(p.as_fd());
            }
        }
        let mut fds: Vec<PollFd<'_>> = borrowed
            .iter()
            .map(|b| PollFd::new(*b, PollFlags::POLLIN))
            .collect();
        let t = match timeout {
            Some(d) => {
                PollTimeout::try_from(d.as_millis().min(60_000) as i32 + 1).unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        match poll(&mut fds, t) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                tracing::error!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let ready: Vec<Source> = fds
            .iter()
            .zip(&srcs)
            .filter(|(f, _)| f.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, s)| s.clone())
            .collect();
        drop(fds);
        drop(borrowed);
        // Output first, so an exit drains everything the process wrote.
        for src in ready.iter().filter(|s| matches!(s, Source::Pipe(..))) {
            if let Source::Pipe(id, i) = src {
                rt.on_pipe(id, *i);
            }
        }
        for src in &ready {
            match src {
                Source::Listener => {
                    while let Ok((stream, _)) = listener.accept() {
                        // A client that stops reading its replies must not stall the runtime:
                        // a reply that cannot be written in 5 s drops the connection.
                        if stream.set_write_timeout(Some(Duration::from_secs(5))).is_err() {
                            continue;
                        }
                        next_conn += 1;
                        conns.insert(
                            next_conn,
                            Conn {
                                stream,
                                buf: Vec::new(),
                                fds: Vec::new(),
                            },
                        );
                    }
                }
                Source::Conn(id) => {
                    let Some(c) = conns.get_mut(id) else { continue };
                    let n = recv_some(c.stream.as_raw_fd(), &mut c.buf, &mut c.fds).unwrap_or(0);
                    if n == 0 {
                        conns.remove(id);
                        continue;
                    }
                    while let Some(c) = conns.get_mut(id)
                        && let Some(nl) = c.buf.iter().position(|b| *b == b'\n')
                    {
                        let line: Vec<u8> = c.buf.drain(..=nl).collect();
                        let mut fds = std::mem::take(&mut c.fds);
                        let reply = match serde_json::from_slice::<Request>(&line) {
                            Ok(req) => rt.handle(*id, req, &mut fds),
                            Err(e) => Some(Reply::Error {
                                message: format!("bad request: {e}"),
                            }),
                        };
                        if let Some(c) = conns.get_mut(id) {
                            c.fds = fds;
                        }
                        if let Some(r) = reply {
                            send_reply(&mut conns, *id, &r);
                        }
                    }
                }
                Source::Pipe(..) => {}
                other => rt.on_pidfd(other),
            }
        }
        for (conn, reply) in std::mem::take(&mut rt.outbox) {
            send_reply(&mut conns, conn, &reply);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_that_would_leave_their_directories_are_refused() {
        let sb = SandboxConfig {
            name: "p".into(),
            uid: "0000-aa".into(),
            ..Default::default()
        };
        assert!(validate_sandbox(&sb).is_ok());
        for uid in ["", "../../x", "a/b", "a b"] {
            let e = validate_sandbox(&SandboxConfig {
                uid: uid.into(),
                ..sb.clone()
            })
            .expect_err(uid);
            assert!(e.to_string().contains("invalid pod uid"), "{e}");
        }
        let rel = SandboxConfig {
            log_directory: Some("logs".into()),
            ..sb.clone()
        };
        assert!(validate_sandbox(&rel).is_err());
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
        let mount = |h: &str, d: &str| crate::api::Mount {
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
}
