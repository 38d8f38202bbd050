//! Errors as they cross the socket: a kind the client can act on, and the message a person reads.

use serde::{Deserialize, Serialize};

/// What kind of failure a reply reports (CRI's gRPC codes, reduced to what the agent tells apart).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// No such sandbox, container, exec or image.
    NotFound,
    /// The request cannot be carried out as asked: a malformed name, path, reference or
    /// configuration, or an image whose content is unusable.
    Invalid,
    /// The object is not in a state that allows the operation: starting a container that is not
    /// `Created`, a container in a lost sandbox, removing an image a container uses.
    Conflict,
    /// The operation ran out of its time (`ExecSync` with a timeout).
    DeadlineExceeded,
    /// Something the operation needs cannot be reached now (a registry, the runtime itself);
    /// trying again later may work.
    Unavailable,
    /// The runtime failed.
    #[default]
    Internal,
}

/// An error reply: its kind and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ReplyError {
    #[serde(default)]
    pub kind: ErrorKind,
    pub message: String,
}

impl ReplyError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ReplyError {
            kind,
            message: message.into(),
        }
    }
}
