//! HTTP and TLS plumbing shared by the control plane and the node agent, so that each exists
//! once: TLS configurations from PEM (`tls`, ring provider, explicit CAs: a node image has no
//! system trust store), the HTTPS server loop (`server`: timeouts, connection cap, client
//! certificate identity), response bodies (`body`), a pooled HTTP/1.1 client (`client`, for the
//! etcd gateway, the proxy to node agents and the benchmarks) and the Kubernetes API client
//! stack (`kubeapi`: the `kube` crate configured from a server URL, CA and credentials, or a
//! kubeconfig file).

#![forbid(unsafe_code)]

pub mod body;
pub mod client;
pub mod kubeapi;
pub mod server;
pub mod tls;

pub use body::Body;
