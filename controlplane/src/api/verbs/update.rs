//! PUT (with the stale-resourceVersion 409) and the replace step every write of an existing
//! object goes through: what clients may not change, status subresource rules, generation,
//! field ownership, and the final delete of a terminating object whose finalizers are gone.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::{Fields, UNCONDITIONAL_ATTEMPTS, drop_unknown_fields, fieldmanager, writer};
use crate::api::Api;
use crate::api::admission::{self, check_shape, check_type};
use crate::api::object::{self, name_of};
use crate::api::registry::Resource;
use crate::api::request::{Query, Target};
use crate::api::schema::Type;
use crate::api::status::ApiError;

impl Api {
    /// PUT.
    pub(crate) async fn update(&self, t: &Target, new: Value, q: &Query) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let expected = match new["metadata"]["resourceVersion"].as_str() {
            Some(s) if !s.is_empty() => Some(
                s.parse::<i64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?,
            ),
            _ => None,
        };
        // Without a resourceVersion the PUT is unconditional: a write that lost a race is
        // retried on a fresh read (upstream's GuaranteedUpdate), not answered with 409.
        let mut attempt = 0;
        loop {
            let (old, rev) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
            if expected.is_some_and(|want| want != rev) {
                return Err(ApiError::conflict(t.res, &name));
            }
            match self.replace(t, &old, new.clone(), rev, q, Fields::Record).await {
                Err(e) if e.is_stale_write() && expected.is_none() && attempt < UNCONDITIONAL_ATTEMPTS => {
                    attempt += 1
                }
                other => return other,
            }
        }
    }

    /// Writes `new` over the stored object at `rev`, keeping what clients may not change.
    pub(crate) async fn replace(
        &self,
        t: &Target,
        old: &Value,
        mut new: Value,
        rev: i64,
        q: &Query,
        fields: Fields,
    ) -> Result<Value, ApiError> {
        let res = t.res;
        let name = t.name.clone().unwrap_or_default();
        check_shape(res, &new)?;
        check_type(res, &new)?;
        drop_unknown_fields(res, &mut new, q)?;
        new["apiVersion"] = json!(res.api_version());
        new["kind"] = json!(res.kind);
        if name_of(&new) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&new)
            )));
        }
        if let Some(uid) = new["metadata"]["uid"].as_str()
            && Some(uid) != old["metadata"]["uid"].as_str()
        {
            return Err(ApiError::precondition_failed(
                res,
                &name,
                "the UID in the precondition does not match the UID in record",
            ));
        }
        for k in [
            "uid",
            "creationTimestamp",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old["metadata"].get(k) {
                Some(v) => new["metadata"][k] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(k);
                    }
                }
            }
        }
        let has_status_sub = res.has_subresource("status");
        match t.sub.as_deref() {
            Some("finalize") => {
                // Only `spec.finalizers` changes through a namespace's /finalize.
                let finalizers = new["spec"]["finalizers"].clone();
                new = old.clone();
                new["spec"]["finalizers"] = finalizers;
            }
            Some("status") => {
                // Only status changes through /status (and, after an apply, the field owners).
                let status = new.get_mut("status").map(Value::take).unwrap_or_default();
                let owners = new
                    .get_mut("metadata")
                    .and_then(|m| m.get_mut("managedFields"))
                    .map(Value::take);
                new = clone_except(old, "status");
                new["status"] = status;
                if let (Fields::Recorded, Some(mf)) = (fields, owners) {
                    new["metadata"]["managedFields"] = mf;
                }
            }
            Some("ephemeralcontainers") => {
                // Only `spec.ephemeralContainers` changes through /ephemeralcontainers.
                let ephemeral = new["spec"].get("ephemeralContainers").cloned();
                new = old.clone();
                set_or_remove(&mut new["spec"], "ephemeralContainers", ephemeral);
            }
            _ if has_status_sub => new["status"] = old["status"].clone(),
            _ => {}
        }
        if t.sub.is_none() && res.group.is_empty() && res.plural == "pods" {
            // A pod's ephemeral containers change only through their subresource.
            let ephemeral = old["spec"].get("ephemeralContainers").cloned();
            set_or_remove(&mut new["spec"], "ephemeralContainers", ephemeral);
        }
        if new["status"].is_null()
            && let Some(m) = new.as_object_mut()
        {
            m.remove("status");
        }
        admission::admit(res, &mut new, false)?;
        if t.sub.as_deref() == Some("ephemeralcontainers") {
            check_ephemeral(res, &name, old, &new)?;
        }
        if res.group.is_empty() && res.plural == "services" {
            super::clusterip::keep_cluster_ip(old, &mut new, &name)?;
        }
        crate::api::authz::node_restriction(
            res,
            t.sub.as_deref(),
            crate::api::authz::node::Write::Update { old, new: &new },
        )?;
        crate::api::authz::escalation::check(&self.authz, res, &new)?;
        if old.get("spec") != new.get("spec") {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(0);
            new["metadata"]["generation"] = json!(g + 1);
        }
        let now = object::rfc3339(SystemTime::now());
        match (fields, writer(t, q, &now)) {
            (Fields::Record, Some(w)) => fieldmanager::record_update(
                Type::of_kind(&res.api_version(), res.kind),
                Some(old),
                &mut new,
                w,
            ),
            // The server's own writes and applies (already recorded) keep what is there.
            _ if new["metadata"].get("managedFields").is_none() => {
                if let Some(mf) = old["metadata"].get("managedFields") {
                    new["metadata"]["managedFields"] = mf.clone();
                }
            }
            _ => {}
        }
        let deleting = new["metadata"]["deletionTimestamp"].is_string();
        let finalizers_empty = new["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        if q.dry_run() {
            new["metadata"]["resourceVersion"] = json!(rev.to_string());
            return Ok(new);
        }
        let key = res.key(t.namespace.as_deref(), &name);
        // A namespace also waits for its `spec.finalizers` (the namespace controller's).
        let spec_finalizers_empty = !(res.group.is_empty() && res.plural == "namespaces")
            || new["spec"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        // An object in graceful deletion (a pod its node is stopping) is not removed by an
        // update: its node's final delete does that (upstream's shouldDeleteDuringUpdate).
        let graceful = old["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .is_some_and(|g| g > 0);
        if deleting && finalizers_empty && spec_finalizers_empty && !graceful {
            // The last finalizer is gone: the object goes away now (its dependents are the
            // garbage collector's).
            return self.remove(res, key, rev, &name).await;
        }
        self.put_at(res, key, new, rev, &name).await
    }
}

/// A copy of `obj` without its member `key` (what is about to be replaced needs no copy).
fn clone_except(obj: &Value, key: &str) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != key)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Sets `obj[key]` to `v`, or removes the key when `v` is None.
fn set_or_remove(obj: &mut Value, key: &str, v: Option<Value>) {
    match v {
        Some(v) => obj[key] = v,
        None => {
            if let Some(m) = obj.as_object_mut() {
                m.remove(key);
            }
        }
    }
}

/// The rules of `pods/ephemeralcontainers` ([`admission::ephemeral`]) over the typed pods.
fn check_ephemeral(res: &Resource, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    let typed = |v: &Value| {
        serde_json::from_value::<Pod>(v.clone())
            .map_err(|e| ApiError::bad_request(format!("decoding the pod: {e}")))
    };
    let errors: Vec<(String, String)> = admission::ephemeral::check_update(&typed(old)?, &typed(new)?)
        .into_iter()
        .map(|e| (e.field, e.message))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_fields(res, name, &errors))
    }
}
