//! The kubelet's Summary API document (`GET /stats/summary`, `stats/v1alpha1`): the part
//! metrics-server reads (CPU nanocores and memory working set of the node, its pods and their
//! containers). Written by the agent, read by the API server's metrics scraper.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The bytes allocated under `path`, as `du` counts them (blocks × 512; symlinks not followed,
/// other file systems mounted below skipped); 0 when it does not exist. Ephemeral-storage
/// accounting measures with it on both sides: the runtime its writable layers and logs, the
/// agent its emptyDirs.
pub fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = fs::symlink_metadata(path) else {
        return 0;
    };
    let dev = top.dev();
    let mut total = top.blocks() * 512;
    let mut todo = vec![path.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                todo.push(entry.path());
            }
        }
    }
    total
}

/// The Summary document (only what metrics are made of).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    #[serde(default)]
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodRef,
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// RFC 3339 time of the sample.
    #[serde(default)]
    pub time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    #[serde(default)]
    pub time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `du`'s count: what is written, in whole blocks; nothing for a missing path.
    #[test]
    fn disk_usage_counts_allocated_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(disk_usage(&dir.path().join("missing")), 0);
        let before = disk_usage(dir.path());
        fs::create_dir(dir.path().join("a")).expect("mkdir");
        fs::write(dir.path().join("a/f"), vec![7u8; 100 * 1024]).expect("write");
        std::os::unix::fs::symlink("/usr", dir.path().join("a/l")).expect("symlink");
        let after = disk_usage(dir.path());
        assert!(after - before >= 100 * 1024, "{before} -> {after}");
        assert!(
            after - before < 100 * 1024 + 64 * 1024,
            "symlinks are not followed: {after}"
        );
    }
}
