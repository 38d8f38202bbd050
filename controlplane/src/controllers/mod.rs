//! The controllers (docs/SEEDS-SPEC.md §3): API clients that move the cluster towards what its
//! objects ask for. They run inside `controlplane serve` over the in-process transport (identity
//! `system:kube-controller-manager`) or standalone (`controlplane controllers --kubeconfig F`),
//! one active instance per cluster through the Lease `kube-system/kube-controller-manager`.
//!
//! Each controller is kube-runtime's `Controller` (per-object work queue, no two reconciles of one
//! object at once, requeue by `Action`) over shared informers (`informer`: one list+watch per
//! kind for all controllers). Decisions are pure functions of the cached objects in each
//! controller's `reconcile` module, table-tested; the code around them only moves data. Events
//! carry upstream's component names (`replicaset-controller`, ...).

pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod expectations;
pub mod garbagecollector;
pub mod history;
pub mod index;
pub mod informer;
pub mod job;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podautoscaler;
pub mod podgc;
pub mod podstatus;
pub mod podutil;
pub mod replicaset;
pub mod rootcacert;
pub mod serviceaccount;
pub mod slowstart;
pub mod statefulset;
pub mod tainteviction;
pub mod ttlafterfinished;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::events::Recorder;
use crate::leader::{self, LeaseConfig};
use informer::Informers;

/// How the controller manager runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub leader_elect: bool,
    pub identity: String,
    /// Reconciles of one controller running at once.
    pub concurrency: u16,
    /// `--controllers`: upstream's names, `*` for all, `-name` to leave one out.
    pub controllers: Vec<String>,
    pub node_lifecycle: nodelifecycle::LifecycleConfig,
    pub podgc: podgc::PodGcConfig,
    pub node_ipam: nodeipam::IpamConfig,
    /// The cluster CA (PEM) the root-ca-cert-publisher puts in every namespace
    /// (`--root-ca-file`; without it that controller does not run).
    pub root_ca: Option<String>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            leader_elect: true,
            identity: leader::identity(),
            concurrency: 8,
            controllers: vec!["*".into()],
            node_lifecycle: Default::default(),
            podgc: Default::default(),
            node_ipam: Default::default(),
            root_ca: None,
        }
    }
}

impl ControllerConfig {
    /// Whether the controller `name` runs (kube-controller-manager's `--controllers` rule: a
    /// name turns it on, `-name` off, `*` all the others on).
    pub fn enabled(&self, name: &str) -> bool {
        let off = format!("-{name}");
        if self.controllers.contains(&off) {
            return false;
        }
        self.controllers.iter().any(|c| c == name || c == "*")
    }
}

/// A controller ready to run.
pub type Running = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the controllers are built from.
pub struct Manager {
    pub client: kube::Client,
    pub informers: Informers,
    pub cfg: ControllerConfig,
}

impl Manager {
    /// An event recorder for the controller named `component` (upstream's names).
    pub fn recorder(&self, component: &str) -> Arc<Recorder> {
        Arc::new(Recorder::new(self.client.clone(), component, &self.cfg.identity))
    }

    /// kube-runtime's controller settings for this manager.
    pub fn controller_config(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default().concurrency(self.cfg.concurrency)
    }
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Runs every controller for ever (as leader only, with leader election).
pub async fn run(client: kube::Client, cfg: ControllerConfig) {
    if cfg.leader_elect {
        let lease = LeaseConfig::new("kube-controller-manager", &cfg.identity);
        leader::run_as_leader(client.clone(), lease, move || {
            run_all(client.clone(), cfg.clone())
        })
        .await;
    } else {
        run_all(client, cfg).await;
    }
}

/// Builds every controller (they subscribe to the informers), starts the informers, and runs
/// the controllers until one ends.
pub async fn run_all(client: kube::Client, cfg: ControllerConfig) {
    let mgr = Manager {
        informers: Informers::new(client.clone()),
        client,
        cfg,
    };
    let by_node = index::PodsByNode::by_node(&mgr.informers.get::<k8s_openapi::api::core::v1::Pod>());
    type Build<'a> = Box<dyn FnOnce() -> Running + 'a>;
    let all: Vec<(&str, Build<'_>)> = vec![
        ("replicaset-controller", Box::new(|| replicaset::controller(&mgr))),
        ("deployment-controller", Box::new(|| deployment::controller(&mgr))),
        (
            "statefulset-controller",
            Box::new(|| statefulset::controller(&mgr)),
        ),
        ("daemonset-controller", Box::new(|| daemonset::controller(&mgr))),
        ("job-controller", Box::new(|| job::controller(&mgr))),
        ("cronjob-controller", Box::new(|| cronjob::controller(&mgr))),
        (
            "ttl-after-finished-controller",
            Box::new(|| ttlafterfinished::controller(&mgr)),
        ),
        (
            "node-lifecycle-controller",
            Box::new(|| nodelifecycle::controller(&mgr, &by_node)),
        ),
        (
            "taint-eviction-controller",
            Box::new(|| tainteviction::controller(&mgr, &by_node)),
        ),
        (podgc::NAME, Box::new(|| podgc::controller(&mgr))),
        ("node-ipam-controller", Box::new(|| nodeipam::controller(&mgr))),
        ("disruption-controller", Box::new(|| disruption::controller(&mgr))),
        (podautoscaler::NAME, Box::new(|| podautoscaler::controller(&mgr))),
        (
            garbagecollector::NAME,
            Box::new(|| garbagecollector::controller(&mgr)),
        ),
        (namespace::NAME, Box::new(|| namespace::controller(&mgr))),
        (
            serviceaccount::NAME,
            Box::new(|| serviceaccount::controller(&mgr)),
        ),
    ];
    let publisher: Option<(&str, Build<'_>)> = match mgr.cfg.root_ca.clone() {
        Some(ca) => Some((rootcacert::NAME, Box::new(|| rootcacert::controller(&mgr, ca)))),
        None => {
            tracing::warn!("no root CA given: the root CA publisher does not run");
            None
        }
    };
    let controllers: Vec<(&str, Running)> = all
        .into_iter()
        .chain(publisher)
        .filter(|(name, _)| mgr.cfg.enabled(name))
        .map(|(name, build)| (name, build()))
        .collect();
    mgr.informers.start();
    tracing::info!(controllers = controllers.len(), identity = %mgr.cfg.identity, "controllers started");
    // Dropped with this future (leadership lost): every controller stops.
    let scope = leader::Scope::default();
    let tasks: Vec<_> = controllers
        .into_iter()
        .map(|(name, fut)| {
            scope.spawn(async move {
                fut.await;
                tracing::error!(controller = name, "controller stopped");
            })
        })
        .collect();
    let _ = futures::future::select_all(tasks).await;
}

/// Per-object retry back-off after reconcile errors: 5 ms doubling to 1,000 s (client-go's
/// default controller rate limiter), reset by a success.
#[derive(Debug, Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, u32>>,
}

impl Failures {
    /// The delay before retrying `key` after one more failure.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        let ms = 5u64.saturating_mul(1u64 << (*n - 1).min(30));
        Duration::from_millis(ms.min(1_000_000))
    }

    /// `key` succeeded: its back-off starts over.
    pub fn reset(&self, key: &str) {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// A failed sync of `obj` (a `kind`): logged, and retried after its next back-off delay (every
/// controller's `error_policy`).
pub fn retry_after_failure<K: kube::Resource>(
    failures: &Failures,
    kind: &str,
    obj: &K,
    err: &dyn std::fmt::Display,
) -> Action {
    let key = key_of(obj);
    let delay = failures.next_delay(&key);
    tracing::warn!(kind, object = %key, error = %err, retry_in = ?delay, "sync failed");
    Action::requeue(delay)
}

/// Runs `sync` for `obj` (a `kind`) in its span; a success resets its back-off.
pub async fn run_sync<K, E>(
    failures: &Failures,
    kind: &'static str,
    obj: &K,
    sync: impl Future<Output = Result<Action, E>>,
) -> Result<Action, E>
where
    K: kube::Resource,
{
    use tracing::Instrument;
    let key = key_of(obj);
    let action = sync
        .instrument(tracing::debug_span!("sync", kind, key = %key))
        .await?;
    failures.reset(&key);
    Ok(action)
}

/// Requeue after `delay`.
pub fn requeue(delay: Duration) -> Action {
    Action::requeue(delay)
}

/// The `namespace/name` key of an object.
pub fn key_of<K: kube::Resource>(o: &K) -> String {
    let m = o.meta();
    match &m.namespace {
        Some(ns) => format!("{ns}/{}", m.name.as_deref().unwrap_or_default()),
        None => m.name.clone().unwrap_or_default(),
    }
}

/// The controller (owner with `controller: true`) of `child` if it is a `K`, as a reference to
/// reconcile.
pub fn controller_ref<K, C>(child: &C) -> Option<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()>,
    C: kube::Resource,
{
    let o = child
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    if o.kind != K::kind(&()) || o.api_version != K::api_version(&()) {
        return None;
    }
    let r = ObjectRef::new(&o.name);
    Some(match &child.meta().namespace {
        Some(ns) => r.within(ns),
        None => r,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_are_chosen_as_upstream_does() {
        let mut cfg = ControllerConfig::default();
        assert!(cfg.enabled("taint-eviction-controller"));
        cfg.controllers = vec!["*".into(), "-taint-eviction-controller".into()];
        assert!(!cfg.enabled("taint-eviction-controller"));
        assert!(cfg.enabled("disruption-controller"));
        cfg.controllers = vec!["disruption-controller".into()];
        assert!(!cfg.enabled("replicaset-controller"));
        assert!(cfg.enabled("disruption-controller"));
    }

    #[test]
    fn failure_backoff_doubles_from_5ms_to_1000s() {
        let f = Failures::default();
        let d: Vec<u128> = (0..5).map(|_| f.next_delay("a").as_millis()).collect();
        assert_eq!(d, [5, 10, 20, 40, 80]);
        for _ in 0..40 {
            f.next_delay("a");
        }
        assert_eq!(f.next_delay("a"), Duration::from_secs(1000));
        f.reset("a");
        assert_eq!(f.next_delay("a"), Duration::from_millis(5));
    }
}
