//! The verbs on objects: get, list, create, update, patch, plus pod binding and scale. Objects
//! are stored as JSON without `resourceVersion`; it is set from the store revision on every read.
//! Admission (defaults, validation, CSR signing) is in `admission.rs`, deletion in `delete.rs`.

use std::time::SystemTime;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::admission::{check_shape, check_type, selector_requirements};
use super::object::{self, labels_match, parse_field_selector, parse_label_selector};
use super::registry::{self, Resource};
use super::status::{self, ApiError};
use super::types::Type;
use super::{Api, Query, Target, Want, fieldmanager, openapi, patch, table};
use crate::storage::{KeyValue, StoreError, Write};

/// Maps a store error to an API error for `res`/`name`.
pub(crate) fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Compacted { requested, compacted } => {
            ApiError::gone(format!("too old resource version: {requested} ({compacted})"))
        }
        other => ApiError::internal(other.to_string()),
    }
}

fn store_err_for<'a>(res: &'a Resource, name: &'a str) -> impl FnOnce(StoreError) -> ApiError + 'a {
    move |e| match e {
        StoreError::NotFound { .. } => ApiError::not_found(res, name),
        StoreError::AlreadyExists { .. } => ApiError::already_exists(res, name),
        StoreError::Conflict { .. } => ApiError::conflict(res, name),
        other => store_err(other),
    }
}

/// Decodes a stored object and sets its resourceVersion.
pub(crate) fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut v: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("stored object {}: {e}", kv.key)))?;
    v["metadata"]["resourceVersion"] = json!(kv.mod_revision.to_string());
    Ok(v)
}

/// The stored form of an object: everything but its resourceVersion (the store's revision),
/// serialized in place (no copy of the object).
pub(crate) fn encode(obj: &Value) -> Vec<u8> {
    serde_json::to_vec(&Stored(obj)).unwrap_or_default()
}

struct Stored<'a>(&'a Value);

impl serde::Serialize for Stored<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(top) = self.0.as_object() else {
            return self.0.serialize(s);
        };
        let mut map = s.serialize_map(Some(top.len()))?;
        for (k, v) in top {
            match v.as_object() {
                Some(meta) if k == "metadata" => map.serialize_entry(k, &WithoutVersion(meta))?,
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

struct WithoutVersion<'a>(&'a serde_json::Map<String, Value>);

impl serde::Serialize for WithoutVersion<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.0.iter().filter(|(k, _)| k.as_str() != "resourceVersion") {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// `obj` as the store now holds it, at revision `rev` (what decoding the write would give).
fn stored_at(mut obj: Value, rev: i64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(rev.to_string());
    obj
}

pub(crate) fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// Fields each kind can be selected by, besides metadata.name and metadata.namespace.
fn selectable_fields(res: &Resource) -> &'static [&'static str] {
    match (res.group, res.plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "secrets") => &["type"],
        ("apps", "replicasets") => &["status.replicas"],
        ("batch", "jobs") => &["status.successful"],
        ("certificates.k8s.io", "certificatesigningrequests") => &["spec.signerName"],
        _ => &[],
    }
}

/// A compiled list/watch filter.
pub(crate) struct Filter {
    labels: Vec<object::Requirement>,
    fields: Vec<object::FieldTerm>,
}

impl Filter {
    pub(crate) fn from_query(res: &Resource, q: &Query) -> Result<Self, ApiError> {
        let labels = parse_label_selector(q.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        let fields = parse_field_selector(q.get("fieldSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        let extra = selectable_fields(res);
        for (f, _, _) in &fields {
            if f != "metadata.name" && f != "metadata.namespace" && !extra.contains(&f.as_str()) {
                let mut known = vec![
                    "\"metadata.name\"".to_string(),
                    "\"metadata.namespace\"".to_string(),
                ];
                known.extend(extra.iter().map(|e| format!("\"{e}\"")));
                return Err(ApiError::bad_request(format!(
                    "\"{f}\" is not a known field selector: only {}",
                    known.join(", ")
                )));
            }
        }
        Ok(Self { labels, fields })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        labels_match(&self.labels, obj["metadata"].get("labels"))
            && self.fields.iter().all(|(f, want, eq)| {
                let got = object::field_value(obj, f);
                let got = if got.is_empty() && f == "spec.unschedulable" {
                    "false".to_string()
                } else {
                    got
                };
                (got == *want) == *eq
            })
    }
}

/// A client does not set the status of what it creates: kinds with a status subresource start
/// from an empty status (Go's `PrepareForCreate`), except nodes (their agent reports status at
/// registration), pods and namespaces (admission sets theirs) and volumes and claims.
fn reset_status_on_create(res: &Resource, obj: &mut Value) {
    let keep = res.group.is_empty()
        && matches!(
            res.kind,
            "Node" | "Pod" | "Namespace" | "PersistentVolume" | "PersistentVolumeClaim"
        );
    if !res.has_subresource("status") || keep {
        return;
    }
    obj["status"] = if res.group.is_empty() && res.kind == "Service" {
        json!({"loadBalancer": {}})
    } else {
        json!({})
    };
}

/// Whether a write still has its field ownership to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fields {
    /// Record it as an `Update` by the request's field manager (if it names one).
    Record,
    /// Already recorded (server-side apply).
    Recorded,
}

/// The field-ownership writer of a request (None for the server's own writes).
fn writer<'a>(t: &Target, q: &'a Query, now: &'a str) -> Option<fieldmanager::Writer<'a>> {
    let scope = if t.sub.as_deref() == Some("status") {
        fieldmanager::Scope::Status
    } else {
        fieldmanager::Scope::Main {
            status_is_separate: t.res.has_subresource("status"),
        }
    };
    Some(fieldmanager::Writer {
        manager: q.field_manager()?,
        api_version: t.res.api_version(),
        scope,
        now,
    })
}

/// Applies `fieldValidation` (OpenAPI schemas): Strict refuses unknown fields, Warn (the
/// default) drops them with a `Warning: 299 - "unknown field \"...\""` header, Ignore drops them
/// silently (Go's typed decoding never stores them).
fn drop_unknown_fields(res: &Resource, obj: &mut Value, q: &Query) -> Result<(), ApiError> {
    let mode = openapi::FieldValidation::parse(q.get("fieldValidation"))?;
    let dropped = openapi::enforce(res, obj, mode)?;
    if !dropped.is_empty() {
        tracing::info!(
            kind = res.kind,
            name = name_of(obj),
            ?dropped,
            "unknown fields dropped"
        );
        if mode == openapi::FieldValidation::Warn {
            for f in dropped {
                super::warn(format!("unknown field {f:?}"));
            }
        }
    }
    Ok(())
}

pub(crate) fn b64_bytes(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub(crate) fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(s: &str) -> Option<String> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

impl Api {
    pub(crate) async fn read_object(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(Value, i64), ApiError> {
        let kv = self
            .store
            .get(&res.key(ns, name))
            .await
            .map_err(store_err)?
            .ok_or_else(|| ApiError::not_found(res, name))?;
        Ok((decode(&kv)?, kv.mod_revision))
    }

    pub(crate) async fn get(&self, t: &Target, want: Want) -> Result<Value, ApiError> {
        let name = t.name.as_deref().unwrap_or_default();
        let (obj, rev) = self.read_object(t.res, t.namespace.as_deref(), name).await?;
        Ok(match want {
            Want::Table => table::table(t.res, &[obj], &rev.to_string(), None, false),
            Want::Object => obj,
        })
    }

    pub(crate) async fn list(&self, t: &Target, q: &Query, want: Want) -> Result<Value, ApiError> {
        let filter = Filter::from_query(t.res, q)?;
        let prefix = match &t.namespace {
            Some(ns) => t.res.namespace_prefix(ns),
            None => t.res.key_prefix(),
        };
        let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut start = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => Some(
                unb64(c)
                    .filter(|k| k.starts_with(&prefix))
                    .ok_or_else(|| ApiError::bad_request("the provided continue parameter is invalid"))?,
            ),
            None => None,
        };
        let mut items = Vec::new();
        let mut revision;
        let mut next = None;
        // Filters apply after the read: keep reading pages until `limit` matches or the end.
        loop {
            let page = self
                .store
                .list(&prefix, start.as_deref(), if limit > 0 { limit } else { 0 })
                .await
                .map_err(store_err)?;
            revision = page.revision;
            let last_key = page.items.last().map(|kv| kv.key.clone());
            for kv in &page.items {
                let obj = decode(kv)?;
                if filter.matches(&obj) {
                    items.push(obj);
                }
            }
            if !page.more {
                break;
            }
            if limit > 0 && items.len() >= limit {
                next = last_key.map(|k| b64(&k));
                break;
            }
            start = last_key;
        }
        let rv = revision.to_string();
        Ok(match want {
            Want::Table => table::table(
                t.res,
                &items,
                &rv,
                next.as_deref(),
                q.get("includeObject") == Some("Object"),
            ),
            Want::Object => {
                let mut meta = json!({ "resourceVersion": rv });
                if let Some(c) = &next {
                    meta["continue"] = json!(c);
                }
                json!({ "kind": format!("{}List", t.res.kind), "apiVersion": t.res.api_version(), "metadata": meta, "items": items })
            }
        })
    }

    /// POST: create. Returns (HTTP code, object).
    pub(crate) async fn create(
        &self,
        t: &Target,
        obj: Value,
        q: &Query,
        caller: Option<&super::Caller>,
    ) -> Result<(u16, Value), ApiError> {
        self.create_as(t, obj, q, caller, Fields::Record).await
    }

    /// Create, with `fields` saying whether the write's field ownership is still to be recorded.
    pub(crate) async fn create_as(
        &self,
        t: &Target,
        mut obj: Value,
        q: &Query,
        caller: Option<&super::Caller>,
        fields: Fields,
    ) -> Result<(u16, Value), ApiError> {
        let res = t.res;
        check_shape(res, &obj)?;
        check_type(res, &obj)?;
        drop_unknown_fields(res, &mut obj, q)?;
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        let ns = if res.namespaced {
            let body_ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
            let ns = t
                .namespace
                .clone()
                .or(body_ns.clone())
                .unwrap_or_else(|| "default".into());
            if body_ns.is_some_and(|b| b != ns) {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            obj["metadata"]["namespace"] = json!(ns);
            Some(ns)
        } else {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            None
        };
        if name_of(&obj).is_empty() {
            match obj["metadata"]["generateName"].as_str() {
                Some(g) if !g.is_empty() => {
                    obj["metadata"]["name"] = json!(format!("{g}{}", object::random_suffix()))
                }
                _ => {
                    return Err(ApiError::invalid(
                        res,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ));
                }
            }
        }
        if let Some(ns) = &ns {
            self.namespace_active(ns).await?;
        }
        reset_status_on_create(res, &mut obj);
        self.admit(res, &mut obj, true)?;
        let meta = &mut obj["metadata"];
        meta["uid"] = json!(object::new_uid());
        meta["creationTimestamp"] = json!(object::rfc3339(SystemTime::now()));
        if let Some(m) = meta.as_object_mut() {
            for k in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(k);
            }
        }
        if obj.get("spec").is_some() {
            obj["metadata"]["generation"] = json!(1);
        }
        let now = object::rfc3339(SystemTime::now());
        if let (Fields::Record, Some(w)) = (fields, writer(t, q, &now)) {
            fieldmanager::record_update(Type::of_kind(&res.api_version(), res.kind), None, &mut obj, w);
        }
        let name = name_of(&obj).to_string();
        if res.group == "certificates.k8s.io" && res.plural == "certificatesigningrequests" {
            self.admit_csr(&mut obj, caller);
        }
        if q.dry_run() {
            return Ok((201, obj));
        }
        let ev = self
            .store
            .write(Write::Create {
                key: res.key(ns.as_deref(), &name),
                value: encode(&obj),
            })
            .await
            .map_err(store_err_for(res, &name))?;
        if res.plural == "namespaces" && res.group.is_empty() {
            self.populate_namespace(&name).await?;
        }
        Ok((201, stored_at(obj, ev.kv.mod_revision)))
    }

    /// What every namespace holds from the start: the `default` ServiceAccount and the
    /// `kube-root-ca.crt` ConfigMap.
    pub(crate) async fn populate_namespace(&self, ns: &str) -> Result<(), ApiError> {
        let items = [
            (
                "serviceaccounts",
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
            ),
            (
                "configmaps",
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"},
                       "data": {"ca.crt": self.ca_pem}}),
            ),
        ];
        for (plural, body) in items {
            let res = registry::find("", "v1", plural).ok_or_else(|| ApiError::internal(plural))?;
            let t = Target {
                res,
                namespace: Some(ns.into()),
                name: None,
                sub: None,
            };
            match Box::pin(self.create(&t, body, &Query::default(), None)).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
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
            Some("status") => {
                // Only status changes through /status (and, after an apply, the field owners).
                let status = new["status"].clone();
                let owners = new["metadata"].get("managedFields").cloned();
                new = old.clone();
                new["status"] = status;
                if let (Fields::Recorded, Some(mf)) = (fields, owners) {
                    new["metadata"]["managedFields"] = mf;
                }
            }
            _ if has_status_sub => new["status"] = old["status"].clone(),
            _ => {}
        }
        if new["status"].is_null()
            && let Some(m) = new.as_object_mut()
        {
            m.remove("status");
        }
        self.admit(res, &mut new, false)?;
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
        if deleting && finalizers_empty {
            // The last finalizer is gone: the object goes away now.
            let gone = self.remove(res, key, rev, &name).await?;
            self.collect_dependents(&gone, "Background").await?;
            return Ok(gone);
        }
        self.put_at(res, key, &new, rev, &name).await
    }

    /// Writes `obj` at `key` if the key is still at `rev`; returns the object as stored.
    pub(crate) async fn put_at(
        &self,
        res: &Resource,
        key: String,
        obj: &Value,
        rev: i64,
        name: &str,
    ) -> Result<Value, ApiError> {
        let ev = self
            .store
            .write(Write::Update {
                key,
                value: encode(obj),
                expected: Some(rev),
            })
            .await
            .map_err(store_err_for(res, name))?;
        Ok(stored_at(obj.clone(), ev.kv.mod_revision))
    }

    /// Deletes `key` if it is still at `rev`; returns the object as it was.
    pub(crate) async fn remove(
        &self,
        res: &Resource,
        key: String,
        rev: i64,
        name: &str,
    ) -> Result<Value, ApiError> {
        let ev = self
            .store
            .write(Write::Delete {
                key,
                expected: Some(rev),
            })
            .await
            .map_err(store_err_for(res, name))?;
        decode(&ev.kv)
    }

    /// PUT.
    pub(crate) async fn update(&self, t: &Target, new: Value, q: &Query) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let (old, rev) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
        let expected = match new["metadata"]["resourceVersion"].as_str() {
            Some(s) if !s.is_empty() => s
                .parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?,
            _ => rev,
        };
        if expected != rev {
            return Err(ApiError::conflict(t.res, &name));
        }
        self.replace(t, &old, new, rev, q, Fields::Record).await
    }

    /// PATCH (merge, JSON, strategic, apply). Server-side apply creates missing objects.
    pub(crate) async fn patch(
        &self,
        t: &Target,
        ct: &str,
        body: &Bytes,
        q: &Query,
    ) -> Result<(u16, Value), ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let media = ct.split(';').next().unwrap_or_default().trim().to_string();
        let ty = Type::of_kind(&t.res.api_version(), t.res.kind);
        let patch_doc = super::parse_json_body(&media, body)?;
        if media == "application/apply-patch+yaml" {
            check_shape(t.res, &patch_doc)?;
        }
        for attempt in 0..5 {
            let (old, rev) = match self.read_object(t.res, t.namespace.as_deref(), &name).await {
                Ok(x) => x,
                Err(e) if e.code == 404 && media == "application/apply-patch+yaml" => {
                    let target = Target {
                        name: None,
                        ..t.clone()
                    };
                    let now = object::rfc3339(SystemTime::now());
                    let obj = match writer(t, q, &now) {
                        Some(w) => fieldmanager::apply(ty, &Value::Null, &patch_doc, q.flag("force"), w)?,
                        None => patch_doc,
                    };
                    return self.create_as(&target, obj, q, None, Fields::Recorded).await;
                }
                Err(e) => return Err(e),
            };
            let mut new = old.clone();
            let mut fields = Fields::Record;
            match media.as_str() {
                "application/merge-patch+json" => patch::merge_patch(&mut new, &patch_doc),
                "application/json-patch+json" => {
                    patch::json_patch(&mut new, &patch_doc).map_err(|e| ApiError {
                        code: 422,
                        reason: "Invalid",
                        message: e,
                        details: None,
                    })?
                }
                "application/strategic-merge-patch+json" => {
                    patch::strategic_merge(&mut new, &patch_doc, ty).map_err(ApiError::bad_request)?
                }
                "application/apply-patch+yaml" => {
                    let now = object::rfc3339(SystemTime::now());
                    if let Some(w) = writer(t, q, &now) {
                        new = fieldmanager::apply(ty, &old, &patch_doc, q.flag("force"), w)?;
                        fields = Fields::Recorded;
                    } else {
                        patch::strategic_merge(&mut new, &patch_doc, ty).map_err(ApiError::bad_request)?
                    }
                }
                other => return Err(ApiError::unsupported_media_type(other)),
            }
            // A resourceVersion in the patch is a precondition (kubectl diff sends one).
            if let Some(want) = patch_doc["metadata"]["resourceVersion"].as_str()
                && want != rev.to_string()
            {
                return Err(ApiError::conflict(t.res, &name));
            }
            check_shape(t.res, &new)?;
            new["metadata"]["resourceVersion"] = json!(rev.to_string());
            match self.replace(t, &old, new, rev, q, fields).await {
                Err(e)
                    if e.reason == "Conflict"
                        && attempt < 4
                        && patch_doc["metadata"]["resourceVersion"].is_null() =>
                {
                    continue;
                }
                other => return other.map(|v| (200, v)),
            }
        }
        Err(ApiError::conflict(t.res, &name))
    }

    /// POST pods/<name>/binding: sets spec.nodeName once.
    pub(crate) async fn bind(&self, t: &Target, binding: Value) -> Result<Value, ApiError> {
        let node = binding["target"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    t.res,
                    t.name.as_deref().unwrap_or_default(),
                    "target.name",
                    "Required value",
                )
            })?;
        let name = t.name.clone().unwrap_or_default();
        let (mut pod, rev) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
        if pod["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty()) {
            return Err(ApiError::precondition_failed(
                t.res,
                &name,
                &format!(
                    "pod {name} is already assigned to node {:?}",
                    pod["spec"]["nodeName"]
                ),
            ));
        }
        pod["spec"]["nodeName"] = json!(node);
        let key = t.res.key(t.namespace.as_deref(), &name);
        self.put_at(t.res, key, &pod, rev, &name).await?;
        Ok(status::success(201))
    }

    pub(crate) fn scale_of(obj: &Value) -> Value {
        let sel = selector_requirements(&obj["spec"]["selector"]);
        let selector = sel
            .iter()
            .filter_map(|r| match r {
                object::Requirement::Eq(k, v) => Some(format!("{k}={v}")),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut meta = obj["metadata"].clone();
        if let Some(m) = meta.as_object_mut() {
            m.retain(|k, _| {
                ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"].contains(&k.as_str())
            });
        }
        json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta,
            "spec": { "replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1) },
            "status": { "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector },
        })
    }

    pub(crate) async fn get_scale(&self, t: &Target) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let (obj, _) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
        Ok(Self::scale_of(&obj))
    }

    /// PUT/PATCH .../scale: changes spec.replicas only.
    pub(crate) async fn patch_scale(
        &self,
        t: &Target,
        ct: &str,
        body: &Bytes,
        q: &Query,
    ) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let (obj, rev) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
        let mut scale = Self::scale_of(&obj);
        let doc = super::parse_json_body(ct, body)?;
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/json-patch+json" => {
                patch::json_patch(&mut scale, &doc).map_err(ApiError::bad_request)?
            }
            "application/json" => scale = doc,
            _ => patch::merge_patch(&mut scale, &doc),
        }
        let replicas = scale["spec"]["replicas"]
            .as_i64()
            .filter(|r| *r >= 0)
            .ok_or_else(|| {
                ApiError::invalid(
                    t.res,
                    &name,
                    "spec.replicas",
                    "Invalid value: must be greater than or equal to 0",
                )
            })?;
        let mut new = obj.clone();
        new["spec"]["replicas"] = json!(replicas);
        let target = Target {
            sub: None,
            ..t.clone()
        };
        let updated = self.replace(&target, &obj, new, rev, q, Fields::Record).await?;
        Ok(Self::scale_of(&updated))
    }
}
