//! The runtime inside node VMs (x86_64 and arm64): the in-guest suite (`runtime-suite`, appended
//! to the initramfs) runs as the machine config's test command against the node's own runtime
//! process, pulling the project's test images from a real registry on the host's loopback
//! (Debian's `docker-registry`) through a QEMU guest forward.

use std::time::Duration;

use anyhow::{Result, ensure};
use qemu_tests::guest::run_guest_program;
use qemu_tests::vm::Arch;

const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

/// Every case the suite runs; each must report `ok`.
const CASES: &[&str] = &[
    "hostile_images",
    "namespaces",
    "pod_network",
    "host_namespaces",
    "share_process_namespace",
    "cgroup_values",
    "oom_killed",
    "seccomp_blocked",
    "exit_codes_and_logs",
    "stop_grace",
    "filesystem",
    "exec",
    "attach_input",
    "log_rotation",
    "sandbox_lost",
    "readopt",
    "runtime_restart",
    "cycles",
];

fn run_suite(arch: Arch) -> Result<()> {
    let (console, logs) = run_guest_program(
        arch,
        "runtime",
        "runtime-suite",
        &[],
        Vec::new(),
        "SUITE done",
        SUITE_TIMEOUT,
    )?;
    let results: Vec<&str> = console.lines().filter(|l| l.contains("SUITE ")).collect();
    eprintln!("{}", results.join("\n"));
    for case in CASES {
        ensure!(
            results.iter().any(|l| l.contains(&format!("SUITE ok {case} "))),
            "{arch:?}: case {case} did not pass:\n{}\n(logs in {})",
            results.join("\n"),
            logs.display()
        );
    }
    let done = results
        .iter()
        .find(|l| l.contains("SUITE done"))
        .copied()
        .unwrap_or_default();
    ensure!(done.contains("failed=0"), "{arch:?}: {done}");
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
