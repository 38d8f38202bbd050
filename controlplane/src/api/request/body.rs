//! Request bodies: reading them whole (bounded by [`MAX_BODY`]) and decoding objects from JSON or
//! Kubernetes protobuf.

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::api::protobuf;
use crate::api::status::ApiError;

/// Largest request body accepted (etcd's default request limit is 1.5 MiB; Secrets max 1 MiB).
pub const MAX_BODY: usize = 3 << 20;

/// Decodes a create/update body: Kubernetes protobuf (what kubectl 1.32's typed clients send) or
/// JSON.
pub(crate) fn parse_object_body(ct: &str, body: &Bytes) -> Result<Value, ApiError> {
    if is_protobuf(ct) {
        return protobuf::decode(body).map_err(|e| {
            ApiError::bad_request(format!("the request body could not be decoded as protobuf: {e}"))
        });
    }
    parse_json_body(ct, body)
}

/// Decodes the `DeleteOptions` body of a DELETE (or an eviction): Kubernetes protobuf (what
/// client-go's typed clients send with the protobuf content type) or JSON whatever the content
/// type says (kubectl and older clients send JSON without one); an empty body is no options.
pub(crate) fn parse_delete_options(ct: &str, body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    if is_protobuf(ct) {
        return parse_object_body(ct, body);
    }
    parse_json_body("application/json", body)
}

/// Whether a content type is Kubernetes protobuf.
pub(crate) fn is_protobuf(ct: &str) -> bool {
    ct.split(';').next().unwrap_or_default().trim() == protobuf::MEDIA_TYPE
}

/// Decodes a JSON (or YAML-flavoured JSON) request body into an object.
pub(crate) fn parse_json_body(ct: &str, body: &Bytes) -> Result<Value, ApiError> {
    let media = ct.split(';').next().unwrap_or_default().trim();
    match media {
        ""
        | "application/json"
        | "application/yaml"
        | "application/apply-patch+yaml"
        | "application/merge-patch+json"
        | "application/json-patch+json"
        | "application/strategic-merge-patch+json"
        | "*/*" => {}
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body could not be decoded as JSON: {e}")))
}

/// Reads a hyper body into bytes, refusing more than [`MAX_BODY`].
pub async fn collect_body<B>(body: B) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::too_large(MAX_BODY))
        }
        Err(e) => Err(ApiError::bad_request(format!("reading the request body: {e}"))),
    }
}
