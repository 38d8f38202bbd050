//! Writing OCI image layouts: the test images the project builds (busybox for both arches,
//! hostile layers) and exports for air-gapped nodes.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::registry::{Descriptor, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST, Platform, sha256_digest};
use super::store::ImageConfig;

pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One file of a layer being built.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir(String),
    File { path: String, mode: u32, data: Vec<u8> },
    Symlink { path: String, target: String },
}

/// A gzip-compressed tar of `entries` and its uncompressed digest.
pub fn layer(entries: &[Entry]) -> io::Result<(Vec<u8>, String)> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, io::empty())?;
            }
            Entry::File { path, mode, data } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, &data[..])?;
            }
            Entry::Symlink { path, target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target)?;
            }
        }
    }
    gzip_layer(&b.into_inner()?)
}

/// (path, kind, data or link target) of a raw tar entry; see [`raw_tar`].
pub type RawEntry<'a> = (&'a str, char, &'a str);

/// An uncompressed tar whose header names are written raw, so it can hold what a well-behaved
/// writer refuses (`..`, absolute paths, escaping links, device nodes): the hostile layers of the
/// tests. Entries are (path, kind, data or link target) with kind 'f' file, 'd' directory,
/// 'l' symlink, 'h' hard link, 'c' character device 1:3.
pub fn raw_tar(entries: &[RawEntry<'_>]) -> io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(if *kind == 'd' { 0o755 } else { 0o644 });
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(if *kind == 'f' { data.len() as u64 } else { 0 });
        h.set_entry_type(match kind {
            'f' => tar::EntryType::Regular,
            'd' => tar::EntryType::Directory,
            'l' => tar::EntryType::Symlink,
            'h' => tar::EntryType::Link,
            'c' => tar::EntryType::Char,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("entry kind {other:?}"),
                ));
            }
        });
        if *kind == 'c' {
            h.set_device_major(1)?;
            h.set_device_minor(3)?;
        }
        let name = h.as_old_mut().name.as_mut();
        if path.len() > name.len() || data.len() > 100 && matches!(kind, 'l' | 'h') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "name too long for a raw header",
            ));
        }
        name.fill(0);
        name[..path.len()].copy_from_slice(path.as_bytes());
        if matches!(kind, 'l' | 'h') {
            h.as_old_mut().linkname.as_mut()[..data.len()].copy_from_slice(data.as_bytes());
        }
        h.set_cksum();
        b.append(&h, if *kind == 'f' { data.as_bytes() } else { &[][..] })?;
    }
    b.into_inner()
}

/// Gzip-compresses a tar; returns it with its diff ID.
pub fn gzip_layer(tar: &[u8]) -> io::Result<(Vec<u8>, String)> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(tar)?;
    Ok((gz.finish()?, sha256_digest(tar)))
}

/// Accumulates blobs and tagged manifests, then writes `index.json` and `oci-layout`.
#[derive(Debug)]
pub struct LayoutWriter {
    dir: PathBuf,
    index: Vec<serde_json::Value>,
}

impl LayoutWriter {
    pub fn new(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir.join("blobs/sha256"))?;
        Ok(LayoutWriter {
            dir: dir.to_path_buf(),
            index: Vec::new(),
        })
    }

    pub fn blob(&mut self, media_type: &str, bytes: &[u8]) -> io::Result<Descriptor> {
        let digest = sha256_digest(bytes);
        fs::write(self.dir.join("blobs/sha256").join(&digest[7..]), bytes)?;
        Ok(Descriptor {
            media_type: media_type.into(),
            digest,
            size: bytes.len() as u64,
            platform: None,
        })
    }

    /// Writes a single-platform image manifest (untagged) from compressed layers and their diff IDs.
    pub fn image(
        &mut self,
        arch: &str,
        layers: &[(Vec<u8>, String)],
        config: &ImageConfig,
    ) -> io::Result<Descriptor> {
        let cfg = json!({
            "architecture": arch, "os": "linux", "config": config,
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>()},
        });
        let cfg_d = self.blob(MEDIA_OCI_CONFIG, &serde_json::to_vec(&cfg)?)?;
        let mut layer_ds = Vec::new();
        for (bytes, _) in layers {
            layer_ds.push(self.blob(MEDIA_OCI_LAYER_GZIP, bytes)?);
        }
        let desc = |d: &Descriptor| json!({"mediaType": d.media_type, "digest": d.digest, "size": d.size});
        let m = json!({
            "schemaVersion": 2, "mediaType": MEDIA_OCI_MANIFEST, "config": desc(&cfg_d),
            "layers": layer_ds.iter().map(desc).collect::<Vec<_>>(),
        });
        let mut d = self.blob(MEDIA_OCI_MANIFEST, &serde_json::to_vec(&m)?)?;
        d.platform = Some(Platform {
            architecture: arch.into(),
            os: "linux".into(),
            variant: None,
        });
        Ok(d)
    }

    /// Writes an index over per-platform manifests (untagged).
    pub fn multi_arch(&mut self, manifests: &[Descriptor]) -> io::Result<Descriptor> {
        let entries: Vec<_> = manifests
            .iter()
            .map(|d| {
                let p = d.platform.as_ref();
                json!({"mediaType": d.media_type, "digest": d.digest, "size": d.size,
                    "platform": {"architecture": p.map(|p| p.architecture.clone()), "os": "linux"}})
            })
            .collect();
        let idx = json!({"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX, "manifests": entries});
        self.blob(MEDIA_OCI_INDEX, &serde_json::to_vec(&idx)?)
    }

    /// Tags a manifest or index in the layout's `index.json`.
    pub fn tag(&mut self, name: &str, d: &Descriptor) {
        self.index.push(
            json!({"mediaType": d.media_type, "digest": d.digest, "size": d.size,
            "annotations": {"org.opencontainers.image.ref.name": name}}),
        );
    }

    pub fn finish(self) -> io::Result<()> {
        fs::write(self.dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let idx = json!({"schemaVersion": 2, "manifests": self.index});
        fs::write(self.dir.join("index.json"), serde_json::to_vec_pretty(&idx)?)
    }
}

/// The busybox applets the test images link (all the suites use).
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "ash", "cat", "echo", "sleep", "ls", "mkdir", "hostname", "readlink", "id", "env", "pwd", "true",
    "false", "touch", "rm", "head", "tail", "wc", "dd", "grep", "ps", "kill", "yes", "seq", "test", "[",
    "nc", "ip", "ifconfig", "wget", "mount", "date", "stat", "sync", "awk", "sed", "tr", "cut", "printf",
    "uname", "chmod", "ln",
];

/// A busybox image's single layer for one architecture.
pub fn busybox_layer(busybox: &[u8]) -> io::Result<(Vec<u8>, String)> {
    let mut e = vec![
        Entry::Dir("bin".into()),
        Entry::File {
            path: "bin/busybox".into(),
            mode: 0o755,
            data: busybox.to_vec(),
        },
        Entry::Dir("etc".into()),
        Entry::File {
            path: "etc/passwd".into(),
            mode: 0o644,
            data: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
                .to_vec(),
        },
        Entry::File {
            path: "etc/group".into(),
            mode: 0o644,
            data: b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
        },
        Entry::Dir("tmp".into()),
        Entry::Dir("root".into()),
    ];
    for a in BUSYBOX_APPLETS {
        e.push(Entry::Symlink {
            path: format!("bin/{a}"),
            target: "busybox".into(),
        });
    }
    layer(&e)
}
