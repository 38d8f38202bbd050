//! `./build.sh cluster` end to end: `nodeos-vm cluster up --nodes 2` starts a control plane, a
//! registry and two x86_64 node VMs on a shared LAN; a pod created without `nodeName` is
//! scheduled to one of them and runs; a Deployment rolls from one image to another; `cluster
//! node ... kill` (power loss) makes the node's pods Terminating and replaced on the other node
//! after the tolerations; the node boots again; `cluster down` stops everything it started.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use qemu_tests::devcluster;
use qemu_tests::guest::{REGISTRY_GUEST, guest_busybox};
use qemu_tests::vm::relay_bin;

fn nodeos_vm(data_dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(relay_bin())
        .arg("cluster")
        .args(args)
        .args(["--data-dir", &data_dir.display().to_string()])
        .output()
        .context("running nodeos-vm")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "nodeos-vm cluster {args:?} failed:\n{text}");
    Ok(text)
}

/// Stops the cluster however the test ends.
struct Down<'a>(&'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = nodeos_vm(self.0, &["down"]);
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait_for(
    kubeconfig: &Path,
    args: &[&str],
    ok: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let v = kubectl(kubeconfig, args).unwrap_or_default();
        if ok(&v) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("kubectl {args:?}: still {v:?} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "boots VMs: ./build.sh test vm"]
fn two_node_cluster_schedules_a_pod() -> Result<()> {
    let data = qemu_tests::vm::target_dir().join("qemu-tests/cluster-two-nodes");
    let _ = std::fs::remove_dir_all(&data);
    let up = nodeos_vm(&data, &["up", "--nodes", "2"])?;
    let _down = Down(&data);
    ensure!(up.contains("export KUBECONFIG="), "{up}");
    let state = devcluster::load(&data)?;
    let kc = state.kubeconfig.clone();
    // Each node has its own name and LAN address.
    let addresses = kubectl(
        &kc,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.addresses[?(@.type==\"InternalIP\")].address} {end}",
        ],
    )?;
    ensure!(
        addresses.contains("node-0=192.168.77.10") && addresses.contains("node-1=192.168.77.11"),
        "{addresses}"
    );
    // A pod without nodeName is scheduled and runs with real containers.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
        "spec": {"containers": [{"name": "hello", "image": guest_busybox(),
                 "command": ["sh", "-c", "echo hello; sleep 3600"]}]},
    });
    let file = data.join("hello.json");
    std::fs::write(&file, pod.to_string())?;
    kubectl(&kc, &["create", "-f", &file.display().to_string()])?;
    let node = wait_for(
        &kc,
        &["get", "pod", "hello", "-o", "jsonpath={.spec.nodeName}"],
        |n| n.starts_with("node-"),
        Duration::from_secs(60),
    )?;
    wait_for(
        &kc,
        &["get", "pod", "hello", "-o", "jsonpath={.status.phase}"],
        |p| p == "Running",
        Duration::from_secs(240),
    )?;
    let events = kubectl(&kc, &["events", "--for", "pod/hello"])?;
    ensure!(
        events.contains("Scheduled")
            && events.contains(&format!("Successfully assigned default/hello to {node}")),
        "{events}"
    );
    // The nodes report usage: `kubectl top` through metrics.k8s.io (a CPU rate needs two
    // scrapes, 15 s apart).
    let top = wait_for(
        &kc,
        &["top", "node", "--no-headers"],
        |t| {
            t.lines()
                .filter(|l| l.starts_with("node-") && l.contains('%'))
                .count()
                == 2
        },
        Duration::from_secs(90),
    )?;
    ensure!(top.lines().all(|l| l.contains("Mi")), "{top}");
    wait_for(
        &kc,
        &["top", "pod", "hello", "--no-headers"],
        |t| t.starts_with("hello") && t.contains("Mi"),
        Duration::from_secs(90),
    )?;
    // A Deployment rolls from one image to another with real containers.
    let image = |name: &str| format!("{}:{}/{name}", REGISTRY_GUEST.0, REGISTRY_GUEST.1);
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 5,
                // Shortened tolerations: the lost node's pods are evicted 5 s after its taint.
                "tolerations": [
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}],
                "containers": [{"name": "web", "image": guest_busybox(), "command": ["sh", "-c", "sleep 3600"]}]}}},
    });
    let file = data.join("web.json");
    std::fs::write(&file, deployment.to_string())?;
    kubectl(&kc, &["create", "-f", &file.display().to_string()])?;
    kubectl(&kc, &["rollout", "status", "deployment/web", "--timeout=300s"])?;
    let layered = image("layered:1");
    kubectl(
        &kc,
        &["set", "image", "deployment/web", &format!("web={layered}")],
    )?;
    let rolled = kubectl(&kc, &["rollout", "status", "deployment/web", "--timeout=300s"])?;
    ensure!(rolled.contains("successfully rolled out"), "{rolled}");
    let pods = |kc: &Path| {
        kubectl(
            kc,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.spec.nodeName},{.spec.containers[0].image},{.status.phase},{.metadata.deletionTimestamp};{end}",
            ],
        )
    };
    let rows = |text: &str| -> Vec<Vec<String>> {
        text.split(';')
            .filter(|r| !r.is_empty())
            .map(|r| r.split(',').map(str::to_string).collect())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let running = loop {
        let now = rows(&pods(&kc)?);
        if now.len() == 2
            && now
                .iter()
                .all(|r| r[1] == layered && r[2] == "Running" && r[3].is_empty())
        {
            break now;
        }
        ensure!(Instant::now() < deadline, "after the rollout: {now:?}");
        std::thread::sleep(Duration::from_secs(1));
    };
    // Each pod's address is in its node's own pod CIDR (node IPAM → agent → runtime).
    let cidrs = kubectl(
        &kc,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.podCIDR} {end}",
        ],
    )?;
    let ips = kubectl(
        &kc,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName}={.status.podIP} {end}",
        ],
    )?;
    for pair in ips.split_whitespace() {
        let (node, ip) = pair.split_once('=').context("node=ip")?;
        let cidr = cidrs
            .split_whitespace()
            .find_map(|c| c.strip_prefix(&format!("{node}=")))
            .with_context(|| format!("no podCIDR for {node}: {cidrs}"))?;
        let net = cidr
            .strip_suffix(".0/24")
            .with_context(|| format!("a /24: {cidr}"))?;
        ensure!(
            ip.starts_with(&format!("{net}.")),
            "pod on {node} has {ip}, outside {cidr}"
        );
    }
    // Power loss of a node holding a pod: after the node-monitor grace period and the
    // tolerations, its pods are Terminating and replaced on the other node.
    let victim = running[0][0].clone();
    let survivor = if victim == "node-0" { "node-1" } else { "node-0" };
    nodeos_vm(&data, &["node", &victim, "kill"])?;
    let status = nodeos_vm(&data, &["status"])?;
    ensure!(
        status
            .lines()
            .any(|l| l.starts_with(victim.as_str()) && l.ends_with("stopped")),
        "{status}"
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now = rows(&pods(&kc)?);
        let terminating_on_victim = now.iter().any(|r| r[0] == victim && !r[3].is_empty());
        let replaced = now
            .iter()
            .filter(|r| r[0] == survivor && r[2] == "Running" && r[3].is_empty())
            .count();
        if terminating_on_victim && replaced == 2 {
            break;
        }
        ensure!(Instant::now() < deadline, "after {victim} was lost: {now:?}");
        std::thread::sleep(Duration::from_secs(2));
    }
    let events = kubectl(
        &kc,
        &["get", "events", "-o", "jsonpath={range .items[*]}{.reason} {end}"],
    )?;
    ensure!(events.contains("TaintManagerEviction"), "{events}");
    // A new boot of the same node.
    nodeos_vm(&data, &["node", &victim, "start"])?;
    let serial = data.join(format!("nodes/{victim}/serial.log"));
    let deadline = Instant::now() + Duration::from_secs(300);
    while !std::fs::read_to_string(&serial)
        .unwrap_or_default()
        .contains("agent: node registered")
    {
        ensure!(
            Instant::now() < deadline,
            "{victim} did not boot again; see {}",
            serial.display()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let before = devcluster::load(&data)?;
    nodeos_vm(&data, &["down"])?;
    let mut procs = vec![before.control_plane, before.registry, before.switch];
    procs.extend(before.nodes.into_iter().filter_map(|n| n.proc));
    std::thread::sleep(Duration::from_millis(500));
    for p in procs {
        ensure!(
            !p.alive(),
            "{} (pid {}) still running after down",
            p.program,
            p.pid
        );
    }
    ensure!(!data.join("cluster.json").exists(), "state removed");
    Ok(())
}
