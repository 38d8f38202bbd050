//! OCI images: references, the distribution API, layer extraction and the node's
//! content-addressed store.

pub mod http;
pub mod layout;
pub mod reference;
pub mod registry;
pub mod store;
pub mod unpack;
