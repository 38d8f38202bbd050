//! The machine config: a typed, versioned JSON document read from QEMU fw_cfg
//! (`opt/nodeos/config`) and the kernel command line (`nodeos.config=<base64 JSON>`).
//!
//! Layering: built-in defaults, then the fw_cfg document, then the command-line document (JSON merge
//! patch, RFC 7386, so the command line can override single fields). Unknown fields are rejected.
//! The merged document is validated into [`MachineConfig`]; code past that point never re-checks it.

use std::net::Ipv4Addr;
use std::path::Path;

use agent::settings::ShutdownGracePeriod;
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

/// The only config version this build understands.
pub const API_VERSION: &str = "nodeos/v1alpha1";
/// Where QEMU's fw_cfg sysfs driver exposes `-fw_cfg name=opt/nodeos/config,...`.
pub const FW_CFG_PATH: &str = "/sys/firmware/qemu_fw_cfg/by_name/opt/nodeos/config/raw";
/// The kernel command-line key carrying a base64 (standard or URL-safe) JSON document.
pub const CMDLINE_KEY: &str = "nodeos.config";
/// Default grace period for children at shutdown.
pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: u32 = 10;

/// Errors reading or validating the machine config. Each names where the bad input came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: not valid base64: {reason}")]
    Base64 {
        source_name: &'static str,
        reason: String,
    },
    #[error("{source_name}: not a JSON object: {reason}")]
    Json {
        source_name: &'static str,
        reason: String,
    },
    #[error("{source_name}: cannot read: {reason}")]
    Read {
        source_name: &'static str,
        reason: String,
    },
    #[error("{0}")]
    Schema(String),
    #[error("unsupported apiVersion {found:?} (this node understands {API_VERSION:?})")]
    Version { found: String },
    #[error("invalid field {field}: {reason}")]
    Invalid { field: String, reason: String },
}

/// What init does once the node is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnReady {
    /// Keep running the node's services (the normal case).
    #[default]
    Run,
    /// Orderly poweroff right after `init: ready` (boot benchmarks, smoke tests).
    Poweroff,
    /// Orderly reboot right after `init: ready`.
    Reboot,
}

/// The document as written by users (serde input).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineConfigDoc {
    pub api_version: String,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub log_level: Option<String>,
    #[serde(default)]
    pub network: NetworkConfigDoc,
    #[serde(default)]
    pub on_ready: OnReady,
    #[serde(default)]
    pub shutdown_grace_seconds: Option<u32>,
    #[serde(default)]
    pub debug: DebugConfigDoc,
    /// The control plane this node joins (none: the node runs standalone).
    #[serde(default)]
    pub control_plane: Option<ControlPlaneConfigDoc>,
    #[serde(default)]
    pub registries: RegistriesConfigDoc,
    #[serde(default)]
    pub storage: StorageConfigDoc,
    #[serde(default)]
    pub node_shutdown: NodeShutdownDoc,
    /// The kubelet's `evictionHard` (signal → `<quantity>` or `<N>%`); absent: its defaults.
    #[serde(default)]
    pub eviction_hard: Option<std::collections::BTreeMap<String, String>>,
    /// The kubelet's `evictionSoft`, `evictionSoftGracePeriod` (Go durations) and
    /// `evictionMaxPodGracePeriod` (seconds).
    #[serde(default)]
    pub eviction_soft: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub eviction_soft_grace_period: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub eviction_max_pod_grace_period: u64,
    /// The kubelet's `evictionMinimumReclaim` (signal → `<quantity>` or `<N>%`).
    #[serde(default)]
    pub eviction_minimum_reclaim: std::collections::BTreeMap<String, String>,
    /// Image garbage collection (`highThresholdPercent`, `lowThresholdPercent`,
    /// `minimumAgeSeconds`); absent fields take the kubelet's defaults.
    #[serde(default, rename = "imageGC")]
    pub image_gc: Option<agent::imagegc::Policy>,
}

/// Graceful node shutdown: the kubelet's `shutdownGracePeriod`,
/// `shutdownGracePeriodCriticalPods` and `shutdownGracePeriodByPodPriority`, in seconds. All
/// zero (the default, as upstream): off, pods are not stopped before the machine goes down.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeShutdownDoc {
    #[serde(default)]
    pub grace_period_seconds: u64,
    #[serde(default)]
    pub critical_pods_grace_period_seconds: u64,
    #[serde(default)]
    pub by_pod_priority: Vec<ShutdownGracePeriod>,
}

/// The longest graceful node shutdown the config accepts (all bands together).
pub const MAX_NODE_SHUTDOWN_SECONDS: u64 = 3600;

/// `nodeShutdown` as priority bands, sorted by priority (empty: off).
fn node_shutdown(doc: NodeShutdownDoc) -> Result<Vec<ShutdownGracePeriod>, ConfigError> {
    let field = "nodeShutdown";
    let two = doc.grace_period_seconds != 0 || doc.critical_pods_grace_period_seconds != 0;
    if two && !doc.by_pod_priority.is_empty() {
        return Err(invalid(
            field,
            "byPodPriority cannot be used with gracePeriodSeconds or criticalPodsGracePeriodSeconds",
        ));
    }
    if doc.critical_pods_grace_period_seconds > doc.grace_period_seconds {
        return Err(invalid(
            field,
            "criticalPodsGracePeriodSeconds must not exceed gracePeriodSeconds",
        ));
    }
    let mut bands = if two {
        ShutdownGracePeriod::two_phases(doc.grace_period_seconds, doc.critical_pods_grace_period_seconds)
    } else {
        doc.by_pod_priority
    };
    bands.sort();
    if let Some(w) = bands.windows(2).find(|w| w[0].priority == w[1].priority) {
        return Err(invalid(
            "nodeShutdown.byPodPriority",
            format!("priority {} is listed twice", w[0].priority),
        ));
    }
    if bands
        .iter()
        .try_fold(0u64, |sum, b| sum.checked_add(b.shutdown_grace_period_seconds))
        .is_none_or(|sum| sum > MAX_NODE_SHUTDOWN_SECONDS)
    {
        return Err(invalid(
            field,
            format!("the grace periods add up to more than {MAX_NODE_SHUTDOWN_SECONDS} seconds"),
        ));
    }
    Ok(bands)
}

/// Node-local storage.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StorageConfigDoc {
    /// Size of the file system holding containers' writable layers, their logs and pods'
    /// volumes: `<N>%` of memory (1-90) or `<N>Mi` / `<N>Gi`. Default [`DEFAULT_EPHEMERAL_SIZE`].
    #[serde(default)]
    pub ephemeral_size: Option<String>,
    /// Size of the file system holding pulled images (the kubelet's imagefs), same forms.
    /// Default [`DEFAULT_IMAGE_SIZE`].
    #[serde(default)]
    pub image_size: Option<String>,
}

/// The ephemeral storage's size when the config names none.
pub const DEFAULT_EPHEMERAL_SIZE: &str = "50%";
/// The image file system's size when the config names none.
pub const DEFAULT_IMAGE_SIZE: &str = "25%";

/// A `storage.<field>` size as the tmpfs `size=` option (`N%` or bytes).
fn tmpfs_size(field: &str, text: &str) -> Result<String, ConfigError> {
    let field = format!("storage.{field}");
    let bad = || invalid(&field, format!("{text:?} is not <N>% (1-90) or <N>Mi / <N>Gi"));
    let number = |digits: &str| -> Result<u64, ConfigError> {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        digits.parse().map_err(|_| bad())
    };
    if let Some(p) = text.strip_suffix('%') {
        let p = number(p)?;
        return if (1..=90).contains(&p) {
            Ok(format!("{p}%"))
        } else {
            Err(bad())
        };
    }
    let (digits, unit) = match (text.strip_suffix("Mi"), text.strip_suffix("Gi")) {
        (Some(d), _) => (d, 1u64 << 20),
        (_, Some(d)) => (d, 1u64 << 30),
        _ => return Err(bad()),
    };
    match number(digits)?.checked_mul(unit) {
        Some(bytes) if bytes >= 16 << 20 => Ok(bytes.to_string()),
        _ => Err(invalid(
            &field,
            format!("{text:?} is smaller than 16Mi or too large"),
        )),
    }
}

/// Image registries.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistriesConfigDoc {
    /// `host[:port]` of registries reached over plain HTTP (loopback ones always are).
    #[serde(default)]
    pub insecure: Vec<String>,
}

/// Where the node's agent registers, and how it proves it may.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ControlPlaneConfigDoc {
    /// `https://HOST:PORT` of the API server.
    pub server: String,
    /// Base64 of the cluster CA certificate (PEM).
    pub ca_data: String,
    /// A bootstrap token, `<6 chars>.<16 chars>`.
    pub bootstrap_token: String,
    /// `IP:PORT` where the control plane reaches this node's agent (logs), when that is not the
    /// node's own address and port 10250 (behind NAT, e.g. a QEMU host forward).
    #[serde(default)]
    pub kubelet_endpoint: Option<String>,
}

/// The validated control-plane settings handed to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneConfig {
    pub server: String,
    pub ca_pem: String,
    pub bootstrap_token: String,
    pub kubelet_endpoint: Option<std::net::SocketAddr>,
}

/// Network section of the document.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkConfigDoc {
    /// Interfaces to configure; empty means DHCP on every ethernet interface found.
    #[serde(default)]
    pub interfaces: Vec<InterfaceConfigDoc>,
    /// Nameservers written to /etc/resolv.conf (added to those DHCP offers).
    #[serde(default)]
    pub nameservers: Vec<String>,
}

/// One interface: DHCP, or static `address` (CIDR) with an optional `gateway`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InterfaceConfigDoc {
    pub name: String,
    #[serde(default)]
    pub dhcp: bool,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub gateway: Option<String>,
}

/// Test and diagnostics switches. Off by default; never needed in production.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DebugConfigDoc {
    /// Adds a supervised service that exits with status 1 after 200 ms, to exercise back-off.
    #[serde(default)]
    pub crash_service: bool,
    /// A program (absolute path and arguments) run once after boot; the machine powers off when
    /// it exits. The in-guest test suites use it.
    #[serde(default)]
    pub test_command: Vec<String>,
    /// Kills the agent with SIGKILL `afterSeconds` after each of its starts, `times` times: a
    /// restart-safety test (running pods must survive agent crashes untouched).
    #[serde(default)]
    pub kill_agent: Option<KillDoc>,
    /// The same for the runtime process (running pods, their output and input must survive
    /// runtime crashes untouched).
    #[serde(default)]
    pub kill_runtime: Option<KillDoc>,
}

/// `debug.killAgent` and `debug.killRuntime`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KillDoc {
    pub after_seconds: u32,
    pub times: u32,
}

/// The validated machine config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineConfig {
    pub hostname: Option<String>,
    pub log_level: String,
    pub interfaces: Vec<InterfaceConfig>,
    pub nameservers: Vec<Ipv4Addr>,
    pub on_ready: OnReady,
    pub shutdown_grace_seconds: u32,
    pub crash_service: bool,
    pub test_command: Vec<String>,
    pub kill_agent: Option<KillDoc>,
    pub kill_runtime: Option<KillDoc>,
    pub control_plane: Option<ControlPlaneConfig>,
    pub insecure_registries: Vec<String>,
    /// The ephemeral storage's tmpfs `size=` option.
    pub ephemeral_size: String,
    /// The image file system's tmpfs `size=` option.
    pub image_size: String,
    /// Graceful node shutdown's priority bands (empty: off).
    pub node_shutdown: Vec<ShutdownGracePeriod>,
    /// Eviction thresholds as written (validated).
    pub eviction: agent::pods::pressure::EvictionConfig,
    /// Image garbage collection (validated); None: the kubelet's defaults.
    pub image_gc: Option<agent::imagegc::Policy>,
}

/// A validated interface setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceConfig {
    Dhcp {
        name: String,
    },
    Static {
        name: String,
        address: Ipv4Addr,
        prefix: u8,
        gateway: Option<Ipv4Addr>,
    },
}

impl Default for MachineConfig {
    /// The safe default: DHCP on every ethernet interface, derived hostname, services running.
    fn default() -> Self {
        Self {
            hostname: None,
            log_level: "info".into(),
            interfaces: Vec::new(),
            nameservers: Vec::new(),
            on_ready: OnReady::Run,
            shutdown_grace_seconds: DEFAULT_SHUTDOWN_GRACE_SECONDS,
            crash_service: false,
            test_command: Vec::new(),
            kill_agent: None,
            kill_runtime: None,
            control_plane: None,
            insecure_registries: Vec::new(),
            ephemeral_size: DEFAULT_EPHEMERAL_SIZE.into(),
            image_size: DEFAULT_IMAGE_SIZE.into(),
            node_shutdown: Vec::new(),
            eviction: Default::default(),
            image_gc: None,
        }
    }
}

/// Extracts `nodeos.config=` from a kernel command line.
pub fn cmdline_value(cmdline: &str) -> Option<&str> {
    cmdline
        .split_ascii_whitespace()
        .find_map(|tok| tok.strip_prefix(CMDLINE_KEY)?.strip_prefix('='))
}

fn decode_b64(source_name: &'static str, text: &str) -> Result<Vec<u8>, ConfigError> {
    let text = text.trim();
    let std = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    std.decode(text)
        .or_else(|_| url.decode(text.trim_end_matches('=')))
        .map_err(|e| ConfigError::Base64 {
            source_name,
            reason: e.to_string(),
        })
}

fn parse_object(source_name: &'static str, bytes: &[u8]) -> Result<Value, ConfigError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ConfigError::Json {
        source_name,
        reason: e.to_string(),
    })?;
    if !value.is_object() {
        return Err(ConfigError::Json {
            source_name,
            reason: "the document must be a JSON object".into(),
        });
    }
    Ok(value)
}

/// Reads both sources. `fw_cfg` is the raw fw_cfg file (if QEMU provided one), `cmdline` the
/// kernel command line. Returns `Ok(None)` when neither source has a document.
pub fn load(fw_cfg: Option<&[u8]>, cmdline: &str) -> Result<Option<MachineConfig>, ConfigError> {
    let mut merged: Option<Value> = None;
    if let Some(raw) = fw_cfg {
        merged = Some(parse_object("fw_cfg opt/nodeos/config", raw)?);
    }
    if let Some(b64) = cmdline_value(cmdline) {
        let bytes = decode_b64("kernel command line nodeos.config", b64)?;
        let patch = parse_object("kernel command line nodeos.config", &bytes)?;
        match merged.as_mut() {
            Some(m) => kcore::json::merge_patch(m, &patch),
            None => merged = Some(patch),
        }
    }
    merged.map(validate_value).transpose()
}

/// Reads the fw_cfg file if the firmware exposes one.
pub fn read_fw_cfg(path: &Path) -> Result<Option<Vec<u8>>, ConfigError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::Read {
            source_name: "fw_cfg opt/nodeos/config",
            reason: e.to_string(),
        }),
    }
}

fn validate_value(value: Value) -> Result<MachineConfig, ConfigError> {
    if let Some(v) = value.get("apiVersion")
        && v.as_str() != Some(API_VERSION)
    {
        return Err(ConfigError::Version {
            found: v.to_string().trim_matches('"').to_string(),
        });
    }
    let doc: MachineConfigDoc =
        serde_json::from_value(value).map_err(|e| ConfigError::Schema(e.to_string()))?;
    validate(doc)
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// An RFC 1123 hostname: labels of [a-z0-9-], not starting or ending with '-', 63 chars each, 253 total.
pub fn is_valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

fn parse_cidr(field: &str, text: &str) -> Result<(Ipv4Addr, u8), ConfigError> {
    let (addr, prefix) = text
        .split_once('/')
        .ok_or_else(|| invalid(field, "expected ADDRESS/PREFIX"))?;
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| invalid(field, format!("{addr:?} is not an IPv4 address")))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| *p <= 32)
        .ok_or_else(|| invalid(field, "prefix must be 0-32"))?;
    Ok((addr, prefix))
}

fn validate(doc: MachineConfigDoc) -> Result<MachineConfig, ConfigError> {
    if doc.api_version != API_VERSION {
        return Err(ConfigError::Version {
            found: doc.api_version,
        });
    }
    if let Some(h) = &doc.hostname
        && !is_valid_hostname(h)
    {
        return Err(invalid(
            "hostname",
            format!("{h:?} is not a lowercase RFC 1123 hostname"),
        ));
    }
    let log_level = doc.log_level.unwrap_or_else(|| "info".into());
    if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
        return Err(invalid(
            "logLevel",
            "must be one of error, warn, info, debug, trace",
        ));
    }
    let mut interfaces = Vec::new();
    for (i, itf) in doc.network.interfaces.into_iter().enumerate() {
        let base = format!("network.interfaces[{i}]");
        if itf.name.is_empty() || itf.name.len() >= 16 || itf.name.contains('/') {
            return Err(invalid(
                format!("{base}.name"),
                "must be a Linux interface name (1-15 chars)",
            ));
        }
        match (itf.dhcp, itf.address) {
            (true, Some(_)) => return Err(invalid(base, "set either dhcp or address, not both")),
            (true, None) => {
                if itf.gateway.is_some() {
                    return Err(invalid(
                        format!("{base}.gateway"),
                        "only valid with a static address",
                    ));
                }
                interfaces.push(InterfaceConfig::Dhcp { name: itf.name })
            }
            (false, None) => return Err(invalid(base, "set dhcp: true or an address")),
            (false, Some(cidr)) => {
                let (address, prefix) = parse_cidr(&format!("{base}.address"), &cidr)?;
                let gateway = match itf.gateway {
                    None => None,
                    Some(g) => Some(g.parse().map_err(|_| {
                        invalid(format!("{base}.gateway"), format!("{g:?} is not an IPv4 address"))
                    })?),
                };
                interfaces.push(InterfaceConfig::Static {
                    name: itf.name,
                    address,
                    prefix,
                    gateway,
                });
            }
        }
    }
    let mut nameservers = Vec::new();
    for (i, ns) in doc.network.nameservers.iter().enumerate() {
        nameservers.push(ns.parse().map_err(|_| {
            invalid(
                format!("network.nameservers[{i}]"),
                format!("{ns:?} is not an IPv4 address"),
            )
        })?);
    }
    let grace = doc
        .shutdown_grace_seconds
        .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SECONDS);
    if !(1..=600).contains(&grace) {
        return Err(invalid("shutdownGraceSeconds", "must be between 1 and 600"));
    }
    if doc
        .debug
        .test_command
        .first()
        .is_some_and(|p| !p.starts_with('/'))
    {
        return Err(invalid(
            "debug.testCommand",
            "the program must be an absolute path",
        ));
    }
    let control_plane = doc.control_plane.map(validate_control_plane).transpose()?;
    let storage = &doc.storage;
    let ephemeral_size = tmpfs_size(
        "ephemeralSize",
        storage
            .ephemeral_size
            .as_deref()
            .unwrap_or(DEFAULT_EPHEMERAL_SIZE),
    )?;
    let image_size = tmpfs_size(
        "imageSize",
        storage.image_size.as_deref().unwrap_or(DEFAULT_IMAGE_SIZE),
    )?;
    let node_shutdown = node_shutdown(doc.node_shutdown)?;
    let eviction = agent::pods::pressure::EvictionConfig {
        eviction_hard: doc.eviction_hard,
        eviction_soft: doc.eviction_soft,
        eviction_soft_grace_period: doc.eviction_soft_grace_period,
        eviction_max_pod_grace_period: doc.eviction_max_pod_grace_period,
        eviction_minimum_reclaim: doc.eviction_minimum_reclaim,
    };
    eviction
        .thresholds()
        .map_err(|e| invalid("eviction", e.to_string()))?;
    eviction
        .minimum_reclaim()
        .map_err(|e| invalid("evictionMinimumReclaim", e.to_string()))?;
    if let Some(p) = &doc.image_gc {
        p.validate().map_err(|e| invalid("imageGC", e.to_string()))?;
    }
    Ok(MachineConfig {
        image_gc: doc.image_gc,
        eviction,
        node_shutdown,
        ephemeral_size,
        image_size,
        control_plane,
        hostname: doc.hostname,
        log_level,
        interfaces,
        nameservers,
        on_ready: doc.on_ready,
        shutdown_grace_seconds: grace,
        crash_service: doc.debug.crash_service,
        test_command: doc.debug.test_command,
        kill_agent: doc.debug.kill_agent,
        kill_runtime: doc.debug.kill_runtime,
        insecure_registries: doc.registries.insecure,
    })
}

fn validate_control_plane(cp: ControlPlaneConfigDoc) -> Result<ControlPlaneConfig, ConfigError> {
    let rest = cp
        .server
        .strip_prefix("https://")
        .ok_or_else(|| invalid("controlPlane.server", "must be an https:// URL"))?;
    if rest.is_empty() || rest.contains('/') && !rest.ends_with('/') {
        return Err(invalid("controlPlane.server", "must be https://HOST[:PORT]"));
    }
    let pem = base64::engine::general_purpose::STANDARD
        .decode(cp.ca_data.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|p| p.contains("-----BEGIN CERTIFICATE-----"))
        .ok_or_else(|| invalid("controlPlane.caData", "must be the base64 of a PEM certificate"))?;
    let token_ok = cp.bootstrap_token.split_once('.').is_some_and(|(id, secret)| {
        id.len() == 6
            && secret.len() == 16
            && (id.bytes().chain(secret.bytes())).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    });
    if !token_ok {
        return Err(invalid(
            "controlPlane.bootstrapToken",
            "must look like abcdef.0123456789abcdef",
        ));
    }
    let kubelet_endpoint = cp
        .kubelet_endpoint
        .map(|e| e.parse::<std::net::SocketAddr>())
        .transpose()
        .map_err(|_| invalid("controlPlane.kubeletEndpoint", "must be IP:PORT"))?;
    Ok(ControlPlaneConfig {
        server: cp.server.trim_end_matches('/').to_string(),
        ca_pem: pem,
        bootstrap_token: cp.bootstrap_token,
        kubelet_endpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn no_sources_gives_none() {
        assert_eq!(load(None, "console=ttyS0 quiet").ok().flatten(), None);
    }

    #[test]
    fn fw_cfg_document_is_validated() {
        let doc = br#"{"apiVersion":"nodeos/v1alpha1","hostname":"node-a",
            "network":{"interfaces":[{"name":"eth0","address":"10.0.2.15/24","gateway":"10.0.2.2"}],"nameservers":["10.0.2.3"]},
            "onReady":"poweroff","shutdownGraceSeconds":3}"#;
        let cfg = load(Some(doc), "").expect("valid").expect("present");
        assert_eq!(cfg.hostname.as_deref(), Some("node-a"));
        assert_eq!(cfg.on_ready, OnReady::Poweroff);
        assert_eq!(cfg.shutdown_grace_seconds, 3);
        assert_eq!(
            cfg.interfaces,
            vec![InterfaceConfig::Static {
                name: "eth0".into(),
                address: Ipv4Addr::new(10, 0, 2, 15),
                prefix: 24,
                gateway: Some(Ipv4Addr::new(10, 0, 2, 2))
            }]
        );
        assert_eq!(cfg.nameservers, vec![Ipv4Addr::new(10, 0, 2, 3)]);
    }

    #[test]
    fn image_storage_size() {
        let with = |size: &str| {
            let doc = format!(r#"{{"apiVersion":"nodeos/v1alpha1","storage":{{"imageSize":{size}}}}}"#);
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present"))
        };
        let doc = br#"{"apiVersion":"nodeos/v1alpha1"}"#;
        let default = load(Some(doc), "").expect("valid").expect("present");
        assert_eq!(default.image_size, "25%");
        let set = with(r#""1Gi""#).expect("valid");
        assert_eq!(
            (set.image_size.as_str(), set.ephemeral_size.as_str()),
            ("1073741824", "50%")
        );
        for size in [r#""0%""#, r#""8Mi""#, r#""lots""#] {
            let err = with(size).expect_err(size).to_string();
            assert!(
                err.starts_with("invalid field storage.imageSize"),
                "{size}: {err}"
            );
        }
    }

    #[test]
    fn ephemeral_storage_size() {
        let with = |size: &str| {
            let doc = format!(r#"{{"apiVersion":"nodeos/v1alpha1","storage":{{"ephemeralSize":{size}}}}}"#);
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present").ephemeral_size)
        };
        let doc = br#"{"apiVersion":"nodeos/v1alpha1"}"#;
        assert_eq!(
            load(Some(doc), "")
                .expect("valid")
                .expect("present")
                .ephemeral_size,
            "50%"
        );
        for (size, option) in [
            (r#""30%""#, "30%"),
            (r#""512Mi""#, "536870912"),
            (r#""2Gi""#, "2147483648"),
        ] {
            assert_eq!(with(size).expect("valid"), option, "{size}");
        }
        for size in [
            r#""0%""#,
            r#""95%""#,
            r#""-5%""#,
            r#""8Mi""#,
            r#""2G""#,
            r#""lots""#,
            r#""""#,
            r#""1%%""#,
            "2048",
        ] {
            let err = with(size).expect_err(size).to_string();
            assert!(
                err.starts_with("invalid field storage.ephemeralSize") || size == "2048",
                "{size}: {err}"
            );
        }
    }

    #[test]
    fn eviction_thresholds() {
        let with = |map: &str| {
            let doc = format!(r#"{{"apiVersion":"nodeos/v1alpha1","evictionHard":{map}}}"#);
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present").eviction.eviction_hard)
        };
        let doc = br#"{"apiVersion":"nodeos/v1alpha1"}"#;
        assert_eq!(
            load(Some(doc), "").expect("valid").expect("present").eviction,
            agent::pods::pressure::EvictionConfig::default()
        );
        let given = with(r#"{"memory.available":"600Mi","nodefs.available":"7.5%"}"#).expect("valid");
        assert_eq!(
            given.map(|m| m.into_iter().collect::<Vec<_>>()),
            Some(vec![
                ("memory.available".to_string(), "600Mi".to_string()),
                ("nodefs.available".to_string(), "7.5%".to_string())
            ])
        );
        for (map, why) in [
            (
                r#"{"containerfs.available":"15%"}"#,
                "unsupported eviction signal \"containerfs.available\"",
            ),
            (r#"{"memory.free":"1Mi"}"#, "unsupported eviction signal"),
            (r#"{"memory.available":"lots"}"#, "not a quantity or a percentage"),
            (r#"{"nodefs.available":"120%"}"#, "not a quantity or a percentage"),
            (r#"{"nodefs.available":"-1%"}"#, "not a quantity or a percentage"),
            (r#"{"memory.available":5}"#, ""),
        ] {
            let err = with(map).expect_err(map).to_string();
            assert!(err.contains(why), "{map}: {err}");
        }
        // Soft thresholds need their grace period.
        let soft = |extra: &str| {
            let doc = format!(
                r#"{{"apiVersion":"nodeos/v1alpha1","evictionSoft":{{"memory.available":"300Mi"}}{extra}}}"#
            );
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present").eviction)
        };
        let e =
            soft(r#","evictionSoftGracePeriod":{"memory.available":"1m30s"},"evictionMaxPodGracePeriod":20"#)
                .expect("valid");
        assert_eq!(e.eviction_max_pod_grace_period, 20);
        let err = soft("").expect_err("no grace").to_string();
        assert!(
            err.contains("grace period must be specified for the soft eviction threshold memory.available"),
            "{err}"
        );
        // Minimum reclaim: the same signals and amounts.
        let reclaim = |map: &str| {
            let doc = format!(r#"{{"apiVersion":"nodeos/v1alpha1","evictionMinimumReclaim":{map}}}"#);
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present").eviction)
        };
        let e = reclaim(r#"{"memory.available":"50Mi","imagefs.available":"2%"}"#).expect("valid");
        assert_eq!(e.minimum_reclaim().expect("valid").len(), 2);
        for (map, why) in [
            (r#"{"memory.free":"1Mi"}"#, "unsupported eviction signal"),
            (r#"{"memory.available":"much"}"#, "not a quantity or a percentage"),
        ] {
            let err = reclaim(map).expect_err(map).to_string();
            assert!(
                err.starts_with("invalid field evictionMinimumReclaim") && err.contains(why),
                "{map}: {err}"
            );
        }
    }

    #[test]
    fn image_gc_policy() {
        let with = |section: &str| {
            let doc = format!(r#"{{"apiVersion":"nodeos/v1alpha1","imageGC":{section}}}"#);
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present").image_gc)
        };
        let p = with(r#"{"highThresholdPercent":90,"minimumAgeSeconds":0}"#)
            .expect("valid")
            .expect("given");
        assert_eq!(
            (
                p.high_threshold_percent,
                p.low_threshold_percent,
                p.minimum_age_seconds
            ),
            (90, 80, 0),
            "absent fields take the defaults"
        );
        for (section, why) in [
            (
                r#"{"highThresholdPercent":50}"#,
                "must be less than imageGCHighThresholdPercent",
            ),
            (
                r#"{"highThresholdPercent":101,"lowThresholdPercent":1}"#,
                "must be between 0 and 100",
            ),
            (r#"{"high":1}"#, "unknown field"),
        ] {
            let err = with(section).expect_err(section).to_string();
            assert!(err.contains(why), "{section}: {err}");
        }
    }

    #[test]
    fn node_shutdown_bands() {
        let with = |section: &str| {
            let doc = format!(r#"{{"apiVersion":"nodeos/v1alpha1","nodeShutdown":{section}}}"#);
            load(Some(doc.as_bytes()), "").map(|c| c.expect("present").node_shutdown)
        };
        let band = |priority, shutdown_grace_period_seconds| ShutdownGracePeriod {
            priority,
            shutdown_grace_period_seconds,
        };
        let doc = br#"{"apiVersion":"nodeos/v1alpha1"}"#;
        let default = load(Some(doc), "").expect("valid").expect("present");
        assert_eq!(default.node_shutdown, vec![], "off unless configured");
        assert_eq!(with("{}").expect("valid"), vec![]);
        assert_eq!(
            with(r#"{"gracePeriodSeconds":30,"criticalPodsGracePeriodSeconds":10}"#).expect("valid"),
            vec![band(0, 20), band(2_000_000_000, 10)]
        );
        // Given out of order; kept sorted by priority.
        assert_eq!(
            with(
                r#"{"byPodPriority":[{"priority":100000,"shutdownGracePeriodSeconds":10},
                    {"priority":0,"shutdownGracePeriodSeconds":60},
                    {"priority":10000,"shutdownGracePeriodSeconds":180}]}"#
            )
            .expect("valid"),
            vec![band(0, 60), band(10000, 180), band(100000, 10)]
        );
        for (section, why) in [
            (
                r#"{"gracePeriodSeconds":10,"criticalPodsGracePeriodSeconds":20}"#,
                "must not exceed",
            ),
            (
                r#"{"gracePeriodSeconds":10,"byPodPriority":[{"priority":0,"shutdownGracePeriodSeconds":5}]}"#,
                "cannot be used with",
            ),
            (
                r#"{"byPodPriority":[{"priority":0,"shutdownGracePeriodSeconds":5},{"priority":0,"shutdownGracePeriodSeconds":6}]}"#,
                "priority 0 is listed twice",
            ),
            (r#"{"gracePeriodSeconds":3601}"#, "more than 3600 seconds"),
            (r#"{"gracePeriodSeconds":-1}"#, ""),
            (r#"{"gracePeriod":"30s"}"#, "unknown field"),
            (r#"{"byPodPriority":[{"priority":0}]}"#, "missing field"),
        ] {
            let err = with(section).expect_err(section).to_string();
            assert!(err.contains(why), "{section}: {err}");
        }
    }

    #[test]
    fn cmdline_overrides_fw_cfg_fields() {
        let fw = br#"{"apiVersion":"nodeos/v1alpha1","hostname":"from-fwcfg","logLevel":"debug"}"#;
        let cmdline = format!(
            "quiet nodeos.config={} panic=-1",
            b64(r#"{"hostname":"from-cmdline"}"#)
        );
        let cfg = load(Some(fw), &cmdline).expect("valid").expect("present");
        assert_eq!(cfg.hostname.as_deref(), Some("from-cmdline"));
        assert_eq!(cfg.log_level, "debug");
    }

    #[test]
    fn kill_switches_for_restart_tests() {
        let doc =
            br#"{"apiVersion":"nodeos/v1alpha1","debug":{"killRuntime":{"afterSeconds":20,"times":5}}}"#;
        let cfg = load(Some(doc), "").expect("valid").expect("present");
        assert_eq!(
            (cfg.kill_runtime, cfg.kill_agent),
            (
                Some(KillDoc {
                    after_seconds: 20,
                    times: 5
                }),
                None
            )
        );
        let typo = br#"{"apiVersion":"nodeos/v1alpha1","debug":{"killRuntime":{"afterSecs":20,"times":5}}}"#;
        assert!(load(Some(typo), "").is_err(), "an unknown field is refused");
    }

    #[test]
    fn unknown_field_is_rejected_with_its_name() {
        let err =
            load(Some(br#"{"apiVersion":"nodeos/v1alpha1","hostnme":"x"}"#), "").expect_err("must fail");
        assert!(err.to_string().contains("unknown field `hostnme`"), "{err}");
    }

    #[test]
    fn wrong_version_is_rejected() {
        let err = load(Some(br#"{"apiVersion":"nodeos/v9","hostname":"x"}"#), "").expect_err("must fail");
        assert!(
            err.to_string().contains("unsupported apiVersion \"nodeos/v9\""),
            "{err}"
        );
    }

    #[test]
    fn missing_version_is_rejected() {
        let err = load(Some(br#"{"hostname":"x"}"#), "").expect_err("must fail");
        assert!(err.to_string().contains("missing field `apiVersion`"), "{err}");
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"apiVersion":"nodeos/v1alpha1","hostname":"Bad_Host"}"#,
                "invalid field hostname",
            ),
            (
                r#"{"apiVersion":"nodeos/v1alpha1","network":{"interfaces":[{"name":"eth0","address":"10.0.0.1/40"}]}}"#,
                "invalid field network.interfaces[0].address",
            ),
            (
                r#"{"apiVersion":"nodeos/v1alpha1","network":{"interfaces":[{"name":"eth0"}]}}"#,
                "invalid field network.interfaces[0]: set dhcp",
            ),
            (
                r#"{"apiVersion":"nodeos/v1alpha1","shutdownGraceSeconds":0}"#,
                "invalid field shutdownGraceSeconds",
            ),
            (
                r#"{"apiVersion":"nodeos/v1alpha1","onReady":"explode"}"#,
                "unknown variant `explode`",
            ),
        ];
        for (doc, want) in cases {
            let err = load(Some(doc.as_bytes()), "").expect_err(doc);
            assert!(err.to_string().contains(want), "{doc}: {err}");
        }
    }

    #[test]
    fn malformed_sources_are_named() {
        let err = load(Some(b"{not json"), "").expect_err("must fail");
        assert!(
            err.to_string()
                .starts_with("fw_cfg opt/nodeos/config: not a JSON object"),
            "{err}"
        );
        let err = load(None, "nodeos.config=!!!").expect_err("must fail");
        assert!(
            err.to_string()
                .starts_with("kernel command line nodeos.config: not valid base64"),
            "{err}"
        );
        let err = load(Some(b"[1,2]"), "").expect_err("must fail");
        assert!(err.to_string().contains("must be a JSON object"), "{err}");
    }

    #[test]
    fn control_plane_section() {
        let ca = b64("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
        let doc = format!(
            r#"{{"apiVersion":"nodeos/v1alpha1","controlPlane":{{"server":"https://10.0.2.100:6443","caData":"{ca}","bootstrapToken":"abcdef.0123456789abcdef"}}}}"#
        );
        let cfg = load(Some(doc.as_bytes()), "").expect("valid").expect("present");
        let cp = cfg.control_plane.expect("control plane");
        assert_eq!(cp.server, "https://10.0.2.100:6443");
        assert!(cp.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(cp.kubelet_endpoint, None);
        let with_endpoint = doc.replace(
            r#""bootstrapToken""#,
            r#""kubeletEndpoint":"127.0.0.1:40123","bootstrapToken""#,
        );
        let cfg = load(Some(with_endpoint.as_bytes()), "")
            .expect("valid")
            .expect("present");
        let endpoint = cfg.control_plane.and_then(|c| c.kubelet_endpoint);
        assert_eq!(endpoint, Some("127.0.0.1:40123".parse().expect("addr")));
        for (bad, field) in [
            (
                with_endpoint.replace("127.0.0.1:40123", "node:10250"),
                "controlPlane.kubeletEndpoint",
            ),
            (doc.replace("https://", "http://"), "controlPlane.server"),
            (doc.replace(&ca, "bm90IGEgY2VydA=="), "controlPlane.caData"),
            (
                doc.replace("abcdef.0123456789abcdef", "short.token"),
                "controlPlane.bootstrapToken",
            ),
        ] {
            let err = load(Some(bad.as_bytes()), "").expect_err("must fail");
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn hostname_rules() {
        assert!(is_valid_hostname("node-1.example"));
        assert!(!is_valid_hostname("-node"));
        assert!(!is_valid_hostname("Node"));
        assert!(!is_valid_hostname(&"a".repeat(64)));
        assert!(!is_valid_hostname(""));
    }
}
