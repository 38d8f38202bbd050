//! The Kubernetes-compatible control plane. Today: the storage layer (the `Store` trait and the
//! embedded, durable backend). The API server, the etcd backend, scheduler and controllers come
//! with the control-plane issue.

#![forbid(unsafe_code)]

pub mod storage;
