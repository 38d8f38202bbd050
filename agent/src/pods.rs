//! Pod workers, first cut: the pods bound to this node (`spec.nodeName`) are run through the
//! node's runtime process and their status is written back.
//!
//! Every [`SYNC`] the agent lists its pods and, per pod: pulls the images (imagePullPolicy),
//! runs the sandbox and starts the containers; restarts exited containers per restartPolicy with
//! the kubelet's back-off (10 s doubling to 300 s); writes `status` (phase, conditions, podIP,
//! containerStatuses) when it changed; and for a pod being deleted stops its containers within
//! the grace period, removes the sandbox and deletes the object for good.
//!
//! Not yet: init containers, probes, lifecycle hooks, volumes, env from ConfigMaps/Secrets,
//! cluster DNS, log/exec endpoints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use runtime_api::{
    Client, ClientError, ContainerConfig, ContainerStatus, Dns, ErrorKind, PodResources, PullPolicy,
    QosClass, Resources, SandboxConfig, SandboxStatus, State,
};
use serde_json::{Value, json};
use tracing::Instrument;

use k8s_openapi::api::core::v1::{Event as ApiEvent, Pod as ApiPod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};

/// How often pods are reconciled.
pub const SYNC: Duration = Duration::from_secs(2);
/// Back-off for restarts and failed starts: 10 s doubling to 300 s.
const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// What the pod workers need to know about the node.
#[derive(Debug, Clone)]
pub struct PodSettings {
    pub node: String,
    pub node_ip: Option<String>,
    /// Registries reached over plain HTTP.
    pub insecure_registries: Vec<String>,
}

/// Why a pod step failed. The texts are what the pod's status shows (the message of a waiting
/// container) or what its events say.
#[derive(Debug, thiserror::Error)]
enum PodError {
    #[error(transparent)]
    InvalidImageName(ClientError),
    #[error("Container image \"{image}\" is not present with pull policy of Never")]
    NeverPull { image: String },
    #[error(transparent)]
    ImagePull(ClientError),
    #[error("the pod spec cannot be read: {0}")]
    Spec(serde_json::Error),
    #[error(transparent)]
    RuntimeUnavailable(ClientError),
    #[error(transparent)]
    CreateSandbox(ClientError),
    #[error(transparent)]
    CreateContainer(ClientError),
    #[error("container gone from the spec")]
    NotInSpec,
    #[error(transparent)]
    Runtime(#[from] ClientError),
}

impl PodError {
    /// The waiting reason of the pod's containers after this failure (the kubelet's).
    fn reason(&self) -> &'static str {
        match self {
            PodError::InvalidImageName(_) => "InvalidImageName",
            PodError::NeverPull { .. } => "ErrImageNeverPull",
            PodError::ImagePull(_) => "ErrImagePull",
            PodError::RuntimeUnavailable(_) => "RuntimeUnavailable",
            PodError::Spec(_) => "CreateContainerConfigError",
            PodError::CreateSandbox(_) => "FailedCreatePodSandBox",
            PodError::CreateContainer(_) | PodError::NotInSpec | PodError::Runtime(_) => {
                "CreateContainerError"
            }
        }
    }
}

/// Why the pod could not start, as its containers' waiting state shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    reason: &'static str,
    message: String,
}

#[derive(Debug, Clone)]
struct Ctr {
    id: String,
    image: String,
    restarts: u32,
    last_terminated: Option<Value>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

#[derive(Debug)]
struct Pod {
    namespace: String,
    name: String,
    sandbox: Option<SandboxStatus>,
    containers: BTreeMap<String, Ctr>,
    /// Why the pod could not start, and when to try again.
    failure: Option<Failure>,
    retry_at: Instant,
    backoff: Duration,
    started: Option<String>,
    last_status: Value,
}

fn now() -> String {
    kcore::time::rfc3339(SystemTime::now())
}

fn runtime_client() -> Result<Client, ClientError> {
    Client::connect(Path::new(runtime_api::SOCKET))
}

fn resources(c: &Value) -> Resources {
    let r = &c["resources"];
    let q = |kind: &str, res: &str, f: fn(&str) -> Option<u64>| {
        let v = &r[kind][res];
        v.as_str()
            .map(str::to_string)
            .or_else(|| v.as_i64().map(|n| n.to_string()))
            .and_then(|s| f(&s))
    };
    Resources {
        cpu_request: q("requests", "cpu", kcore::quantity::cpu_milli),
        cpu_limit: q("limits", "cpu", kcore::quantity::cpu_milli),
        memory_request: q("requests", "memory", kcore::quantity::bytes),
        memory_limit: q("limits", "memory", kcore::quantity::bytes),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The node's own nameservers (pods get them: there is no cluster DNS yet).
fn node_dns() -> Dns {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    Dns {
        servers: text
            .lines()
            .filter_map(|l| l.strip_prefix("nameserver "))
            .map(|s| s.trim().to_string())
            .collect(),
        ..Dns::default()
    }
}

/// The pod as its typed object (QoS and OOM policy read it). Parsed from text, as kube parses
/// the pods it lists: one instance of the `Pod` deserializer in the node binary, not a second
/// one over `Value` (that costs ~0.5 MB).
fn typed_pod(pod: &Value) -> Result<ApiPod, PodError> {
    serde_json::from_str(&pod.to_string()).map_err(PodError::Spec)
}

/// The pod slice's parent and values, as kcore decides them for every node of the cluster.
fn pod_resources(pod: &ApiPod) -> PodResources {
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

/// `oom_score_adj` of container `name` of `pod` on a node with `node_memory` bytes.
fn oom_score_adj(pod: &ApiPod, name: &str, node_memory: u64) -> i32 {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .find(|c| c.name == name)
        .map_or(kcore::qos::BEST_EFFORT_OOM_SCORE_ADJ, |c| {
            kcore::qos::container_oom_score_adj(pod, c, node_memory)
        })
}

fn container_config(pod: &Value, c: &Value, restarts: u32, oom_score_adj: i32) -> ContainerConfig {
    let name = c["name"].as_str().unwrap_or_default().to_string();
    let meta = &pod["metadata"];
    let mut env: Vec<String> = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let Some(k) = e["name"].as_str() else { continue };
        let v = if let Some(v) = e["value"].as_str() {
            Some(v.to_string())
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => meta["name"].as_str().map(str::to_string),
                Some("metadata.namespace") => meta["namespace"].as_str().map(str::to_string),
                Some("metadata.uid") => meta["uid"].as_str().map(str::to_string),
                Some("spec.nodeName") => pod["spec"]["nodeName"].as_str().map(str::to_string),
                _ => None,
            }
        };
        if let Some(v) = v {
            env.push(format!("{k}={v}"));
        }
    }
    let sc = &c["securityContext"];
    let psc = &pod["spec"]["securityContext"];
    let uid = sc["runAsUser"]
        .as_u64()
        .or(psc["runAsUser"].as_u64())
        .and_then(|u| u32::try_from(u).ok());
    let gid = sc["runAsGroup"]
        .as_u64()
        .or(psc["runAsGroup"].as_u64())
        .and_then(|u| u32::try_from(u).ok());
    ContainerConfig {
        name: name.clone(),
        image: c["image"].as_str().unwrap_or_default().to_string(),
        command: strings(&c["command"]),
        args: strings(&c["args"]),
        env,
        working_dir: c["workingDir"].as_str().map(str::to_string),
        run_as_user: uid,
        run_as_group: gid,
        resources: resources(c),
        oom_score_adj,
        read_only_root_filesystem: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        no_new_privileges: sc["allowPrivilegeEscalation"].as_bool() == Some(false),
        log_path: Some(format!("{name}/{restarts}.log")),
        ..ContainerConfig::default()
    }
}

/// An event about a pod (or one of its containers) for the API (docs/SEEDS-SPEC.md Appendix B).
#[derive(Debug, Clone)]
struct Event {
    reason: &'static str,
    warning: bool,
    message: String,
    container: Option<String>,
}

fn normal(reason: &'static str, container: &str, message: String) -> Event {
    Event {
        reason,
        warning: false,
        message,
        container: Some(container.into()),
    }
}

/// Posts events about `pod` (failures are logged: events are best effort, as in the kubelet).
async fn post_events(client: &kube::Client, node: &str, pod: &Value, events: Vec<Event>) {
    let meta = &pod["metadata"];
    let (ns, name) = (
        meta["namespace"].as_str().unwrap_or("default"),
        meta["name"].as_str().unwrap_or_default(),
    );
    for ev in events {
        let t = now();
        let mut involved =
            json!({"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns, "uid": meta["uid"]});
        if let Some(c) = &ev.container {
            involved["fieldPath"] = json!(format!("spec.containers{{{c}}}"));
        }
        let body = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{name}."), "namespace": ns},
            "involvedObject": involved,
            "reason": ev.reason, "message": ev.message, "type": if ev.warning { "Warning" } else { "Normal" },
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": t, "lastTimestamp": t, "count": 1,
            "reportingComponent": "kubelet", "reportingInstance": node,
        });
        let events: kube::Api<ApiEvent> = kube::Api::namespaced(client.clone(), ns);
        let created = match serde_json::from_value::<ApiEvent>(body) {
            Ok(ev) => events.create(&PostParams::default(), &ev).await.map(drop),
            Err(e) => Err(kube::Error::SerdeError(e)),
        };
        if let Err(e) = created {
            tracing::debug!(error = %e, reason = ev.reason, "event not recorded");
        }
    }
}

/// Makes sure the image is on the node per the container's pull policy, through the runtime.
fn ensure_image(
    rt: &mut Client,
    c: &Value,
    insecure_registries: &[String],
    events: &mut Vec<Event>,
) -> Result<(), PodError> {
    let image = c["image"].as_str().unwrap_or_default();
    let cname = c["name"].as_str().unwrap_or_default();
    let policy = c["imagePullPolicy"].as_str().unwrap_or("IfNotPresent");
    let present = rt
        .image_status(image)
        .map_err(|e| match e.kind() {
            ErrorKind::Invalid => PodError::InvalidImageName(e),
            _ => PodError::RuntimeUnavailable(e),
        })?
        .is_some();
    match policy {
        "Never" if !present => Err(PodError::NeverPull { image: image.into() }),
        "IfNotPresent" | "Never" if present => {
            events.push(normal(
                "Pulled",
                cname,
                format!(
                    "Container image \"{image}\" already present on machine and can be accessed by the pod"
                ),
            ));
            Ok(())
        }
        _ => {
            events.push(normal("Pulling", cname, format!("Pulling image \"{image}\"")));
            let pull = if policy == "Always" {
                PullPolicy::Always
            } else {
                PullPolicy::IfNotPresent
            };
            match rt.pull_image(image, pull, None, insecure_registries.to_vec()) {
                Ok(_) => {
                    events.push(normal(
                        "Pulled",
                        cname,
                        format!("Successfully pulled image \"{image}\""),
                    ));
                    Ok(())
                }
                Err(e) => {
                    events.push(Event {
                        reason: "Failed",
                        warning: true,
                        message: format!("Failed to pull image \"{image}\": {e}"),
                        container: Some(cname.into()),
                    });
                    Err(PodError::ImagePull(e))
                }
            }
        }
    }
}

/// Pulls, runs the sandbox, creates and starts every container (blocking).
fn start_pod(
    pod: &Value,
    node: &NodeFacts,
    events: &mut Vec<Event>,
) -> Result<(SandboxStatus, BTreeMap<String, Ctr>), PodError> {
    let spec = &pod["spec"];
    let meta = &pod["metadata"];
    let typed = typed_pod(pod)?;
    let containers: Vec<Value> = spec["containers"].as_array().cloned().unwrap_or_default();
    let mut rt = runtime_client().map_err(PodError::RuntimeUnavailable)?;
    for c in &containers {
        ensure_image(&mut rt, c, &node.insecure_registries, events)?;
    }
    let (ns, name, uid) = (
        meta["namespace"].as_str().unwrap_or("default"),
        meta["name"].as_str().unwrap_or_default(),
        meta["uid"].as_str().unwrap_or_default(),
    );
    let sb = rt
        .run_sandbox(SandboxConfig {
            name: name.into(),
            namespace: ns.into(),
            uid: uid.into(),
            hostname: spec["hostname"].as_str().map(str::to_string),
            dns: node_dns(),
            resources: pod_resources(&typed),
            share_process_namespace: spec["shareProcessNamespace"].as_bool().unwrap_or(false),
            log_directory: Some(PathBuf::from(format!("/var/log/pods/{ns}_{name}_{uid}"))),
            ..SandboxConfig::default()
        })
        .map_err(PodError::CreateSandbox)?;
    let mut out = BTreeMap::new();
    for c in &containers {
        let name = c["name"].as_str().unwrap_or_default();
        let cfg = container_config(pod, c, 0, oom_score_adj(&typed, name, node.memory));
        let started = rt
            .create_container(&sb.id, cfg.clone())
            .and_then(|st| rt.start_container(&st.id));
        match started {
            Ok(st) => {
                events.push(normal("Created", &cfg.name, "Container created".into()));
                events.push(normal("Started", &cfg.name, "Container started".into()));
                out.insert(
                    cfg.name.clone(),
                    Ctr {
                        id: st.id,
                        image: st.image,
                        restarts: 0,
                        last_terminated: None,
                        retry_at: None,
                        backoff: BACKOFF_START,
                    },
                );
            }
            Err(e) => {
                let _ = rt.remove_sandbox(&sb.id);
                return Err(PodError::CreateContainer(e));
            }
        }
    }
    Ok((sb, out))
}

fn terminated_state(st: &ContainerStatus) -> Value {
    json!({"terminated": {
        "exitCode": st.exit_code.unwrap_or(255),
        "signal": st.signal,
        "reason": st.reason.clone().unwrap_or_else(|| "Error".into()),
        "startedAt": st.started_at,
        "finishedAt": st.finished_at,
        "containerID": format!("nodeos://{}", st.id),
    }})
}

/// The pod's status from the runtime's view of its containers.
fn pod_status(
    pod: &Value,
    p: &Pod,
    live: &BTreeMap<String, ContainerStatus>,
    node_ip: Option<&str>,
) -> Value {
    let policy = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always");
    let mut statuses = Vec::new();
    let (mut running, mut succeeded, mut failed, mut total) = (0, 0, 0, 0);
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        total += 1;
        let name = c["name"].as_str().unwrap_or_default();
        let image = c["image"].as_str().unwrap_or_default();
        let tracked = p.containers.get(name);
        let st = tracked.and_then(|t| live.get(&t.id));
        let state = match (st, &p.failure) {
            (Some(st), _) if st.state == State::Running => {
                running += 1;
                json!({"running": {"startedAt": st.started_at}})
            }
            (Some(st), _) if st.state == State::Exited => {
                if st.exit_code == Some(0) {
                    succeeded += 1;
                } else {
                    failed += 1;
                }
                let restarting = tracked.is_some_and(|t| t.retry_at.is_some());
                if restarting {
                    json!({"waiting": {"reason": "CrashLoopBackOff",
                        "message": format!("back-off restarting failed container {name}")}})
                } else {
                    terminated_state(st)
                }
            }
            (_, Some(f)) => json!({"waiting": {"reason": f.reason, "message": f.message}}),
            _ => json!({"waiting": {"reason": "ContainerCreating"}}),
        };
        let ready = state.get("running").is_some();
        let mut s = json!({
            "name": name, "image": image, "imageID": tracked.map(|t| t.image.clone()).unwrap_or_default(),
            "ready": ready, "started": ready, "restartCount": tracked.map_or(0, |t| t.restarts), "state": state,
        });
        if let Some(id) = tracked.map(|t| &t.id) {
            s["containerID"] = json!(format!("nodeos://{id}"));
        }
        if let Some(last) = tracked.and_then(|t| t.last_terminated.clone()) {
            s["lastState"] = last;
        }
        statuses.push(s);
    }
    let phase = if total > 0 && succeeded == total && policy != "Always" {
        "Succeeded"
    } else if total > 0 && succeeded + failed == total && failed > 0 && policy == "Never" {
        "Failed"
    } else if running > 0 || (p.sandbox.is_some() && succeeded + failed > 0) {
        "Running"
    } else {
        "Pending"
    };
    let all_ready = total > 0 && running == total;
    let cond = |kind: &str, ok: bool| {
        let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" }, "lastTransitionTime": p.started});
        if !ok && matches!(kind, "Ready" | "ContainersReady") {
            c["reason"] = json!("ContainersNotReady");
        }
        c
    };
    let mut status = json!({
        "phase": phase,
        "conditions": [cond("PodReadyToStartContainers", p.sandbox.is_some()), cond("Initialized", true),
                       cond("Ready", all_ready), cond("ContainersReady", all_ready), cond("PodScheduled", true)],
        "containerStatuses": statuses,
        "startTime": p.started,
    });
    if let Some(ip) = node_ip {
        status["hostIP"] = json!(ip);
        status["hostIPs"] = json!([{"ip": ip}]);
    }
    if let Some(ip) = p.sandbox.as_ref().and_then(|s| s.ip.clone()) {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    status
}

/// Stops the pod's containers within `grace` and removes its sandbox (blocking).
fn stop_pod(sandbox: &SandboxStatus, containers: Vec<String>, grace: u64) {
    let Ok(mut rt) = runtime_client() else { return };
    for id in containers {
        if let Err(e) = rt.stop_container(&id, grace) {
            tracing::debug!(container = %id, error = %e, "stop");
        }
    }
    if let Err(e) = rt.remove_sandbox(&sandbox.id) {
        tracing::warn!(sandbox = %sandbox.id, error = %e, "removing the sandbox failed");
    }
}

/// Restarts one exited container (blocking): a new container in the same sandbox.
fn restart(
    pod: &Value,
    sandbox: &SandboxStatus,
    name: &str,
    old: &str,
    restarts: u32,
    node_memory: u64,
) -> Result<ContainerStatus, PodError> {
    let c = pod["spec"]["containers"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"].as_str() == Some(name)))
        .ok_or(PodError::NotInSpec)?;
    let oom = oom_score_adj(&typed_pod(pod)?, name, node_memory);
    let mut rt = runtime_client()?;
    let _ = rt.remove_container(old);
    let st = rt.create_container(&sandbox.id, container_config(pod, c, restarts, oom))?;
    Ok(rt.start_container(&st.id)?)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// The runtime's containers by id (empty when the runtime cannot be reached).
async fn live_containers() -> BTreeMap<String, ContainerStatus> {
    blocking(|| runtime_client().and_then(|mut c| c.list_containers()))
        .await
        .and_then(Result::ok)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect()
}

/// The span of one pod's work, so `RUST_LOG=agent=debug` shows one pod's path through a sync.
fn pod_span(namespace: &str, name: &str, uid: &str) -> tracing::Span {
    tracing::info_span!("pod", namespace, name, uid)
}

/// What a pod start needs to know about the node (moved into blocking tasks).
#[derive(Debug, Clone)]
struct NodeFacts {
    /// Registries reached over plain HTTP, for the runtime's pulls.
    insecure_registries: Vec<String>,
    /// The machine's memory (bytes), for Burstable `oom_score_adj`.
    memory: u64,
}

/// What every pod step needs: the API and the node.
struct Ctx {
    client: kube::Client,
    settings: PodSettings,
    node: Arc<NodeFacts>,
}

/// The pod workers: the pods this agent runs, by uid.
struct Worker {
    ctx: Ctx,
    pods: BTreeMap<String, Pod>,
}

/// Reconciles this node's pods forever.
pub async fn run(client: kube::Client, settings: PodSettings) {
    let node = Arc::new(NodeFacts {
        insecure_registries: settings.insecure_registries.clone(),
        memory: crate::node::memory_capacity(),
    });
    let all_pods: kube::Api<ApiPod> = kube::Api::all(client.clone());
    let mine = ListParams::default().fields(&format!("spec.nodeName={}", settings.node));
    let mut worker = Worker {
        ctx: Ctx {
            client,
            settings,
            node,
        },
        pods: readopt().await,
    };
    let mut tick = tokio::time::interval(SYNC);
    loop {
        tick.tick().await;
        let items: Vec<Value> = match all_pods.list(&mine).await {
            Ok(list) => list
                .items
                .iter()
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing this node's pods failed");
                continue;
            }
        };
        worker.sync(&items).await;
    }
}

/// What the runtime already runs (the agent restarted), as pods to carry on with.
async fn readopt() -> BTreeMap<String, Pod> {
    let mut pods = BTreeMap::new();
    let Some(Ok(list)) = blocking(|| runtime_client().and_then(|mut c| c.list_sandboxes())).await else {
        return pods;
    };
    let ctrs = live_containers().await;
    for sb in list.into_iter().filter(|s| s.ready) {
        let containers = ctrs
            .values()
            .filter(|c| c.sandbox_id == sb.id)
            .map(|c| {
                (
                    c.name.clone(),
                    Ctr {
                        id: c.id.clone(),
                        image: c.image.clone(),
                        // Each restart writes `<name>/<restarts>.log`: the count survives us.
                        restarts: c
                            .log_path
                            .as_deref()
                            .and_then(|p| p.file_stem()?.to_str()?.parse().ok())
                            .unwrap_or(0),
                        last_terminated: None,
                        retry_at: None,
                        backoff: BACKOFF_START,
                    },
                )
            })
            .collect();
        let _span = pod_span(&sb.namespace, &sb.name, &sb.uid).entered();
        tracing::info!(pod = %format!("{}/{}", sb.namespace, sb.name), "pod re-adopted");
        pods.insert(
            sb.uid.clone(),
            Pod {
                namespace: sb.namespace.clone(),
                name: sb.name.clone(),
                started: Some(sb.created_at.clone()),
                sandbox: Some(sb),
                containers,
                failure: None,
                retry_at: Instant::now(),
                backoff: BACKOFF_START,
                last_status: Value::Null,
            },
        );
    }
    pods
}

impl Worker {
    /// One pass over this node's pods (`items`, from the API): each pod reconciled, the ones
    /// gone from the API removed, and changed statuses written back.
    async fn sync(&mut self, items: &[Value]) {
        let live = live_containers().await;
        let mut seen = Vec::new();
        for pod in items {
            let meta = &pod["metadata"];
            let Some(uid) = meta["uid"].as_str() else {
                continue;
            };
            seen.push(uid.to_string());
            let ns = meta["namespace"].as_str().unwrap_or("default");
            let name = meta["name"].as_str().unwrap_or_default();
            self.sync_pod(pod, uid, ns, name, &live)
                .instrument(pod_span(ns, name, uid))
                .await;
        }
        self.remove_gone(&seen).await;
        self.write_statuses(items).await;
    }

    /// One pod's reconcile step: finishes its deletion, or starts it when due and restarts its
    /// exited containers per restartPolicy.
    async fn sync_pod(
        &mut self,
        pod: &Value,
        uid: &str,
        ns: &str,
        name: &str,
        live: &BTreeMap<String, ContainerStatus>,
    ) {
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            return self.finish_deletion(pod, uid, ns, name).await;
        }
        if pod["status"]["phase"]
            .as_str()
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
            && !self.pods.contains_key(uid)
        {
            return;
        }
        let p = self.pods.entry(uid.to_string()).or_insert_with(|| Pod {
            namespace: ns.to_string(),
            name: name.to_string(),
            sandbox: None,
            containers: BTreeMap::new(),
            failure: None,
            retry_at: Instant::now(),
            backoff: BACKOFF_START,
            started: Some(now()),
            last_status: Value::Null,
        });
        if p.sandbox.is_none() && Instant::now() >= p.retry_at {
            self.ctx.start(p, pod).await;
        }
        self.ctx.restart_exited(p, pod, live).await;
    }

    /// A pod being deleted: its containers stopped within the grace period, its sandbox removed,
    /// and the object deleted for good.
    async fn finish_deletion(&mut self, pod: &Value, uid: &str, ns: &str, name: &str) {
        let ctx = &self.ctx;
        if let Some(p) = self.pods.remove(uid) {
            let grace = pod["metadata"]["deletionGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30);
            if let Some(sb) = p.sandbox {
                let evs = p
                    .containers
                    .keys()
                    .map(|c| normal("Killing", c, format!("Stopping container {c}")))
                    .collect();
                post_events(&ctx.client, &ctx.settings.node, pod, evs).await;
                let ids: Vec<String> = p.containers.values().map(|c| c.id.clone()).collect();
                tracing::debug!(grace_s = grace, "stopping the pod");
                blocking(move || stop_pod(&sb, ids, grace)).await;
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let pods_in_ns: kube::Api<ApiPod> = kube::Api::namespaced(ctx.client.clone(), ns);
        match pods_in_ns.delete(name, &params).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "pod deleted"),
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "final pod delete failed")
            }
        }
    }

    /// Pods that vanished from the API (deleted with grace 0 elsewhere) are stopped.
    async fn remove_gone(&mut self, seen: &[String]) {
        let gone: Vec<String> = self.pods.keys().filter(|u| !seen.contains(u)).cloned().collect();
        for uid in gone {
            if let Some(p) = self.pods.remove(&uid)
                && let Some(sb) = p.sandbox
            {
                let span = pod_span(&p.namespace, &p.name, &uid);
                tracing::info!(parent: &span, pod = %format!("{}/{}", p.namespace, p.name), "pod gone from the API; removing it");
                let ids: Vec<String> = p.containers.values().map(|c| c.id.clone()).collect();
                blocking(move || stop_pod(&sb, ids, 0)).instrument(span).await;
            }
        }
    }

    /// Status write-back, only where it changed.
    async fn write_statuses(&mut self, items: &[Value]) {
        let live = live_containers().await;
        let list_pods: BTreeMap<&str, &Value> = items
            .iter()
            .filter_map(|p| Some((p["metadata"]["uid"].as_str()?, p)))
            .collect();
        for (uid, p) in self.pods.iter_mut() {
            let Some(pod) = list_pods.get(uid.as_str()) else {
                continue;
            };
            let status = pod_status(pod, p, &live, self.ctx.settings.node_ip.as_deref());
            if status == p.last_status {
                continue;
            }
            let span = pod_span(&p.namespace, &p.name, uid);
            let pods_in_ns: kube::Api<ApiPod> = kube::Api::namespaced(self.ctx.client.clone(), &p.namespace);
            let patch = Patch::Merge(json!({"status": status}));
            match pods_in_ns
                .patch_status(&p.name, &PatchParams::default(), &patch)
                .instrument(span.clone())
                .await
            {
                Ok(_) => {
                    tracing::debug!(parent: &span, phase = %status["phase"], "status written");
                    p.last_status = status;
                }
                Err(e) => {
                    tracing::warn!(parent: &span, pod = %format!("{}/{}", p.namespace, p.name), error = %e, "status update failed")
                }
            }
        }
    }
}

impl Ctx {
    /// Pulls, runs the sandbox and starts the containers; a failure is kept on the pod (its
    /// containers' waiting reason) and retried with back-off.
    async fn start(&self, p: &mut Pod, pod: &Value) {
        tracing::debug!("starting the pod");
        let (pod2, node) = (pod.clone(), self.node.clone());
        let result = blocking(move || {
            let mut events = Vec::new();
            let r = start_pod(&pod2, &node, &mut events);
            (r, events)
        })
        .await;
        let Some((result, events)) = result else {
            return;
        };
        post_events(&self.client, &self.settings.node, pod, events).await;
        let pod_name = format!("{}/{}", p.namespace, p.name);
        match result {
            Ok((sb, ctrs)) => {
                tracing::info!(pod = %pod_name, ip = ?sb.ip, "pod running");
                p.sandbox = Some(sb);
                p.containers = ctrs;
                p.failure = None;
            }
            Err(e) => {
                let reason = e.reason();
                tracing::warn!(pod = %pod_name, reason = %reason, error = %e, "pod start failed");
                let reason = if reason == "ErrImagePull" && p.failure.is_some() {
                    "ImagePullBackOff"
                } else {
                    reason
                };
                p.failure = Some(Failure {
                    reason,
                    message: e.to_string(),
                });
                p.retry_at = Instant::now() + p.backoff;
                p.backoff = (p.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Restarts the pod's exited containers per restartPolicy, after their back-off.
    async fn restart_exited(&self, p: &mut Pod, pod: &Value, live: &BTreeMap<String, ContainerStatus>) {
        let policy = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always");
        let Some(sb) = p.sandbox.clone() else {
            return;
        };
        for (cname, t) in p.containers.iter_mut() {
            let Some(st) = live.get(&t.id) else { continue };
            let again = st.state == State::Exited
                && (policy == "Always" || (policy == "OnFailure" && st.exit_code != Some(0)));
            if !again {
                continue;
            }
            match t.retry_at {
                None => {
                    t.last_terminated = Some(terminated_state(st));
                    t.retry_at = Some(Instant::now() + t.backoff);
                    tracing::debug!(container = %cname, back_off_s = t.backoff.as_secs(), "container exited");
                }
                Some(at) if Instant::now() >= at => {
                    let (pod2, sb2, old, n) = (pod.clone(), sb.clone(), t.id.clone(), t.restarts + 1);
                    let (cn, memory) = (cname.clone(), self.node.memory);
                    match blocking(move || restart(&pod2, &sb2, &cn, &old, n, memory)).await {
                        Some(Ok(new)) => {
                            let evs = vec![
                                normal("Created", cname, "Container created".into()),
                                normal("Started", cname, "Container started".into()),
                            ];
                            post_events(&self.client, &self.settings.node, pod, evs).await;
                            tracing::debug!(container = %cname, restarts = n, "container restarted");
                            t.id = new.id;
                            t.restarts += 1;
                            t.retry_at = None;
                            t.backoff = (t.backoff * 2).min(BACKOFF_MAX);
                        }
                        Some(Err(e)) => tracing::debug!(container = %cname, error = %e, "restart failed"),
                        None => {}
                    }
                }
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    const PRESENT: &str = r#"{"result":"imageStatus","image":{"reference":"docker.io/library/busybox:1",
        "id":"sha256:c","digest":"sha256:m","size":1}}"#;
    const ABSENT: &str = r#"{"result":"imageStatus","image":null}"#;

    #[test]
    fn image_failures_keep_the_kubelet_reasons_and_texts() {
        let mut events = Vec::new();
        let never = json!({"name": "main", "image": "busybox", "imagePullPolicy": "Never"});
        let e = ensure_image(&mut fake_runtime(vec![ABSENT]), &never, &[], &mut events).expect_err("absent");
        assert_eq!(e.reason(), "ErrImageNeverPull");
        assert_eq!(
            e.to_string(),
            r#"Container image "busybox" is not present with pull policy of Never"#
        );
        let bad = json!({"name": "main", "image": "not a reference"});
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
            &never_pull_policy("IfNotPresent"),
            &[],
            &mut events,
        )
        .expect_err("registry down");
        assert_eq!(e.reason(), "ErrImagePull");
        let texts: Vec<(&str, &str)> = events.iter().map(|e| (e.reason, e.message.as_str())).collect();
        assert_eq!(
            texts,
            [
                ("Pulling", r#"Pulling image "busybox""#),
                (
                    "Failed",
                    r#"Failed to pull image "busybox": connecting to 10.0.2.100:5000: refused"#
                )
            ]
        );
        assert_eq!(PodError::NotInSpec.to_string(), "container gone from the spec");
    }

    fn never_pull_policy(policy: &str) -> Value {
        json!({"name": "main", "image": "busybox", "imagePullPolicy": policy})
    }

    #[test]
    fn images_present_or_pulled_through_the_runtime() {
        let mut events = Vec::new();
        ensure_image(
            &mut fake_runtime(vec![PRESENT]),
            &never_pull_policy("IfNotPresent"),
            &[],
            &mut events,
        )
        .expect("present");
        let pulled = r#"{"result":"image","image":{"reference":"docker.io/library/busybox:1",
            "id":"sha256:c","digest":"sha256:m","size":1}}"#;
        ensure_image(
            &mut fake_runtime(vec![PRESENT, pulled]),
            &never_pull_policy("Always"),
            &["10.0.2.100:5000".into()],
            &mut events,
        )
        .expect("pulled");
        let texts: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            texts,
            [
                r#"Container image "busybox" already present on machine and can be accessed by the pod"#,
                r#"Pulling image "busybox""#,
                r#"Successfully pulled image "busybox""#,
            ]
        );
    }

    #[test]
    fn qos_and_oom_scores_go_to_the_runtime_as_numbers() {
        let pod = json!({
            "metadata": {"namespace": "default", "name": "web", "uid": "u1"},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}}]},
        });
        let typed = typed_pod(&pod).expect("typed");
        assert_eq!(
            pod_resources(&typed),
            PodResources {
                qos: QosClass::Guaranteed,
                cpu_request_milli: 1000,
                cpu_limit_milli: Some(1000),
                memory_limit: Some(1 << 30),
            },
            "1 and 1000m are equal: Guaranteed, as the API server says"
        );
        let cfg = container_config(
            &pod,
            &pod["spec"]["containers"][0],
            0,
            oom_score_adj(&typed, "main", 8 << 30),
        );
        assert_eq!(cfg.oom_score_adj, -997);
        assert_eq!(cfg.resources.cpu_limit, Some(1000));
    }

    #[test]
    fn start_failure_is_the_containers_waiting_state() {
        let pod = json!({
            "metadata": {"namespace": "default", "name": "web", "uid": "u1"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        });
        let p = Pod {
            namespace: "default".into(),
            name: "web".into(),
            sandbox: None,
            containers: BTreeMap::new(),
            failure: Some(Failure {
                reason: "ImagePullBackOff",
                message: "registry unreachable".into(),
            }),
            retry_at: Instant::now(),
            backoff: BACKOFF_START,
            started: Some(now()),
            last_status: Value::Null,
        };
        let status = pod_status(&pod, &p, &BTreeMap::new(), Some("10.0.2.15"));
        assert_eq!(status["phase"], "Pending");
        assert_eq!(
            status["containerStatuses"][0]["state"],
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "registry unreachable"}})
        );
        assert_eq!(status["hostIP"], "10.0.2.15");
    }
}
