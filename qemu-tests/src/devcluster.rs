//! `./build.sh cluster up|down|status|node`: a local multi-node cluster that outlives the command
//! (the project's `kind`): the control plane on the host's loopback, a registry with the test
//! images, N node VMs (QEMU, TCG) joined to it, and a LAN between the VMs through a UDP switch on
//! 127.0.0.1. Everything started is recorded (pids, QEMU command lines) in `<data-dir>/cluster.json`;
//! `down` stops exactly those processes; `node NAME poweroff|kill|start` presses a node's power
//! button, kills its QEMU (power loss), or boots it again with the same name, MACs and address.
//!
//! Each node has its own name (`node-<i>`), MACs (`52:54:00:4e:0{0,1}:<i>`) and LAN address
//! (`192.168.77.<10+i>/24` on `eth1`, the Node's InternalIP). The control plane reaches each agent
//! through a host port forwarded to the node's 10250 (advertised as the kubelet endpoint).

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::cluster::CP_GUEST_IP;
use crate::guest::REGISTRY_GUEST;
use crate::registry::{push_image, spawn_registry, write_test_images};
use crate::vm::{
    Arch, Lan, Nic, VmConfig, free_port, out_dir, qemu_args, qmp_command, relay_bin, target_dir,
};

/// Which architectures the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Archs {
    One(Arch),
    /// x86_64 and aarch64 alternately.
    Mixed,
}

impl Archs {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "mixed" => Ok(Archs::Mixed),
            other => Ok(Archs::One(Arch::parse(other)?)),
        }
    }

    fn of(self, i: usize) -> Arch {
        match self {
            Archs::One(a) => a,
            Archs::Mixed if i.is_multiple_of(2) => Arch::X86_64,
            Archs::Mixed => Arch::Aarch64,
        }
    }
}

/// Options of `cluster up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub nodes: usize,
    pub archs: Archs,
    pub data_dir: PathBuf,
    pub memory_mib: u32,
}

/// The default data directory: `<out>/cluster`.
pub fn default_data_dir() -> PathBuf {
    out_dir().join("cluster")
}

/// A process the cluster started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proc {
    pub pid: u32,
    /// The program it runs (a recorded pid is only signalled while it still runs this).
    pub program: String,
}

impl Proc {
    fn of(child: &std::process::Child, program: &str) -> Self {
        Self {
            pid: child.id(),
            program: program.into(),
        }
    }

    /// Whether the pid still runs the recorded program (pids are reused).
    pub fn alive(&self) -> bool {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'));
        !zombie && String::from_utf8_lossy(argv0).ends_with(&self.program)
    }

    fn kill(&self) {
        if self.alive() {
            let _ = Command::new("kill").args(["-9", &self.pid.to_string()]).status();
        }
    }
}

/// One node VM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub arch: String,
    pub proc: Option<Proc>,
    pub dir: PathBuf,
    pub args: Vec<String>,
    pub address: String,
    pub agent_port: u16,
}

/// Everything `cluster up` started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub control_plane: Proc,
    pub api_port: u16,
    pub registry: Proc,
    pub registry_port: u16,
    pub switch: Proc,
    pub kubeconfig: PathBuf,
    pub nodes: Vec<NodeState>,
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

/// The recorded state of the cluster in `dir`.
pub fn load(dir: &Path) -> Result<State> {
    let p = state_path(dir);
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("no cluster recorded in {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("reading {}", p.display()))
}

fn save(dir: &Path, s: &State) -> Result<()> {
    std::fs::write(state_path(dir), serde_json::to_string_pretty(s)?)?;
    Ok(())
}

fn free_udp_port() -> Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts `program args` in its own process group (so it outlives this command and its
/// terminal), stdout/stderr to files.
fn spawn_detached(
    program: &Path,
    args: &[String],
    stdout: &Path,
    stderr: &Path,
) -> Result<std::process::Child> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(stdout)?)
        .stderr(std::fs::File::create(stderr)?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .context("running kubectl")?;
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The machine config of node `i`.
fn machine_config(cp_dir: &Path, name: &str, address: &str, agent_port: u16) -> Result<String> {
    let ca = std::fs::read(cp_dir.join("pki/ca.crt")).context("cluster CA")?;
    let token = std::fs::read_to_string(cp_dir.join("pki/bootstrap.token")).context("bootstrap token")?;
    let (rip, rport) = REGISTRY_GUEST;
    Ok(serde_json::json!({
        "apiVersion": "nodeos/v1alpha1",
        "hostname": name,
        // The LAN address first: it is the node's address (InternalIP); eth0 (user networking)
        // gives the default route and DNS.
        "network": {"interfaces": [
            {"name": "eth1", "address": format!("{address}/24")},
            {"name": "eth0", "dhcp": true},
        ]},
        "controlPlane": {
            "server": format!("https://{CP_GUEST_IP}:6443"),
            "caData": base64::engine::general_purpose::STANDARD.encode(ca),
            "bootstrapToken": token.trim(),
            "kubeletEndpoint": format!("127.0.0.1:{agent_port}"),
        },
        "registries": {"insecure": [format!("{rip}:{rport}")]},
        // `cluster node NAME poweroff` shows graceful node shutdown: 30 s for the pods, the
        // last 10 of them for critical ones.
        "nodeShutdown": {"gracePeriodSeconds": 30, "criticalPodsGracePeriodSeconds": 10},
    })
    .to_string())
}

fn start_qemu(node: &NodeState) -> Result<(Proc, std::process::Child)> {
    let arch = Arch::parse(&node.arch)?;
    let serial = node.dir.join("serial.log");
    if serial.exists() {
        let _ = std::fs::rename(&serial, node.dir.join("serial.log.1"));
    }
    let child = spawn_detached(
        Path::new(arch.qemu()),
        &node.args,
        &node.dir.join("qemu.stdout"),
        &node.dir.join("qemu.stderr"),
    )?;
    Ok((Proc::of(&child, arch.qemu()), child))
}

/// `cluster up`.
pub fn up(opts: &UpOptions) -> Result<()> {
    let dir = &opts.data_dir;
    if let Ok(old) = load(dir)
        && (old.control_plane.alive() || old.nodes.iter().any(|n| n.proc.as_ref().is_some_and(Proc::alive)))
    {
        bail!(
            "a cluster is already running from {} (./build.sh cluster down first)",
            dir.display()
        );
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let mut started: Vec<Proc> = Vec::new();
    let result = up_inner(opts, &mut started);
    if result.is_err() {
        for p in &started {
            p.kill();
        }
    }
    result
}

fn up_inner(opts: &UpOptions, started: &mut Vec<Proc>) -> Result<()> {
    let dir = &opts.data_dir;
    let t0 = Instant::now();
    // Control plane.
    let cp_dir = dir.join("controlplane");
    std::fs::create_dir_all(&cp_dir)?;
    let cp_bin = target_dir().join("debug/controlplane");
    let api_port = free_port()?;
    let cp_args: Vec<String> = ["serve", "--data-dir"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            cp_dir.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{api_port}"),
            "--san".into(),
            CP_GUEST_IP.into(),
        ])
        .collect();
    let mut cp = spawn_detached(
        &cp_bin,
        &cp_args,
        &cp_dir.join("stdout.log"),
        &cp_dir.join("controlplane.log"),
    )?;
    let control_plane = Proc::of(&cp, &cp_bin.display().to_string());
    started.push(control_plane.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(cp_dir.join("stdout.log"))
        .unwrap_or_default()
        .contains("serving on")
    {
        if Instant::now() > deadline || cp.try_wait()?.is_some() {
            bail!(
                "the control plane did not start; see {}",
                cp_dir.join("controlplane.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let kubeconfig = cp_dir.join("admin.kubeconfig");
    // Registry with the test images.
    let reg_dir = dir.join("registry");
    std::fs::create_dir_all(&reg_dir)?;
    let (reg_child, registry_port) = spawn_registry(&reg_dir, None, true)?;
    let registry = Proc::of(&reg_child, "docker-registry");
    started.push(registry.clone());
    let images = dir.join("images");
    write_test_images(&images, &["amd64", "arm64"])?;
    for image in ["busybox:1", "layered:1"] {
        push_image(&format!("127.0.0.1:{registry_port}"), &images, image, image, None)?;
    }
    // The LAN switch.
    let switch_port = free_udp_port()?;
    let node_ports: Vec<u16> = (0..opts.nodes).map(|_| free_udp_port()).collect::<Result<_>>()?;
    let mut switch_args = vec!["switch".to_string(), "--listen".into(), switch_port.to_string()];
    for p in &node_ports {
        switch_args.extend(["--peer".into(), p.to_string()]);
    }
    let relay = relay_bin();
    let sw = spawn_detached(
        &relay,
        &switch_args,
        &dir.join("switch.log"),
        &dir.join("switch.err"),
    )?;
    let switch = Proc::of(&sw, &relay.display().to_string());
    started.push(switch.clone());
    // Nodes.
    let out = out_dir();
    let mut nodes = Vec::new();
    let mut children = Vec::new();
    for (i, local_port) in node_ports.iter().enumerate() {
        let arch = opts.archs.of(i);
        let name = format!("node-{i}");
        let ndir = dir.join("nodes").join(&name);
        std::fs::create_dir_all(&ndir)?;
        let address = format!("192.168.77.{}", 10 + i);
        let agent_port = free_port()?;
        let nic = Nic {
            mac: Some(format!("52:54:00:4e:00:{i:02x}")),
            forwards: vec![(agent_port, 10250)],
            guest_forwards: vec![
                (CP_GUEST_IP.into(), 6443, api_port),
                (REGISTRY_GUEST.0.into(), REGISTRY_GUEST.1, registry_port),
            ],
        };
        // The node's state partition: its identity survives `cluster node NAME poweroff|start`.
        let disk = ndir.join("state.img");
        crate::vm::state_disk(&disk)?;
        let cfg = VmConfig::direct(&out, arch)?
            .with_memory_mib(opts.memory_mib)
            .with_extra_disk(&disk)
            .with_nics(vec![nic])
            .with_lan(Lan {
                mac: format!("52:54:00:4e:01:{i:02x}"),
                local_port: *local_port,
                switch_port,
            })
            .with_fw_cfg(machine_config(&cp_dir, &name, &address, agent_port)?);
        let (args, _) = qemu_args(&cfg, &ndir)?;
        std::fs::write(ndir.join("qemu.args"), args.join("\n"))?;
        let mut node = NodeState {
            name,
            arch: arch.name().into(),
            proc: None,
            dir: ndir,
            args,
            address,
            agent_port,
        };
        let (p, child) = start_qemu(&node)?;
        started.push(p.clone());
        node.proc = Some(p);
        nodes.push(node);
        children.push(child);
    }
    let state = State {
        control_plane,
        api_port,
        registry,
        registry_port,
        switch,
        kubeconfig: kubeconfig.clone(),
        nodes,
    };
    save(dir, &state)?;
    // Wait until every node is Ready.
    let timeout = Duration::from_secs(300 + 60 * opts.nodes as u64);
    let deadline = Instant::now() + timeout;
    let jp = "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}";
    loop {
        let text = kubectl(&kubeconfig, &["get", "nodes", "-o", jp]).unwrap_or_default();
        let ready = state
            .nodes
            .iter()
            .filter(|n| text.lines().any(|l| l == format!("{}=True", n.name)))
            .count();
        if ready == state.nodes.len() {
            break;
        }
        if let Some(dead) = state
            .nodes
            .iter()
            .find(|n| n.proc.as_ref().is_some_and(|p| !p.alive()))
        {
            bail!(
                "node {} stopped while booting; see {}",
                dead.name,
                dead.dir.join("serial.log").display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{ready}/{} nodes Ready after {timeout:?}; serial logs under {}",
                state.nodes.len(),
                dir.join("nodes").display()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    println!(
        "cluster up in {:.1} s: control plane https://127.0.0.1:{api_port}, {} node(s)",
        t0.elapsed().as_secs_f64(),
        state.nodes.len()
    );
    println!("{}", kubectl(&kubeconfig, &["get", "nodes", "-o", "wide"])?);
    println!(
        "images: {}:{}/busybox:1 (the registry seen from the nodes)",
        REGISTRY_GUEST.0, REGISTRY_GUEST.1
    );
    println!("export KUBECONFIG={}", kubeconfig.display());
    Ok(())
}

/// `cluster down`: stops the recorded processes (nothing else), nodes first.
pub fn down(dir: &Path) -> Result<()> {
    let state = load(dir)?;
    for n in &state.nodes {
        if let Some(p) = &n.proc {
            p.kill();
        }
    }
    for p in [&state.switch, &state.registry, &state.control_plane] {
        p.kill();
    }
    std::fs::remove_file(state_path(dir))?;
    println!("cluster in {} stopped (logs kept)", dir.display());
    Ok(())
}

/// `cluster status`.
pub fn status(dir: &Path) -> Result<()> {
    let state = load(dir)?;
    let show = |what: &str, p: Option<&Proc>| {
        let (pid, s) = match p {
            Some(p) => (p.pid.to_string(), if p.alive() { "running" } else { "stopped" }),
            None => ("-".into(), "stopped"),
        };
        println!("{what:<24} {pid:>8}  {s}");
    };
    println!("{:<24} {:>8}  STATE", "PROCESS", "PID");
    show(
        &format!("control plane :{}", state.api_port),
        Some(&state.control_plane),
    );
    show(
        &format!("registry :{}", state.registry_port),
        Some(&state.registry),
    );
    show("lan switch", Some(&state.switch));
    for n in &state.nodes {
        show(
            &format!("{} ({}, {})", n.name, n.arch, n.address),
            n.proc.as_ref(),
        );
    }
    if state.control_plane.alive() {
        println!(
            "\n{}",
            kubectl(&state.kubeconfig, &["get", "nodes", "-o", "wide"])?
        );
        println!("export KUBECONFIG={}", state.kubeconfig.display());
    }
    Ok(())
}

/// `cluster node NAME poweroff|kill|start`.
pub fn node(dir: &Path, name: &str, action: &str) -> Result<()> {
    let mut state = load(dir)?;
    let n = state
        .nodes
        .iter_mut()
        .find(|n| n.name == name)
        .with_context(|| format!("no node {name} in this cluster"))?;
    let running = n.proc.as_ref().is_some_and(Proc::alive);
    match action {
        "poweroff" => {
            if !running {
                bail!("{name} is not running");
            }
            if n.arch == "aarch64" {
                println!(
                    "note: the arm64 cloud kernel has no gpio-keys driver; the power button may go unseen"
                );
            }
            qmp_command(&n.dir.join("qmp.sock"), "system_powerdown", None)?;
            println!("{name}: power button pressed");
        }
        "kill" => {
            if let Some(p) = &n.proc {
                p.kill();
            }
            println!("{name}: QEMU killed (power loss)");
        }
        "start" => {
            if running {
                bail!("{name} is already running");
            }
            n.proc = Some(start_qemu(n)?.0);
            println!("{name}: booting ({})", n.dir.join("serial.log").display());
        }
        other => bail!("unknown node action {other:?} (poweroff, kill or start)"),
    }
    save(dir, &state)
}

/// `nodeos-vm switch --listen PORT --peer PORT...`: an Ethernet switch over UDP datagrams on
/// 127.0.0.1 (one datagram = one frame, QEMU's `dgram` netdev). It learns which peer has which
/// source MAC and floods frames for unknown or broadcast destinations to every other peer.
pub fn switch(listen: u16, peers: &[u16]) -> Result<()> {
    let socket = UdpSocket::bind(("127.0.0.1", listen))?;
    let peers: Vec<SocketAddr> = peers
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    let mut table: std::collections::HashMap<[u8; 6], SocketAddr> = std::collections::HashMap::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = socket.recv_from(&mut buf)?;
        // Only the recorded VMs may use the switch.
        if n < 14 || !peers.contains(&from) {
            continue;
        }
        let frame = &buf[..n];
        let mut src = [0u8; 6];
        src.copy_from_slice(&frame[6..12]);
        table.insert(src, from);
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&frame[..6]);
        let unicast = dst[0] & 1 == 0;
        match table.get(&dst).filter(|_| unicast) {
            Some(to) if *to != from => {
                let _ = socket.send_to(frame, to);
            }
            Some(_) => {}
            None => {
                for p in peers.iter().filter(|p| **p != from) {
                    let _ = socket.send_to(frame, p);
                }
            }
        }
    }
}
