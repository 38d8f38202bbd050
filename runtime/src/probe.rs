//! What the host offers containers: the cgroup setup and controllers, and the containers a previous
//! run of the runtime left in its state directory (the start of re-adoption after a restart).

use std::path::Path;

use libcgroups::common::CgroupSetup;
use libcontainer::container::{Container, ContainerStatus};

/// Errors probing the host.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot detect the cgroup setup: {0}")]
    Cgroups(String),
    #[error("cannot read runtime state directory {path}: {source}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The host's container capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProbe {
    /// True on a pure cgroup v2 (unified) host: the only layout the runtime supports.
    pub unified_cgroups: bool,
    /// Controllers enabled for children of the cgroup root.
    pub controllers: Vec<String>,
}

/// Detects the cgroup layout and the controllers enabled below `cgroup_root`.
pub fn probe_host(cgroup_root: &Path) -> Result<HostProbe, ProbeError> {
    let setup = libcgroups::common::get_cgroup_setup().map_err(|e| ProbeError::Cgroups(e.to_string()))?;
    let controllers = std::fs::read_to_string(cgroup_root.join("cgroup.subtree_control"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    Ok(HostProbe {
        unified_cgroups: matches!(setup, CgroupSetup::Unified),
        controllers,
    })
}

/// A container found in the state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownContainer {
    pub id: String,
    pub status: ContainerStatus,
    pub pid: Option<i32>,
}

/// Lists the containers recorded under `state_root` (libcontainer's per-container state dirs).
/// A missing directory means none. Unreadable entries are skipped with a warning.
pub fn known_containers(state_root: &Path) -> Result<Vec<KnownContainer>, ProbeError> {
    let rd = match std::fs::read_dir(state_root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ProbeError::StateDir {
                path: state_root.display().to_string(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        match Container::load(entry.path()) {
            Ok(c) => out.push(KnownContainer {
                id: c.id().to_string(),
                status: c.status(),
                pid: c.pid().map(|p| p.as_raw()),
            }),
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "unreadable container state")
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_state_dir_means_no_containers() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let got = known_containers(&tmp.path().join("absent")).expect("ok");
        assert!(got.is_empty());
    }

    #[test]
    fn garbage_state_is_skipped() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("c1")).expect("mkdir");
        std::fs::write(tmp.path().join("c1/state.json"), "{not json").expect("write");
        let got = known_containers(tmp.path()).expect("ok");
        assert!(got.is_empty());
    }
}
