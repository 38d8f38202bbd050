//! The runtime process: the parent of every pause process and container on the node.
//!
//! **Fork safety.** libcontainer `clone3()`s the calling process and runs Rust code (allocation,
//! serde, tracing) in the children; done from a multithreaded process on musl it hung (a lock held
//! by another thread at clone time; docs/RUNTIME-NOTES.md P2). So containers are created here, in a
//! process of the node binary (`nodeos runtime`) that never starts a thread: one `poll(2)` loop
//! over the API socket, the containers' output pipes and a pidfd per process. Being the parent, it
//! also reaps every container and records exit codes, which libcontainer leaves to the caller.
//! Long work (image pulls, container builds: [`build`]) runs in forked children, never in a
//! thread. Clients (the agent, the in-guest test suite) may be multithreaded; they only talk to
//! the socket.
//!
//! **Restart safety.** Sandboxes, containers and exit codes are written to `<state>/…/state.json`
//! on every change. A client that restarts lists them again and finds everything that was running
//! still running. If the runtime process itself restarts, it reloads the records and re-attaches
//! to live processes through pidfds; PID 1, their parent from then on, records their exits for
//! it ([`orphans`]). Their output pipes, stdin pipes and terminals survive: a copy of each is
//! parked in a socket queue PID 1 keeps open ([`fdstore`]) and taken back at the restart.
//!
//! One operation family per file: [`state`] (records, persistence, re-adoption), [`sandbox`],
//! [`container`], [`exec`], [`images`], [`stats`], [`errors`]; [`build`] runs builds in helpers;
//! [`serve`] is the loop.

mod build;
mod container;
mod errors;
mod exec;
pub mod fdstore;
mod images;
pub mod orphans;
mod sandbox;
mod serve;
mod state;
mod stats;

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use runtime_api::{Reply, Request};

pub use errors::{RuntimeError, store_error_kind};
pub use serve::serve;

use crate::cgroups::{self, Tree};
use crate::image::store::ImageStore;
use crate::net::Cidr;

/// Written by init once the background kernel modules (bridge, veth, overlay, ...) are loaded.
pub const MODULES_DONE: &str = "/run/nodeos/modules.done";

/// Where the runtime keeps its records and its containers' directories (`containers/<id>`:
/// writable layer, rootfs mount point); init mounts the node's ephemeral storage below it.
pub const STATE_DIR: &str = "/run/nodeos/runtime";

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
    /// Where PID 1 records the exits of re-adopted processes ([`orphans::PATH`]).
    pub orphan_exits: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            socket: PathBuf::from(runtime_api::SOCKET),
            state_dir: PathBuf::from(STATE_DIR),
            image_root: PathBuf::from(crate::IMAGE_ROOT),
            cgroup_root: PathBuf::from(cgroups::CGROUP_ROOT),
            log_max_size: crate::logs::DEFAULT_MAX_SIZE,
            log_max_files: crate::logs::DEFAULT_MAX_FILES,
            // The pod CIDR when the node is given none.
            pod_cidr: Cidr {
                addr: std::net::Ipv4Addr::new(10, 244, 0, 0),
                prefix: 24,
            },
            orphan_exits: PathBuf::from(orphans::PATH),
        }
    }
}

/// Where the pod CIDR set by the agent is kept for the runtime's next start (under the state
/// dir).
const POD_CIDR_FILE: &str = "pod-cidr";

/// The runtime's state and operations (the poll loop lives in [`serve`]).
pub struct Runtime {
    opts: Options,
    tree: Tree,
    /// The node's images, read here; pulls write them from child processes.
    images: ImageStore,
    youki_root: PathBuf,
    pause_root: PathBuf,
    sandboxes: BTreeMap<String, state::Sandbox>,
    containers: BTreeMap<String, state::Ctr>,
    execs: BTreeMap<String, exec::ExecProc>,
    /// Pulls in progress, by normalised reference.
    pulls: BTreeMap<String, images::Pull>,
    /// Sandbox and container builds in progress in helper children, by token.
    builds: BTreeMap<u64, build::Build>,
    next_build: u64,
    /// The last CPU reading per cgroup, for usage rates.
    cpu_samples: BTreeMap<String, stats::CpuSample>,
    /// Deferred replies: (connection, reply).
    outbox: Vec<(u64, Reply)>,
    /// Descriptors that go with the reply `handle` just returned (SCM_RIGHTS).
    pub(crate) reply_fds: Vec<OwnedFd>,
    /// The pod bridge's interface index, once created.
    bridge: Option<u32>,
    /// The host ports the kernel forwards, as last synced (None: not known to this process).
    host_ports: Option<Vec<crate::net::nft::HostPort>>,
    /// Whether the pause root holds the node binary (prepared at the first sandbox).
    pause_ready: bool,
    /// Whether children the runtime does not track may be left to reap (see
    /// `exec::reap_strays`).
    strays: bool,
    /// Where containers' stdio is parked across restarts (None: not handed one by PID 1).
    fd_store: Option<fdstore::FdStore>,
    /// Parked descriptors that must go (a container ended, a `stdinOnce` input was taken).
    fd_store_stale: bool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("sandboxes", &self.sandboxes.len())
            .field("containers", &self.containers.len())
            .field("pulls", &self.pulls.len())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Prepares directories, the node's cgroup slices and the pause root, then reloads persisted
    /// sandboxes and containers.
    pub fn open(opts: Options, fd_store: Option<fdstore::FdStore>) -> Result<Self, RuntimeError> {
        let youki_root = opts.state_dir.join("youki");
        let pause_root = opts.state_dir.join("pause-root");
        for d in [
            &youki_root,
            &opts.state_dir.join("sandboxes"),
            &opts.state_dir.join("containers"),
            &pause_root,
        ] {
            fs::create_dir_all(d).map_err(errors::io_ctx(d.display().to_string()))?;
        }
        let mut opts = opts;
        // The pod CIDR the agent gave an earlier run of this process (kept in the tmpfs state).
        if let Some(cidr) = fs::read_to_string(opts.state_dir.join(POD_CIDR_FILE))
            .ok()
            .and_then(|s| crate::net::Cidr::parse(s.trim()))
        {
            opts.pod_cidr = cidr;
        }
        let tree = Tree::new(&opts.cgroup_root);
        let (cpu, mem) = state::node_capacity();
        let pid_max = fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(32_768);
        tree.setup_node(
            cpu,
            kcore::allocatable::kubepods_memory_max(mem),
            kcore::allocatable::kubepods_pids_max(pid_max),
        )?;
        // Only reads here: the pull children open the store with the registries' trust.
        let no_network = crate::image::http::Client::new(b"").map_err(|e| RuntimeError::Io {
            what: "registry client".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let images = ImageStore::open(&opts.image_root, no_network, vec![])?;
        let mut rt = Runtime {
            opts,
            tree,
            images,
            youki_root,
            pause_root,
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            execs: BTreeMap::new(),
            pulls: BTreeMap::new(),
            builds: BTreeMap::new(),
            next_build: 0,
            cpu_samples: BTreeMap::new(),
            outbox: Vec::new(),
            reply_fds: Vec::new(),
            strays: false,
            bridge: None,
            host_ports: None,
            pause_ready: false,
            fd_store,
            fd_store_stale: false,
        };
        rt.reload();
        rt.update_burstable()?;
        // Re-stated: the rules outlive the process, but the records are what counts.
        if !rt.wanted_host_ports().is_empty()
            && let Err(e) = rt.sync_host_ports()
        {
            tracing::warn!(error = %e, "host ports not forwarded");
        }
        Ok(rt)
    }

    /// Handles one request from connection `conn` (with the fds sent along); `None` means the
    /// reply comes later, through the outbox.
    pub fn handle(&mut self, conn: u64, req: Request, fds: &mut Vec<OwnedFd>) -> Option<Reply> {
        let r = match req {
            Request::Version => Ok(Reply::Version {
                version: env!("CARGO_PKG_VERSION").into(),
            }),
            Request::RunSandbox { config } => match self.run_sandbox(conn, config) {
                Ok(()) => return None,
                Err(e) => Err(e),
            },
            Request::StopSandbox { id } => self.stop_sandbox(&id).map(|()| Reply::Ok),
            Request::RemoveSandbox { id } => self.remove_sandbox(&id).map(|()| Reply::Ok),
            Request::ListSandboxes => Ok(Reply::Sandboxes {
                items: self.sandboxes.values().map(|s| s.rec.status.clone()).collect(),
            }),
            Request::CreateContainer { sandbox_id, config } => {
                match self.create_container(conn, &sandbox_id, config) {
                    Ok(()) => return None,
                    Err(e) => Err(e),
                }
            }
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
                Some(c) if c.rec.status.state == runtime_api::State::Exited => Ok(Reply::Container {
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
            Request::WaitExec { exec_id } => match self.wait_exec(conn, &exec_id) {
                Ok(Some(exit_code)) => Ok(Reply::ExecExit { exit_code }),
                Ok(None) => return None,
                Err(e) => Err(e),
            },
            Request::ExecSync {
                id,
                command,
                timeout_seconds,
            } => match self.exec_sync(conn, &id, command, timeout_seconds) {
                Ok(()) => return None,
                Err(e) => Err(e),
            },
            Request::PullImage {
                image,
                policy,
                auth,
                insecure_registries,
            } => match self.pull_image(conn, &image, policy, auth, insecure_registries) {
                Ok(Some(reply)) => Ok(reply),
                Ok(None) => return None,
                Err(e) => Err(e),
            },
            Request::ImageStatus { image } => self
                .image_status(&image)
                .map(|image| Reply::ImageStatus { image }),
            Request::ListImages => self.list_images().map(|items| Reply::Images { items }),
            Request::RemoveImage { image } => self.remove_image(&image).map(|()| Reply::Ok),
            Request::ContainerStats { id } => self
                .container_stats(&id, false)
                .map(|stats| Reply::ContainerStats { stats }),
            Request::PodStats { sandbox_id, disk } => self
                .pod_stats(&sandbox_id, disk)
                .map(|stats| Reply::PodStats { stats }),
            Request::ListPodStats => Ok(Reply::PodStatsList {
                items: self.list_pod_stats(),
            }),
            Request::UpdateRuntimeConfig { pod_cidr } => self.set_pod_cidr(&pod_cidr).map(|()| Reply::Ok),
            Request::PortForward { sandbox_id, port } => self.port_forward(&sandbox_id, port).map(|socket| {
                self.reply_fds.push(socket);
                Reply::PortForward
            }),
            Request::Attach { id } => self.attach(&id).map(|(tty, input)| {
                let given = input.is_some();
                self.reply_fds.extend(input);
                Reply::Attach { tty, input: given }
            }),
        };
        Some(r.unwrap_or_else(|e| Reply::Error(e.to_reply())))
    }
}

/// A runtime over scratch directories (its cgroup "tree" is plain files), for unit tests.
#[cfg(test)]
fn test_runtime(dir: &std::path::Path) -> Runtime {
    fs::create_dir_all(dir.join("cgroup")).expect("cgroup root");
    Runtime::open(
        Options {
            socket: dir.join("runtime.sock"),
            state_dir: dir.join("state"),
            image_root: dir.join("images"),
            cgroup_root: dir.join("cgroup"),
            ..Options::default()
        },
        None,
    )
    .expect("runtime over scratch directories")
}
