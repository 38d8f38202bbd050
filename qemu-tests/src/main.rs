//! `nodeos-vm`: boots node images for `./build.sh run`, `./build.sh cluster` and the VM
//! benchmarks; carries the guest-forward relay and the LAN switch of local clusters.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use qemu_tests::cluster::ControlPlane;
use qemu_tests::devcluster;
use qemu_tests::vm::{Arch, VmConfig, VmFactory, field_u64, out_dir};

const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

fn usage() -> ! {
    eprintln!(
        "usage: nodeos-vm run [--arch x86_64|aarch64] [--uefi] [--stay]\n       nodeos-vm bench-boot [--runs N] [--arch ARCH|all] --json FILE\n       nodeos-vm bench-runtime [--runs N] [--arch ARCH|all] --json FILE\n       nodeos-vm bench-pods [--runs N] --json FILE\n       nodeos-vm cluster up [--nodes N] [--arch x86_64|aarch64|mixed] [--data-dir D] [--memory MIB]\n       nodeos-vm cluster down|status [--data-dir D]\n       nodeos-vm cluster node NAME poweroff|kill|start [--data-dir D]\n       nodeos-vm switch --listen PORT --peer PORT..."
    );
    std::process::exit(2)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    match args.first().map(String::as_str) {
        Some("run") => run(
            Arch::parse(&value("--arch").unwrap_or_else(|| "x86_64".into()))?,
            flag("--uefi"),
            flag("--stay"),
        ),
        Some("relay") => relay(args.get(1).map(String::as_str).unwrap_or_else(|| usage())),
        Some("cluster") => {
            let data_dir = value("--data-dir")
                .map(PathBuf::from)
                .unwrap_or_else(devcluster::default_data_dir);
            match args.get(1).map(String::as_str) {
                Some("up") => devcluster::up(&devcluster::UpOptions {
                    nodes: value("--nodes").map(|n| n.parse()).transpose()?.unwrap_or(2),
                    archs: devcluster::Archs::parse(&value("--arch").unwrap_or_else(|| "x86_64".into()))?,
                    memory_mib: value("--memory").map(|n| n.parse()).transpose()?.unwrap_or(1024),
                    data_dir,
                }),
                Some("down") => devcluster::down(&data_dir),
                Some("status") => devcluster::status(&data_dir),
                Some("node") => match (args.get(2), args.get(3)) {
                    (Some(name), Some(action)) => devcluster::node(&data_dir, name, action),
                    _ => usage(),
                },
                _ => usage(),
            }
        }
        Some("switch") => {
            let listen: u16 = value("--listen").unwrap_or_else(|| usage()).parse()?;
            let peers = args
                .windows(2)
                .filter(|w| w[0] == "--peer")
                .map(|w| w[1].parse::<u16>())
                .collect::<Result<Vec<_>, _>>()?;
            devcluster::switch(listen, &peers)
        }
        Some("bench-boot") => {
            let runs: usize = value("--runs").map(|r| r.parse()).transpose()?.unwrap_or(5);
            let arches = match value("--arch").as_deref() {
                None | Some("all") => Arch::ALL.to_vec(),
                Some(a) => vec![Arch::parse(a)?],
            };
            let json = PathBuf::from(value("--json").unwrap_or_else(|| usage()));
            bench_boot(&arches, runs, &json)
        }
        Some("bench-pods") => {
            let runs: usize = value("--runs").map(|r| r.parse()).transpose()?.unwrap_or(5);
            let json = PathBuf::from(value("--json").unwrap_or_else(|| usage()));
            bench_pods(runs, &json)
        }
        Some("bench-runtime") => {
            let runs: usize = value("--runs").map(|r| r.parse()).transpose()?.unwrap_or(20);
            let arches = match value("--arch").as_deref() {
                None | Some("all") => Arch::ALL.to_vec(),
                Some(a) => vec![Arch::parse(a)?],
            };
            let json = PathBuf::from(value("--json").unwrap_or_else(|| usage()));
            bench_runtime(&arches, runs, &json)
        }
        _ => usage(),
    }
}

/// Copies stdin to a TCP connection to `addr` and the connection to stdout: QEMU runs this per
/// guest connection for a `guestfwd=...-cmd:` forward (a chardev forward carries one connection).
fn relay(addr: &str) -> Result<()> {
    let stream = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let mut to_host = stream.try_clone()?;
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_host);
        let _ = to_host.shutdown(std::net::Shutdown::Write);
    });
    // stdout is line-buffered: flush every chunk, or TLS records sit in the buffer.
    let mut from_host = stream;
    let mut out = std::io::stdout().lock();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match std::io::Read::read(&mut from_host, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
        }
    }
    let _ = up.join();
    Ok(())
}

/// The main job: a control plane on its embedded store, one node VM that boots, joins it and is
/// shown Ready by the real kubectl, its agent answering over TLS; then an orderly poweroff.
fn run(arch: Arch, uefi: bool, stay: bool) -> Result<()> {
    let out = out_dir();
    let cp = ControlPlane::start()?;
    println!(
        "control plane: {} (kubeconfig {})",
        cp.dir().display(),
        cp.dir().join("admin.kubeconfig").display()
    );
    let base = if uefi {
        VmConfig::uefi(&out, arch)
    } else {
        VmConfig::direct(&out, arch)?
    };
    let registry = qemu_tests::guest::busybox_registry()?;
    let mut nic = cp.nic();
    let (rip, rport) = qemu_tests::guest::REGISTRY_GUEST;
    nic.guest_forwards.push((rip.into(), rport, registry.port));
    let node_name = format!("demo-{}", arch.name().replace('_', "-"));
    // The agent's port is forwarded to the host and advertised, so `kubectl logs` works.
    let machine_config = cp.expose_agent(&mut nic, &cp.machine_config_with_registry(&node_name)?)?;
    let port = nic.forwards.last().map(|f| f.0).context("no agent forward")?;
    let cfg = base.with_nics(vec![nic]).with_fw_cfg(machine_config);
    let mut factory = VmFactory::new(&format!("run-{}", arch.name()))?;
    let t0 = Instant::now();
    let mut vm = factory.start(&cfg)?;
    println!(
        "booting {} ({}), console log: {}",
        arch.name(),
        if uefi { "UEFI disk" } else { "direct kernel" },
        vm.dir().join("serial.log").display()
    );
    let ready = vm.wait_for_line("init: ready", BOOT_TIMEOUT)?;
    println!("{ready}    (host wall clock {:.1} s)", t0.elapsed().as_secs_f64());
    vm.wait_for_line("agent: node registered", BOOT_TIMEOUT)?;
    println!(
        "node registered after {:.1} s (host wall clock)",
        t0.elapsed().as_secs_f64()
    );
    for l in vm
        .console()
        .lines()
        .filter(|l| l.starts_with("init:") || l.starts_with("agent:"))
    {
        println!("  {l}");
    }
    println!(
        "\n$ kubectl get nodes -o wide\n{}",
        cp.kubectl(&["get", "nodes", "-o", "wide"])?
    );
    let health = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "20",
            &format!("https://127.0.0.1:{port}/healthz"),
        ])
        .output()
        .context("running curl")?;
    let body = String::from_utf8_lossy(&health.stdout);
    println!("agent https://127.0.0.1:{port}/healthz -> {body:?}");
    if body != "ok" {
        bail!("the agent did not answer its health check");
    }
    let status = cp.kubectl(&[
        "get",
        "node",
        &node_name,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ])?;
    if status != "True" {
        bail!("node {node_name} is not Ready ({status:?})");
    }
    // A pod bound to the node (there is no scheduler yet), pulled from the registry on the host.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {"nodeName": node_name, "containers": [{
            "name": "hello", "image": qemu_tests::guest::guest_busybox(),
            "command": ["sh", "-c", "echo hello from $(hostname); sleep 3600"],
            "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        }]},
    });
    cp.create(&pod)?;
    let t1 = Instant::now();
    cp.wait_for(
        &["pod", "hello"],
        "{.status.phase}",
        |p| p == "Running",
        BOOT_TIMEOUT,
    )?;
    println!(
        "pod hello Running {:.1} s after it was created",
        t1.elapsed().as_secs_f64()
    );
    println!(
        "\n$ kubectl get pods -o wide\n{}",
        cp.kubectl(&["get", "pods", "-o", "wide"])?
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let logs = loop {
        let l = cp.kubectl(&["logs", "hello"]).unwrap_or_default();
        if !l.is_empty() || Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!("$ kubectl logs hello\n{logs}");
    if stay {
        println!(
            "node is up; KUBECONFIG={} kubectl get nodes; press Ctrl-C to stop",
            cp.dir().join("admin.kubeconfig").display()
        );
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    if arch == Arch::Aarch64 && !uefi {
        // The arm64 cloud kernel has no gpio-keys driver, so `virt` without firmware has no
        // power button: stop QEMU instead.
        println!("(arm64 direct boot has no power button; stopping QEMU)");
        vm.qmp("quit", None).ok();
        return Ok(());
    }
    vm.qmp("system_powerdown", None)?;
    let status = vm.wait_exit(Duration::from_secs(120))?;
    let going = vm
        .console()
        .lines()
        .find(|l| l.contains("init: going down"))
        .map(str::to_string)
        .unwrap_or_default();
    println!("{going}\nQEMU exited: {status}");
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// One boot: returns (guest boot_ms at the ready line, host wall ms to that line).
fn boot_once(factory: &mut VmFactory, cfg: &VmConfig, needle: &str) -> Result<(f64, f64)> {
    let t0 = Instant::now();
    let mut vm = factory.start(cfg)?;
    let line = vm.wait_for_line(needle, BOOT_TIMEOUT)?;
    let wall = t0.elapsed().as_secs_f64() * 1000.0;
    let ms = field_u64(&line, "boot_ms").with_context(|| format!("no boot_ms in {line:?}"))?;
    let _ = vm.wait_exit(Duration::from_secs(60));
    Ok((ms as f64, wall))
}

fn file_size(p: &std::path::Path) -> Result<u64> {
    Ok(std::fs::metadata(p)
        .with_context(|| format!("{} (run ./build.sh image)", p.display()))?
        .len())
}

/// Percentiles (nearest rank) of `v` in milliseconds, with the sample count.
fn percentiles(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| {
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    };
    serde_json::json!({"n": v.len(), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)})
}

/// Watches pods with `kubectl get pods -w` and returns, for each name in `names`, the time at
/// which `jsonpath` (one line per event: `name value`) first showed `want`, from `start`.
fn watch_until(
    cp: &qemu_tests::cluster::ControlPlane,
    names: &[String],
    jsonpath: &str,
    want: &str,
    start: std::time::Instant,
    timeout: Duration,
) -> Result<Vec<f64>> {
    use std::io::BufRead;
    let mut child = std::process::Command::new("kubectl")
        .env("KUBECONFIG", cp.dir().join("admin.kubeconfig"))
        .args([
            "get",
            "pods",
            "-w",
            "-o",
            &format!("jsonpath={{.metadata.name}} {jsonpath}{{\"\\n\"}}"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("kubectl stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((std::time::Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let mut seen: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + timeout;
    while seen.len() < names.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((at, line)) = rx.recv_timeout(left) else {
            let _ = child.kill();
            bail!("only {} of {} pods reached {want}", seen.len(), names.len());
        };
        let mut parts = line.splitn(2, ' ');
        let (name, value) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        if value.trim() == want && names.iter().any(|n| n == name) && !seen.contains_key(name) {
            seen.insert(name.to_string(), at.duration_since(start).as_secs_f64() * 1000.0);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(seen.into_values().collect())
}

/// Pod benchmark (issue: agent): one x86_64 node VM joined to a control plane on the host, the
/// image already pulled: create → Running for single pods and for 30 created at once, create →
/// Ready with a readiness probe, the agent's re-adoption of 30 pods after a SIGKILL, and the
/// node's memory working set (`kubectl top node`) idle and with 30 pods.
fn bench_pods(runs: usize, json: &std::path::Path) -> Result<()> {
    use qemu_tests::cluster::ControlPlane;
    use qemu_tests::guest::{REGISTRY_GUEST, busybox_registry, guest_busybox};
    const KILL_AFTER_S: u64 = 240;
    let vcpus: u32 = match std::env::var("BENCH_VCPUS") {
        Ok(v) => v.parse().with_context(|| format!("BENCH_VCPUS={v:?}"))?,
        Err(_) => 2,
    };
    let cp = ControlPlane::start_bin(&qemu_tests::vm::target_dir().join("release/controlplane"))?;
    let registry = busybox_registry()?;
    let mut factory = VmFactory::new("bench-pods")?;
    let mut nic = cp.nic();
    nic.guest_forwards
        .push((REGISTRY_GUEST.0.into(), REGISTRY_GUEST.1, registry.port));
    let node = "bench-node";
    let mut config: serde_json::Value = serde_json::from_str(&cp.machine_config_with_registry(node)?)?;
    // One agent kill, late enough for the other phases to be over.
    config["debug"] = serde_json::json!({"killAgent": {"afterSeconds": KILL_AFTER_S, "times": 1}});
    // The API server reaches the agent (for `kubectl top`) through a host forward.
    let config = cp.expose_agent(&mut nic, &config.to_string())?;
    // BENCH_KPROFILE=<file>: the kernel's profiler (`profile=`) samples the 30-pod burst and its
    // counts (gzip, base64) go to <file>, the kernel's symbols (/proc/kallsyms, likewise) next to
    // it (`.syms`); the run ends after the burst.
    let kprofile = std::env::var_os("BENCH_KPROFILE").map(std::path::PathBuf::from);
    let mut cfg = VmConfig::direct(&out_dir(), Arch::X86_64)?;
    if kprofile.is_some() {
        cfg = cfg.with_cmdline_extra("profile=2");
    }
    let cfg = cfg
        .with_memory_mib(1024)
        .with_cpus(vcpus)
        .with_nics(vec![nic])
        .with_fw_cfg(config);
    let mut vm = factory.start(&cfg)?;
    vm.wait_for_line("agent: node registered", Duration::from_secs(300))?;
    let booted = std::time::Instant::now();
    let image = guest_busybox();
    let pod = |name: &str, probe: bool| {
        let mut p = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"]}]}});
        if probe {
            p["spec"]["containers"][0]["readinessProbe"] =
                serde_json::json!({"exec": {"command": ["true"]}, "periodSeconds": 1});
        }
        p
    };
    let create = |items: Vec<serde_json::Value>| -> Result<()> {
        cp.create(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))?;
        Ok(())
    };
    let phase = "{.status.phase}";
    let ready = "{.status.conditions[?(@.type==\"Ready\")].status}";
    // Warm-up: the image is pulled once.
    let start = std::time::Instant::now();
    create(vec![pod("warm", false)])?;
    watch_until(
        &cp,
        &["warm".into()],
        phase,
        "Running",
        start,
        Duration::from_secs(300),
    )?;
    // The metrics API scrapes every 15 s from its first request on: a few tries.
    let top = |cp: &ControlPlane| -> Option<String> {
        for _ in 0..20 {
            if let Ok(out) = cp.kubectl(&["top", "node", "--no-headers"])
                && let Some(m) = out.split_whitespace().nth(3)
            {
                return Some(m.to_string());
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        None
    };
    // The inspector reads the node's /proc (it adds one pod, whose pause process is counted
    // among the pauses).
    let mut inspector = pod("inspector", false);
    inspector["spec"]["containers"][0]["securityContext"] = serde_json::json!({"privileged": true});
    inspector["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "proc", "mountPath": "/host/proc", "readOnly": true}]);
    inspector["spec"]["volumes"] =
        serde_json::json!([{"name": "proc", "hostPath": {"path": "/proc", "type": "Directory"}}]);
    create(vec![inspector])?;
    watch_until(
        &cp,
        &["inspector".into()],
        phase,
        "Running",
        std::time::Instant::now(),
        Duration::from_secs(120),
    )?;
    std::thread::sleep(Duration::from_secs(20));
    let idle_memory = top(&cp);
    let idle_userspace = node_userspace_memory(&cp)?;
    // Creates pod `name` and returns the time until `path` showed `want` for it.
    let time_one = |name: String, probe: bool, path: &str, want: &str| -> Result<f64> {
        let start = std::time::Instant::now();
        create(vec![pod(&name, probe)])?;
        let t = watch_until(&cp, &[name], path, want, start, Duration::from_secs(120))?;
        Ok(t.first().copied().unwrap_or(f64::NAN))
    };
    let (mut single, mut probed) = (Vec::new(), Vec::new());
    for i in 0..runs {
        single.push(time_one(format!("one-{i}"), false, phase, "Running")?);
        probed.push(time_one(format!("ready-{i}"), true, ready, "True")?);
        eprintln!(
            "bench pods run {}/{runs}: single {:.0} ms, ready {:.0} ms",
            i + 1,
            single[i],
            probed[i]
        );
    }
    let _ = cp.kubectl(&[
        "delete",
        "pods",
        "--field-selector=metadata.name!=inspector",
        "--wait=false",
    ]);
    std::thread::sleep(Duration::from_secs(10));
    let names: Vec<String> = (0..30).map(|i| format!("many-{i}")).collect();
    // Every process's /proc/<pid>/stat on the node, for the kernel profile's run.
    let stats = |to: &std::path::Path| -> Result<()> {
        let all = inspector_sh(&cp, "cat /host/proc/[0-9]*/stat 2>/dev/null")?;
        Ok(std::fs::write(to, all)?)
    };
    if let Some(file) = &kprofile {
        stats(&file.with_extension("stat0"))?;
        inspector_sh(&cp, "echo 0 > /proc/profile")?;
    }
    let cpu_before = node_cpu(&cp)?;
    let start = std::time::Instant::now();
    create(names.iter().map(|n| pod(n, false)).collect())?;
    let many = watch_until(&cp, &names, phase, "Running", start, Duration::from_secs(300))?;
    let burst_s = start.elapsed().as_secs_f64();
    let burst_cpu = node_cpu(&cp)?.since(&cpu_before, burst_s);
    if let Some(file) = &kprofile {
        stats(&file.with_extension("stat1"))?;
        let counts = inspector_sh(&cp, "gzip -c /proc/profile | base64")?;
        std::fs::write(file, counts)?;
        let syms = inspector_sh(&cp, "gzip -c /proc/kallsyms | base64")?;
        std::fs::write(file.with_extension("syms"), syms)?;
        eprintln!(
            "bench pods: 30 at once, last Running after {:.0} ms; {burst_cpu}; kernel profile in {}",
            many.iter().cloned().fold(0.0, f64::max),
            file.display()
        );
        return Ok(());
    }
    eprintln!(
        "bench pods: 30 at once, last Running after {:.0} ms",
        many.iter().cloned().fold(0.0, f64::max)
    );
    std::thread::sleep(Duration::from_secs(20));
    let busy_memory = top(&cp);
    let busy_userspace = node_userspace_memory(&cp)?;
    // The agent kill: the time from PID 1's kill to the restarted agent's 30th adoption.
    let left = Duration::from_secs(KILL_AFTER_S + 60).saturating_sub(booted.elapsed());
    vm.wait_for_line("killing the service", left)?;
    let killed = std::time::Instant::now();
    let before = vm.console().matches("adopted the pod from the runtime").count();
    let readopt = loop {
        if vm.console().matches("adopted the pod from the runtime").count() >= before + 30 {
            break killed.elapsed().as_secs_f64() * 1000.0;
        }
        ensure!(
            killed.elapsed() < Duration::from_secs(120),
            "the agent did not adopt the 30 pods again"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let ready_after = cp.kubectl(&[
        "get",
        "pods",
        "-o",
        &format!("jsonpath={{range .items[*]}}{ready} {{end}}"),
    ])?;
    let all_ready = ready_after.split_whitespace().filter(|s| *s == "True").count();
    let doc = serde_json::json!({
        "benchmark": "pods", "accel": "tcg", "vcpus": vcpus, "arch": "x86_64", "memory_mib": 1024,
        "results": {
            "create_to_running_single": percentiles(single),
            "create_to_running_30_at_once": percentiles(many),
            "node_cpu_30_at_once": burst_cpu,
            "create_to_ready_with_probe": percentiles(probed),
            "agent_kill_to_30_pods_adopted_ms": readopt,
            "pods_ready_after_agent_restart": all_ready,
            "node_working_set_idle": idle_memory,
            "node_working_set_30_pods": busy_memory,
            "node_userspace_idle": idle_userspace,
            "node_userspace_30_pods": busy_userspace,
        },
        "notes": "times from the kubectl create call to the first watch event showing the state (host clock); \
                  node working set is kubectl top node (whole machine incl. kernel); node userspace is \
                  VmRSS and Pss (smaps_rollup) of PID 1, the agent, the runtime and every pause process, \
                  read from the node's /proc by a privileged pod (idle: the warm-up pod and the inspector \
                  run; 30 pods: those and the inspector); node CPU is the node's /proc/stat (busy = \
                  all but idle and iowait, both vCPUs; kernel = system, irq and softirq) and the \
                  agent's and runtime's own CPU (the runtime's with its reaped children: build \
                  helpers and libcontainer's processes), from before the 30 pods' create to after \
                  the last was seen Running",
    });
    std::fs::write(json, serde_json::to_string_pretty(&doc)?)?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// CPU clock ticks on the node (USER_HZ, 100 on our kernels), read by the `inspector` pod.
struct NodeCpu {
    busy: u64,
    /// The kernel's part of `busy` (system, irq and softirq ticks).
    kernel: u64,
    agent: u64,
    runtime: u64,
}

impl NodeCpu {
    /// Seconds of CPU between `before` and this reading, over `wall_s` seconds.
    fn since(&self, before: &NodeCpu, wall_s: f64) -> serde_json::Value {
        let s = |a: u64, b: u64| a.saturating_sub(b) as f64 / 100.0;
        serde_json::json!({
            "wall_s": wall_s,
            "node_busy_cpu_s": s(self.busy, before.busy),
            "node_kernel_cpu_s": s(self.kernel, before.kernel),
            "agent_cpu_s": s(self.agent, before.agent),
            "runtime_cpu_s": s(self.runtime, before.runtime),
        })
    }
}

/// Runs `script` in the bench's privileged `inspector` pod (the node's `/proc` is at
/// `/host/proc`); its output.
fn inspector_sh(cp: &qemu_tests::cluster::ControlPlane, script: &str) -> Result<String> {
    cp.kubectl(&["exec", "inspector", "--", "sh", "-c", script])
}

/// The node's busy ticks (all CPUs; also the kernel's part of them) and the agent's and the
/// runtime's (the runtime's with the children it reaped).
fn node_cpu(cp: &qemu_tests::cluster::ControlPlane) -> Result<NodeCpu> {
    const SCRIPT: &str = r#"
read -r _ u n s i w q sq st _ < /host/proc/stat
echo busy $((u + n + s + q + sq + st))
echo kernel $((s + q + sq))
for p in /host/proc/[0-9]*; do
  set -- $(tr '\0' ' ' < $p/cmdline 2>/dev/null)
  case "$2" in agent|runtime) k=$2;; *) continue;; esac
  # utime stime cutime cstime are fields 14-17; the command (field 2) has no spaces here.
  set -- $(cat $p/stat)
  echo $k $((${14} + ${15} + ${16} + ${17}))
done"#;
    let out = inspector_sh(cp, SCRIPT)?;
    let mut cpu = NodeCpu {
        busy: 0,
        kernel: 0,
        agent: 0,
        runtime: 0,
    };
    for line in out.lines() {
        let (kind, ticks) = line
            .split_once(' ')
            .with_context(|| format!("node cpu: {line:?} in {out:?}"))?;
        let ticks: u64 = ticks
            .trim()
            .parse()
            .with_context(|| format!("node cpu: {line:?}"))?;
        match kind {
            "busy" => cpu.busy = ticks,
            "kernel" => cpu.kernel = ticks,
            "agent" => cpu.agent = ticks,
            "runtime" => cpu.runtime = ticks,
            _ => bail!("node cpu: {line:?}"),
        }
    }
    ensure!(
        cpu.busy > 0 && cpu.agent > 0 && cpu.runtime > 0,
        "node cpu: {out:?}"
    );
    Ok(cpu)
}

/// What the node's own processes hold (PID 1, agent, runtime, pause), read from the node's
/// /proc by the `inspector` pod: per kind the process count, VmRSS and Pss in KiB, and the
/// totals. RSS counts the pages of the binary they share once per process; Pss divides them
/// among the sharers, so its total is what the node pays. (The pauses run the runtime's small
/// pause program, started as `/pause pause`.)
fn node_userspace_memory(cp: &qemu_tests::cluster::ControlPlane) -> Result<serde_json::Value> {
    const SCRIPT: &str = r#"
for p in /host/proc/[0-9]*; do
  set -- $(tr '\0' ' ' < $p/cmdline 2>/dev/null)
  if [ "${p##*/}" = 1 ]; then k=init; else
    case "$2" in agent|runtime|pause) k=$2;; *) continue;; esac
  fi
  r=$(awk '/^VmRSS:/{print $2}' $p/status 2>/dev/null)
  s=$(awk '/^Pss:/{print $2}' $p/smaps_rollup 2>/dev/null)
  # A process that ended meanwhile has nothing to read.
  [ -n "$r" ] && [ -n "$s" ] && echo "$k $r $s"
done; true"#;
    let out = inspector_sh(cp, SCRIPT)?;
    let mut kinds = std::collections::BTreeMap::<String, (u64, u64, u64)>::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, rss, pss] = f[..] else {
            anyhow::bail!("node memory: {line:?} in {out:?}");
        };
        let e = kinds.entry(kind.to_string()).or_default();
        e.0 += 1;
        e.1 += rss.parse::<u64>()?;
        e.2 += pss.parse::<u64>()?;
    }
    for k in ["init", "agent", "runtime"] {
        ensure!(
            kinds.get(k).map(|e| e.0) == Some(1),
            "node memory: no single {k} in {out:?}"
        );
    }
    let (rss, pss) = kinds.values().fold((0, 0), |(r, p), e| (r + e.1, p + e.2));
    let mut doc = serde_json::json!({"total_rss_kib": rss, "total_pss_kib": pss});
    for (k, (n, r, p)) in kinds {
        doc[k] = serde_json::json!({"processes": n, "rss_kib": r, "pss_kib": p});
    }
    Ok(doc)
}

/// Runtime benchmark: `runtime-bench` in a node VM per arch, with Debian's runc and crun (and
/// their libraries, from `$NODEOS_CACHE/bench/<arch>/root`) appended to the initramfs.
fn bench_runtime(arches: &[Arch], runs: usize, json: &std::path::Path) -> Result<()> {
    let cache = std::env::var_os("NODEOS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| qemu_tests::vm::target_dir().join("cache"));
    let mut results = serde_json::Map::new();
    for &arch in arches {
        let da = if arch == Arch::X86_64 { "amd64" } else { "arm64" };
        let root = cache.join("bench").join(da).join("root");
        let extra = qemu_tests::guest::tree_entries(
            &root,
            &format!("{}/bench/root", qemu_tests::guest::GUEST_DIR),
            &["usr/share", "etc", "usr/lib/systemd", "usr/libexec"],
        )
        .with_context(|| format!("{} (./build.sh bench runtime fetches it)", root.display()))?;
        let runs_arg = runs.to_string();
        let (console, logs) = qemu_tests::guest::run_guest_program(
            arch,
            "bench-runtime",
            "runtime-bench",
            &["--runs", &runs_arg],
            extra,
            "BENCH done",
            Duration::from_secs(1800),
        )?;
        let mut arch_results = serde_json::Map::new();
        for l in console.lines() {
            if let Some(err) = l.strip_prefix("BENCH error: ") {
                bail!("{arch:?}: {err} (logs in {})", logs.display());
            }
            if let Some(j) = l.strip_prefix("BENCH {")
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&format!("{{{j}"))
                && let Some(name) = v.get("name").and_then(|n| n.as_str())
            {
                arch_results.insert(name.to_string(), v.clone());
            }
        }
        results.insert(arch.name().to_string(), serde_json::Value::Object(arch_results));
    }
    let doc = serde_json::json!({ "benchmark": "runtime", "accel": "tcg", "vcpus": 1, "results": results });
    std::fs::write(json, serde_json::to_string_pretty(&doc)?)?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// Boot benchmark: our init (onReady=poweroff) vs a do-nothing /init on the same kernel,
/// interleaved, `runs` times each, medians and the difference.
fn bench_boot(arches: &[Arch], runs: usize, json: &std::path::Path) -> Result<()> {
    let out = out_dir();
    let mut factory = VmFactory::new("bench-boot")?;
    let mut results = serde_json::Map::new();
    for &arch in arches {
        let dir = out.join(arch.name());
        let node = VmConfig::direct(&out, arch)?
            .with_fw_cfg(r#"{"apiVersion":"nodeos/v1alpha1","onReady":"poweroff"}"#);
        let mut floor = VmConfig::direct(&out, arch)?;
        if let qemu_tests::Boot::Direct { initrd, .. } = &mut floor.boot {
            *initrd = dir.join("floor-initramfs.img");
        }
        let (mut ours, mut base, mut ours_wall, mut base_wall) = (vec![], vec![], vec![], vec![]);
        for i in 0..runs {
            let (ms, wall) = boot_once(&mut factory, &floor, "floor: ready")?;
            base.push(ms);
            base_wall.push(wall);
            let (ms, wall) = boot_once(&mut factory, &node, "init: ready")?;
            ours.push(ms);
            ours_wall.push(wall);
            eprintln!(
                "bench boot {} run {}/{}: init {} ms, floor {} ms",
                arch.name(),
                i + 1,
                runs,
                ours[i],
                base[i]
            );
        }
        let (o, b) = (median(&mut ours.clone()), median(&mut base.clone()));
        results.insert(
            arch.name().into(),
            serde_json::json!({
                "sizes_bytes": {
                    "node.efi": file_size(&dir.join("node.efi"))?,
                    "vmlinuz": file_size(&dir.join("vmlinuz"))?,
                    "initramfs.img": file_size(&dir.join("initramfs.img"))?,
                    "disk.qcow2": file_size(&dir.join("disk.qcow2"))?,
                },
                "runs": runs,
                "init_ready_boot_ms": { "median": o, "all": ours },
                "floor_ready_boot_ms": { "median": b, "all": base },
                "init_minus_floor_ms": o - b,
                "init_over_floor_ratio": o / b,
                "host_wall_ms_to_ready": { "init_median": median(&mut ours_wall), "floor_median": median(&mut base_wall) },
                "target": { "node_efi_max_bytes": 20 * 1024 * 1024, "init_minus_floor_max_ms": 500 },
            }),
        );
    }
    let doc = serde_json::json!({ "benchmark": "boot", "accel": "tcg", "results": results });
    std::fs::write(json, serde_json::to_string_pretty(&doc)?)?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
