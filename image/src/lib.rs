//! The image builder: from a Debian kernel package, the systemd EFI stub and the static node
//! binary, it writes for one architecture `vmlinuz`, `initramfs.img`, `node.efi` (a UKI),
//! `disk.raw` (GPT: ESP with A/B boot slots + state partition) and `disk.qcow2`, plus
//! `SHA256SUMS`. Same inputs give the same bytes.

#![forbid(unsafe_code)]

pub mod cpio;
pub mod disk;
pub mod kernel;
pub mod uki;

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use cpio::{Archive, Node};
use kernel::KernelPackage;

/// Target architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    #[value(name = "aarch64")]
    Aarch64,
}

impl Arch {
    /// The name used in paths and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
    /// The removable-media boot path in the ESP (the UEFI fallback path).
    pub fn efi_fallback(self) -> &'static str {
        match self {
            Arch::X86_64 => "EFI/BOOT/BOOTX64.EFI",
            Arch::Aarch64 => "EFI/BOOT/BOOTAA64.EFI",
        }
    }
    /// The kernel command line the images boot with.
    pub fn default_cmdline(self) -> &'static str {
        match self {
            Arch::X86_64 => "console=ttyS0,115200 quiet panic=-1",
            Arch::Aarch64 => "console=ttyAMA0 quiet panic=-1",
        }
    }
}

/// Errors of the pipeline; each says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("kernel package: {0}")]
    Kernel(#[from] kernel::KernelError),
    #[error("UKI: {0}")]
    Uki(#[from] uki::UkiError),
    #[error("disk: {0}")]
    Disk(#[from] disk::DiskError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("qemu-img: {0}")]
    QemuImg(String),
}

type Result<T> = std::result::Result<T, BuildError>;

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| BuildError::Io {
        path: path.into(),
        source,
    })
}

fn write(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::write(path, data).map_err(|source| BuildError::Io {
        path: path.into(),
        source,
    })
}

/// Inputs of one build.
#[derive(Debug, Clone)]
pub struct BuildConfig {
    pub arch: Arch,
    /// The unpacked kernel package (holds `boot/` and `lib/modules/`).
    pub kernel_root: PathBuf,
    /// systemd's `linux{x64,aa64}.efi.stub`.
    pub stub: PathBuf,
    /// The static node binary (becomes `/init`).
    pub node_bin: PathBuf,
    pub out: PathBuf,
    pub cmdline: String,
    /// Minimum ESP size; it grows to hold two images plus 16 MiB.
    pub esp_mib: u64,
    pub state_mib: u64,
    /// Extra files for the initramfs: (path in the image, contents, mode). Test images use this.
    pub extra_files: Vec<(String, Vec<u8>, u32)>,
}

/// What a build wrote, with sizes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outputs {
    pub arch: &'static str,
    pub kernel_version: String,
    pub modules: Vec<String>,
    pub files: Vec<OutputFile>,
}

/// One written file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutputFile {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// Device nodes the kernel needs before devtmpfs is mounted (it opens /dev/console for PID 1).
fn add_base(a: &mut Archive) {
    a.add("dev", Node::Dir, 0o755);
    a.add("dev/console", Node::CharDev(5, 1), 0o600);
    a.add("dev/kmsg", Node::CharDev(1, 11), 0o644);
    a.add("dev/null", Node::CharDev(1, 3), 0o666);
    for d in ["proc", "sys", "run", "tmp", "etc"] {
        a.add(d, Node::Dir, 0o755);
    }
}

/// zstd (level 19, single-threaded, no dictionary): deterministic, and the kernel unpacks it
/// faster than gzip.
pub fn zstd(data: &[u8]) -> Result<Vec<u8>> {
    zstd::bulk::compress(data, 19).map_err(|source| BuildError::Io {
        path: "zstd".into(),
        source,
    })
}

fn os_release(kernel: &str) -> String {
    let v = env!("CARGO_PKG_VERSION");
    format!(
        "ID=nodeos\nNAME=nodeos\nVERSION_ID={v}\nPRETTY_NAME=\"nodeos {v} (Linux {kernel})\"\nHOME_URL=\"\"\n"
    )
}

/// Builds the node initramfs archive (uncompressed cpio bytes) and returns it with the module list.
pub fn node_initramfs(cfg: &BuildConfig, pkg: &KernelPackage) -> Result<(Vec<u8>, Vec<String>)> {
    let mut a = Archive::new(0);
    add_base(&mut a);
    a.add("init", Node::File(read(&cfg.node_bin)?), 0o755);
    a.add(
        "etc/os-release",
        Node::File(os_release(&pkg.version).into_bytes()),
        0o644,
    );
    // Boot-critical modules (config, network, power button) load before `init: ready`; the rest
    // load in the background. The list marks the split with a `# background` line.
    let early = pkg.select(kernel::BOOT_MODULES)?;
    let mut mods = early.clone();
    for m in pkg.select(kernel::NODE_MODULES)? {
        if !mods.iter().any(|e| e.name == m.name) {
            mods.push(m);
        }
    }
    let mut list = String::new();
    for (i, m) in mods.iter().enumerate() {
        // Signatures are stripped: verifying them cost 0.9 s of boot under TCG (measured), and the
        // modules travel inside the same initramfs/UKI as the kernel, which is the unit of trust.
        // Boot-critical modules ship uncompressed (in-kernel xz cost ~35 ms a module under TCG);
        // background modules are re-compressed with xz, which keeps the initramfs the kernel must
        // unpack before /init small, and moves their decompression off the boot path.
        let elf = pkg.module_elf(&m.path)?;
        let elf = kernel::strip_signature(&elf);
        let base = m.rel_path.strip_suffix(".xz").unwrap_or(&m.rel_path);
        let (rel, data) = if i < early.len() {
            (base.to_string(), elf.to_vec())
        } else {
            (format!("{base}.xz"), kernel::xz_for_kernel(elf)?)
        };
        let dest = format!("lib/modules/{}/{rel}", pkg.version);
        a.add(&dest, Node::File(data), 0o644);
        if list.lines().count() == early.len() {
            list.push_str("# background\n");
        }
        list.push_str(&format!("/{dest}\n"));
    }
    a.add("lib/modules/load.list", Node::File(list.into_bytes()), 0o644);
    for (path, data, mode) in &cfg.extra_files {
        a.add(path, Node::File(data.clone()), *mode);
    }
    let mut out = Vec::new();
    a.write_to(&mut out).map_err(|source| BuildError::Io {
        path: "initramfs".into(),
        source,
    })?;
    Ok((out, mods.into_iter().map(|m| m.name).collect()))
}

/// An initramfs holding only `bin` as `/init`: the do-nothing floor for boot benchmarks.
pub fn floor_initramfs(bin: &Path) -> Result<Vec<u8>> {
    let mut a = Archive::new(0);
    add_base(&mut a);
    a.add("init", Node::File(read(bin)?), 0o755);
    let mut out = Vec::new();
    a.write_to(&mut out).map_err(|source| BuildError::Io {
        path: "initramfs".into(),
        source,
    })?;
    zstd(&out)
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the whole pipeline for one architecture.
pub fn build(cfg: &BuildConfig) -> Result<Outputs> {
    std::fs::create_dir_all(&cfg.out).map_err(|source| BuildError::Io {
        path: cfg.out.clone(),
        source,
    })?;
    let pkg = KernelPackage::open(&cfg.kernel_root)?;
    let (cpio, modules) = node_initramfs(cfg, &pkg)?;
    let initrd = zstd(&cpio)?;
    let kernel = read(&pkg.vmlinuz)?;
    let stub = read(&cfg.stub)?;
    let osrel = os_release(&pkg.version);
    let uki = uki::build(
        &stub,
        &[
            (".osrel", osrel.as_bytes()),
            (".cmdline", cfg.cmdline.as_bytes()),
            (".initrd", &initrd),
            (".linux", &kernel),
        ],
    )?;
    // Slot A is the UEFI fallback path itself (what firmware boots with no boot entries); slot B
    // is written by upgrades and starts as a copy. The ESP holds two images plus headroom.
    let slots = format!(
        r#"{{"default":"a","slots":{{"a":"{}","b":"EFI/nodeos/b.efi"}}}}"#,
        cfg.arch.efi_fallback()
    );
    let esp_mib = cfg
        .esp_mib
        .max((2 * uki.len() as u64).div_ceil(1 << 20).div_ceil(8) * 8 + 16);
    let esp = disk::build_fat(
        esp_mib,
        "NODEOS-ESP",
        &[
            (cfg.arch.efi_fallback(), &uki),
            ("EFI/nodeos/b.efi", &uki),
            ("EFI/nodeos/slots.json", slots.as_bytes()),
        ],
    )?;
    let raw = disk::build_gpt(
        &format!("nodeos/{}/{}", cfg.arch.name(), sha256_hex(&uki)),
        &[
            disk::Partition {
                name: "esp".into(),
                type_guid: disk::ESP_TYPE.into(),
                size_mib: esp_mib,
                contents: esp,
            },
            disk::Partition {
                name: "nodeos-state".into(),
                type_guid: disk::LINUX_DATA_TYPE.into(),
                size_mib: cfg.state_mib,
                contents: Vec::new(),
            },
        ],
    )?;
    let o = &cfg.out;
    write(&o.join("vmlinuz"), &kernel)?;
    write(&o.join("initramfs.img"), &initrd)?;
    write(&o.join("cmdline"), cfg.cmdline.as_bytes())?;
    write(&o.join("node.efi"), &uki)?;
    write(&o.join("disk.raw"), &raw)?;
    let qcow = o.join("disk.qcow2");
    let _ = std::fs::remove_file(&qcow);
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(o.join("disk.raw"))
        .arg(&qcow)
        .status()
        .map_err(|e| BuildError::QemuImg(format!("cannot run qemu-img (run ./build.sh setup): {e}")))?;
    if !status.success() {
        return Err(BuildError::QemuImg(format!("convert failed: {status}")));
    }
    let mut files = Vec::new();
    let mut sums = String::new();
    for name in [
        "vmlinuz",
        "initramfs.img",
        "cmdline",
        "node.efi",
        "disk.raw",
        "disk.qcow2",
    ] {
        let data = read(&o.join(name))?;
        let sha = sha256_hex(&data);
        sums.push_str(&format!("{sha}  {name}\n"));
        files.push(OutputFile {
            name: name.into(),
            bytes: data.len() as u64,
            sha256: sha,
        });
    }
    write(&o.join("SHA256SUMS"), sums.as_bytes())?;
    Ok(Outputs {
        arch: cfg.arch.name(),
        kernel_version: pkg.version,
        modules,
        files,
    })
}
