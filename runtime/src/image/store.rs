//! The node's content-addressed image store.
//!
//! ```text
//! <root>/blobs/sha256/<hex>      manifests and image configs, verified
//! <root>/layers/<hex>/           one unpacked layer (an overlayfs lower dir), keyed by the
//!                                compressed layer digest so a present layer is never fetched again
//! <root>/images/<hex>.json       one record per image reference (hex = sha256 of the reference)
//! <root>/tmp/                    downloads and extractions in progress; emptied on open
//! ```
//!
//! Nothing becomes visible before it is complete and verified: blobs and layers are written
//! under `tmp/` and renamed into place, records are written last. Pulls of the same layer
//! share one download (a lock per digest); the second puller finds the layer present.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::http::Client;
use super::reference::{Reference, ReferenceError};
use super::registry::{
    self, Credentials, Descriptor, Manifest, ManifestDoc, Registry, RegistryError, sha256_digest,
    verify_digest,
};
use super::unpack::{self, UnpackError};

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("layer {digest}: {source}")]
    Unpack { digest: String, source: UnpackError },
    #[error(
        "layer {digest}: uncompressed digest {actual} does not match the image config's diff ID {expected}"
    )]
    DiffId {
        digest: String,
        expected: String,
        actual: String,
    },
    #[error("image config {digest}: {reason}")]
    Config { digest: String, reason: String },
    #[error("layer {digest}: unsupported media type {media_type:?}")]
    MediaType { digest: String, media_type: String },
    #[error("image {0} is not present on this node")]
    NotFound(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("OCI layout {path}: {reason}")]
    Layout { path: PathBuf, reason: String },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a container inherits from its image (the `config` object of the OCI image config).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageConfig {
    #[serde(
        default,
        rename = "Env",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub env: Vec<String>,
    #[serde(
        default,
        rename = "Entrypoint",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub entrypoint: Vec<String>,
    #[serde(
        default,
        rename = "Cmd",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub cmd: Vec<String>,
    #[serde(
        default,
        rename = "WorkingDir",
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub working_dir: String,
    #[serde(
        default,
        rename = "User",
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub user: String,
}

fn null_default<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Deserialize)]
struct ConfigDoc {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default, deserialize_with = "null_default")]
    config: ImageConfig,
    rootfs: RootFs,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

/// One image on the node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// The normalised reference it was pulled or imported as.
    pub reference: String,
    pub manifest_digest: String,
    pub config_digest: String,
    /// Compressed layer digests, bottom first.
    pub layers: Vec<String>,
    pub config: ImageConfig,
    pub architecture: String,
    /// Sum of the compressed layer sizes.
    pub size: u64,
}

/// Where an image's manifest and blobs come from.
trait BlobSource {
    fn fetch(&mut self, d: &Descriptor, out: &mut dyn Write) -> Result<(), StoreError>;
}

struct RegistrySource<'a> {
    registry: &'a mut Registry,
    repository: String,
}

impl BlobSource for RegistrySource<'_> {
    fn fetch(&mut self, d: &Descriptor, out: &mut dyn Write) -> Result<(), StoreError> {
        Ok(self.registry.blob(&self.repository, d, out)?)
    }
}

struct LayoutSource {
    dir: PathBuf,
}

impl LayoutSource {
    fn path(&self, digest: &str) -> Result<PathBuf, StoreError> {
        match digest.split_once(':') {
            Some(("sha256", hex)) if super::reference::valid_digest(digest) => {
                Ok(self.dir.join("blobs/sha256").join(hex))
            }
            _ => Err(StoreError::Layout {
                path: self.dir.clone(),
                reason: format!("bad digest {digest:?}"),
            }),
        }
    }
}

impl BlobSource for LayoutSource {
    fn fetch(&mut self, d: &Descriptor, out: &mut dyn Write) -> Result<(), StoreError> {
        let path = self.path(&d.digest)?;
        let mut f = fs::File::open(&path).map_err(io_at(&path))?;
        Ok(registry::copy_verified(
            &format!("blob {}", d.digest),
            &mut f,
            d,
            out,
        )?)
    }
}

/// Settings for pulls.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    pub credentials: Option<Credentials>,
}

/// The store. Safe to share between threads.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    /// This process's scratch directory (`tmp/<pid>`).
    tmp: PathBuf,
    client: Client,
    insecure: Vec<String>,
    arch: String,
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    downloads: AtomicU64,
}

/// The layer media types the store unpacks (compression is detected from the bytes).
fn is_layer_type(m: &str) -> bool {
    m.is_empty()
        || m.starts_with("application/vnd.oci.image.layer.v1.tar")
        || m.starts_with("application/vnd.docker.image.rootfs.diff.tar")
}

impl ImageStore {
    /// Opens (creating) a store. `insecure` lists registry hosts reached over plain HTTP; loopback
    /// hosts always are.
    pub fn open(root: &Path, client: Client, insecure: Vec<String>) -> Result<Self, StoreError> {
        for d in ["blobs/sha256", "layers", "images"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(io_at(&p))?;
        }
        // Each process works in tmp/<pid>; what dead processes left there is removed.
        let all_tmp = root.join("tmp");
        fs::create_dir_all(&all_tmp).map_err(io_at(&all_tmp))?;
        let me = std::process::id();
        for e in fs::read_dir(&all_tmp).map_err(io_at(&all_tmp))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let alive = name
                .parse::<u32>()
                .is_ok_and(|p| p != me && Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let p = e.path();
                let r = if p.is_dir() {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
                r.map_err(io_at(&p))?;
            }
        }
        let tmp = all_tmp.join(me.to_string());
        fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
        Ok(ImageStore {
            tmp,
            root: root.to_path_buf(),
            client,
            insecure,
            arch: registry::host_architecture().to_string(),
            locks: Mutex::new(HashMap::new()),
            downloads: AtomicU64::new(0),
        })
    }

    /// Pulls for another architecture (tests of index resolution).
    pub fn with_architecture(mut self, arch: &str) -> Self {
        self.arch = arch.to_string();
        self
    }

    /// This process's scratch directory: empty between operations.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp
    }

    /// How many layer blobs this store has downloaded since it was opened.
    pub fn downloads(&self) -> u64 {
        self.downloads.load(Ordering::Relaxed)
    }

    fn lock(&self, key: &str) -> Arc<Mutex<()>> {
        let mut m = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(key.to_string()).or_default().clone()
    }

    fn plain_http(&self, host: &str) -> bool {
        let name = host
            .rsplit_once(':')
            .map_or(host, |(h, _)| h)
            .trim_matches(['[', ']']);
        self.insecure.iter().any(|i| i == host)
            || name == "localhost"
            || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    fn record_path(&self, reference: &str) -> PathBuf {
        let key = sha256_digest(reference.as_bytes());
        self.root.join("images").join(format!("{}.json", &key[7..]))
    }

    /// The unpacked directory of a layer.
    pub fn layer_dir(&self, digest: &str) -> PathBuf {
        self.root
            .join("layers")
            .join(digest.trim_start_matches("sha256:"))
    }

    /// The record of a present image.
    pub fn get(&self, reference: &str) -> Result<Option<ImageRecord>, StoreError> {
        let r = Reference::parse(reference)?.to_string();
        let path = self.record_path(&r);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| StoreError::Io {
                path,
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }

    /// Every image record.
    pub fn list(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let dir = self.root.join("images");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(io_at(&dir))? {
            let e = e.map_err(io_at(&dir))?;
            if let Ok(b) = fs::read(e.path())
                && let Ok(r) = serde_json::from_slice::<ImageRecord>(&b)
            {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// Lower directories for overlayfs, top layer first (the `lowerdir=` order).
    pub fn lower_dirs(&self, rec: &ImageRecord) -> Vec<PathBuf> {
        rec.layers.iter().rev().map(|d| self.layer_dir(d)).collect()
    }

    /// Pulls an image (unless an identical one is present) and returns its record.
    pub fn pull(&self, reference: &str, opts: &PullOptions) -> Result<ImageRecord, StoreError> {
        let r = Reference::parse(reference)?;
        let name = r.to_string();
        let lock = self.lock(&format!("ref:{name}"));
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let host = r.api_host().to_string();
        let mut reg = Registry::new(
            self.client.clone(),
            &host,
            self.plain_http(&host),
            opts.credentials.clone(),
        );
        let (mdigest, mbytes, manifest) = reg.resolve(&r, &self.arch)?;
        if let Some(have) = self.get(&name)?
            && have.manifest_digest == mdigest
            && have.layers.iter().all(|d| self.layer_dir(d).is_dir())
        {
            return Ok(have);
        }
        let mut src = RegistrySource {
            registry: &mut reg,
            repository: r.repository.clone(),
        };
        self.install(&name, &mdigest, &mbytes, &manifest, &mut src)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.tmp.join(format!(
            "w-{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("x")
        ));
        let mut f = fs::File::create(&tmp).map_err(io_at(&tmp))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(io_at(&tmp))?;
        fs::rename(&tmp, path).map_err(io_at(path))
    }

    fn install(
        &self,
        name: &str,
        mdigest: &str,
        mbytes: &[u8],
        m: &Manifest,
        src: &mut dyn BlobSource,
    ) -> Result<ImageRecord, StoreError> {
        let mut cfg_bytes = Vec::new();
        if m.config.size > registry::MAX_MANIFEST_BYTES {
            return Err(StoreError::Config {
                digest: m.config.digest.clone(),
                reason: "larger than 4 MiB".into(),
            });
        }
        src.fetch(&m.config, &mut cfg_bytes)?;
        let bad_cfg = |reason: String| StoreError::Config {
            digest: m.config.digest.clone(),
            reason,
        };
        let cfg: ConfigDoc = serde_json::from_slice(&cfg_bytes)
            .map_err(|e| bad_cfg(format!("not a valid image config: {e}")))?;
        if cfg.rootfs.kind != "layers" || cfg.rootfs.diff_ids.len() != m.layers.len() {
            return Err(bad_cfg(format!(
                "rootfs lists {} diff IDs of type {:?} for {} layers",
                cfg.rootfs.diff_ids.len(),
                cfg.rootfs.kind,
                m.layers.len()
            )));
        }
        if !cfg.os.is_empty() && cfg.os != "linux" {
            return Err(bad_cfg(format!("image is for os {:?}", cfg.os)));
        }
        for (layer, diff_id) in m.layers.iter().zip(&cfg.rootfs.diff_ids) {
            if !is_layer_type(&layer.media_type) {
                return Err(StoreError::MediaType {
                    digest: layer.digest.clone(),
                    media_type: layer.media_type.clone(),
                });
            }
            self.ensure_layer(layer, diff_id, src)?;
        }
        for (digest, bytes) in [(mdigest, mbytes), (m.config.digest.as_str(), &cfg_bytes[..])] {
            let path = self
                .root
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:"));
            if !path.exists() {
                self.write_atomic(&path, bytes)?;
            }
        }
        let rec = ImageRecord {
            reference: name.to_string(),
            manifest_digest: mdigest.to_string(),
            config_digest: m.config.digest.clone(),
            layers: m.layers.iter().map(|l| l.digest.clone()).collect(),
            config: cfg.config,
            architecture: cfg.architecture,
            size: m.layers.iter().map(|l| l.size).sum(),
        };
        let json = serde_json::to_vec_pretty(&rec).map_err(|e| bad_cfg(e.to_string()))?;
        self.write_atomic(&self.record_path(name), &json)?;
        tracing::info!(
            image = name,
            digest = mdigest,
            layers = rec.layers.len(),
            "image stored"
        );
        Ok(rec)
    }

    fn ensure_layer(
        &self,
        layer: &Descriptor,
        diff_id: &str,
        src: &mut dyn BlobSource,
    ) -> Result<(), StoreError> {
        let lock = self.lock(&layer.digest);
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let dest = self.layer_dir(&layer.digest);
        if dest.is_dir() {
            return Ok(());
        }
        let hex = layer.digest.trim_start_matches("sha256:");
        let tmp = &self.tmp;
        let blob_path = tmp.join(format!("{hex}.blob"));
        let dir_path = tmp.join(format!("{hex}.dir"));
        let result = (|| {
            let mut f = fs::File::create(&blob_path).map_err(io_at(&blob_path))?;
            self.downloads.fetch_add(1, Ordering::Relaxed);
            src.fetch(layer, &mut f)?;
            drop(f);
            fs::create_dir(&dir_path).map_err(io_at(&dir_path))?;
            let f = fs::File::open(&blob_path).map_err(io_at(&blob_path))?;
            let actual = unpack::unpack_layer(f, &dir_path).map_err(|source| StoreError::Unpack {
                digest: layer.digest.clone(),
                source,
            })?;
            if actual != diff_id {
                return Err(StoreError::DiffId {
                    digest: layer.digest.clone(),
                    expected: diff_id.into(),
                    actual,
                });
            }
            match fs::rename(&dir_path, &dest) {
                // Another process stored the same layer meanwhile: theirs is as good as ours.
                Err(_) if dest.is_dir() => fs::remove_dir_all(&dir_path).map_err(io_at(&dir_path)),
                r => r.map_err(io_at(&dest)),
            }
        })();
        let _ = fs::remove_file(&blob_path);
        if result.is_err() && dir_path.exists() {
            let _ = fs::remove_dir_all(&dir_path);
        }
        result
    }

    /// Imports every tagged image of an OCI image layout (a directory, or a tar archive of one)
    /// for air-gapped nodes. Returns the records.
    pub fn import_layout(&self, path: &Path) -> Result<Vec<ImageRecord>, StoreError> {
        let meta = fs::metadata(path).map_err(io_at(path))?;
        let extracted;
        let dir = if meta.is_dir() {
            path.to_path_buf()
        } else {
            extracted = self.tmp.join("layout");
            let _ = fs::remove_dir_all(&extracted);
            fs::create_dir_all(&extracted).map_err(io_at(&extracted))?;
            let f = fs::File::open(path).map_err(io_at(path))?;
            let r = unpack::unpack_layer(f, &extracted);
            if let Err(e) = r {
                let _ = fs::remove_dir_all(&extracted);
                return Err(StoreError::Layout {
                    path: path.into(),
                    reason: e.to_string(),
                });
            }
            extracted.clone()
        };
        let result = self.import_dir(&dir);
        if dir != path {
            let _ = fs::remove_dir_all(&dir);
        }
        result
    }

    fn import_dir(&self, dir: &Path) -> Result<Vec<ImageRecord>, StoreError> {
        let bad = |reason: String| StoreError::Layout {
            path: dir.to_path_buf(),
            reason,
        };
        let marker = fs::read(dir.join("oci-layout")).map_err(|e| bad(format!("oci-layout: {e}")))?;
        let v: serde_json::Value =
            serde_json::from_slice(&marker).map_err(|e| bad(format!("oci-layout: {e}")))?;
        if v.get("imageLayoutVersion").and_then(|x| x.as_str()) != Some("1.0.0") {
            return Err(bad("oci-layout: imageLayoutVersion is not 1.0.0".into()));
        }
        let index = fs::read(dir.join("index.json")).map_err(|e| bad(format!("index.json: {e}")))?;
        let iv: serde_json::Value =
            serde_json::from_slice(&index).map_err(|e| bad(format!("index.json: {e}")))?;
        let entries = iv
            .get("manifests")
            .and_then(|m| m.as_array())
            .cloned()
            .unwrap_or_default();
        let mut src = LayoutSource {
            dir: dir.to_path_buf(),
        };
        let mut out = Vec::new();
        for e in entries {
            let Some(refname) = e
                .pointer("/annotations/org.opencontainers.image.ref.name")
                .and_then(|v| v.as_str())
            else {
                continue;
            };
            let d: Descriptor =
                serde_json::from_value(e.clone()).map_err(|err| bad(format!("index.json entry: {err}")))?;
            let name = Reference::parse(refname)?.to_string();
            let mut bytes = Vec::new();
            src.fetch(&d, &mut bytes)?;
            let (mdigest, mbytes, manifest) =
                match registry::parse_manifest(&name, &bytes, Some(&d.media_type))? {
                    ManifestDoc::Image(m) => (d.digest.clone(), bytes, m),
                    ManifestDoc::Index(list) => {
                        let pick = registry::select_platform(&name, &list, &self.arch)?.clone();
                        let mut b = Vec::new();
                        src.fetch(&pick, &mut b)?;
                        verify_digest(&name, &b, &pick.digest)?;
                        match registry::parse_manifest(&name, &b, Some(&pick.media_type))? {
                            ManifestDoc::Image(m) => (pick.digest, b, m),
                            ManifestDoc::Index(_) => return Err(bad("an index inside an index".into())),
                        }
                    }
                };
            out.push(self.install(&name, &mdigest, &mbytes, &manifest, &mut src)?);
        }
        if out.is_empty() {
            return Err(bad(
                "index.json names no image (annotation org.opencontainers.image.ref.name)".into(),
            ));
        }
        Ok(out)
    }

    /// Removes one image record (its layers go at the next `gc`).
    pub fn remove(&self, reference: &str) -> Result<(), StoreError> {
        let r = Reference::parse(reference)?.to_string();
        let path = self.record_path(&r);
        fs::remove_file(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                StoreError::NotFound(r.clone())
            } else {
                StoreError::Io { path, source: e }
            }
        })
    }

    /// Deletes every image not named in `keep` (normalised or not), then every layer and blob no
    /// remaining image uses. Returns the removed image references.
    pub fn gc(&self, keep: &[&str]) -> Result<Vec<String>, StoreError> {
        self.gc_keeping_layers(keep, &[])
    }

    /// [`ImageStore::gc`], keeping also the layers in `layers_in_use` (digests): those of
    /// containers whose image record was replaced or removed meanwhile.
    pub fn gc_keeping_layers(
        &self,
        keep: &[&str],
        layers_in_use: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let keep: HashSet<String> = keep
            .iter()
            .filter_map(|k| Reference::parse(k).ok())
            .map(|r| r.to_string())
            .collect();
        let mut removed = Vec::new();
        let mut live_layers: HashSet<String> = layers_in_use
            .iter()
            .map(|d| d.trim_start_matches("sha256:").to_string())
            .collect();
        let mut live_blobs = HashSet::new();
        for rec in self.list()? {
            if keep.contains(&rec.reference) {
                live_layers.extend(
                    rec.layers
                        .iter()
                        .map(|d| d.trim_start_matches("sha256:").to_string()),
                );
                live_blobs.insert(rec.manifest_digest.trim_start_matches("sha256:").to_string());
                live_blobs.insert(rec.config_digest.trim_start_matches("sha256:").to_string());
            } else {
                self.remove(&rec.reference)?;
                removed.push(rec.reference);
            }
        }
        for (dir, live) in [
            (self.root.join("layers"), &live_layers),
            (self.root.join("blobs/sha256"), &live_blobs),
        ] {
            for e in fs::read_dir(&dir).map_err(io_at(&dir))? {
                let e = e.map_err(io_at(&dir))?;
                let name = e.file_name().to_string_lossy().into_owned();
                if live.contains(&name) {
                    continue;
                }
                let lock = self.lock(&format!("sha256:{name}"));
                let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                let p = e.path();
                let r = if p.is_dir() {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
                r.map_err(io_at(&p))?;
            }
        }
        Ok(removed)
    }
}
