//! A deterministic `newc` cpio writer (the initramfs format): entries are sorted by path, parents
//! first; inode numbers are sequential; owner is root and every mtime is the same fixed value.

use std::collections::BTreeMap;
use std::io::{self, Write};

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    /// Character device (major, minor).
    CharDev(u32, u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    node: Node,
    mode: u32,
}

/// An in-memory archive: path (without leading `/`) to entry.
#[derive(Debug, Default, Clone)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
    mtime: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

impl Archive {
    /// An empty archive whose entries all carry `mtime` (seconds since the epoch).
    pub fn new(mtime: u32) -> Self {
        Self {
            entries: BTreeMap::new(),
            mtime,
        }
    }

    fn normalize(path: &str) -> String {
        path.trim_start_matches('/').trim_end_matches('/').to_string()
    }

    fn add_parents(&mut self, path: &str) {
        let mut acc = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            self.entries.entry(acc.clone()).or_insert(Entry {
                node: Node::Dir,
                mode: 0o755,
            });
        }
    }

    /// Adds (or replaces) an entry with permission bits `mode`, creating parent directories.
    pub fn add(&mut self, path: &str, node: Node, mode: u32) {
        let path = Self::normalize(path);
        self.add_parents(&path);
        self.entries.insert(
            path,
            Entry {
                node,
                mode: mode & 0o7777,
            },
        );
    }

    /// Paths in archive order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Writes the archive (with the `TRAILER!!!` record) to `w`.
    pub fn write_to<W: Write>(&self, w: &mut W) -> io::Result<()> {
        let mut pos = 0u64;
        for (ino, (path, e)) in self.entries.iter().enumerate() {
            let (kind, data, rdev): (u32, &[u8], (u32, u32)) = match &e.node {
                Node::Dir => (S_IFDIR, &[], (0, 0)),
                Node::File(d) => (S_IFREG, d.as_slice(), (0, 0)),
                Node::Symlink(t) => (S_IFLNK, t.as_bytes(), (0, 0)),
                Node::CharDev(ma, mi) => (S_IFCHR, &[], (*ma, *mi)),
            };
            let nlink = if matches!(e.node, Node::Dir) { 2 } else { 1 };
            pos += write_record(
                w,
                pos,
                ino as u32 + 1,
                kind | e.mode,
                nlink,
                self.mtime,
                path,
                data,
                rdev,
            )?;
        }
        write_record(w, pos, 0, 0, 1, 0, "TRAILER!!!", &[], (0, 0))?;
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn write_record<W: Write>(
    w: &mut W,
    pos: u64,
    ino: u32,
    mode: u32,
    nlink: u32,
    mtime: u32,
    name: &str,
    data: &[u8],
    rdev: (u32, u32),
) -> io::Result<u64> {
    let namesize = name.len() + 1;
    let header = format!(
        "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{mtime:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{namesize:08x}{:08x}",
        0,
        0,
        data.len(),
        0,
        0,
        rdev.0,
        rdev.1,
        0
    );
    let mut n = 0u64;
    w.write_all(header.as_bytes())?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    n += (header.len() + namesize) as u64;
    let pad = (4 - ((pos + n) % 4)) % 4;
    w.write_all(&[0u8; 3][..pad as usize])?;
    n += pad;
    w.write_all(data)?;
    n += data.len() as u64;
    let pad = (4 - ((pos + n) % 4)) % 4;
    w.write_all(&[0u8; 3][..pad as usize])?;
    Ok(n + pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_come_first_and_output_is_aligned() {
        let mut a = Archive::new(0);
        a.add("/lib/modules/x.ko", Node::File(b"abc".to_vec()), 0o644);
        a.add("dev/console", Node::CharDev(5, 1), 0o600);
        let paths: Vec<&str> = a.paths().collect();
        assert_eq!(
            paths,
            ["dev", "dev/console", "lib", "lib/modules", "lib/modules/x.ko"]
        );
        let mut out = Vec::new();
        a.write_to(&mut out).expect("write");
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("TRAILER!!!"));
    }

    #[test]
    fn same_input_same_bytes() {
        let build = || {
            let mut a = Archive::new(1);
            a.add("init", Node::File(vec![1, 2, 3, 4, 5]), 0o755);
            a.add("bin/sh", Node::Symlink("/init".into()), 0o777);
            let mut out = Vec::new();
            a.write_to(&mut out).expect("write");
            out
        };
        assert_eq!(build(), build());
    }

    #[test]
    fn header_fields_are_right() {
        let mut a = Archive::new(0);
        a.add("c", Node::CharDev(5, 1), 0o600);
        let mut out = Vec::new();
        a.write_to(&mut out).expect("write");
        let h = std::str::from_utf8(&out[..110]).expect("ascii header");
        let field = |i: usize| u32::from_str_radix(&h[6 + 8 * i..14 + 8 * i], 16).expect("hex");
        assert_eq!(field(1), S_IFCHR | 0o600); // mode
        assert_eq!(field(9), 5); // rdevmajor
        assert_eq!(field(10), 1); // rdevminor
        assert_eq!(field(11), 2); // namesize "c\0"
    }
}
