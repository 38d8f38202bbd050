//! The pod cgroup tree and its values, as docs/SEEDS-SPEC.md §4.10-4.11 records them.
//!
//! ```text
//! /kubepods.slice                                   cpu.weight from node CPUs, memory.max and
//!                                                   pids.max less the system's reservation
//! /kubepods.slice/kubepods-burstable.slice          cpu.weight from the sum of Burstable requests
//! /kubepods.slice/kubepods-besteffort.slice         cpu.weight 1
//! <qos slice>/kubepods[-<qos>]-pod<uid_>.slice      pod: the values the agent computed (kcore::qos)
//! <pod slice>/nodeos-<id>.scope                     one per container, pause included
//! ```
//! Guaranteed pods sit directly under `kubepods.slice`. Slices written by us use the kubelet's
//! linear shares→weight mapping; container scopes are written by libcgroups, which uses the OCI
//! runtimes' quadratic mapping (NODE-37), so both match what the kubelet + runc produce.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use runtime_api::{PodResources, QosClass};
use serde::{Deserialize, Serialize};

/// Where cgroup2 is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
pub const KUBEPODS: &str = "/kubepods.slice";
/// The CFS period every container and pod gets (µs).
pub const CPU_PERIOD: u64 = 100_000;
/// Controllers enabled down the tree.
const CONTROLLERS: &str = "+cpu +memory +pids +io";

/// cgroup v1 shares for a CPU request: `max(2, milli × 1024 / 1000)`.
pub fn cpu_shares(milli: u64) -> u64 {
    (milli * 1024 / 1000).max(2)
}

/// The kubelet's linear shares→weight mapping for the slices it writes.
pub fn slice_weight(shares: u64) -> u64 {
    1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142
}

/// CFS quota (µs per [`CPU_PERIOD`]) for a CPU limit; the kernel minimum is 1000.
pub fn cpu_quota(limit_milli: u64) -> u64 {
    (limit_milli * CPU_PERIOD / 1000).max(1000)
}

/// The pause process's score (what containerd gives it).
pub const PAUSE_OOM_SCORE_ADJ: i32 = -998;

/// `7d672ea5-d2db-…` → `7d672ea5_d2db_…` (NODE-40).
pub fn uid_for_path(uid: &str) -> String {
    uid.replace('-', "_")
}

/// The pod slice path (relative to the cgroup root, absolute form) under the slice of the QoS
/// class the agent gave.
pub fn pod_slice(qos: QosClass, uid: &str) -> String {
    let uid = uid_for_path(uid);
    match qos {
        QosClass::Guaranteed => format!("{KUBEPODS}/kubepods-pod{uid}.slice"),
        QosClass::Burstable => {
            format!("{KUBEPODS}/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice")
        }
        QosClass::BestEffort => {
            format!("{KUBEPODS}/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice")
        }
    }
}

/// A container's scope under its pod slice.
pub fn container_scope(pod_slice: &str, container_id: &str) -> String {
    format!("{pod_slice}/nodeos-{container_id}.scope")
}

/// Values of a pod slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSliceValues {
    pub cpu_weight: u64,
    /// CFS quota, or None for `max`.
    pub cpu_quota: Option<u64>,
    pub memory_max: Option<u64>,
}

/// The pod slice's file values from the values the agent computed (NODE-36/37): the linear
/// weight of the pod's cpu request, the quota of its cpu limit, its memory limit.
pub fn pod_slice_values(r: &PodResources) -> PodSliceValues {
    PodSliceValues {
        cpu_weight: slice_weight(cpu_shares(r.cpu_request_milli)),
        cpu_quota: r.cpu_limit_milli.map(cpu_quota),
        memory_max: r.memory_limit,
    }
}

/// Errors writing the tree.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {source}")]
pub struct CgroupError {
    pub path: PathBuf,
    pub source: io::Error,
}

/// The cgroup tree of the node's pods, rooted at a cgroup2 mount.
#[derive(Debug, Clone)]
pub struct Tree {
    root: PathBuf,
}

impl Tree {
    pub fn new(root: &Path) -> Self {
        Tree {
            root: root.to_path_buf(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    fn write(&self, rel: &str, file: &str, value: &str) -> Result<(), CgroupError> {
        let path = self.path(rel).join(file);
        fs::write(&path, value).map_err(|source| CgroupError { path, source })
    }

    /// Reads a cgroup file (trimmed).
    pub fn read(&self, rel: &str, file: &str) -> Result<String, CgroupError> {
        let path = self.path(rel).join(file);
        fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|source| CgroupError { path, source })
    }

    /// Creates `rel` and enables the controllers for its children.
    fn ensure(&self, rel: &str) -> Result<(), CgroupError> {
        let path = self.path(rel);
        fs::create_dir_all(&path).map_err(|source| CgroupError {
            path: path.clone(),
            source,
        })?;
        self.write(rel, "cgroup.subtree_control", CONTROLLERS)
    }

    /// Creates `kubepods.slice` and the QoS slices. `cpu_milli` is the node's CPU, `memory` and
    /// `pids` the limits of everything pods may use together (kcore::allocatable).
    pub fn setup_node(&self, cpu_milli: u64, memory: u64, pids: u64) -> Result<(), CgroupError> {
        // The root must delegate the controllers first.
        self.write("/", "cgroup.subtree_control", CONTROLLERS)?;
        self.ensure(KUBEPODS)?;
        self.write(
            KUBEPODS,
            "cpu.weight",
            &slice_weight(cpu_shares(cpu_milli)).to_string(),
        )?;
        self.write(KUBEPODS, "memory.max", &memory.to_string())?;
        self.write(KUBEPODS, "pids.max", &pids.to_string())?;
        for qos in ["burstable", "besteffort"] {
            let rel = format!("{KUBEPODS}/kubepods-{qos}.slice");
            self.ensure(&rel)?;
            self.write(&rel, "cpu.weight", "1")?;
            self.write(&rel, "memory.max", "max")?;
        }
        Ok(())
    }

    /// Sets the Burstable slice's weight from the sum of Burstable CPU requests (NODE-36/39).
    pub fn set_burstable_requests(&self, cpu_milli: u64) -> Result<(), CgroupError> {
        let rel = format!("{KUBEPODS}/kubepods-burstable.slice");
        self.write(
            &rel,
            "cpu.weight",
            &slice_weight(cpu_shares(cpu_milli)).to_string(),
        )
    }

    /// Creates a pod slice and writes its values.
    pub fn create_pod(&self, rel: &str, v: &PodSliceValues) -> Result<(), CgroupError> {
        self.ensure(rel)?;
        self.write(rel, "cpu.weight", &v.cpu_weight.to_string())?;
        let cpu_max = match v.cpu_quota {
            Some(q) => format!("{q} {CPU_PERIOD}"),
            None => format!("max {CPU_PERIOD}"),
        };
        self.write(rel, "cpu.max", &cpu_max)?;
        self.write(
            rel,
            "memory.max",
            &v.memory_max.map_or("max".to_string(), |m| m.to_string()),
        )?;
        self.write(rel, "memory.oom.group", "0")
    }

    /// Creates a container's scope under its pod slice, whose subtree has the controllers.
    /// libcontainer then only moves the container's process into it; given a path that does
    /// not exist yet, it enables every controller the node has at every level of the path
    /// first (`cgroup.subtree_control`, ~28 writes per container, each taking the kernel's
    /// cgroup lock and walking the node's cgroups).
    pub fn create_scope(&self, rel: &str) -> Result<(), CgroupError> {
        let path = self.path(rel);
        match fs::create_dir(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(source) => Err(CgroupError { path, source }),
        }
    }

    /// Removes a container's scope if it is empty (a failed build's); its pod slice's removal
    /// takes what is left.
    pub fn remove_scope(&self, rel: &str) {
        let _ = fs::remove_dir(self.path(rel));
    }

    /// Removes a pod slice (and empty container scopes left under it).
    pub fn remove_pod(&self, rel: &str) -> Result<(), CgroupError> {
        let path = self.path(rel);
        if let Ok(rd) = fs::read_dir(&path) {
            for e in rd.flatten() {
                if e.path().is_dir() {
                    let _ = fs::remove_dir(e.path());
                }
            }
        }
        match fs::remove_dir(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CgroupError { path, source }),
        }
    }

    /// Whether the kernel OOM-killed something in this cgroup (`memory.events` oom_kill > 0).
    pub fn oom_killed(&self, rel: &str) -> bool {
        self.read(rel, "memory.events").is_ok_and(|s| {
            s.lines().any(|l| {
                l.strip_prefix("oom_kill ")
                    .is_some_and(|n| n.trim().parse::<u64>().unwrap_or(0) > 0)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1024 * 1024;

    #[test]
    fn weights_match_the_observed_values() {
        // NODE-35/37: 4 CPUs → 157, Burstable 950m → 37, CoreDNS pod 100m → 4, BestEffort → 1.
        assert_eq!(slice_weight(cpu_shares(4000)), 157);
        assert_eq!(slice_weight(cpu_shares(950)), 37);
        assert_eq!(slice_weight(cpu_shares(100)), 4);
        assert_eq!(slice_weight(cpu_shares(0)), 1);
        assert_eq!(cpu_shares(100), 102);
        assert_eq!(cpu_quota(1000), 100_000);
        assert_eq!(cpu_quota(500), 50_000);
        assert_eq!(cpu_quota(1), 1000);
        // 170Mi = 178257920 (NODE-38).
        assert_eq!(170 * MI, 178_257_920);
    }

    #[test]
    fn pod_slice_values_from_the_agents_numbers() {
        // CoreDNS: 100m requested, 170Mi memory limit, no cpu limit (NODE-35).
        let coredns = PodResources {
            qos: QosClass::Burstable,
            cpu_request_milli: 100,
            cpu_limit_milli: None,
            memory_limit: Some(170 * MI),
        };
        assert_eq!(
            pod_slice_values(&coredns),
            PodSliceValues {
                cpu_weight: 4,
                cpu_quota: None,
                memory_max: Some(178_257_920)
            }
        );
        let g = PodResources {
            qos: QosClass::Guaranteed,
            cpu_request_milli: 1000,
            cpu_limit_milli: Some(1000),
            memory_limit: Some(128 * MI),
        };
        let v = pod_slice_values(&g);
        assert_eq!((v.cpu_quota, v.memory_max), (Some(100_000), Some(128 * MI)));
        assert_eq!(
            pod_slice_values(&PodResources::default()).cpu_weight,
            1,
            "BestEffort"
        );
    }

    #[test]
    fn paths() {
        let uid = "7d672ea5-d2db-4c8e-be14-cd10571ef470";
        assert_eq!(
            pod_slice(QosClass::Burstable, uid),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d672ea5_d2db_4c8e_be14_cd10571ef470.slice"
        );
        assert_eq!(
            pod_slice(QosClass::Guaranteed, "a-b"),
            "/kubepods.slice/kubepods-poda_b.slice"
        );
        assert_eq!(container_scope("/p.slice", "abc"), "/p.slice/nodeos-abc.scope");
    }
}
