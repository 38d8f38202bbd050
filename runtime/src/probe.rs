//! What the host offers containers: the cgroup setup and its controllers.

use std::path::Path;

use libcgroups::common::CgroupSetup;

/// Errors probing the host.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot detect the cgroup setup: {0}")]
    Cgroups(String),
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
