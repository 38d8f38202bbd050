//! The root CA publisher (`root-ca-cert-publisher`, `--controllers` name
//! `root-ca-certificate-publisher-controller`; CTL-62): every active namespace has the
//! `kube-root-ca.crt` ConfigMap whose `ca.crt` is the cluster's CA, created again if deleted
//! and corrected if changed.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};

use self::reconcile::{NAME as CONFIGMAP, Publish, publish};
use super::serviceaccount::{namespace_of, reconcile::active};
use super::{Failures, Manager, Running};

/// Upstream's controller name (for `--controllers`).
pub const NAME: &str = "root-ca-certificate-publisher-controller";
/// Upstream's component name (its work queue and logs).
pub const COMPONENT: &str = "root-ca-cert-publisher";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
}

struct Ctx {
    client: kube::Client,
    configmaps: Store<ConfigMap>,
    ca: String,
    failures: Failures,
}

fn ours(cm: &ConfigMap) -> Option<ObjectRef<Namespace>> {
    (cm.metadata.name.as_deref() == Some(CONFIGMAP))
        .then(|| namespace_of(cm))
        .flatten()
}

/// The publisher of `ca`, over the shared Namespace and ConfigMap informers.
pub fn controller(mgr: &Manager, ca: String) -> Running {
    let namespaces = mgr.informers.get::<Namespace>();
    let configmaps = mgr.informers.get::<ConfigMap>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        configmaps: configmaps.reader(),
        ca,
        failures: Failures::default(),
    });
    let changed = configmaps
        .subscribe()
        .filter_map(|cm| futures::future::ready(ours(&cm)));
    let deleted = configmaps
        .deletions()
        .filter_map(|cm| futures::future::ready(ours(&cm)));
    let ctl = Controller::for_shared_stream(namespaces.subscribe(), namespaces.reader())
        .reconcile_on(changed)
        .reconcile_on(deleted)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(ns: Arc<Namespace>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    super::retry_after_failure(&ctx.failures, COMPONENT, &*ns, err)
}

async fn reconcile_one(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    if !active(&ns) {
        return Ok(Action::await_change());
    }
    super::informer::synced(&ctx.configmaps).await;
    let current = ctx.configmaps.get(&ObjectRef::new(CONFIGMAP).within(&name));
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(ctx.client.clone(), &name);
    let result = match publish(&name, current.as_deref(), &ctx.ca) {
        Publish::Nothing => Ok(()),
        Publish::Create(cm) => api.create(&PostParams::default(), &cm).await.map(|_| ()),
        Publish::Update(cm) => api
            .replace(CONFIGMAP, &PostParams::default(), &cm)
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => {}
        // The cache lagged (409: created or changed meanwhile, retried on its event), or the
        // namespace is going away.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 || s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.failures.reset(&name);
    Ok(Action::await_change())
}
