//! The runtime's in-guest test suite. It runs inside a node VM as the machine config's
//! `debug.testCommand` (root, cgroup v2, the node's own runtime process on its socket), pulls the
//! test images (through the runtime's `PullImage`) from the registry the harness forwards into the
//! guest, and prints one line per
//! case: `SUITE ok <case>` or `SUITE FAIL <case>: <why>`, then `SUITE done passed=N failed=M`.
//!
//! Usage: `runtime-suite --registry HOST:PORT [--only CASE[,CASE...]]`
//! (`runtime-suite readopt-child <file>` is its own helper for the re-adoption case).

#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use runtime::cgroups;
use runtime::seccomp::{self, PROBE_ADMIN_CAPS, Profile};
use runtime_api::{
    Client, ClientError, ContainerConfig, ContainerStatus, ErrorKind, PodResources, PullPolicy, QosClass,
    Resources, SandboxConfig, SandboxStatus, State,
};

type R<T = ()> = Result<T, String>;

const MI: u64 = 1024 * 1024;
const LOGS: &str = "/var/log/pods";

fn e<E: std::fmt::Display>(ctx: &str) -> impl FnOnce(E) -> String + '_ {
    move |err| format!("{ctx}: {err}")
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> R {
    if cond { Ok(()) } else { Err(msg()) }
}

struct Suite {
    registry: String,
    client: Client,
    pods: u32,
}

impl Suite {
    fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.registry)
    }

    fn sandbox(&mut self, name: &str, resources: PodResources, share_pid: bool) -> R<SandboxStatus> {
        self.pods += 1;
        let uid = format!("00000000-0000-4000-8000-{:012}", self.pods);
        self.client
            .run_sandbox(SandboxConfig {
                name: name.into(),
                namespace: "default".into(),
                uid: uid.clone(),
                resources,
                share_process_namespace: share_pid,
                log_directory: Some(PathBuf::from(format!("{LOGS}/default_{name}_{uid}"))),
                dns: runtime_api::Dns {
                    servers: vec!["10.96.0.10".into()],
                    searches: vec!["default.svc.cluster.local".into()],
                    options: vec!["ndots:5".into()],
                },
                ..Default::default()
            })
            .map_err(e("run sandbox"))
    }

    fn container(
        &mut self,
        sb: &SandboxStatus,
        name: &str,
        script: &str,
        res: Resources,
    ) -> R<ContainerStatus> {
        self.container_with(
            sb,
            ContainerConfig {
                name: name.into(),
                image: self.image("busybox:1"),
                command: vec!["sh".into(), "-c".into(), script.into()],
                resources: res,
                ..Default::default()
            },
        )
    }

    /// Makes `name` (in the test registry) present through the runtime.
    fn pull(&mut self, name: &str, policy: PullPolicy) -> Result<runtime_api::Image, ClientError> {
        let image = self.image(name);
        self.client
            .pull_image(&image, policy, None, vec![self.registry.clone()])
    }

    fn container_with(&mut self, sb: &SandboxStatus, cfg: ContainerConfig) -> R<ContainerStatus> {
        let c = self
            .client
            .create_container(&sb.id, cfg)
            .map_err(e("create container"))?;
        self.client.start_container(&c.id).map_err(e("start container"))
    }

    /// Waits for the exit (the runtime replies when it happens); `timeout` only bounds a
    /// polling fallback when the wait itself fails.
    fn wait_exit(&mut self, id: &str, timeout: Duration) -> R<ContainerStatus> {
        let t0 = Instant::now();
        let st = self.client.wait_container(id).map_err(e("wait"))?;
        ensure(st.state == State::Exited && t0.elapsed() <= timeout, || {
            format!("{} not exited within {timeout:?}", st.name)
        })?;
        Ok(st)
    }

    fn remove_pod(&mut self, sb: &SandboxStatus) -> R {
        self.client.remove_sandbox(&sb.id).map_err(e("remove sandbox"))
    }
}

/// The text of a container's CRI log (the message part of each record).
fn log_text(path: &Path) -> R<String> {
    let raw = fs::read_to_string(path).map_err(e("reading log"))?;
    let mut out = String::new();
    for l in raw.lines() {
        let parts: Vec<&str> = l.splitn(4, ' ').collect();
        ensure(
            parts.len() == 4
                && parts[0].ends_with('Z')
                && ["stdout", "stderr"].contains(&parts[1])
                && ["F", "P"].contains(&parts[2]),
            || format!("not a CRI log record: {l:?}"),
        )?;
        out.push_str(parts[3]);
        if parts[2] == "F" {
            out.push('\n');
        }
    }
    Ok(out)
}

fn ns(pid: i32, kind: &str) -> R<String> {
    fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .map(|p| p.display().to_string())
        .map_err(e("ns link"))
}

fn cg(rel: &str, file: &str) -> R<String> {
    let p = Path::new(cgroups::CGROUP_ROOT)
        .join(rel.trim_start_matches('/'))
        .join(file);
    fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(|err| format!("{}: {err}", p.display()))
}

fn check_cg(rel: &str, file: &str, want: &str) -> R {
    let got = cg(rel, file)?;
    ensure(got == want, || format!("{rel}/{file} = {got:?}, want {want:?}"))
}

fn check_all(rel: &str, want: &[(&str, &str)]) -> R {
    want.iter()
        .try_for_each(|(file, value)| check_cg(rel, file, value))
}

fn oom_adj(pid: i32) -> R<String> {
    fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .map(|s| s.trim().to_string())
        .map_err(e("oom_score_adj"))
}

fn pid_of(c: &ContainerStatus) -> R<i32> {
    c.pid.ok_or_else(|| "no pid".to_string())
}

// ---------------------------------------------------------------------------------------------

fn namespaces(s: &mut Suite) -> R {
    let sb = s.sandbox("ns-pod", PodResources::default(), false)?;
    let a = s.container(
        &sb,
        "a",
        "hostname; cat /etc/resolv.conf; sleep 1000",
        Resources::default(),
    )?;
    let b = s.container(&sb, "b", "sleep 1000", Resources::default())?;
    let pause = sb.pause_pid.ok_or("no pause pid")?;
    for c in [&a, &b] {
        let pid = pid_of(c)?;
        for kind in ["net", "ipc", "uts"] {
            ensure(ns(pid, kind)? == ns(pause, kind)?, || {
                format!("{} {kind} ns differs from the sandbox's", c.name)
            })?;
        }
        for kind in ["pid", "mnt"] {
            ensure(ns(pid, kind)? != ns(pause, kind)?, || {
                format!("{} shares the sandbox's {kind} ns", c.name)
            })?;
        }
    }
    ensure(ns(pid_of(&a)?, "pid")? != ns(pid_of(&b)?, "pid")?, || {
        "containers share a pid ns".into()
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let log = log_text(a.log_path.as_deref().ok_or("no log path")?)?;
    ensure(log.starts_with("ns-pod\n"), || {
        format!("hostname is not the pod name: {log:?}")
    })?;
    ensure(
        log.contains("nameserver 10.96.0.10")
            && log.contains("search default.svc.cluster.local")
            && log.contains("options ndots:5"),
        || format!("resolv.conf: {log:?}"),
    )?;
    s.remove_pod(&sb)
}

/// `hostNetwork`, `hostPID` and `hostIPC`: the sandbox and its containers stay in the node's
/// namespaces (network with UTS), get no pod address, set none of the node's sysctls, and
/// leave nothing behind.
fn host_namespaces(s: &mut Suite) -> R {
    let ping_range =
        || fs::read_to_string("/proc/sys/net/ipv4/ping_group_range").map_err(e("ping_group_range"));
    let before = ping_range()?;
    s.pods += 1;
    let uid = format!("00000000-0000-4000-8000-{:012}", s.pods);
    let sb = s
        .client
        .run_sandbox(SandboxConfig {
            name: "on-host".into(),
            namespace: "default".into(),
            uid: uid.clone(),
            host: runtime_api::HostNamespaces {
                network: true,
                pid: true,
                ipc: true,
            },
            log_directory: Some(PathBuf::from(format!("{LOGS}/default_on-host_{uid}"))),
            ..Default::default()
        })
        .map_err(e("run sandbox"))?;
    ensure(sb.ip.is_none(), || {
        format!("a pod on the node's network got {:?}", sb.ip)
    })?;
    let c = s.container(
        &sb,
        "a",
        "hostname; cat /proc/1/cmdline | tr '\\0' ' '; echo; sleep 1000",
        Resources::default(),
    )?;
    let pid = pid_of(&c)?;
    let me = std::process::id() as i32;
    for kind in ["net", "uts", "ipc", "pid"] {
        ensure(ns(pid, kind)? == ns(me, kind)?, || {
            format!("the container's {kind} ns is not the node's")
        })?;
    }
    ensure(ns(pid, "mnt")? != ns(me, "mnt")?, || {
        "the container shares the node's mount ns".into()
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let log = log_text(c.log_path.as_deref().ok_or("no log path")?)?;
    let node = nix::unistd::gethostname().map_err(e("hostname"))?;
    ensure(log.starts_with(&format!("{}\n", node.to_string_lossy())), || {
        format!("hostname is not the node's: {log:?}")
    })?;
    let init = fs::read_to_string("/proc/1/cmdline")
        .map_err(e("cmdline"))?
        .replace('\0', " ");
    ensure(log.lines().nth(1) == Some(init.as_str()), || {
        format!("pid 1 is not the node's init ({init:?}): {log:?}")
    })?;
    ensure(ping_range()? == before, || {
        "the node's ping_group_range changed".into()
    })?;
    s.remove_pod(&sb)?;
    ensure(ping_range()? == before, || {
        "the node's ping_group_range changed".into()
    })
}

fn pod_network(s: &mut Suite) -> R {
    let a = s.sandbox("net-a", PodResources::default(), false)?;
    let b = s.sandbox("net-b", PodResources::default(), false)?;
    let (ip_a, ip_b) = (
        a.ip.clone().ok_or("pod a has no IP")?,
        b.ip.clone().ok_or("pod b has no IP")?,
    );
    ensure(
        ip_a != ip_b && ip_a.starts_with("10.244.0.") && ip_b.starts_with("10.244.0."),
        || format!("{ip_a} {ip_b}"),
    )?;
    // Debian's busybox 1.35 pings through a raw socket only (no fallback to ICMP datagram
    // sockets), so this probe adds back the NET_RAW the defaults leave out; the sandbox's
    // ping_group_range is what lets datagram-socket pings work without it.
    let script = format!(
        "ip -4 -o addr show eth0; ip route; ping -c 1 -W 5 {ip_a} >/dev/null && echo PING_OK; ip -o link show lo; echo range $(cat /proc/sys/net/ipv4/ping_group_range)"
    );
    let c = s.container_with(
        &b,
        ContainerConfig {
            name: "probe".into(),
            image: s.image("busybox:1"),
            command: vec!["sh".into(), "-c".into(), script],
            capabilities_add: vec!["NET_RAW".into()],
            ..Default::default()
        },
    )?;
    let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
    let log = log_text(st.log_path.as_deref().ok_or("log")?)?;
    ensure(log.contains("range 0 2147483647"), || {
        format!("ping_group_range not open in the sandbox: {log}")
    })?;
    ensure(log.contains(&format!("inet {ip_b}/24")), || {
        format!("eth0 address: {log}")
    })?;
    ensure(log.contains("default via 10.244.0.1 dev eth0"), || {
        format!("route: {log}")
    })?;
    ensure(log.contains("PING_OK"), || {
        format!("pod-to-pod ping failed: {log}")
    })?;
    ensure(log.contains("<LOOPBACK,UP"), || format!("loopback down: {log}"))?;
    let veth = format!("/sys/class/net/{}", runtime::net::veth_name(&a.id));
    ensure(Path::new(&veth).exists(), || format!("{veth} missing"))?;
    s.remove_pod(&a)?;
    ensure(!Path::new(&veth).exists(), || format!("{veth} left behind"))?;
    s.remove_pod(&b)
}

/// Port mappings (hostPort): a connection to the node's own address on the host port reaches the
/// pod's port from the node (nftables' output chain), from another pod (prerouting) and from the
/// pod itself (hairpin, masqueraded); other ports do not, the rule goes with the sandbox, and a
/// mapping without a port is refused.
fn host_ports(s: &mut Suite) -> R {
    let mapping = |host_port, container_port| runtime_api::PortMapping {
        protocol: runtime_api::Protocol::Tcp,
        container_port,
        host_port,
        host_ip: None,
    };
    let config = |name: &str, uid: &str, ports| SandboxConfig {
        name: name.into(),
        namespace: "default".into(),
        uid: uid.into(),
        port_mappings: ports,
        log_directory: Some(PathBuf::from(format!("{LOGS}/default_{name}_{uid}"))),
        ..Default::default()
    };
    let bad = s.client.run_sandbox(config(
        "hp-bad",
        "00000000-0000-4000-8000-0000000000f1",
        vec![mapping(0, 80)],
    ));
    ensure(
        matches!(&bad, Err(ClientError::Invalid(m)) if m.contains("invalid port mapping 0->80")),
        || format!("a mapping without a host port: {bad:?}"),
    )?;
    let sb = s
        .client
        .run_sandbox(config(
            "hp",
            "00000000-0000-4000-8000-0000000000f2",
            vec![mapping(30080, 8080)],
        ))
        .map_err(e("run sandbox"))?;
    s.container(
        &sb,
        "web",
        "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www",
        Resources::default(),
    )?;
    // The bridge's address is one of the node's own.
    let get = |port: u16| -> Result<String, std::io::Error> {
        let mut c = std::net::TcpStream::connect(("10.244.0.1", port))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        std::io::Write::write_all(&mut c, b"GET /index.html HTTP/1.0\r\n\r\n")?;
        let mut out = String::new();
        std::io::Read::read_to_string(&mut c, &mut out)?;
        Ok(out)
    };
    let t0 = Instant::now();
    let reply = loop {
        match get(30080) {
            Ok(r) => break r,
            Err(err) if t0.elapsed() > Duration::from_secs(20) => {
                return Err(format!("through host port 30080: {err}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    ensure(
        reply.starts_with("HTTP/1.") && reply.ends_with("\r\n\r\nok\n"),
        || format!("through host port 30080: {reply:?}"),
    )?;
    // From a container of the pod itself (hairpin, masqueraded) and from another pod.
    let client = s.sandbox("hp-client", PodResources::default(), false)?;
    // `; exit $?` keeps sh from exec-ing timeout: as PID 1 of the container, wget (busybox's
    // timeout execs the command and kills it from a child) would ignore the SIGTERM.
    let call = "timeout 10 wget -qO- http://10.244.0.1:30080/index.html; exit $?";
    for (pod, name) in [(&sb, "self"), (&client, "other")] {
        let c = s.container(pod, name, call, Resources::default())?;
        let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
        let log = log_text(st.log_path.as_deref().ok_or("log")?)?;
        ensure(st.exit_code == Some(0) && log == "ok\n", || {
            format!("{name} through host port 30080: {:?} {log:?}", st.exit_code)
        })?;
    }
    s.remove_pod(&client)?;
    let refused = |port| {
        get(port)
            .err()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    };
    ensure(refused(30081), || "port 30081 forwarded".into())?;
    s.remove_pod(&sb)?;
    ensure(refused(30080), || {
        "port 30080 still forwarded after the removal".into()
    })
}

fn share_process_namespace(s: &mut Suite) -> R {
    let sb = s.sandbox("shared-pid", PodResources::default(), true)?;
    let c = s.container(
        &sb,
        "a",
        "ps -o pid,args; ls /proc/1/root/ > /dev/null 2>&1 && echo PAUSE-ROOT-OPEN || echo PAUSE-ROOT-CLOSED; sleep 1000",
        Resources::default(),
    )?;
    let pause = sb.pause_pid.ok_or("no pause pid")?;
    // The pause is unprivileged (so a root container without CAP_SYS_PTRACE cannot reach its
    // mount namespace through /proc/1/root), and that namespace holds its read-only root and a
    // /dev, no /proc.
    let status = fs::read_to_string(format!("/proc/{pause}/status")).map_err(e("pause status"))?;
    ensure(
        status.lines().any(|l| {
            l.split_whitespace()
                .eq(["Uid:", "65535", "65535", "65535", "65535"])
        }) && status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        || format!("the pause runs privileged: {status}"),
    )?;
    let mounts = fs::read_to_string(format!("/proc/{pause}/mountinfo")).map_err(e("pause mounts"))?;
    let points: Vec<(&str, bool)> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.get(4)?, f.get(5)?.split(',').any(|o| o == "ro")))
        })
        .collect();
    ensure(points == [("/", true), ("/dev", false)], || {
        format!("the pause's mounts are not a read-only root and /dev: {mounts}")
    })?;
    ensure(ns(pid_of(&c)?, "pid")? == ns(pause, "pid")?, || {
        "container is not in the sandbox's pid ns".into()
    })?;
    // The script's last line, however slow the guest.
    let path = c.log_path.as_deref().ok_or("no log path")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut log = log_text(path)?;
    while !log.lines().any(|l| l.starts_with("PAUSE-ROOT-")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        log = log_text(path)?;
    }
    ensure(
        log.lines()
            .any(|l| l.trim_start().starts_with("1 ") && l.contains("/pause")),
        || format!("pause is not PID 1: {log}"),
    )?;
    // Whole lines: `ps` above shows the command, both words included.
    ensure(log.lines().any(|l| l == "PAUSE-ROOT-CLOSED"), || {
        format!("a root container reached the pause's root: {log}")
    })?;
    // A process its container's main process left behind outlives it in a shared pid
    // namespace (pause adopts it); removing the container ends it (libcontainer's delete
    // empties the container's cgroup).
    let b = s.container(&sb, "b", "sleep 1001 & exec sleep 1", Resources::default())?;
    s.wait_exit(&b.id, Duration::from_secs(30))?;
    ensure(processes_running("sleep 1001") == 1, || {
        "the left-behind process is not running".into()
    })?;
    s.client.remove_container(&b.id).map_err(e("remove container"))?;
    ensure(processes_running("sleep 1001") == 0, || {
        "the container's left-behind process outlived its removal".into()
    })?;
    s.remove_pod(&sb)
}

/// How many processes on the node run exactly `cmdline` (arguments joined by spaces).
fn processes_running(cmdline: &str) -> usize {
    let Ok(dir) = fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let args: Vec<&[u8]> = c.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            args.join(&b' ') == cmdline.as_bytes()
        })
        .count()
}

/// What the agent computes for a pod with this spec (kcore::qos): the pod slice's values and
/// each container's `oom_score_adj` on this node.
fn pod_values(spec: serde_json::Value, node_mem: u64) -> R<(PodResources, Vec<i32>)> {
    let pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
        .map_err(e("pod spec"))?;
    let cg = kcore::qos::pod_cgroup(&pod);
    let ooms = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| kcore::qos::container_oom_score_adj(&pod, c, node_mem))
        .collect();
    let qos = match cg.qos {
        kcore::qos::QosClass::Guaranteed => QosClass::Guaranteed,
        kcore::qos::QosClass::Burstable => QosClass::Burstable,
        kcore::qos::QosClass::BestEffort => QosClass::BestEffort,
    };
    Ok((
        PodResources {
            qos,
            cpu_request_milli: cg.cpu_request_milli,
            cpu_limit_milli: cg.cpu_limit_milli,
            memory_limit: cg.memory_limit,
        },
        ooms,
    ))
}

fn node_memory() -> R<u64> {
    let kib: u64 = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .ok_or("MemTotal")?;
    Ok(kib * 1024)
}

/// Every value of docs/SEEDS-SPEC.md §4.10 and §4.11 for one pod of each QoS class, from pod
/// specs through the agent's policy (kcore) to the files the runtime writes.
fn cgroup_values(s: &mut Suite) -> R {
    let node_mem = node_memory()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    check_cg(
        cgroups::KUBEPODS,
        "cpu.weight",
        &cgroups::slice_weight(cgroups::cpu_shares(cpus * 1000)).to_string(),
    )?;
    check_cg(
        cgroups::KUBEPODS,
        "memory.max",
        &kcore::allocatable::kubepods_memory_max(node_mem).to_string(),
    )?;
    let pid_max: u64 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .map_err(e("pid_max"))?
        .trim()
        .parse()
        .map_err(e("pid_max"))?;
    check_cg(
        cgroups::KUBEPODS,
        "pids.max",
        &kcore::allocatable::kubepods_pids_max(pid_max).to_string(),
    )?;
    check_cg("/kubepods.slice/kubepods-besteffort.slice", "cpu.weight", "1")?;
    check_cg("/kubepods.slice/kubepods-besteffort.slice", "memory.max", "max")?;

    // Burstable: the CoreDNS shape (100m, 70Mi request, 170Mi limit) and a second pod of 850m.
    let (pod, ooms) = pod_values(
        serde_json::json!({"containers": [{"name": "coredns", "image": "x", "resources": {
            "requests": {"cpu": "100m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}}}]}),
        node_mem,
    )?;
    ensure(pod.qos == QosClass::Burstable, || format!("{pod:?}"))?;
    let sb = s.sandbox("burstable", pod, false)?;
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "coredns".into(),
            image: s.image("busybox:1"),
            command: vec!["sleep".into(), "1000".into()],
            resources: Resources {
                cpu_request: Some(100),
                memory_request: Some(70 * MI),
                memory_limit: Some(170 * MI),
                ..Default::default()
            },
            oom_score_adj: ooms[0],
            ..Default::default()
        },
    )?;
    let (other, _) = pod_values(
        serde_json::json!({"containers": [{"name": "a", "image": "x", "resources": {"requests": {"cpu": "850m"}}}]}),
        node_mem,
    )?;
    let sb2 = s.sandbox("burstable2", other, false)?;
    check_cg("/kubepods.slice/kubepods-burstable.slice", "cpu.weight", "37")?; // 950m
    check_cg("/kubepods.slice/kubepods-burstable.slice", "memory.max", "max")?;
    ensure(
        sb.cgroup.starts_with(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod00000000_0000_4000_8000_",
        ),
        || sb.cgroup.clone(),
    )?;
    check_all(
        &sb.cgroup,
        &[
            ("cpu.weight", "4"),
            ("cpu.max", "max 100000"),
            ("memory.max", "178257920"),
            ("memory.oom.group", "0"),
            ("memory.high", "max"),
        ],
    )?;
    check_all(
        &c.cgroup,
        &[
            ("cpu.weight", "17"),
            ("cpu.max", "max 100000"),
            ("memory.max", "178257920"),
            ("memory.oom.group", "1"),
            ("memory.high", "max"),
        ],
    )?;
    let pause_scope = format!("{}/nodeos-{}.scope", sb.cgroup, sb.id);
    check_all(
        &pause_scope,
        &[
            ("cpu.weight", "1"),
            ("cpu.max", "max 100000"),
            ("memory.max", "max"),
            ("memory.oom.group", "0"),
            ("memory.high", "max"),
        ],
    )?;
    // NODE-45: 1000 - 1000 × request / node memory, within [3, 999].
    let want_adj = (1000 - (1000 * 70 * MI / node_mem) as i64)
        .clamp(3, 999)
        .to_string();
    ensure(oom_adj(pid_of(&c)?)? == want_adj, || {
        format!(
            "burstable oom_score_adj {} want {want_adj}",
            oom_adj(pid_of(&c).unwrap_or(0)).unwrap_or_default()
        )
    })?;
    ensure(oom_adj(sb.pause_pid.ok_or("pause")?)? == "-998", || {
        "pause oom_score_adj".into()
    })?;
    let procs = cg(&c.cgroup, "cgroup.procs")?;
    ensure(
        procs
            .lines()
            .any(|p| p == pid_of(&c).map(|x| x.to_string()).unwrap_or_default()),
        || format!("container pid not in its scope: {procs}"),
    )?;
    s.remove_pod(&sb2)?;
    check_cg("/kubepods.slice/kubepods-burstable.slice", "cpu.weight", "4")?; // 100m left
    s.remove_pod(&sb)?;

    // Guaranteed: 500m / 64Mi in two containers (requests as the API defaults them from limits,
    // one written as "0.5"/"64Mi" and the other as "500m"/"67108864": equal by value); the pod
    // slice sits under kubepods directly.
    let (pod, ooms) = pod_values(
        serde_json::json!({"containers": [
            {"name": "app", "image": "x", "resources": {"requests": {"cpu": "0.5", "memory": "64Mi"},
                                                        "limits": {"cpu": "500m", "memory": "67108864"}}},
            {"name": "b", "image": "x", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"},
                                                      "limits": {"cpu": "500m", "memory": "64Mi"}}}]}),
        node_mem,
    )?;
    ensure(pod.qos == QosClass::Guaranteed, || format!("{pod:?}"))?;
    let sb = s.sandbox("guaranteed", pod, false)?;
    ensure(sb.cgroup.starts_with("/kubepods.slice/kubepods-pod"), || {
        sb.cgroup.clone()
    })?;
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "app".into(),
            image: s.image("busybox:1"),
            command: vec!["sleep".into(), "1000".into()],
            resources: Resources {
                cpu_limit: Some(500),
                memory_limit: Some(64 * MI),
                ..Default::default()
            },
            oom_score_adj: ooms[0],
            ..Default::default()
        },
    )?;
    check_all(
        &sb.cgroup,
        &[
            (
                "cpu.weight",
                &*cgroups::slice_weight(cgroups::cpu_shares(1000)).to_string(),
            ),
            ("cpu.max", "100000 100000"),
            ("memory.max", "134217728"),
            ("memory.oom.group", "0"),
        ],
    )?;
    // 500m → shares 512 → the OCI runtimes' mapping gives 59.
    check_all(
        &c.cgroup,
        &[
            ("cpu.weight", "59"),
            ("cpu.max", "50000 100000"),
            ("memory.max", "67108864"),
            ("memory.oom.group", "1"),
        ],
    )?;
    ensure(oom_adj(pid_of(&c)?)? == "-997", || {
        "guaranteed oom_score_adj".into()
    })?;
    s.remove_pod(&sb)?;

    // BestEffort.
    let (pod, ooms) = pod_values(
        serde_json::json!({"containers": [{"name": "app", "image": "x"}]}),
        node_mem,
    )?;
    let sb = s.sandbox("besteffort", pod, false)?;
    ensure(
        sb.cgroup
            .starts_with("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"),
        || sb.cgroup.clone(),
    )?;
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "app".into(),
            image: s.image("busybox:1"),
            command: vec!["sleep".into(), "1000".into()],
            oom_score_adj: ooms[0],
            ..Default::default()
        },
    )?;
    check_all(
        &sb.cgroup,
        &[
            ("cpu.weight", "1"),
            ("cpu.max", "max 100000"),
            ("memory.max", "max"),
            ("memory.oom.group", "0"),
        ],
    )?;
    check_all(
        &c.cgroup,
        &[
            ("cpu.weight", "1"),
            ("cpu.max", "max 100000"),
            ("memory.max", "max"),
            ("memory.oom.group", "1"),
        ],
    )?;
    ensure(oom_adj(pid_of(&c)?)? == "1000", || {
        "besteffort oom_score_adj".into()
    })?;
    // libcontainer writes each new container's score into the runtime process before it forks;
    // the runtime keeps its own (the node daemons' −999) all the same.
    let own = oom_adj(runtime_pid()?)?;
    ensure(own == kcore::qos::NODE_DAEMON_OOM_SCORE_ADJ.to_string(), || {
        format!("the runtime's oom_score_adj is {own} after creating a BestEffort container")
    })?;
    s.remove_pod(&sb)
}

/// The runtime service's pid: the process running `<node binary> runtime` whose parent is
/// PID 1 (its forked pull helpers have the same command line).
fn runtime_pid() -> R<i32> {
    for entry in fs::read_dir("/proc").map_err(e("/proc"))?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let is_runtime = cmdline.split(|b| *b == 0).nth(1) == Some(b"runtime".as_slice());
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if is_runtime && status.lines().any(|l| l.split_whitespace().eq(["PPid:", "1"])) {
            return Ok(pid);
        }
    }
    Err("no runtime process".into())
}

fn oom_killed(s: &mut Suite) -> R {
    let r = Resources {
        memory_limit: Some(16 * MI),
        ..Default::default()
    };
    let (pod, _) = pod_values(
        serde_json::json!({"containers": [{"name": "hog", "image": "x", "resources": {
            "requests": {"memory": "16Mi"}, "limits": {"memory": "16Mi"}}}]}),
        node_memory()?,
    )?;
    let sb = s.sandbox("oom", pod, false)?;
    let c = s.container(
        &sb,
        "hog",
        "echo start; dd if=/dev/zero of=/dev/null bs=64M count=1; echo survived",
        r,
    )?;
    let st = s.wait_exit(&c.id, Duration::from_secs(60))?;
    ensure(
        st.exit_code == Some(137) && st.reason.as_deref() == Some("OOMKilled"),
        || format!("exit {:?} reason {:?}", st.exit_code, st.reason),
    )?;
    s.remove_pod(&sb)
}

/// RuntimeDefault inside real containers: this binary, mounted into a busybox container, makes
/// each probe call of `seccomp::probes` and prints its errno; with the default capabilities,
/// with SYS_ADMIN and SYS_PTRACE added (also through an exec, which gets its container's
/// profile), and unconfined (the kernel's own answers).
fn seccomp_blocked(s: &mut Suite) -> R {
    let sb = s.sandbox("seccomp", PodResources::default(), false)?;
    let exe = std::env::current_exe().map_err(e("this binary's path"))?;
    let probe_mount = vec![runtime_api::Mount {
        host_path: exe,
        container_path: "/probe".into(),
        read_only: true,
    }];
    let mut answers = Vec::new();
    for (name, profile, add) in [
        ("default", Profile::RuntimeDefault, Vec::new()),
        (
            "admin",
            Profile::RuntimeDefault,
            PROBE_ADMIN_CAPS.map(String::from).to_vec(),
        ),
        ("unconfined", Profile::Unconfined, Vec::new()),
    ] {
        let c = s.container_with(
            &sb,
            ContainerConfig {
                name: name.into(),
                image: s.image("busybox:1"),
                command: vec!["/probe".into(), "seccomp-probe".into()],
                seccomp: profile,
                capabilities_add: add,
                mounts: probe_mount.clone(),
                ..Default::default()
            },
        )?;
        let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
        answers.push((
            name,
            parse_probe(&log_text(st.log_path.as_deref().ok_or("log")?)?)?,
        ));
    }
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "admin-exec".into(),
            image: s.image("busybox:1"),
            command: vec!["sleep".into(), "1000".into()],
            capabilities_add: PROBE_ADMIN_CAPS.map(String::from).to_vec(),
            mounts: probe_mount,
            ..Default::default()
        },
    )?;
    let r = s
        .client
        .exec_sync(
            &c.id,
            vec!["/probe".into(), "seccomp-probe".into()],
            Some(Duration::from_secs(30)),
        )
        .map_err(e("exec probe"))?;
    answers.push(("admin exec", parse_probe(&String::from_utf8_lossy(&r.stdout))?));
    for (name, got) in &answers {
        let probes = seccomp::probes();
        ensure(got.len() == probes.len(), || {
            format!("{name}: {} answers for {} probes", got.len(), probes.len())
        })?;
        for (p, errno) in probes.iter().zip(got) {
            let want = match *name {
                "default" => Some(p.default),
                "admin" | "admin exec" => Some(p.admin),
                // Unconfined: no EPERM where the filter is the only thing that refuses.
                _ => match p.name {
                    "personality-no-randomize" => Some(0),
                    "unshare" | "clone-newuts" | "clone3" => Some(libc::EINVAL),
                    _ => None,
                },
            };
            if let Some(want) = want {
                ensure(*errno == want, || {
                    format!(
                        "{name}: {} ({}) answered errno {errno}, want {want}",
                        p.name, p.nr
                    )
                })?;
            }
        }
    }
    s.remove_pod(&sb)
}

/// The probe's answers: one errno per `name=errno` line, in order, before `probe-done`.
fn parse_probe(out: &str) -> R<Vec<i32>> {
    out.lines()
        .take_while(|l| *l != "probe-done")
        .filter_map(|l| l.split_once('='))
        .map(|(_, v)| {
            v.trim()
                .parse::<i32>()
                .map_err(|err| format!("probe line {v:?}: {err}"))
        })
        .collect()
}

/// The seccomp probe (inside a container): one `name=errno` line per probe, then `probe-done`.
fn seccomp_probe() {
    for (p, errno) in seccomp::run_probes() {
        println!("{}={errno}", p.name);
    }
    println!("probe-done");
}

/// `privileged: true`: every capability, no seccomp, no no_new_privs, writable /sys, nothing
/// masked under /proc, the node's devices; the same script in a plain container shows the
/// opposite.
fn privileged_containers(s: &mut Suite) -> R {
    let sb = s.sandbox("privileged", PodResources::default(), false)?;
    // A node device no container gets by default.
    let defaults = [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
    ];
    let devices = runtime::spec::host_devices(Path::new("/dev")).map_err(e("listing /dev"))?;
    let dev = devices
        .iter()
        .filter_map(|d| d["path"].as_str())
        .find(|p| !defaults.contains(p))
        .ok_or("the node has no device beyond the defaults")?
        .to_string();
    let script = format!(
        "grep -E '^(CapEff|Seccomp|NoNewPrivs):' /proc/self/status | tr -d '\\t'; \\
         grep ' /sys sysfs ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1; \\
         echo proc-submounts=$(grep -c ' /proc/' /proc/self/mountinfo); \\
         if [ -e {dev} ]; then echo device-present; else echo device-absent; fi"
    );
    let mut got = Vec::new();
    for privileged in [true, false] {
        let c = s.container_with(
            &sb,
            ContainerConfig {
                name: if privileged { "privileged" } else { "plain" }.into(),
                image: s.image("busybox:1"),
                command: vec!["sh".into(), "-c".into(), script.clone()],
                privileged,
                ..Default::default()
            },
        )?;
        let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
        got.push(log_text(st.log_path.as_deref().ok_or("log")?)?);
    }
    let want_privileged =
        "CapEff:000001ffffffffff\nNoNewPrivs:0\nSeccomp:0\nrw\nproc-submounts=0\ndevice-present\n";
    ensure(got[0] == want_privileged, || {
        format!("privileged ({dev}): {:?}", got[0])
    })?;
    let plain = &got[1];
    ensure(
        plain.starts_with("CapEff:00000000a00405fb\nNoNewPrivs:1\nSeccomp:2\nro\n")
            && !plain.contains("proc-submounts=0")
            && plain.ends_with("device-absent\n"),
        || format!("plain ({dev}): {plain:?}"),
    )?;
    s.remove_pod(&sb)
}

fn exit_codes_and_logs(s: &mut Suite) -> R {
    let sb = s.sandbox("exits", PodResources::default(), false)?;
    let c = s.container(
        &sb,
        "app",
        "echo out; echo err >&2; printf partial; exit 7",
        Resources::default(),
    )?;
    let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
    ensure(
        st.exit_code == Some(7) && st.reason.as_deref() == Some("Error") && st.signal.is_none(),
        || format!("{st:?}"),
    )?;
    ensure(st.started_at.is_some() && st.finished_at.is_some(), || {
        "timestamps".into()
    })?;
    let raw = fs::read_to_string(st.log_path.as_deref().ok_or("log")?).map_err(e("log"))?;
    ensure(
        raw.contains(" stdout F out\n")
            && raw.contains(" stderr F err\n")
            && raw.contains(" stdout P partial\n"),
        || raw.clone(),
    )?;
    let ok = s.container(&sb, "ok", "true", Resources::default())?;
    let st = s.wait_exit(&ok.id, Duration::from_secs(30))?;
    ensure(
        st.exit_code == Some(0) && st.reason.as_deref() == Some("Completed"),
        || format!("{st:?}"),
    )?;
    // An image that is not on the node, and a command that does not exist: clear errors.
    let err = s.client.create_container(
        &sb.id,
        ContainerConfig {
            name: "x".into(),
            image: s.image("nope:1"),
            ..Default::default()
        },
    );
    ensure(
        err.as_ref().is_err_and(|x| {
            x.kind() == ErrorKind::NotFound && x.to_string().contains("is not present on this node")
        }),
        || format!("{err:?}"),
    )?;
    s.remove_pod(&sb)
}

fn stop_grace(s: &mut Suite) -> R {
    let sb = s.sandbox("stop", PodResources::default(), false)?;
    let polite = s.container(
        &sb,
        "polite",
        "trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.1; done",
        Resources::default(),
    )?;
    let stubborn = s.container(
        &sb,
        "stubborn",
        "trap '' TERM; while true; do sleep 0.1; done",
        Resources::default(),
    )?;
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let st = s.client.stop_container(&polite.id, 30).map_err(e("stop"))?;
    ensure(
        st.exit_code == Some(0) && t0.elapsed() < Duration::from_secs(10),
        || format!("polite: {st:?} after {:?}", t0.elapsed()),
    )?;
    ensure(
        log_text(st.log_path.as_deref().ok_or("log")?)?.contains("got TERM"),
        || "no TERM in the log".into(),
    )?;
    let t0 = Instant::now();
    let st = s.client.stop_container(&stubborn.id, 1).map_err(e("stop"))?;
    let took = t0.elapsed();
    ensure(st.exit_code == Some(137) && st.signal == Some(9), || {
        format!("stubborn: {st:?}")
    })?;
    ensure(took >= Duration::from_millis(900), || {
        format!("SIGKILL came before the grace period: {took:?}")
    })?;
    s.remove_pod(&sb)
}

fn filesystem(s: &mut Suite) -> R {
    let sb = s.sandbox("fs", PodResources::default(), false)?;
    let c = s.container_with(&sb, ContainerConfig {
        name: "ro".into(),
        image: s.image("layered:1"),
        command: vec!["sh".into(), "-c".into(), "ls /data; ls /opaque; touch /x 2>/dev/null && echo WRITABLE || echo READONLY; wc -c < /proc/kcore; wc -c < /proc/cmdline; grep CapEff /proc/self/status; id -u".into()],
        read_only_root_filesystem: true,
        run_as_user: Some(0),
        ..Default::default()
    })?;
    let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
    let log = log_text(st.log_path.as_deref().ok_or("log")?)?;
    // /proc/kcore and /proc/cmdline are masked; CapEff: containerd's defaults without CAP_MKNOD
    // and CAP_NET_RAW.
    let want = [
        "keep",
        "new",
        "READONLY",
        "0",
        "0",
        "CapEff:\t00000000a00405fb",
        "0",
    ];
    let got: Vec<&str> = log.lines().collect();
    ensure(got == want, || format!("got {got:?}, want {want:?}"))?;
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "user".into(),
            image: s.image("busybox:1"),
            command: vec![
                "sh".into(),
                "-c".into(),
                "id -u; id -g; touch /x && echo WRITABLE".into(),
            ],
            run_as_user: Some(65534),
            ..Default::default()
        },
    )?;
    let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
    let log = log_text(st.log_path.as_deref().ok_or("log")?)?;
    ensure(
        log.lines().take(2).collect::<Vec<_>>() == ["65534", "65534"],
        || log.clone(),
    )?;
    // securityContext.capabilities: NET_RAW added back, CHOWN dropped (bit 0 off, bit 13 on).
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "caps".into(),
            image: s.image("busybox:1"),
            command: vec!["sh".into(), "-c".into(), "grep CapEff /proc/self/status".into()],
            run_as_user: Some(0),
            capabilities_add: vec!["NET_RAW".into()],
            capabilities_drop: vec!["chown".into()],
            ..Default::default()
        },
    )?;
    let st = s.wait_exit(&c.id, Duration::from_secs(30))?;
    let log = log_text(st.log_path.as_deref().ok_or("log")?)?;
    ensure(log.trim() == "CapEff:\t00000000a00425fa", || log.clone())?;
    // MKNOD cannot be granted (no device cgroup); an unknown name is refused.
    for (add, want) in [("MKNOD", "cannot be granted"), ("FLY", "unknown capability")] {
        let r = s.client.create_container(
            &sb.id,
            ContainerConfig {
                name: "nocaps".into(),
                image: s.image("busybox:1"),
                capabilities_add: vec![add.into()],
                ..Default::default()
            },
        );
        ensure(
            r.as_ref()
                .is_err_and(|x| x.kind() == ErrorKind::Invalid && x.to_string().contains(want)),
            || format!("{add}: {r:?}"),
        )?;
    }
    s.remove_pod(&sb)
}

fn hostile_images(s: &mut Suite) -> R {
    for (case, want) in [
        ("dotdot", "path contains '..'"),
        ("absolute", "absolute path"),
        ("symlink-escape", "goes through the symlink"),
        ("hardlink-escape", "hard link target"),
        ("device-node", "device nodes are not allowed"),
    ] {
        let r = s.pull(&format!("hostile/{case}:1"), PullPolicy::Always);
        ensure(
            r.as_ref()
                .is_err_and(|x| x.kind() == ErrorKind::Invalid && x.to_string().contains(want)),
            || format!("{case}: {r:?}"),
        )?;
    }
    ensure(!Path::new("/tmp/escaped").exists(), || {
        "a hostile layer wrote /tmp/escaped".into()
    })
}

/// The image requests: status, list, pull policies, removal refused while a container uses the
/// image, and two clients pulling one image at once.
fn images(s: &mut Suite) -> R {
    let busybox = s
        .client
        .image_status(&s.image("busybox:1"))
        .map_err(e("status"))?
        .ok_or("busybox:1 not present")?;
    ensure(
        busybox.digest.starts_with("sha256:") && busybox.id.starts_with("sha256:") && busybox.size > 0,
        || format!("{busybox:?}"),
    )?;
    let missing = s.client.image_status(&s.image("nope:1")).map_err(e("status"))?;
    ensure(missing.is_none(), || format!("{missing:?}"))?;
    let bad = s.client.image_status("Not A Reference");
    ensure(
        bad.as_ref().is_err_and(|x| x.kind() == ErrorKind::Invalid),
        || format!("{bad:?}"),
    )?;
    let listed = s.client.list_images().map_err(e("list"))?;
    ensure(listed.contains(&busybox), || format!("{listed:?}"))?;
    let never = s.pull("nope:1", PullPolicy::Never);
    ensure(
        never.as_ref().is_err_and(|x| x.kind() == ErrorKind::NotFound),
        || format!("{never:?}"),
    )?;
    let absent = s.pull("nope:1", PullPolicy::IfNotPresent);
    ensure(
        absent.as_ref().is_err_and(|x| x.kind() == ErrorKind::NotFound),
        || format!("a tag the registry does not have: {absent:?}"),
    )?;
    let present = s.pull("busybox:1", PullPolicy::Never).map_err(e("pull Never"))?;
    ensure(present == busybox, || format!("{present:?}"))?;

    let sb = s.sandbox("images", PodResources::default(), false)?;
    let c = s.container(&sb, "app", "sleep 1000", Resources::default())?;
    let in_use = s.client.remove_image(&s.image("busybox:1"));
    ensure(
        in_use.as_ref().is_err_and(|x| x.kind() == ErrorKind::Conflict),
        || format!("removed an image in use: {in_use:?}"),
    )?;
    s.client.remove_container(&c.id).map_err(e("remove container"))?;
    s.remove_pod(&sb)?;

    // layered:1 is used by no container now: removed, gone, pulled again by two clients at once.
    s.client
        .remove_image(&s.image("layered:1"))
        .map_err(e("remove"))?;
    let gone = s
        .client
        .image_status(&s.image("layered:1"))
        .map_err(e("status"))?;
    ensure(gone.is_none(), || format!("still there: {gone:?}"))?;
    s.client
        .remove_image(&s.image("layered:1"))
        .map_err(e("removing twice"))?;
    let (registry, image) = (s.registry.clone(), s.image("layered:1"));
    let other = std::thread::spawn(move || {
        let mut c = Client::connect(Path::new(runtime_api::SOCKET))?;
        c.pull_image(&image, PullPolicy::IfNotPresent, None, vec![registry])
    });
    let t0 = Instant::now();
    let mine = s.pull("layered:1", PullPolicy::IfNotPresent).map_err(e("pull"))?;
    let theirs = other
        .join()
        .map_err(|_| "pull thread panicked".to_string())?
        .map_err(e("concurrent pull"))?;
    ensure(mine == theirs, || format!("{mine:?} vs {theirs:?}"))?;
    println!(
        "SUITE info images: layered:1 pulled again in {} ms",
        t0.elapsed().as_millis()
    );
    // Meanwhile the runtime kept answering: a pull runs outside its loop.
    s.client.version().map_err(e("version"))?;
    Ok(())
}

/// `ExecSync`: exit code and both streams captured, output capped, timeout, wrong targets.
fn exec_sync(s: &mut Suite) -> R {
    let sb = s.sandbox("exec-sync", PodResources::default(), false)?;
    let c = s.container(&sb, "app", "sleep 1000", Resources::default())?;
    let sh = |script: &str| vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    let r = s
        .client
        .exec_sync(
            &c.id,
            sh("echo out; echo err >&2; exit 7"),
            Some(Duration::from_secs(10)),
        )
        .map_err(e("exec sync"))?;
    ensure(
        r.exit_code == 7 && r.stdout == b"out\n" && r.stderr == b"err\n",
        || format!("{r:?}"),
    )?;
    // An exec runs at its container's oom_score_adj, not at the runtime's −999.
    let adj = s
        .client
        .exec_sync(&c.id, sh("cat /proc/self/oom_score_adj"), None)
        .map_err(e("exec sync oom_score_adj"))?;
    let want = format!("{}\n", oom_adj(pid_of(&c)?)?);
    ensure(adj.stdout == want.as_bytes() && want != "-999\n", || {
        format!(
            "exec oom_score_adj {:?}, container {want:?}",
            String::from_utf8_lossy(&adj.stdout)
        )
    })?;
    let big = s
        .client
        .exec_sync(&c.id, sh("head -c 3000000 /dev/zero"), None)
        .map_err(e("exec sync big"))?;
    ensure(
        big.exit_code == 0 && big.stdout.len() == runtime_api::ExecSyncResult::MAX_OUTPUT,
        || format!("exit {} with {} bytes", big.exit_code, big.stdout.len()),
    )?;
    let t0 = Instant::now();
    let slow = s
        .client
        .exec_sync(&c.id, sh("sleep 30"), Some(Duration::from_secs(1)));
    let took = t0.elapsed();
    ensure(
        slow.as_ref()
            .is_err_and(|x| x.kind() == ErrorKind::DeadlineExceeded)
            && took >= Duration::from_secs(1)
            && took < Duration::from_secs(10),
        || format!("{slow:?} after {took:?}"),
    )?;
    let missing = s.client.exec_sync("nope", sh("true"), None);
    ensure(
        missing.as_ref().is_err_and(|x| x.kind() == ErrorKind::NotFound),
        || format!("{missing:?}"),
    )?;
    let done = s.container(&sb, "done", "true", Resources::default())?;
    s.wait_exit(&done.id, Duration::from_secs(30))?;
    let exited = s.client.exec_sync(&done.id, sh("true"), None);
    ensure(
        exited.as_ref().is_err_and(|x| x.kind() == ErrorKind::Conflict),
        || format!("{exited:?}"),
    )?;
    s.remove_pod(&sb)
}

/// `ContainerStats`/`PodStats`: cumulative CPU, a rate from two samples, the working set, the
/// pod's interface.
fn stats(s: &mut Suite) -> R {
    let sb = s.sandbox("stats", PodResources::default(), false)?;
    let busy = s.container(&sb, "busy", "while :; do :; done", Resources::default())?;
    let first = s.client.container_stats(&busy.id).map_err(e("stats"))?;
    std::thread::sleep(Duration::from_millis(1500));
    let second = s.client.container_stats(&busy.id).map_err(e("stats"))?;
    ensure(
        second.cpu.usage_core_nano_seconds > first.cpu.usage_core_nano_seconds
            && second.cpu.usage_nano_cores.is_some_and(|n| n > 100_000_000),
        || format!("cpu {:?} then {:?}", first.cpu, second.cpu),
    )?;
    ensure(
        second.memory.working_set_bytes > 0 && second.memory.usage_bytes >= second.memory.working_set_bytes,
        || format!("{:?}", second.memory),
    )?;
    let pod = s.client.pod_stats(&sb.id, false).map_err(e("pod stats"))?;
    ensure(
        pod.containers.len() == 1
            && pod.containers[0].name == "busy"
            && pod.cpu.usage_core_nano_seconds >= second.cpu.usage_core_nano_seconds
            && pod.network.as_ref().is_some_and(|n| n.interface == "eth0"),
        || format!("{pod:?}"),
    )?;
    let all = s.client.list_pod_stats().map_err(e("list pod stats"))?;
    ensure(all.iter().any(|p| p.sandbox_id == sb.id), || format!("{all:?}"))?;
    let missing = s.client.container_stats("nope");
    ensure(
        missing.as_ref().is_err_and(|x| x.kind() == ErrorKind::NotFound),
        || format!("{missing:?}"),
    )?;
    s.remove_pod(&sb)
}

fn exec(s: &mut Suite) -> R {
    let sb = s.sandbox("exec", PodResources::default(), false)?;
    let c = s.container(&sb, "app", "sleep 1000", Resources::default())?;
    // Pipes.
    let (in_r, in_w) = nix::unistd::pipe().map_err(e("pipe"))?;
    let (out_r, out_w) = nix::unistd::pipe().map_err(e("pipe"))?;
    nix::unistd::write(&in_w, b"from-stdin\n").map_err(e("write"))?;
    drop(in_w);
    let id = s
        .client
        .exec(
            &c.id,
            vec![
                "sh".into(),
                "-c".into(),
                "hostname; read l; echo got:$l; echo e >&2; exit 3".into(),
            ],
            [in_r.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()],
        )
        .map_err(e("exec"))?;
    drop((in_r, out_w));
    let code = s.client.wait_exec(&id).map_err(e("wait exec"))?;
    let mut out = String::new();
    fs::File::from(out_r)
        .read_to_string(&mut out)
        .map_err(e("read"))?;
    ensure(code == 3 && out == "exec\ngot:from-stdin\ne\n", || {
        format!("exit {code}, output {out:?}")
    })?;
    // A terminal, with a window size set from outside.
    let pty = nix::pty::openpty(None, None).map_err(e("openpty"))?;
    runtime_api::pty::set_window_size(pty.master.as_fd(), 100, 40).map_err(e("TIOCSWINSZ"))?;
    let slave = pty.slave.as_raw_fd();
    let id = s
        .client
        .exec(
            &c.id,
            vec![
                "sh".into(),
                "-c".into(),
                "test -t 0 && echo TTY; stty size".into(),
            ],
            [slave, slave, slave],
        )
        .map_err(e("exec tty"))?;
    drop(pty.slave);
    let code = s.client.wait_exec(&id).map_err(e("wait exec"))?;
    // The two lines may arrive in separate reads of the terminal: read until both are there,
    // the terminal is closed, or 10 s have passed.
    let mut buf = vec![0u8; 4096];
    let mut out = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.matches('\n').count() < 2 && Instant::now() < deadline {
        let mut ready = [nix::poll::PollFd::new(
            pty.master.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        if nix::poll::poll(&mut ready, nix::poll::PollTimeout::from(500u16)).map_err(e("poll pty"))? == 0 {
            continue;
        }
        match nix::unistd::read(pty.master.as_raw_fd(), &mut buf) {
            Ok(0) | Err(nix::errno::Errno::EIO) => break,
            Ok(n) => out.push_str(&String::from_utf8_lossy(&buf[..n]).replace('\r', "")),
            Err(err) => return Err(format!("read pty: {err}")),
        }
    }
    ensure(code == 0 && out == "TTY\n40 100\n", || {
        format!("tty exec: exit {code}, output {out:?}")
    })?;
    let err = s.client.exec("nope", vec!["true".into()], [0, 1, 2]);
    ensure(err.is_err(), || "exec into a missing container succeeded".into())?;
    s.remove_pod(&sb)
}

/// `Attach`: a `stdinOnce` container's stdin pipe goes to the first client only and its close is
/// the container's EOF; a terminal container's master takes input and window sizes, and the
/// process has it as its controlling terminal; a container joins a target's pid namespace.
fn attach_input(s: &mut Suite) -> R {
    let sb = s.sandbox("attach", PodResources::default(), false)?;
    let image = s.image("busybox:1");
    let piped = s.container_with(
        &sb,
        ContainerConfig {
            name: "piped".into(),
            image: image.clone(),
            command: vec!["sh".into(), "-c".into(), "cat; echo eof".into()],
            stdin: true,
            stdin_once: true,
            ..Default::default()
        },
    )?;
    let first = s.client.attach(&piped.id).map_err(e("attach"))?;
    let second = s.client.attach(&piped.id).map_err(e("attach again"))?;
    ensure(
        !first.tty && first.input.is_some() && second.input.is_none(),
        || format!("stdinOnce: {first:?} then {second:?}"),
    )?;
    let input = first.input.ok_or("no input")?;
    nix::unistd::write(&input, b"hello\n").map_err(e("write"))?;
    drop(input);
    let st = s.wait_exit(&piped.id, Duration::from_secs(30))?;
    let text = log_text(&st.log_path.clone().ok_or("log")?)?;
    ensure(text == "hello\neof\n", || format!("stdin pipe: {text:?}"))?;
    let over = s.client.attach(&piped.id);
    ensure(
        over.as_ref().is_err_and(|x| x.kind() == ErrorKind::Conflict),
        || format!("attach to an exited container: {over:?}"),
    )?;

    let term = s.container_with(
        &sb,
        ContainerConfig {
            name: "term".into(),
            image: image.clone(),
            command: vec![
                "sh".into(),
                "-c".into(),
                "read l; echo got-$l; tty; stty size; awk '{print ($7 != 0 && $8 != -1) ? \"ctty\" : \"none\"}' /proc/1/stat".into(),
            ],
            stdin: true,
            tty: true,
            ..Default::default()
        },
    )?;
    let a = s.client.attach(&term.id).map_err(e("attach tty"))?;
    let master = a.input.ok_or("no terminal")?;
    ensure(a.tty, || "not a terminal".into())?;
    runtime_api::pty::set_window_size(master.as_fd(), 100, 40).map_err(e("TIOCSWINSZ"))?;
    nix::unistd::write(&master, b"abc\n").map_err(e("write tty"))?;
    let st = s.wait_exit(&term.id, Duration::from_secs(30))?;
    let text = log_text(&st.log_path.clone().ok_or("log")?)?.replace('\r', "");
    // The terminal echoes the input, and it is the process's controlling terminal (a tty
    // number and a foreground process group in /proc/1/stat).
    ensure(text.contains("abc\ngot-abc\n/dev/pts/0\n40 100\nctty\n"), || {
        format!("terminal: {text:?}")
    })?;

    let target = s.container(&sb, "target", "exec sleep 1001", Resources::default())?;
    let peek = s.container_with(
        &sb,
        ContainerConfig {
            name: "peek".into(),
            image,
            command: vec!["ps".into(), "-o".into(), "pid,args".into()],
            target_container_id: Some(target.id.clone()),
            ..Default::default()
        },
    )?;
    let st = s.wait_exit(&peek.id, Duration::from_secs(30))?;
    let text = log_text(&st.log_path.clone().ok_or("log")?)?;
    ensure(text.contains("    1 sleep 1001"), || {
        format!("target pid namespace: {text:?}")
    })?;
    let other = s.sandbox("attach-other", PodResources::default(), false)?;
    let bad = s.client.create_container(
        &other.id,
        ContainerConfig {
            name: "peek".into(),
            image: s.image("busybox:1"),
            target_container_id: Some(target.id.clone()),
            ..Default::default()
        },
    );
    ensure(
        bad.as_ref().is_err_and(|x| x.kind() == ErrorKind::Invalid),
        || format!("a target in another sandbox: {bad:?}"),
    )?;
    s.remove_pod(&other)?;
    s.remove_pod(&sb)
}

fn log_rotation(s: &mut Suite) -> R {
    let sb = s.sandbox("logs", PodResources::default(), false)?;
    let c = s.container_with(
        &sb,
        ContainerConfig {
            name: "chatty".into(),
            image: s.image("busybox:1"),
            command: vec![
                "sh".into(),
                "-c".into(),
                "i=0; while [ $i -lt 400 ]; do echo line-$i; i=$((i+1)); done".into(),
            ],
            log_max_size: Some(2048),
            log_max_files: Some(3),
            ..Default::default()
        },
    )?;
    let st = s.wait_exit(&c.id, Duration::from_secs(60))?;
    let path = st.log_path.clone().ok_or("log")?;
    let rotated = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
    ensure(
        rotated(1).exists() && rotated(2).exists() && !rotated(3).exists(),
        || "expected exactly 3 files".into(),
    )?;
    for p in [path.clone(), rotated(1), rotated(2)] {
        let len = fs::metadata(&p).map_err(e("meta"))?.len();
        ensure(len <= 2048, || format!("{} is {len} bytes", p.display()))?;
    }
    let last = log_text(&path)?;
    ensure(last.ends_with("line-399\n"), || {
        format!("newest file does not end with the last line: {last:?}")
    })?;
    let older = log_text(&rotated(1))?;
    let first_new: u32 = last
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("line-")?.parse().ok())
        .ok_or("parse")?;
    let last_old: u32 = older
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("line-")?.parse().ok())
        .ok_or("parse")?;
    ensure(last_old + 1 == first_new, || {
        format!("rotation lost lines between {last_old} and {first_new}")
    })?;
    s.remove_pod(&sb)
}

fn sandbox_lost(s: &mut Suite) -> R {
    let sb = s.sandbox("lost", PodResources::default(), false)?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sb.pause_pid.ok_or("pid")?),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(e("kill"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = s.client.list_sandboxes().map_err(e("list"))?;
        let me = l.iter().find(|x| x.id == sb.id).ok_or("sandbox vanished")?;
        if !me.ready {
            break;
        }
        ensure(Instant::now() < deadline, || {
            "sandbox still ready after its pause process died".into()
        })?;
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = s.client.create_container(
        &sb.id,
        ContainerConfig {
            name: "x".into(),
            image: s.image("busybox:1"),
            ..Default::default()
        },
    );
    ensure(
        err.is_err_and(|x| x.kind() == ErrorKind::Conflict && x.to_string().contains("is not ready")),
        || "created a container in a lost sandbox".into(),
    )?;
    s.remove_pod(&sb)
}

const READOPT_FILE: &str = "/run/readopt.ids";

/// Child process: creates a pod, writes "sandbox container pid", exits without cleaning up.
fn readopt_child(registry: &str) -> R {
    let client = Client::connect_wait(Path::new(runtime_api::SOCKET), Duration::from_secs(30))
        .map_err(e("connect"))?;
    let mut s = Suite {
        registry: registry.into(),
        client,
        pods: 900,
    };
    let sb = s.sandbox("readopt", PodResources::default(), false)?;
    let c = s.container(&sb, "app", "sleep 1000", Resources::default())?;
    fs::write(READOPT_FILE, format!("{} {} {}", sb.id, c.id, pid_of(&c)?)).map_err(e("write ids"))
}

fn readopt(s: &mut Suite) -> R {
    let me = std::env::current_exe().map_err(e("current_exe"))?;
    let st = std::process::Command::new(me)
        .args(["readopt-child", &s.registry])
        .status()
        .map_err(e("spawn child"))?;
    ensure(st.success(), || format!("child client failed: {st}"))?;
    let ids = fs::read_to_string(READOPT_FILE).map_err(e("ids"))?;
    let v: Vec<&str> = ids.split_whitespace().collect();
    ensure(v.len() == 3, || ids.clone())?;
    // A new client (the agent restarted) finds the pod running, same process.
    let mut fresh = Client::connect(Path::new(runtime_api::SOCKET)).map_err(e("connect"))?;
    let sbs = fresh.list_sandboxes().map_err(e("list"))?;
    let sb = sbs.iter().find(|x| x.id == v[0]).ok_or("sandbox not listed")?;
    ensure(sb.ready, || "sandbox not ready".into())?;
    let cs = fresh.list_containers().map_err(e("list"))?;
    let c = cs.iter().find(|x| x.id == v[1]).ok_or("container not listed")?;
    ensure(
        c.state == State::Running && c.pid.map(|p| p.to_string()).as_deref() == Some(v[2]),
        || format!("{c:?}"),
    )?;
    ensure(Path::new(&format!("/proc/{}", v[2])).exists(), || {
        "process gone".into()
    })?;
    let st = fresh.stop_container(&c.id, 0).map_err(e("stop"))?;
    ensure(st.exit_code == Some(137), || format!("{st:?}"))?;
    fresh.remove_sandbox(&sb.id).map_err(e("remove"))
}

/// The runtime process itself is killed (-9) and restarted by PID 1: its containers keep their
/// processes, their output still reaches their logs, their stdin pipes and terminals still take
/// input, a `stdinOnce` input taken before the crash still ends in EOF when its client closes,
/// and their exit codes are known (PID 1 records them).
fn runtime_restart(s: &mut Suite) -> R {
    let sb = s.sandbox("rt-restart", PodResources::default(), false)?;
    let image = s.image("busybox:1");
    let with = |name: &str, script: &str, stdin: bool, stdin_once: bool, tty: bool| ContainerConfig {
        name: name.into(),
        image: image.clone(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        stdin,
        stdin_once,
        tty,
        ..Default::default()
    };
    let ticker = s.container_with(
        &sb,
        with(
            "ticker",
            "i=0; while true; do echo tick $i; echo err $i >&2; i=$((i+1)); sleep 0.2; done",
            false,
            false,
            false,
        ),
    )?;
    let reader = s.container_with(
        &sb,
        with(
            "reader",
            "while read l; do echo got-$l; done; echo eof",
            true,
            false,
            false,
        ),
    )?;
    let once = s.container_with(&sb, with("once", "cat; echo eof", true, true, false))?;
    let term = s.container_with(
        &sb,
        with("term", "while read l; do echo tty-$l; done", true, false, true),
    )?;
    let once_in = s
        .client
        .attach(&once.id)
        .map_err(e("attach once"))?
        .input
        .ok_or("once: no input")?;
    nix::unistd::write(&once_in, b"one\n").map_err(e("write once"))?;
    let reader_in = s
        .client
        .attach(&reader.id)
        .map_err(e("attach reader"))?
        .input
        .ok_or("reader: no input")?;
    nix::unistd::write(&reader_in, b"before\n").map_err(e("write reader"))?;
    drop(reader_in);
    let log = |c: &ContainerStatus| -> R<String> { log_text(c.log_path.as_deref().ok_or("no log path")?) };
    wait_until(Duration::from_secs(20), || {
        Ok(log(&reader)?.contains("got-before\n")
            && log(&once)?.contains("one\n")
            && log(&ticker)?.contains("tick 3\n"))
    })
    .map_err(|m| format!("before the restart: {m}"))?;

    let pid = ticker.pid.ok_or("ticker: no pid")?;
    let runtime_pid = parent_of(pid)?;
    let ticks = log(&ticker)?.matches("tick ").count();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runtime_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(e("kill the runtime"))?;
    // PID 1 starts it again (100 ms back-off); the old socket answers nothing meanwhile.
    let t0 = Instant::now();
    s.client = loop {
        match Client::connect(Path::new(runtime_api::SOCKET)).and_then(|mut c| c.list_containers().map(|_| c))
        {
            Ok(c) if parent_of(pid)? != runtime_pid => break c,
            _ if t0.elapsed() > Duration::from_secs(30) => {
                return Err("the runtime did not come back in 30 s".into());
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let listed = s.client.list_containers().map_err(e("list"))?;
    for c in [&ticker, &reader, &once, &term] {
        let now = listed
            .iter()
            .find(|x| x.id == c.id)
            .ok_or_else(|| format!("{} not listed", c.name))?;
        ensure(now.state == State::Running && now.pid == c.pid, || {
            format!("{} after the restart: {now:?} (was pid {:?})", c.name, c.pid)
        })?;
    }
    // Output goes on into the same logs (the ticker would have died of EPIPE otherwise).
    wait_until(Duration::from_secs(20), || {
        Ok(log(&ticker)?.matches("tick ").count() >= ticks + 5)
    })
    .map_err(|m| format!("ticker's output after the restart: {m}"))?;
    ensure(log(&ticker)?.contains(&format!("err {}\n", ticks + 2)), || {
        "stderr after the restart".into()
    })?;
    let reader_in = s
        .client
        .attach(&reader.id)
        .map_err(e("attach reader"))?
        .input
        .ok_or("reader: no input after the restart")?;
    nix::unistd::write(&reader_in, b"after\n").map_err(e("write reader"))?;
    let a = s.client.attach(&term.id).map_err(e("attach term"))?;
    ensure(a.tty, || "term: not a terminal after the restart".into())?;
    let master = a.input.ok_or("term: no input after the restart")?;
    nix::unistd::write(&master, b"x42\n").map_err(e("write term"))?;
    // The stdinOnce input taken before the crash: its close is still the container's EOF.
    nix::unistd::write(&once_in, b"two\n").map_err(e("write once"))?;
    drop(once_in);
    let st = s.wait_exit(&once.id, Duration::from_secs(30))?;
    let text = log(&st)?;
    ensure(text == "one\ntwo\neof\n", || {
        format!("stdinOnce across the restart: {text:?}")
    })?;
    wait_until(Duration::from_secs(20), || {
        Ok(log(&reader)?.contains("got-after\n") && log(&term)?.contains("tty-x42"))
    })
    .map_err(|m| format!("input after the restart: {m}"))?;
    ensure(!log(&reader)?.contains("eof"), || "the reader saw EOF".into())?;
    // Exits of re-adopted containers (PID 1 reaps them now and records how they ended).
    ensure(
        st.exit_code == Some(0) && st.reason.as_deref() == Some("Completed"),
        || format!("exit of a re-adopted container: {st:?}"),
    )?;
    let stopped = s.client.stop_container(&ticker.id, 0).map_err(e("stop ticker"))?;
    ensure(
        stopped.exit_code == Some(137) && stopped.signal == Some(9),
        || format!("a re-adopted container killed: {stopped:?}"),
    )?;
    s.remove_pod(&sb)
}

/// Polls `cond` every 100 ms until it holds; the error says what was last seen if it never did.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> R<bool>) -> R {
    let t0 = Instant::now();
    loop {
        match cond() {
            Ok(true) => return Ok(()),
            r if t0.elapsed() > limit => return Err(format!("not within {limit:?} ({r:?})")),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The parent pid of `pid` (field 4 of /proc/<pid>/stat).
fn parent_of(pid: i32) -> R<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).map_err(e("stat"))?;
    let rest = &stat[stat.rfind(')').ok_or("stat")? + 1..];
    rest.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("stat: {stat:?}"))
}

/// 100 pods created and deleted; nothing may be left behind.
fn cycles(s: &mut Suite) -> R {
    let before = leftovers()?;
    let t0 = Instant::now();
    for i in 0..100 {
        let sb = s.sandbox(&format!("cycle-{i}"), PodResources::default(), false)?;
        let c = s.container(&sb, "app", "true", Resources::default())?;
        s.wait_exit(&c.id, Duration::from_secs(30))?;
        s.remove_pod(&sb)?;
    }
    println!("SUITE info cycles: 100 pods in {} ms", t0.elapsed().as_millis());
    let after = leftovers()?;
    ensure(before == after, || {
        format!("left behind: before {before:?} after {after:?}")
    })
}

/// Pod cgroups, runtime mounts, network namespaces, interfaces and state entries on the node.
fn leftovers() -> R<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for qos in [
        "kubepods.slice",
        "kubepods.slice/kubepods-burstable.slice",
        "kubepods.slice/kubepods-besteffort.slice",
    ] {
        for e in fs::read_dir(Path::new(cgroups::CGROUP_ROOT).join(qos))
            .map_err(e("cgroups"))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() && n.contains("-pod") {
                out.insert(format!("cgroup {qos}/{n}"));
            }
        }
    }
    for l in fs::read_to_string("/proc/self/mountinfo")
        .map_err(e("mountinfo"))?
        .lines()
    {
        if let Some(m) = l.split_whitespace().nth(4)
            && m.starts_with("/run/nodeos/runtime/")
        {
            out.insert(format!("mount {m}"));
        }
    }
    for d in [
        "/run/nodeos/runtime/sandboxes",
        "/run/nodeos/runtime/containers",
        "/run/nodeos/runtime/youki",
    ] {
        for e in fs::read_dir(d).map_err(e("state"))?.flatten() {
            out.insert(format!("state {}", e.path().display()));
        }
    }
    let mut netns = BTreeSet::new();
    for e in fs::read_dir("/proc").map_err(e("proc"))?.flatten() {
        if let Ok(l) = fs::read_link(e.path().join("ns/net")) {
            netns.insert(l.display().to_string());
        }
    }
    out.insert(format!("netns count {}", netns.len()));
    for e in fs::read_dir("/sys/class/net").map_err(e("net"))?.flatten() {
        out.insert(format!("link {}", e.file_name().to_string_lossy()));
    }
    Ok(out)
}

fn main() {
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("seccomp-probe") {
        seccomp_probe();
        return;
    }
    if args.get(1).map(String::as_str) == Some("readopt-child") {
        let r = readopt_child(args.get(2).map(String::as_str).unwrap_or(""));
        if let Err(err) = &r {
            println!("readopt child: {err}");
        }
        std::process::exit(i32::from(r.is_err()));
    }
    let mut registry = String::new();
    let mut only: Option<Vec<String>> = None;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--registry" => registry = it.next().cloned().unwrap_or_default(),
            "--only" => only = it.next().map(|v| v.split(',').map(str::to_string).collect()),
            other => {
                println!("SUITE FAIL usage: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let t0 = Instant::now();
    let client = match Client::connect_wait(Path::new(runtime_api::SOCKET), Duration::from_secs(60)) {
        Ok(c) => c,
        Err(err) => {
            println!("SUITE FAIL setup: {err}");
            std::process::exit(1);
        }
    };
    let mut s = Suite {
        registry,
        client,
        pods: 0,
    };
    for img in ["busybox:1", "layered:1"] {
        match s.pull(img, PullPolicy::Always) {
            Ok(image) => println!(
                "SUITE info pulled {} ({}, {} bytes) at {} ms",
                image.reference,
                image.digest,
                image.size,
                t0.elapsed().as_millis()
            ),
            Err(err) => {
                println!("SUITE FAIL setup: pull {img}: {err}");
                std::process::exit(1);
            }
        }
    }
    type Case = fn(&mut Suite) -> R;
    let cases: Vec<(&str, Case)> = vec![
        ("hostile_images", hostile_images),
        ("namespaces", namespaces),
        ("pod_network", pod_network),
        ("host_ports", host_ports),
        ("host_namespaces", host_namespaces),
        ("share_process_namespace", share_process_namespace),
        ("cgroup_values", cgroup_values),
        ("oom_killed", oom_killed),
        ("seccomp_blocked", seccomp_blocked),
        ("privileged_containers", privileged_containers),
        ("exit_codes_and_logs", exit_codes_and_logs),
        ("stop_grace", stop_grace),
        ("filesystem", filesystem),
        ("images", images),
        ("exec", exec),
        ("attach_input", attach_input),
        ("exec_sync", exec_sync),
        ("stats", stats),
        ("log_rotation", log_rotation),
        ("sandbox_lost", sandbox_lost),
        ("readopt", readopt),
        ("runtime_restart", runtime_restart),
        ("cycles", cycles),
    ];
    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let (mut passed, mut failed) = (0, 0);
    let mut report = |name: &str, r: R, ms: u128| match r {
        Ok(()) => {
            passed += 1;
            println!("SUITE ok {name} ({ms} ms)");
        }
        Err(err) => {
            failed += 1;
            println!("SUITE FAIL {name}: {err}");
        }
    };
    for (name, f) in cases {
        if wanted(name) {
            let t = Instant::now();
            let r = f(&mut s);
            report(name, r, t.elapsed().as_millis());
        }
    }
    println!(
        "SUITE done passed={passed} failed={failed} ms={}",
        t0.elapsed().as_millis()
    );
    std::process::exit(i32::from(failed > 0));
}
