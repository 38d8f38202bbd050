//! The stored form of objects: JSON without `resourceVersion`, which is the store's revision of
//! the key and is set on every read; and the mapping of store errors to API errors.

use serde_json::{Value, json};

use crate::api::registry::Resource;
use crate::api::status::ApiError;
use crate::storage::{KeyValue, StoreError};

/// Maps a store error to an API error (a compacted revision is 410 Gone).
pub(crate) fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Compacted { requested, compacted } => {
            ApiError::gone(format!("too old resource version: {requested} ({compacted})"))
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// Maps a store error on object `name` of `res`: missing, existing and stale objects become
/// 404, 409 AlreadyExists and 409 Conflict.
pub(crate) fn store_err_for<'a>(
    res: &'a Resource,
    name: &'a str,
) -> impl FnOnce(StoreError) -> ApiError + 'a {
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
pub(crate) fn stored_at(mut obj: Value, rev: i64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(rev.to_string());
    obj
}
