//! Kubernetes logic used by both the control plane and the node agent, with no server
//! dependencies (docs/DESIGN.md §2: one place, never two copies). Today: API time formats, JSON merge patch and
//! resource quantities, URL query values.

#![forbid(unsafe_code)]

pub mod json;
pub mod quantity;
pub mod time;
pub mod url;
