//! Layer extraction into an overlayfs lower directory.
//!
//! A layer is a tar stream, gzip- or zstd-compressed or plain (decided by its magic bytes, not by
//! the media type it claims). Whiteouts (`.wh.NAME`) become 0:0 character devices and opaque
//! markers (`.wh..wh..opq`) become the `trusted.overlay.opaque` xattr: the overlayfs encoding.
//!
//! Hostile input is refused, never "sanitised": absolute paths, `..` components, entries reached
//! through a symlink (the classic symlink escape), hard links that leave the layer, device nodes
//! and unsupported entry types, whiteouts of `.`, `..`, nothing or another whiteout (`.wh..`,
//! `.wh...`, `.wh..wh.plnk`: AUFS metadata, never valid in OCI layers), and layers beyond
//! [`Limits`] (decompressed bytes, so a gzip bomb stops at the limit; entry count; path length).
//! The caller extracts into a fresh private directory and renames it into place only on success,
//! so a rejected layer leaves nothing behind.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::sys;

/// Why a layer was refused.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?}: absolute path")]
    Absolute { path: String },
    #[error("layer entry {path:?}: path contains '..'")]
    DotDot { path: String },
    #[error(
        "layer entry {path:?}: goes through the symlink {link:?} (links may not be followed during extraction)"
    )]
    ThroughSymlink { path: String, link: String },
    #[error("layer entry {path:?}: hard link target {target:?} is outside the layer or missing")]
    HardLinkEscape { path: String, target: String },
    #[error("layer entry {path:?}: device nodes are not allowed in image layers")]
    DeviceNode { path: String },
    #[error("layer entry {path:?}: unsupported entry type {kind}")]
    Unsupported { path: String, kind: String },
    #[error("layer entry {path:?}: {parent:?} exists and is not a directory")]
    NotADirectory { path: String, parent: String },
    #[error("layer entry {path:?}: not a valid whiteout (OCI whiteouts are .wh.<name> and .wh..wh..opq)")]
    BadWhiteout { path: String },
    #[error("layer entry {path:?}: path longer than {limit} bytes")]
    PathTooLong { path: String, limit: usize },
    #[error("layer has more than {0} entries")]
    TooManyEntries(u64),
    #[error("layer decompresses to more than {0} bytes")]
    TooLarge(u64),
    #[error("layer is not a valid tar stream: {0}")]
    Tar(io::Error),
    #[error("layer entry {path:?}: {source}")]
    Io { path: String, source: io::Error },
}

fn io_err(path: &str) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Io {
        path: path.to_string(),
        source,
    }
}

/// The compression of a layer, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

pub fn detect(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Hashes everything read through it (the layer's uncompressed digest, its "diff ID").
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Bounds on one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of decompressed tar stream.
    pub max_bytes: u64,
    /// Most tar entries.
    pub max_entries: u64,
    /// Longest entry path (bytes; PATH_MAX).
    pub max_path: usize,
}

impl Default for Limits {
    /// 16 GiB, a million entries, 4,096-byte paths: far beyond real images (the largest common
    /// layers are a few GiB and ~100,000 files), far below what exhausts a node.
    fn default() -> Self {
        Self {
            max_bytes: 16 << 30,
            max_entries: 1_000_000,
            max_path: 4096,
        }
    }
}

/// Reads at most `limit` bytes through, then fails (instead of ending the stream quietly).
struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self
            .left
            .checked_sub(n as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::FileTooLarge, UnpackError::TooLarge(self.limit)))?;
        Ok(n)
    }
}

/// The [`UnpackError`] an I/O error of the stream stands for (the size bound's, or a tar error).
fn stream_err(e: io::Error) -> UnpackError {
    if e.kind() == io::ErrorKind::FileTooLarge
        && let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<UnpackError>())
        && let UnpackError::TooLarge(limit) = inner
    {
        return UnpackError::TooLarge(*limit);
    }
    UnpackError::Tar(e)
}

/// Extracts a (possibly compressed) layer into `dest` (an existing empty directory) within the
/// default [`Limits`] and returns its diff ID (`sha256:` of the uncompressed tar stream).
pub fn unpack_layer(input: impl Read, dest: &Path) -> Result<String, UnpackError> {
    unpack_layer_within(input, dest, Limits::default())
}

/// [`unpack_layer`] within `limits`.
pub fn unpack_layer_within(input: impl Read, dest: &Path, limits: Limits) -> Result<String, UnpackError> {
    let mut buffered = BufReader::with_capacity(256 * 1024, input);
    let head = buffered.fill_buf().map_err(UnpackError::Tar)?.to_vec();
    let decompressed: Box<dyn Read> = match detect(&head) {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(buffered)),
        Compression::Zstd => Box::new(
            ruzstd::decoding::StreamingDecoder::new(buffered)
                .map_err(|e| UnpackError::Tar(io::Error::new(io::ErrorKind::InvalidData, e.to_string())))?,
        ),
    };
    let mut hashing = HashingReader {
        inner: Bounded {
            inner: decompressed,
            left: limits.max_bytes,
            limit: limits.max_bytes,
        },
        hasher: Sha256::new(),
    };
    {
        let mut archive = tar::Archive::new(&mut hashing);
        let mut count = 0u64;
        for entry in archive.entries().map_err(stream_err)? {
            let entry = entry.map_err(stream_err)?;
            count += 1;
            if count > limits.max_entries {
                return Err(UnpackError::TooManyEntries(limits.max_entries));
            }
            extract_entry(entry, dest, &limits)?;
        }
    }
    // Read the end-of-archive padding so the digest covers the whole stream.
    io::copy(&mut hashing, &mut io::sink()).map_err(stream_err)?;
    Ok(format!(
        "sha256:{}",
        super::registry::hex(&hashing.hasher.finalize())
    ))
}

/// Turns an archive path into a relative path of normal components, or refuses it.
pub fn clean_path(raw: &Path) -> Result<PathBuf, UnpackError> {
    let shown = raw.to_string_lossy().into_owned();
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Err(UnpackError::Absolute { path: shown }),
            Component::ParentDir => return Err(UnpackError::DotDot { path: shown }),
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(out)
}

/// Makes sure every parent of `rel` under `root` is a real directory (creating missing ones),
/// refusing symlinks and non-directories on the way.
fn prepare_parents(root: &Path, rel: &Path, shown: &str) -> Result<(), UnpackError> {
    let mut cur = root.to_path_buf();
    let Some(parent) = rel.parent() else { return Ok(()) };
    for c in parent.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(UnpackError::ThroughSymlink {
                    path: shown.into(),
                    link: cur
                        .strip_prefix(root)
                        .unwrap_or(&cur)
                        .to_string_lossy()
                        .into_owned(),
                });
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(UnpackError::NotADirectory {
                    path: shown.into(),
                    parent: cur
                        .strip_prefix(root)
                        .unwrap_or(&cur)
                        .to_string_lossy()
                        .into_owned(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&cur)
                    .map_err(io_err(shown))?;
            }
            Err(e) => return Err(io_err(shown)(e)),
        }
    }
    Ok(())
}

/// Removes whatever is at `path` (a later layer entry replaces an earlier one), except a
/// directory that is about to be re-declared as a directory.
fn clear(path: &Path, keep_dir: bool, shown: &str) -> Result<(), UnpackError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && keep_dir => Ok(()),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io_err(shown)),
        Ok(_) => fs::remove_file(path).map_err(io_err(shown)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(shown)(e)),
    }
}

fn extract_entry<R: Read>(
    mut entry: tar::Entry<'_, R>,
    root: &Path,
    limits: &Limits,
) -> Result<(), UnpackError> {
    let raw = entry.path().map_err(stream_err)?.into_owned();
    let shown = raw.to_string_lossy().into_owned();
    if raw.as_os_str().len() > limits.max_path {
        return Err(UnpackError::PathTooLong {
            path: shown.chars().take(64).collect::<String>() + "...",
            limit: limits.max_path,
        });
    }
    let kind = entry.header().entry_type();
    if matches!(kind, tar::EntryType::XGlobalHeader | tar::EntryType::XHeader) {
        return Ok(());
    }
    let rel = clean_path(&raw)?;
    if rel.as_os_str().is_empty() {
        return Ok(()); // "./": the layer root itself
    }
    prepare_parents(root, &rel, &shown)?;
    let target = root.join(&rel);
    let name = rel.file_name().unwrap_or_default().as_bytes();
    if name == b".wh..wh..opq" {
        let dir = target.parent().unwrap_or(root);
        return sys::set_xattr(dir, c"trusted.overlay.opaque", b"y").map_err(io_err(&shown));
    }
    if let Some(hidden) = name.strip_prefix(b".wh.") {
        if matches!(hidden, b"" | b"." | b"..") || hidden.starts_with(b".wh.") {
            return Err(UnpackError::BadWhiteout { path: shown });
        }
        let path = target.with_file_name(OsStr::from_bytes(hidden));
        clear(&path, false, &shown)?;
        return sys::mknod_whiteout(&path).map_err(io_err(&shown));
    }
    let header = entry.header();
    let mode = header.mode().map_err(UnpackError::Tar)? & 0o7777;
    let uid = header.uid().map_err(UnpackError::Tar)?;
    let gid = header.gid().map_err(UnpackError::Tar)?;
    let mtime = header.mtime().unwrap_or(0);
    match kind {
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            clear(&target, false, &shown)?;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&target)
                .map_err(io_err(&shown))?;
            io::copy(&mut entry, &mut f).map_err(io_err(&shown))?;
            drop(f);
        }
        tar::EntryType::Directory => {
            clear(&target, true, &shown)?;
            if !target.is_dir() {
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&target)
                    .map_err(io_err(&shown))?;
            }
        }
        tar::EntryType::Symlink => {
            let link = entry
                .link_name()
                .map_err(UnpackError::Tar)?
                .unwrap_or_default()
                .into_owned();
            clear(&target, false, &shown)?;
            symlink(&link, &target).map_err(io_err(&shown))?;
            // Symlinks keep their own owner; their mode and time do not matter.
            return sys::lchown(&target, uid, gid).map_err(io_err(&shown));
        }
        tar::EntryType::Link => {
            let link = entry
                .link_name()
                .map_err(UnpackError::Tar)?
                .unwrap_or_default()
                .into_owned();
            let escape = || UnpackError::HardLinkEscape {
                path: shown.clone(),
                target: link.to_string_lossy().into_owned(),
            };
            let src_rel = clean_path(&link).map_err(|_| escape())?;
            prepare_parents(root, &src_rel, &shown).map_err(|_| escape())?;
            let src = root.join(&src_rel);
            match fs::symlink_metadata(&src) {
                Ok(m) if m.is_file() || m.file_type().is_symlink() => {}
                _ => return Err(escape()),
            }
            clear(&target, false, &shown)?;
            return fs::hard_link(&src, &target).map_err(io_err(&shown));
        }
        tar::EntryType::Fifo => {
            clear(&target, false, &shown)?;
            sys::mkfifo(&target).map_err(io_err(&shown))?;
        }
        tar::EntryType::Char | tar::EntryType::Block => return Err(UnpackError::DeviceNode { path: shown }),
        other => {
            return Err(UnpackError::Unsupported {
                path: shown,
                kind: format!("{other:?}"),
            });
        }
    }
    sys::lchown(&target, uid, gid).map_err(io_err(&shown))?;
    fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(io_err(&shown))?;
    sys::set_mtime(&target, mtime).map_err(io_err(&shown))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    use crate::image::layout::RawEntry;

    fn tar_of(entries: &[(&str, char, &str)]) -> Vec<u8> {
        crate::image::layout::raw_tar(entries).expect("test tar")
    }

    fn unpack(entries: &[(&str, char, &str)]) -> (tempfile::TempDir, Result<String, UnpackError>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = unpack_layer(&tar_of(entries)[..], dir.path());
        (dir, r)
    }

    #[test]
    fn extracts_files_links_and_whiteouts() {
        let (dir, r) = unpack(&[
            ("bin/", 'd', ""),
            ("bin/busybox", 'f', "#!binary"),
            ("bin/sh", 'l', "busybox"),
            ("bin/ash", 'h', "bin/busybox"),
            ("etc/.wh.shadow", 'f', ""),
            ("var/.wh..wh..opq", 'f', ""),
            ("./", 'd', ""),
        ]);
        let diff_id = r.expect("good layer");
        assert!(diff_id.starts_with("sha256:") && diff_id.len() == 71);
        let root = dir.path();
        assert_eq!(
            fs::read_to_string(root.join("bin/busybox")).expect("file"),
            "#!binary"
        );
        assert_eq!(
            fs::read_link(root.join("bin/sh")).expect("link"),
            Path::new("busybox")
        );
        assert_eq!(
            fs::read_to_string(root.join("bin/ash")).expect("hard link"),
            "#!binary"
        );
        let wh = fs::symlink_metadata(root.join("etc/shadow"));
        // mknod needs CAP_MKNOD: the tests run as root in CI and in the guest.
        if nix::unistd::geteuid().is_root() {
            let m = wh.expect("whiteout");
            assert!(m.file_type().is_char_device());
            assert_eq!(std::os::unix::fs::MetadataExt::rdev(&m), 0);
        }
        assert!(root.join("var").is_dir());
        // Same bytes, same diff ID.
        let (_d2, r2) = unpack(&[
            ("bin/", 'd', ""),
            ("bin/busybox", 'f', "#!binary"),
            ("bin/sh", 'l', "busybox"),
            ("bin/ash", 'h', "bin/busybox"),
            ("etc/.wh.shadow", 'f', ""),
            ("var/.wh..wh..opq", 'f', ""),
            ("./", 'd', ""),
        ]);
        assert_eq!(r2.expect("same"), diff_id);
    }

    #[test]
    fn refuses_hostile_layers() {
        let cases: Vec<(&str, Vec<RawEntry<'_>>, &str)> = vec![
            ("dotdot", vec![("../escape", 'f', "x")], "contains '..'"),
            (
                "nested dotdot",
                vec![("a/../../escape", 'f', "x")],
                "contains '..'",
            ),
            ("absolute", vec![("/etc/passwd", 'f', "x")], "absolute path"),
            (
                "symlink escape",
                vec![("evil", 'l', "/"), ("evil/etc/passwd", 'f', "x")],
                "goes through the symlink \"evil\"",
            ),
            (
                "relative symlink escape",
                vec![("up", 'l', "../../.."), ("up/x", 'f', "x")],
                "goes through the symlink",
            ),
            (
                "hard link outside",
                vec![("pw", 'h', "../../etc/passwd")],
                "hard link target",
            ),
            (
                "hard link absolute",
                vec![("pw", 'h', "/etc/passwd")],
                "hard link target",
            ),
            (
                "hard link via symlink",
                vec![("s", 'l', "/etc"), ("pw", 'h', "s/passwd")],
                "hard link target",
            ),
            (
                "device node",
                vec![("dev/mem", 'c', "")],
                "device nodes are not allowed",
            ),
            (
                "file as parent",
                vec![("a", 'f', "x"), ("a/b", 'f', "y")],
                "is not a directory",
            ),
        ];
        for (name, entries, want) in cases {
            let (dir, r) = unpack(&entries);
            let err = r.expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {err}");
            // Nothing was written outside the destination (the parent holds only it).
            let parent = dir.path().parent().expect("parent");
            assert!(!parent.join("escape").exists(), "{name}");
        }
        // Truncated and garbage streams.
        let good = tar_of(&[("a", 'f', &"x".repeat(2000))]);
        // Bad whiteouts: hiding ".", "..", nothing, or AUFS metadata.
        for bad in ["d/.wh..", "d/.wh...", "d/.wh.", "d/.wh..wh.plnk"] {
            let (_dir, r) = unpack(&[("d/", 'd', ""), (bad, 'f', "")]);
            let err = r.expect_err(bad);
            assert!(matches!(err, UnpackError::BadWhiteout { .. }), "{bad}: {err}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(unpack_layer(&good[..700], dir.path()).is_err(), "truncated tar");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &good).expect("gz");
        let gz = gz.finish().expect("gz");
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(
            unpack_layer(&gz[..gz.len() / 2], dir.path()).is_err(),
            "truncated gzip"
        );
        let zst = ruzstd::encoding::compress_to_vec(&good[..], ruzstd::encoding::CompressionLevel::Fastest);
        assert_eq!(detect(&zst), Compression::Zstd);
        let dir = tempfile::tempdir().expect("tempdir");
        let id = unpack_layer(&zst[..], dir.path()).expect("zstd layer");
        assert_eq!(
            id,
            super::super::registry::sha256_digest(&good),
            "zstd layer diff ID"
        );
        assert_eq!(fs::read(dir.path().join("a")).expect("file").len(), 2000);
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(
            unpack_layer(&zst[..zst.len() / 2], dir.path()).is_err(),
            "truncated zstd"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let id = unpack_layer(&gz[..], dir.path()).expect("gzip layer");
        assert_eq!(
            id,
            super::super::registry::sha256_digest(&good),
            "diff ID is the uncompressed digest"
        );
    }

    #[test]
    fn bombs_and_oversized_layers_stop_at_their_limits() {
        // A gzip bomb: 64 MiB of zeros in ~64 KiB, stopped at 1 MiB.
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let header_and_zeros = tar_of(&[("zeros", 'f', "")]);
        io::Write::write_all(&mut bomb, &header_and_zeros[..512]).expect("gz");
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            io::Write::write_all(&mut bomb, &zeros).expect("gz");
        }
        let bomb = bomb.finish().expect("gz");
        assert!(bomb.len() < 256 << 10, "{}", bomb.len());
        let small = Limits {
            max_bytes: 1 << 20,
            ..Limits::default()
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let err = unpack_layer_within(&bomb[..], dir.path(), small).expect_err("bomb");
        assert!(matches!(err, UnpackError::TooLarge(l) if l == 1 << 20), "{err}");
        assert_eq!(err.to_string(), "layer decompresses to more than 1048576 bytes");

        let many: Vec<(String, char, &str)> = (0..20).map(|i| (format!("f{i}"), 'f', "x")).collect();
        let many: Vec<(&str, char, &str)> = many.iter().map(|(p, k, d)| (p.as_str(), *k, *d)).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let few = Limits {
            max_entries: 10,
            ..Limits::default()
        };
        let err = unpack_layer_within(&tar_of(&many)[..], dir.path(), few).expect_err("entries");
        assert!(matches!(err, UnpackError::TooManyEntries(10)), "{err}");

        let deep = format!("{}/f", "d".repeat(90));
        let dir = tempfile::tempdir().expect("tempdir");
        let short = Limits {
            max_path: 64,
            ..Limits::default()
        };
        let err =
            unpack_layer_within(&tar_of(&[(&deep, 'f', "x")])[..], dir.path(), short).expect_err("path");
        assert!(matches!(err, UnpackError::PathTooLong { limit: 64, .. }), "{err}");
        // Within the limits the same layers unpack.
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(unpack_layer(&tar_of(&many)[..], dir.path()).is_ok());
    }
}
