//! Everything below the pod abstraction: images, sandboxes, containers, cgroups and pod network
//! devices. Nothing here knows the Kubernetes API.
//!
//! Containers are created by the runtime process ([`server`]), a single-threaded process of the
//! node binary; everything else talks to it through the `runtime-api` crate (its protocol and
//! client, without libcontainer).

#![deny(unsafe_code)]

pub mod cgroups;
pub mod image;
pub mod logs;
pub mod net;
pub mod pause;
pub mod probe;

pub mod seccomp;
pub mod server;
pub mod spec;
// The one module with `unsafe` (each block has a `// SAFETY:` comment).
#[allow(unsafe_code)]
mod sys;

/// Where a node keeps its images.
pub use runtime_api::IMAGE_ROOT;
