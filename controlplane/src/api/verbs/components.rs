//! `componentstatuses` (read-only): the health of the components this server can see. Upstream
//! probes the scheduler, the controller manager and etcd; here the store is the one component
//! the API server checks itself (as `etcd-0`, the name upstream gives its first store member).

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::output::{table, warnings};
use crate::api::request::{Target, Want};
use crate::api::status::ApiError;

/// The store's component name.
const STORE: &str = "etcd-0";

impl Api {
    /// GET of componentstatuses or of one of them.
    pub(crate) async fn component_statuses(&self, t: &Target, want: Want) -> Result<Value, ApiError> {
        warnings::warn("v1 ComponentStatus is deprecated in v1.19+".into());
        let store = match self.store.revision().await {
            Ok(_) => json!({"type": "Healthy", "status": "True", "message": "ok"}),
            Err(e) => json!({"type": "Healthy", "status": "False", "error": e.to_string()}),
        };
        let item = json!({"apiVersion": "v1", "kind": "ComponentStatus",
            "metadata": {"name": STORE}, "conditions": [store]});
        let items = match t.name.as_deref() {
            None => vec![item],
            Some(STORE) => vec![item],
            Some(name) => return Err(ApiError::not_found(t.res, name)),
        };
        Ok(match (want, t.name.is_some()) {
            (Want::Table, _) => table::table(t.res, &items, "", None, false),
            (Want::Object | Want::Metadata, true) => items.into_iter().next().unwrap_or_default(),
            (Want::Object | Want::Metadata, false) => {
                json!({"apiVersion": "v1", "kind": "ComponentStatusList",
                "metadata": {}, "items": items})
            }
        })
    }
}
