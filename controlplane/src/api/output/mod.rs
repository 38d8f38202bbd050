//! What goes back to the client: response bodies (whole or streamed) in the format it asked for
//! ([`Format`]: JSON, or Kubernetes protobuf when the object has a protobuf form), `Status`
//! errors as responses, `Warning` headers (`warnings`), server-side tables ([`table`]),
//! discovery documents ([`discovery`]) and OpenAPI ([`openapi`]).

pub mod discovery;
pub mod openapi;
pub mod table;
pub(crate) mod warnings;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::Value;
pub use transport::Body;
pub use transport::body::full;

use crate::api::protobuf;
use crate::api::status::ApiError;

/// The encoding of an answer, from the request's `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    /// `application/vnd.kubernetes.protobuf`: objects and lists of kinds with a protobuf form,
    /// `Status` errors and watch streams (JSON for everything else, which client-go accepts).
    Protobuf,
}

impl Format {
    /// The preferred of the media types the server answers in, by q-value, then by order:
    /// client-go's `application/vnd.kubernetes.protobuf, application/json` is protobuf. A
    /// protobuf range with other parameters (`;as=Table`, `;as=PartialObjectMetadataList`) asks
    /// for a form the server has in JSON only, so it does not count.
    pub fn from_accept(accept: &str) -> Self {
        let mut best: Option<(f32, Format)> = None;
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let (mut q, mut other_params) = (1.0f32, false);
            for p in parts.filter(|p| !p.is_empty()) {
                match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                    Some(("q", v)) => q = v.parse().unwrap_or(0.0),
                    Some(("stream", "watch")) => {}
                    _ => other_params = true,
                }
            }
            let format = if media.eq_ignore_ascii_case(protobuf::MEDIA_TYPE) && !other_params {
                Format::Protobuf
            } else if ["application/json", "application/yaml", "application/*", "*/*", ""]
                .iter()
                .any(|m| media.eq_ignore_ascii_case(m))
            {
                Format::Json
            } else {
                continue;
            };
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::Json, |(_, f)| f)
    }
}

/// A JSON document with status `code`.
pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut resp = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// An object (or a `Status`) with status `code` in `format`: protobuf when asked for and the
/// object has a protobuf form, JSON otherwise.
pub(crate) fn object_response(code: u16, v: &Value, format: Format) -> Response<Body> {
    if format == Format::Protobuf {
        match protobuf::encode(v) {
            Ok(doc) => return bytes_response(code, doc, protobuf::MEDIA_TYPE),
            Err(e) => tracing::debug!(error = %e, "no protobuf form: answering JSON"),
        }
    }
    json_response(code, v)
}

/// An already encoded document of media type `ct` with status `code`.
pub(crate) fn bytes_response(code: u16, body: impl Into<Bytes>, ct: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

/// An already serialized JSON document, 200.
pub(crate) fn json_bytes_response(body: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// An API error as its `Status` document.
pub fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// An API error as its `Status` document in `format`.
pub fn error_response_as(e: &ApiError, format: Format) -> Response<Body> {
    object_response(e.code, &e.to_status(), format)
}

/// A plain-text response (health checks).
pub(crate) fn text_response(code: u16, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(text));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_choose_the_format() {
        for (accept, want) in [
            ("", Format::Json),
            ("application/json", Format::Json),
            ("application/vnd.kubernetes.protobuf", Format::Protobuf),
            (
                "application/vnd.kubernetes.protobuf, application/json",
                Format::Protobuf,
            ),
            ("application/vnd.kubernetes.protobuf, */*", Format::Protobuf),
            (
                "application/json, application/vnd.kubernetes.protobuf",
                Format::Json,
            ),
            (
                "application/json;q=0.5, application/vnd.kubernetes.protobuf",
                Format::Protobuf,
            ),
            (
                "application/vnd.kubernetes.protobuf;q=0.5,application/json;q=0.9",
                Format::Json,
            ),
            (
                "application/vnd.kubernetes.protobuf;stream=watch",
                Format::Protobuf,
            ),
            (
                "application/vnd.kubernetes.protobuf;q=0, application/json",
                Format::Json,
            ),
            (
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
                Format::Json,
            ),
            (
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
                Format::Json,
            ),
            (
                "text/html, application/vnd.kubernetes.protobuf;q=0.1",
                Format::Protobuf,
            ),
            ("text/html", Format::Json),
        ] {
            assert_eq!(Format::from_accept(accept), want, "{accept}");
        }
    }
}
