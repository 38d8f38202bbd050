//! Hollow nodes: N simulated nodes in one process (`controlplane hollow-nodes --kubeconfig F
//! --count N`), for scheduler and controller tests and benchmarks without VMs, against this
//! control plane or any other. Each node registers a Node (capacity, labels, taints, Ready),
//! renews its Lease in `kube-node-lease` every 10 s, reports pods bound to it as Running and Ready
//! (no containers run), and finishes their graceful deletion. Killing the process is losing all
//! its nodes.
//!
//! Nodes advertise only loopback addresses (`127.1.x.y`), and each node its own kubelet
//! endpoint on 127.0.0.1 (its own port, in the Node's `daemonEndpoints` and the
//! `nodeos.dev/kubelet-endpoint` annotation, so the endpoint knows which node is asked): the
//! API server dials a Node's address for logs, exec and metrics, and nothing in a test may dial
//! off the machine. The endpoint answers the Summary API (`GET /stats/summary`, what the metrics
//! API scrapes) and everything else (logs, exec) with a clear error. The process raises its soft
//! open-files limit to the hard one: every node holds a listener, and the API server keeps a
//! connection to each node it scrapes. The endpoints serve certificates the cluster issues for
//! the nodes' names ([`certs`]), as the API server verifies them.
//!
//! Usage is simulated, as kubemark's hollow kubelets do: a Running pod's containers use nothing
//! unless the pod carries the annotation `hollow.nodeos.dev/usage` (a test knob, only read by
//! hollow nodes): `{"cpu": "250m", "memory": "64Mi"}` for each container, optionally with
//! `"containers": {"<name>": {"cpu": .., "memory": ..}}` per container. Annotating a running
//! pod changes what its node reports; the node's usage is the sum of its pods'.
//!
//! A pod may ask to finish: annotation `nodeos.dev/hollow-run-seconds: "N"` makes its containers
//! exit after N seconds with `nodeos.dev/hollow-exit-code` (default 0), and the pod Succeeded or
//! Failed (restartPolicy Never/OnFailure; with Always it keeps running).

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore};

mod certs;

use crate::api::metrics::summary::{self, ContainerUsage, PodRef};

/// The pod annotation with the usage hollow nodes report for its containers (test knob).
pub const USAGE_ANNOTATION: &str = "hollow.nodeos.dev/usage";

/// Options of `controlplane hollow-nodes`.
#[derive(Debug, Clone, clap::Args)]
pub struct HollowArgs {
    #[arg(long)]
    pub kubeconfig: PathBuf,
    #[arg(long)]
    pub count: usize,
    /// Node names are `<prefix>-0` .. `<prefix>-<count-1>`.
    #[arg(long, default_value = "hollow")]
    pub name_prefix: String,
    /// Extra labels, `k=v,k2=v2`.
    #[arg(long, default_value = "")]
    pub labels: String,
    /// Taints, `k=v:Effect,k2:Effect`.
    #[arg(long, default_value = "")]
    pub taints: String,
    #[arg(long, default_value = "4")]
    pub cpu: String,
    #[arg(long, default_value = "16Gi")]
    pub memory: String,
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// API requests in flight at once.
    #[arg(long, default_value_t = 32)]
    pub parallel: usize,
    /// The Lease duration (the kubelet's `nodeLeaseDurationSeconds`); the Lease is renewed
    /// every quarter of it.
    #[arg(long, default_value_t = 40)]
    pub node_lease_duration_seconds: u32,
}

/// Errors of bad arguments.
#[derive(Debug, thiserror::Error)]
pub enum HollowError {
    #[error("bad label {0:?} (want key=value)")]
    Label(String),
    #[error("bad taint {0:?} (want key[=value]:NoSchedule|PreferNoSchedule|NoExecute)")]
    Taint(String),
    #[error("at most 65,536 hollow nodes per process (their addresses are 127.1.x.y)")]
    TooMany,
}

/// `k=v,k2=v2` → map.
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, HollowError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').ok_or_else(|| HollowError::Label(p.into()))?;
            (!k.trim().is_empty())
                .then(|| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| HollowError::Label(p.into()))
        })
        .collect()
}

/// `k=v:Effect,k2:Effect` (the kubelet's `--register-with-taints` format).
pub fn parse_taints(s: &str) -> Result<Vec<Value>, HollowError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (kv, effect) = p.rsplit_once(':').ok_or_else(|| HollowError::Taint(p.into()))?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(HollowError::Taint(p.into()));
            }
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if k.is_empty() {
                return Err(HollowError::Taint(p.into()));
            }
            let mut t = json!({"key": k, "effect": effect});
            if !v.is_empty() {
                t["value"] = json!(v);
            }
            Ok(t)
        })
        .collect()
}

/// The loopback address of node `i`.
fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, (i / 256) as u8, (i % 256) as u8)
}

const USER_AGENT: &str = "kubelet/v1.32.0-hollow nodeos-hollow-node";

fn now() -> String {
    kcore::time::rfc3339(SystemTime::now())
}

struct Fleet {
    client: kube::Client,
    args: HollowArgs,
    labels: BTreeMap<String, String>,
    taints: Vec<Value>,
    names: Vec<String>,
    /// Each node's kubelet endpoint port (on 127.0.0.1).
    kubelet_ports: Vec<u16>,
    limit: Arc<Semaphore>,
    /// Pods reported, by uid: the status we last wrote (phase).
    reported: Mutex<HashMap<String, String>>,
    /// Running pods per node (by uid), with their containers' usage: what `/stats/summary` tells.
    running: std::sync::Mutex<HashMap<usize, BTreeMap<String, RunningPod>>>,
}

/// A Running pod as the Summary API reports it: containers with CPU nanocores and memory bytes.
#[derive(Debug, Clone)]
struct RunningPod {
    reference: PodRef,
    containers: Vec<ContainerUsage>,
}

fn conditions(now: &str) -> Value {
    let c = |t: &str, s: &str, reason: &str, message: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        c(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available"
        ),
        c(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure"
        ),
        c(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available"
        ),
        c("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ])
}

impl Fleet {
    fn node(&self, i: usize) -> Value {
        let name = &self.names[i];
        let mut labels = json!({
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", "node.nodeos.dev/hollow": "true",
        });
        for (k, v) in &self.labels {
            labels[k] = json!(v);
        }
        let a = &self.args;
        let resources = json!({"cpu": a.cpu, "memory": a.memory, "pods": a.max_pods.to_string(), "ephemeral-storage": "100Gi"});
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                "annotations": {crate::api::KUBELET_ENDPOINT_ANNOTATION: format!("127.0.0.1:{}", self.kubelet_ports[i])}},
            "spec": {"taints": self.taints},
            "status": {
                "capacity": resources, "allocatable": resources,
                "addresses": [{"type": "InternalIP", "address": address(i).to_string()}, {"type": "Hostname", "address": name}],
                "conditions": conditions(&now()),
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_ports[i]}},
                "nodeInfo": {"machineID": format!("hollow-{i}"), "systemUUID": format!("hollow-{i}"), "bootID": format!("hollow-{i}"),
                    "kernelVersion": "hollow", "osImage": "nodeos hollow node", "containerRuntimeVersion": "hollow://0",
                    "kubeletVersion": "v1.32.0-hollow", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            },
        })
    }

    async fn register(&self, i: usize) -> Result<(), kube::Error> {
        let _permit = self.limit.acquire().await;
        let nodes: kube::Api<Node> = kube::Api::all(self.client.clone());
        let body = self.node(i);
        let node: Node = serde_json::from_value(body.clone()).map_err(kube::Error::SerdeError)?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Registered before: as the kubelet, only labels and annotations are posted
                // again (the taints are the cluster's now).
                let name = &self.names[i];
                let meta = json!({"metadata": body["metadata"]});
                nodes
                    .patch(name, &PatchParams::default(), &Patch::Merge(&meta))
                    .await?;
                let status = json!({"status": body["status"]});
                nodes
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .map(drop)
            }
            Err(e) => Err(e),
        }
    }

    async fn renew(&self, i: usize) -> Result<(), kube::Error> {
        let _permit = self.limit.acquire().await;
        let name = &self.names[i];
        let leases: kube::Api<Lease> = kube::Api::namespaced(self.client.clone(), "kube-node-lease");
        let spec = json!({"holderIdentity": name, "leaseDurationSeconds": self.args.node_lease_duration_seconds,
                          "renewTime": kcore::time::rfc3339_micros(SystemTime::now())});
        match leases
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec}))
                .map_err(kube::Error::SerdeError)?;
                leases.create(&PostParams::default(), &lease).await.map(drop)
            }
            Err(e) => Err(e),
        }
    }

    async fn post_status(&self, i: usize) -> Result<(), kube::Error> {
        let _permit = self.limit.acquire().await;
        let nodes: kube::Api<Node> = kube::Api::all(self.client.clone());
        let patch = json!({"status": {"conditions": conditions(&now())}});
        nodes
            .patch_status(&self.names[i], &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map(drop)
    }

    /// Follows a pod event: a Running pod bound here (not being deleted) is reported by its
    /// node's Summary API with its annotated usage; any other is not.
    fn track(&self, pod: &Pod, deleted: bool) {
        let Some(i) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| self.index_of(n))
        else {
            return;
        };
        let meta = &pod.metadata;
        let Some(uid) = meta.uid.clone() else { return };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let running = !deleted && meta.deletion_timestamp.is_none() && phase == Some("Running");
        let mut all = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !running {
            if let Some(pods) = all.get_mut(&i) {
                pods.remove(&uid);
            }
            return;
        }
        let names: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
            .collect();
        let usage = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(USAGE_ANNOTATION))
            .and_then(|a| {
                let u = summary::annotated_usage(a, &names);
                if u.is_none() {
                    tracing::warn!(pod = ?meta.name, value = %a, "malformed {USAGE_ANNOTATION} annotation; reporting no usage");
                }
                u
            })
            .unwrap_or_default();
        let containers = names
            .into_iter()
            .map(|c| {
                let (cpu, mem) = usage.get(&c).copied().unwrap_or((0, 0));
                (c, cpu, mem)
            })
            .collect();
        let reference = PodRef {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: uid.clone(),
        };
        all.entry(i).or_default().insert(
            uid,
            RunningPod {
                reference,
                containers,
            },
        );
    }

    /// Node `i`'s kubelet endpoint: the Summary API, and a clear error for everything else.
    fn answer(
        &self,
        i: usize,
        method: &hyper::Method,
        path: &str,
    ) -> (hyper::StatusCode, &'static str, Vec<u8>) {
        if *method == hyper::Method::GET && path == "/stats/summary" {
            let pods: Vec<(PodRef, Vec<ContainerUsage>)> = self
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&i)
                .map(|pods| {
                    pods.values()
                        .map(|p| (p.reference.clone(), p.containers.clone()))
                        .collect()
                })
                .unwrap_or_default();
            let s = summary::summary(&self.names[i], &pods, &now());
            match serde_json::to_vec(&s) {
                Ok(body) => return (hyper::StatusCode::OK, "application/json", body),
                Err(e) => {
                    return (
                        hyper::StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        e.to_string().into_bytes(),
                    );
                }
            }
        }
        let msg = format!("hollow nodes run no containers: {path} is not available on a hollow node");
        (hyper::StatusCode::BAD_REQUEST, "text/plain", msg.into_bytes())
    }

    fn index_of(&self, node: &str) -> Option<usize> {
        let rest = node.strip_prefix(&self.args.name_prefix)?.strip_prefix('-')?;
        let i: usize = rest.parse().ok()?;
        (i < self.names.len() && self.names[i] == node).then_some(i)
    }

    /// Brings one pod bound to a hollow node to what it should report (boxed: it schedules itself
    /// again for pods that finish later).
    fn sync_pod(
        self: Arc<Self>,
        pod: Pod,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move { self.sync_pod_now(pod).await })
    }

    async fn sync_pod_now(self: Arc<Self>, pod: Pod) {
        let meta = &pod.metadata;
        let (Some(uid), Some(name), Some(ns)) = (meta.uid.clone(), meta.name.clone(), meta.namespace.clone())
        else {
            return;
        };
        let Some(spec) = pod.spec.as_ref() else { return };
        let Some(i) = spec.node_name.as_deref().and_then(|n| self.index_of(n)) else {
            return;
        };
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), &ns);
        if meta.deletion_timestamp.is_some() {
            let _permit = self.limit.acquire().await;
            // A pod that finalizers keep after its containers stopped shows the terminal phase,
            // as the kubelet reports it (the Job controller waits for it with
            // podReplacementPolicy Failed).
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or_default();
            if meta.finalizers.as_ref().is_some_and(|f| !f.is_empty())
                && !matches!(phase, "Succeeded" | "Failed")
            {
                let started = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.start_time.as_ref())
                    .map_or_else(
                        || kcore::time::unix_seconds(SystemTime::now()),
                        |t| t.0.timestamp(),
                    );
                let status = pod_status(&pod, i, "Failed", 143, started);
                if let Err(e) = pods
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await
                {
                    tracing::debug!(pod = %format!("{ns}/{name}"), error = %e, "terminal status not written");
                }
            }
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match pods.delete(&name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "final delete failed"),
            }
            self.reported.lock().await.remove(&uid);
            return;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if matches!(phase.as_str(), "Succeeded" | "Failed") {
            return;
        }
        let annotations = meta.annotations.clone().unwrap_or_default();
        let run_seconds: Option<u64> = annotations
            .get("nodeos.dev/hollow-run-seconds")
            .and_then(|s| s.parse().ok());
        let exit_code: i32 = annotations
            .get("nodeos.dev/hollow-exit-code")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let restart_always = spec.restart_policy.as_deref().unwrap_or("Always") == "Always";
        let start = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0.timestamp());
        let started = match start {
            Some(s) => s,
            None => kcore::time::unix_seconds(SystemTime::now()),
        };
        let finished = match run_seconds {
            Some(secs) if !restart_always => {
                let ends = started + i64::try_from(secs).unwrap_or(i64::MAX);
                let wait = ends - kcore::time::unix_seconds(SystemTime::now());
                if wait > 0 {
                    // Report it Running now; come back when it ends, with the pod as it is then
                    // (a copy from now would report it Running again).
                    let again = self.clone();
                    let api = pods.clone();
                    let name2 = name.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(u64::try_from(wait).unwrap_or(0))).await;
                        if let Ok(current) = api.get(&name2).await {
                            again.sync_pod(current).await;
                        }
                    });
                    false
                } else {
                    true
                }
            }
            _ => false,
        };
        let want = if finished {
            if exit_code == 0 { "Succeeded" } else { "Failed" }
        } else {
            "Running"
        };
        {
            let mut reported = self.reported.lock().await;
            let last = reported.get(&uid).map(String::as_str);
            if last == Some(want) && phase == want {
                return;
            }
            // A finished pod stays finished, whatever an older copy of it says.
            if matches!(last, Some("Succeeded" | "Failed")) {
                return;
            }
            reported.insert(uid.clone(), want.to_string());
        }
        let status = pod_status(&pod, i, want, exit_code, started);
        let _permit = self.limit.acquire().await;
        if let Err(e) = pods
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
        {
            self.reported.lock().await.remove(&uid);
            tracing::debug!(pod = %format!("{ns}/{name}"), error = %e, "status not written");
        }
    }
}

/// The status a hollow node reports for a pod: Running and Ready, or finished.
fn pod_status(pod: &Pod, node: usize, phase: &str, exit_code: i32, started: i64) -> Value {
    let now = now();
    let start = chrono::DateTime::from_timestamp(started, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| now.clone());
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let running = phase == "Running";
    let cond = |t: &str, s: bool| json!({"type": t, "status": if s { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now});
    let state = |_: &str| {
        if running {
            json!({"running": {"startedAt": start}})
        } else {
            json!({"terminated": {"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" },
                                  "startedAt": start, "finishedAt": now, "containerID": format!("hollow://{uid}")}})
        }
    };
    let statuses: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": format!("hollow://{}", c.image.clone().unwrap_or_default()),
                   "containerID": format!("hollow://{uid}/{}", c.name), "ready": running, "started": running,
                   "restartCount": 0, "state": state(&c.name)})
        })
        .collect();
    let inits: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": format!("hollow://{}", c.image.clone().unwrap_or_default()),
                   "containerID": format!("hollow://{uid}/{}", c.name), "ready": true, "restartCount": 0,
                   "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": start, "finishedAt": start}}})
        })
        .collect();
    let host_ip = address(node).to_string();
    let n = u32::from(address(node))
        ^ (u32::from_le_bytes(
            uid.as_bytes()
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 4]),
        ) & 0xff);
    let pod_ip = Ipv4Addr::new(
        10,
        200 + ((n >> 16) & 0x3f) as u8,
        (n >> 8) as u8,
        (n & 0xff) as u8,
    )
    .to_string();
    json!({
        "phase": phase,
        "conditions": [cond("PodReadyToStartContainers", running), cond("Initialized", true),
                       cond("ContainersReady", running), cond("Ready", running), cond("PodScheduled", true)],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": start,
        "containerStatuses": statuses,
        "initContainerStatuses": inits,
    })
}

/// The kubelet endpoints' listeners, one per node on 127.0.0.1, and their ports.
async fn kubelet_listeners(count: usize) -> std::io::Result<(Vec<tokio::net::TcpListener>, Vec<u16>)> {
    let mut listeners = Vec::with_capacity(count);
    let mut ports = Vec::with_capacity(count);
    for _ in 0..count {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        ports.push(l.local_addr()?.port());
        listeners.push(l);
    }
    Ok((listeners, ports))
}

/// Serves node `i`'s kubelet endpoint on `listener` (with the certificates of [`certs`]).
fn serve_kubelet(
    fleet: Arc<Fleet>,
    i: usize,
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let limits = transport::server::Limits {
        max_connections: 64,
        ..transport::server::Limits::default()
    };
    tokio::spawn(async move {
        let serve = transport::server::serve(listener, tls, limits, move |_peer, req| {
            let fleet = fleet.clone();
            async move {
                let (status, ct, body) = fleet.answer(i, req.method(), req.uri().path());
                let mut resp = hyper::Response::new(transport::body::full(body));
                *resp.status_mut() = status;
                resp.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(ct),
                );
                resp
            }
        });
        match serve.await {}
    });
}

/// Runs the hollow nodes until the process is killed.
pub async fn run(args: HollowArgs) -> anyhow::Result<()> {
    if args.count > 65_536 {
        return Err(HollowError::TooMany.into());
    }
    let labels = parse_labels(&args.labels)?;
    let taints = parse_taints(&args.taints)?;
    crate::rlimit::raise_open_files_limit();
    let client = transport::kubeapi::from_kubeconfig(&args.kubeconfig, USER_AGENT).await?;
    let certs = Arc::new(certs::ServingCerts::self_signed()?);
    let tls = Arc::new(transport::tls::server_config_with(certs.clone(), None)?);
    let (listeners, kubelet_ports) = kubelet_listeners(args.count).await?;
    let names = (0..args.count)
        .map(|i| format!("{}-{i}", args.name_prefix))
        .collect();
    let fleet = Arc::new(Fleet {
        client: client.clone(),
        limit: Arc::new(Semaphore::new(args.parallel.max(1))),
        args: args.clone(),
        labels,
        taints,
        names,
        kubelet_ports,
        reported: Mutex::new(HashMap::new()),
        running: std::sync::Mutex::new(HashMap::new()),
    });
    for (i, listener) in listeners.into_iter().enumerate() {
        serve_kubelet(fleet.clone(), i, listener, tls.clone());
    }
    // Register every node (in parallel, bounded), then heartbeat.
    let mut tasks = Vec::new();
    for i in 0..args.count {
        let f = fleet.clone();
        tasks.push(tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                match f.register(i).await.and(f.renew(i).await) {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(node = %f.names[i], error = %e, "registration failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(7));
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Err(e) = certs::obtain(&client, &fleet.names, &certs).await {
        tracing::warn!(error = %e, "no serving certificates: the API server will not reach these nodes' endpoints");
        eprintln!(
            "hollow-nodes: no serving certificates ({e}); logs, exec and metrics will not reach these nodes"
        );
    }
    println!(
        "hollow-nodes: {} nodes registered ({}-0..)",
        args.count, args.name_prefix
    );
    tracing::info!(count = args.count, prefix = %args.name_prefix, "hollow nodes registered");
    // Leases every quarter of their duration (10 s by default), node status every 30 renewals
    // (5 min), each spread over the period. Registration has just posted the status, so the
    // first status report is due a report period later (the kubelet's
    // nodeStatusReportFrequency), not in the first lease round.
    let lease_fleet = fleet.clone();
    tokio::spawn(async move {
        let n = lease_fleet.names.len().max(1);
        let period =
            Duration::from_millis(u64::from(lease_fleet.args.node_lease_duration_seconds.max(1)) * 250);
        let mut tick = tokio::time::interval(period / n as u32);
        let mut i = 0usize;
        let mut status_round = 0u64;
        loop {
            tick.tick().await;
            let f = lease_fleet.clone();
            let idx = i;
            let status_due = status_round > 0 && status_round.is_multiple_of(30);
            tokio::spawn(async move {
                if let Err(e) = f.renew(idx).await {
                    tracing::debug!(node = %f.names[idx], error = %e, "lease renewal failed");
                }
                if status_due && let Err(e) = f.post_status(idx).await {
                    tracing::debug!(node = %f.names[idx], error = %e, "node status update failed");
                }
            });
            i += 1;
            if i == n {
                i = 0;
                status_round += 1;
            }
        }
    });
    // One watch for all pods; those bound to our nodes are reported.
    let pods: kube::Api<Pod> = kube::Api::all(client);
    let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                fleet.track(&p, false);
                let bound_here = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .and_then(|n| fleet.index_of(n))
                    .is_some();
                if bound_here {
                    tokio::spawn(fleet.clone().sync_pod(p));
                }
            }
            Ok(watcher::Event::Delete(p)) => {
                fleet.track(&p, true);
                if let Some(uid) = p.metadata.uid {
                    fleet.reported.lock().await.remove(&uid);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "pod watch error"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_and_taints_as_the_kubelet_flags() {
        let l = parse_labels("zone=a, tier=web").expect("labels");
        assert_eq!(l.get("zone").map(String::as_str), Some("a"));
        assert!(parse_labels("novalue").is_err());
        let t = parse_taints("dedicated=backend:NoSchedule,gpu:PreferNoSchedule").expect("taints");
        assert_eq!(
            t[0],
            json!({"key": "dedicated", "value": "backend", "effect": "NoSchedule"})
        );
        assert_eq!(t[1], json!({"key": "gpu", "effect": "PreferNoSchedule"}));
        assert!(parse_taints("k=v:Sometimes").is_err());
        assert!(parse_taints(":NoSchedule").is_err());
    }

    #[test]
    fn addresses_stay_on_loopback() {
        assert_eq!(address(0), Ipv4Addr::new(127, 1, 0, 0));
        assert_eq!(address(4999), Ipv4Addr::new(127, 1, 19, 135));
        assert!(address(65_535).is_loopback());
    }
}
