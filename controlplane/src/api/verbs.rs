//! The verbs on objects: get, list, create, update, patch, delete (with cascading), plus the
//! pod subresources (binding, eviction) and scale. Objects are stored as JSON without
//! `resourceVersion`; it is set from the store revision on every read.

use std::time::SystemTime;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::object::{self, labels_match, parse_field_selector, parse_label_selector};
use super::registry::{self, RESOURCES, Resource};
use super::status::{self, ApiError};
use super::{Api, Query, Target, Want, patch, table};
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

fn encode(obj: &Value) -> Vec<u8> {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(&o).unwrap_or_default()
}

fn name_of(obj: &Value) -> &str {
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

fn b64_bytes(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn b64(s: &str) -> String {
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
                for o in &mut items {
                    // List items carry no apiVersion/kind in Kubernetes' JSON, but kubectl copes
                    // either way; keeping them makes the items self-describing.
                    let _ = o;
                }
                json!({ "kind": format!("{}List", t.res.kind), "apiVersion": t.res.api_version(), "metadata": meta, "items": items })
            }
        })
    }

    /// Defaults and validation of a new or updated object (the seeds' API-50 defaults that need
    /// no other objects, and the name rules).
    fn admit(&self, res: &Resource, obj: &mut Value, creating: bool) -> Result<(), ApiError> {
        let name = name_of(obj).to_string();
        let name_err = match (res.group, res.plural) {
            ("", "namespaces") | ("", "services") => object::dns1123_label_error(&name),
            _ => object::dns1123_subdomain_error(&name),
        };
        if let Some(msg) = name_err {
            return Err(ApiError::invalid(
                res,
                &name,
                "metadata.name",
                &format!("Invalid value: {name:?}: {msg}"),
            ));
        }
        if let Some(labels) = obj["metadata"]["labels"].as_object() {
            for (k, v) in labels {
                if !v.is_string() {
                    return Err(ApiError::invalid(
                        res,
                        &name,
                        &format!("metadata.labels.{k}"),
                        "Invalid value: must be a string",
                    ));
                }
            }
        }
        match (res.group, res.plural) {
            ("", "namespaces") => {
                obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
                if creating {
                    obj["spec"]["finalizers"] = json!(["kubernetes"]);
                    obj["status"] = json!({ "phase": "Active" });
                }
            }
            ("", "pods") => {
                let containers = obj["spec"]["containers"].as_array().cloned().unwrap_or_default();
                if containers.is_empty() {
                    return Err(ApiError::invalid(res, &name, "spec.containers", "Required value"));
                }
                for (i, c) in containers.iter().enumerate() {
                    if c["name"].as_str().is_none_or(str::is_empty) {
                        return Err(ApiError::invalid(
                            res,
                            &name,
                            &format!("spec.containers[{i}].name"),
                            "Required value",
                        ));
                    }
                    if c["image"].as_str().is_none_or(str::is_empty) {
                        return Err(ApiError::invalid(
                            res,
                            &name,
                            &format!("spec.containers[{i}].image"),
                            "Required value",
                        ));
                    }
                }
                let spec = &mut obj["spec"];
                for (k, v) in [
                    ("restartPolicy", json!("Always")),
                    ("dnsPolicy", json!("ClusterFirst")),
                    ("terminationGracePeriodSeconds", json!(30)),
                    ("schedulerName", json!("default-scheduler")),
                    ("serviceAccountName", json!("default")),
                    ("securityContext", json!({})),
                    ("enableServiceLinks", json!(true)),
                    ("preemptionPolicy", json!("PreemptLowerPriority")),
                    ("priority", json!(0)),
                ] {
                    if spec.get(k).is_none() {
                        spec[k] = v;
                    }
                }
                for list in ["containers", "initContainers"] {
                    if let Some(cs) = spec[list].as_array_mut() {
                        for c in cs {
                            if c.get("imagePullPolicy").is_none() {
                                c["imagePullPolicy"] =
                                    json!(default_pull_policy(c["image"].as_str().unwrap_or_default()));
                            }
                            for (k, v) in [
                                ("terminationMessagePath", json!("/dev/termination-log")),
                                ("terminationMessagePolicy", json!("File")),
                                ("resources", json!({})),
                            ] {
                                if c.get(k).is_none() {
                                    c[k] = v;
                                }
                            }
                        }
                    }
                }
                if creating {
                    obj["status"] = json!({ "phase": "Pending", "qosClass": qos_class(&obj["spec"]) });
                }
            }
            ("apps", "deployments")
            | ("apps", "replicasets")
            | ("apps", "statefulsets")
            | ("apps", "daemonsets") => {
                let sel = &obj["spec"]["selector"];
                if sel.is_null() {
                    return Err(ApiError::invalid(res, &name, "spec.selector", "Required value"));
                }
                let tmpl_labels = obj["spec"]["template"]["metadata"]["labels"].clone();
                let reqs = selector_requirements(sel);
                if !labels_match(&reqs, Some(&tmpl_labels)) {
                    return Err(ApiError::invalid(
                        res,
                        &name,
                        "spec.template.metadata.labels",
                        &format!(
                            "Invalid value: {}: `selector` does not match template `labels`",
                            tmpl_labels
                        ),
                    ));
                }
                if res.plural != "daemonsets" && obj["spec"].get("replicas").is_none() {
                    obj["spec"]["replicas"] = json!(1);
                }
                if res.plural == "deployments" {
                    if obj["spec"].get("revisionHistoryLimit").is_none() {
                        obj["spec"]["revisionHistoryLimit"] = json!(10);
                    }
                    if obj["spec"].get("progressDeadlineSeconds").is_none() {
                        obj["spec"]["progressDeadlineSeconds"] = json!(600);
                    }
                    if obj["spec"].get("strategy").is_none() {
                        obj["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}});
                    }
                }
            }
            ("", "services") => {
                let spec = &mut obj["spec"];
                if spec.get("type").is_none() {
                    spec["type"] = json!("ClusterIP");
                }
                if spec.get("sessionAffinity").is_none() {
                    spec["sessionAffinity"] = json!("None");
                }
                if let Some(ports) = spec["ports"].as_array_mut() {
                    for p in ports {
                        if p.get("protocol").is_none() {
                            p["protocol"] = json!("TCP");
                        }
                        if p.get("targetPort").is_none() {
                            p["targetPort"] = p["port"].clone();
                        }
                    }
                }
            }
            ("", "secrets") => {
                if obj.get("type").is_none() {
                    obj["type"] = json!("Opaque");
                }
                if let Some(sd) = obj
                    .get_mut("stringData")
                    .and_then(Value::as_object_mut)
                    .map(std::mem::take)
                {
                    for (k, v) in sd {
                        obj["data"][&k] = json!(b64(v.as_str().unwrap_or_default()));
                    }
                    if let Some(m) = obj.as_object_mut() {
                        m.remove("stringData");
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn namespace_active(&self, ns: &str) -> Result<(), ApiError> {
        let res =
            registry::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
        match self.read_object(res, None, ns).await {
            Ok((obj, _)) if obj["status"]["phase"] == "Terminating" => Err(ApiError {
                code: 403,
                reason: "Forbidden",
                message: format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
                details: None,
            }),
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Err(ApiError::namespace_not_found(ns)),
            Err(e) => Err(e),
        }
    }

    /// POST: create. Returns (HTTP code, object).
    pub(crate) async fn create(
        &self,
        t: &Target,
        mut obj: Value,
        q: &Query,
        caller: Option<&super::Caller>,
    ) -> Result<(u16, Value), ApiError> {
        let res = t.res;
        if !obj.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        check_type(res, &obj)?;
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
        Ok((201, decode(&ev.kv)?))
    }

    /// CSR admission: records who asked, and approves and signs a kubelet client CSR from a
    /// bootstrapping node (the upstream csrapproving + csrsigning controllers' job for this signer).
    fn admit_csr(&self, csr: &mut Value, caller: Option<&super::Caller>) {
        if let Some(c) = caller {
            csr["spec"]["username"] = json!(c.user);
            csr["spec"]["groups"] = json!(c.groups);
        }
        let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
        let bootstrapping = caller.is_some_and(|c| {
            c.groups
                .iter()
                .any(|g| g == "system:bootstrappers" || g == "system:nodes")
        });
        let Some(pki) = self
            .pki
            .as_ref()
            .filter(|_| signer == crate::pki::KUBELET_CLIENT_SIGNER && bootstrapping)
        else {
            return;
        };
        let pem = csr["spec"]["request"]
            .as_str()
            .and_then(|r| base64::engine::general_purpose::STANDARD.decode(r).ok());
        let now = object::rfc3339(SystemTime::now());
        match pem
            .map(|p| String::from_utf8_lossy(&p).into_owned())
            .map(|p| pki.sign_node_csr(&p))
        {
            Some(Ok(cert)) => {
                csr["status"] = json!({
                    "conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved",
                        "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
                        "lastUpdateTime": now, "lastTransitionTime": now}],
                    "certificate": b64_bytes(cert.as_bytes()),
                });
            }
            other => {
                let reason = match other {
                    Some(Err(r)) => r,
                    _ => "spec.request is not a base64 PEM certificate request".into(),
                };
                tracing::warn!(reason = %reason, "CSR not approved");
                csr["status"] = json!({
                    "conditions": [{"type": "Failed", "status": "True", "reason": "SigningError", "message": reason,
                        "lastUpdateTime": now, "lastTransitionTime": now}],
                });
            }
        }
    }

    /// What every namespace holds from the start: the `default` ServiceAccount and the
    /// `kube-root-ca.crt` ConfigMap.
    async fn populate_namespace(&self, ns: &str) -> Result<(), ApiError> {
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
    async fn replace(
        &self,
        t: &Target,
        old: &Value,
        mut new: Value,
        rev: i64,
        q: &Query,
    ) -> Result<Value, ApiError> {
        let res = t.res;
        let name = t.name.clone().unwrap_or_default();
        check_type(res, &new)?;
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
                // Only status changes through /status.
                let status = new["status"].clone();
                new = old.clone();
                new["status"] = status;
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
        let ev = self
            .store
            .write(Write::Update {
                key,
                value: encode(&new),
                expected: Some(rev),
            })
            .await
            .map_err(store_err_for(res, &name))?;
        decode(&ev.kv)
    }

    /// Deletes `key` if it is still at `rev`; returns the object as it was.
    async fn remove(&self, res: &Resource, key: String, rev: i64, name: &str) -> Result<Value, ApiError> {
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
        self.replace(t, &old, new, rev, q).await
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
        let patch_doc = super::parse_json_body(&media, body)?;
        for attempt in 0..5 {
            let (old, rev) = match self.read_object(t.res, t.namespace.as_deref(), &name).await {
                Ok(x) => x,
                Err(e) if e.code == 404 && media == "application/apply-patch+yaml" => {
                    let target = Target {
                        name: None,
                        ..t.clone()
                    };
                    return self.create(&target, patch_doc, q, None).await;
                }
                Err(e) => return Err(e),
            };
            let mut new = old.clone();
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
                "application/strategic-merge-patch+json" | "application/apply-patch+yaml" => {
                    patch::strategic_merge(&mut new, &patch_doc).map_err(ApiError::bad_request)?
                }
                other => return Err(ApiError::unsupported_media_type(other)),
            }
            // A resourceVersion in the patch is a precondition (kubectl diff sends one).
            if let Some(want) = patch_doc["metadata"]["resourceVersion"].as_str()
                && want != rev.to_string()
            {
                return Err(ApiError::conflict(t.res, &name));
            }
            new["metadata"]["resourceVersion"] = json!(rev.to_string());
            match self.replace(t, &old, new, rev, q).await {
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

    /// DELETE of one object. Honours preconditions, finalizers and propagationPolicy.
    pub(crate) async fn delete(&self, t: &Target, opts: &Value, q: &Query) -> Result<Value, ApiError> {
        let res = t.res;
        let name = t.name.clone().unwrap_or_default();
        let (mut obj, rev) = self.read_object(res, t.namespace.as_deref(), &name).await?;
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
        if has_finalizers {
            if obj["metadata"]["deletionTimestamp"].is_null() {
                obj["metadata"]["deletionTimestamp"] = json!(object::rfc3339(SystemTime::now()));
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                let key = res.key(t.namespace.as_deref(), &name);
                let ev = self
                    .store
                    .write(Write::Update {
                        key,
                        value: encode(&obj),
                        expected: Some(rev),
                    })
                    .await
                    .map_err(store_err_for(res, &name))?;
                return decode(&ev.kv);
            }
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
    async fn dependents(&self, owner: &Value) -> Result<Vec<(&'static Resource, Value)>, ApiError> {
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
    async fn collect_dependents(&self, owner: &Value, policy: &str) -> Result<(), ApiError> {
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

    async fn orphan_dependents(&self, owner: &Value) -> Result<(), ApiError> {
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
    async fn delete_namespace(&self, name: &str, mut ns: Value, rev: i64) -> Result<Value, ApiError> {
        let res =
            registry::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
        ns["status"]["phase"] = json!("Terminating");
        if ns["metadata"]["deletionTimestamp"].is_null() {
            ns["metadata"]["deletionTimestamp"] = json!(object::rfc3339(SystemTime::now()));
        }
        let ev = self
            .store
            .write(Write::Update {
                key: res.key(None, name),
                value: encode(&ns),
                expected: Some(rev),
            })
            .await
            .map_err(store_err_for(res, name))?;
        let terminating = decode(&ev.kv)?;
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
        let list = self.list(t, q, Want::Object).await?;
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

    /// POST pods/<name>/eviction: deletes the pod (disruption budgets are not checked yet).
    pub(crate) async fn evict(&self, t: &Target) -> Result<Value, ApiError> {
        self.delete(t, &Value::Null, &Query::default()).await?;
        Ok(status::success(201))
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
        self.store
            .write(Write::Update {
                key,
                value: encode(&pod),
                expected: Some(rev),
            })
            .await
            .map_err(store_err_for(t.res, &name))?;
        Ok(status::success(201))
    }

    fn scale_of(&self, t: &Target, obj: &Value) -> Value {
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
        let _ = t;
        json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta,
            "spec": { "replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1) },
            "status": { "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector },
        })
    }

    pub(crate) async fn get_scale(&self, t: &Target) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let (obj, _) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
        Ok(self.scale_of(t, &obj))
    }

    /// PUT/PATCH .../scale: changes spec.replicas only.
    pub(crate) async fn patch_scale(&self, t: &Target, ct: &str, body: &Bytes) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let (obj, rev) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
        let mut scale = self.scale_of(t, &obj);
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
        let updated = self.replace(&target, &obj, new, rev, &Query::default()).await?;
        Ok(self.scale_of(t, &updated))
    }
}

/// The label selector of a workload (`matchLabels` and `matchExpressions`) as requirements.
pub(crate) fn selector_requirements(sel: &Value) -> Vec<object::Requirement> {
    let mut reqs = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        for (k, v) in m {
            reqs.push(object::Requirement::Eq(
                k.clone(),
                v.as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default().to_string();
        let values: Vec<String> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        reqs.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => object::Requirement::In(key, values),
            "NotIn" => object::Requirement::NotIn(key, values),
            "Exists" => object::Requirement::Exists(key),
            _ => object::Requirement::NotExists(key),
        });
    }
    reqs
}

/// The request body's apiVersion/kind must match the URL's resource when present.
fn check_type(res: &Resource, obj: &Value) -> Result<(), ApiError> {
    let kind = obj["kind"].as_str().unwrap_or(res.kind);
    let av = obj["apiVersion"].as_str().unwrap_or_default();
    if kind != res.kind || (!av.is_empty() && av != res.api_version()) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({}) or kind {kind} is not {}",
            res.api_version(),
            res.kind
        )));
    }
    Ok(())
}

/// imagePullPolicy default: `:latest` or no tag → Always, otherwise IfNotPresent (digests too).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// QoS class from container requests and limits (limits-only counts as requests = limits).
pub fn qos_class(spec: &Value) -> &'static str {
    let mut all_guaranteed = true;
    let mut any = false;
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let r = &c["resources"];
            for res in ["cpu", "memory"] {
                let limit = r["limits"][res]
                    .as_str()
                    .map(str::to_string)
                    .or(r["limits"][res].as_i64().map(|n| n.to_string()));
                let req = r["requests"][res]
                    .as_str()
                    .map(str::to_string)
                    .or(r["requests"][res].as_i64().map(|n| n.to_string()));
                if limit.is_some() || req.is_some() {
                    any = true;
                }
                match (&req, &limit) {
                    (_, None) => all_guaranteed = false,
                    (Some(q), Some(l)) if q != l => all_guaranteed = false,
                    _ => {}
                }
            }
        }
    }
    if !any {
        "BestEffort"
    } else if all_guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}
