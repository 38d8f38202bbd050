//! Pod volumes on the node (docs/SEEDS-SPEC.md §4, the kubelet's volume plugins): emptyDir,
//! configMap, secret, downwardAPI, projected (serviceAccountToken, configMap, secret,
//! downwardAPI) and hostPath, under `/var/lib/kubelet/pods/<uid>/volumes/<plugin>/<name>`, bind
//! mounted into the containers by the runtime.
//!
//! What a volume holds is pure ([`files`]) over the objects the worker fetched ([`Sources`]);
//! writing is atomic as the kubelet's `AtomicWriter` does it: the files go to a fresh `..<n>`
//! directory, the `..data` symlink is swapped to it with a rename, and each top-level name is a
//! symlink through `..data`, so a container never sees half an update.
//!
//! emptyDir with `medium: Memory` is a tmpfs of its own, sized as the kubelet sizes it: the
//! smaller of its `sizeLimit` and the memory limit of the pod's cgroup (`kcore::qos::pod_cgroup`);
//! with neither, the kernel's default (half the node's memory) where upstream takes the node's
//! allocatable memory. A disk-backed emptyDir over its `sizeLimit` evicts the pod
//! (`eviction.rs`). Pod directories are taken down by [`remove_pod_dir`], which unmounts those
//! tmpfs first.
//!
//! Not yet: clusterTrustBundle sources, persistent volumes.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIVolumeFile, KeyToPath, Pod, SecretProjection, Volume,
};

use super::container::NodeFacts;
use super::env::{self, EnvError, Source, Sources};

/// Where pods' volumes live.
pub const ROOT: &str = "/var/lib/kubelet/pods";

/// A pod's directory.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join(uid)
}

/// One file of a volume: its bytes and mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// What a volume is on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// An empty directory the containers share.
    EmptyDir { medium: Medium },
    /// Files written atomically (relative paths).
    Files(BTreeMap<String, File>),
    /// A path of the node, as it is.
    HostPath { path: PathBuf, kind: String },
}

/// Where an emptyDir lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk (its root file system).
    Disk,
    /// A tmpfs of its own, `size` bytes at most (None: the kernel's default).
    Memory { size: Option<u64> },
}

/// The size of a memory-backed emptyDir: the smaller of its `sizeLimit` and the memory limit of
/// the pod's cgroup (the kubelet's `calculateEmptyDirMemorySize` reads `ResourceConfigForPod`,
/// which is `kcore::qos::pod_cgroup`), without the node's allocatable memory.
pub fn memory_volume_size(pod: &Pod, size_limit: Option<&str>) -> Option<u64> {
    let limit = size_limit.and_then(kcore::quantity::bytes).filter(|b| *b > 0);
    let pod_limit = kcore::qos::pod_cgroup(pod).memory_limit.filter(|m| *m > 0);
    match (limit, pod_limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A service account token a projected volume holds: the TokenRequest to make.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokenWanted {
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

/// The plugin directory name of a volume (`kubernetes.io~configmap`, ...).
pub fn plugin(v: &Volume) -> &'static str {
    if v.empty_dir.is_some() {
        "kubernetes.io~empty-dir"
    } else if v.config_map.is_some() {
        "kubernetes.io~configmap"
    } else if v.secret.is_some() {
        "kubernetes.io~secret"
    } else if v.downward_api.is_some() {
        "kubernetes.io~downward-api"
    } else if v.projected.is_some() {
        "kubernetes.io~projected"
    } else if v.host_path.is_some() {
        "kubernetes.io~host-path"
    } else {
        "unsupported"
    }
}

/// A relative path that stays in its directory.
fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with("..")
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn mode(m: Option<i32>, default: i32) -> u32 {
    u32::try_from(m.unwrap_or(default)).unwrap_or(0o644) & 0o7777
}

/// Why a volume cannot be set up (the text after `MountVolume.SetUp failed for volume "v" : `).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A missing ConfigMap/Secret, or a downward-API field the agent does not know.
    #[error(transparent)]
    Reference(#[from] EnvError),
    #[error("{} references non-existent config key: {key}", .of.lower())]
    MissingKey { of: Source, key: String },
    /// A source read that failed (a timeout, not a missing object): the volume keeps what it
    /// holds.
    #[error("failed to sync {} cache: {reason}", .of.lower())]
    Sync { of: Source, reason: String },
    #[error("invalid path {0:?}")]
    InvalidPath(String),
    #[error("{0}: a downward API item needs a fieldRef or a resourceFieldRef")]
    NoDownwardSource(String),
    #[error("container {0} not found")]
    NoContainer(String),
    #[error("the service account token is not available")]
    NoToken,
    #[error("failed to fetch token: {0}")]
    Token(#[source] kube::Error),
    #[error("the token request returned no token")]
    EmptyToken,
    #[error("volume type not supported by this agent yet")]
    Unsupported,
    #[error("hostPath type check failed: {} is not a {what}", .path.display())]
    HostPathType { path: PathBuf, what: &'static str },
    #[error("invalid hostPath type {0:?}")]
    HostPathKind(String),
    #[error("invalid volume name {0:?}")]
    InvalidName(String),
    #[error("invalid subPath {0:?}: must be a relative path without '..'")]
    InvalidSubPath(String),
    #[error("subPath {sub}: {source}")]
    SubPath { sub: String, source: std::io::Error },
    #[error("volume {0:?} is not available")]
    NotAvailable(String),
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// A volume that could not be set up, as the kubelet's `FailedMount` event says it.
#[derive(Debug, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {source}")]
pub struct MountError {
    pub volume: String,
    pub source: VolumeError,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Keys (or the `items` chosen) of a ConfigMap/Secret as files.
fn keyed(
    out: &mut BTreeMap<String, File>,
    data: &BTreeMap<String, String>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: i32,
    of: Source,
) -> Result<(), VolumeError> {
    let Some(items) = items else {
        for (k, v) in data {
            out.insert(
                k.clone(),
                File {
                    data: v.clone().into_bytes(),
                    mode: mode(None, default_mode),
                },
            );
        }
        return Ok(());
    };
    for it in items {
        let v = data.get(&it.key).ok_or_else(|| VolumeError::MissingKey {
            of,
            key: it.key.clone(),
        })?;
        if !safe_relative(&it.path) {
            return Err(VolumeError::InvalidPath(it.path.clone()));
        }
        out.insert(
            it.path.clone(),
            File {
                data: v.clone().into_bytes(),
                mode: mode(it.mode, default_mode),
            },
        );
    }
    Ok(())
}

/// The downward API files (labels and annotations as `key="value"` lines, sorted; single
/// fields as the environment's `fieldRef` reads them).
fn downward(
    out: &mut BTreeMap<String, File>,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    node: &NodeFacts,
    pod_ip: Option<&str>,
) -> Result<(), VolumeError> {
    let m = &pod.metadata;
    let node_ip = node.node_ip.as_deref();
    let pairs = |map: Option<&BTreeMap<String, String>>| -> String {
        map.into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}\n"))
            .collect()
    };
    for it in items {
        if !safe_relative(&it.path) {
            return Err(VolumeError::InvalidPath(it.path.clone()));
        }
        let text = match (&it.field_ref, &it.resource_field_ref) {
            (Some(f), _) => match f.field_path.as_str() {
                "metadata.labels" => pairs(m.labels.as_ref()),
                "metadata.annotations" => pairs(m.annotations.as_ref()),
                other => env::field(pod, other, node_ip, pod_ip)?,
            },
            // In a volume the container is named (the API requires it).
            (None, Some(r)) => {
                let name = r.container_name.as_deref().unwrap_or_default();
                let c = pod
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
                    .find(|c| c.name == name)
                    .ok_or_else(|| VolumeError::NoContainer(name.into()))?;
                env::resource_field(c, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str()), node)?
            }
            (None, None) => return Err(VolumeError::NoDownwardSource(it.path.clone())),
        };
        out.insert(
            it.path.clone(),
            File {
                data: text.into_bytes(),
                mode: mode(it.mode, default_mode),
            },
        );
    }
    Ok(())
}

/// The files of ConfigMap or Secret `name` (nothing when it is missing and optional).
fn object_files(
    out: &mut BTreeMap<String, File>,
    sources: &Sources,
    of: Source,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    optional: Option<bool>,
    default_mode: i32,
) -> Result<(), VolumeError> {
    match env::object(sources, of, name, optional)? {
        Some(data) => keyed(out, data, items, default_mode, of),
        None => Ok(()),
    }
}

/// What volume `v` of `pod` holds, given the fetched objects and tokens (by [`TokenWanted`]).
pub fn files(
    pod: &Pod,
    v: &Volume,
    sources: &Sources,
    tokens: &BTreeMap<TokenWanted, String>,
    node: &NodeFacts,
    pod_ip: Option<&str>,
) -> Result<Content, VolumeError> {
    let mut out = BTreeMap::new();
    if let Some(e) = &v.empty_dir {
        let medium = if e.medium.as_deref() == Some("Memory") {
            let size = memory_volume_size(pod, e.size_limit.as_ref().map(|q| q.0.as_str()));
            Medium::Memory { size }
        } else {
            Medium::Disk
        };
        return Ok(Content::EmptyDir { medium });
    }
    if let Some(h) = &v.host_path {
        return Ok(Content::HostPath {
            path: PathBuf::from(&h.path),
            kind: h.type_.clone().unwrap_or_default(),
        });
    }
    let dm = |m: Option<i32>| m.unwrap_or(0o644);
    if let Some(c) = &v.config_map {
        let (items, mode) = (c.items.as_ref(), dm(c.default_mode));
        object_files(
            &mut out,
            sources,
            Source::ConfigMap,
            &c.name,
            items,
            c.optional,
            mode,
        )?;
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or_default();
        let (items, mode) = (s.items.as_ref(), dm(s.default_mode));
        object_files(&mut out, sources, Source::Secret, name, items, s.optional, mode)?;
    } else if let Some(d) = &v.downward_api {
        let items = d.items.as_deref().unwrap_or_default();
        downward(&mut out, pod, items, dm(d.default_mode), node, pod_ip)?;
    } else if let Some(p) = &v.projected {
        let dm = dm(p.default_mode);
        for src in p.sources.iter().flatten() {
            if let Some(ConfigMapProjection {
                name,
                items,
                optional,
            }) = &src.config_map
            {
                object_files(
                    &mut out,
                    sources,
                    Source::ConfigMap,
                    name,
                    items.as_ref(),
                    *optional,
                    dm,
                )?;
            }
            if let Some(SecretProjection {
                name,
                items,
                optional,
            }) = &src.secret
            {
                object_files(
                    &mut out,
                    sources,
                    Source::Secret,
                    name,
                    items.as_ref(),
                    *optional,
                    dm,
                )?;
            }
            if let Some(d) = &src.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                downward(&mut out, pod, items, dm, node, pod_ip)?;
            }
            if let Some(t) = &src.service_account_token {
                let token = tokens.get(&token_wanted(t)).ok_or(VolumeError::NoToken)?;
                if !safe_relative(&t.path) {
                    return Err(VolumeError::InvalidPath(t.path.clone()));
                }
                out.insert(
                    t.path.clone(),
                    File {
                        data: token.clone().into_bytes(),
                        mode: mode(None, dm),
                    },
                );
            }
        }
    } else {
        return Err(VolumeError::Unsupported);
    }
    Ok(Content::Files(out))
}

fn token_wanted(t: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection) -> TokenWanted {
    TokenWanted {
        audience: t.audience.clone().filter(|a| !a.is_empty()),
        expiration_seconds: t.expiration_seconds.unwrap_or(3600),
    }
}

/// The service account tokens volume `v` holds.
pub fn tokens_wanted(v: &Volume) -> Vec<TokenWanted> {
    let mut out: Vec<TokenWanted> = v
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(token_wanted)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The ConfigMaps and Secrets the pod's volumes refer to (names).
pub fn references(pod: &Pod) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let (c, s) = volume_references(v);
        cms.extend(c);
        secrets.extend(s);
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// The ConfigMaps and Secrets one volume is made from (names, unsorted).
pub fn volume_references(v: &Volume) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    if let Some(c) = &v.config_map {
        cms.push(c.name.clone());
    }
    if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
        secrets.push(s);
    }
    for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
        if let Some(c) = &src.config_map {
            cms.push(c.name.clone());
        }
        if let Some(s) = &src.secret {
            secrets.push(s.name.clone());
        }
    }
    (cms, secrets)
}

/// Checks a hostPath against its `type` (the kubelet's messages).
fn check_host_path(path: &Path, kind: &str) -> Result<(), VolumeError> {
    use std::os::unix::fs::FileTypeExt;
    let ft = std::fs::metadata(path).map(|m| m.file_type()).ok();
    let (what, is): (&'static str, fn(&std::fs::FileType) -> bool) = match kind {
        "" => return Ok(()),
        "DirectoryOrCreate" | "FileOrCreate" if ft.is_some() => return Ok(()),
        "DirectoryOrCreate" => {
            std::fs::create_dir_all(path).map_err(io_error(path))?;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755));
            return Ok(());
        }
        "FileOrCreate" => {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(io_error(path))?;
            return Ok(());
        }
        "Directory" => ("directory", |t| t.is_dir()),
        "File" => ("file", |t| t.is_file()),
        "Socket" => ("socket file", |t| t.is_socket()),
        "CharDevice" => ("character device", |t| t.is_char_device()),
        "BlockDevice" => ("block device", |t| t.is_block_device()),
        other => return Err(VolumeError::HostPathKind(other.into())),
    };
    if ft.as_ref().is_some_and(is) {
        Ok(())
    } else {
        Err(VolumeError::HostPathType {
            path: path.to_path_buf(),
            what,
        })
    }
}

/// Writes `files` into `dir` atomically (`..data` swap); nothing is written when they are
/// already there. Returns whether anything changed.
pub fn write_atomic(dir: &Path, files: &BTreeMap<String, File>) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join("..data");
    let current = std::fs::read_link(&data).ok();
    if let Some(cur) = &current {
        let same = files.iter().all(|(rel, f)| {
            let p = dir.join(cur).join(rel);
            std::fs::read(&p).is_ok_and(|d| d == f.data)
                && std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == f.mode)
        }) && count_files(&dir.join(cur)) == files.len();
        if same {
            return Ok(false);
        }
    }
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh)?;
    for (rel, f) in files {
        let p = fresh.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, &f.data)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(f.mode))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    // Top-level names point through ..data; names gone from the volume are removed.
    let tops: std::collections::BTreeSet<String> = files
        .keys()
        .filter_map(|k| k.split('/').next().map(str::to_string))
        .collect();
    for top in &tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(top), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") {
            if name != "..data" && name != stamp {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        } else if !tops.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(true)
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                count_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

/// Makes volume `v` present under the pod's directory; returns the directory (or path) to mount.
pub fn set_up(pod_dir: &Path, v: &Volume, content: &Content) -> Result<PathBuf, VolumeError> {
    // Volume names become directory names.
    if !kcore::names::is_dns1123_label(&v.name) {
        return Err(VolumeError::InvalidName(v.name.clone()));
    }
    let dir = pod_dir.join("volumes").join(plugin(v)).join(&v.name);
    match content {
        Content::EmptyDir { medium } => {
            std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
            if let Medium::Memory { size } = medium
                && !is_mount_point(&dir).map_err(io_error(&dir))?
            {
                let mut opts = "mode=0777".to_string();
                if let Some(bytes) = size {
                    opts.push_str(&format!(",size={bytes}"));
                }
                nix::mount::mount(
                    Some("tmpfs"),
                    &dir,
                    Some("tmpfs"),
                    nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                    Some(opts.as_str()),
                )
                .map_err(|e| VolumeError::Io {
                    path: dir.clone(),
                    source: e.into(),
                })?;
            }
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777));
            Ok(dir)
        }
        Content::Files(files) => {
            write_atomic(&dir, files).map_err(io_error(&dir))?;
            Ok(dir)
        }
        Content::HostPath { path, kind } => {
            check_host_path(path, kind)?;
            Ok(path.clone())
        }
    }
}

/// Whether `dir` is the root of a mount (another device than its parent's).
fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    Ok(std::fs::metadata(dir)?.dev() != std::fs::metadata(parent)?.dev())
}

/// The mount points at or below `dir`, deepest first, from a `/proc/self/mountinfo` text.
pub fn mounts_below(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// Takes a pod's directory down: unmounts its memory-backed emptyDirs, then removes it.
pub fn remove_pod_dir(dir: &Path) -> std::io::Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    for m in mounts_below(&info, dir) {
        nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH)?;
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The bind mounts of container `c`: (volume dir + subPath, mountPath, read only).
pub fn mounts(
    c: &Container,
    dirs: &BTreeMap<String, PathBuf>,
) -> Result<Vec<runtime_api::Mount>, VolumeError> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let dir = dirs
            .get(&m.name)
            .ok_or_else(|| VolumeError::NotAvailable(m.name.clone()))?;
        let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            None => dir.clone(),
            Some(sub) if safe_relative(sub) => {
                let p = dir.join(sub);
                if std::fs::symlink_metadata(&p).is_err() {
                    std::fs::create_dir_all(&p).map_err(|source| VolumeError::SubPath {
                        sub: sub.into(),
                        source,
                    })?;
                }
                p
            }
            Some(sub) => return Err(VolumeError::InvalidSubPath(sub.into())),
        };
        out.push(runtime_api::Mount {
            host_path: source,
            container_path: m.mount_path.clone(),
            read_only: m.read_only == Some(true),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1",
                "labels": {"app": "web", "tier": "front"}},
            "spec": {"nodeName": "n1", "volumes": volumes,
                "containers": [{"name": "main", "image": "busybox",
                    "resources": {"limits": {"memory": "128Mi"}, "requests": {"cpu": "250m"}}}]},
        }))
        .expect("pod")
    }

    fn sources() -> Sources {
        let data = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        Sources {
            config_maps: [
                (
                    "app".to_string(),
                    data(&[("MODE", "fast"), ("conf.yaml", "a: 1")]),
                ),
                ("kube-root-ca.crt".to_string(), data(&[("ca.crt", "PEM")])),
            ]
            .into(),
            secrets: [("creds".to_string(), data(&[("password", "s3cret")]))].into(),
            service_env: BTreeMap::new(),
        }
    }

    fn listing(c: &Content) -> Vec<String> {
        match c {
            Content::Files(f) => f
                .iter()
                .map(|(k, v)| format!("{k}:{:o}={}", v.mode, String::from_utf8_lossy(&v.data)))
                .collect(),
            other => vec![format!("{other:?}")],
        }
    }

    #[test]
    fn memory_volumes_are_sized_as_the_kubelet_sizes_them() {
        let with_limits = |limits: &[Option<&str>]| {
            let containers: Vec<serde_json::Value> = limits
                .iter()
                .enumerate()
                .map(|(i, l)| match l {
                    Some(m) => {
                        serde_json::json!({"name": format!("c{i}"), "resources": {"limits": {"memory": m}}})
                    }
                    None => serde_json::json!({"name": format!("c{i}")}),
                })
                .collect();
            serde_json::from_value::<Pod>(serde_json::json!({"spec": {"containers": containers}}))
                .expect("pod")
        };
        const MI: u64 = 1 << 20;
        let both = with_limits(&[Some("64Mi"), Some("64Mi")]);
        assert_eq!(
            memory_volume_size(&both, Some("10Mi")),
            Some(10 * MI),
            "sizeLimit below the pod's"
        );
        assert_eq!(
            memory_volume_size(&both, Some("1Gi")),
            Some(128 * MI),
            "the pod's limit below"
        );
        assert_eq!(memory_volume_size(&both, None), Some(128 * MI));
        let partial = with_limits(&[Some("64Mi"), None]);
        assert_eq!(
            memory_volume_size(&partial, None),
            None,
            "not every container declares one"
        );
        assert_eq!(memory_volume_size(&partial, Some("5Mi")), Some(5 * MI));
    }

    #[test]
    fn mounts_below_a_pod_dir_deepest_first() {
        let info = "22 1 0:21 / / rw - rootfs rootfs rw\n\
            40 22 0:40 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/ram rw - tmpfs tmpfs rw\n\
            41 40 0:41 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/ram/in rw - tmpfs tmpfs rw\n\
            42 22 0:42 / /var/lib/kubelet/pods/u10/volumes/x rw - tmpfs tmpfs rw\n";
        let got = mounts_below(info, Path::new("/var/lib/kubelet/pods/u1"));
        assert_eq!(
            got,
            [
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/ram/in"),
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/ram"),
            ]
        );
    }

    #[test]
    fn volume_contents_are_the_kubelets() {
        let token = TokenWanted {
            audience: None,
            expiration_seconds: 3607,
        };
        let tokens: BTreeMap<TokenWanted, String> = [(token, "jwt".to_string())].into();
        let table = [
            (
                serde_json::json!({"name": "v", "emptyDir": {}}),
                Ok(vec!["EmptyDir { medium: Disk }".to_string()]),
            ),
            (
                serde_json::json!({"name": "v", "emptyDir": {"medium": "Memory", "sizeLimit": "5Mi"}}),
                Ok(vec![
                    "EmptyDir { medium: Memory { size: Some(5242880) } }".to_string(),
                ]),
            ),
            (
                serde_json::json!({"name": "v", "configMap": {"name": "app"}}),
                Ok(vec!["MODE:644=fast".into(), "conf.yaml:644=a: 1".into()]),
            ),
            (
                serde_json::json!({"name": "v", "configMap": {"name": "app", "defaultMode": 0o400,
                    "items": [{"key": "MODE", "path": "sub/mode"}, {"key": "conf.yaml", "path": "c", "mode": 0o600}]}}),
                Ok(vec!["c:600=a: 1".into(), "sub/mode:400=fast".into()]),
            ),
            (
                serde_json::json!({"name": "v", "configMap": {"name": "app", "items": [{"key": "nope", "path": "x"}]}}),
                Err("configmap references non-existent config key: nope".to_string()),
            ),
            (
                serde_json::json!({"name": "v", "configMap": {"name": "app", "items": [{"key": "MODE", "path": "../x"}]}}),
                Err("invalid path \"../x\"".to_string()),
            ),
            (
                serde_json::json!({"name": "v", "configMap": {"name": "gone"}}),
                Err("configmap \"gone\" not found".into()),
            ),
            (
                serde_json::json!({"name": "v", "configMap": {"name": "gone", "optional": true}}),
                Ok(vec![]),
            ),
            (
                serde_json::json!({"name": "v", "secret": {"secretName": "creds"}}),
                Ok(vec!["password:644=s3cret".into()]),
            ),
            (
                serde_json::json!({"name": "v", "secret": {"secretName": "nope"}}),
                Err("secret \"nope\" not found".into()),
            ),
            (
                serde_json::json!({"name": "v", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}),
                Ok(vec![
                    "labels:644=app=\"web\"\ntier=\"front\"\n".into(),
                    "name:644=web".into(),
                ]),
            ),
            (
                serde_json::json!({"name": "v", "downwardAPI": {"items": [
                    {"path": "mem", "resourceFieldRef": {"containerName": "main", "resource": "limits.memory", "divisor": "1Mi"}},
                    {"path": "cpu", "resourceFieldRef": {"containerName": "main", "resource": "requests.cpu", "divisor": "1m"}}]}}),
                Ok(vec!["cpu:644=250".into(), "mem:644=128".into()]),
            ),
            (
                serde_json::json!({"name": "v", "downwardAPI": {"items": [
                    {"path": "mem", "resourceFieldRef": {"containerName": "nope", "resource": "limits.memory"}}]}}),
                Err("container nope not found".into()),
            ),
            (
                serde_json::json!({"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}),
                Ok(vec![
                    "ca.crt:644=PEM".into(),
                    "namespace:644=prod".into(),
                    "token:644=jwt".into(),
                ]),
            ),
        ];
        for (vol, want) in table {
            let p = pod(serde_json::json!([vol.clone()]));
            let v = &p.spec.as_ref().and_then(|s| s.volumes.as_ref()).expect("volumes")[0];
            let got = files(&p, v, &sources(), &tokens, &crate::pods::env::tests::node(), None)
                .map(|c| listing(&c))
                .map_err(|e| e.to_string());
            assert_eq!(got, want, "{vol}");
        }
    }

    #[test]
    fn references_and_tokens_are_collected() {
        let p = pod(serde_json::json!([
            {"name": "a", "configMap": {"name": "app"}},
            {"name": "b", "secret": {"secretName": "creds"}},
            {"name": "c", "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}},
                {"serviceAccountToken": {"path": "t", "audience": "vault", "expirationSeconds": 600}}]}},
        ]));
        assert_eq!(
            references(&p),
            (
                vec!["app".to_string(), "kube-root-ca.crt".into()],
                vec!["creds".to_string()]
            )
        );
        let wanted: Vec<TokenWanted> = p
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .flat_map(tokens_wanted)
            .collect();
        assert_eq!(
            wanted,
            [TokenWanted {
                audience: Some("vault".into()),
                expiration_seconds: 600
            }]
        );
    }

    #[test]
    fn updates_swap_atomically_and_drop_removed_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("vol");
        let f = |pairs: &[(&str, &str)]| -> BTreeMap<String, File> {
            pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        File {
                            data: v.as_bytes().to_vec(),
                            mode: 0o644,
                        },
                    )
                })
                .collect()
        };
        assert!(write_atomic(&d, &f(&[("a", "1"), ("b", "2")])).expect("write"));
        assert_eq!(std::fs::read_to_string(d.join("a")).expect("a"), "1");
        assert!(
            std::fs::symlink_metadata(d.join("a"))
                .expect("meta")
                .file_type()
                .is_symlink()
        );
        assert!(
            !write_atomic(&d, &f(&[("a", "1"), ("b", "2")])).expect("write"),
            "unchanged: nothing written"
        );
        let before = std::fs::read_link(d.join("..data")).expect("data");
        assert!(write_atomic(&d, &f(&[("a", "3")])).expect("write"));
        assert_ne!(std::fs::read_link(d.join("..data")).expect("data"), before);
        assert_eq!(std::fs::read_to_string(d.join("a")).expect("a"), "3");
        assert!(std::fs::symlink_metadata(d.join("b")).is_err(), "b removed");
        let dirs: Vec<String> = std::fs::read_dir(&d)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != "..data")
            .collect();
        assert_eq!(dirs.len(), 1, "old payloads removed: {dirs:?}");
    }

    #[test]
    fn host_paths_are_checked_and_sub_paths_stay_inside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, "x").expect("write");
        let check = |p: &Path, kind: &str| check_host_path(p, kind).map_err(|e| e.to_string());
        assert_eq!(check(&file, "File"), Ok(()));
        assert_eq!(
            check(&file, "Directory"),
            Err(format!(
                "hostPath type check failed: {} is not a directory",
                file.display()
            ))
        );
        let made = dir.path().join("made");
        assert_eq!(check(&made, "DirectoryOrCreate"), Ok(()));
        assert!(made.is_dir());
        let c: Container = serde_json::from_value(serde_json::json!({"name": "main",
            "volumeMounts": [{"name": "v", "mountPath": "/data", "subPath": "../etc"}]}))
        .expect("container");
        let dirs: BTreeMap<String, PathBuf> = [("v".to_string(), dir.path().to_path_buf())].into();
        assert!(
            mounts(&c, &dirs)
                .expect_err("escape")
                .to_string()
                .contains("invalid subPath")
        );
        let c: Container = serde_json::from_value(serde_json::json!({"name": "main",
            "volumeMounts": [{"name": "v", "mountPath": "/data", "subPath": "sub", "readOnly": true}]}))
        .expect("container");
        let m = mounts(&c, &dirs).expect("mounts");
        assert_eq!(
            (m[0].host_path.clone(), m[0].read_only),
            (dir.path().join("sub"), true)
        );
        assert!(dir.path().join("sub").is_dir());
    }

    /// A source that could not be read is not a missing one: the kubelet's cache text, and the
    /// volumes it affects are only those made from sources.
    #[test]
    fn unreadable_sources_say_so() {
        let e = MountError {
            volume: "conf".into(),
            source: VolumeError::Sync {
                of: Source::ConfigMap,
                reason: "no answer within 60s".into(),
            },
        };
        assert_eq!(
            e.to_string(),
            "MountVolume.SetUp failed for volume \"conf\" : failed to sync configmap cache: no answer within 60s"
        );
        let v: Volume =
            serde_json::from_value(serde_json::json!({"name": "scratch", "emptyDir": {}})).expect("volume");
        assert_eq!(volume_references(&v), (Vec::new(), Vec::new()));
        let v: Volume = serde_json::from_value(serde_json::json!({"name": "p", "projected": {"sources": [
            {"configMap": {"name": "kube-root-ca.crt"}}, {"secret": {"name": "s"}}]}}))
        .expect("volume");
        assert_eq!(
            volume_references(&v),
            (vec!["kube-root-ca.crt".to_string()], vec!["s".to_string()])
        );
    }
}
