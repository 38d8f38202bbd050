//! Everything below the pod abstraction. Today: the pause process and a probe of the host's
//! container capabilities; images, sandboxes and containers come with the runtime issue.

pub mod pause;
pub mod probe;
