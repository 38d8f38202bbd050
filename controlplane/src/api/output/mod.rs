//! What goes back to the client: response bodies (whole or streamed), `Status` errors as
//! responses, `Warning` headers (`warnings`), server-side tables ([`table`]), discovery
//! documents ([`discovery`]) and OpenAPI ([`openapi`]).

pub mod discovery;
pub mod openapi;
pub mod table;
pub(crate) mod warnings;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::Value;
pub use transport::Body;
pub use transport::body::full;

use crate::api::status::ApiError;

/// A JSON document with status `code`.
pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut resp = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
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
