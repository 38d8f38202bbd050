//! Boot, supervision, shutdown and machine-config scenarios on real QEMU guests (TCG).
//! Run with `./build.sh test vm` (they need the images of `./build.sh image`).

use std::time::Duration;

use anyhow::{Result, ensure};
use qemu_tests::vm::{Arch, Nic, VmConfig, VmFactory, field_u64, free_port, out_dir};

/// Generous: two busy cores, TCG, sometimes two guests at once.
const BOOT: Duration = Duration::from_secs(300);
const EXIT: Duration = Duration::from_secs(120);

fn poweroff_config() -> &'static str {
    r#"{"apiVersion":"nodeos/v1alpha1","onReady":"poweroff"}"#
}

/// Boots, reaches `init: ready`, powers off through the machine config, and QEMU exits cleanly
/// with no kernel panic.
fn boot_to_ready_and_poweroff(name: &str, cfg: VmConfig) -> Result<()> {
    let mut f = VmFactory::new(name)?;
    let mut vm = f.start(&cfg.with_fw_cfg(poweroff_config()))?;
    let ready = vm.wait_for_line("init: ready boot_ms=", BOOT)?;
    ensure!(
        field_u64(&ready, "boot_ms").is_some_and(|ms| ms > 0),
        "bad ready line {ready:?}"
    );
    let status = vm.wait_exit(EXIT)?;
    let console = vm.console();
    ensure!(status.success(), "QEMU exit status {status}");
    ensure!(!console.contains("Kernel panic"), "kernel panic:\n{console}");
    ensure!(
        console.contains("init: going down action=Poweroff"),
        "no orderly poweroff:\n{console}"
    );
    let cg = console
        .lines()
        .find(|l| l.contains("init: cgroup2 mounted subtree_control="))
        .unwrap_or_default();
    for c in ["cpu", "memory", "pids", "io"] {
        ensure!(
            cg.split(['=', ' ']).any(|w| w == c),
            "controller {c} not enabled: {cg:?}"
        );
    }
    let mods = console
        .lines()
        .find(|l| l.contains("init: modules loaded="))
        .unwrap_or_default();
    ensure!(
        mods.contains(" failed=0 "),
        "a module failed to load: {mods:?}\n{console}"
    );
    ensure!(console.contains("init: root moved to tmpfs"), "{console}");
    Ok(())
}

#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn x86_64_direct_boot_reaches_ready_and_powers_off() -> Result<()> {
    boot_to_ready_and_poweroff("x86_64-direct", VmConfig::direct(&out_dir(), Arch::X86_64)?)
}

#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn aarch64_direct_boot_reaches_ready_and_powers_off() -> Result<()> {
    boot_to_ready_and_poweroff("aarch64-direct", VmConfig::direct(&out_dir(), Arch::Aarch64)?)
}

#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn x86_64_uefi_disk_boots_slot_a() -> Result<()> {
    boot_to_ready_and_poweroff("x86_64-uefi", VmConfig::uefi(&out_dir(), Arch::X86_64))
}

#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn aarch64_uefi_disk_boots_slot_a() -> Result<()> {
    boot_to_ready_and_poweroff(
        "aarch64-uefi",
        VmConfig::uefi(&out_dir(), Arch::Aarch64).with_memory_mib(1024),
    )
}

/// The node is configured (hostname, DHCP address on restricted user networking), its agent
/// serves TLS through a host forward, and the ACPI power button gives an orderly poweroff.
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn x86_64_network_agent_and_power_button() -> Result<()> {
    let port = free_port()?;
    let cfg = VmConfig::direct(&out_dir(), Arch::X86_64)?
        .with_nics(vec![Nic {
            forwards: vec![(port, 10250)],
            ..Nic::default()
        }])
        .with_fw_cfg(r#"{"apiVersion":"nodeos/v1alpha1","hostname":"test-node","shutdownGraceSeconds":5}"#);
    let mut f = VmFactory::new("x86_64-network")?;
    let mut vm = f.start(&cfg)?;
    vm.wait_for_line("init: ready", BOOT)?;
    let net = vm.wait_for_line("init: network up", BOOT)?;
    ensure!(
        net.contains("interface=eth0") && net.contains("address=10.0.2.15/24"),
        "{net}"
    );
    vm.wait_for_line("init: hostname set hostname=test-node", BOOT)?;
    vm.wait_for_line("agent: ready", BOOT)?;
    let mods = vm.wait_for_line("init: modules done", BOOT)?;
    ensure!(mods.contains(" failed=0 "), "background modules: {mods}");
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "30",
            &format!("https://127.0.0.1:{port}/healthz"),
        ])
        .output()?;
    ensure!(
        String::from_utf8_lossy(&out.stdout) == "ok",
        "agent health: {:?}",
        out
    );
    // The agent runs as a supervised child: it must not have restarted.
    ensure!(
        !vm.console().contains("service exited service=agent"),
        "agent exited:\n{}",
        vm.console()
    );
    vm.qmp("system_powerdown", None)?;
    vm.wait_for_line("init: power button pressed", EXIT)?;
    let status = vm.wait_exit(EXIT)?;
    let console = vm.console();
    ensure!(status.success(), "QEMU exit {status}");
    ensure!(
        console.contains("init: service stopped service=agent"),
        "agent not stopped with grace:\n{console}"
    );
    ensure!(console.contains("init: going down action=Poweroff"), "{console}");
    ensure!(!console.contains("Kernel panic"), "{console}");
    Ok(())
}

/// Ctrl-alt-del reboots in order (QEMU runs with -no-reboot, so the reboot ends it).
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn x86_64_ctrl_alt_del_reboots_in_order() -> Result<()> {
    let mut f = VmFactory::new("x86_64-cad")?;
    let mut vm = f.start(&VmConfig::direct(&out_dir(), Arch::X86_64)?)?;
    vm.wait_for_line("init: ready", BOOT)?;
    // The i8042 keyboard delivers ctrl-alt-del; without CAD disabled the kernel would reboot at once.
    vm.qmp(
        "send-key",
        Some(serde_json::json!({"keys":[
        {"type":"qcode","data":"ctrl"},{"type":"qcode","data":"alt"},{"type":"qcode","data":"delete"}]})),
    )?;
    vm.wait_for_line("init: ctrl-alt-del", EXIT)?;
    vm.wait_exit(EXIT)?;
    let console = vm.console();
    ensure!(console.contains("init: going down action=Reboot"), "{console}");
    ensure!(!console.contains("Kernel panic"), "{console}");
    Ok(())
}

/// A supervised child that crashes is restarted with exponential back-off.
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn crashing_service_restarts_with_backoff() -> Result<()> {
    let cfg = VmConfig::direct(&out_dir(), Arch::X86_64)?
        .with_fw_cfg(r#"{"apiVersion":"nodeos/v1alpha1","debug":{"crashService":true}}"#);
    let mut f = VmFactory::new("crash-backoff")?;
    let mut vm = f.start(&cfg)?;
    let lines = vm.wait_for_lines("init: warn: service exited service=crashtest", 5, BOOT)?;
    let delays: Vec<u64> = lines
        .iter()
        .filter_map(|l| field_u64(l, "restart_in_ms"))
        .collect();
    ensure!(
        delays == [100, 200, 400, 800, 1600],
        "delays {delays:?} from {lines:#?}"
    );
    for l in &lines {
        ensure!(l.contains("status=1"), "{l}");
    }
    let starts = vm
        .console()
        .matches("init: service started service=crashtest")
        .count();
    ensure!(starts >= 5, "only {starts} starts");
    Ok(())
}

/// A bad machine config is reported clearly (source, field) and the node falls back to the safe
/// default and still comes up.
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn bad_machine_config_is_reported_and_node_falls_back() -> Result<()> {
    let cases = [
        (
            r#"{"apiVersion":"nodeos/v1alpha1","hostnme":"typo"}"#,
            "unknown field `hostnme`",
        ),
        (
            r#"{"apiVersion":"nodeos/v1alpha1","hostname":"Not_Valid"}"#,
            "invalid field hostname",
        ),
        ("{this is not json", "fw_cfg opt/nodeos/config: not a JSON object"),
    ];
    let mut f = VmFactory::new("bad-config")?;
    for (doc, want) in cases {
        let mut vm = f.start(&VmConfig::direct(&out_dir(), Arch::X86_64)?.with_fw_cfg(doc))?;
        let line = vm.wait_for_line("init: error: machine config rejected", BOOT)?;
        ensure!(line.contains(want), "{doc}: got {line:?}");
        ensure!(line.contains("using safe defaults"), "{line}");
        vm.wait_for_line("init: ready", BOOT)?;
        // Safe default: DHCP on every interface.
        vm.wait_for_line("init: network up interface=eth0", BOOT)?;
    }
    Ok(())
}

/// The command line can override single fields of the fw_cfg document.
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn kernel_cmdline_config_overrides_fw_cfg() -> Result<()> {
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD.encode(r#"{"hostname":"from-cmdline"}"#);
    let cfg = VmConfig::direct(&out_dir(), Arch::Aarch64)?
        .with_cmdline_extra(&format!("nodeos.config={patch}"))
        .with_fw_cfg(r#"{"apiVersion":"nodeos/v1alpha1","hostname":"from-fwcfg","onReady":"poweroff"}"#);
    let mut f = VmFactory::new("cmdline-config")?;
    let mut vm = f.start(&cfg)?;
    vm.wait_for_line("init: hostname set hostname=from-cmdline", BOOT)?;
    ensure!(vm.wait_exit(EXIT)?.success());
    Ok(())
}

/// Static addressing from the machine config on arm64; the agent's TLS endpoint answers through
/// a host forward (slirp forwards to 10.0.2.15, the address configured here).
#[test]
#[ignore = "needs VM images: ./build.sh test vm"]
fn aarch64_static_address_and_agent() -> Result<()> {
    let port = free_port()?;
    let cfg = VmConfig::direct(&out_dir(), Arch::Aarch64)?
        .with_nics(vec![Nic {
            forwards: vec![(port, 10250)],
            ..Nic::default()
        }])
        .with_fw_cfg(
            r#"{"apiVersion":"nodeos/v1alpha1","hostname":"arm-node","network":{"interfaces":[
                {"name":"eth0","address":"10.0.2.15/24","gateway":"10.0.2.2"}],"nameservers":["10.0.2.3"]}}"#,
        );
    let mut f = VmFactory::new("aarch64-static")?;
    let mut vm = f.start(&cfg)?;
    let net = vm.wait_for_line("init: network up", BOOT)?;
    ensure!(
        net.contains("address=10.0.2.15/24") && net.contains("gateway=Some(10.0.2.2)"),
        "{net}"
    );
    vm.wait_for_line("agent: ready", BOOT)?;
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "30",
            &format!("https://127.0.0.1:{port}/healthz"),
        ])
        .output()?;
    ensure!(
        String::from_utf8_lossy(&out.stdout) == "ok",
        "agent health: {:?}",
        out
    );
    Ok(())
}
