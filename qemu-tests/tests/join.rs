//! Node join end to end: a control plane on the host (on its embedded store), an x86_64 and an
//! arm64 node VM that bootstrap with a token, get client certificates, register their Nodes and
//! renew their Leases; the real kubectl shows both Ready.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use qemu_tests::cluster::ControlPlane;
use qemu_tests::vm::{Arch, VmConfig, VmFactory, out_dir};

const BOOT: Duration = Duration::from_secs(300);

#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn x86_64_and_arm64_nodes_join_one_control_plane() -> Result<()> {
    let cp = ControlPlane::start()?;
    let mut f = VmFactory::new("join")?;
    let mut vms = Vec::new();
    for (arch, name) in [(Arch::X86_64, "node-amd64"), (Arch::Aarch64, "node-arm64")] {
        let cfg = VmConfig::direct(&out_dir(), arch)?
            .with_nics(vec![cp.nic()])
            .with_fw_cfg(cp.machine_config(name)?);
        vms.push(f.start(&cfg)?);
    }
    for vm in &mut vms {
        vm.wait_for_line("agent: node registered", BOOT)?;
    }
    let nodes = cp.kubectl(&["get", "nodes"])?;
    for n in ["node-amd64", "node-arm64"] {
        ensure!(
            nodes
                .lines()
                .any(|l| l.starts_with(n) && l.split_whitespace().nth(1) == Some("Ready")),
            "{n} not Ready:\n{nodes}"
        );
    }
    let archs = cp.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.nodeInfo.architecture} {end}",
    ])?;
    ensure!(
        archs.contains("node-amd64=amd64") && archs.contains("node-arm64=arm64"),
        "{archs}"
    );
    let ready = cp.kubectl(&["get", "node", "node-arm64", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason} {.status.conditions[?(@.type==\"Ready\")].message}"])?;
    ensure!(ready == "KubeletReady kubelet is posting ready status", "{ready}");
    let labels = cp.kubectl(&["get", "node", "node-amd64", "-o", "jsonpath={.metadata.labels}"])?;
    ensure!(
        labels.contains("\"kubernetes.io/arch\":\"amd64\"")
            && labels.contains("\"kubernetes.io/hostname\":\"node-amd64\""),
        "{labels}"
    );
    let addr = cp.kubectl(&[
        "get",
        "node",
        "node-amd64",
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
    ])?;
    ensure!(addr == "10.0.2.15", "{addr}");
    // The node authenticates with its own certificate now; the CSR records who asked.
    let csrs = cp.kubectl(&[
        "get",
        "csr",
        "-o",
        "jsonpath={range .items[*]}{.spec.username} {.status.conditions[0].type}{\"\\n\"}{end}",
    ])?;
    ensure!(
        csrs.lines().count() == 2
            && csrs
                .lines()
                .all(|l| l.starts_with("system:bootstrap:") && l.ends_with(" Approved")),
        "{csrs}"
    );
    // Leases are renewed every 10 s.
    let renew = |n: &str| {
        cp.kubectl(&[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            n,
            "-o",
            "jsonpath={.spec.renewTime}",
        ])
    };
    let first = renew("node-amd64")?;
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = renew("node-amd64")?;
        if now != first {
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "lease not renewed in 60 s (renewTime {first})"
        );
    }
    ensure!(!renew("node-arm64")?.is_empty());
    Ok(())
}
