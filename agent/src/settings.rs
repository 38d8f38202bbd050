//! The hand-off from init to the agent: one typed document that init writes (from the validated
//! machine config and the network it brought up) and the agent reads at start.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where init writes the settings (tmpfs; mode 0600: they hold the bootstrap token).
pub const PATH: &str = "/run/nodeos/agent.json";

/// What the agent needs from the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSettings {
    pub node_name: String,
    /// The node's address (the first configured interface).
    #[serde(rename = "nodeIP")]
    pub node_ip: Option<String>,
    pub control_plane: Option<ControlPlane>,
    /// Registries reached over plain HTTP.
    #[serde(default)]
    pub insecure_registries: Vec<String>,
    /// Graceful node shutdown (docs/SEEDS-SPEC.md NODE-68); empty: off, as upstream's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGracePeriod>,
    /// Eviction thresholds (docs/SEEDS-SPEC.md NODE-46): hard, soft with grace periods.
    #[serde(default)]
    pub eviction: crate::pods::pressure::EvictionConfig,
    /// Image garbage collection; None: the kubelet's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_gc: Option<crate::imagegc::Policy>,
}

/// How long the pods of one priority band get when the node shuts down: the kubelet's
/// `shutdownGracePeriodByPodPriority` entry (pods with at least `priority`, up to the next
/// entry's, share `shutdown_grace_period_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShutdownGracePeriod {
    pub priority: i32,
    pub shutdown_grace_period_seconds: u64,
}

pub use kcore::qos::SYSTEM_CRITICAL_PRIORITY;

impl ShutdownGracePeriod {
    /// The kubelet's `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` as priority
    /// bands (its `migrateConfig`): regular pods get `total - critical`, pods of at least
    /// [`SYSTEM_CRITICAL_PRIORITY`] the last `critical` seconds. A zero total, or a critical
    /// period longer than the total, turns the feature off (no bands), as upstream.
    pub fn two_phases(total: u64, critical: u64) -> Vec<Self> {
        if total == 0 || critical > total {
            return Vec::new();
        }
        vec![
            Self {
                priority: 0,
                shutdown_grace_period_seconds: total - critical,
            },
            Self {
                priority: SYSTEM_CRITICAL_PRIORITY,
                shutdown_grace_period_seconds: critical,
            },
        ]
    }

    /// How long a whole shutdown may take: the sum of the bands.
    pub fn total(bands: &[Self]) -> u64 {
        bands.iter().map(|b| b.shutdown_grace_period_seconds).sum()
    }
}

/// The control plane to join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlane {
    /// `https://HOST:PORT` of the API server.
    pub server: String,
    /// The cluster CA (PEM): the only trust anchor the agent uses.
    pub ca_pem: String,
    /// `<id>.<secret>`: lets the node ask for its client certificate.
    pub bootstrap_token: String,
    /// `IP:PORT` where the control plane reaches this agent, when not the node's address:10250.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_endpoint: Option<String>,
}

/// Errors reading or writing the settings.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl AgentSettings {
    /// The node's eviction thresholds: the configured ones, or the kubelet's defaults.
    pub fn thresholds(
        &self,
    ) -> Result<crate::pods::pressure::Thresholds, crate::pods::pressure::ThresholdError> {
        self.eviction.thresholds()
    }

    /// Writes the settings to `path` (mode 0600), creating its directory.
    pub fn write(&self, path: &Path) -> Result<(), SettingsError> {
        let io = |source| SettingsError::Io {
            path: path.into(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let bytes = serde_json::to_vec(self).map_err(|source| SettingsError::Decode {
            path: path.into(),
            source,
        })?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(&bytes))
            .map_err(io)
    }

    /// The settings at `path`; None when there are none (a node without a control plane).
    pub fn read(path: &Path) -> Result<Option<Self>, SettingsError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(SettingsError::Io {
                    path: path.into(),
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| SettingsError::Decode {
                path: path.into(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_shutdown_phases_become_priority_bands() {
        let band = |priority, shutdown_grace_period_seconds| ShutdownGracePeriod {
            priority,
            shutdown_grace_period_seconds,
        };
        // SEEDS-SPEC NODE-68's example: 30 s with 10 s for critical pods gives 20 s + 10 s.
        let bands = ShutdownGracePeriod::two_phases(30, 10);
        assert_eq!(bands, vec![band(0, 20), band(SYSTEM_CRITICAL_PRIORITY, 10)]);
        assert_eq!(ShutdownGracePeriod::total(&bands), 30);
        assert_eq!(
            ShutdownGracePeriod::two_phases(30, 0),
            vec![band(0, 30), band(SYSTEM_CRITICAL_PRIORITY, 0)]
        );
        assert_eq!(
            ShutdownGracePeriod::two_phases(10, 10),
            vec![band(0, 0), band(SYSTEM_CRITICAL_PRIORITY, 10)]
        );
        assert_eq!(ShutdownGracePeriod::two_phases(0, 0), vec![]);
        assert_eq!(ShutdownGracePeriod::two_phases(10, 20), vec![]);
    }

    #[test]
    fn written_settings_read_back_and_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("run/agent.json");
        assert_eq!(AgentSettings::read(&path).expect("absent is fine"), None);
        let s = AgentSettings {
            node_name: "n1".into(),
            node_ip: Some("10.0.2.15".into()),
            control_plane: Some(ControlPlane {
                server: "https://10.0.2.100:6443".into(),
                ca_pem: "PEM".into(),
                bootstrap_token: "abcdef.0123456789abcdef".into(),
                kubelet_endpoint: None,
            }),
            insecure_registries: vec!["10.0.2.101:5000".into()],
            shutdown_grace_period_by_pod_priority: vec![ShutdownGracePeriod {
                priority: 0,
                shutdown_grace_period_seconds: 20,
            }],
            eviction: crate::pods::pressure::EvictionConfig {
                eviction_hard: Some([("memory.available".to_string(), "200Mi".to_string())].into()),
                ..Default::default()
            },
            image_gc: Some(crate::imagegc::Policy {
                high_threshold_percent: 50,
                ..crate::imagegc::Policy::default()
            }),
        };
        s.write(&path).expect("write");
        assert_eq!(AgentSettings::read(&path).expect("read"), Some(s));
        let mode = std::fs::metadata(&path).expect("stat").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
        std::fs::write(&path, "{").expect("corrupt");
        assert!(matches!(
            AgentSettings::read(&path),
            Err(SettingsError::Decode { .. })
        ));
    }
}
