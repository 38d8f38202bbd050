//! Kubernetes logic used by both the control plane and the node agent, with no server
//! dependencies (docs/DESIGN.md §2: one place, never two copies): API time formats, JSON merge
//! patch, resource quantities and pod requests, QoS class and OOM scores, label/node selectors,
//! taints and tolerations, URL query values.

#![forbid(unsafe_code)]

pub mod allocatable;
pub mod json;
pub mod labels;
pub mod names;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod summary;
pub mod taints;
pub mod time;
pub mod url;
