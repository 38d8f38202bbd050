//! What a request asks for, decoded: who calls ([`Caller`]), which resource (`Target`), the
//! query parameters (`Query`), the response form (`Want`) and the body (`body`: JSON or
//! Kubernetes protobuf through [`crate::api::protobuf`]).

pub(crate) mod body;
mod query;
mod target;

use bytes::Bytes;
use http::{Request, header};

pub(crate) use query::Query;
pub(crate) use target::{Target, parse_target};

/// Who is calling (from the client certificate or a bearer token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub groups: Vec<String>,
}

/// What the client asked the response to look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    Object,
    Table,
    /// `as=PartialObjectMetadata` (or `...List`): the objects' metadata only, as client-go's
    /// and kube's metadata clients ask.
    Metadata,
}

impl Want {
    /// From the request's `Accept` header: a server-side table (`as=Table`), metadata only
    /// (`as=PartialObjectMetadata`) or the object.
    pub(crate) fn of(req: &Request<Bytes>) -> Self {
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if accept.contains("as=Table") {
            Want::Table
        } else if accept.contains("as=PartialObjectMetadata") {
            Want::Metadata
        } else {
            Want::Object
        }
    }
}
