//! Failures of one operation and the kind each one crosses the socket with.

use std::io;

use runtime_api::{ErrorKind, ReplyError};

use crate::cgroups::CgroupError;
use crate::image::registry::RegistryError;
use crate::image::store::StoreError;
use crate::net::NetlinkError;

/// Why an operation failed; its text is the reply's message.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    /// The object is not in a state that allows the operation.
    #[error("{0}")]
    Conflict(String),
    /// Nothing left to give (pod addresses); may work once pods are removed.
    #[error("{0}")]
    Exhausted(String),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{what}: {detail}")]
    Container { what: String, detail: String },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Image(#[from] StoreError),
    #[error("{what}: {source}")]
    Network { what: String, source: NetlinkError },
    #[error("host ports: {0}")]
    HostPorts(#[from] crate::net::nft::NftError),
    /// What a build helper reported (its kind kept).
    #[error("{}", .0.message)]
    Reported(ReplyError),
    /// Nothing listens where a port forward dialed (containerd's text).
    #[error("failed to connect to localhost:{port} inside namespace \"{sandbox}\", {source} ")]
    Dial {
        port: u16,
        sandbox: String,
        source: crate::net::DialError,
    },
}

impl RuntimeError {
    /// The kind the client sees.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::NotFound(_) => ErrorKind::NotFound,
            RuntimeError::Invalid(_) => ErrorKind::Invalid,
            RuntimeError::Conflict(_) => ErrorKind::Conflict,
            RuntimeError::Exhausted(_) => ErrorKind::Unavailable,
            RuntimeError::Dial { .. } => ErrorKind::NotFound,
            RuntimeError::Image(e) => store_error_kind(e),
            RuntimeError::Reported(e) => e.kind,
            RuntimeError::Io { .. }
            | RuntimeError::Container { .. }
            | RuntimeError::Cgroup(_)
            | RuntimeError::Network { .. }
            | RuntimeError::HostPorts(_) => ErrorKind::Internal,
        }
    }

    /// The error as it goes on the wire.
    pub fn to_reply(&self) -> ReplyError {
        ReplyError::new(self.kind(), self.to_string())
    }
}

/// The kind of an image store failure: a bad reference or unusable image content is `Invalid`,
/// a registry that cannot be reached or fails is `Unavailable`, an image or tag it does not have
/// `NotFound`.
pub fn store_error_kind(e: &StoreError) -> ErrorKind {
    match e {
        StoreError::Reference(_) => ErrorKind::Invalid,
        StoreError::NotFound(_) => ErrorKind::NotFound,
        StoreError::Registry(r) => match r {
            RegistryError::Status { status: 404, .. } => ErrorKind::NotFound,
            RegistryError::Status { status, .. } if *status >= 500 || *status == 429 => {
                ErrorKind::Unavailable
            }
            RegistryError::Http(_) | RegistryError::Body { .. } | RegistryError::Read { .. } => {
                ErrorKind::Unavailable
            }
            RegistryError::Write { .. } => ErrorKind::Internal,
            RegistryError::Status { .. }
            | RegistryError::Auth { .. }
            | RegistryError::Digest { .. }
            | RegistryError::Size { .. }
            | RegistryError::Manifest { .. }
            | RegistryError::Platform { .. } => ErrorKind::Invalid,
        },
        StoreError::Unpack { .. }
        | StoreError::DiffId { .. }
        | StoreError::Config { .. }
        | StoreError::MediaType { .. }
        | StoreError::Layout { .. } => ErrorKind::Invalid,
        StoreError::Io { .. } => ErrorKind::Internal,
    }
}

pub(super) fn io_ctx(what: impl Into<String>) -> impl FnOnce(io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

pub(super) fn errno_ctx(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::Io {
        what,
        source: e.into(),
    }
}

pub(super) fn lc_err(
    what: impl Into<String>,
) -> impl FnOnce(libcontainer::error::LibcontainerError) -> RuntimeError {
    let what = what.into();
    // libcontainer's Display hides the cause (docs/RUNTIME-NOTES.md P4); Debug keeps the chain.
    move |e| RuntimeError::Container {
        what,
        detail: format!("{e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(
            RuntimeError::Conflict("x".into()).to_reply(),
            ReplyError::new(ErrorKind::Conflict, "x")
        );
        let bad_ref = StoreError::Reference(crate::image::reference::ReferenceError::Empty);
        assert_eq!(RuntimeError::Image(bad_ref).kind(), ErrorKind::Invalid);
        let missing = StoreError::Registry(RegistryError::Status {
            url: "u".into(),
            status: 404,
            message: "manifest unknown".into(),
        });
        assert_eq!(store_error_kind(&missing), ErrorKind::NotFound);
        let down = StoreError::Registry(RegistryError::Status {
            url: "u".into(),
            status: 503,
            message: String::new(),
        });
        assert_eq!(store_error_kind(&down), ErrorKind::Unavailable);
        assert_eq!(
            RuntimeError::Exhausted("pod CIDR".into()).kind(),
            ErrorKind::Unavailable
        );
    }
}
