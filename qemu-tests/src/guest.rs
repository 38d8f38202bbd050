//! Programs run inside node VMs: a static binary appended to the initramfs and started as the
//! machine config's `debug.testCommand`, with the project's test images in a real registry on
//! the host's loopback, reached from the guest at [`REGISTRY_GUEST`] through a guest forward.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use image::cpio::Node;

use crate::registry::{HOSTILE, TestRegistry, write_test_images};
use crate::vm::{Arch, Nic, VmConfig, VmFactory, out_dir, target_dir};

/// Where guests reach the registry.
pub const REGISTRY_GUEST: (&str, u16) = ("10.0.2.100", 5000);
/// Where appended test programs live in the guest (kept by init across the root move).
pub const GUEST_DIR: &str = "usr/lib/nodeos-test";

/// A registry holding the project's `busybox:1` (both arches), for nodes that run pods.
pub fn busybox_registry() -> Result<TestRegistry> {
    registry_with(&["busybox:1".to_string()])
}

/// A registry on loopback holding `names` from the project's test images (both arches).
pub fn registry_with(names: &[String]) -> Result<TestRegistry> {
    let reg = TestRegistry::start(None)?;
    let oci = tempfile::tempdir()?;
    write_test_images(oci.path(), &["amd64", "arm64"])?;
    for name in names {
        reg.push(oci.path(), name, name, None)?;
    }
    Ok(reg)
}

/// The image reference guests use for [`busybox_registry`]'s image.
pub fn guest_busybox() -> String {
    format!("{}:{}/busybox:1", REGISTRY_GUEST.0, REGISTRY_GUEST.1)
}

/// A release build of one of the runtime crate's guest programs for `arch`.
pub fn guest_bin(arch: Arch, name: &str) -> PathBuf {
    target_dir().join(format!("{}-unknown-linux-musl/release/{name}", arch.name()))
}

/// Every file and symlink under `root` (skipping `skip` prefixes), as initramfs entries under
/// `prefix`.
pub fn tree_entries(root: &Path, prefix: &str, skip: &[&str]) -> Result<Vec<(String, Node, u32)>> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let p = e.path();
            let rel = p.strip_prefix(root)?.to_string_lossy().into_owned();
            if skip.iter().any(|s| rel.starts_with(s)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&p)?;
            let dest = format!("{prefix}/{rel}");
            if meta.file_type().is_symlink() {
                out.push((
                    dest,
                    Node::Symlink(std::fs::read_link(&p)?.to_string_lossy().into_owned()),
                    0o777,
                ));
            } else if meta.is_dir() {
                out.push((dest, Node::Dir, 0o755));
                stack.push(p);
            } else {
                out.push((
                    dest,
                    Node::File(std::fs::read(&p)?),
                    meta.permissions().mode() & 0o7777,
                ));
            }
        }
    }
    Ok(out)
}

/// Boots a node VM of `arch` that runs `program` (a guest binary name) with `args` after
/// `--registry <guest registry>`, and returns the console once `done` appears.
pub fn run_guest_program(
    arch: Arch,
    test_name: &str,
    program: &str,
    args: &[&str],
    extra: Vec<(String, Node, u32)>,
    done: &str,
    timeout: Duration,
) -> Result<(String, PathBuf)> {
    let mut images = vec!["busybox:1".to_string(), "layered:1".to_string()];
    images.extend(HOSTILE.iter().map(|(case, _)| format!("hostile/{case}:1")));
    let reg = registry_with(&images)?;
    let mut f = VmFactory::new(&format!("{test_name}-{}", arch.name()))?;
    let bin = guest_bin(arch, program);
    let bytes = std::fs::read(&bin)
        .with_context(|| format!("{} not built (./build.sh test runtime)", bin.display()))?;
    let mut files = vec![(format!("{GUEST_DIR}/{program}"), Node::File(bytes), 0o755)];
    files.extend(extra);
    let registry = format!("{}:{}", REGISTRY_GUEST.0, REGISTRY_GUEST.1);
    let mut command = vec![format!("/{GUEST_DIR}/{program}"), "--registry".into(), registry];
    command.extend(args.iter().map(|a| a.to_string()));
    let config = serde_json::json!({
        "apiVersion": "nodeos/v1alpha1",
        "hostname": test_name,
        "debug": {"testCommand": command},
    });
    let cfg = VmConfig::direct(&out_dir(), arch)?
        .with_memory_mib(1024)
        .with_extra_initrd(f.dir(), &files)?
        .with_nics(vec![Nic {
            guest_forwards: vec![(REGISTRY_GUEST.0.into(), REGISTRY_GUEST.1, reg.port)],
            ..Nic::default()
        }])
        .with_fw_cfg(config.to_string());
    let mut vm = f.start(&cfg)?;
    vm.wait_for_line(done, timeout)?;
    let console = vm.console();
    vm.wait_exit(Duration::from_secs(60))?;
    Ok((console, f.dir().to_path_buf()))
}
