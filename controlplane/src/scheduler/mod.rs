//! The scheduler (docs/SEEDS-SPEC.md §2, SCH-1..SCH-16): an API client that watches pods and
//! nodes, keeps a cache of what every node holds, pops pending pods from a priority queue, runs
//! one scheduling cycle per pod (filters, scores, preemption; pure functions in `framework`,
//! `plugins`, `preemption`), binds through `pods/binding`, and reports `Scheduled` /
//! `FailedScheduling` events and the `PodScheduled` condition through the API.
//!
//! It runs inside `controlplane serve` over the in-process transport (identity
//! `system:kube-scheduler`) and standalone against any API server (`controlplane scheduler
//! --kubeconfig F`); with leader election one instance schedules per cluster (Lease
//! `kube-system/kube-scheduler`). Pods naming another `schedulerName` are left alone; pods with
//! `schedulingGates` wait with `PodScheduled=False/SchedulingGated`.
//!
//! Bindings run concurrently (bounded); the pod is *assumed* on its node in the cache at once, so
//! the next cycle does not need to wait for the write.

pub mod cache;
pub mod framework;
pub mod plugins;
pub mod pod;
pub mod preemption;
pub mod queue;
pub(crate) mod strip;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kcore::labels::{labels_of, selector_matches};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};

use self::cache::{Cache, Nominations};
use self::framework::{CycleInput, FitError, schedule};
use self::pod::{DEFAULT_SCHEDULER, PodInfo};
use self::preemption::{Budget, Candidate, Outcome};
use self::queue::{ClusterEvent, SchedulingQueue};
use crate::events::{Kind, Recorder};
use crate::leader::{self, LeaseConfig, Scope};

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// The `schedulerName` it serves.
    pub name: String,
    /// 0: adaptive (docs/SEEDS-SPEC.md SCH-2).
    pub percentage_of_nodes_to_score: u32,
    /// Bindings in flight at once.
    pub parallel_binds: usize,
    pub leader_elect: bool,
    /// This instance's identity in the Lease and in events' `reportingInstance`.
    pub identity: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            name: DEFAULT_SCHEDULER.into(),
            percentage_of_nodes_to_score: 0,
            parallel_binds: 64,
            leader_elect: true,
            identity: leader::identity(),
        }
    }
}

/// Runs the scheduler for ever (as leader only, with leader election).
pub async fn run(client: kube::Client, cfg: SchedulerConfig) {
    if cfg.leader_elect {
        let lease = LeaseConfig::new("kube-scheduler", &cfg.identity);
        leader::run_as_leader(client.clone(), lease, move || {
            Scheduler::new(client.clone(), cfg.clone()).run()
        })
        .await;
    } else {
        Scheduler::new(client, cfg).run().await;
    }
}

/// What the main loop reacts to.
enum Input {
    Pod(Box<watcher::Event<Pod>>),
    Node(Box<watcher::Event<Node>>),
    Namespace(Box<watcher::Event<Namespace>>),
    /// A binding finished.
    Bound {
        uid: String,
        result: Result<(), kube::Error>,
    },
}

/// Auxiliary objects read through reflectors.
struct Stores {
    priority_classes: Store<PriorityClass>,
    budgets: Store<PodDisruptionBudget>,
    runtime_classes: Store<RuntimeClass>,
    services: Store<Service>,
    replica_sets: Store<ReplicaSet>,
    stateful_sets: Store<StatefulSet>,
}

fn reflect<K>(scope: &Scope, api: kube::Api<K>, strip: fn(&mut K)) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(strip),
    );
    scope.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(e) = stream.next().await {
            if let Err(e) = e {
                tracing::debug!(error = %e, "scheduler watch error");
            }
        }
    });
    reader
}

fn forward<K, F>(
    scope: &Scope,
    api: kube::Api<K>,
    cfg: watcher::Config,
    tx: mpsc::Sender<Input>,
    strip: fn(&mut K),
    wrap: F,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(watcher::Event<K>) -> Input + Send + 'static,
{
    scope.spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, cfg).default_backoff().modify(strip));
        while let Some(e) = stream.next().await {
            match e {
                Ok(ev) => {
                    if tx.send(wrap(ev)).await.is_err() {
                        return;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "scheduler watch error"),
            }
        }
    });
}

/// Tracks objects seen during a relist so that ones missing from it count as deleted.
#[derive(Debug, Default)]
struct Relist {
    listing: bool,
    seen: HashSet<String>,
    synced: bool,
}

impl Relist {
    fn init(&mut self) {
        self.listing = true;
        self.seen.clear();
    }
    fn saw(&mut self, key: &str) {
        if self.listing {
            self.seen.insert(key.to_string());
        }
    }
    fn done(&mut self) -> HashSet<String> {
        self.listing = false;
        self.synced = true;
        std::mem::take(&mut self.seen)
    }
}

struct Scheduler {
    client: kube::Client,
    cfg: SchedulerConfig,
    cache: Cache,
    queue: SchedulingQueue,
    nominations: Nominations,
    recorder: Arc<Recorder>,
    binds: Arc<Semaphore>,
    next_start: usize,
    rng: u64,
    pods_relist: Relist,
    nodes_relist: Relist,
    ns_relist: Relist,
    /// Pods waiting on scheduling gates (their condition is written once).
    gated: HashSet<String>,
}

/// Cycles run back to back before the loop yields to the other tasks (the API handler among
/// them: in process they share two cores).
const CYCLES_PER_TURN: usize = 16;

impl Scheduler {
    fn new(client: kube::Client, cfg: SchedulerConfig) -> Self {
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        Self {
            recorder: Arc::new(Recorder::new(client.clone(), &cfg.name, &cfg.identity)),
            binds: Arc::new(Semaphore::new(cfg.parallel_binds.max(1))),
            client,
            cfg,
            cache: Cache::default(),
            queue: SchedulingQueue::default(),
            nominations: Nominations::default(),
            next_start: 0,
            rng: u64::from_le_bytes(seed) | 1,
            pods_relist: Relist::default(),
            nodes_relist: Relist::default(),
            ns_relist: Relist::default(),
            gated: HashSet::new(),
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: only the tie-break needs randomness.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    async fn run(mut self) {
        let (tx, mut rx) = mpsc::channel::<Input>(4096);
        // The watches stop with this future (leadership lost).
        let scope = Scope::default();
        let c = &self.client;
        // Finished pods hold no resources: upstream's scheduler watches the same set.
        let pods_cfg = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        forward(
            &scope,
            kube::Api::<Pod>::all(c.clone()),
            pods_cfg,
            tx.clone(),
            strip::pod,
            |e| Input::Pod(Box::new(e)),
        );
        forward(
            &scope,
            kube::Api::<Node>::all(c.clone()),
            watcher::Config::default(),
            tx.clone(),
            strip::node,
            |e| Input::Node(Box::new(e)),
        );
        forward(
            &scope,
            kube::Api::<Namespace>::all(c.clone()),
            watcher::Config::default(),
            tx.clone(),
            strip::meta,
            |e| Input::Namespace(Box::new(e)),
        );
        let stores = Stores {
            priority_classes: reflect(&scope, kube::Api::all(c.clone()), strip::meta),
            budgets: reflect(&scope, kube::Api::all(c.clone()), strip::meta),
            runtime_classes: reflect(&scope, kube::Api::all(c.clone()), strip::meta),
            services: reflect(&scope, kube::Api::all(c.clone()), strip::service),
            replica_sets: reflect(&scope, kube::Api::all(c.clone()), strip::replica_set),
            stateful_sets: reflect(&scope, kube::Api::all(c.clone()), strip::stateful_set),
        };
        tracing::info!(name = %self.cfg.name, identity = %self.cfg.identity, "scheduler started");
        loop {
            // Take in everything that has arrived before deciding anything.
            while let Ok(input) = rx.try_recv() {
                self.handle(input, &stores, &tx);
            }
            let synced = self.pods_relist.synced && self.nodes_relist.synced;
            let mut ran = 0;
            while synced && ran < CYCLES_PER_TURN {
                let Some(pod) = self.queue.pop(Instant::now()) else {
                    break;
                };
                self.cycle(pod, &stores, &tx);
                ran += 1;
            }
            if ran > 0 {
                tokio::task::yield_now().await;
                continue;
            }
            let wait = self
                .queue
                .next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(60));
            tokio::select! {
                input = rx.recv() => match input {
                    Some(i) => self.handle(i, &stores, &tx),
                    None => return,
                },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn class_priority(stores: &Stores) -> impl Fn(&str) -> Option<(i32, bool)> + '_ {
        move |name: &str| {
            stores
                .priority_classes
                .find(|pc| pc.metadata.name.as_deref() == Some(name))
                .map(|pc| (pc.value, pc.preemption_policy.as_deref() == Some("Never")))
        }
    }

    /// The pod as the filters should see it: with its RuntimeClass's scheduling constraints and
    /// overhead merged in (upstream's RuntimeClass admission does this at creation).
    fn pod_info(pod: Arc<Pod>, stores: &Stores) -> PodInfo {
        let rc_name = pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone());
        let rc = rc_name.and_then(|n| {
            stores
                .runtime_classes
                .find(|r| r.metadata.name.as_deref() == Some(n.as_str()))
        });
        let pod = match rc {
            Some(rc) => {
                let mut p = (*pod).clone();
                if let Some(spec) = p.spec.as_mut() {
                    if let Some(sched) = &rc.scheduling {
                        if let Some(sel) = &sched.node_selector {
                            let ns = spec.node_selector.get_or_insert_with(BTreeMap::new);
                            for (k, v) in sel {
                                ns.entry(k.clone()).or_insert_with(|| v.clone());
                            }
                        }
                        if let Some(t) = &sched.tolerations {
                            spec.tolerations
                                .get_or_insert_with(Vec::new)
                                .extend(t.iter().cloned());
                        }
                    }
                    if spec.overhead.is_none() {
                        spec.overhead = rc.overhead.as_ref().and_then(|o| o.pod_fixed.clone());
                    }
                }
                Arc::new(p)
            }
            None => pod,
        };
        PodInfo::new(pod, &Self::class_priority(stores))
    }

    fn handle(&mut self, input: Input, stores: &Stores, tx: &mpsc::Sender<Input>) {
        let now = Instant::now();
        match input {
            Input::Pod(ev) => match *ev {
                watcher::Event::Init => self.pods_relist.init(),
                watcher::Event::InitApply(p) | watcher::Event::Apply(p) => {
                    if let Some(uid) = p.metadata.uid.as_deref() {
                        self.pods_relist.saw(uid);
                    }
                    self.on_pod(Arc::new(p), stores, now);
                }
                watcher::Event::Delete(p) => {
                    if let Some(uid) = p.metadata.uid.as_deref() {
                        self.on_pod_deleted(uid, now);
                    }
                }
                watcher::Event::InitDone => {
                    let seen = self.pods_relist.done();
                    let gone: Vec<String> = self
                        .cache
                        .pods()
                        .map(|p| p.uid.clone())
                        .filter(|u| !seen.contains(u) && !self.cache.is_assumed(u))
                        .collect();
                    for uid in gone {
                        self.on_pod_deleted(&uid, now);
                    }
                }
            },
            Input::Node(ev) => match *ev {
                watcher::Event::Init => self.nodes_relist.init(),
                watcher::Event::InitApply(n) | watcher::Event::Apply(n) => {
                    if let Some(name) = n.metadata.name.as_deref() {
                        self.nodes_relist.saw(name);
                    }
                    let change = self.cache.upsert_node(Arc::new(n));
                    if change.any() {
                        self.queue.on_event(ClusterEvent::Node(change), now);
                    }
                }
                watcher::Event::Delete(n) => {
                    if let Some(name) = n.metadata.name.as_deref() {
                        self.cache.remove_node(name);
                        self.queue.on_event(ClusterEvent::NodeDeleted, now);
                    }
                }
                watcher::Event::InitDone => {
                    let seen = self.nodes_relist.done();
                    let gone: Vec<String> = self
                        .cache
                        .nodes()
                        .iter()
                        .map(|n| n.name.clone())
                        .filter(|n| !seen.contains(n))
                        .collect();
                    for name in gone {
                        self.cache.remove_node(&name);
                        self.queue.on_event(ClusterEvent::NodeDeleted, now);
                    }
                }
            },
            Input::Namespace(ev) => match *ev {
                watcher::Event::Init => self.ns_relist.init(),
                watcher::Event::InitApply(n) | watcher::Event::Apply(n) => {
                    if let Some(name) = n.metadata.name.clone() {
                        self.ns_relist.saw(&name);
                        self.cache
                            .set_namespace(name, labels_of(&n.metadata.labels).clone());
                    }
                }
                watcher::Event::Delete(n) => {
                    if let Some(name) = n.metadata.name.as_deref() {
                        self.cache.remove_namespace(name);
                    }
                }
                watcher::Event::InitDone => {
                    self.ns_relist.done();
                }
            },
            Input::Bound { uid, result } => self.on_bound(uid, result, stores, tx),
        }
    }

    fn on_pod(&mut self, pod: Arc<Pod>, stores: &Stores, now: Instant) {
        let info = Self::pod_info(pod, stores);
        let uid = info.uid.clone();
        if info.node_name.is_some() {
            let info = Arc::new(info.placed());
            self.queue.remove(&uid);
            self.nominations.remove(&uid);
            self.gated.remove(&uid);
            if info.finished {
                if self.cache.remove_pod(&uid).is_some() {
                    self.queue.on_event(ClusterEvent::AssignedPodDeleted, now);
                }
                return;
            }
            let before = self
                .cache
                .pod(&uid)
                .map(|(p, n)| (p.labels.clone(), n.to_string()));
            let terminating = info.terminating;
            self.cache.set_bound_pod(info.clone());
            let new_or_moved = before
                .as_ref()
                .is_none_or(|(labels, node)| *labels != info.labels || Some(node) != info.node_name.as_ref());
            if new_or_moved && !terminating {
                self.queue.on_event(ClusterEvent::AssignedPodAdded, now);
            }
            return;
        }
        let info = Arc::new(info);
        if info.scheduler_name != self.cfg.name || info.terminating || info.finished {
            self.queue.remove(&uid);
            self.nominations.remove(&uid);
            return;
        }
        if info.gated {
            self.queue.remove(&uid);
            if self.gated.insert(uid) {
                self.set_unschedulable_condition(
                    &info,
                    "SchedulingGated",
                    "Scheduling is blocked due to non-empty scheduling gates",
                );
            }
            return;
        }
        self.gated.remove(&uid);
        // Assumed and being bound: an older unbound version of the pod must not queue it again.
        if self.cache.is_assumed(&uid) {
            return;
        }
        if let Some(n) = info.nominated_node.clone() {
            self.nominations.set(info.clone(), &n);
        }
        self.queue.upsert(info, now);
    }

    fn on_pod_deleted(&mut self, uid: &str, now: Instant) {
        self.queue.remove(uid);
        self.nominations.remove(uid);
        self.gated.remove(uid);
        if self.cache.remove_pod(uid).is_some() {
            self.queue.on_event(ClusterEvent::AssignedPodDeleted, now);
        }
    }

    /// The union of the selectors of the Services, ReplicaSet or StatefulSet selecting the pod
    /// (upstream's `DefaultSelector`), for default topology spreading.
    fn default_selector(info: &PodInfo, stores: &Stores) -> Option<LabelSelector> {
        if !info.spread.is_empty() {
            return None;
        }
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        for svc in stores.services.state() {
            if svc.metadata.namespace.as_deref() != Some(info.namespace.as_str()) {
                continue;
            }
            let Some(sel) = svc
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .filter(|s| !s.is_empty())
            else {
                continue;
            };
            if sel.iter().all(|(k, v)| info.labels.get(k) == Some(v)) {
                labels.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let mut exprs = Vec::new();
        let owner = info
            .pod
            .iter()
            .flat_map(|p| p.metadata.owner_references.iter().flatten())
            .find(|o| o.controller == Some(true));
        if let Some(o) = owner {
            let ns = Some(info.namespace.as_str());
            let sel = match o.kind.as_str() {
                "ReplicaSet" => stores
                    .replica_sets
                    .find(|r| {
                        r.metadata.name.as_deref() == Some(&o.name) && r.metadata.namespace.as_deref() == ns
                    })
                    .and_then(|r| r.spec.as_ref().map(|s| s.selector.clone())),
                "StatefulSet" => stores
                    .stateful_sets
                    .find(|r| {
                        r.metadata.name.as_deref() == Some(&o.name) && r.metadata.namespace.as_deref() == ns
                    })
                    .and_then(|r| r.spec.as_ref().map(|s| s.selector.clone())),
                _ => None,
            };
            if let Some(sel) = sel {
                labels.extend(sel.match_labels.unwrap_or_default());
                exprs.extend(sel.match_expressions.unwrap_or_default());
            }
        }
        if labels.is_empty() && exprs.is_empty() {
            return None;
        }
        Some(LabelSelector {
            match_labels: (!labels.is_empty()).then_some(labels),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        })
    }

    /// The PodDisruptionBudgets as preemption reads them: the status when the disruption
    /// controller keeps it, else computed from the pods in the cache.
    fn budgets(&self, stores: &Stores) -> Vec<Budget> {
        stores
            .budgets
            .state()
            .iter()
            .map(|pdb| {
                let ns = pdb.metadata.namespace.clone().unwrap_or_default();
                let spec = pdb.spec.clone().unwrap_or_default();
                let status = pdb.status.as_ref();
                let allowed = match status.filter(|s| s.observed_generation.is_some()) {
                    Some(s) => s.disruptions_allowed,
                    None => {
                        let healthy = self
                            .cache
                            .pods()
                            .filter(|p| p.namespace == ns && !p.terminating)
                            .filter(|p| {
                                spec.selector
                                    .as_ref()
                                    .is_some_and(|s| selector_matches(s, &p.labels))
                            })
                            .count() as i32;
                        let desired = match (&spec.min_available, &spec.max_unavailable) {
                            (Some(min), _) => scaled(min, healthy),
                            (None, Some(max)) => healthy - scaled(max, healthy),
                            (None, None) => 0,
                        };
                        (healthy - desired).max(0)
                    }
                };
                Budget {
                    namespace: ns,
                    selector: spec.selector.clone(),
                    allowed,
                    disrupted: status
                        .and_then(|s| s.disrupted_pods.as_ref())
                        .map(|d| d.keys().cloned().collect())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }

    fn cycle(&mut self, info: Arc<PodInfo>, stores: &Stores, tx: &mpsc::Sender<Input>) {
        let span = tracing::debug_span!("schedule", pod = %info.key());
        let _enter = span.enter();
        let now = Instant::now();
        let input = CycleInput {
            cache: &self.cache,
            nominations: &self.nominations,
            default_selector: Self::default_selector(&info, stores),
            percentage_of_nodes_to_score: self.cfg.percentage_of_nodes_to_score,
        };
        let mut rng = self.rng;
        let mut random = || {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let result = schedule(&info, &input, self.next_start, &mut random);
        self.rng = self.random() ^ rng;
        let nodes = self.cache.nodes().len().max(1);
        match result {
            Ok(s) => {
                self.next_start = (self.next_start + s.evaluated) % nodes;
                tracing::debug!(node = %s.node, feasible = s.feasible, evaluated = s.evaluated, "scheduled");
                self.cache.assume(info.clone(), &s.node);
                self.nominations.remove(&info.uid);
                self.bind(info, s.node, tx);
            }
            Err(mut fit) => {
                self.next_start = (self.next_start + fit.rejections.len()) % nodes;
                let mut plugins = fit.plugins();
                if fit.num_all_nodes > 0 {
                    let outcome = preemption::preempt(
                        &info,
                        &fit,
                        &self.cache,
                        &self.nominations,
                        &self.budgets(stores),
                    );
                    fit.post_filter_msg = outcome.message();
                    if let Outcome::Chosen(c) = outcome {
                        // The victims' deletion is the event that brings the pod back.
                        plugins.push(plugins::Plugin::NodeResourcesFit);
                        self.preempt(&info, c);
                    }
                }
                let message = fit.message();
                tracing::debug!(%message, "unschedulable");
                self.report_unschedulable(&info, &fit, &message);
                self.queue.unschedulable(&info.uid, plugins, now);
            }
        }
    }

    fn bind(&self, info: Arc<PodInfo>, node: String, tx: &mpsc::Sender<Input>) {
        let (client, recorder, binds, tx) = (
            self.client.clone(),
            self.recorder.clone(),
            self.binds.clone(),
            tx.clone(),
        );
        tokio::spawn(async move {
            let Ok(permit) = binds.acquire_owned().await else {
                return;
            };
            let pods: kube::Api<Pod> = kube::Api::namespaced(client, &info.namespace);
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": info.name, "namespace": info.namespace, "uid": info.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            });
            let result = match serde_json::to_vec(&binding) {
                Ok(body) => pods
                    .create_subresource::<serde_json::Value>(
                        "binding",
                        &info.name,
                        &PostParams::default(),
                        body,
                    )
                    .await
                    .map(drop),
                Err(e) => Err(kube::Error::SerdeError(e)),
            };
            // The event waits for the recorder's turn, not holding a binding's place.
            drop(permit);
            if result.is_ok() {
                let msg = format!("Successfully assigned {}/{} to {node}", info.namespace, info.name);
                let _ = tx
                    .send(Input::Bound {
                        uid: info.uid.clone(),
                        result: Ok(()),
                    })
                    .await;
                recorder
                    .record(&info.involved(), Kind::Normal, "Scheduled", "Binding", &msg)
                    .await;
            } else {
                let _ = tx
                    .send(Input::Bound {
                        uid: info.uid.clone(),
                        result,
                    })
                    .await;
            }
        });
    }

    fn on_bound(
        &mut self,
        uid: String,
        result: Result<(), kube::Error>,
        stores: &Stores,
        tx: &mpsc::Sender<Input>,
    ) {
        let _ = (stores, tx);
        match result {
            Ok(()) => self.queue.remove(&uid),
            Err(e) => {
                let info = self.cache.remove_pod(&uid);
                self.queue
                    .on_event(ClusterEvent::AssignedPodDeleted, Instant::now());
                match &e {
                    // Deleted meanwhile, or bound by someone else: nothing more to do.
                    kube::Error::Api(s) if s.code == 404 || s.code == 409 => {
                        tracing::debug!(%uid, error = %e, "binding not needed any more");
                        self.queue.remove(&uid);
                    }
                    _ => {
                        tracing::warn!(%uid, error = %e, "binding failed; retrying after back-off");
                        self.queue.failed(&uid);
                        if let Some(info) = info {
                            let recorder = self.recorder.clone();
                            let msg = format!("Binding rejected: {e}");
                            tokio::spawn(async move {
                                recorder
                                    .record(
                                        &info.involved(),
                                        Kind::Warning,
                                        "FailedScheduling",
                                        "Scheduling",
                                        &msg,
                                    )
                                    .await
                            });
                        }
                    }
                }
            }
        }
    }

    /// Marks the victims (`DisruptionTarget`), deletes them gracefully, and nominates the node.
    fn preempt(&mut self, info: &Arc<PodInfo>, c: Candidate) {
        tracing::info!(pod = %info.key(), node = %c.node, victims = c.victims.len(), "preempting");
        self.nominations.set(info.clone(), &c.node);
        let (client, recorder) = (self.client.clone(), self.recorder.clone());
        let preemptor = info.clone();
        let name = self.cfg.name.clone();
        tokio::spawn(async move {
            let now = kcore::time::rfc3339(SystemTime::now());
            for v in &c.victims {
                let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &v.namespace);
                let condition = json!({"status": {"conditions": [{
                    "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                    "message": format!("{name}: preempting to accommodate a higher priority pod"),
                    "lastTransitionTime": now}]}});
                if let Err(e) = pods
                    .patch_status(&v.name, &PatchParams::default(), &Patch::Strategic(&condition))
                    .await
                {
                    tracing::debug!(victim = %v.key(), error = %e, "DisruptionTarget not recorded");
                }
                match pods.delete(&v.name, &DeleteParams::default()).await {
                    Ok(_) => {
                        let msg = format!("Preempted by pod {} on node {}", preemptor.uid, c.node);
                        recorder
                            .record(&v.involved(), Kind::Normal, "Preempted", "Preempting", &msg)
                            .await;
                    }
                    Err(e) => tracing::warn!(victim = %v.key(), error = %e, "preemption victim not deleted"),
                }
            }
            let pods: kube::Api<Pod> = kube::Api::namespaced(client, &preemptor.namespace);
            let patch = json!({"status": {"nominatedNodeName": c.node}});
            if let Err(e) = pods
                .patch_status(&preemptor.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::debug!(pod = %preemptor.key(), error = %e, "nominatedNodeName not recorded");
            }
        });
    }

    fn report_unschedulable(&self, info: &Arc<PodInfo>, fit: &FitError, message: &str) {
        let _ = fit;
        self.set_unschedulable_condition(info, "Unschedulable", message);
        let recorder = self.recorder.clone();
        let (info, message) = (info.clone(), message.to_string());
        tokio::spawn(async move {
            recorder
                .record(
                    &info.involved(),
                    Kind::Warning,
                    "FailedScheduling",
                    "Scheduling",
                    &message,
                )
                .await
        });
    }

    /// Writes `PodScheduled=False` with `reason` and `message` unless the pod already says so.
    fn set_unschedulable_condition(&self, info: &Arc<PodInfo>, reason: &str, message: &str) {
        let current = info
            .pod
            .as_deref()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
        if current.is_some_and(|c| {
            c.status == "False"
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message)
        }) {
            return;
        }
        let transition = match current {
            Some(c) if c.status == "False" => c.last_transition_time.as_ref().map(|t| json!(t)),
            _ => None,
        }
        .unwrap_or_else(|| json!(kcore::time::rfc3339(SystemTime::now())));
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
            "lastProbeTime": null, "lastTransitionTime": transition}]}});
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), &info.namespace);
        let name = info.name.clone();
        tokio::spawn(async move {
            if let Err(e) = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                tracing::debug!(pod = %name, error = %e, "PodScheduled condition not written");
            }
        });
    }
}

/// An int-or-percent of `total` (percentages rounded up, as for minAvailable).
fn scaled(v: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString, total: i32) -> i32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match v {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map(|p| ((p * i64::from(total)) as f64 / 100.0).ceil() as i32)
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests;
