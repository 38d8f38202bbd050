//! GET of one object (or its server-side table row).

use serde_json::Value;

use crate::api::Api;
use crate::api::object::stored::partial_metadata;
use crate::api::output::table;
use crate::api::request::{Target, Want};
use crate::api::status::ApiError;

impl Api {
    /// GET of one object (or its server-side table row).
    pub(crate) async fn get(&self, t: &Target, want: Want) -> Result<Value, ApiError> {
        let name = t.name.as_deref().unwrap_or_default();
        let (mut obj, rev) = self.read_object(t.res, t.namespace.as_deref(), name).await?;
        Ok(match want {
            Want::Table => table::table(t.res, &[obj], &rev.to_string(), None, false),
            Want::Metadata => partial_metadata(obj["metadata"].take()),
            Want::Object => obj,
        })
    }
}
