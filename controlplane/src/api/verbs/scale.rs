//! The `scale` subresource (`autoscaling/v1 Scale`) of workloads: read, and PUT/PATCH of
//! `spec.replicas`.

use bytes::Bytes;
use serde_json::{Value, json};

use super::patch;
use super::{Fields, UNCONDITIONAL_ATTEMPTS};
use crate::api::Api;
use crate::api::object::selector::{Requirement, selector_requirements};
use crate::api::request::body::{is_protobuf, parse_json_body, parse_object_body};
use crate::api::request::{Query, Target};
use crate::api::status::ApiError;

impl Api {
    /// The `Scale` of a workload object.
    pub(crate) fn scale_of(obj: &Value) -> Value {
        let selector = &obj["spec"]["selector"];
        let sel = if obj["kind"] == "ReplicationController" {
            // A ReplicationController's selector is a plain label map.
            selector_requirements(&json!({ "matchLabels": selector }))
        } else {
            selector_requirements(selector)
        };
        let selector = sel
            .iter()
            .filter_map(|r| match r {
                Requirement::Eq(k, v) => Some(format!("{k}={v}")),
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

    /// GET .../scale.
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
        let (ct, doc) = if is_protobuf(ct) {
            // A protobuf Scale replaces, as a JSON one.
            ("application/json", parse_object_body(ct, body)?)
        } else {
            (ct, parse_json_body(ct, body)?)
        };
        let media = ct.split(';').next().unwrap_or_default().trim();
        // A resourceVersion in the Scale (or the patch) is a precondition; without one the
        // write is retried on a fresh read, as upstream's GuaranteedUpdate does, so a
        // controller's status write in between is no conflict for the caller.
        let precondition = doc["metadata"]["resourceVersion"]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let mut attempt = 0;
        loop {
            let (obj, rev) = self.read_object(t.res, t.namespace.as_deref(), &name).await?;
            if precondition
                .as_deref()
                .is_some_and(|want| want != rev.to_string())
            {
                return Err(ApiError::conflict(t.res, &name));
            }
            let mut scale = Self::scale_of(&obj);
            match media {
                // A JSON patch that does not apply to a Scale is a bad request (the object's own
                // PATCH answers 422).
                "application/json-patch+json" => {
                    patch::json_patch(&mut scale, &doc).map_err(|e| ApiError::bad_request(e.to_string()))?
                }
                "application/json" => scale = doc.clone(),
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
            match self.replace(&target, &obj, new, rev, q, Fields::Record).await {
                Err(e)
                    if e.is_stale_write() && precondition.is_none() && attempt < UNCONDITIONAL_ATTEMPTS =>
                {
                    attempt += 1
                }
                other => return other.map(|updated| Self::scale_of(&updated)),
            }
        }
    }
}
