//! The verbs on objects, one operation per file: get (`read`), list ([`list`]), create, update and
//! replace, patch (merge, JSON, strategic, apply), CSR approval, pod binding, scale, delete, eviction,
//! service-account tokens and watch, and the field ownership they record ([`fieldmanager`]).
//! Objects are stored as JSON without `resourceVersion` ([`crate::api::object::stored`]); it is
//! set from the store revision on every read. Here: what the verbs share (reading and writing one
//! key at a revision, field validation, the request's field manager).

mod approval;
mod bind;
pub(crate) mod bootstrap_tokens;
pub(crate) mod clusterip;
mod components;
mod create;
mod delete;
mod eviction;
pub(crate) mod fieldmanager;
pub(crate) mod list;
pub(crate) mod patch;
mod read;
mod scale;
mod serviceaccount;
mod tokens;
mod update;
pub(crate) mod watch;

use serde_json::Value;

use crate::api::Api;
use crate::api::object::name_of;
use crate::api::object::selector::Filter;
use crate::api::object::sparse::Paths;
use crate::api::object::stored::{decode, encode, store_err, store_err_for, stored_at};
use crate::api::output::{openapi, warnings};
use crate::api::registry::Resource;
use crate::api::request::{Query, Target};
use crate::api::status::ApiError;
use crate::storage::{KeyValue, Write};

/// Whether a write still has its field ownership to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fields {
    /// Record it as an `Update` by the request's field manager (if it names one).
    Record,
    /// Already recorded (server-side apply).
    Recorded,
}

/// The field-ownership writer of a request (None for the server's own writes).
/// How often a write without preconditions (PATCH without a resourceVersion, PUT without one,
/// `/scale`) is tried again on a fresh read after losing a race. Upstream's GuaranteedUpdate
/// retries without bound; each lost race means another writer succeeded, so a bound this high
/// is reached only under a storm of writers to one object.
pub(crate) const UNCONDITIONAL_ATTEMPTS: u32 = 64;

pub(crate) fn writer<'a>(t: &Target, q: &'a Query, now: &'a str) -> Option<fieldmanager::Writer<'a>> {
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
pub(crate) fn drop_unknown_fields(res: &Resource, obj: &mut Value, q: &Query) -> Result<(), ApiError> {
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
                warnings::warn(format!("unknown field {f:?}"));
            }
        }
    }
    Ok(())
}

/// The list/watch filter of a request's `labelSelector` and `fieldSelector`.
pub(crate) fn filter_of(res: &Resource, q: &Query) -> Result<Filter, ApiError> {
    Filter::new(
        res,
        q.get("labelSelector").unwrap_or_default(),
        q.get("fieldSelector").unwrap_or_default(),
    )
}

impl Api {
    /// The stored form of one object (404 when it does not exist).
    async fn read_stored(&self, res: &Resource, ns: Option<&str>, name: &str) -> Result<KeyValue, ApiError> {
        self.store
            .get(&res.key(ns, name))
            .await
            .map_err(store_err)?
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// Reads one object with its revision (404 when it does not exist).
    pub(crate) async fn read_object(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(Value, i64), ApiError> {
        let kv = self.read_stored(res, ns, name).await?;
        Ok((decode(&kv)?, kv.mod_revision))
    }

    /// Reads only the fields `paths` of one object (404 when it does not exist): for admission's
    /// lookups on every create, which need a field or two of a namespace or service account.
    pub(crate) async fn read_fields(
        &self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        paths: &Paths,
    ) -> Result<Value, ApiError> {
        let kv = self.read_stored(res, ns, name).await?;
        paths
            .decode(&kv.value)
            .map_err(|e| ApiError::internal(format!("stored object {}: {e}", kv.key)))
    }

    /// Writes `obj` at `key` if the key is still at `rev`; returns the object as stored.
    pub(crate) async fn put_at(
        &self,
        res: &Resource,
        key: String,
        obj: Value,
        rev: i64,
        name: &str,
    ) -> Result<Value, ApiError> {
        let ev = self
            .store
            .write(Write::Update {
                key,
                value: encode(&obj),
                expected: Some(rev),
            })
            .await
            .map_err(store_err_for(res, name))?;
        Ok(stored_at(obj, ev.kv.mod_revision))
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
        let removed = decode(&ev.kv)?;
        if res.group.is_empty() && res.plural == "services" {
            self.release_address_of(&removed).await;
        }
        Ok(removed)
    }
}
