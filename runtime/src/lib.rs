//! Everything below the pod abstraction: images, sandboxes, containers, cgroups and pod network
//! devices. Nothing here knows the Kubernetes API.

pub mod image;
pub mod pause;
pub mod probe;
mod sys;
