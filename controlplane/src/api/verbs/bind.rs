//! `POST pods/<name>/binding`: the scheduler's (or a client's) assignment of a pod to a node.

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::request::Target;
use crate::api::status::{self, ApiError};

impl Api {
    /// `POST pods/<name>/binding`: sets spec.nodeName once, and the `PodScheduled=True`
    /// condition, as upstream's binding storage does; refuses a pod being deleted, a gated pod,
    /// and a binding whose `metadata.uid` is not the pod's.
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
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            return Err(ApiError::precondition_failed(
                t.res,
                &name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        if pod["spec"]["schedulingGates"]
            .as_array()
            .is_some_and(|g| !g.is_empty())
        {
            return Err(ApiError::precondition_failed(
                t.res,
                &name,
                &format!("pod {name} has non-empty .spec.schedulingGates"),
            ));
        }
        if let Some(uid) = binding["metadata"]["uid"].as_str().filter(|u| !u.is_empty())
            && pod["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::precondition_failed(
                t.res,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    pod["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        pod["spec"]["nodeName"] = json!(node);
        set_scheduled(&mut pod["status"]);
        let key = t.res.key(t.namespace.as_deref(), &name);
        self.put_at(t.res, key, pod, rev, &name).await?;
        Ok(status::success(201))
    }
}

/// `PodScheduled=True` (the transition time moves only when the status changes).
fn set_scheduled(status: &mut Value) {
    if !status.is_object() {
        *status = json!({});
    }
    let now = crate::api::object::rfc3339(std::time::SystemTime::now());
    let conditions = status["conditions"].as_array_mut();
    match conditions {
        Some(list) => match list.iter_mut().find(|c| c["type"] == "PodScheduled") {
            Some(c) => {
                if c["status"] != "True" {
                    c["lastTransitionTime"] = json!(now);
                }
                c["status"] = json!("True");
                if let Some(m) = c.as_object_mut() {
                    m.remove("reason");
                    m.remove("message");
                }
            }
            None => list.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now})),
        },
        None => {
            status["conditions"] =
                json!([{"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}]);
        }
    }
}
