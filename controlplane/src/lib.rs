//! The Kubernetes-compatible control plane: the API machinery (`api`), its HTTPS transport
//! (`server`), the cluster PKI (`pki`) and the storage layer (`storage`: the `Store` trait and the
//! embedded durable backend). Scheduler, controllers and the etcd backend are not written yet.

#![forbid(unsafe_code)]

pub mod api;
pub mod inprocess;
pub mod pki;
pub mod process;
pub mod server;
pub mod storage;
