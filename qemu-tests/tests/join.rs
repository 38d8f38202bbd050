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
    // The node authenticates with its own certificate now; the CSR records who asked. Each node
    // then asks for its serving certificate as itself, approved for its own name.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let csrs = loop {
        let csrs = cp.kubectl(&[
            "get",
            "csr",
            "-o",
            "jsonpath={range .items[*]}{.spec.signerName} {.spec.username} {.status.conditions[0].type}{\"\\n\"}{end}",
        ])?;
        // The serving CSRs follow registration by a moment.
        if csrs.lines().count() >= 4 || std::time::Instant::now() > deadline {
            break csrs;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let mut lines: Vec<&str> = csrs.lines().collect();
    lines.sort();
    ensure!(
        lines.len() == 4
            && lines[..2].iter().all(|l| l
                .starts_with("kubernetes.io/kube-apiserver-client-kubelet system:bootstrap:")
                && l.ends_with(" Approved"))
            && lines[2] == "kubernetes.io/kubelet-serving system:node:node-amd64 Approved"
            && lines[3] == "kubernetes.io/kubelet-serving system:node:node-arm64 Approved",
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

/// A node with a state partition keeps its identity across a reboot, so the bootstrap token may
/// be gone by then (it expires a day after the control plane's first start): the node comes back
/// with the client and serving certificates it recorded, and asks for nothing new.
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn a_rebooted_node_keeps_its_identity_without_the_bootstrap_token() -> Result<()> {
    let cp = ControlPlane::start()?;
    let mut f = VmFactory::new("identity")?;
    let disk = f.dir().join("state.img");
    qemu_tests::vm::state_disk(&disk)?;
    let node = "keeper";
    let cfg = VmConfig::direct(&out_dir(), Arch::X86_64)?
        .with_nics(vec![cp.nic()])
        .with_fw_cfg(cp.machine_config(node)?)
        .with_extra_disk(&disk);
    let mut vm = f.start(&cfg)?;
    let read = vm.wait_for_line("agent: state partition read", BOOT)?;
    ensure!(
        read.contains("restored=0"),
        "a blank partition restores nothing: {read}"
    );
    vm.wait_for_line("agent: node registered", BOOT)?;
    // Recorded twice: after the client certificate, after the serving certificate.
    vm.wait_for_lines("identity recorded on the state partition", 2, BOOT)?;
    vm.qmp("system_powerdown", None)?;
    let status = vm.wait_exit(Duration::from_secs(120))?;
    ensure!(status.success(), "QEMU: {status}");
    drop(vm);
    // The token is gone: an expired or deleted one cannot join anyone.
    let token = std::fs::read_to_string(cp.dir().join("pki/bootstrap.token"))?;
    let id = token.trim().split('.').next().unwrap_or_default().to_string();
    cp.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "secret",
        &format!("bootstrap-token-{id}"),
    ])?;
    let mut vm = f.start(&cfg)?;
    let read = vm.wait_for_line("agent: state partition read", BOOT)?;
    ensure!(
        read.contains("restored=5"),
        "ca.crt, node.crt/key, serving.crt/key: {read}"
    );
    vm.wait_for_line("agent: node registered", BOOT)?;
    vm.wait_for_line("serving certificate in use", BOOT)?;
    let console = vm.console();
    ensure!(
        !console.contains("joining the control plane failed")
            && !console.contains("serving certificate requested"),
        "the node asked for something again:\n{console}"
    );
    let csrs = cp.kubectl(&[
        "get",
        "csr",
        "-o",
        "jsonpath={range .items[*]}{.spec.signerName}{\"\\n\"}{end}",
    ])?;
    let mut signers: Vec<&str> = csrs.lines().collect();
    signers.sort();
    ensure!(
        signers
            == [
                "kubernetes.io/kube-apiserver-client-kubelet",
                "kubernetes.io/kubelet-serving"
            ],
        "one CSR of each, from the first boot:\n{csrs}"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = cp.kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        if ready == "True" {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{node} not Ready after the reboot: {ready}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}
