//! Images as the runtime's clients see them: what to pull, and what is on the node.

use serde::{Deserialize, Serialize};

/// When `PullImage` goes to the registry (the container's `imagePullPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    /// Resolve the reference at the registry; download only what is not present.
    Always,
    /// Use a present image without asking the registry.
    #[default]
    IfNotPresent,
    /// Never reach the registry: a missing image is `NotFound`.
    Never,
}

/// Registry credentials (basic auth, or exchanged for a bearer token).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// An image present on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// The normalised reference (`docker.io/library/busybox:1`).
    pub reference: String,
    /// The image id: the digest of its config.
    pub id: String,
    /// The digest of its manifest (what `<name>@<digest>` pins).
    pub digest: String,
    /// Bytes of its compressed layers.
    pub size: u64,
}
