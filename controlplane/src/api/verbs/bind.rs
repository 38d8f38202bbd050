//! `POST pods/<name>/binding`: the scheduler's (or a client's) assignment of a pod to a node.

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::request::Target;
use crate::api::status::{self, ApiError};

impl Api {
    /// `POST pods/<name>/binding`: sets spec.nodeName once.
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
}
