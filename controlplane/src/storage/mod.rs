//! Storage behind one trait with etcd's model: a global revision that is every object's
//! `resourceVersion`, compare-and-swap on an object's revision, watch from a revision, and
//! compaction (a watch from before the compacted revision fails with [`StoreError::Compacted`]).

pub mod embedded;
pub mod encryption;
pub mod etcd;
mod packed;
mod wal;

use std::future::Future;
use std::pin::Pin;

/// A store revision (etcd's `mod_revision`; the API's `resourceVersion`).
pub type Revision = i64;

/// A stored value with its revisions. The value is shared, not copied, between the store's
/// watch history (as an event's object and as the next event's previous object) and the
/// readers it is handed to (the embedded store's map keeps it compressed, `packed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: bytes::Bytes,
    /// The revision that created the key.
    pub create_revision: Revision,
    /// The revision of the last change to the key.
    pub mod_revision: Revision,
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change. For a delete, `kv` is the last value and `kv.mod_revision` the delete's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// The value before this change (None for a creation).
    pub prev: Option<KeyValue>,
}

/// Errors of every store backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("key {key} not found")]
    NotFound { key: String },
    #[error("key {key} already exists")]
    AlreadyExists { key: String },
    #[error("key {key} was modified: expected revision {expected}, found {actual}")]
    Conflict {
        key: String,
        expected: Revision,
        actual: Revision,
    },
    #[error("revision {requested} has been compacted (oldest available is {compacted} + 1)")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    #[error("revision {requested} is in the future (the current revision is {current})")]
    FutureRevision { requested: Revision, current: Revision },
    #[error("store I/O on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("store data in {path} is corrupt: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("the store is shut down")]
    Closed,
    /// A stored value the encryption configuration cannot read (or a value it cannot encrypt).
    #[error("unable to transform key {key:?}: {reason}")]
    Transform { key: String, reason: String },
    /// A value over [`MAX_VALUE`]: refused before anything is written (etcd's text).
    #[error("etcdserver: request is too large")]
    TooLarge { key: String, size: usize },
}

/// The largest value one write may store: etcd's default request limit (1.5 MiB), enforced by
/// every backend before the write is made, so no path (create, update, patch, status, apply)
/// stores an object a real etcd would refuse, and the embedded log never holds a record it
/// could not read back.
pub const MAX_VALUE: usize = 1_572_864;

/// Refuses a write whose value is over [`MAX_VALUE`].
pub fn check_size(w: &Write) -> Result<()> {
    match w {
        Write::Create { key, value } | Write::Update { key, value, .. } if value.len() > MAX_VALUE => {
            Err(StoreError::TooLarge {
                key: key.clone(),
                size: value.len(),
            })
        }
        _ => Ok(()),
    }
}

/// Result alias for the store.
pub type Result<T> = std::result::Result<T, StoreError>;

/// A boxed future, so the trait can be used as `Arc<dyn Store>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A page of a range read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    pub items: Vec<KeyValue>,
    /// The store revision the page was read at.
    pub revision: Revision,
    /// True when more keys follow the last one returned.
    pub more: bool,
}

/// One write of a transaction-free API: the store applies it atomically and returns the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Fails with AlreadyExists if the key exists.
    Create { key: String, value: bytes::Bytes },
    /// Fails with NotFound / Conflict unless the key exists at `expected` (or any revision if None).
    Update {
        key: String,
        value: bytes::Bytes,
        expected: Option<Revision>,
    },
    /// Fails with NotFound / Conflict like Update.
    Delete { key: String, expected: Option<Revision> },
}

impl Write {
    /// The key written.
    pub fn key(&self) -> &str {
        match self {
            Write::Create { key, .. } | Write::Update { key, .. } | Write::Delete { key, .. } => key,
        }
    }
}

/// Keeps a revision readable with [`Store::list_at`] while it is alive (see
/// [`Store::hold_revision`]); dropping it releases the revision.
pub struct RevisionHold {
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl RevisionHold {
    /// A hold that needs no release (the backend keeps old revisions by itself).
    pub fn none() -> Self {
        Self { release: None }
    }

    /// A hold that runs `release` when dropped.
    pub fn new(release: impl FnOnce() + Send + 'static) -> Self {
        Self {
            release: Some(Box::new(release)),
        }
    }
}

impl Drop for RevisionHold {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

impl std::fmt::Debug for RevisionHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RevisionHold")
            .field("releases", &self.release.is_some())
            .finish()
    }
}

/// A stream of events for a key prefix.
pub trait WatchStream: Send {
    /// The next event; `Err(Compacted)` when the watcher fell too far behind, `Err(Closed)` at shutdown.
    fn next(&mut self) -> BoxFuture<'_, Result<Event>>;
}

/// The storage interface of the API server.
pub trait Store: Send + Sync + 'static {
    /// Reads one key at the current revision.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>>>;
    /// Reads keys with `prefix` in key order, starting after `start_after` (exclusive), at most
    /// `limit` (0 = all).
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage>>;
    /// Reads like [`Store::list`], but the keys as they were at `revision`, so that a read of
    /// many pages sees one consistent state. [`StoreError::Compacted`] when the store no longer
    /// has that revision's history, [`StoreError::FutureRevision`] when it is newer than the
    /// current revision.
    fn list_at<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
        revision: Revision,
    ) -> BoxFuture<'a, Result<ListPage>>;
    /// Holds `revision` (one a read just returned): while the returned [`RevisionHold`] lives,
    /// the store keeps what [`Store::list_at`] needs to read at it (within backend limits: a
    /// reader that stalls for ever does not make the store keep history for ever).
    /// [`StoreError::Compacted`] when it is already gone.
    fn hold_revision(&self, revision: Revision) -> BoxFuture<'_, Result<RevisionHold>>;
    /// Applies one write durably; the returned event carries the new revision.
    fn write(&self, w: Write) -> BoxFuture<'_, Result<Event>>;
    /// Events for keys under `prefix` with revision greater than `after`.
    fn watch<'a>(&'a self, prefix: &'a str, after: Revision) -> BoxFuture<'a, Result<Box<dyn WatchStream>>>;
    /// The current revision.
    fn revision(&self) -> BoxFuture<'_, Result<Revision>>;
    /// The highest compacted revision (watches must start after it).
    fn compacted(&self) -> BoxFuture<'_, Result<Revision>>;
    /// Why the store takes no more writes (it became read-only after a failed log write), or
    /// None while it is writable. The API server's `/readyz` reports it.
    fn failure(&self) -> Option<String>;
}
