//! The Kubernetes-compatible control plane: the API machinery (`api`), its HTTPS front
//! (`server`), the in-process transport of bundled components (`inprocess`), the cluster PKI
//! (`pki`) and the storage layer (`storage`: the `Store` trait, the embedded durable backend and
//! the etcd backend).

#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod controllers;
pub mod cron;
pub mod events;
pub mod hollow;
pub mod inprocess;
pub mod leader;
pub mod pki;
#[cfg(any(test, feature = "testing"))]
pub mod process;
pub mod rlimit;
pub mod scheduler;
pub mod server;
pub mod storage;
