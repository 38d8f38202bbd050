//! The Debian kernel package as unpacked by `build.sh setup`: its kernel image and the modules
//! the node needs, with their dependency closure computed from each module's own `depends=`
//! modinfo (no depmod, no modules.dep).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

/// The modules every node loads at boot (names as `modinfo` spells them, `-` and `_` alike).
pub const NODE_MODULES: &[&str] = &[
    // config and control
    "qemu_fw_cfg",
    "evdev",
    "button",
    // devices
    "virtio_net",
    "virtio_blk",
    "virtio_input",
    "vmw_vsock_virtio_transport",
    // filesystems and integrity
    "overlay",
    "squashfs",
    "erofs",
    "dm_verity",
    // pod and service networking
    "veth",
    "bridge",
    "br_netfilter",
    "vxlan",
    "nf_tables",
    "nf_conntrack",
    "nf_nat",
    "nft_chain_nat",
    "nft_masq",
    // host ports (runtime::net::nft: fib daddr type local ... dnat)
    "nft_nat",
    "nft_fib_ipv4",
];

/// The subset (with its closure) loaded before `init: ready`: the machine config (fw_cfg), the
/// network and block devices, and the power button.
pub const BOOT_MODULES: &[&str] = &["qemu_fw_cfg", "virtio_net", "virtio_blk", "evdev", "button"];

/// Errors reading the kernel package.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{path}: {reason}")]
    Layout { path: PathBuf, reason: String },
    #[error("module {name}: not in the kernel package and not built in")]
    UnknownModule { name: String },
    #[error("module {path}: {reason}")]
    BadModule { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, KernelError>;

/// The unpacked kernel package.
#[derive(Debug, Clone)]
pub struct KernelPackage {
    pub version: String,
    pub vmlinuz: PathBuf,
    pub modules_dir: PathBuf,
    index: BTreeMap<String, PathBuf>,
    builtin: HashSet<String>,
}

/// A module to ship, in load order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleFile {
    pub name: String,
    /// Path relative to `/lib/modules/<version>/`.
    pub rel_path: String,
    pub path: PathBuf,
}

/// Module names compare with `-` and `_` equal.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

fn module_name_of(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(".ko.xz")
        .or_else(|| file_name.strip_suffix(".ko.zst"))
        .or_else(|| file_name.strip_suffix(".ko"))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|source| KernelError::Io {
        path: dir.into(),
        source,
    })?;
    for e in rd {
        let e = e.map_err(|source| KernelError::Io {
            path: dir.into(),
            source,
        })?;
        let p = e.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

impl KernelPackage {
    /// Opens an unpacked package root (the directory holding `boot/` and `lib/modules/`).
    pub fn open(root: &Path) -> Result<Self> {
        let boot = root.join("boot");
        let rd = std::fs::read_dir(&boot).map_err(|source| KernelError::Io {
            path: boot.clone(),
            source,
        })?;
        let mut vmlinuz = None;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(v) = name.strip_prefix("vmlinuz-") {
                vmlinuz = Some((v.to_string(), e.path()));
            }
        }
        let (version, vmlinuz) = vmlinuz.ok_or_else(|| KernelError::Layout {
            path: boot.clone(),
            reason: "no vmlinuz-* in boot/".into(),
        })?;
        let modules_dir = root.join("lib/modules").join(&version);
        if !modules_dir.is_dir() {
            return Err(KernelError::Layout {
                path: modules_dir,
                reason: "missing modules directory".into(),
            });
        }
        let mut files = Vec::new();
        walk(&modules_dir.join("kernel"), &mut files)?;
        files.sort();
        let mut index = BTreeMap::new();
        for f in files {
            if let Some(name) = f.file_name().and_then(|n| n.to_str()).and_then(module_name_of) {
                index.insert(normalize(name), f.clone());
            }
        }
        let builtin_path = modules_dir.join("modules.builtin");
        let builtin = std::fs::read_to_string(&builtin_path)
            .map_err(|source| KernelError::Io {
                path: builtin_path,
                source,
            })?
            .lines()
            .filter_map(|l| l.rsplit('/').next().and_then(module_name_of).map(normalize))
            .collect();
        Ok(Self {
            version,
            vmlinuz,
            modules_dir,
            index,
            builtin,
        })
    }

    /// The module's ELF bytes (decompressed when the file is `.ko.xz`).
    pub fn module_elf(&self, path: &Path) -> Result<Vec<u8>> {
        let raw = std::fs::read(path).map_err(|source| KernelError::Io {
            path: path.into(),
            source,
        })?;
        if path.extension().is_some_and(|e| e == "xz") {
            let mut out = Vec::new();
            lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out).map_err(|e| KernelError::BadModule {
                path: path.into(),
                reason: format!("xz: {e}"),
            })?;
            Ok(out)
        } else {
            Ok(raw)
        }
    }

    /// The `depends=` of a module file, read from its `.modinfo` ELF section.
    pub fn depends(&self, path: &Path) -> Result<Vec<String>> {
        let elf = self.module_elf(path)?;
        modinfo_depends(&elf).map_err(|reason| KernelError::BadModule {
            path: path.into(),
            reason,
        })
    }

    /// The dependency closure of `wanted`, dependencies first; built-in modules are skipped.
    pub fn select(&self, wanted: &[&str]) -> Result<Vec<ModuleFile>> {
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        for name in wanted {
            self.visit(&normalize(name), &mut seen, &mut order, 0)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        seen: &mut HashSet<String>,
        order: &mut Vec<ModuleFile>,
        depth: usize,
    ) -> Result<()> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let Some(path) = self.index.get(name) else {
            if self.builtin.contains(name) {
                return Ok(());
            }
            return Err(KernelError::UnknownModule { name: name.into() });
        };
        if depth > 64 {
            return Err(KernelError::BadModule {
                path: path.clone(),
                reason: "dependency chain too deep".into(),
            });
        }
        for dep in self.depends(path)? {
            self.visit(&normalize(&dep), seen, order, depth + 1)?;
        }
        let rel_path = path
            .strip_prefix(&self.modules_dir)
            .map_err(|_| KernelError::Layout {
                path: path.clone(),
                reason: "outside the modules dir".into(),
            })?
            .to_string_lossy()
            .into_owned();
        order.push(ModuleFile {
            name: name.into(),
            rel_path,
            path: path.clone(),
        });
        Ok(())
    }
}

/// Parses the `.modinfo` section of a module ELF and returns its `depends=` list.
pub fn modinfo_depends(elf: &[u8]) -> std::result::Result<Vec<String>, String> {
    let file = object::File::parse(elf).map_err(|e| format!("not an ELF object: {e}"))?;
    let section = file.section_by_name(".modinfo").ok_or("no .modinfo section")?;
    let data = section.data().map_err(|e| format!(".modinfo: {e}"))?;
    let mut deps = Vec::new();
    for entry in data.split(|b| *b == 0) {
        if let Some(v) = entry.strip_prefix(b"depends=") {
            let v = std::str::from_utf8(v).map_err(|_| "depends= is not UTF-8")?;
            deps.extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_string));
        }
    }
    Ok(deps)
}

/// Compresses a module the way the kernel's in-kernel decompressor accepts it (xz, CRC32 check,
/// 1 MiB dictionary), with Debian's `xz` (single-threaded: the output is deterministic).
pub fn xz_for_kernel(elf: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let io = |source| KernelError::Io {
        path: "xz".into(),
        source,
    };
    let mut child = Command::new("xz")
        .args(["--check=crc32", "--lzma2=dict=1MiB", "-T1", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(io)?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| io(std::io::Error::other("no stdin")))?;
    let data = elf.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().map_err(io)?;
    writer
        .join()
        .map_err(|_| io(std::io::Error::other("writer panicked")))?
        .map_err(io)?;
    if !out.status.success() {
        return Err(io(std::io::Error::other(format!(
            "xz exited with {}",
            out.status
        ))));
    }
    Ok(out.stdout)
}

/// The marker the kernel's sign-file appends after a module signature.
const SIG_MARKER: &[u8] = b"~Module signature appended~\n";

/// Removes an appended module signature, returning the bare ELF (unchanged if unsigned).
pub fn strip_signature(elf: &[u8]) -> &[u8] {
    let Some(body) = elf.strip_suffix(SIG_MARKER) else {
        return elf;
    };
    // struct module_signature (12 bytes) ends with the signature length, big-endian.
    if body.len() < 12 {
        return elf;
    }
    let info = &body[body.len() - 12..];
    let sig_len = u32::from_be_bytes([info[8], info[9], info[10], info[11]]) as usize;
    match (body.len() - 12).checked_sub(sig_len) {
        Some(end) => &body[..end],
        None => elf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize() {
        assert_eq!(normalize("dm-verity"), "dm_verity");
        assert_eq!(module_name_of("overlay.ko.xz"), Some("overlay"));
        assert_eq!(module_name_of("x.ko"), Some("x"));
        assert_eq!(module_name_of("modules.order"), None);
    }

    #[test]
    fn signature_is_stripped() {
        let mut signed = b"\x7fELF-body".to_vec();
        signed.extend_from_slice(b"SIGNATURE");
        signed.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        signed.extend_from_slice(SIG_MARKER);
        assert_eq!(strip_signature(&signed), b"\x7fELF-body");
        assert_eq!(strip_signature(b"\x7fELF-unsigned"), b"\x7fELF-unsigned");
        // A length larger than the file leaves it alone.
        let mut bogus = vec![0u8; 4];
        bogus.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        bogus.extend_from_slice(SIG_MARKER);
        assert_eq!(strip_signature(&bogus), bogus.as_slice());
    }

    #[test]
    fn garbage_is_not_a_module() {
        assert!(modinfo_depends(b"not an elf").is_err());
    }
}
