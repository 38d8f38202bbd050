//! The ServiceAccounts controller (`serviceaccount-controller`): every active namespace has
//! the `default` ServiceAccount, created again if deleted.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};

use super::{Failures, Manager, Running};

/// Upstream's controller name.
pub const NAME: &str = "serviceaccount-controller";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
}

struct Ctx {
    client: kube::Client,
    accounts: Store<ServiceAccount>,
    failures: Failures,
}

/// The namespace of an object, as the namespace to reconcile.
pub(crate) fn namespace_of<K: kube::Resource>(o: &K) -> Option<ObjectRef<Namespace>> {
    o.meta().namespace.as_deref().map(ObjectRef::new)
}

/// The controller, over the shared Namespace and ServiceAccount informers.
pub fn controller(mgr: &Manager) -> Running {
    let namespaces = mgr.informers.get::<Namespace>();
    let accounts = mgr.informers.get::<ServiceAccount>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        accounts: accounts.reader(),
        failures: Failures::default(),
    });
    let deleted = accounts
        .deletions()
        .filter_map(|sa| futures::future::ready(namespace_of(&*sa)));
    let ctl = Controller::for_shared_stream(namespaces.subscribe(), namespaces.reader())
        .reconcile_on(deleted)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(ns: Arc<Namespace>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    super::retry_after_failure(&ctx.failures, "serviceaccount-controller", &*ns, err)
}

async fn reconcile_one(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    super::informer::synced(&ctx.accounts).await;
    let exists = |a: &str| ctx.accounts.get(&ObjectRef::new(a).within(&name)).is_some();
    for sa in reconcile::missing(&ns, exists) {
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(ctx.client.clone(), &name);
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => tracing::info!(namespace = %name, "created the default ServiceAccount"),
            // Already there (the cache lagged), or the namespace is going away.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 || s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    ctx.failures.reset(&name);
    Ok(Action::await_change())
}
