//! The runtime inside node VMs (x86_64 and arm64): the in-guest suite (`runtime-suite`, appended
//! to the initramfs) runs as the machine config's test command against the node's own runtime
//! process, pulling the project's test images from a real registry on the host's loopback
//! (Debian's `docker-registry`) through a QEMU guest forward.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use qemu_tests::registry::{HOSTILE, TestRegistry, write_test_images};
use qemu_tests::vm::{Arch, Nic, VmConfig, VmFactory, out_dir, target_dir};

/// Where guests reach the registry.
const REGISTRY_GUEST: (&str, u16) = ("10.0.2.100", 5000);
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

/// Every case the suite runs; each must report `ok`.
const CASES: &[&str] = &[
    "hostile_images",
    "namespaces",
    "pod_network",
    "share_process_namespace",
    "cgroup_values",
    "oom_killed",
    "seccomp_blocked",
    "exit_codes_and_logs",
    "stop_grace",
    "filesystem",
    "exec",
    "log_rotation",
    "sandbox_lost",
    "readopt",
    "cycles",
];

fn suite_bin(arch: Arch) -> PathBuf {
    target_dir().join(format!(
        "{}-unknown-linux-musl/release/runtime-suite",
        arch.name()
    ))
}

fn run_suite(arch: Arch) -> Result<()> {
    let reg = TestRegistry::start(None)?;
    let oci = tempfile::tempdir()?;
    write_test_images(oci.path(), &["amd64", "arm64"])?;
    reg.push(oci.path(), "busybox:1", "busybox:1", None)?;
    reg.push(oci.path(), "layered:1", "layered:1", None)?;
    for (case, _) in HOSTILE {
        reg.push(
            oci.path(),
            &format!("hostile/{case}:1"),
            &format!("hostile/{case}:1"),
            None,
        )?;
    }
    let mut f = VmFactory::new(&format!("runtime-{}", arch.name()))?;
    let bin = suite_bin(arch);
    let suite = std::fs::read(&bin)
        .with_context(|| format!("{} not built (./build.sh test runtime)", bin.display()))?;
    let registry = format!("{}:{}", REGISTRY_GUEST.0, REGISTRY_GUEST.1);
    let config = serde_json::json!({
        "apiVersion": "nodeos/v1alpha1",
        "hostname": "runtime-test",
        "debug": {"testCommand": ["/usr/lib/nodeos-test/runtime-suite", "--registry", registry]},
    });
    let cfg = VmConfig::direct(&out_dir(), arch)?
        .with_memory_mib(1024)
        .with_extra_initrd(f.dir(), &[("usr/lib/nodeos-test/runtime-suite", suite, 0o755)])?
        .with_nics(vec![Nic {
            guest_forwards: vec![(REGISTRY_GUEST.0.into(), REGISTRY_GUEST.1, reg.port)],
            ..Nic::default()
        }])
        .with_fw_cfg(config.to_string());
    let mut vm = f.start(&cfg)?;
    let done = vm.wait_for_line("SUITE done", SUITE_TIMEOUT)?;
    let console = vm.console();
    let results: Vec<&str> = console.lines().filter(|l| l.contains("SUITE ")).collect();
    eprintln!("{}", results.join("\n"));
    for case in CASES {
        ensure!(
            results.iter().any(|l| l.contains(&format!("SUITE ok {case} "))),
            "{arch:?}: case {case} did not pass:\n{}\n(logs in {})",
            results.join("\n"),
            f.dir().display()
        );
    }
    ensure!(done.contains("failed=0"), "{arch:?}: {done}");
    vm.wait_exit(Duration::from_secs(60))?;
    Ok(())
}

#[test]
#[ignore = "needs VM images and the suite: ./build.sh test runtime"]
fn runtime_suite_x86_64() -> Result<()> {
    run_suite(Arch::X86_64)
}

#[test]
#[ignore = "needs VM images and the suite: ./build.sh test runtime"]
fn runtime_suite_aarch64() -> Result<()> {
    run_suite(Arch::Aarch64)
}
