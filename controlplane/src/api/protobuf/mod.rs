//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`): request bodies decoded into the
//! JSON form the rest of the server works on ([`decode`]), and answers encoded from it
//! ([`encode`], lists, watch frames) for clients that ask for protobuf.
//!
//! A document is the magic `k8s\0` followed by a `runtime.Unknown`: its `typeMeta` names the
//! apiVersion and kind, its `raw` holds the object's own protobuf message. The object is walked
//! with the generated field table of [`crate::api::schema`] (field numbers from the Go struct
//! tags, JSON names, list markers), so every served kind is handled without per-kind code, both
//! ways.
//!
//! Go's protobuf encoding writes non-pointer fields even when they hold their zero value, where
//! its JSON encoding (`omitempty`) leaves them out. So that a protobuf body means what the same
//! object sent as JSON means, the decoder drops zero values the way `omitempty` drops them: empty
//! strings, zero timestamps and `0`/`false` scalars, except for the fields in
//! `ZERO_IS_A_VALUE` (Go pointers whose zero is a setting, e.g. `replicas: 0`,
//! `automountServiceAccountToken: false`). Messages are kept even when empty (`emptyDir: {}` is
//! a setting; Go writes `{}` for empty structs too). Lists and map values are kept as they are.
//! The encoder writes what the JSON form holds (a field JSON leaves out is a zero value to a Go
//! decoder), in field-number order, map entries sorted by key, as Go does. List items are
//! transcoded from their stored JSON in one pass instead (`transcode`: no `Value` built).
//!
//! Watch streams (`;stream=watch`) are frames of a 4-byte big-endian length and a
//! `metav1.WatchEvent` message (no magic, no `Unknown`: upstream's raw stream serializer), whose
//! `object.raw` is the object's own document with magic and `Unknown`.

mod decode;
mod encode;
mod transcode;

pub use decode::{DecodeError, decode};
pub use encode::{EncodeError, encode};
pub(crate) use encode::{ListEncoder, watch_frame, watch_frame_of};

use crate::api::schema::{kind_message, message_named};

/// The media type of Kubernetes protobuf documents.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The media type of a protobuf watch stream.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// The 4-byte prefix of every Kubernetes protobuf document.
const MAGIC: &[u8] = b"k8s\0";

/// `metav1` messages by kind: they are sent in any group version (a DELETE of a Deployment sends
/// `apps/v1 DeleteOptions`, errors are `v1 Status`).
const META_KINDS: &[(&str, &str)] = &[
    (
        "DeleteOptions",
        "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    ),
    ("Status", "k8s.io.apimachinery.pkg.apis.meta.v1.Status"),
];

/// The message of a top-level object of `kind` in `api_version`.
fn body_message(api_version: &str, kind: &str) -> Option<usize> {
    kind_message(api_version, kind).or_else(|| {
        META_KINDS
            .iter()
            .find(|(k, _)| *k == kind)
            .and_then(|(_, name)| message_named(name))
    })
}
