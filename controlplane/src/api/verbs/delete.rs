//! Deletion: preconditions, finalizers, propagation policies (cascading garbage collection of
//! dependents, synchronously within the request), namespace deletion, collections.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::UNCONDITIONAL_ATTEMPTS;
use crate::api::Api;
use crate::api::object::stored::{decode, encode, store_err};
use crate::api::object::{self, name_of};
use crate::api::registry::{self, RESOURCES, Resource};
use crate::api::request::{Query, Target};
use crate::api::status::ApiError;
use crate::storage::{StoreError, Write};

impl Api {
    /// DELETE of one object. Honours preconditions, finalizers and propagationPolicy. A write
    /// that lost a race with another writer (a node updating the pod's status while a
    /// controller deletes it) is tried again on a fresh read, as upstream's deletion does;
    /// only the caller's own preconditions answer 409.
    pub(crate) async fn delete(&self, t: &Target, opts: &Value, q: &Query) -> Result<Value, ApiError> {
        let mut attempt = 0;
        loop {
            match self.delete_once(t, opts, q).await {
                Err(e) if e.is_stale_write() && attempt < UNCONDITIONAL_ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    async fn delete_once(&self, t: &Target, opts: &Value, q: &Query) -> Result<Value, ApiError> {
        let res = t.res;
        let name = t.name.clone().unwrap_or_default();
        let (mut obj, rev) = self.read_object(res, t.namespace.as_deref(), &name).await?;
        crate::api::authz::node_restriction(res, None, crate::api::authz::node::Write::Delete(&obj))?;
        if let Some(uid) = opts["preconditions"]["uid"].as_str()
            && Some(uid) != obj["metadata"]["uid"].as_str()
        {
            return Err(ApiError::precondition_failed(
                res,
                &name,
                &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                    obj["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(want) = opts["preconditions"]["resourceVersion"].as_str()
            && want != rev.to_string()
        {
            return Err(ApiError::precondition_failed(
                res,
                &name,
                &format!(
                    "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({rev}). The object might have been modified"
                ),
            ));
        }
        let policy = opts["propagationPolicy"]
            .as_str()
            .or(q.get("propagationPolicy"))
            .map(str::to_string)
            .unwrap_or_else(|| "Background".into());
        if !["Background", "Foreground", "Orphan"].contains(&policy.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unsupported propagationPolicy {policy:?}"
            )));
        }
        if q.dry_run()
            || opts["dryRun"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x == "All"))
        {
            return Ok(obj);
        }
        if res.group.is_empty() && res.plural == "namespaces" {
            return self.delete_namespace(&name, obj, rev).await;
        }
        let has_finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if policy == "Foreground" {
            // Dependents first (synchronously), then the owner.
            self.collect_dependents(&obj, "Foreground").await?;
        }
        if policy == "Orphan" {
            self.orphan_dependents(&obj).await?;
        }
        // Graceful pod deletion (docs/SEEDS-SPEC.md API-40): a pod on a node that has not terminated
        // stays, with deletionTimestamp = now + grace, until its node finishes it (grace from the
        // request, else spec.terminationGracePeriodSeconds, default 30). Unscheduled or finished
        // pods, and grace 0, go at once.
        let grace = pod_grace_seconds(res, &obj, opts);
        if has_finalizers || grace > 0 {
            if obj["metadata"]["deletionTimestamp"].is_null() {
                let at = SystemTime::now() + std::time::Duration::from_secs(grace as u64);
                obj["metadata"]["deletionTimestamp"] = json!(object::rfc3339(at));
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                let key = res.key(t.namespace.as_deref(), &name);
                return self.put_at(res, key, &obj, rev, &name).await;
            }
            // Already terminating: finalizers or the node will finish it (a delete with grace 0,
            // as `kubectl delete --force` sends, does not reach here and removes it now).
            return Ok(obj);
        }
        let key = res.key(t.namespace.as_deref(), &name);
        let gone = self.remove(res, key, rev, &name).await?;
        if policy == "Background" {
            self.collect_dependents(&gone, "Background").await?;
        }
        Ok(gone)
    }

    /// Objects (in the owner's namespace, or anywhere for cluster-scoped owners) whose
    /// ownerReferences name `owner`'s uid.
    pub(crate) async fn dependents(
        &self,
        owner: &Value,
    ) -> Result<Vec<(&'static Resource, Value)>, ApiError> {
        let uid = owner["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        let ns = owner["metadata"]["namespace"].as_str().map(str::to_string);
        let mut out = Vec::new();
        for res in RESOURCES.iter().filter(|r| r.namespaced || ns.is_none()) {
            let prefix = match (&ns, res.namespaced) {
                (Some(n), true) => res.namespace_prefix(n),
                _ => res.key_prefix(),
            };
            let page = self.store.list(&prefix, None, 0).await.map_err(store_err)?;
            for kv in &page.items {
                let obj = decode(kv)?;
                let owned = obj["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid.as_str())));
                if owned {
                    out.push((res, obj));
                }
            }
        }
        Ok(out)
    }

    /// Garbage-collects `owner`'s dependents with `policy` (Background or Foreground cascade).
    pub(crate) async fn collect_dependents(&self, owner: &Value, policy: &str) -> Result<(), ApiError> {
        for (res, dep) in self.dependents(owner).await? {
            let t = Target {
                res,
                namespace: dep["metadata"]["namespace"].as_str().map(str::to_string),
                name: Some(name_of(&dep).to_string()),
                sub: None,
            };
            match Box::pin(self.delete(&t, &json!({ "propagationPolicy": policy }), &Query::default())).await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) async fn orphan_dependents(&self, owner: &Value) -> Result<(), ApiError> {
        let uid = owner["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        for (res, mut dep) in self.dependents(owner).await? {
            let rev: i64 = dep["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            if let Some(refs) = dep["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
            }
            let key = res.key(dep["metadata"]["namespace"].as_str(), name_of(&dep));
            match self
                .store
                .write(Write::Update {
                    key,
                    value: encode(&dep),
                    expected: Some(rev),
                })
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(store_err(e)),
            }
        }
        Ok(())
    }

    /// Namespace deletion: Terminating, then every namespaced object in it, then the namespace.
    pub(crate) async fn delete_namespace(
        &self,
        name: &str,
        mut ns: Value,
        rev: i64,
    ) -> Result<Value, ApiError> {
        let res =
            registry::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
        ns["status"]["phase"] = json!("Terminating");
        if ns["metadata"]["deletionTimestamp"].is_null() {
            ns["metadata"]["deletionTimestamp"] = json!(object::rfc3339(SystemTime::now()));
        }
        let terminating = self.put_at(res, res.key(None, name), &ns, rev, name).await?;
        for r in RESOURCES.iter().filter(|r| r.namespaced) {
            let page = self
                .store
                .list(&r.namespace_prefix(name), None, 0)
                .await
                .map_err(store_err)?;
            for kv in page.items {
                match self
                    .store
                    .write(Write::Delete {
                        key: kv.key.clone(),
                        expected: None,
                    })
                    .await
                {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(store_err(e)),
                }
            }
        }
        match self
            .store
            .write(Write::Delete {
                key: res.key(None, name),
                expected: None,
            })
            .await
        {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(store_err(e)),
        }
        Ok(terminating)
    }

    /// DELETE of a collection (with selectors).
    pub(crate) async fn delete_collection(
        &self,
        t: &Target,
        opts: &Value,
        q: &Query,
    ) -> Result<Value, ApiError> {
        let list = self.list_objects(t, q).await?;
        for item in list["items"].as_array().into_iter().flatten() {
            let it = Target {
                res: t.res,
                namespace: item["metadata"]["namespace"].as_str().map(str::to_string),
                name: Some(name_of(item).to_string()),
                sub: None,
            };
            match self.delete(&it, opts, q).await {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(list)
    }
}

/// The grace period a pod deletion gets: 0 (immediate) unless the pod is bound to a node and
/// still running; otherwise the request's gracePeriodSeconds, else the pod's
/// terminationGracePeriodSeconds (default 30).
fn pod_grace_seconds(res: &Resource, pod: &Value, opts: &Value) -> i64 {
    if !(res.group.is_empty() && res.plural == "pods") {
        return 0;
    }
    let bound = pod["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
    let finished = matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    if !bound || finished {
        return 0;
    }
    opts["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0)
}
