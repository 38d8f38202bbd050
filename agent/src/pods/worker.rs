//! One pod's worker: observes the pod (from the watch) and its sandbox and containers (from the
//! runtime snapshot), asks [`plan`] what to do, does it through the runtime, and writes the
//! status [`pod_status`] computes when it changed. It ends when the pod is gone: deleted by its
//! owner (stopped within the grace period, then deleted for good) or removed from the API.
//!
//! On its first look the worker adopts what the runtime already runs for the pod (the agent
//! restarted): the ready sandbox with the highest attempt and the newest instance of each
//! container in it, restart counts from the log files and the API, so nothing is restarted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerStatus as ApiContainerStatus, Pod, PodSpec, PodStatus, Secret, Service,
    Volume,
};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use runtime_api::{Client, ClientError, ContainerConfig, ContainerStatus, SandboxStatus, State};
use tokio::sync::{mpsc, watch};

use super::backoff::Backoff;
use super::container::{self, NodeFacts, StartError};
use super::dns;
use super::env::{self, EnvError, Source};
use super::events::{self, Event};
use super::eviction::{self, PodFailure};
use super::hooks::{self, Hook};
use super::plan::{self, Failure, Instance, Observed, Run, Sandbox, Step, Terminated};
use super::probe::{self, Kind, Prober, Timing};
use super::shutdown;
use super::status::{self, pod_label};
use super::volumes::{self, MountError, TokenWanted, VolumeError};

/// The runtime's view of every sandbox and container, taken at `taken`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken: Instant,
    pub sandboxes: Vec<SandboxStatus>,
    /// By container id.
    pub containers: BTreeMap<String, ContainerStatus>,
}

/// What every worker shares.
pub struct Ctx {
    pub client: kube::Client,
    pub node: NodeFacts,
    /// This node's Node object as last read, and when (admission reads it for each new pod).
    pub node_object: std::sync::Mutex<Option<(Instant, Arc<k8s_openapi::api::core::v1::Node>)>>,
    /// Posts the workers' events in the background.
    pub events: events::Recorder,
    /// The cluster's Services, kept by a watch (for the service environment variables).
    pub services: kube::runtime::reflector::Store<Service>,
}

/// How long a read of the Node object serves admission.
const NODE_OBJECT_TTL: Duration = Duration::from_secs(5);

impl Ctx {
    /// This node's Node object, read from the API at most every [`NODE_OBJECT_TTL`] (a burst
    /// of new pods, e.g. after a reboot, reads it once).
    pub async fn node_object(&self) -> Result<Arc<k8s_openapi::api::core::v1::Node>, kube::Error> {
        let cached = self.node_object.lock().ok().and_then(|c| c.clone());
        if let Some((at, node)) = cached
            && at.elapsed() < NODE_OBJECT_TTL
        {
            return Ok(node);
        }
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.client.clone());
        let node = Arc::new(api.get(&self.node.node).await?);
        if let Ok(mut c) = self.node_object.lock() {
            *c = Some((Instant::now(), node.clone()));
        }
        Ok(node)
    }
}

/// A connection to the node's runtime; see [`connection`].
pub fn runtime() -> Result<RuntimeConn, ClientError> {
    connection(Path::new(runtime_api::SOCKET))
}

/// Idle connections to runtime sockets, by socket path.
static IDLE: std::sync::Mutex<Vec<(std::path::PathBuf, std::os::unix::net::UnixStream)>> =
    std::sync::Mutex::new(Vec::new());

/// At most this many idle connections are kept.
const MAX_IDLE: usize = 8;

/// A connection to the runtime at `path`: an idle one if there is one still open, else a new
/// one. It goes back to the idle ones when dropped, if every request on it had its whole
/// reply. A pod step, a relist or a probe each connected anew before; in `bench pods` (30 pods
/// at once) a sampling profiler put ~8% of the agent's CPU in `connect` alone, and the runtime
/// accepted and closed as many.
pub fn connection(path: &Path) -> Result<RuntimeConn, ClientError> {
    let take_idle = || {
        let mut idle = IDLE.lock().ok()?;
        let i = idle.iter().rposition(|(p, _)| p == path)?;
        Some(idle.swap_remove(i).1)
    };
    while let Some(stream) = take_idle() {
        let client = Client::from_stream(stream);
        // One the runtime closed meanwhile (it restarted) is dropped.
        if client.reusable() {
            return Ok(RuntimeConn {
                client,
                path: path.into(),
            });
        }
    }
    Ok(RuntimeConn {
        client: Client::connect(path)?,
        path: path.into(),
    })
}

/// A runtime connection from [`connection`]; a [`Client`] through `Deref`.
#[derive(Debug)]
pub struct RuntimeConn {
    client: Client,
    path: std::path::PathBuf,
}

impl std::ops::Deref for RuntimeConn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::DerefMut for RuntimeConn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

impl Drop for RuntimeConn {
    fn drop(&mut self) {
        if !self.client.reusable() {
            return;
        }
        if let Ok(stream) = self.client.try_clone_stream()
            && let Ok(mut idle) = IDLE.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push((std::mem::take(&mut self.path), stream));
        }
    }
}

/// Runs `f` on the blocking pool (runtime calls block).
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

fn system_time(rfc3339: Option<&str>) -> Option<SystemTime> {
    let secs = kcore::time::parse_rfc3339(rfc3339?)?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// A runtime container as the planner sees it.
pub fn run_of(st: &ContainerStatus) -> Run {
    match st.state {
        State::Created => Run::Created,
        State::Running => Run::Running {
            started: system_time(st.started_at.as_deref()).unwrap_or_else(SystemTime::now),
        },
        State::Exited | State::Unknown => Run::Exited(Terminated {
            id: st.id.clone(),
            exit_code: st.exit_code.unwrap_or(255),
            signal: st.signal,
            reason: st.reason.clone().unwrap_or_else(|| {
                if st.state == State::Unknown {
                    "Unknown".into()
                } else if st.exit_code == Some(0) {
                    "Completed".into()
                } else {
                    "Error".into()
                }
            }),
            started: system_time(st.started_at.as_deref()),
            finished: system_time(st.finished_at.as_deref()).unwrap_or_else(SystemTime::now),
        }),
    }
}

fn instance(st: &ContainerStatus) -> Instance {
    Instance {
        id: st.id.clone(),
        image_id: st.image.clone(),
        run: run_of(st),
    }
}

/// The restart number in a log path (`.../<name>/<restarts>.log`).
fn log_index(st: &ContainerStatus) -> Option<u32> {
    st.log_path.as_ref()?.file_stem()?.to_str()?.parse().ok()
}

/// A terminated state the API shows, back as the planner's.
fn api_terminated(s: &ApiContainerStatus, now: SystemTime) -> Option<Terminated> {
    let t = s.last_state.as_ref()?.terminated.as_ref()?;
    Some(Terminated {
        id: t
            .container_id
            .as_deref()
            .and_then(|id| id.strip_prefix(status::CONTAINER_ID_PREFIX))
            .unwrap_or_default()
            .to_string(),
        exit_code: t.exit_code,
        signal: t.signal,
        reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
        started: t.started_at.as_ref().map(|t| t.0.into()),
        finished: t.finished_at.as_ref().map_or(now, |t| t.0.into()),
    })
}

/// The pod's `terminationGracePeriodSeconds` (30 by default).
fn pod_grace(pod: &Pod) -> u64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .map_or(30, |g| u64::try_from(g).unwrap_or(0))
}

/// Container `name` of the pod's spec: an init, main or ephemeral container.
fn spec_container(pod: &Pod, name: &str) -> Option<Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == name)
        .cloned()
        .or_else(|| {
            spec.ephemeral_containers
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .map(plan::ephemeral_as_container)
        })
}

/// The container an ephemeral container `name` shares its process namespace with, if any.
fn ephemeral_target(pod: &Pod, name: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .ephemeral_containers
        .iter()
        .flatten()
        .find(|e| e.name == name)?
        .target_container_name
        .clone()
        .filter(|t| !t.is_empty())
}

fn all_statuses(status: Option<&PodStatus>) -> impl Iterator<Item = &ApiContainerStatus> {
    status.into_iter().flat_map(|s| {
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
            .chain(s.ephemeral_container_statuses.iter().flatten())
    })
}

pub struct Worker {
    ctx: Arc<Ctx>,
    uid: String,
    pod_rx: watch::Receiver<Option<Arc<Pod>>>,
    /// Node shutdown's request to stop the pod.
    kill_rx: mpsc::Receiver<shutdown::Kill>,
    snap_rx: watch::Receiver<Option<Arc<Snapshot>>>,
    obs: Observed,
    /// When `obs` last changed from a runtime reply (older snapshots do not overwrite it).
    replied: Instant,
    adopted: bool,
    sandbox_backoff: Backoff,
    /// Instances whose CrashLoopBackOff was announced (one `BackOff` event each).
    announced: BTreeSet<String>,
    written: Option<PodStatus>,
    /// The pod's volumes by name (what to bind mount), once set up.
    volumes: Option<BTreeMap<String, std::path::PathBuf>>,
    /// When the volumes were last set up or refreshed, successfully or not.
    volumes_at: Option<Instant>,
    /// Service account tokens the volumes hold, with when they were issued.
    tokens: BTreeMap<TokenWanted, (String, SystemTime)>,
    /// When local storage was last measured.
    storage_at: Option<Instant>,
}

/// How often ConfigMap, Secret and downward API volumes are brought up to date.
const VOLUME_REFRESH: Duration = Duration::from_secs(60);

impl Worker {
    pub fn new(
        ctx: Arc<Ctx>,
        uid: String,
        pod_rx: watch::Receiver<Option<Arc<Pod>>>,
        kill_rx: mpsc::Receiver<shutdown::Kill>,
        snap_rx: watch::Receiver<Option<Arc<Snapshot>>>,
    ) -> Self {
        Worker {
            ctx,
            uid,
            pod_rx,
            kill_rx,
            snap_rx,
            obs: Observed::default(),
            replied: Instant::now(),
            adopted: false,
            sandbox_backoff: Backoff::default(),
            announced: BTreeSet::new(),
            written: None,
            volumes: None,
            volumes_at: None,
            tokens: BTreeMap::new(),
            storage_at: None,
        }
    }

    fn span(&self, pod: &Pod) -> tracing::Span {
        let m = &pod.metadata;
        tracing::info_span!(
            "pod",
            namespace = m.namespace.as_deref().unwrap_or_default(),
            name = m.name.as_deref().unwrap_or_default(),
            uid = %self.uid
        )
    }

    /// Works on the pod until it is gone.
    pub async fn run(mut self) {
        // The first snapshot, so that adoption sees what the runtime runs.
        while self.snap_rx.borrow_and_update().is_none() {
            if self.snap_rx.changed().await.is_err() {
                return;
            }
        }
        loop {
            let pod = self.pod_rx.borrow_and_update().clone();
            let Some(pod) = pod else {
                self.remove_everything().await;
                return;
            };
            let span = self.span(&pod);
            if pod.metadata.deletion_timestamp.is_some() {
                let done = async {
                    self.terminate(&pod).await;
                    self.delete(&pod).await;
                };
                tracing::Instrument::instrument(done, span).await;
                return;
            }
            let wake = tracing::Instrument::instrument(self.sync(&pod), span).await;
            let sleep = async {
                match wake {
                    Some(at) => {
                        let d = at.duration_since(SystemTime::now()).unwrap_or_default();
                        tokio::time::sleep(d).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = self.pod_rx.changed() => {
                    if changed.is_err() {
                        self.remove_everything().await;
                        return;
                    }
                }
                _ = self.snap_rx.changed() => {}
                () = sleep => {}
                Some(kill) = self.kill_rx.recv() => {
                    let span = self.span(&pod);
                    tracing::Instrument::instrument(self.kill(&pod, kill.failure), span).await;
                    let _ = kill.done.send(());
                }
            }
        }
    }

    /// One round: observe, act, write the status. Returns when to look again at the latest.
    async fn sync(&mut self, pod: &Pod) -> Option<SystemTime> {
        self.observe(pod);
        let now = SystemTime::now();
        let mut wake = self.check_failure(pod, now).await;
        let node_ip = self.ctx.node.node_ip.clone();
        let mut st = status::pod_status(pod, &self.obs, node_ip.as_deref(), now);
        let terminal = matches!(st.phase.as_deref(), Some("Succeeded" | "Failed"));
        // Volumes are brought up to date every VOLUME_REFRESH, and taken over (tokens
        // renewed) when the agent adopted a running pod.
        let sandbox_ready = self.obs.sandbox.as_ref().is_some_and(|s| s.ready);
        let due = self.volumes_at.is_none_or(|at| at.elapsed() >= VOLUME_REFRESH);
        let refresh = due
            && (self.volumes.is_some()
                || sandbox_ready && self.obs.containers.values().any(|c| c.current.is_some()));
        if !terminal
            && refresh
            && let Err(e) = self.set_up_volumes(pod).await
        {
            tracing::debug!(error = %e, "volume refresh failed");
        }
        if terminal {
            // Written once its containers are stopped: a pod is never reported terminal while
            // it may still run (the kubelet's mergePodStatus).
            if self.stop_running(pod).await {
                st = status::pod_status(pod, &self.obs, node_ip.as_deref(), SystemTime::now());
            }
        } else if let Some(spec) = pod.spec.as_ref() {
            let p = plan::plan(spec, &self.obs, now);
            if let Some(at) = p.wake {
                wake = plan::earliest(wake, at);
            }
            self.announce_backoffs(pod, now).await;
            let acted = !p.steps.is_empty();
            for step in p.steps {
                if let Some(at) = self.execute(pod, step).await {
                    wake = plan::earliest(wake, at);
                }
            }
            let (probed, next_probe) = self.probe(pod, &Kind::ALL).await;
            if let Some(at) = next_probe {
                wake = plan::earliest(wake, at);
            }
            if acted || probed {
                st = status::pod_status(pod, &self.obs, node_ip.as_deref(), SystemTime::now());
            }
        }
        self.write_status(pod, st).await;
        wake
    }

    /// Fails and stops the pod on the node's own account (node shutdown): its containers get
    /// the failure's grace period, then the pod is written `Failed`.
    async fn kill(&mut self, pod: &Pod, failure: PodFailure) {
        if super::terminal(pod) || self.obs.failed.is_some() {
            // Ended already, or being stopped for another reason.
            return;
        }
        tracing::info!(reason = failure.reason, grace_s = ?failure.grace, "the node stops the pod");
        self.obs.failed = Some(failure);
        self.sync(pod).await;
    }

    /// Fails the pod when the node must: past its `activeDeadlineSeconds`, or over a
    /// local-storage limit (measured every [`eviction::STORAGE_CHECK`]). Returns when to look
    /// again.
    async fn check_failure(&mut self, pod: &Pod, now: SystemTime) -> Option<SystemTime> {
        let spec = pod.spec.as_ref()?;
        let status = pod.status.as_ref();
        if self.obs.failed.is_some() || super::terminal(pod) {
            return None;
        }
        let start = status
            .and_then(|s| s.start_time.as_ref())
            .map(|t| SystemTime::from(t.0));
        let mut failure = eviction::deadline_failure(spec, start, now);
        let mut wake = eviction::active_deadline(spec, start);
        if failure.is_none() && eviction::watches_local_storage(spec) {
            wake = plan::earliest(wake, now + eviction::STORAGE_CHECK);
            if self
                .storage_at
                .is_none_or(|at| at.elapsed() >= eviction::STORAGE_CHECK)
            {
                self.storage_at = Some(Instant::now());
                if let Some(usage) = self.storage_usage(spec).await {
                    failure = eviction::local_storage_failure(spec, &usage);
                }
            }
        }
        let Some(f) = failure else {
            return wake;
        };
        tracing::info!(reason = f.reason, message = %f.message, "the node fails the pod");
        let warning = f.reason == eviction::EVICTED_REASON;
        let ev = Event::pod(f.reason, warning, f.message.clone());
        self.ctx.events.pod(pod, vec![ev]);
        self.obs.failed = Some(f);
        None
    }

    /// The pod's use of the node's disk: its running containers' writable layers and logs (from
    /// the runtime), its disk-backed emptyDirs (measured here). None when it cannot be told.
    async fn storage_usage(&self, spec: &PodSpec) -> Option<eviction::StorageUsage> {
        let sandbox = self.obs.sandbox.as_ref().filter(|s| s.ready)?.id.clone();
        let stats = blocking(move || runtime().and_then(|mut rt| rt.pod_stats(&sandbox, true)))
            .await?
            .ok()?;
        let mut usage = eviction::StorageUsage::default();
        for c in stats.containers {
            let used = c.writable_layer_bytes.unwrap_or(0) + c.logs_bytes.unwrap_or(0);
            *usage.containers.entry(c.name).or_default() += used;
        }
        let volumes = self.volumes.as_ref();
        let dirs: Vec<(String, std::path::PathBuf)> = eviction::disk_empty_dirs(spec)
            .filter_map(|(name, _)| Some((name.to_string(), volumes?.get(name)?.clone())))
            .collect();
        usage.empty_dirs = blocking(move || {
            dirs.into_iter()
                .map(|(name, dir)| (name, kcore::summary::disk_usage(&dir)))
                .collect::<BTreeMap<String, u64>>()
        })
        .await?;
        Some(usage)
    }

    /// Brings `obs` up to the latest runtime snapshot (adopting on the first look).
    fn observe(&mut self, pod: &Pod) {
        let Some(snap) = self.snap_rx.borrow().clone() else {
            return;
        };
        if !self.adopted {
            self.adopted = true;
            self.adopt(pod, &snap);
            return;
        }
        if snap.taken < self.replied {
            return;
        }
        if let Some(sb) = self.obs.sandbox.as_mut() {
            match snap.sandboxes.iter().find(|s| s.id == sb.id) {
                Some(s) => {
                    sb.ready = s.ready;
                    if s.ip.is_some() {
                        sb.ip = s.ip.clone();
                    }
                }
                None => sb.ready = false,
            }
        }
        for c in self.obs.containers.values_mut() {
            let Some(cur) = c.current.as_mut() else { continue };
            match snap.containers.get(&cur.id) {
                Some(st) => cur.run = run_of(st),
                None => {
                    // Gone from the runtime: it ran; the next start is a restart.
                    c.restarts = c.restarts.max(1);
                    c.current = None;
                    c.probes.clear();
                }
            }
        }
    }

    /// Takes over what the runtime runs for this pod, and the counts the API shows.
    fn adopt(&mut self, pod: &Pod, snap: &Snapshot) {
        let now = SystemTime::now();
        let api = pod.status.as_ref();
        let sandbox = snap
            .sandboxes
            .iter()
            .filter(|s| s.uid == self.uid && s.ready)
            .max_by_key(|s| s.attempt);
        for s in all_statuses(api) {
            let c = self.obs.containers.entry(s.name.clone()).or_default();
            c.restarts = u32::try_from(s.restart_count).unwrap_or(0);
            c.last = api_terminated(s, now);
        }
        let Some(sb) = sandbox else {
            // Nothing running (a new pod, or the node rebooted): containers that ran before
            // start again as restarts, as the kubelet restarts them after a reboot.
            for s in all_statuses(api) {
                let ran = s
                    .state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some());
                if ran && let Some(c) = self.obs.containers.get_mut(&s.name) {
                    c.restarts = c.restarts.max(1);
                    if c.last.is_none() {
                        c.last = s
                            .state
                            .as_ref()
                            .and_then(|st| st.terminated.as_ref())
                            .map(|t| Terminated {
                                id: String::new(),
                                exit_code: t.exit_code,
                                signal: t.signal,
                                reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
                                started: t.started_at.as_ref().map(|t| t.0.into()),
                                finished: t.finished_at.as_ref().map_or(now, |t| t.0.into()),
                            });
                    }
                }
            }
            return;
        };
        self.obs.sandbox = Some(Sandbox {
            id: sb.id.clone(),
            attempt: sb.attempt,
            ready: true,
            ip: sb.ip.clone(),
        });
        let mut newest: BTreeMap<&str, &ContainerStatus> = BTreeMap::new();
        for st in snap.containers.values().filter(|c| c.sandbox_id == sb.id) {
            let keep = newest
                .get(st.name.as_str())
                .is_none_or(|n| st.created_at > n.created_at);
            if keep {
                newest.insert(&st.name, st);
            }
        }
        for (name, st) in newest {
            let c = self.obs.containers.entry(name.to_string()).or_default();
            c.restarts = c.restarts.max(log_index(st).unwrap_or(0));
            c.current = Some(instance(st));
            // The probes' conclusions the API shows for this very instance are kept, so a
            // restart of the agent does not make ready pods unready.
            let shown = all_statuses(api).find(|s| {
                s.name == name
                    && s.container_id.as_deref() == Some(&format!("{}{}", status::CONTAINER_ID_PREFIX, st.id))
            });
            if let Some(shown) = shown {
                if shown.started == Some(true) {
                    c.probes.insert(Kind::Startup, Prober::concluded(true));
                }
                if shown.ready {
                    c.probes.insert(Kind::Readiness, Prober::concluded(true));
                }
            }
        }
        tracing::info!(sandbox = %sb.id, attempt = sb.attempt, containers = self.obs.containers.len(), "adopted the pod from the runtime");
    }

    /// Carries out one step; returns when to retry if it failed.
    async fn execute(&mut self, pod: &Pod, step: Step) -> Option<SystemTime> {
        match step {
            Step::RunSandbox { attempt, changed } => self.run_sandbox(pod, attempt, changed).await,
            Step::Start { name } => self.start(pod, &name).await,
            Step::KillPod => {
                self.stop_running(pod).await;
                None
            }
        }
    }

    async fn run_sandbox(&mut self, pod: &Pod, attempt: u32, changed: bool) -> Option<SystemTime> {
        let now = SystemTime::now();
        if let Some(at) = self.sandbox_backoff.retry_at().filter(|at| *at > now) {
            return Some(at);
        }
        if changed {
            let ev = Event::pod(
                "SandboxChanged",
                false,
                "Pod sandbox changed, it will be killed and re-created.".into(),
            );
            self.ctx.events.pod(pod, vec![ev]);
        }
        let old = self.sandbox_ids();
        let node_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let (dns, warnings) = dns::pod_dns(pod, &dns::parse_resolv_conf(&node_resolv));
        if warnings.iter().any(|(reason, _)| *reason == "MissingClusterDNS") {
            // The kubelet warns about its node too (one event, counted, by the correlation).
            self.ctx
                .events
                .node("MissingClusterDNS", dns::MISSING_CLUSTER_DNS.into());
        }
        let warnings = warnings
            .into_iter()
            .map(|(reason, message)| Event::pod(reason, true, message))
            .collect();
        self.ctx.events.pod(pod, warnings);
        let config = match container::sandbox_config(pod, attempt, dns) {
            Ok(c) => c,
            Err(e) => return self.sandbox_failed(pod, now, &e),
        };
        let result = blocking(move || {
            let mut rt = runtime()?;
            for id in old {
                if let Err(e) = rt.remove_sandbox(&id) {
                    tracing::debug!(sandbox = %id, error = %e, "removing the old sandbox");
                }
            }
            rt.run_sandbox(config)
        })
        .await?;
        self.replied = Instant::now();
        match result {
            Ok(sb) => {
                tracing::info!(sandbox = %sb.id, attempt, ip = ?sb.ip, "sandbox running");
                self.sandbox_backoff = Backoff::default();
                self.obs.sandbox = Some(Sandbox {
                    id: sb.id,
                    attempt: sb.attempt,
                    ready: true,
                    ip: sb.ip,
                });
                for c in self.obs.containers.values_mut() {
                    c.probes.clear();
                    if let Some(Run::Exited(t)) = c.current.take().map(|i| i.run) {
                        c.last = Some(t);
                    }
                }
                None
            }
            Err(e) => self.sandbox_failed(pod, now, &e),
        }
    }

    /// A sandbox that could not be made: the kubelet's event, and the next try after a back-off.
    fn sandbox_failed(
        &mut self,
        pod: &Pod,
        now: SystemTime,
        e: &dyn std::fmt::Display,
    ) -> Option<SystemTime> {
        tracing::warn!(error = %e, "sandbox creation failed");
        let ev = Event::pod(
            "FailedCreatePodSandBox",
            true,
            format!("Failed to create pod sandbox: {e}"),
        );
        self.ctx.events.pod(pod, vec![ev]);
        self.sandbox_backoff.step(now, now);
        self.sandbox_backoff.retry_at()
    }

    /// Every sandbox the runtime holds for this pod (and the one the worker made).
    fn sandbox_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .snap_rx
            .borrow()
            .iter()
            .flat_map(|s| s.sandboxes.iter())
            .filter(|s| s.uid == self.uid)
            .map(|s| s.id.clone())
            .collect();
        if let Some(sb) = &self.obs.sandbox
            && !ids.contains(&sb.id)
        {
            ids.push(sb.id.clone());
        }
        ids
    }

    /// The pod's address (the node's for a pod on the node's network).
    fn pod_ip(&self, pod: &Pod) -> Option<String> {
        status::pod_ip(pod, &self.obs, self.ctx.node.node_ip.as_deref())
    }

    /// Pulls, creates and starts container `name` in the sandbox (a restart when it ran before).
    async fn start(&mut self, pod: &Pod, name: &str) -> Option<SystemTime> {
        let spec = spec_container(pod, name)?;
        let sandbox = self.obs.sandbox.clone()?;
        let now = SystemTime::now();
        let c = self.obs.containers.entry(name.to_string()).or_default();
        let restart = c.ever_ran();
        let old = c.current.clone();
        let restarts = if restart { c.restarts + 1 } else { c.restarts };
        let node = self.ctx.node.clone();
        let old_id = old.as_ref().map(|i| i.id.clone());
        if self.volumes.is_none()
            && let Err(e) = self.set_up_volumes(pod).await
        {
            let c = self.obs.containers.entry(name.to_string()).or_default();
            c.failure = Some(Failure {
                reason: "ContainerCreating".into(),
                message: e.to_string(),
            });
            c.start_backoff.step(now, now);
            return c.start_backoff.retry_at();
        }
        let dirs = self.volumes.clone().unwrap_or_default();
        // An ephemeral container with a target joins the target's running instance's pid
        // namespace.
        let target = match ephemeral_target(pod, name) {
            None => Ok(None),
            Some(t) => self
                .obs
                .containers
                .get(&t)
                .and_then(|c| c.current.as_ref())
                .filter(|i| matches!(i.run, Run::Running { .. }))
                .map(|i| Some(i.id.clone()))
                .ok_or(StartError::TargetNotRunning { name: t }),
        };
        let pod_ip = self.pod_ip(pod);
        let cfg = self
            .sources(pod, &spec)
            .await
            .and_then(|sources| env::resolve(pod, &spec, &sources, &node, pod_ip.as_deref()))
            .map_err(StartError::from)
            .and_then(|env| {
                let mut cfg = container::container_config(pod, &spec, restarts, &node, &env);
                cfg.mounts = volumes::mounts(&spec, &dirs)?;
                cfg.target_container_id = target?;
                Ok(cfg)
            });
        let result = blocking(move || {
            let mut events = Vec::new();
            let r = match cfg {
                Ok(cfg) => start_container(&spec, &sandbox.id, cfg, &node, old_id.as_deref(), &mut events),
                Err(e) => {
                    events.push(Event::warning("Failed", &spec.name, format!("Error: {e}")));
                    Err(e)
                }
            };
            (r, events)
        })
        .await;
        self.replied = Instant::now();
        let (result, evs) = result?;
        let c = self.obs.containers.entry(name.to_string()).or_default();
        let out = match result {
            Ok(st) => {
                if let Some(Instance {
                    run: Run::Exited(t), ..
                }) = old
                {
                    c.backoff.step(t.finished, now);
                    c.last = Some(t);
                }
                tracing::debug!(container = %name, restarts, "container started");
                c.restarts = restarts;
                c.current = Some(instance(&st));
                c.probes.clear();
                c.failure = None;
                c.start_backoff = Backoff::default();
                None
            }
            Err(e) => {
                tracing::warn!(container = %name, reason = e.reason(), error = %e, "container start failed");
                c.failure = Some(Failure {
                    reason: e.reason().into(),
                    message: e.to_string(),
                });
                c.start_backoff.step(now, now);
                c.start_backoff.retry_at()
            }
        };
        self.ctx.events.pod(pod, evs);
        if out.is_none() {
            self.post_start(pod, name).await;
        }
        out
    }

    /// Runs the container's postStart hook, if any (NODE-26); a failure kills the container,
    /// which then restarts per policy.
    async fn post_start(&mut self, pod: &Pod, name: &str) {
        let Some(spec) = spec_container(pod, name) else {
            return;
        };
        let Some(h) = Hook::PostStart.of(&spec) else {
            return;
        };
        let Some(id) = self
            .obs
            .containers
            .get(name)
            .and_then(|c| c.current.as_ref())
            .map(|i| i.id.clone())
        else {
            return;
        };
        let grace = pod_grace(pod);
        let pod_ip = self.pod_ip(pod);
        // The hook has no deadline of its own upstream; two minutes bound a hung one here.
        let r = hooks::run(h, &spec, &id, pod, pod_ip.as_deref(), Duration::from_secs(120)).await;
        if let Err(e) = r {
            tracing::warn!(container = %name, error = %e, "postStart hook failed");
            let ev = Event::warning(Hook::PostStart.failed_reason(), name, e.to_string());
            self.ctx.events.pod(pod, vec![ev]);
            let kill = vec![(name.to_string(), id, "FailedPostStartHook".to_string())];
            self.stop_with(pod, kill, grace, false).await;
        }
    }

    /// Runs the probes of `kinds` that are due (NODE-22..NODE-25); a failed liveness or startup
    /// probe stops the container (it restarts per policy). Returns whether a conclusion changed
    /// and when the next probe is due.
    async fn probe(&mut self, pod: &Pod, kinds: &[Kind]) -> (bool, Option<SystemTime>) {
        let (mut changed, mut next) = (false, None::<SystemTime>);
        let pod_ip = self.pod_ip(pod);
        let names: Vec<String> = self.obs.containers.keys().cloned().collect();
        for name in names {
            let Some(spec) = spec_container(pod, &name) else {
                continue;
            };
            for &kind in kinds {
                let Some(p) = kind.of(&spec).cloned() else {
                    continue;
                };
                let Some(c) = self.obs.containers.get_mut(&name) else {
                    break;
                };
                let Some(Instance {
                    id,
                    run: Run::Running { started },
                    ..
                }) = c.current.clone()
                else {
                    break;
                };
                // Startup runs until it succeeds; liveness and readiness only after that.
                if (kind == Kind::Startup) == c.started_and_ready(&spec).0 {
                    continue;
                }
                let t = Timing::of(&p);
                let due = c.probes.entry(kind).or_default().due(started, &t);
                let now = SystemTime::now();
                if due > now {
                    next = plan::earliest(next, due);
                    continue;
                }
                let outcome = probe::run(&p, &spec, &id, pod_ip.as_deref()).await;
                let now = SystemTime::now();
                let Some(c) = self.obs.containers.get_mut(&name) else {
                    break;
                };
                let prober = c.probes.entry(kind).or_default();
                let concluded = prober.record(outcome.is_ok(), now, &t);
                let due = prober.due(started, &t);
                next = plan::earliest(next, due);
                changed |= concluded.is_some();
                let mut evs = Vec::new();
                if let Err(msg) = &outcome {
                    tracing::debug!(container = %name, probe = kind.word(), message = %msg, "probe failed");
                    evs.push(Event::warning(
                        "Unhealthy",
                        &name,
                        format!("{} probe failed: {msg}", kind.word()),
                    ));
                }
                let kill = concluded == Some(false) && kind != Kind::Readiness;
                self.ctx.events.pod(pod, evs);
                if kill {
                    // The probe's own grace period first, then the pod's.
                    let grace = p
                        .termination_grace_period_seconds
                        .map_or_else(|| pod_grace(pod), |g| u64::try_from(g).unwrap_or(0));
                    let message = format!(
                        "Container {name} failed {} probe, will be restarted",
                        kind.word().to_lowercase()
                    );
                    self.stop_with(pod, vec![(name.clone(), id, message)], grace, false)
                        .await;
                    break;
                }
            }
        }
        (changed, next)
    }

    /// Takes the runtime's answer to a stop into `obs`.
    fn stopped(&mut self, name: &str, r: Option<Result<ContainerStatus, ClientError>>) {
        self.replied = Instant::now();
        match r {
            Some(Ok(st)) => {
                if let Some(c) = self.obs.containers.get_mut(name) {
                    c.current = Some(instance(&st));
                }
            }
            Some(Err(e)) => tracing::debug!(container = %name, error = %e, "stop"),
            None => {}
        }
    }

    /// The ConfigMaps and Secrets container `c` refers to, from the API (through the Node
    /// authorizer: a node reads only what its pods use).
    async fn sources(&self, pod: &Pod, c: &Container) -> Result<env::Sources, EnvError> {
        let (cms, secrets) = env::references(c);
        let mut sources = self.fetch(pod, cms, secrets).await?;
        sources.service_env = self.service_env(pod).await?;
        Ok(sources)
    }

    /// The pod's service environment variables: the Services of its namespace (with
    /// `enableServiceLinks`, the default) and `default/kubernetes`, read from the API.
    async fn service_env(&self, pod: &Pod) -> Result<BTreeMap<String, String>, EnvError> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let failed = |e: kube::Error| {
            tracing::warn!(error = %e, "listing services failed");
            EnvError::Services
        };
        // From the watch's cache once it has listed (the kubelet reads its informer too);
        // straight from the API before.
        if futures_util::FutureExt::now_or_never(self.ctx.services.wait_until_ready())
            .is_some_and(|r| r.is_ok())
        {
            let services: Vec<Service> = self
                .ctx
                .services
                .state()
                .iter()
                .filter(|s| {
                    let (sns, name) = (s.metadata.namespace.as_deref(), s.metadata.name.as_deref());
                    (links && sns == Some(ns)) || (sns == Some("default") && name == Some("kubernetes"))
                })
                .map(|s| Service::clone(s))
                .collect();
            return Ok(env::service_env(&services, ns, links));
        }
        let mut services = Vec::new();
        if links {
            let api: kube::Api<Service> = kube::Api::namespaced(self.ctx.client.clone(), ns);
            services = api.list(&Default::default()).await.map_err(failed)?.items;
            for s in &mut services {
                s.metadata.namespace = Some(ns.to_string());
            }
        }
        if !(links && ns == "default") {
            let api: kube::Api<Service> = kube::Api::namespaced(self.ctx.client.clone(), "default");
            if let Some(mut k) = api.get_opt("kubernetes").await.map_err(failed)? {
                k.metadata.namespace = Some("default".into());
                services.push(k);
            }
        }
        Ok(env::service_env(&services, ns, links))
    }

    /// ConfigMaps and Secrets of the pod's namespace by name (None for those that do not
    /// exist). Any other failure to read one is an error: an object that could not be read is
    /// not an object that does not exist (an optional one would be taken for absent and its
    /// volume emptied).
    async fn fetch(
        &self,
        pod: &Pod,
        cms: Vec<String>,
        secrets: Vec<String>,
    ) -> Result<env::Sources, EnvError> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut out = env::Sources::default();
        let failed = |of: Source, name: &str, e: kube::Error| {
            tracing::warn!(kind = of.kind(), %name, error = %e, "reading a pod's source failed");
            EnvError::Sync {
                of,
                reason: e.to_string(),
            }
        };
        let cm_api: kube::Api<ConfigMap> = kube::Api::namespaced(self.ctx.client.clone(), ns);
        for name in cms {
            let data = cm_api
                .get_opt(&name)
                .await
                .map_err(|e| failed(Source::ConfigMap, &name, e))?
                .map(|cm| cm.data.unwrap_or_default().into_iter().collect());
            out.config_maps.insert(name, data);
        }
        let secret_api: kube::Api<Secret> = kube::Api::namespaced(self.ctx.client.clone(), ns);
        for name in secrets {
            let data = secret_api
                .get_opt(&name)
                .await
                .map_err(|e| failed(Source::Secret, &name, e))?
                .map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect()
                });
            out.secrets.insert(name, data);
        }
        Ok(out)
    }

    /// Sets up (or brings up to date) every volume of the pod; the first failure is the
    /// kubelet's `FailedMount` event.
    async fn set_up_volumes(&mut self, pod: &Pod) -> Result<(), MountError> {
        self.volumes_at = Some(Instant::now());
        let (cms, secrets) = volumes::references(pod);
        let fetched = self.fetch(pod, cms, secrets).await;
        let empty = env::Sources::default();
        let sources = fetched.as_ref().unwrap_or(&empty);
        let pod_dir = volumes::pod_dir(std::path::Path::new(volumes::ROOT), &self.uid);
        let pod_ip = self.pod_ip(pod);
        let mut dirs = BTreeMap::new();
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            // A volume made from a source that could not be read is left as it is.
            let uses_sources = volumes::volume_references(v) != (Vec::new(), Vec::new());
            let unreadable = match &fetched {
                Err(EnvError::Sync { of, reason }) if uses_sources => Some(VolumeError::Sync {
                    of: *of,
                    reason: reason.clone(),
                }),
                _ => None,
            };
            let set_up = match unreadable {
                Some(e) => Err(e),
                None => match self.tokens_for(pod, v).await {
                    Ok(tokens) => volumes::files(pod, v, sources, &tokens, &self.ctx.node, pod_ip.as_deref())
                        .and_then(|content| volumes::set_up(&pod_dir, v, &content)),
                    Err(e) => Err(e),
                },
            };
            match set_up {
                Ok(dir) => {
                    dirs.insert(v.name.clone(), dir);
                }
                Err(source) => {
                    let e = MountError {
                        volume: v.name.clone(),
                        source,
                    };
                    tracing::warn!(error = %e, "volume set-up failed");
                    let ev = Event::pod("FailedMount", true, e.to_string());
                    self.ctx.events.pod(pod, vec![ev]);
                    return Err(e);
                }
            }
        }
        self.volumes = Some(dirs);
        Ok(())
    }

    /// The service account tokens volume `v` holds: kept ones until 80 % of their lifetime has
    /// passed (as the kubelet renews them), new ones from TokenRequest.
    async fn tokens_for(
        &mut self,
        pod: &Pod,
        v: &Volume,
    ) -> Result<BTreeMap<TokenWanted, String>, VolumeError> {
        let now = SystemTime::now();
        let mut out = BTreeMap::new();
        for want in volumes::tokens_wanted(v) {
            let lifetime = u64::try_from(want.expiration_seconds).unwrap_or(0);
            let fresh = self.tokens.get(&want).filter(|(_, issued)| {
                let age = now.duration_since(*issued).unwrap_or_default().as_secs();
                age.saturating_mul(10) < lifetime.saturating_mul(8)
            });
            let token = match fresh {
                Some((t, _)) => t.clone(),
                None => {
                    let t = self.request_token(pod, &want).await?;
                    self.tokens.insert(want.clone(), (t.clone(), now));
                    t
                }
            };
            out.insert(want, token);
        }
        Ok(out)
    }

    /// A token for the pod's service account, bound to the pod (TokenRequest).
    async fn request_token(&self, pod: &Pod, want: &TokenWanted) -> Result<String, VolumeError> {
        use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: want.audience.iter().cloned().collect(),
                expiration_seconds: Some(want.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: Some(self.uid.clone()),
                }),
            },
            ..TokenRequest::default()
        };
        let api: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(self.ctx.client.clone(), ns);
        let tr = api
            .create_token_request(&sa, &kube::api::PostParams::default(), &req)
            .await
            .map_err(VolumeError::Token)?;
        tr.status.map(|s| s.token).ok_or(VolumeError::EmptyToken)
    }

    /// One `BackOff` event per crashed instance that waits for its back-off.
    async fn announce_backoffs(&mut self, pod: &Pod, now: SystemTime) {
        let mut evs = Vec::new();
        for (name, c) in &self.obs.containers {
            let Some(Instance {
                id,
                run: Run::Exited(t),
                ..
            }) = &c.current
            else {
                continue;
            };
            if c.backoff.restart_at(t.finished) > now && self.announced.insert(id.clone()) {
                let policy = pod.spec.as_ref().map_or("Always", plan::restart_policy);
                let sidecar = spec_container(pod, name).is_some_and(|c| plan::is_sidecar(&c));
                let ephemeral = pod.spec.as_ref().is_some_and(|s| plan::is_ephemeral(s, name));
                if !ephemeral && (sidecar || plan::restarts_after(policy, t.exit_code)) {
                    evs.push(Event::warning(
                        "BackOff",
                        name,
                        format!(
                            "Back-off restarting failed container {name} in pod {}",
                            pod_label(pod)
                        ),
                    ));
                }
            }
        }
        if !evs.is_empty() {
            self.ctx.events.pod(pod, evs);
        }
    }

    /// Writes `status` when it differs from what the API holds and from the last write.
    async fn write_status(&mut self, pod: &Pod, status: PodStatus) {
        if pod.status.as_ref() == Some(&status) || self.written.as_ref() == Some(&status) {
            return;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let api: kube::Api<Pod> = kube::Api::namespaced(self.ctx.client.clone(), ns);
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        match api.patch_status(name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                tracing::debug!(phase = ?status.phase, "status written");
                self.written = Some(status);
            }
            Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "status update failed"),
        }
    }

    /// Stops containers that still run (a terminal pod's sidecars, a lost Never pod, a pod the
    /// node fails); returns whether there were any.
    async fn stop_running(&mut self, pod: &Pod) -> bool {
        let running = self.obs.running();
        if running.is_empty() {
            return false;
        }
        let grace = self
            .obs
            .failed
            .as_ref()
            .and_then(|f| f.grace)
            .unwrap_or_else(|| pod_grace(pod));
        self.stop(pod, running, grace).await;
        true
    }

    /// Stops `containers` (name, id) in parallel within `grace` seconds (at least 2: NODE-31).
    async fn stop(&mut self, pod: &Pod, containers: Vec<(String, String)>, grace: u64) {
        let stops = containers
            .into_iter()
            .map(|(name, id)| {
                let message = format!("Stopping container {name}");
                (name, id, message)
            })
            .collect();
        self.stop_with(pod, stops, grace, true).await;
    }

    /// Stops containers (name, id, `Killing` message) in parallel: each runs its preStop hook
    /// inside the grace period, then gets what is left of it, at least 2 s (NODE-27, NODE-31).
    /// While the pod terminates (`terminating`), readiness probes keep running until the
    /// containers have stopped, and the status follows them (NODE-25).
    async fn stop_with(
        &mut self,
        pod: &Pod,
        containers: Vec<(String, String, String)>,
        grace: u64,
        terminating: bool,
    ) {
        let evs = containers
            .iter()
            .map(|(n, _, message)| Event::normal("Killing", n, message.clone()))
            .collect();
        self.ctx.events.pod(pod, evs);
        let deadline = Instant::now() + Duration::from_secs(grace);
        let pod_ip = self.pod_ip(pod);
        let stops = containers.into_iter().map(|(name, id, _)| {
            let spec = spec_container(pod, &name);
            let pod_ip = pod_ip.clone();
            async move {
                let mut failed = None;
                if let Some(spec) = &spec
                    && let Some(h) = Hook::PreStop.of(spec)
                {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tracing::debug!(container = %name, left_ms = left.as_millis() as u64, "running the preStop hook");
                    if let Err(e) = hooks::run(h, spec, &id, pod, pod_ip.as_deref(), left).await {
                        tracing::warn!(container = %name, error = %e, "preStop hook failed");
                        failed = Some(e.to_string());
                    }
                }
                let timeout = deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs()
                    .max(2);
                let r = blocking(move || runtime().and_then(|mut rt| rt.stop_container(&id, timeout))).await;
                (name, r, failed)
            }
        });
        let all = futures_util::future::join_all(stops);
        let results = if terminating {
            self.probing_readiness(pod, all).await
        } else {
            all.await
        };
        let mut evs = Vec::new();
        for (name, r, failed) in results {
            if let Some(msg) = failed {
                evs.push(Event::warning(Hook::PreStop.failed_reason(), &name, msg));
            }
            self.stopped(&name, r);
        }
        if !evs.is_empty() {
            self.ctx.events.pod(pod, evs);
        }
    }

    /// Waits for `work` while running the readiness probes that fall due (liveness and startup
    /// are off during termination, NODE-25), writing the status when a conclusion changes.
    async fn probing_readiness<F: std::future::Future>(&mut self, pod: &Pod, work: F) -> F::Output {
        let mut work = std::pin::pin!(work);
        loop {
            let round = async {
                // Boxed: a probe may stop a container, which may probe (never with readiness
                // alone, but the types recurse all the same).
                let (changed, next) = Box::pin(self.probe(pod, &[Kind::Readiness])).await;
                if changed {
                    let node_ip = self.ctx.node.node_ip.clone();
                    let st = status::pod_status(pod, &self.obs, node_ip.as_deref(), SystemTime::now());
                    self.write_status(pod, st).await;
                }
                let wait = next
                    .and_then(|at| at.duration_since(SystemTime::now()).ok())
                    .unwrap_or(Duration::from_secs(1));
                tokio::time::sleep(wait).await;
            };
            tokio::select! {
                out = &mut work => return out,
                () = round => {}
            }
        }
    }

    /// Graceful termination (NODE-31): main containers in parallel within the grace period,
    /// then the sidecars, then the sandbox.
    async fn terminate(&mut self, pod: &Pod) {
        self.observe(pod);
        let started = Instant::now();
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .map_or_else(|| pod_grace(pod), |g| u64::try_from(g).unwrap_or(0));
        let sidecars: BTreeSet<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .filter(|c| plan::is_sidecar(c))
            .map(|c| c.name.as_str())
            .collect();
        let (side, mains): (Vec<_>, Vec<_>) = self
            .obs
            .running()
            .into_iter()
            .partition(|(n, _)| sidecars.contains(n.as_str()));
        tracing::debug!(grace_s = grace, "stopping the pod");
        if !mains.is_empty() {
            self.stop(pod, mains, grace).await;
        }
        if !side.is_empty() {
            let left = grace.saturating_sub(started.elapsed().as_secs());
            self.stop(pod, side, left).await;
        }
        self.remove_everything().await;
    }

    /// Removes every sandbox of the pod (its containers with it).
    async fn remove_everything(&mut self) {
        let ids = self.sandbox_ids();
        if !ids.is_empty() {
            blocking(move || {
                let Ok(mut rt) = runtime() else { return };
                for id in ids {
                    if let Err(e) = rt.remove_sandbox(&id) {
                        tracing::warn!(sandbox = %id, error = %e, "removing the sandbox failed");
                    }
                }
            })
            .await;
        }
        self.obs = Observed::default();
        let dir = volumes::pod_dir(std::path::Path::new(volumes::ROOT), &self.uid);
        if let Err(e) = volumes::remove_pod_dir(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "removing the pod's volumes failed");
        }
        self.volumes = None;
        self.volumes_at = None;
        if let Err(e) =
            crate::logs::remove_pod_logs(std::path::Path::new(crate::logs::PODS_LOG_ROOT), &self.uid)
        {
            tracing::warn!(error = %e, "removing the pod's logs failed");
        }
    }

    /// The final delete: grace 0 with a UID precondition (NODE-31 step 6).
    async fn delete(&self, pod: &Pod) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: kube::Api<Pod> = kube::Api::namespaced(self.ctx.client.clone(), ns);
        match api.delete(name, &params).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "pod deleted"),
            Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "final pod delete failed"),
        }
    }
}

/// Pull, create and start (blocking). The old instance, if any, is removed first.
fn start_container(
    c: &Container,
    sandbox_id: &str,
    cfg: ContainerConfig,
    node: &NodeFacts,
    old: Option<&str>,
    events: &mut Vec<Event>,
) -> Result<ContainerStatus, StartError> {
    let mut rt = runtime().map_err(StartError::RuntimeUnavailable)?;
    container::ensure_image(&mut rt, c, &node.insecure_registries, events)?;
    if let Some(old) = old
        && let Err(e) = rt.remove_container(old)
    {
        tracing::debug!(container = %old, error = %e, "removing the old instance");
    }
    let created = rt
        .create_container(sandbox_id, cfg)
        .map_err(StartError::CreateContainer)?;
    events.push(Event::normal("Created", &c.name, "Container created".into()));
    match rt.start_container(&created.id) {
        Ok(st) => {
            events.push(Event::normal("Started", &c.name, "Container started".into()));
            Ok(st)
        }
        Err(e) => {
            let _ = rt.remove_container(&created.id);
            events.push(Event::warning("Failed", &c.name, format!("Error: {e}")));
            Err(StartError::StartContainer(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    #[test]
    fn runtime_connections_are_kept_while_open_and_in_step() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("runtime.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let accepted = Arc::new(AtomicUsize::new(0));
        let (closed_tx, closed_rx) = mpsc::channel();
        let counted = accepted.clone();
        // A fake runtime answering `Version`: its first connection closes after two replies,
        // its second answers garbage, the others answer.
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().enumerate() {
                let Ok(conn) = conn else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let closed_tx = closed_tx.clone();
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().expect("clone");
                    let ok = serde_json::to_string(&runtime_api::Reply::Version { version: "1".into() })
                        .expect("reply");
                    for (i, line) in BufReader::new(conn).lines().enumerate() {
                        if line.is_err() {
                            break;
                        }
                        let reply = if n == 1 {
                            "not json".to_string()
                        } else {
                            ok.clone()
                        };
                        let _ = w.write_all(format!("{reply}\n").as_bytes());
                        if n == 0 && i == 1 {
                            break;
                        }
                    }
                    // Both descriptors of the connection are closed before the test goes on.
                    drop(w);
                    if n == 0 {
                        let _ = closed_tx.send(());
                    }
                });
            }
        });
        let version = || connection(&path).and_then(|mut rt| rt.version());
        assert_eq!(version().expect("first"), "1");
        assert_eq!(version().expect("second, same connection"), "1");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the idle connection was not reused"
        );
        // The runtime closed it while idle: not used again.
        closed_rx.recv().expect("closed");
        version().expect_err("the garbage reply of a new connection");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // A connection whose reply could not be read is not kept.
        assert_eq!(version().expect("a third connection"), "1");
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }
}
