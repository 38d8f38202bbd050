//! Kubernetes logic used by both the control plane and the node agent, with no server
//! dependencies (DESIGN.md §2: one place, never two copies). Today: API time formats and JSON merge patch.

#![forbid(unsafe_code)]

pub mod json;
pub mod time;
