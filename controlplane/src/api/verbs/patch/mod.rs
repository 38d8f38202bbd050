//! PATCH: JSON merge patch (RFC 7386), JSON patch (RFC 6902, [`json`](mod@json)), strategic merge patch
//! ([`strategic`]) and server-side apply (through [`super::fieldmanager`]), retried on write
//! conflicts.

mod json;
mod strategic;

use std::time::SystemTime;

use bytes::Bytes;
use serde_json::{Value, json};

pub use json::json_patch;
pub use kcore::json::merge_patch;
pub use strategic::strategic_merge;

use super::{Fields, UNCONDITIONAL_ATTEMPTS, fieldmanager, writer};
use crate::api::Api;
use crate::api::admission::check_shape;
use crate::api::object;
use crate::api::request::body::parse_json_body;
use crate::api::request::{Query, Target};
use crate::api::schema::Type;
use crate::api::status::ApiError;

/// Why a patch does not apply. The texts are what the API answers (kubectl prints them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// A JSON patch that is not a list.
    #[error("a JSON patch must be an array of operations")]
    NotAnArray,
    #[error("operation without \"op\"")]
    NoOp,
    #[error("operation without \"path\"")]
    NoPath,
    /// An `add`, `replace` or `test` without its value.
    #[error("{0} without value")]
    NoValue(&'static str),
    #[error("move/copy without from")]
    NoFrom,
    #[error("unknown JSON patch operation {0:?}")]
    UnknownOp(String),
    /// A path that is not a JSON pointer (RFC 6901).
    #[error("invalid JSON pointer {0:?}")]
    InvalidPointer(String),
    /// A step of the path names no member of the object it is in.
    #[error("path segment {0:?} not found")]
    SegmentNotFound(String),
    #[error("invalid array index {0:?}")]
    InvalidIndex(String),
    #[error("array index {0} out of range")]
    IndexOutOfRange(usize),
    /// A step of the path goes through a scalar.
    #[error("cannot descend into {0:?}")]
    CannotDescend(String),
    /// An `add` into a scalar.
    #[error("cannot add at {0:?}")]
    CannotAdd(String),
    #[error("cannot remove the whole document")]
    RemoveRoot,
    #[error("path {0:?} not found")]
    PathNotFound(String),
    #[error("test failed at {0:?}")]
    TestFailed(String),
    /// A `move` into its own child (RFC 6902 §4.4).
    #[error("cannot move {0:?} into itself")]
    MoveIntoItself(String),
    /// A strategic merge patch item of a keyed list without its key.
    #[error("strategic merge patch: list element without merge key {0:?}")]
    NoMergeKey(String),
    /// More operations than [`json::MAX_OPERATIONS`] (upstream's text and limit).
    #[error("The allowed maximum operations in a JSON patch is {limit}, got {got}")]
    TooManyOperations { limit: usize, got: usize },
    /// `copy` operations that would grow the document past [`json::MAX_COPY_BYTES`] (the
    /// CVE-2019-1002100 fix; json-patch's text).
    #[error(
        "Unable to complete the copy, the accumulated size increase of copy is {size}, exceeding the limit {limit}"
    )]
    CopyTooLarge { size: usize, limit: usize },
}

impl From<PatchError> for ApiError {
    /// A JSON patch that does not apply is 422 Invalid; a strategic merge patch that does not
    /// apply is a bad request.
    fn from(e: PatchError) -> Self {
        match e {
            PatchError::NoMergeKey(_) => ApiError::bad_request(e.to_string()),
            PatchError::TooManyOperations { .. } | PatchError::CopyTooLarge { .. } => ApiError {
                code: 413,
                reason: "RequestEntityTooLarge",
                message: e.to_string(),
                details: None,
            },
            _ => ApiError {
                code: 422,
                reason: "Invalid",
                message: e.to_string(),
                details: None,
            },
        }
    }
}

impl Api {
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
        let patch_doc = parse_json_body(&media, body)?;
        if media == "application/apply-patch+yaml" {
            check_shape(t.res, &patch_doc)?;
        }
        for attempt in 0..=UNCONDITIONAL_ATTEMPTS {
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
                "application/merge-patch+json" => merge_patch(&mut new, &patch_doc),
                "application/json-patch+json" => json_patch(&mut new, &patch_doc)?,
                "application/strategic-merge-patch+json" => strategic_merge(&mut new, &patch_doc, ty)?,
                "application/apply-patch+yaml" => {
                    let now = object::rfc3339(SystemTime::now());
                    if let Some(w) = writer(t, q, &now) {
                        new = fieldmanager::apply(ty, &old, &patch_doc, q.flag("force"), w)?;
                        fields = Fields::Recorded;
                    } else {
                        strategic_merge(&mut new, &patch_doc, ty)?
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
                    if e.is_stale_write()
                        && attempt < UNCONDITIONAL_ATTEMPTS
                        && patch_doc["metadata"]["resourceVersion"].is_null() =>
                {
                    continue;
                }
                other => return other.map(|v| (200, v)),
            }
        }
        Err(ApiError::conflict(t.res, &name))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_sets_and_removes() {
        let mut d = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        merge_patch(&mut d, &json!({"metadata": {"labels": {"a": null, "c": "3"}}}));
        assert_eq!(d, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }
}
