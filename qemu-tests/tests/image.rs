//! Image builder checks against the real inputs (Debian kernel packages, systemd stubs, the
//! static node binaries): reproducibility and the module closure. Run with `./build.sh test vm`.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use image::{Arch, BuildConfig, kernel::KernelPackage};

fn env_path(key: &str) -> Result<PathBuf> {
    std::env::var_os(key)
        .map(PathBuf::from)
        .with_context(|| format!("{key} not set (run through ./build.sh test vm)"))
}

fn inputs(arch: Arch, out: PathBuf) -> Result<BuildConfig> {
    let (deb, stub, triple) = match arch {
        Arch::X86_64 => ("amd64", "linuxx64.efi.stub", "x86_64-unknown-linux-musl"),
        Arch::Aarch64 => ("arm64", "linuxaa64.efi.stub", "aarch64-unknown-linux-musl"),
    };
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    Ok(BuildConfig {
        arch,
        kernel_root: env_path("NODEOS_KERNEL_CACHE")?.join(deb).join("root"),
        stub: env_path("NODEOS_STUB_CACHE")?
            .join(deb)
            .join("root/usr/lib/systemd/boot/efi")
            .join(stub),
        node_bin: target.join(triple).join("release/nodeos"),
        out,
        cmdline: arch.default_cmdline().into(),
        esp_mib: 64,
        state_mib: 64,
        extra_files: Vec::new(),
    })
}

/// A fresh build in a temporary directory gives byte-identical artifacts to the ones
/// `./build.sh image` wrote (two independent builds from the same inputs).
#[test]
#[ignore = "needs the kernel cache and node binaries: ./build.sh test vm"]
fn image_builds_are_reproducible() -> Result<()> {
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let tmp = tempfile::tempdir()?;
        let outputs = image::build(&inputs(arch, tmp.path().to_path_buf())?)?;
        let fresh = std::fs::read_to_string(tmp.path().join("SHA256SUMS"))?;
        let built = std::fs::read_to_string(qemu_tests::vm::out_dir().join(arch.name()).join("SHA256SUMS"))
            .context("no SHA256SUMS from ./build.sh image")?;
        ensure!(
            fresh == built,
            "{}: fresh build differs:\n{fresh}\nvs ./build.sh image:\n{built}",
            arch.name()
        );
        ensure!(
            outputs
                .files
                .iter()
                .any(|f| f.name == "node.efi" && f.bytes > 1_000_000)
        );
    }
    Ok(())
}

/// The module closure is computed from `depends=`: every dependency precedes its dependents.
#[test]
#[ignore = "needs the kernel cache: ./build.sh test vm"]
fn module_closure_orders_dependencies_first() -> Result<()> {
    for deb in ["amd64", "arm64"] {
        let pkg = KernelPackage::open(&env_path("NODEOS_KERNEL_CACHE")?.join(deb).join("root"))?;
        let mods = pkg.select(image::kernel::NODE_MODULES)?;
        let pos = |n: &str| mods.iter().position(|m| m.name == n);
        for m in &mods {
            for dep in pkg.depends(&m.path)? {
                let dep = image::kernel::normalize(&dep);
                if let Some(d) = pos(&dep) {
                    ensure!(
                        d < pos(&m.name).unwrap_or(0),
                        "{deb}: {dep} must load before {}",
                        m.name
                    );
                }
            }
        }
        // nft_masq needs nf_nat and nf_tables, which need nf_conntrack: all must be in the closure.
        for needed in [
            "nf_tables",
            "nf_nat",
            "nf_conntrack",
            "overlay",
            "bridge",
            "veth",
            "qemu_fw_cfg",
        ] {
            ensure!(pos(needed).is_some(), "{deb}: {needed} missing from the closure");
        }
        ensure!(
            pos("nf_conntrack") < pos("nf_nat") && pos("nf_nat") < pos("nft_masq"),
            "{deb}: bad order"
        );
    }
    Ok(())
}
