//! Starting authorization on an [`Api`]: the bootstrap policy created at first start and
//! reconciled on later ones (missing rules, selectors, labels and subjects added to objects
//! annotated `rbac.authorization.kubernetes.io/autoupdate: "true"`), the index loaded and kept
//! current, and the ClusterRole aggregation controller (upstream's
//! `clusterrole-aggregation-controller`: an aggregated role's rules are the union of the rules
//! of the ClusterRoles its `clusterRoleSelectors` match).

use std::sync::Arc;

use serde_json::{Value, json};

use super::policy::{self, AUTOUPDATE};
use super::rules::{Rule, uncovered};
use crate::api::Api;
use crate::api::object::selector::{labels_match, selector_requirements};
use crate::api::registry;
use crate::api::request::{Query, Target};
use crate::api::status::ApiError;

fn target(plural: &str, name: &str) -> Result<Target, ApiError> {
    let res = registry::find("rbac.authorization.k8s.io", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} not served")))?;
    Ok(Target {
        res,
        namespace: None,
        name: Some(name.to_string()),
        sub: None,
    })
}

/// Whether a stored object may be reconciled.
fn autoupdate(obj: &Value) -> bool {
    obj["metadata"]["annotations"][AUTOUPDATE].as_str() != Some("false")
}

/// Adds the labels and annotations of `want` that `have` lacks; returns whether it did.
fn merge_metadata(have: &mut Value, want: &Value) -> bool {
    let mut changed = false;
    for field in ["labels", "annotations"] {
        if let Some(m) = want["metadata"][field].as_object() {
            for (k, v) in m {
                if have["metadata"][field].get(k).is_none() {
                    have["metadata"][field][k] = v.clone();
                    changed = true;
                }
            }
        }
    }
    changed
}

impl Api {
    /// Creates or reconciles the bootstrap policy, loads the RBAC index and keeps it current,
    /// and starts the aggregation controller. Call once, after [`Api::bootstrap`].
    pub async fn start_authorization(&self) -> Result<(), ApiError> {
        for prefix in [
            super::rbac::PREFIX,
            super::node::PODS_PREFIX,
            super::node::CLAIMS_PREFIX,
            super::node::VOLUMES_PREFIX,
        ] {
            let rev = self
                .authz
                .load(self.store.as_ref(), prefix)
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
            tokio::spawn(self.authz.clone().follow(self.store.clone(), prefix, rev));
        }
        self.reconcile_policy().await?;
        // Settle aggregation (admin aggregates edit, which aggregates view) before serving.
        for _ in 0..4 {
            if self.aggregate_once().await? == 0 {
                break;
            }
        }
        let api = self.clone();
        tokio::spawn(async move { api.aggregate_forever().await });
        Ok(())
    }

    /// Creates missing bootstrap ClusterRoles and ClusterRoleBindings and adds what an existing
    /// one (not opted out of auto-update) is missing.
    pub(crate) async fn reconcile_policy(&self) -> Result<(), ApiError> {
        for spec in policy::cluster_roles() {
            let want = policy::cluster_role_object(&spec);
            self.reconcile_object("clusterroles", spec.name, want, |have, want| {
                let mut changed = merge_metadata(have, want);
                let have_rules: Vec<Rule> = serde_json::from_value(have["rules"].clone()).unwrap_or_default();
                let want_rules: Vec<Rule> = serde_json::from_value(want["rules"].clone()).unwrap_or_default();
                let mut rules = have_rules.clone();
                for r in want_rules {
                    if !uncovered(&have_rules, std::slice::from_ref(&r)).is_empty() {
                        rules.push(r);
                    }
                }
                if rules.len() != have_rules.len() {
                    have["rules"] = json!(rules);
                    changed = true;
                }
                if let Some(want_sel) = want["aggregationRule"]["clusterRoleSelectors"].as_array() {
                    let sel = &mut have["aggregationRule"]["clusterRoleSelectors"];
                    if !sel.is_array() {
                        *sel = json!([]);
                    }
                    for s in want_sel {
                        if let Some(list) = sel.as_array_mut()
                            && !list.contains(s)
                        {
                            list.push(s.clone());
                            changed = true;
                        }
                    }
                }
                changed
            })
            .await?;
        }
        for spec in policy::cluster_role_bindings() {
            let want = policy::cluster_role_binding_object(&spec);
            self.reconcile_object("clusterrolebindings", spec.0, want, |have, want| {
                let mut changed = merge_metadata(have, want);
                if !have["subjects"].is_array() {
                    have["subjects"] = json!([]);
                }
                for s in want["subjects"].as_array().into_iter().flatten() {
                    let present = have["subjects"].as_array().is_some_and(|l| {
                        l.iter().any(|x| {
                            x["kind"] == s["kind"]
                                && x["name"] == s["name"]
                                && x["namespace"] == s["namespace"]
                        })
                    });
                    if !present && let Some(l) = have["subjects"].as_array_mut() {
                        l.push(s.clone());
                        changed = true;
                    }
                }
                changed
            })
            .await?;
        }
        Ok(())
    }

    async fn reconcile_object(
        &self,
        plural: &str,
        name: &str,
        want: Value,
        merge: impl Fn(&mut Value, &Value) -> bool,
    ) -> Result<(), ApiError> {
        let t = target(plural, name)?;
        for _ in 0..5 {
            match self.read_object(t.res, None, name).await {
                Err(e) if e.code == 404 => {
                    let create = Target {
                        name: None,
                        ..t.clone()
                    };
                    match self.create(&create, want.clone(), &Query::default(), None).await {
                        Err(e) if e.code == 409 => continue,
                        other => return other.map(|_| ()),
                    }
                }
                Err(e) => return Err(e),
                Ok((mut have, _)) => {
                    if !autoupdate(&have) || !merge(&mut have, &want) {
                        return Ok(());
                    }
                    tracing::info!(kind = plural, name, "reconciling bootstrap RBAC object");
                    match self.update(&t, have, &Query::default()).await {
                        Err(e) if e.code == 409 => continue,
                        other => return other.map(|_| ()),
                    }
                }
            }
        }
        Ok(())
    }

    /// The aggregation controller: after every ClusterRole change, rewrites each aggregated
    /// role whose rules differ from the union of the roles it selects.
    async fn aggregate_forever(self) {
        loop {
            if let Err(e) = self.aggregate_once().await {
                tracing::warn!(error = %e, "ClusterRole aggregation failed");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
            self.authz.cluster_roles_changed().await;
        }
    }

    /// One aggregation pass; returns how many roles it rewrote.
    pub(crate) async fn aggregate_once(&self) -> Result<usize, ApiError> {
        let wanted: Vec<(String, Vec<Rule>)> = self
            .authz
            .with_index(|ix| {
                let mut out = Vec::new();
                for (name, role) in &ix.cluster_roles {
                    let Some(selectors) = &role.selectors else {
                        continue;
                    };
                    let mut names: Vec<&String> = ix
                        .cluster_roles
                        .iter()
                        .filter(|(other, r)| {
                            *other != name
                                && selectors
                                    .iter()
                                    .any(|s| labels_match(&selector_requirements(s), r.labels.as_ref()))
                        })
                        .map(|(n, _)| n)
                        .collect();
                    names.sort();
                    let mut rules: Vec<Rule> = Vec::new();
                    for n in names {
                        for r in ix
                            .cluster_roles
                            .get(n)
                            .map(|c| c.rules.as_slice())
                            .unwrap_or_default()
                        {
                            if !rules.contains(r) {
                                rules.push(r.clone());
                            }
                        }
                    }
                    if rules != role.rules {
                        out.push((name.clone(), rules));
                    }
                }
                out
            })
            .unwrap_or_default();
        let writes = wanted.len();
        for (name, rules) in wanted {
            let t = target("clusterroles", &name)?;
            let (mut obj, _) = self.read_object(t.res, None, &name).await?;
            obj["rules"] = json!(rules);
            tracing::debug!(name = %name, rules = rules.len(), "aggregating ClusterRole");
            match self.update(&t, obj, &Query::default()).await {
                Ok(_) | Err(ApiError { code: 404 | 409, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(writes)
    }
}

/// The store seen by the API: every successful write is also handed to the authorizer's index.
pub(crate) struct ObservedStore {
    pub inner: Arc<dyn crate::storage::Store>,
    pub authz: Arc<super::Authz>,
}

impl crate::storage::Store for ObservedStore {
    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> crate::storage::BoxFuture<'a, crate::storage::Result<Option<crate::storage::KeyValue>>> {
        self.inner.get(key)
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> crate::storage::BoxFuture<'a, crate::storage::Result<crate::storage::ListPage>> {
        self.inner.list(prefix, start_after, limit)
    }

    fn list_at<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
        revision: crate::storage::Revision,
    ) -> crate::storage::BoxFuture<'a, crate::storage::Result<crate::storage::ListPage>> {
        self.inner.list_at(prefix, start_after, limit, revision)
    }

    fn hold_revision(
        &self,
        revision: crate::storage::Revision,
    ) -> crate::storage::BoxFuture<'_, crate::storage::Result<crate::storage::RevisionHold>> {
        self.inner.hold_revision(revision)
    }

    fn write(
        &self,
        w: crate::storage::Write,
    ) -> crate::storage::BoxFuture<'_, crate::storage::Result<crate::storage::Event>> {
        Box::pin(async move {
            let ev = self.inner.write(w).await?;
            self.authz.observe(&ev);
            Ok(ev)
        })
    }

    fn watch<'a>(
        &'a self,
        prefix: &'a str,
        after: crate::storage::Revision,
    ) -> crate::storage::BoxFuture<'a, crate::storage::Result<Box<dyn crate::storage::WatchStream>>> {
        self.inner.watch(prefix, after)
    }

    fn revision(&self) -> crate::storage::BoxFuture<'_, crate::storage::Result<crate::storage::Revision>> {
        self.inner.revision()
    }

    fn compacted(&self) -> crate::storage::BoxFuture<'_, crate::storage::Result<crate::storage::Revision>> {
        self.inner.compacted()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
}
