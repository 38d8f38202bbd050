//! Joining the cluster: TLS bootstrap (a CSR sent with the bootstrap token, signed by the control
//! plane as `system:node:<name>` in `system:nodes`; [`submit_csr`] and [`issued_certificate`]
//! serve the serving certificate too), Node registration with capacity, addresses,
//! nodeInfo, labels and the Ready condition, and the Lease in `kube-node-lease` renewed every 10 s.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine;
use serde_json::{Value, json};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use transport::kubeapi::{Credentials, KubeClientError};

use crate::pods::pressure::{Pressure, Signal, Thresholds};
use crate::pods::shutdown::NodeState;
use crate::settings::{AgentSettings, ControlPlane};
use crate::state::StateStore;

/// The agent's User-Agent: the API server names the agent's field manager after its product
/// token, `kubelet`, as for upstream's kubelet.
pub const USER_AGENT: &str = concat!(
    "kubelet/v1.32.0-nodeos.",
    env!("CARGO_PKG_VERSION"),
    " nodeos-agent"
);

/// Lease renewal period (the kubelet's default).
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
/// The Lease duration the node announces.
pub const LEASE_DURATION_SECONDS: u32 = 40;
/// Node status (Ready heartbeat) update period.
pub const STATUS_UPDATE: Duration = Duration::from_secs(60);

/// Errors joining the cluster.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("API client: {0}")]
    Client(#[from] KubeClientError),
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("building the {kind} object: {source}")]
    Object {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("creating the node key or CSR: {0}")]
    Csr(#[source] rcgen::Error),
    #[error("the control plane did not issue a certificate: {0}")]
    NotIssued(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The node's client identity (PEM).
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JoinError + '_ {
    move |source| JoinError::Io {
        path: path.into(),
        source,
    }
}

/// The signer and usages of the node's client certificate.
const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];

/// Gets the node's client certificate: reuses the one in `dir` when it is usable
/// ([`stored_identity`]), otherwise sends a CSR with the bootstrap token and waits for the signed
/// certificate. A new identity is recorded on the state partition when the node has one.
pub async fn bootstrap(
    cp: &ControlPlane,
    node: &str,
    dir: &Path,
    state: Option<&StateStore>,
) -> Result<Identity, JoinError> {
    if let Some(id) = stored_identity(dir, &cp.ca_pem, SystemTime::now()) {
        return Ok(id);
    }
    let client = transport::kubeapi::client(
        &cp.server,
        &cp.ca_pem,
        Credentials::Bearer(cp.bootstrap_token.clone()),
        USER_AGENT,
    )?;
    request_client_certificate(&client, node, dir, &cp.ca_pem, state).await
}

/// Asks (through `client`: the bootstrap token, or the node's current certificate when it
/// renews) for a client certificate with a new key, and stores both with the CA they are for.
async fn request_client_certificate(
    client: &kube::Client,
    node: &str,
    dir: &Path,
    ca_pem: &str,
    state: Option<&StateStore>,
) -> Result<Identity, JoinError> {
    let (key, csr_pem) = node_csr(node, &[]).map_err(JoinError::Csr)?;
    let name = submit_csr(
        client,
        &format!("node-csr-{node}-"),
        &csr_pem,
        CLIENT_SIGNER,
        CLIENT_USAGES,
    )
    .await?;
    let cert_pem = issued_certificate(client, &name, Some(CSR_WAIT)).await?;
    let key_pem = key.serialize_pem();
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (file, data) in [
        ("node.key", &key_pem),
        ("node.crt", &cert_pem),
        ("ca.crt", &ca_pem.to_string()),
    ] {
        let path = dir.join(file);
        crate::state::write_private(&path, data.as_bytes()).map_err(io(&path))?;
    }
    keep_identity(state, dir);
    Ok(Identity { cert_pem, key_pem })
}

/// Records the identity files of `dir` on the state partition, when there is one (a failure is
/// logged: the node keeps working and bootstraps again after its next reboot).
pub fn keep_identity(state: Option<&StateStore>, dir: &Path) {
    let Some(store) = state else {
        return;
    };
    match crate::state::persist(store, dir) {
        Ok(()) => {
            tracing::info!(partition = %store.path().display(), "identity recorded on the state partition")
        }
        Err(e) => tracing::warn!(error = %e, "identity not recorded on the state partition"),
    }
}

/// The client identity stored in `dir`, when it can be used at `now`: the certificate parses,
/// has not expired, and was issued under the CA the node trusts now (a node pointed at a
/// re-created cluster bootstraps again instead of presenting a stranger's certificate).
fn stored_identity(dir: &Path, ca_pem: &str, now: SystemTime) -> Option<Identity> {
    let cert_pem = std::fs::read_to_string(dir.join("node.crt")).ok()?;
    let key_pem = std::fs::read_to_string(dir.join("node.key")).ok()?;
    let Some((_, not_after)) = transport::tls::certificate_names(&cert_pem) else {
        tracing::warn!("the stored client certificate does not parse; bootstrapping again");
        return None;
    };
    if not_after <= now {
        tracing::warn!("the stored client certificate has expired; bootstrapping again");
        return None;
    }
    if let Ok(stored_ca) = std::fs::read_to_string(dir.join("ca.crt"))
        && stored_ca.trim() != ca_pem.trim()
    {
        tracing::warn!("the stored client certificate is for another cluster CA; bootstrapping again");
        return None;
    }
    Some(Identity { cert_pem, key_pem })
}

/// Renews the node's client certificate (`cert_pem`) in the last fifth of its life, through the
/// node's own identity (the control plane approves a node's renewal of its own name), records
/// it, and then asks the agent to restart (`restart`) so every client uses the new certificate
/// (pods keep running across an agent restart). Failures are retried every 5 minutes.
pub async fn keep_client_certificate(
    client: kube::Client,
    node: String,
    cert_pem: String,
    ca_pem: String,
    dir: PathBuf,
    state: Option<StateStore>,
    restart: std::sync::Arc<tokio::sync::Notify>,
) {
    let Some((_, not_after)) = transport::tls::certificate_names(&cert_pem) else {
        return;
    };
    let due = crate::serving::renew_at(&[], not_after, &[], SystemTime::now());
    let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
    tracing::info!(
        renew_in_s = wait.as_secs(),
        "client certificate renewal scheduled"
    );
    // Long sleeps in steps, so a clock that jumps is noticed within a day.
    while SystemTime::now() < due {
        let left = due.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::time::sleep(left.min(Duration::from_secs(86_400))).await;
    }
    loop {
        match request_client_certificate(&client, &node, &dir, &ca_pem, state.as_ref()).await {
            Ok(_) => {
                tracing::info!(node = %node, "client certificate renewed; restarting the agent to use it");
                restart.notify_one();
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "client certificate renewal failed; retrying in 5 min");
                tokio::time::sleep(Duration::from_secs(300)).await;
            }
        }
    }
}

/// A new key and a CSR (PEM) for `CN=system:node:<node>, O=system:nodes` with `names` (DNS
/// names and IP addresses) as SANs: what a node sends for its client and serving certificates.
pub fn node_csr(node: &str, names: &[String]) -> Result<(rcgen::KeyPair, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let pem = params.serialize_request(&key)?.pem()?;
    Ok((key, pem))
}

/// How long joining waits for its client certificate.
const CSR_WAIT: Duration = Duration::from_secs(120);

/// Creates a CSR for `csr_pem` with `signer` and `usages`; returns its name.
pub(crate) async fn submit_csr(
    client: &kube::Client,
    generate_name: &str,
    csr_pem: &str,
    signer: &str,
    usages: &[&str],
) -> Result<String, JoinError> {
    let csr = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": { "generateName": generate_name },
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr_pem.as_bytes()),
            "signerName": signer,
            "usages": usages,
        },
    });
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    let csr = serde_json::from_value(csr).map_err(|source| JoinError::Object {
        kind: "CertificateSigningRequest",
        source,
    })?;
    let created = csrs.create(&PostParams::default(), &csr).await?;
    Ok(created.metadata.name.unwrap_or_default())
}

/// Waits for CSR `name` to carry a certificate (PEM): at most `wait`, or for as long as it
/// stays pending without one; a Denied or Failed CSR is an error with its message.
pub(crate) async fn issued_certificate(
    client: &kube::Client,
    name: &str,
    wait: Option<Duration>,
) -> Result<String, JoinError> {
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(200);
    loop {
        let obj = serde_json::to_value(csrs.get(name).await?).unwrap_or_default();
        if let Some(cert) = obj["status"]["certificate"].as_str().filter(|c| !c.is_empty()) {
            return base64::engine::general_purpose::STANDARD
                .decode(cert)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| JoinError::NotIssued("status.certificate is not base64 PEM".into()));
        }
        let failed = obj["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Denied" || c["type"] == "Failed"))
            .map(|c| c["message"].as_str().unwrap_or_default().to_string());
        if let Some(reason) = failed {
            return Err(JoinError::NotIssued(reason));
        }
        if wait.is_some_and(|w| started.elapsed() >= w) {
            return Err(JoinError::NotIssued(format!(
                "CSR {name} still pending after {} s",
                started.elapsed().as_secs()
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The machine's CPUs (the Node's cpu capacity, all of it allocatable).
pub fn cpu_capacity() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// The machine's memory (bytes): what Burstable containers' `oom_score_adj` is relative to.
pub fn memory_capacity() -> u64 {
    memory_kib() * 1024
}

fn memory_kib() -> u64 {
    read_trim("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// What the node's conditions say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    pub pressure: Pressure,
    pub shutting_down: bool,
}

/// When each condition last changed status (type → (status, RFC 3339 time)).
pub type Transitions = std::collections::BTreeMap<&'static str, (&'static str, String)>;

/// The node's conditions at `now` (the kubelet's setters): the pressure conditions from the
/// eviction manager; Ready is False while the node shuts down ("node is shutting down").
/// `since` keeps each condition's last transition time across calls.
fn conditions(now: &str, health: Health, since: &mut Transitions) -> Value {
    let mut c = |t: &'static str, ok: bool, good: [&str; 3], bad: [&str; 3]| {
        let [status, reason, message] = if ok { good } else { bad };
        let status: &'static str = if status == "True" { "True" } else { "False" };
        let changed = match since.get(t) {
            Some((s, at)) if *s == status => at.clone(),
            _ => now.to_string(),
        };
        since.insert(t, (status, changed.clone()));
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": changed})
    };
    let p = health.pressure;
    json!([
        c(
            "MemoryPressure",
            !p.memory,
            [
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available"
            ],
            [
                "True",
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available"
            ],
        ),
        c(
            "DiskPressure",
            !p.disk,
            [
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure"
            ],
            ["True", "KubeletHasDiskPressure", "kubelet has disk pressure"],
        ),
        c(
            "PIDPressure",
            !p.pid,
            [
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available"
            ],
            [
                "True",
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available"
            ],
        ),
        c(
            "Ready",
            !health.shutting_down,
            ["True", "KubeletReady", "kubelet is posting ready status"],
            [
                "False",
                "KubeletNotReady",
                crate::pods::shutdown::NODE_NOT_READY_MESSAGE
            ],
        ),
    ])
}

/// Node annotation naming where the control plane reaches the agent (`IP:PORT`), for nodes
/// behind NAT; without it the API server uses the node's InternalIP and kubelet port.
pub const KUBELET_ENDPOINT_ANNOTATION: &str = "nodeos.dev/kubelet-endpoint";

/// The size in bytes of the node's ephemeral storage (None where init mounted none, as on a
/// development host).
fn ephemeral_capacity() -> Option<u64> {
    let root = std::path::Path::new(kcore::allocatable::EPHEMERAL_ROOT);
    let st = nix::sys::statvfs::statvfs(root).ok()?;
    let bytes = st.blocks().saturating_mul(st.fragment_size());
    (bytes > 0).then_some(bytes)
}

/// The Node object this machine registers.
pub fn node_object(name: &str, ip: Option<&str>, thresholds: &Thresholds) -> Value {
    let now = kcore::time::rfc3339(SystemTime::now());
    let cpus = cpu_capacity();
    let mem = memory_kib();
    let mut addresses = vec![json!({"type": "Hostname", "address": name})];
    if let Some(ip) = ip {
        addresses.insert(0, json!({"type": "InternalIP", "address": ip}));
    }
    let version = env!("CARGO_PKG_VERSION");
    let mut capacity = json!({ "cpu": cpus.to_string(), "memory": format!("{mem}Ki"), "pods": "110" });
    let memory = kcore::allocatable::allocatable_memory(
        mem * 1024,
        thresholds.reserved(Signal::MemoryAvailable, mem * 1024),
    );
    let mut allocatable =
        json!({ "cpu": cpus.to_string(), "memory": format!("{}Ki", memory / 1024), "pods": "110" });
    if let Some(bytes) = ephemeral_capacity() {
        capacity["ephemeral-storage"] = json!(bytes.to_string());
        let reserved = thresholds.reserved(Signal::NodefsAvailable, bytes);
        allocatable["ephemeral-storage"] = json!(bytes.saturating_sub(reserved).to_string());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/arch": arch(), "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
                "beta.kubernetes.io/arch": arch(), "beta.kubernetes.io/os": "linux",
            },
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "addresses": addresses,
            "conditions": conditions(&now, Health::default(), &mut Transitions::new()),
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": read_trim("/etc/machine-id"),
                "systemUUID": read_trim("/sys/class/dmi/id/product_uuid"),
                "bootID": read_trim("/proc/sys/kernel/random/boot_id"),
                "kernelVersion": read_trim("/proc/sys/kernel/osrelease"),
                "osImage": format!("nodeos {version}"),
                "containerRuntimeVersion": format!("nodeos://{version}"),
                "kubeletVersion": format!("v1.32.0-nodeos.{version}"),
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": arch(),
            },
        },
    })
}

/// Creates the Node, or brings an existing one's status up to date.
pub async fn register(
    client: &kube::Client,
    name: &str,
    ip: Option<&str>,
    kubelet_endpoint: Option<&str>,
    thresholds: &Thresholds,
) -> Result<(), JoinError> {
    let mut node = node_object(name, ip, thresholds);
    if let Some(e) = kubelet_endpoint {
        node["metadata"]["annotations"] = json!({ KUBELET_ENDPOINT_ANNOTATION: e });
    }
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let status = node["status"].clone();
    let node: Node =
        serde_json::from_value(node).map_err(|source| JoinError::Object { kind: "Node", source })?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // The endpoint annotation is set, or cleared (null) when no longer configured.
            let annotations = json!({ KUBELET_ENDPOINT_ANNOTATION: kubelet_endpoint });
            let meta = json!({ "metadata": { "annotations": annotations } });
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(meta))
                .await?;
            patch_status(client, name, json!({ "status": status })).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Renews the node's Lease (creating it the first time).
pub async fn renew_lease(client: &kube::Client, name: &str) -> Result<(), JoinError> {
    let now = kcore::time::rfc3339_micros(SystemTime::now());
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "kube-node-lease");
    let patch = json!({ "spec": { "holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": now } });
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease = json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": name, "namespace": "kube-node-lease" }, "spec": patch["spec"].clone() });
            let lease: Lease = serde_json::from_value(lease).map_err(|source| JoinError::Object {
                kind: "Lease",
                source,
            })?;
            leases.create(&PostParams::default(), &lease).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Merge-patches the node's status subresource.
async fn patch_status(client: &kube::Client, name: &str, patch: Value) -> Result<(), JoinError> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Updates the conditions (the Ready heartbeat).
pub async fn post_status(
    client: &kube::Client,
    name: &str,
    health: Health,
    since: &mut Transitions,
) -> Result<(), JoinError> {
    let now = kcore::time::rfc3339(SystemTime::now());
    let conditions = conditions(&now, health, since);
    let mut status = json!({ "conditions": conditions });
    if let Ok(Ok(images)) = tokio::task::spawn_blocking(|| {
        runtime_api::Client::connect(Path::new(runtime_api::SOCKET))?.list_images()
    })
    .await
    {
        status["images"] = node_images(&images);
    }
    patch_status(client, name, json!({ "status": status })).await
}

/// The most images a Node lists (the kubelet's `nodeStatusMaxImages` default).
const MAX_NODE_IMAGES: usize = 50;

/// `status.images`: the node's images, largest first, each named by its digest and its
/// reference (as the kubelet lists RepoDigests and RepoTags), at most [`MAX_NODE_IMAGES`].
fn node_images(images: &[runtime_api::Image]) -> Value {
    let mut by_id: std::collections::BTreeMap<&str, (Vec<String>, u64)> = std::collections::BTreeMap::new();
    for img in images {
        let e = by_id.entry(img.id.as_str()).or_default();
        let repo = img.reference.rsplit_once('@').map(|(r, _)| r).unwrap_or_else(|| {
            match img.reference.rsplit_once(':') {
                Some((r, tag)) if !tag.contains('/') => r,
                _ => img.reference.as_str(),
            }
        });
        let pinned = format!("{repo}@{}", img.digest);
        for n in [pinned, img.reference.clone()] {
            if !e.0.contains(&n) {
                e.0.push(n);
            }
        }
        e.1 = e.1.max(img.size);
    }
    let mut list: Vec<(Vec<String>, u64)> = by_id.into_values().collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    list.truncate(MAX_NODE_IMAGES);
    Value::Array(
        list.into_iter()
            .map(|(names, size)| json!({"names": names, "sizeBytes": size}))
            .collect(),
    )
}

/// How long the agent waits for the control plane to give its Node a pod CIDR.
const POD_CIDR_WAIT: Duration = Duration::from_secs(30);

/// Hands the runtime the pod CIDR the control plane gave this node (`spec.podCIDR`, from the
/// node IPAM controller at registration), as the kubelet does through CRI's
/// `UpdateRuntimeConfig`. Without one within [`POD_CIDR_WAIT`] (a control plane without node
/// IPAM) pods keep the runtime's default range.
async fn apply_pod_cidr(client: &kube::Client, name: &str) {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + POD_CIDR_WAIT;
    let cidr = loop {
        let assigned = nodes
            .get(name)
            .await
            .ok()
            .and_then(|n| n.spec?.pod_cidr)
            .filter(|c| !c.is_empty());
        if let Some(c) = assigned {
            break c;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(node = %name, "no pod CIDR assigned; pods use the runtime's default range");
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let given = cidr.clone();
    let applied = tokio::task::spawn_blocking(move || {
        runtime_api::Client::connect(Path::new(runtime_api::SOCKET))?.update_runtime_config(&given)
    })
    .await;
    match applied {
        Ok(Ok(())) => tracing::info!(node = %name, %cidr, "pod CIDR applied"),
        Ok(Err(e)) => tracing::warn!(node = %name, %cidr, error = %e, "pod CIDR not applied"),
        Err(e) => tracing::warn!(node = %name, %cidr, error = %e, "pod CIDR not applied"),
    }
}

/// Joins and then keeps the Lease and the Ready condition fresh, forever. Failures are retried
/// with back-off (the control plane may come up after the node).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    settings: AgentSettings,
    state_dir: PathBuf,
    partition: Option<StateStore>,
    authz: std::sync::Arc<crate::authz::Authorizer>,
    serving_cert: std::sync::Arc<transport::tls::SwappableCert>,
    state: std::sync::Arc<tokio::sync::watch::Sender<NodeState>>,
    restart: std::sync::Arc<tokio::sync::Notify>,
    known: crate::pods::KnownPods,
) {
    let Some(cp) = settings.control_plane.clone() else {
        tracing::info!("no control plane configured; running standalone");
        return;
    };
    let name = settings.node_name.clone();
    let thresholds = settings.thresholds().unwrap_or_else(|e| {
        tracing::error!(error = %e, "bad eviction thresholds; using the defaults");
        Thresholds::default()
    });
    let mut delay = Duration::from_secs(1);
    let client = loop {
        let joined = async {
            let id = bootstrap(&cp, &name, &state_dir, partition.as_ref()).await?;
            tracing::info!(node = %name, "client certificate in use");
            let client = transport::kubeapi::client(
                &cp.server,
                &cp.ca_pem,
                Credentials::Certificate {
                    cert_pem: id.cert_pem.clone(),
                    key_pem: id.key_pem,
                },
                USER_AGENT,
            )?;
            register(
                &client,
                &name,
                settings.node_ip.as_deref(),
                cp.kubelet_endpoint.as_deref(),
                &thresholds,
            )
            .await?;
            renew_lease(&client, &name).await?;
            Ok::<_, JoinError>((client, id.cert_pem))
        };
        match joined.await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "joining the control plane failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    };
    let (client, client_cert) = client;
    tracing::info!(node = %name, server = %cp.server, "node registered");
    authz.set_client(client.clone());
    tokio::spawn(keep_client_certificate(
        client.clone(),
        name.clone(),
        client_cert,
        cp.ca_pem.clone(),
        state_dir.clone(),
        partition.clone(),
        restart,
    ));
    tokio::spawn(crate::serving::keep(
        client.clone(),
        name.clone(),
        settings.node_ip.clone(),
        state_dir.clone(),
        serving_cert,
        partition,
    ));
    let pressure = std::sync::Arc::new(tokio::sync::watch::channel(Pressure::default()).0);
    let (image_reclaim, reclaim_requests) = tokio::sync::mpsc::channel(1);
    // One recorder (and one event correlation) for everything this node reports.
    let events = crate::pods::events::Recorder::spawn(client.clone(), name.clone());
    let pods = crate::pods::run(
        client.clone(),
        crate::pods::PodSettings {
            node: name.clone(),
            node_ip: settings.node_ip.clone(),
            insecure_registries: settings.insecure_registries.clone(),
            shutdown_bands: settings.shutdown_grace_period_by_pod_priority.clone(),
            thresholds,
            max_pod_grace: settings.eviction.eviction_max_pod_grace_period,
            image_reclaim: Some(image_reclaim),
            min_reclaim: settings.eviction.minimum_reclaim().unwrap_or_else(|e| {
                tracing::error!(error = %e, "bad evictionMinimumReclaim; reclaiming to the thresholds only");
                Default::default()
            }),
        },
        state.clone(),
        pressure.clone(),
        known,
        events.clone(),
    );
    let gc = settings.image_gc.unwrap_or_default();
    tokio::spawn(crate::imagegc::run(events, gc, reclaim_requests));
    let (cidr_client, cidr_node) = (client.clone(), name.clone());
    tokio::spawn(async move {
        // Pods get addresses from the node's own range, so the pod loop waits for it.
        apply_pod_cidr(&cidr_client, &cidr_node).await;
        pods.await;
    });
    let mut lease = tokio::time::interval(LEASE_RENEW);
    let mut status = tokio::time::interval(STATUS_UPDATE);
    let mut renewed = 0u64;
    let mut state_rx = state.subscribe();
    let mut pressure_rx = pressure.subscribe();
    let mut health = Health {
        pressure: *pressure_rx.borrow_and_update(),
        shutting_down: *state_rx.borrow_and_update() != NodeState::Running,
    };
    let mut since = Transitions::new();
    loop {
        tokio::select! {
            changed = state_rx.changed(), if !health.shutting_down => {
                health.shutting_down = changed.is_err() || *state_rx.borrow_and_update() != NodeState::Running;
                if health.shutting_down {
                    tracing::info!(node = %name, "node shutdown: reporting the node NotReady");
                    if let Err(e) = post_status(&client, &name, health, &mut since).await {
                        tracing::warn!(error = %e, "node status update failed");
                    }
                }
            }
            Ok(()) = pressure_rx.changed() => {
                health.pressure = *pressure_rx.borrow_and_update();
                if let Err(e) = post_status(&client, &name, health, &mut since).await {
                    tracing::warn!(error = %e, "node status update failed");
                }
            }
            _ = lease.tick() => match renew_lease(&client, &name).await {
                Ok(()) => {
                    renewed += 1;
                    if renewed <= 2 {
                        tracing::info!(node = %name, renewals = renewed, "lease renewed");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            },
            _ = status.tick() => {
                if let Err(e) = post_status(&client, &name, health, &mut since).await {
                    tracing::warn!(error = %e, "node status update failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_listed_largest_first_by_digest_and_reference() {
        let img = |reference: &str, id: &str, size| runtime_api::Image {
            reference: reference.into(),
            id: id.into(),
            digest: format!("sha256:{id}{id}"),
            size,
        };
        let listed = node_images(&[
            img("10.0.2.100:5000/busybox:1", "b", 100),
            img("10.0.2.100:5000/big:2", "g", 900),
            img("10.0.2.100:5000/busybox:latest", "b", 100),
        ]);
        assert_eq!(
            listed,
            json!([
                {"names": ["10.0.2.100:5000/big@sha256:gg", "10.0.2.100:5000/big:2"], "sizeBytes": 900},
                {"names": ["10.0.2.100:5000/busybox@sha256:bb", "10.0.2.100:5000/busybox:1",
                           "10.0.2.100:5000/busybox:latest"], "sizeBytes": 100},
            ])
        );
    }

    #[test]
    fn conditions_keep_their_transition_time_until_their_status_changes() {
        let mut since = Transitions::new();
        let ready = |c: &Value| {
            c.as_array()
                .and_then(|a| a.iter().find(|c| c["type"] == "Ready"))
                .cloned()
        };
        let memory = |c: &Value| {
            c.as_array()
                .and_then(|a| a.iter().find(|c| c["type"] == "MemoryPressure"))
                .cloned()
        };
        let first = conditions("t1", Health::default(), &mut since);
        let again = conditions("t2", Health::default(), &mut since);
        let r = ready(&again).expect("Ready");
        assert_eq!(
            (&r["status"], &r["lastHeartbeatTime"], &r["lastTransitionTime"]),
            (&json!("True"), &json!("t2"), &json!("t1"))
        );
        assert_eq!(ready(&first).expect("Ready")["reason"], "KubeletReady");
        let pressed = Health {
            pressure: Pressure {
                memory: true,
                disk: false,
                pid: false,
            },
            shutting_down: false,
        };
        let m = memory(&conditions("t3", pressed, &mut since)).expect("MemoryPressure");
        assert_eq!(
            (
                &m["status"],
                &m["reason"],
                &m["message"],
                &m["lastTransitionTime"]
            ),
            (
                &json!("True"),
                &json!("KubeletHasInsufficientMemory"),
                &json!("kubelet has insufficient memory available"),
                &json!("t3")
            )
        );
        let down = Health {
            pressure: Pressure::default(),
            shutting_down: true,
        };
        let c = conditions("t4", down, &mut since);
        let r = ready(&c).expect("Ready");
        assert_eq!(
            (
                &r["status"],
                &r["reason"],
                &r["message"],
                &r["lastTransitionTime"]
            ),
            (
                &json!("False"),
                &json!("KubeletNotReady"),
                &json!("node is shutting down"),
                &json!("t4")
            )
        );
        assert_eq!(memory(&c).expect("MemoryPressure")["lastTransitionTime"], "t4");
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    /// A self-signed certificate valid until `not_after` (seconds after the epoch), and its key.
    fn cert(not_after: u64) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = (SystemTime::UNIX_EPOCH + Duration::from_secs(not_after)).into();
        let c = params.self_signed(&key).expect("cert");
        (c.pem(), key.serialize_pem())
    }

    #[test]
    fn a_stored_identity_is_used_only_while_valid_and_for_the_same_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert!(stored_identity(d, "CA", now).is_none(), "nothing stored");
        let (c, k) = cert(1_900_000_000);
        std::fs::write(d.join("node.crt"), &c).expect("write");
        std::fs::write(d.join("node.key"), &k).expect("write");
        // An identity from before ca.crt was kept: used.
        assert!(stored_identity(d, "CA", now).is_some());
        std::fs::write(d.join("ca.crt"), "CA\n").expect("write");
        let id = stored_identity(d, "CA", now).expect("same CA");
        assert_eq!((id.cert_pem, id.key_pem), (c, k));
        assert!(stored_identity(d, "OTHER CA", now).is_none(), "another cluster");
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_001);
        assert!(stored_identity(d, "CA", later).is_none(), "expired");
        std::fs::write(d.join("node.crt"), "not a certificate").expect("write");
        assert!(stored_identity(d, "CA", now).is_none(), "unparsable");
    }
}
