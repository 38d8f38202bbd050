//! `metav1.Status` errors, with the reasons, codes and messages kubectl expects.

use serde_json::{Value, json};

use super::registry::Resource;

/// An API error: becomes an HTTP status and a `Status` body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// The tail of upstream's message for a write at a stale resourceVersion.
const STALE: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

fn details(res: &Resource, name: &str) -> Value {
    json!({ "name": name, "group": res.group, "kind": res.plural })
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    #[must_use]
    fn with_details(mut self, d: Value) -> Self {
        self.details = Some(d);
        self
    }

    pub fn not_found(res: &Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
        )
        .with_details(details(res, name))
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_details(json!({ "name": ns, "kind": "namespaces" }))
    }

    pub fn already_exists(res: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
        )
        .with_details(details(res, name))
    }

    pub fn conflict(res: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {STALE}",
                res.qualified()
            ),
        )
        .with_details(details(res, name))
    }

    /// Whether this is the 409 of a write that lost a race ([`ApiError::conflict`]), which a
    /// write without preconditions retries on a fresh read; other 409s (a failed uid
    /// precondition, AlreadyExists) are final.
    pub fn is_stale_write(&self) -> bool {
        self.code == 409 && self.reason == "Conflict" && self.message.ends_with(STALE)
    }

    pub fn precondition_failed(res: &Resource, name: &str, what: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {what}",
                res.qualified()
            ),
        )
        .with_details(details(res, name))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 with one cause: `<Kind>[.<group>] "<name>" is invalid: <field>: <message>`.
    pub fn invalid(res: &Resource, name: &str, field: &str, message: &str) -> Self {
        Self::invalid_fields(res, name, &[(field.to_string(), message.to_string())])
    }

    /// 422 with every field error, as upstream aggregates them: `<Kind>[.<group>] "<name>" is invalid:
    /// <field>: <error>` for one, `... is invalid: [<field>: <error>, ...]` for several.
    /// Each message starts with its type (`Forbidden: `, `Not found: `, ...).
    pub fn invalid_fields(res: &Resource, name: &str, errors: &[(String, String)]) -> Self {
        let each: Vec<String> = errors.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let all = match each.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let reason = |m: &str| match m.split(':').next().unwrap_or_default() {
            "Forbidden" => "FieldValueForbidden",
            "Not found" => "FieldValueNotFound",
            "Duplicate value" => "FieldValueDuplicate",
            "Required value" => "FieldValueRequired",
            _ => "FieldValueInvalid",
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|(f, m)| json!({"reason": reason(m), "message": m, "field": f}))
            .collect();
        // The kind qualified by its group, as upstream's `GroupKind` prints it.
        let kind = match res.group {
            "" => res.kind.to_string(),
            group => format!("{}.{group}", res.kind),
        };
        Self::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {all}")).with_details(json!({
            "name": name, "group": res.group, "kind": res.kind, "causes": causes
        }))
    }

    /// 403 from admission, worded as upstream's `NewForbidden`: `<resource> "<name>" is
    /// forbidden: <why>` (without the name when it is empty).
    pub fn forbidden(resource: &str, name: &str, why: &str) -> Self {
        let message = if name.is_empty() {
            format!("{resource} is forbidden: {why}")
        } else {
            format!("{resource} \"{name}\" is forbidden: {why}")
        };
        Self::new(403, "Forbidden", message).with_details(json!({"name": name, "kind": resource}))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/json-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"
            ),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    pub fn not_found_path(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource (path {path})"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

/// A success `Status` (what DELETE of a collection and some subresources return).
pub fn success(code: u16) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code })
}
