//! The runtime's interface, for its clients: the requests and replies of the runtime process
//! (newline-delimited JSON over a unix socket, file descriptors passed as SCM_RIGHTS), typed
//! errors that cross the socket with a kind, and a blocking [`Client`].
//!
//! This crate holds no libcontainer and no Kubernetes policy (docs/DESIGN.md §2): the agent
//! depends on it alone, decides QoS and `oom_score_adj` itself and hands the runtime numbers, as
//! a kubelet does over CRI. The runtime crate implements the server side.

// Only `sys` has `unsafe` (each block with a `// SAFETY:` comment).
#![deny(unsafe_code)]

mod client;
mod container;
mod error;
mod image;
mod protocol;
pub mod pty;
mod sandbox;
mod stats;
#[allow(unsafe_code)]
mod sys;

pub use client::{Attached, Client, ClientError};
pub use container::{
    ContainerConfig, ContainerStatus, ExecSyncResult, Mount, Resources, SeccompProfile, State,
};
pub use error::{ErrorKind, ReplyError};
pub use image::{Auth, Image, PullPolicy};
pub use protocol::{Reply, Request, recv_some, send_line};
pub use sandbox::{
    Dns, HostNamespaces, PodResources, PortMapping, Protocol, QosClass, SandboxConfig, SandboxStatus,
};
pub use stats::{ContainerStats, CpuUsage, MemoryUsage, NetworkUsage, PodStats};

/// Where the runtime listens on a node.
pub const SOCKET: &str = "/run/nodeos/runtime.sock";
/// Where the runtime keeps images (the image file system the agent's image GC measures).
pub const IMAGE_ROOT: &str = "/var/lib/nodeos/images";
/// Container logs rotate at this size (the kubelet's `containerLogMaxSize` default, 10Mi)...
pub const LOG_MAX_SIZE: u64 = 10 * 1024 * 1024;
/// ...keeping this many files per container, the live one included (`containerLogMaxFiles`).
pub const LOG_MAX_FILES: usize = 5;
