//! The Kubernetes-compatible control plane. Not yet written: see the control-plane issue.

#![forbid(unsafe_code)]
