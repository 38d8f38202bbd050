//! Everything below the pod abstraction: images, sandboxes, containers, cgroups and pod network
//! devices. Nothing here knows the Kubernetes API.
//!
//! Containers are created by the runtime process ([`server`]), a single-threaded process of the
//! node binary; everything else talks to it through [`api`].

#![deny(unsafe_code)]

pub mod api;
pub mod cgroups;
pub mod image;
pub mod logs;
pub mod net;
pub mod pause;
pub mod probe;

/// Terminals for exec sessions (`kubectl exec -t`).
pub mod pty {
    pub use crate::sys::{openpty, set_nonblocking, set_window_size};
}
pub mod seccomp;
pub mod server;
pub mod spec;
// The one module with `unsafe` (each block has a `// SAFETY:` comment).
#[allow(unsafe_code)]
mod sys;

/// Where a node keeps its images.
pub const IMAGE_ROOT: &str = "/var/lib/nodeos/images";
