//! What the runtime is asked for one container or sandbox: the configs built from the typed pod,
//! the image made present per `imagePullPolicy` (docs/SEEDS-SPEC.md §4.14), and the texts of the
//! kubelet's image events.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use runtime_api::{
    Client, ClientError, ContainerConfig, Dns, ErrorKind, HostNamespaces, PodResources, PortMapping,
    Protocol, PullPolicy, QosClass, Resources, SandboxConfig, SeccompProfile,
};

use super::env::EnvError;
use super::events::Event;
use super::volumes::VolumeError;

/// Why a start failed: the waiting reason the container shows and its message.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    InvalidImageName(ClientError),
    #[error("Container image \"{image}\" is not present with pull policy of Never")]
    NeverPull { image: String },
    #[error(transparent)]
    ImagePull(ClientError),
    #[error(transparent)]
    RuntimeUnavailable(ClientError),
    #[error(transparent)]
    CreateContainer(ClientError),
    #[error(transparent)]
    StartContainer(ClientError),
    /// A missing ConfigMap/Secret (key) or an unusable field reference.
    #[error(transparent)]
    Config(#[from] EnvError),
    /// A volume mount the container asks for cannot be made.
    #[error(transparent)]
    Mount(#[from] VolumeError),
    /// An ephemeral container's `targetContainerName` does not run (its process namespace
    /// cannot be joined).
    #[error("target container \"{name}\" is not running")]
    TargetNotRunning { name: String },
}

impl StartError {
    /// The kubelet's waiting reason for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::InvalidImageName(_) => "InvalidImageName",
            StartError::NeverPull { .. } => "ErrImageNeverPull",
            StartError::ImagePull(_) => "ErrImagePull",
            StartError::RuntimeUnavailable(_) => "RuntimeUnavailable",
            StartError::CreateContainer(_) => "CreateContainerError",
            StartError::StartContainer(_) => "RunContainerError",
            StartError::Config(_) | StartError::Mount(_) | StartError::TargetNotRunning { .. } => {
                "CreateContainerConfigError"
            }
        }
    }
}

/// What a pod start needs to know about the node.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub node: String,
    pub node_ip: Option<String>,
    /// Registries reached over plain HTTP, for the runtime's pulls.
    pub insecure_registries: Vec<String>,
    /// The machine's memory (bytes), for Burstable `oom_score_adj`.
    pub memory: u64,
    /// What pods may use of it (`status.allocatable.memory`).
    pub allocatable_memory: u64,
    /// The machine's CPUs (all allocatable).
    pub cpus: u64,
}

impl NodeFacts {
    /// What the node offers pods of `resource` (`cpu` in millicores, `memory` in bytes); None
    /// where it reports nothing (ephemeral-storage).
    pub fn allocatable(&self, resource: &str) -> Option<u64> {
        match resource {
            "cpu" => Some(self.cpus * 1000),
            "memory" => Some(self.allocatable_memory),
            _ => None,
        }
    }
}

fn milli(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<u64> {
    q.and_then(|q| kcore::quantity::cpu_milli(&q.0))
}

fn bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<u64> {
    q.and_then(|q| kcore::quantity::bytes(&q.0))
}

fn resources(c: &Container) -> Resources {
    let r = c.resources.as_ref();
    let req = r.and_then(|r| r.requests.as_ref());
    let lim = r.and_then(|r| r.limits.as_ref());
    Resources {
        cpu_request: milli(req.and_then(|m| m.get("cpu"))),
        cpu_limit: milli(lim.and_then(|m| m.get("cpu"))),
        memory_request: bytes(req.and_then(|m| m.get("memory"))),
        memory_limit: bytes(lim.and_then(|m| m.get("memory"))),
    }
}

/// The pod slice's parent and values, as kcore decides them for every node of the cluster.
pub fn pod_resources(pod: &Pod) -> PodResources {
    let cg = kcore::qos::pod_cgroup(pod);
    PodResources {
        qos: match cg.qos {
            kcore::qos::QosClass::Guaranteed => QosClass::Guaranteed,
            kcore::qos::QosClass::Burstable => QosClass::Burstable,
            kcore::qos::QosClass::BestEffort => QosClass::BestEffort,
        },
        cpu_request_milli: cg.cpu_request_milli,
        cpu_limit_milli: cg.cpu_limit_milli,
        memory_limit: cg.memory_limit,
    }
}

/// The cluster's DNS domain, as kubeadm sets the kubelet's `clusterDomain`.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Longest pod hostname (the kernel's 64 bytes less the terminating NUL, as the kubelet).
const HOSTNAME_MAX: usize = 63;

/// Longest kernel hostname of a pod with `setHostnameAsFQDN`.
const FQDN_MAX: usize = 64;

/// A pod's hostname and domain as the kubelet forms them (`GeneratePodHostNameAndDomain`):
/// `spec.hostname`, else the pod's name, cut to 63 characters and then of trailing `-` and `.`;
/// the domain `<subdomain>.<namespace>.svc.<cluster domain>` when `spec.subdomain` is set. (The
/// API server validated both fields as DNS labels.)
pub fn host_names(pod: &Pod) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let mut hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .unwrap_or(name)
        .to_string();
    if hostname.len() > HOSTNAME_MAX {
        hostname.truncate(HOSTNAME_MAX);
        let kept = hostname.trim_end_matches(['-', '.']).len();
        hostname.truncate(kept);
    }
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|d| !d.is_empty())
        .map(|sub| {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            format!("{sub}.{ns}.svc.{CLUSTER_DOMAIN}")
        });
    (hostname, domain)
}

/// The kernel hostname of a pod with `setHostnameAsFQDN` and a domain (`GetNodenameForKernel`),
/// refused with the kubelet's words when longer than 64 characters.
pub fn fqdn_hostname(hostname: &str, domain: &str) -> Result<String, String> {
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > FQDN_MAX {
        return Err(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({FQDN_MAX} characters is the max, {} characters requested)",
            fqdn.len()
        ));
    }
    Ok(fqdn)
}

/// `/etc/hosts` lines of the pod's `hostAliases`: one per hostname, as the kubelet writes them.
fn host_alias_lines(pod: &Pod) -> Vec<String> {
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_ref());
    aliases
        .into_iter()
        .flatten()
        .flat_map(|a| {
            let ip = a.ip.clone();
            a.hostnames.iter().flatten().map(move |h| format!("{ip}\t{h}"))
        })
        .collect()
}

/// The sandbox of `pod`, attempt `attempt`, with its DNS settings (`dns.rs`); an error is what
/// the kubelet reports as `FailedCreatePodSandBox` (an FQDN too long for a hostname).
pub fn sandbox_config(pod: &Pod, attempt: u32, dns: Dns) -> Result<SandboxConfig, String> {
    let m = &pod.metadata;
    let (ns, name, uid) = (
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone().unwrap_or_default(),
        m.uid.clone().unwrap_or_default(),
    );
    let spec = pod.spec.as_ref();
    let (hostname, host_domain) = host_names(pod);
    let hostname_as_fqdn = spec.and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false);
    if hostname_as_fqdn && let Some(domain) = &host_domain {
        fqdn_hostname(&hostname, domain)?;
    }
    Ok(SandboxConfig {
        log_directory: Some(PathBuf::from(format!(
            "{}/{ns}_{name}_{uid}",
            crate::logs::PODS_LOG_ROOT
        ))),
        hostname: Some(hostname),
        host_domain,
        hostname_as_fqdn,
        host_entries: host_alias_lines(pod),
        share_process_namespace: spec.and_then(|s| s.share_process_namespace).unwrap_or(false),
        host: HostNamespaces {
            network: spec.and_then(|s| s.host_network).unwrap_or(false),
            pid: spec.and_then(|s| s.host_pid).unwrap_or(false),
            ipc: spec.and_then(|s| s.host_ipc).unwrap_or(false),
        },
        name,
        namespace: ns,
        uid,
        attempt,
        dns,
        resources: pod_resources(pod),
        port_mappings: port_mappings(pod),
    })
}

/// The ports with a `hostPort` of the pod's containers and native sidecars, once per protocol,
/// host IP and host port (CRI's port mappings, as the kubelet makes them; an IPv6 host IP has
/// nothing to bind on this IPv4 pod network and is left out).
fn port_mappings(pod: &Pod) -> Vec<PortMapping> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let mut out: Vec<PortMapping> = Vec::new();
    for p in spec
        .containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
    {
        let (Some(host_port), Ok(container_port)) = (p.host_port, u16::try_from(p.container_port)) else {
            continue;
        };
        let Ok(host_port) = u16::try_from(host_port) else {
            continue;
        };
        let host_ip = match p.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
            None => None,
            Some(ip) => match ip.parse::<std::net::Ipv4Addr>() {
                Ok(ip) if ip.is_unspecified() => None,
                Ok(ip) => Some(ip),
                Err(_) => continue,
            },
        };
        let protocol = match p.protocol.as_deref() {
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            _ => Protocol::Tcp,
        };
        let m = PortMapping {
            protocol,
            container_port,
            host_port,
            host_ip,
        };
        let same =
            |o: &PortMapping| (o.protocol, o.host_ip, o.host_port) == (m.protocol, m.host_ip, m.host_port);
        if host_port > 0 && container_port > 0 && !out.iter().any(same) {
            out.push(m);
        }
    }
    out
}

/// The runtime's config for container `c` of `pod`, its `restarts`-th start, with its resolved
/// environment (`env.rs`; `$(VAR)` in command and args expanded from it).
pub fn container_config(
    pod: &Pod,
    c: &Container,
    restarts: u32,
    node: &NodeFacts,
    env: &[(String, String)],
) -> ContainerConfig {
    let vars: BTreeMap<String, String> = env.iter().cloned().collect();
    let expand = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter()
            .flatten()
            .map(|s| super::env::expand(s, &vars))
            .collect()
    };
    let sc = c.security_context.as_ref();
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let id = |own: Option<i64>, pod: Option<i64>| own.or(pod).and_then(|u| u32::try_from(u).ok());
    ContainerConfig {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        command: expand(&c.command),
        args: expand(&c.args),
        env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        working_dir: c.working_dir.clone(),
        run_as_user: id(sc.and_then(|s| s.run_as_user), psc.and_then(|s| s.run_as_user)),
        run_as_group: id(sc.and_then(|s| s.run_as_group), psc.and_then(|s| s.run_as_group)),
        resources: resources(c),
        oom_score_adj: kcore::qos::container_oom_score_adj(pod, c, node.memory),
        read_only_root_filesystem: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
        no_new_privileges: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        capabilities_add: sc
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.clone())
            .unwrap_or_default(),
        capabilities_drop: sc
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.drop.clone())
            .unwrap_or_default(),
        seccomp: seccomp_profile(sc, psc),
        privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
        log_path: Some(format!("{}/{restarts}.log", c.name)),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        ..ContainerConfig::default()
    }
}

/// The container's seccomp profile: its own `securityContext.seccompProfile`, else the pod's.
/// Neither means RuntimeDefault: this node runs as the kubelet does with `seccompDefault: true`.
fn seccomp_profile(sc: Option<&SecurityContext>, psc: Option<&PodSecurityContext>) -> SeccompProfile {
    let own = sc.and_then(|s| s.seccomp_profile.as_ref());
    let pod = psc.and_then(|s| s.seccomp_profile.as_ref());
    match own.or(pod).map(|p| p.type_.as_str()) {
        Some("Unconfined") => SeccompProfile::Unconfined,
        Some("Localhost") => SeccompProfile::Localhost,
        _ => SeccompProfile::RuntimeDefault,
    }
}

/// Makes sure the container's image is on the node per its pull policy, through the runtime.
pub fn ensure_image(
    rt: &mut Client,
    c: &Container,
    insecure_registries: &[String],
    events: &mut Vec<Event>,
) -> Result<(), StartError> {
    let image = c.image.as_deref().unwrap_or_default();
    let tagged = image
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':') || last.contains('@'));
    let latest = !tagged || image.ends_with(":latest");
    let policy = c
        .image_pull_policy
        .as_deref()
        .unwrap_or(if latest { "Always" } else { "IfNotPresent" });
    let present = rt
        .image_status(image)
        .map_err(|e| match e.kind() {
            ErrorKind::Invalid => StartError::InvalidImageName(e),
            _ => StartError::RuntimeUnavailable(e),
        })?
        .is_some();
    let name = c.name.as_str();
    match policy {
        "Never" if !present => Err(StartError::NeverPull { image: image.into() }),
        "IfNotPresent" | "Never" if present => {
            events.push(Event::normal(
                "Pulled",
                name,
                format!(
                    "Container image \"{image}\" already present on machine and can be accessed by the pod"
                ),
            ));
            Ok(())
        }
        _ => {
            events.push(Event::normal(
                "Pulling",
                name,
                format!("Pulling image \"{image}\""),
            ));
            let pull = if policy == "Always" {
                PullPolicy::Always
            } else {
                PullPolicy::IfNotPresent
            };
            match rt.pull_image(image, pull, None, insecure_registries.to_vec()) {
                Ok(_) => {
                    events.push(Event::normal(
                        "Pulled",
                        name,
                        format!("Successfully pulled image \"{image}\""),
                    ));
                    Ok(())
                }
                Err(e) => {
                    events.push(Event::warning(
                        "Failed",
                        name,
                        format!("Failed to pull image \"{image}\": {e}"),
                    ));
                    Err(StartError::ImagePull(e))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::Value;

    #[test]
    fn port_mappings_as_the_kubelet_makes_them() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "sidecar", "restartPolicy": "Always",
                     "ports": [{"containerPort": 9090, "hostPort": 9090}]},
                    {"name": "init", "ports": [{"containerPort": 7, "hostPort": 7}]}
                ],
                "containers": [
                    {"name": "web", "ports": [
                        {"containerPort": 80, "hostPort": 30080},
                        {"containerPort": 8080},
                        {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "10.0.2.15"},
                        {"containerPort": 81, "hostPort": 30081, "hostIP": "0.0.0.0", "protocol": "SCTP"},
                        {"containerPort": 82, "hostPort": 30082, "hostIP": "fd00::1"}
                    ]},
                    {"name": "dup", "ports": [
                        {"containerPort": 90, "hostPort": 30080},
                        {"containerPort": 90, "hostPort": 30080, "protocol": "UDP"}
                    ]}
                ]
            }
        }))
        .expect("pod");
        let got: Vec<(Protocol, u16, u16, Option<std::net::Ipv4Addr>)> = port_mappings(&pod)
            .into_iter()
            .map(|m| (m.protocol, m.host_port, m.container_port, m.host_ip))
            .collect();
        assert_eq!(
            got,
            [
                (Protocol::Tcp, 30080, 80, None),
                (
                    Protocol::Udp,
                    5353,
                    53,
                    Some(std::net::Ipv4Addr::new(10, 0, 2, 15))
                ),
                (Protocol::Sctp, 30081, 81, None),
                (Protocol::Udp, 30080, 90, None),
                (Protocol::Tcp, 9090, 9090, None),
            ],
            "no hostPort, IPv6 host IPs, repeats and plain init containers left out"
        );
        let plain: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": [{"name": "c"}]}}))
            .expect("pod");
        assert!(port_mappings(&plain).is_empty());
    }

    /// A runtime that answers each request line with the next canned reply.
    fn fake_runtime(replies: Vec<&'static str>) -> Client {
        use std::io::{BufRead, BufReader, Write};
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        std::thread::spawn(move || {
            let mut w = theirs.try_clone().expect("clone");
            let mut lines = BufReader::new(theirs).lines();
            for reply in replies {
                if lines.next().is_none() {
                    break;
                }
                // One reply a line: the canned texts may be written over several lines.
                let line = serde_json::from_str::<Value>(reply)
                    .expect("canned reply")
                    .to_string();
                let _ = w.write_all(line.as_bytes()).and_then(|()| w.write_all(b"\n"));
            }
        });
        Client::from_stream(ours)
    }

    fn named_pod(name: &str, spec: Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "uid": "u-1"},
            "spec": spec,
        }))
        .expect("a pod")
    }

    #[test]
    fn hostnames_and_domains_as_the_kubelet_forms_them() {
        let cases = [
            ("web", serde_json::json!({"containers": []}), "web", None),
            (
                "web",
                serde_json::json!({"containers": [], "hostname": "front"}),
                "front",
                None,
            ),
            (
                "web-0",
                serde_json::json!({"containers": [], "hostname": "web-0", "subdomain": "web"}),
                "web-0",
                Some("web.shop.svc.cluster.local"),
            ),
            (
                // 63 characters end in "-." after the cut: both go.
                &format!("{}-.x", "a".repeat(61)),
                serde_json::json!({"containers": []}),
                &"a".repeat(61)[..],
                None,
            ),
        ];
        for (name, spec, hostname, domain) in cases {
            let pod = named_pod(name, spec);
            assert_eq!(
                host_names(&pod),
                (hostname.to_string(), domain.map(String::from)),
                "{name}"
            );
        }
    }

    #[test]
    fn an_fqdn_hostname_longer_than_64_characters_is_refused_with_the_kubelets_words() {
        assert_eq!(
            fqdn_hostname("web-0", "web.shop.svc.cluster.local").as_deref(),
            Ok("web-0.web.shop.svc.cluster.local")
        );
        let pod = named_pod(
            "a-rather-long-pod-name-0",
            serde_json::json!({"containers": [], "subdomain": "an-even-longer-subdomain", "setHostnameAsFQDN": true}),
        );
        let e = sandbox_config(&pod, 0, Dns::default()).expect_err("72 characters");
        assert_eq!(
            e,
            "failed to construct FQDN from pod hostname and cluster domain, FQDN \
             a-rather-long-pod-name-0.an-even-longer-subdomain.shop.svc.cluster.local is too long \
             (64 characters is the max, 72 characters requested)"
        );
        // Without a subdomain there is no FQDN to set, and nothing to refuse.
        let plain = named_pod(
            "a-rather-long-pod-name-0",
            serde_json::json!({"containers": [], "setHostnameAsFQDN": true}),
        );
        let c = sandbox_config(&plain, 0, Dns::default()).expect("no domain");
        assert!(c.hostname_as_fqdn && c.host_domain.is_none());
    }

    #[test]
    fn the_sandbox_carries_names_and_host_aliases() {
        let pod = named_pod(
            "web-0",
            serde_json::json!({"containers": [], "hostname": "web-0", "subdomain": "web",
                "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}, {"ip": "10.1.2.4", "hostnames": ["baz"]}]}),
        );
        let c = sandbox_config(&pod, 2, Dns::default()).expect("config");
        assert_eq!(c.hostname.as_deref(), Some("web-0"));
        assert_eq!(c.host_domain.as_deref(), Some("web.shop.svc.cluster.local"));
        assert!(!c.hostname_as_fqdn);
        assert_eq!(
            c.host_entries,
            ["10.1.2.3\tfoo.local", "10.1.2.3\tbar.local", "10.1.2.4\tbaz"]
        );
        assert_eq!(c.attempt, 2);
    }

    const PRESENT: &str = r#"{"result":"imageStatus","image":{"reference":"docker.io/library/busybox:1",
        "id":"sha256:c","digest":"sha256:m","size":1}}"#;
    const ABSENT: &str = r#"{"result":"imageStatus","image":null}"#;

    fn with_policy(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "main".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(str::to_string),
            ..Container::default()
        }
    }

    #[test]
    fn image_failures_keep_the_kubelet_reasons_and_texts() {
        let mut events = Vec::new();
        let never = with_policy("busybox:1", Some("Never"));
        let e = ensure_image(&mut fake_runtime(vec![ABSENT]), &never, &[], &mut events).expect_err("absent");
        assert_eq!(e.reason(), "ErrImageNeverPull");
        assert_eq!(
            e.to_string(),
            r#"Container image "busybox:1" is not present with pull policy of Never"#
        );
        let bad = with_policy("not a reference", None);
        let invalid =
            r#"{"result":"error","kind":"Invalid","message":"invalid image reference \"not a reference\""}"#;
        let e = ensure_image(&mut fake_runtime(vec![invalid]), &bad, &[], &mut events).expect_err("invalid");
        assert_eq!(e.reason(), "InvalidImageName");
        assert_eq!(e.to_string(), r#"invalid image reference "not a reference""#);
        assert!(events.is_empty(), "{events:?}");
        let down =
            r#"{"result":"error","kind":"Unavailable","message":"connecting to 10.0.2.100:5000: refused"}"#;
        let e = ensure_image(
            &mut fake_runtime(vec![ABSENT, down]),
            &with_policy("busybox:1", Some("IfNotPresent")),
            &[],
            &mut events,
        )
        .expect_err("registry down");
        assert_eq!(e.reason(), "ErrImagePull");
        let texts: Vec<(&str, &str)> = events.iter().map(|e| (e.reason, e.message.as_str())).collect();
        assert_eq!(
            texts,
            [
                ("Pulling", r#"Pulling image "busybox:1""#),
                (
                    "Failed",
                    r#"Failed to pull image "busybox:1": connecting to 10.0.2.100:5000: refused"#
                )
            ]
        );
    }

    #[test]
    fn images_present_or_pulled_through_the_runtime() {
        let mut events = Vec::new();
        ensure_image(
            &mut fake_runtime(vec![PRESENT]),
            &with_policy("busybox:1", Some("IfNotPresent")),
            &[],
            &mut events,
        )
        .expect("present");
        let pulled = r#"{"result":"image","image":{"reference":"docker.io/library/busybox:1",
            "id":"sha256:c","digest":"sha256:m","size":1}}"#;
        // Without a policy, an untagged image is pulled every time (the API's default: Always).
        ensure_image(
            &mut fake_runtime(vec![PRESENT, pulled]),
            &with_policy("busybox", None),
            &["10.0.2.100:5000".into()],
            &mut events,
        )
        .expect("pulled");
        let texts: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            texts,
            [
                r#"Container image "busybox:1" already present on machine and can be accessed by the pod"#,
                r#"Pulling image "busybox""#,
                r#"Successfully pulled image "busybox""#,
            ]
        );
    }

    use crate::pods::env::tests::node;

    #[test]
    fn qos_and_oom_scores_go_to_the_runtime_as_numbers() {
        let q = |s: &str| Quantity(s.into());
        let main = Container {
            name: "main".into(),
            image: Some("busybox".into()),
            resources: Some(ResourceRequirements {
                requests: Some([("cpu".into(), q("1")), ("memory".into(), q("1Gi"))].into()),
                limits: Some([("cpu".into(), q("1000m")), ("memory".into(), q("1Gi"))].into()),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        };
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![main.clone()],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        assert_eq!(
            pod_resources(&pod),
            PodResources {
                qos: QosClass::Guaranteed,
                cpu_request_milli: 1000,
                cpu_limit_milli: Some(1000),
                memory_limit: Some(1 << 30),
            },
            "1 and 1000m are equal: Guaranteed, as the API server says"
        );
        let cfg = container_config(&pod, &main, 0, &node(), &[("A".into(), "1".into())]);
        assert_eq!(cfg.oom_score_adj, -997);
        assert_eq!(cfg.resources.cpu_limit, Some(1000));
        assert_eq!(cfg.log_path.as_deref(), Some("main/0.log"));
        assert_eq!(cfg.env, ["A=1"]);
        let echo = Container {
            command: Some(vec!["echo".into(), "$(A)".into()]),
            args: Some(vec!["$$(A)".into()]),
            ..main
        };
        let cfg = container_config(&pod, &echo, 2, &node(), &[("A".into(), "1".into())]);
        assert_eq!(
            (cfg.command, cfg.args),
            (vec!["echo".to_string(), "1".into()], vec!["$(A)".to_string()])
        );
        assert_eq!(cfg.log_path.as_deref(), Some("main/2.log"));
    }

    /// seccompProfile: the container's wins over the pod's; none is RuntimeDefault.
    #[test]
    fn seccomp_profile_and_privileged_reach_the_runtime() {
        use k8s_openapi::api::core::v1::SeccompProfile as Sp;
        let sp = |t: &str| {
            Some(Sp {
                type_: t.into(),
                ..Default::default()
            })
        };
        let sc = |t: Option<&str>, privileged: Option<bool>| SecurityContext {
            seccomp_profile: t.and_then(sp),
            privileged,
            ..Default::default()
        };
        let psc = |t: Option<&str>| PodSecurityContext {
            seccomp_profile: t.and_then(sp),
            ..Default::default()
        };
        let cases = [
            (None, None, SeccompProfile::RuntimeDefault),
            (None, Some("Unconfined"), SeccompProfile::Unconfined),
            (
                Some("RuntimeDefault"),
                Some("Unconfined"),
                SeccompProfile::RuntimeDefault,
            ),
            (
                Some("Unconfined"),
                Some("RuntimeDefault"),
                SeccompProfile::Unconfined,
            ),
            (Some("Localhost"), None, SeccompProfile::Localhost),
        ];
        for (own, pod, want) in cases {
            assert_eq!(
                seccomp_profile(Some(&sc(own, None)), Some(&psc(pod))),
                want,
                "{own:?} {pod:?}"
            );
        }
        let pod = Pod {
            spec: Some(PodSpec {
                security_context: Some(psc(Some("Unconfined"))),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = Container {
            name: "c".into(),
            security_context: Some(sc(None, Some(true))),
            ..Default::default()
        };
        let cfg = container_config(&pod, &c, 0, &node(), &[]);
        assert!(cfg.privileged);
        assert_eq!(cfg.seccomp, SeccompProfile::Unconfined);
        let cfg = container_config(&Pod::default(), &Container::default(), 0, &node(), &[]);
        assert!(!cfg.privileged);
        assert_eq!(cfg.seccomp, SeccompProfile::RuntimeDefault);
    }
}
