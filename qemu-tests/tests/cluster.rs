//! `./build.sh cluster` end to end: `nodeos-vm cluster up --nodes 2` starts a control plane, a
//! registry and two x86_64 node VMs on a shared LAN; a pod created without `nodeName` is
//! scheduled to one of them and runs; `cluster node` kills and boots a node again; `cluster down`
//! stops everything it started.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use qemu_tests::devcluster;
use qemu_tests::guest::guest_busybox;
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
    // Power loss and a new boot of the same node.
    nodeos_vm(&data, &["node", "node-1", "kill"])?;
    let status = nodeos_vm(&data, &["status"])?;
    ensure!(
        status
            .lines()
            .any(|l| l.starts_with("node-1") && l.ends_with("stopped")),
        "{status}"
    );
    nodeos_vm(&data, &["node", "node-1", "start"])?;
    let serial = data.join("nodes/node-1/serial.log");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !std::fs::read_to_string(&serial)
        .unwrap_or_default()
        .contains("agent: node registered")
    {
        ensure!(
            Instant::now() < deadline,
            "node-1 did not boot again; see {}",
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
