//! Sandboxes: the pause process holding a pod's namespaces, its cgroup slice (values as the agent
//! gave them), its `/etc` files, its address on the pod bridge.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use runtime_api::{SandboxConfig, SandboxStatus};

use super::build::Then;
use super::errors::{RuntimeError, errno_ctx, io_ctx, lc_err};
use super::state::{Sandbox, SandboxRecord, new_id, now, proc_start_time};
use super::{MODULES_DONE, Runtime};
use crate::cgroups;
use crate::net;
use crate::spec;

impl Runtime {
    /// `RunSandbox`: prepares the sandbox and starts its build (see `build`); the reply comes
    /// when the build ends ([`Runtime::finish_sandbox`]).
    pub(super) fn run_sandbox(&mut self, conn: u64, config: SandboxConfig) -> Result<(), RuntimeError> {
        validate_sandbox(&config)?;
        let id = new_id()?;
        let dir = self.opts.state_dir.join("sandboxes").join(&id);
        let qos = config.resources.qos;
        let slice = cgroups::pod_slice(qos, &config.uid);
        // The address is chosen before /etc/hosts is written, which names it.
        let ip = if config.host.network {
            None
        } else {
            let used: Vec<std::net::Ipv4Addr> = self
                .sandboxes
                .values()
                .filter_map(|s| s.rec.status.ip.as_deref()?.parse().ok())
                .chain(self.builds.values().filter_map(|b| match &b.then {
                    Then::Sandbox(p) => p.ip,
                    Then::Container(_) => None,
                }))
                .collect();
            Some(self.opts.pod_cidr.allocate(&used).ok_or_else(|| {
                RuntimeError::Exhausted(format!("pod CIDR {} is exhausted", self.opts.pod_cidr))
            })?)
        };
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
        let started = self
            .prepare_sandbox(&id, &dir, &config, &slice, ip)
            .and_then(|(bundle, net)| {
                let youki_root = self.youki_root.clone();
                let pending = PendingSandbox {
                    id: id.clone(),
                    dir: dir.clone(),
                    config,
                    slice: slice.clone(),
                    status,
                    ip,
                };
                let id = id.clone();
                self.start_build(conn, Then::Sandbox(Box::new(pending)), move || {
                    build_sandbox(&youki_root, &id, &bundle, net)
                })
            });
        if started.is_err() {
            self.teardown_sandbox_dir(&id, &dir, &slice, ip.is_none());
        }
        started
    }

    /// Completes a sandbox once its build helper ended with `built` (the pause process's pid).
    pub(super) fn finish_sandbox(
        &mut self,
        p: PendingSandbox,
        built: Result<i32, RuntimeError>,
    ) -> Result<SandboxStatus, RuntimeError> {
        let PendingSandbox {
            id,
            dir,
            config,
            slice,
            mut status,
            ip,
        } = p;
        let built = built.and_then(|pid| {
            let pidfd = crate::sys::pidfd_open(pid).map_err(io_ctx("pidfd of the pause process"))?;
            Ok((pid, pidfd))
        });
        let (pid, pidfd) = match built {
            Ok(b) => b,
            Err(e) => {
                // libcontainer may have left a process of the failed create behind.
                self.strays = true;
                self.teardown_sandbox_dir(&id, &dir, &slice, config.host.network);
                return Err(e);
            }
        };
        status.ready = true;
        status.pause_pid = Some(pid);
        status.ip = ip.map(|ip| ip.to_string());
        let qos = status.qos;
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
        // As CNI's portmap plugin fails the sandbox when its rules cannot be added.
        if let Err(e) = self.sync_host_ports() {
            let _ = self.remove_sandbox(&id);
            return Err(e);
        }
        tracing::info!(sandbox = %id, pod = %status.name, pid, qos = ?qos, "sandbox running");
        Ok(status)
    }

    /// Everything of a sandbox the build needs, made by the runtime: its directory, `/dev/shm`,
    /// `/etc` files, cgroup slice, spec and (off the node's network) the pod bridge. Returns the
    /// bundle and what the helper wires up: the bridge, the pod network and the address.
    fn prepare_sandbox(
        &mut self,
        id: &str,
        dir: &Path,
        config: &SandboxConfig,
        slice: &str,
        ip: Option<std::net::Ipv4Addr>,
    ) -> Result<(PathBuf, Option<PodNet>), RuntimeError> {
        // On the node's network the pod has the node's UTS namespace, so its name.
        let hostname = if config.host.network {
            nix::unistd::gethostname()
                .map_err(errno_ctx("the node's hostname"))?
                .to_string_lossy()
                .into_owned()
        } else {
            kernel_hostname(config)
        };
        let node_hosts = config
            .host
            .network
            .then(|| fs::read_to_string("/etc/hosts").unwrap_or_else(|_| LOCALHOST.to_string()));
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
        .map_err(errno_ctx(format!("mounting {}", shm.display())))?;
        for (name, content) in etc_files(config, &hostname, ip, node_hosts.as_deref()) {
            fs::write(dir.join(name), content).map_err(io_ctx(format!("writing {name}")))?;
        }
        self.tree
            .create_pod(slice, &cgroups::pod_slice_values(&config.resources))?;
        let scope = cgroups::container_scope(slice, id);
        self.tree.create_scope(&scope)?;
        let mut spec = spec::sandbox(&hostname, &scope, config.host);
        // Prepared on first use, not at startup: nothing written on nodes without pods.
        if !self.pause_ready {
            prepare_pause_root(&self.pause_root)?;
            self.pause_ready = true;
        }
        spec["root"]["path"] = serde_json::json!(self.pause_root);
        fs::write(bundle.join("config.json"), spec.to_string())
            .map_err(io_ctx("writing the sandbox spec"))?;
        let net = match ip {
            Some(ip) => Some(PodNet {
                bridge: self.ensure_bridge()?,
                cidr: self.opts.pod_cidr,
                ip,
            }),
            None => None,
        };
        Ok((bundle, net))
    }

    /// Takes the node's pod CIDR: sandboxes made from now on get addresses in it. Refused while
    /// the pod bridge is up on another network or a sandbox holds an address outside it (the
    /// running pods keep theirs; a node changes its CIDR by rebooting).
    pub fn set_pod_cidr(&mut self, pod_cidr: &str) -> Result<(), RuntimeError> {
        let cidr = net::Cidr::parse(pod_cidr).ok_or_else(|| {
            RuntimeError::Invalid(format!("invalid pod CIDR {pod_cidr:?} (want a.b.c.d/8..30)"))
        })?;
        if cidr == self.opts.pod_cidr {
            return Ok(());
        }
        if self.bridge.is_some() {
            return Err(RuntimeError::Conflict(format!(
                "the pod network is up on {}; {cidr} applies after a reboot",
                self.opts.pod_cidr
            )));
        }
        if let Some(ip) = self
            .sandboxes
            .values()
            .filter_map(|s| s.rec.status.ip.as_deref()?.parse::<std::net::Ipv4Addr>().ok())
            .find(|ip| !cidr.contains(*ip))
        {
            return Err(RuntimeError::Conflict(format!(
                "a sandbox holds {ip}, outside {cidr}"
            )));
        }
        let file = self.opts.state_dir.join(super::POD_CIDR_FILE);
        fs::write(&file, cidr.to_string()).map_err(io_ctx(file.display().to_string()))?;
        tracing::info!(from = %self.opts.pod_cidr, to = %cidr, "pod CIDR set");
        self.opts.pod_cidr = cidr;
        Ok(())
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

    /// Best-effort removal of everything a sandbox owns on the host (a pod on the node's
    /// network has no veth).
    fn teardown_sandbox_dir(&mut self, id: &str, dir: &Path, slice: &str, host_network: bool) {
        if !host_network && let Err(e) = net::detach(id) {
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
        self.forget_samples(slice);
    }

    /// A socket connecting to `localhost:<port>` in the network namespace of sandbox `id`
    /// (CRI's `PortForward`); containerd's error text when nothing listens.
    pub(super) fn port_forward(&mut self, id: &str, port: u16) -> Result<OwnedFd, RuntimeError> {
        let sb = self.sandbox(id)?;
        let pid = sb
            .rec
            .status
            .pause_pid
            .filter(|_| sb.pidfd.is_some() && sb.rec.status.ready)
            .ok_or_else(|| RuntimeError::Conflict(format!("sandbox {id} is not ready")))?;
        net::dial_localhost(pid, port).map_err(|e| match e {
            net::DialError::Netns(source) => RuntimeError::Network {
                what: format!("entering the network namespace of sandbox {id}"),
                source,
            },
            source => RuntimeError::Dial {
                port,
                sandbox: id.to_string(),
                source,
            },
        })
    }

    pub(super) fn stop_sandbox(&mut self, id: &str) -> Result<(), RuntimeError> {
        let sb = self.sandbox(id)?;
        // Only a pause process we still watch is signalled: once it exited and was reaped its pid
        // may belong to someone else.
        let pause = sb.rec.status.pause_pid.filter(|_| sb.pidfd.is_some());
        for cid in self.containers_of(id) {
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
        self.sync_host_ports_logged();
        Ok(())
    }

    /// The host ports of the ready sandboxes with their own network.
    pub(super) fn wanted_host_ports(&self) -> Vec<net::nft::HostPort> {
        let mut ports: Vec<net::nft::HostPort> = self
            .sandboxes
            .values()
            .filter(|s| s.rec.status.ready && !s.rec.config.host.network)
            .filter_map(|s| Some((s, s.rec.status.ip.as_deref()?.parse().ok()?)))
            .flat_map(|(s, pod_ip)| {
                s.rec
                    .config
                    .port_mappings
                    .iter()
                    .map(move |m| net::nft::HostPort {
                        mapping: m.clone(),
                        pod_ip,
                    })
            })
            .collect();
        ports.sort();
        ports
    }

    /// Brings the kernel's host-port rules in line with the sandboxes (one nftables transaction,
    /// only when they changed; nothing on a node that never had any).
    pub(super) fn sync_host_ports(&mut self) -> Result<(), RuntimeError> {
        let wanted = self.wanted_host_ports();
        let unchanged = match &self.host_ports {
            Some(applied) => *applied == wanted,
            None => wanted.is_empty(),
        };
        if unchanged {
            return Ok(());
        }
        net::nft::sync(&wanted)?;
        tracing::info!(ports = wanted.len(), "host ports forwarded");
        self.host_ports = Some(wanted);
        Ok(())
    }

    fn sync_host_ports_logged(&mut self) {
        if let Err(e) = self.sync_host_ports() {
            tracing::warn!(error = %e, "host port rules not updated");
        }
    }

    pub(super) fn remove_sandbox(&mut self, id: &str) -> Result<(), RuntimeError> {
        self.stop_sandbox(id)?;
        for cid in self.containers_of(id) {
            self.remove_container(&cid)?;
        }
        if let Some(sb) = self.sandboxes.remove(id) {
            self.teardown_sandbox_dir(id, &sb.dir, &sb.rec.status.cgroup, sb.rec.config.host.network);
        }
        self.update_burstable()?;
        tracing::info!(sandbox = id, "sandbox removed");
        Ok(())
    }

    /// The pause process exited: the sandbox is lost (its containers keep running until the
    /// client removes it).
    pub(super) fn on_pause_exit(&mut self, id: &str) {
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
        self.sync_host_ports_logged();
    }
}

/// The hosts file of a pod with only the loopback names.
const LOCALHOST: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// The hostname a pod's UTS namespace gets: its own (the pod name when the client gave none),
/// or `<hostname>.<domain>` with `hostname_as_fqdn` and a domain.
fn kernel_hostname(config: &SandboxConfig) -> String {
    let short = config.hostname.clone().unwrap_or_else(|| config.name.clone());
    match (&config.host_domain, config.hostname_as_fqdn) {
        (Some(domain), true) => format!("{short}.{domain}"),
        _ => short,
    }
}

/// `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` of a pod, as the kubelet writes them: a
/// pod with its own network gets the managed hosts file (loopback and IPv6 names, then its
/// address with `<hostname>.<domain> <hostname>` or `<hostname>`), a pod on the node's network
/// the node's hosts file (`node_hosts`); both end with the hostAliases entries.
fn etc_files(
    config: &SandboxConfig,
    hostname: &str,
    ip: Option<std::net::Ipv4Addr>,
    node_hosts: Option<&str>,
) -> [(&'static str, String); 3] {
    let mut hosts = match node_hosts {
        Some(node) => format!("# Kubernetes-managed hosts file (host network).\n{node}"),
        None => {
            let mut h = format!(
                "# Kubernetes-managed hosts file.\n{LOCALHOST}fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n"
            );
            let short = config.hostname.as_deref().unwrap_or(&config.name);
            if let Some(ip) = ip {
                match &config.host_domain {
                    Some(domain) => h.push_str(&format!("{ip}\t{short}.{domain}\t{short}\n")),
                    None => h.push_str(&format!("{ip}\t{short}\n")),
                }
            }
            h
        }
    };
    if !config.host_entries.is_empty() {
        if !hosts.is_empty() && !hosts.ends_with('\n') {
            hosts.push('\n');
        }
        hosts.push_str("\n# Entries added by HostAliases.\n");
        for l in &config.host_entries {
            hosts.push_str(l);
            hosts.push('\n');
        }
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
    [
        ("hosts", hosts),
        ("hostname", format!("{hostname}\n")),
        ("resolv.conf", resolv),
    ]
}

/// Request fields end up in paths (cgroups, logs, state): anything that could leave its
/// directory is refused before anything is created.
pub(super) fn validate_sandbox(c: &SandboxConfig) -> Result<(), RuntimeError> {
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
    if let Some(d) = &c.host_domain
        && (d.is_empty()
            || d.len() > 253
            || !d.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b)))
    {
        return bad(format!("invalid host domain {d:?}"));
    }
    let kernel = kernel_hostname(c);
    if !c.host.network && kernel.len() > 64 {
        return bad(format!("hostname {kernel:?} is longer than 64 characters"));
    }
    if c.host_entries.iter().any(|l| l.contains(['\n', '\0'])) {
        return bad("a hosts entry holds a line break".into());
    }
    if let Some(m) = c
        .port_mappings
        .iter()
        .find(|m| m.host_port == 0 || m.container_port == 0)
    {
        return bad(format!(
            "invalid port mapping {}->{}: ports are 1-65535",
            m.host_port, m.container_port
        ));
    }
    if c.log_directory
        .as_ref()
        .is_some_and(|d| !d.is_absolute() || d.components().any(|x| x == std::path::Component::ParentDir))
    {
        return bad("the log directory must be an absolute path without '..'".into());
    }
    Ok(())
}

/// The pause root: an empty read-only tree whose `/pause` is the pause program
/// (`crate::pause`, a few hundred bytes; it was a copy of the node binary, 11 MB of tmpfs memory
/// once per boot, since the binary itself lives in the initramfs, deleted after the move to the
/// tmpfs root, and the kernel refuses to bind-mount a deleted file).
fn prepare_pause_root(root: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    for d in ["proc", "dev"] {
        fs::create_dir_all(root.join(d)).map_err(io_ctx(format!("pause root {d}")))?;
    }
    let target = root.join("pause");
    let program = crate::pause::program();
    if fs::read(&target).ok().as_deref() == Some(program.as_slice()) {
        return Ok(());
    }
    let tmp = root.join(".pause.tmp");
    fs::write(&tmp, &program).map_err(io_ctx("writing the pause program"))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o555)).map_err(io_ctx("pause permissions"))?;
    fs::rename(&tmp, &target).map_err(io_ctx("pause root"))
}

/// A sandbox whose build runs in a helper (see `build`).
pub(super) struct PendingSandbox {
    id: String,
    dir: PathBuf,
    config: SandboxConfig,
    slice: String,
    /// The status to report, filled in once the pause process runs.
    status: SandboxStatus,
    /// The address it was given (reserved while the build runs).
    pub ip: Option<std::net::Ipv4Addr>,
}

#[cfg(test)]
impl PendingSandbox {
    /// A pending sandbox of pod `name` with its directory at `dir` and no address.
    pub(super) fn for_test(name: &str, dir: PathBuf) -> Self {
        let config = SandboxConfig {
            name: name.into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        };
        let slice = cgroups::pod_slice(config.resources.qos, &config.uid);
        PendingSandbox {
            id: format!("id-{name}"),
            dir,
            status: SandboxStatus {
                id: format!("id-{name}"),
                name: name.into(),
                namespace: config.namespace.clone(),
                uid: config.uid.clone(),
                attempt: 0,
                ready: false,
                pause_pid: None,
                ip: None,
                cgroup: slice.clone(),
                qos: config.resources.qos,
                created_at: now(),
            },
            config,
            slice,
            ip: None,
        }
    }
}

/// A sandbox's place on the pod network.
struct PodNet {
    bridge: u32,
    cidr: net::Cidr,
    ip: std::net::Ipv4Addr,
}

/// In the build helper: creates and starts the pause process of the sandbox whose bundle is
/// `bundle`, and wires its network; returns its pid.
fn build_sandbox(
    youki_root: &Path,
    id: &str,
    bundle: &Path,
    net: Option<PodNet>,
) -> Result<i32, RuntimeError> {
    let devnull = || {
        fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(io_ctx("/dev/null"))
    };
    let mut c = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_root_path(youki_root)
        .map_err(lc_err("sandbox state root"))?
        .with_stdin(devnull()?)
        .with_stdout(devnull()?)
        .with_stderr(devnull()?)
        .validate_id()
        .map_err(lc_err("sandbox id"))?
        .as_init(bundle)
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(lc_err("creating the pause container"))?;
    let pid = c
        .pid()
        .map(|p| p.as_raw())
        .ok_or_else(|| RuntimeError::Container {
            what: "creating the pause container".into(),
            detail: "no pid".into(),
        })?;
    c.start().map_err(lc_err("starting the pause container"))?;
    if let Some(n) = net {
        net::attach(n.bridge, &n.cidr, id, pid, n.ip).map_err(|source| RuntimeError::Network {
            what: "pod network".into(),
            source,
        })?;
        net::set_sysctls(pid, spec::SANDBOX_SYSCTLS).map_err(|source| RuntimeError::Network {
            what: "pod network sysctls".into(),
            source,
        })?;
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_cidr_is_taken_checked_and_kept_for_the_next_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rt = crate::server::test_runtime(dir.path());
        rt.set_pod_cidr("10.244.7.0/24").expect("taken");
        assert_eq!(rt.opts.pod_cidr.to_string(), "10.244.7.0/24");
        let e = rt.set_pod_cidr("10.244.7.0").expect_err("no prefix");
        assert!(matches!(e, RuntimeError::Invalid(_)), "{e}");
        // Once the bridge is up, another network waits for a reboot; the same one is fine.
        rt.bridge = Some(7);
        rt.set_pod_cidr("10.244.7.0/24").expect("unchanged");
        let e = rt.set_pod_cidr("10.244.8.0/24").expect_err("bridge up");
        assert!(matches!(e, RuntimeError::Conflict(_)), "{e}");
        drop(rt);
        let again = crate::server::test_runtime(dir.path());
        assert_eq!(again.opts.pod_cidr.to_string(), "10.244.7.0/24");
    }

    #[test]
    fn sandbox_requests_that_would_leave_their_directories_are_refused() {
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
    }

    #[test]
    fn etc_files_of_a_pod() {
        let c = SandboxConfig {
            name: "web".into(),
            host_entries: vec!["10.0.0.1\tdb".into(), "10.0.0.1\tdb.local".into()],
            dns: runtime_api::Dns {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            },
            ..Default::default()
        };
        let ip = Some(std::net::Ipv4Addr::new(10, 244, 0, 7));
        let [(_, hosts), (_, hostname), (_, resolv)] = etc_files(&c, "web", ip, None);
        assert_eq!(
            hosts,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.244.0.7\tweb\n\n# Entries added by HostAliases.\n10.0.0.1\tdb\n10.0.0.1\tdb.local\n"
        );
        assert_eq!(hostname, "web\n");
        assert_eq!(
            resolv,
            "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\n"
        );
    }

    #[test]
    fn a_pod_with_a_subdomain_is_named_by_its_fqdn_too() {
        let c = SandboxConfig {
            name: "web-0".into(),
            hostname: Some("web-0".into()),
            host_domain: Some("web.shop.svc.cluster.local".into()),
            ..Default::default()
        };
        let ip = Some(std::net::Ipv4Addr::new(10, 244, 0, 9));
        assert_eq!(kernel_hostname(&c), "web-0");
        let [(_, hosts), (_, hostname), _] = etc_files(&c, &kernel_hostname(&c), ip, None);
        assert!(
            hosts.ends_with("fe00::2\tip6-allrouters\n10.244.0.9\tweb-0.web.shop.svc.cluster.local\tweb-0\n"),
            "{hosts}"
        );
        assert_eq!(hostname, "web-0\n");
        let fqdn = SandboxConfig {
            hostname_as_fqdn: true,
            ..c.clone()
        };
        assert_eq!(kernel_hostname(&fqdn), "web-0.web.shop.svc.cluster.local");
        let [(_, fqdn_hosts), (_, hostname), _] = etc_files(&fqdn, &kernel_hostname(&fqdn), ip, None);
        assert_eq!(
            fqdn_hosts, hosts,
            "the hosts file names the short name either way"
        );
        assert_eq!(hostname, "web-0.web.shop.svc.cluster.local\n");
        // Without a domain, setHostnameAsFQDN changes nothing.
        let plain = SandboxConfig {
            host_domain: None,
            ..fqdn
        };
        assert_eq!(kernel_hostname(&plain), "web-0");
    }

    #[test]
    fn a_pod_on_the_nodes_network_gets_the_nodes_hosts_file() {
        let c = SandboxConfig {
            name: "agent".into(),
            host_entries: vec!["10.1.2.3\tfoo".into()],
            host: runtime_api::HostNamespaces {
                network: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let [(_, hosts), _, _] = etc_files(
            &c,
            "node-0",
            None,
            Some("127.0.0.1 localhost\n192.168.1.5 node-0"),
        );
        assert_eq!(
            hosts,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n192.168.1.5 node-0\n\n\
             # Entries added by HostAliases.\n10.1.2.3\tfoo\n"
        );
    }

    #[test]
    fn names_that_cannot_be_a_hostname_are_refused() {
        let base = SandboxConfig {
            name: "p".into(),
            uid: "u1".into(),
            ..Default::default()
        };
        let long_fqdn = SandboxConfig {
            hostname: Some("a".repeat(40)),
            host_domain: Some("b".repeat(30)),
            hostname_as_fqdn: true,
            ..base.clone()
        };
        assert!(validate_sandbox(&long_fqdn).is_err(), "71 characters");
        assert!(
            validate_sandbox(&SandboxConfig {
                hostname_as_fqdn: false,
                ..long_fqdn
            })
            .is_ok()
        );
        let bad_domain = SandboxConfig {
            host_domain: Some("a b".into()),
            ..base.clone()
        };
        assert!(validate_sandbox(&bad_domain).is_err());
        let injected = SandboxConfig {
            host_entries: vec!["10.0.0.1\tx\n10.0.0.2\ty".into()],
            ..base
        };
        assert!(validate_sandbox(&injected).is_err());
    }
}
