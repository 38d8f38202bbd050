//! Pod sandboxes: the pause process holding a pod's namespaces, its cgroup slice and its address.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// DNS settings of a pod (`/etc/resolv.conf`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dns {
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub searches: Vec<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

/// The QoS class the agent computed for a pod. To the runtime it only names the slice the pod's
/// cgroup goes under (docs/SEEDS-SPEC.md NODE-34): Guaranteed pods directly under
/// `kubepods.slice`, the others under their class's slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    #[default]
    BestEffort,
}

/// A pod's cgroup values as the agent computed them (the kubelet's `ResourceConfigForPod`): the
/// runtime writes them, it does not derive them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResources {
    pub qos: QosClass,
    /// The pod's CPU request in millicores: the pod slice's `cpu.weight`, and this pod's share
    /// of the Burstable slice's weight when it is Burstable.
    #[serde(default)]
    pub cpu_request_milli: u64,
    /// The pod slice's `cpu.max` quota from this limit (millicores); None writes `max`.
    #[serde(default)]
    pub cpu_limit_milli: Option<u64>,
    /// The pod slice's `memory.max` (bytes); None writes `max`.
    #[serde(default)]
    pub memory_limit: Option<u64>,
}

/// Which of the node's namespaces a pod shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostNamespaces {
    #[serde(default)]
    pub network: bool,
    #[serde(default)]
    pub pid: bool,
    #[serde(default)]
    pub ipc: bool,
}

/// A pod sandbox to create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxConfig {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    #[serde(default)]
    pub attempt: u32,
    /// The pod's (short) hostname; defaults to the pod name.
    #[serde(default)]
    pub hostname: Option<String>,
    /// The pod's domain (`<subdomain>.<namespace>.svc.<cluster domain>`): its `/etc/hosts` line
    /// names `<hostname>.<domain>` too.
    #[serde(default)]
    pub host_domain: Option<String>,
    /// `setHostnameAsFQDN`: the kernel hostname is `<hostname>.<domain>` (at most 64 bytes).
    #[serde(default)]
    pub hostname_as_fqdn: bool,
    #[serde(default)]
    pub dns: Dns,
    /// Extra `/etc/hosts` lines (`<ip>\t<name>`, from hostAliases), written after the kubelet's
    /// `# Entries added by HostAliases.` header.
    #[serde(default)]
    pub host_entries: Vec<String>,
    /// The pod slice's parent and values.
    #[serde(default)]
    pub resources: PodResources,
    #[serde(default)]
    pub share_process_namespace: bool,
    /// The node's namespaces the pod shares instead of having its own (`hostNetwork`, which
    /// brings the node's UTS namespace too, `hostPID`, `hostIPC`).
    #[serde(default)]
    pub host: HostNamespaces,
    /// The directory for the pod's container logs (`/var/log/pods/<ns>_<name>_<uid>`).
    #[serde(default)]
    pub log_directory: Option<PathBuf>,
    /// The containers' ports with a `hostPort` (CRI's `port_mappings`): the node forwards
    /// connections to its own addresses (or to `host_ip`) on `host_port` to the pod's address on
    /// `container_port`. Ignored on the node's network.
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
}

/// Transport protocol of a port mapping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

/// One `hostPort` of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    #[serde(default)]
    pub protocol: Protocol,
    pub container_port: u16,
    pub host_port: u16,
    /// Only connections to this node address are forwarded (None: any of the node's addresses).
    #[serde(default)]
    pub host_ip: Option<std::net::Ipv4Addr>,
}

/// A sandbox as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub ready: bool,
    pub pause_pid: Option<i32>,
    pub ip: Option<String>,
    pub cgroup: String,
    pub qos: QosClass,
    pub created_at: String,
}
