//! The Deployment controller (`deployment-controller`): runs a Deployment's revisions as
//! ReplicaSets named `<name>-<pod-template-hash>`, rolls from one to the next (RollingUpdate
//! within maxSurge/maxUnavailable, or Recreate), scales them in proportion when the Deployment
//! is scaled mid-rollout, keeps `revisionHistoryLimit` old ones, and reports status and
//! conditions (progress deadline, pause). The decisions are in `reconcile`; this module reads the
//! caches, runs the writes in order and records the events.

mod gotypes;
pub mod hash;
pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kcore::labels::{labels_of, selector_matches};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::podutil::controller_owner;
use super::{Failures, Manager, Running, controller_ref, key_of, retry_after_failure, run_sync};
use crate::events::{Involved, Kind, Recorder};
use reconcile::Step;

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "deployment-controller";

/// How long a Deployment with nothing pending waits before it is looked at again.
const RESYNC: Duration = Duration::from_secs(600);

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The new ReplicaSet's name is taken by another template: the collision count was raised.
    #[error("hash collision on replica set {0}")]
    Collision(String),
    /// The new ReplicaSet exists but the cache has not shown it yet.
    #[error("replica set {0} exists but is not cached yet")]
    NotCached(String),
    /// The Deployment changed (deleted or recreated) before an adoption.
    #[error("deployment {0} changed before adopting its replica sets")]
    Changed(String),
}

pub(crate) struct Ctx {
    client: kube::Client,
    sets: Store<ReplicaSet>,
    pods: Store<Pod>,
    recorder: Arc<Recorder>,
    failures: Failures,
}

/// The controller, subscribed to the shared Deployment, ReplicaSet and Pod informers.
pub fn controller(mgr: &Manager) -> Running {
    let deployments = mgr.informers.get::<Deployment>();
    let sets = mgr.informers.get::<ReplicaSet>();
    let pods = mgr.informers.get::<Pod>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        sets: sets.reader(),
        pods: pods.reader(),
        recorder: mgr.recorder(COMPONENT),
        failures: Failures::default(),
    });
    // A deleted ReplicaSet brings its Deployment back; an orphan brings every Deployment whose
    // selector matches it (one may adopt it).
    let deleted_sets = sets
        .deletions()
        .filter_map(|rs| futures::future::ready(controller_ref::<Deployment, _>(&*rs)));
    let deployment_reader = deployments.reader();
    let orphans = sets.subscribe().flat_map(move |rs| {
        let refs = if rs
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true))
        {
            Vec::new()
        } else {
            matching_deployments(&deployment_reader, &rs)
        };
        futures::stream::iter(refs)
    });
    // A Recreate rollout waits for the old pods to be gone.
    let set_reader = sets.reader();
    let deployment_reader = deployments.reader();
    let deleted_pods = pods.deletions().filter_map(move |p| {
        let owner = controller_ref::<ReplicaSet, _>(&*p)
            .and_then(|r| set_reader.get(&r))
            .and_then(|rs| controller_ref::<Deployment, _>(&*rs))
            .filter(|d| {
                deployment_reader.get(d).is_some_and(|d| {
                    d.spec
                        .as_ref()
                        .and_then(|s| s.strategy.as_ref())
                        .and_then(|s| s.type_.as_deref())
                        == Some("Recreate")
                })
            });
        futures::future::ready(owner)
    });
    let ctl = Controller::for_shared_stream(deployments.subscribe(), deployments.reader())
        .owns_shared_stream(sets.subscribe())
        .reconcile_on(deleted_sets)
        .reconcile_on(orphans)
        .reconcile_on(deleted_pods)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn matching_deployments(deployments: &Store<Deployment>, rs: &ReplicaSet) -> Vec<ObjectRef<Deployment>> {
    let labels = labels_of(&rs.metadata.labels);
    deployments
        .state()
        .iter()
        .filter(|d| d.metadata.namespace == rs.metadata.namespace)
        .filter(|d| {
            d.spec
                .as_ref()
                .is_some_and(|s| selector_matches(&s.selector, labels))
        })
        .map(|d| ObjectRef::from_obj(&**d))
        .collect()
}

fn error_policy(d: Arc<Deployment>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    retry_after_failure(&ctx.failures, "deployment", &*d, err)
}

async fn reconcile_one(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    // Nothing is decided on a cache that has not listed yet (a restart would over-create).
    super::informer::synced(&ctx.sets).await;
    super::informer::synced(&ctx.pods).await;
    run_sync(&ctx.failures, "deployment", &*d, sync(&d, &ctx)).await
}

async fn sync(d: &Deployment, ctx: &Ctx) -> Result<Action, SyncError> {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let in_ns = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.as_deref() == Some(ns.as_str())
    };
    let sets: Vec<Arc<ReplicaSet>> = ctx
        .sets
        .state()
        .into_iter()
        .filter(|rs| in_ns(&rs.metadata))
        .collect();
    let recreate = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate");
    let pods: Vec<Arc<Pod>> = if recreate {
        ctx.pods
            .state()
            .into_iter()
            .filter(|p| in_ns(&p.metadata))
            .collect()
    } else {
        Vec::new()
    };
    let plan = reconcile::plan(d, &sets, &pods, Utc::now());
    tracing::debug!(
        deployment = %key_of(d),
        resource_version = ?d.metadata.resource_version,
        generation = ?d.metadata.generation,
        replicas = ?d.spec.as_ref().and_then(|s| s.replicas),
        sets = ?sets
            .iter()
            .filter(|rs| rs.metadata.owner_references.iter().flatten().any(|o| Some(&o.uid) == d.metadata.uid.as_ref()))
            .map(|rs| (rs.metadata.name.as_deref(), rs.metadata.resource_version.as_deref(), rs.spec.as_ref().and_then(|s| s.replicas), rs.status.as_ref().map(|s| (s.replicas, s.available_replicas)), rs.metadata.annotations.as_ref().map(|a| (a.get("deployment.kubernetes.io/desired-replicas").cloned(), a.get("deployment.kubernetes.io/revision").cloned()))))
            .collect::<Vec<_>>(),
        steps = ?plan.steps,
        "deployment plan"
    );
    let mut run = Run {
        ctx,
        d,
        rs_api: kube::Api::namespaced(ctx.client.clone(), &ns),
        d_api: kube::Api::namespaced(ctx.client.clone(), &ns),
        versions: sets
            .iter()
            .filter_map(|rs| Some((rs.metadata.name.clone()?, rs.metadata.resource_version.clone()?)))
            .collect(),
        d_version: d.metadata.resource_version.clone(),
        involved: Involved::of(d),
        checked_owner: false,
    };
    for step in plan.steps {
        run.step(step).await?;
    }
    if let Some(status) = plan.status {
        run.write_status(&status).await?;
    }
    Ok(Action::requeue(plan.requeue_after.unwrap_or(RESYNC)))
}

/// The writes of one sync, with the resourceVersions they return (a set written twice in one
/// sync is written at the version the first write made).
struct Run<'a> {
    ctx: &'a Ctx,
    d: &'a Deployment,
    rs_api: kube::Api<ReplicaSet>,
    d_api: kube::Api<Deployment>,
    versions: HashMap<String, String>,
    d_version: Option<String>,
    involved: Involved,
    checked_owner: bool,
}

fn ok_if_gone<T>(r: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

impl Run<'_> {
    fn name(&self) -> String {
        self.d.metadata.name.clone().unwrap_or_default()
    }

    fn note(&mut self, rs: &ReplicaSet) {
        if let (Some(n), Some(v)) = (&rs.metadata.name, &rs.metadata.resource_version) {
            self.versions.insert(n.clone(), v.clone());
        }
    }

    /// Before adopting: the Deployment read fresh is still this one and not being deleted
    /// (upstream's `RecheckDeletionTimestamp`).
    async fn check_owner(&mut self) -> Result<(), SyncError> {
        if self.checked_owner {
            return Ok(());
        }
        let fresh = self.d_api.get(&self.name()).await?;
        if fresh.metadata.uid != self.d.metadata.uid || fresh.metadata.deletion_timestamp.is_some() {
            return Err(SyncError::Changed(key_of(self.d)));
        }
        self.checked_owner = true;
        Ok(())
    }

    async fn step(&mut self, step: Step) -> Result<(), SyncError> {
        let pp = PatchParams::default();
        match step {
            Step::Adopt { name, uid } => {
                self.check_owner().await?;
                let owner = controller_owner("apps/v1", "Deployment", &self.d.metadata);
                let patch = json!({"metadata": {"ownerReferences": [owner], "uid": uid}});
                if let Some(rs) = ok_if_gone(self.rs_api.patch(&name, &pp, &Patch::Strategic(&patch)).await)?
                {
                    self.note(&rs);
                }
            }
            Step::Release { name, uid } => {
                let owner = self.d.metadata.uid.clone().unwrap_or_default();
                let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": owner}], "uid": uid}});
                if let Some(rs) = ok_if_gone(self.rs_api.patch(&name, &pp, &Patch::Strategic(&patch)).await)?
                {
                    self.note(&rs);
                }
            }
            Step::Create(rs) => self.create(&rs).await?,
            Step::Update {
                name,
                replicas,
                annotations,
                min_ready_seconds,
            } => {
                let patch = json!({
                    "metadata": {"resourceVersion": self.versions.get(&name), "annotations": annotations},
                    "spec": {"replicas": replicas, "minReadySeconds": min_ready_seconds},
                });
                let rs = self.rs_api.patch(&name, &pp, &Patch::Merge(&patch)).await?;
                self.note(&rs);
            }
            Step::Delete { name, uid } => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                ok_if_gone(self.rs_api.delete(&name, &dp).await)?;
            }
            Step::SetRevision(revision) => {
                let patch = json!({"metadata": {"annotations": {reconcile::REVISION: revision}}});
                let d = self.d_api.patch(&self.name(), &pp, &Patch::Merge(&patch)).await?;
                self.d_version = d.metadata.resource_version;
            }
            Step::Event(e) => {
                let kind = if e.warning { Kind::Warning } else { Kind::Normal };
                let action = if e.reason == "ScalingReplicaSet" {
                    "Scale"
                } else {
                    "Sync"
                };
                self.ctx
                    .recorder
                    .record(&self.involved, kind, e.reason, action, &e.message)
                    .await;
            }
        }
        Ok(())
    }

    /// Creates the new ReplicaSet. Its name is deterministic: when it is taken, either it is
    /// ours and the cache is behind, or another template hashed the same and the collision count
    /// goes up (upstream's `getNewReplicaSet`).
    async fn create(&mut self, rs: &ReplicaSet) -> Result<(), SyncError> {
        let name = rs.metadata.name.clone().unwrap_or_default();
        let mut body = rs.clone();
        body.metadata.creation_timestamp = None;
        match self.rs_api.create(&PostParams::default(), &body).await {
            Ok(created) => {
                self.note(&created);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self.rs_api.get(&name).await?;
                let template = self
                    .d
                    .spec
                    .as_ref()
                    .map(|s| s.template.clone())
                    .unwrap_or_default();
                let ours = existing
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.controller == Some(true) && Some(&o.uid) == self.d.metadata.uid.as_ref());
                let same = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .is_some_and(|t| reconcile::equal_ignore_hash(&template, t));
                if ours && same {
                    return Err(SyncError::NotCached(name));
                }
                let count = self
                    .d
                    .status
                    .as_ref()
                    .and_then(|s| s.collision_count)
                    .unwrap_or(0);
                let patch = json!({"status": {"collisionCount": count + 1}});
                self.d_api
                    .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                tracing::info!(deployment = %key_of(self.d), collision_count = count + 1, "hash collision: collision count raised");
                Err(SyncError::Collision(name))
            }
            Err(e) => {
                let message = super::slowstart::api_message(&e);
                if let Some(c) = reconcile::create_failed(self.d, &name, &message, Utc::now()) {
                    let mut status = self.d.status.clone().unwrap_or_default();
                    reconcile::set_condition(&mut status, c.clone());
                    let patch = json!({"status": {"conditions": status.conditions}});
                    // A bigger problem is being reported: this write is best effort.
                    let _ = self
                        .d_api
                        .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                let msg = format!("Failed to create new replica set {name:?}: {message}");
                self.ctx
                    .recorder
                    .record(
                        &self.involved,
                        Kind::Warning,
                        reconcile::RS_CREATE_ERROR,
                        "Create",
                        &msg,
                    )
                    .await;
                Err(e.into())
            }
        }
    }

    async fn write_status(&mut self, status: &DeploymentStatus) -> Result<(), SyncError> {
        let patch = json!({
            "metadata": {"resourceVersion": self.d_version},
            "status": {
                "observedGeneration": status.observed_generation,
                "replicas": status.replicas.unwrap_or(0),
                "updatedReplicas": status.updated_replicas.unwrap_or(0),
                "readyReplicas": status.ready_replicas.unwrap_or(0),
                "availableReplicas": status.available_replicas.unwrap_or(0),
                "unavailableReplicas": status.unavailable_replicas.unwrap_or(0),
                "collisionCount": status.collision_count,
                "conditions": status.conditions,
            },
        });
        ok_if_gone(
            self.d_api
                .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        )?;
        Ok(())
    }
}
