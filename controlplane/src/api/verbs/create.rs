//! POST: create (generateName, uid, timestamps, generation, admission, field ownership), and
//! what the first namespaces start with.

use std::sync::OnceLock;
use std::time::SystemTime;

use serde_json::{Value, json};

use super::{Fields, drop_unknown_fields, fieldmanager, writer};
use crate::api::Api;
use crate::api::admission::{self, check_shape, check_type};
use crate::api::object::sparse::Paths;
use crate::api::object::stored::{decode, encode, store_err, store_err_for, stored_at};
use crate::api::object::{self, name_of};
use crate::api::registry::{self, Resource};
use crate::api::request::{Caller, Query, Target};
use crate::api::schema::Type;
use crate::api::status::ApiError;
use crate::storage::Write;

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

impl Api {
    /// POST: create. Returns (HTTP code, object).
    pub(crate) async fn create(
        &self,
        t: &Target,
        obj: Value,
        q: &Query,
        caller: Option<&Caller>,
    ) -> Result<(u16, Value), ApiError> {
        self.create_as(t, obj, q, caller, Fields::Record).await
    }

    /// Create, with `fields` saying whether the write's field ownership is still to be recorded.
    pub(crate) async fn create_as(
        &self,
        t: &Target,
        mut obj: Value,
        q: &Query,
        caller: Option<&Caller>,
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
        // Admission names a pod by what the request said: its name or, before one is
        // generated, its generateName (as upstream's mutating admission sees it).
        let shown = match name_of(&obj) {
            "" => obj["metadata"]["generateName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            n => n.to_string(),
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
        if res.plural == "pods" && res.group.is_empty() {
            self.resolve_priority(&mut obj).await?;
        }
        admission::admit(res, &mut obj, true)?;
        if let (Some(ns), true) = (&ns, res.plural == "pods" && res.group.is_empty()) {
            self.admit_service_account(ns, &shown, &mut obj).await?;
        }
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
        crate::api::authz::node_restriction(
            res,
            t.sub.as_deref(),
            crate::api::authz::node::Write::Create(&obj),
        )?;
        crate::api::authz::escalation::check(&self.authz, res, &obj)?;
        let name = name_of(&obj).to_string();
        if res.group == "certificates.k8s.io" && res.plural == "certificatesigningrequests" {
            // A node's serving CSR is approved against the addresses its Node reports.
            let node = match admission::serving_node(&obj, caller) {
                Some(n) => self.read_node(&n).await,
                None => None,
            };
            admission::admit_csr(self.pki.as_deref(), &mut obj, caller, node.as_ref());
        }
        if q.dry_run() {
            return Ok((201, obj));
        }
        let reservation = match (&ns, res.group.is_empty() && res.plural == "services") {
            (Some(ns), true) => self.allocate_cluster_ip(ns, &mut obj).await?,
            _ => None,
        };
        let written = self
            .store
            .write(Write::Create {
                key: res.key(ns.as_deref(), &name),
                value: encode(&obj),
            })
            .await
            .map_err(store_err_for(res, &name));
        let ev = match written {
            Ok(ev) => ev,
            Err(e) => {
                if let Some(key) = reservation {
                    self.release_cluster_ip(&key).await;
                }
                return Err(e);
            }
        };
        Ok((201, stored_at(obj, ev.kv.mod_revision)))
    }

    /// What every namespace holds: the `default` ServiceAccount and the `kube-root-ca.crt`
    /// ConfigMap. The serviceaccount and root-ca-cert-publisher controllers keep them in every
    /// namespace; the bootstrap creates them in the first namespaces so they are there even
    /// without the controllers.
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

    /// The Priority admission plugin: `spec.priority` and `spec.preemptionPolicy` from the pod's
    /// PriorityClass (or the cluster's `globalDefault` class); a missing class is a 403, and a pod
    /// may not bring a different value of its own.
    async fn resolve_priority(&self, pod: &mut Value) -> Result<(), ApiError> {
        let pcs = registry::find("scheduling.k8s.io", "v1", "priorityclasses")
            .ok_or_else(|| ApiError::internal("priorityclasses not served"))?;
        let pod_name = name_of(pod).to_string();
        let forbidden = |message: String| ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!("pods \"{pod_name}\" is forbidden: {message}"),
            details: Some(json!({"name": pod_name, "kind": "pods"})),
        };
        let class_name = pod["spec"]["priorityClassName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        let class = match &class_name {
            Some(name) => match self.read_object(pcs, None, name).await {
                Ok((pc, _)) => Some(pc),
                Err(e) if e.code == 404 => {
                    return Err(forbidden(format!("no PriorityClass with name {name} was found")));
                }
                Err(e) => return Err(e),
            },
            None => {
                let page = self
                    .store
                    .list(&pcs.key_prefix(), None, 0)
                    .await
                    .map_err(store_err)?;
                page.items
                    .iter()
                    .filter_map(|kv| decode(kv).ok())
                    .filter(|pc| pc["globalDefault"] == true)
                    .max_by_key(|pc| pc["value"].as_i64().unwrap_or(0))
            }
        };
        let Some(class) = class else { return Ok(()) };
        let priority = class["value"].as_i64().unwrap_or(0);
        if let Some(given) = pod["spec"]["priority"].as_i64()
            && given != priority
        {
            return Err(forbidden(format!(
                "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
            )));
        }
        pod["spec"]["priority"] = json!(priority);
        if class_name.is_none() {
            pod["spec"]["priorityClassName"] = class["metadata"]["name"].clone();
        }
        if let Some(policy) = class["preemptionPolicy"].as_str() {
            if let Some(given) = pod["spec"]["preemptionPolicy"].as_str()
                && given != policy
            {
                return Err(forbidden(format!(
                    "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
                )));
            }
            pod["spec"]["preemptionPolicy"] = json!(policy);
        }
        Ok(())
    }

    /// Refuses new objects in a missing (404) or terminating (403) namespace.
    pub(crate) async fn namespace_active(&self, ns: &str) -> Result<(), ApiError> {
        let res =
            registry::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
        static PHASE: OnceLock<Paths> = OnceLock::new();
        let phase = PHASE.get_or_init(|| Paths::new(["status.phase"]));
        match self.read_fields(res, None, ns, phase).await {
            Ok(obj) if obj["status"]["phase"] == "Terminating" => Err(ApiError {
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
}
