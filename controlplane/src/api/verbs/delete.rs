//! Deletion: preconditions, the propagation policy's finalizers (the API's part of garbage
//! collection, as upstream's registry does it: `orphan` or `foregroundDeletion` on the object,
//! dependents left to the garbage collector), graceful pod deletion, finalizers, namespace
//! deletion (emptied by the namespace controller), collections.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::UNCONDITIONAL_ATTEMPTS;
use crate::api::Api;
use crate::api::object::{self, name_of};
use crate::api::registry::{self, Resource};
use crate::api::request::{Query, Target};
use crate::api::status::ApiError;

/// The finalizer that makes the garbage collector orphan an object's dependents first.
pub const ORPHAN_FINALIZER: &str = "orphan";
/// The finalizer that makes the garbage collector delete an object's blocking dependents first.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// The propagation policy a delete asks for (`propagationPolicy`, else the legacy
/// `orphanDependents`), or None for the kind's default.
fn requested_policy(opts: &Value, q: &Query) -> Result<Option<&'static str>, ApiError> {
    let explicit = opts["propagationPolicy"]
        .as_str()
        .or(q.get("propagationPolicy"))
        .map(str::to_string);
    let orphan_dependents = opts["orphanDependents"]
        .as_bool()
        .or(q.get("orphanDependents").and_then(|v| v.parse().ok()));
    if explicit.is_some() && orphan_dependents.is_some() {
        return Err(invalid_delete_options(
            "propagationPolicy",
            "Invalid value: \"null\": orphanDependents and deletionPropagation cannot be both set",
        ));
    }
    match explicit.as_deref() {
        Some("Background") => Ok(Some("Background")),
        Some("Foreground") => Ok(Some("Foreground")),
        Some("Orphan") => Ok(Some("Orphan")),
        Some(other) => Err(invalid_delete_options(
            "propagationPolicy",
            &format!(
                "Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            ),
        )),
        None => Ok(orphan_dependents.map(|o| if o { "Orphan" } else { "Background" })),
    }
}

/// A 422 about DeleteOptions, as upstream's validation words it.
fn invalid_delete_options(field: &str, message: &str) -> ApiError {
    ApiError {
        code: 422,
        reason: "Invalid",
        message: format!("DeleteOptions.meta.k8s.io \"\" is invalid: {field}: {message}"),
        details: Some(json!({
            "group": "meta.k8s.io", "kind": "DeleteOptions",
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}]
        })),
    }
}

/// Upstream's default garbage-collection policy of a kind: batch/v1 Jobs orphan their pods
/// (kept for compatibility; kubectl always asks for Background), everything else deletes its
/// dependents in the background.
fn default_policy(res: &Resource) -> &'static str {
    if res.group == "batch" && res.plural == "jobs" {
        "Orphan"
    } else {
        "Background"
    }
}

/// The object's finalizers after a delete with `policy` (upstream's
/// `deletionFinalizersForGarbageCollection`): without an explicit policy an existing `orphan` or
/// `foregroundDeletion` finalizer stays, else the kind's default applies.
pub(crate) fn finalizers_for_deletion(
    res: &Resource,
    current: &[String],
    policy: Option<&str>,
) -> Vec<String> {
    let has = |f: &str| current.iter().any(|c| c == f);
    let effective = match policy {
        Some(p) => p,
        None if has(ORPHAN_FINALIZER) => "Orphan",
        None if has(FOREGROUND_FINALIZER) => "Foreground",
        None => default_policy(res),
    };
    let mut out: Vec<String> = current
        .iter()
        .filter(|f| *f != ORPHAN_FINALIZER && *f != FOREGROUND_FINALIZER)
        .cloned()
        .collect();
    match effective {
        "Orphan" => out.push(ORPHAN_FINALIZER.into()),
        "Foreground" => out.push(FOREGROUND_FINALIZER.into()),
        _ => {}
    }
    out
}

fn finalizers_of(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

impl Api {
    /// DELETE of one object. Honours preconditions, the propagation policy (as finalizers for
    /// the garbage collector), finalizers and graceful pod deletion. A write
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
        let policy = requested_policy(opts, q)?;
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
        let current = finalizers_of(&obj);
        let finalizers = finalizers_for_deletion(res, &current, policy);
        let key = res.key(t.namespace.as_deref(), &name);
        if obj["metadata"]["deletionTimestamp"].is_string() {
            // Already terminating: finalizers or the node will finish it. Only a new explicit
            // policy changes its garbage-collection finalizer (a delete with grace 0, as
            // `kubectl delete --force` sends, of a pod without finalizers removes it now).
            let grace = pod_grace_seconds(res, &obj, opts);
            if current.is_empty() && grace == 0 && res.group.is_empty() && res.plural == "pods" {
                return self.remove(res, key, rev, &name).await;
            }
            if policy.is_some() && finalizers != current {
                obj["metadata"]["finalizers"] = json!(finalizers);
                return self.put_at(res, key, obj, rev, &name).await;
            }
            return Ok(obj);
        }
        // Graceful pod deletion (docs/SEEDS-SPEC.md API-40): a pod on a node that has not terminated
        // stays, with deletionTimestamp = now + grace, until its node finishes it (grace from the
        // request, else spec.terminationGracePeriodSeconds, default 30). Unscheduled or finished
        // pods, and grace 0, go at once.
        let grace = pod_grace_seconds(res, &obj, opts);
        if !finalizers.is_empty() || grace > 0 {
            let at = SystemTime::now() + std::time::Duration::from_secs(grace as u64);
            obj["metadata"]["deletionTimestamp"] = json!(object::rfc3339(at));
            obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            if finalizers.is_empty() {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("finalizers");
                }
            } else {
                obj["metadata"]["finalizers"] = json!(finalizers);
            }
            return self.put_at(res, key, obj, rev, &name).await;
        }
        // Dependents are the garbage collector's (it sees this deletion).
        self.remove(res, key, rev, &name).await
    }

    /// Namespace deletion: Terminating with a deletionTimestamp; the namespace controller
    /// empties it and removes the `kubernetes` finalizer, and the namespace goes away when no
    /// finalizer is left. A second delete while that runs is a conflict, as upstream.
    pub(crate) async fn delete_namespace(
        &self,
        name: &str,
        mut ns: Value,
        rev: i64,
    ) -> Result<Value, ApiError> {
        let res =
            registry::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
        let spec_finalizers = ns["spec"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        let finalizers = !finalizers_of(&ns).is_empty();
        let key = res.key(None, name);
        if !spec_finalizers && !finalizers {
            return self.remove(res, key, rev, name).await;
        }
        if ns["metadata"]["deletionTimestamp"].is_string() {
            if spec_finalizers {
                return Err(ApiError::precondition_failed(
                    res,
                    name,
                    "The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system.",
                ));
            }
            return Ok(ns);
        }
        ns["status"]["phase"] = json!("Terminating");
        ns["metadata"]["deletionTimestamp"] = json!(object::rfc3339(SystemTime::now()));
        ns["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        self.put_at(res, key, ns, rev, name).await
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
