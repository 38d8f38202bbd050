//! The embedded store (the default backend): an in-memory ordered map made durable by a
//! write-ahead log with group commit (one fsync per batch of concurrent writes; a write is
//! acknowledged only after its batch is on disk; while clients write concurrently, a small batch
//! waits up to [`COMMIT_DELAY`] for more, as PostgreSQL's `commit_delay`), plus a snapshot. The
//! log is folded into a new snapshot once it outgrows [`EmbeddedConfig::compact_log_bytes`], so
//! disk use stays bounded by the live data plus that threshold. Watch history is kept in memory, bounded by count and bytes;
//! a watch from before it is [`StoreError::Compacted`]. The same history answers reads at a past
//! revision ([`Store::list_at`]): a key changed since then reads as the value its first later
//! change replaced. A [`Store::hold_revision`] keeps that history past the usual bounds (up to
//! the `held_*` ones) while a long read runs.
//!
//! The map keeps a value as written while the history holds its event (shared with it), and
//! compressed ([`Packed`]) once the history lets the event go; the history, the log and the
//! snapshot keep values as written.
//!
//! Readers never see a write before it is durable: the single writer thread validates a batch
//! against the committed state plus the batch's own earlier writes, fsyncs it, and only then
//! applies it to the shared state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, mpsc};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot};

use super::packed::Packed;
use super::wal::{self, Op};
use super::{
    BoxFuture, Event, EventKind, KeyValue, ListPage, Result, Revision, RevisionHold, Store, StoreError,
    WatchStream, Write,
};

/// Tuning of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub dir: PathBuf,
    /// Events kept for watches that start in the past.
    pub history_events: usize,
    /// ... and at most this many bytes of them.
    pub history_bytes: usize,
    /// Fold the log into a snapshot when it grows past this.
    pub compact_log_bytes: u64,
    /// While a revision is held, history is kept up to this many events ...
    pub held_history_events: usize,
    /// ... and this many bytes (then it is dropped anyway and the held read fails as compacted).
    pub held_history_bytes: usize,
}

impl EmbeddedConfig {
    /// Defaults for a data directory.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            history_events: 10_000,
            history_bytes: 32 << 20,
            compact_log_bytes: 64 << 20,
            held_history_events: 200_000,
            held_history_bytes: 256 << 20,
        }
    }
}

/// A live key's value and revisions (the key is the map's).
#[derive(Debug, Clone)]
struct Live {
    value: Packed,
    create_revision: Revision,
    mod_revision: Revision,
}

impl Live {
    fn new(kv: &KeyValue, value: Packed) -> Self {
        Self {
            value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        }
    }

    /// The key's value as written.
    fn read(&self, key: String) -> Result<KeyValue> {
        let value = self.value.unpack().map_err(|e| StoreError::Corrupt {
            path: format!("the store's value of {key} in memory"),
            reason: e.to_string(),
        })?;
        Ok(KeyValue {
            key,
            value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        })
    }
}

/// A value a read takes under the state's lock, unpacked once the lock is released (so a long
/// list does not hold up the writer while it decompresses).
enum Taken {
    Live(String, Live),
    Written(KeyValue),
}

/// A page of [`Taken`] values.
struct TakenPage {
    items: Vec<Taken>,
    revision: Revision,
    more: bool,
}

impl TakenPage {
    fn read(self) -> Result<ListPage> {
        let items = self
            .items
            .into_iter()
            .map(|t| match t {
                Taken::Live(key, live) => live.read(key),
                Taken::Written(kv) => Ok(kv),
            })
            .collect::<Result<_>>()?;
        Ok(ListPage {
            items,
            revision: self.revision,
            more: self.more,
        })
    }
}

#[derive(Debug, Default)]
struct State {
    kvs: BTreeMap<String, Live>,
    revision: Revision,
    compacted: Revision,
    history: VecDeque<Arc<Event>>,
    history_bytes: usize,
    /// Held revisions (see [`Store::hold_revision`]) and how many holders each has.
    holds: BTreeMap<Revision, usize>,
    failed: Option<String>,
}

impl State {
    /// Whether the oldest history event may go: always past the held bounds, else past the
    /// usual bounds unless a held revision still needs it.
    fn must_trim(&self, cfg: &EmbeddedConfig) -> bool {
        let Some(oldest) = self.history.front() else {
            return false;
        };
        if self.history.len() > cfg.held_history_events || self.history_bytes > cfg.held_history_bytes {
            return true;
        }
        let over = self.history.len() > cfg.history_events || self.history_bytes > cfg.history_bytes;
        let needed = self
            .holds
            .keys()
            .next()
            .is_some_and(|held| oldest.kv.mod_revision > *held);
        over && !needed
    }

    /// Keys under `prefix` after `start_after`, at most `limit` (0 = all), as they were at
    /// `rev` (not before the compacted revision, not after the current one).
    fn range_at(&self, prefix: &str, start_after: Option<&str>, limit: usize, rev: Revision) -> TakenPage {
        /// What its first change after `rev` replaced, of a changed key.
        fn replaced((_, v): (&str, Option<&KeyValue>)) -> Option<Taken> {
            v.cloned().map(Taken::Written)
        }
        use std::ops::Bound;
        let in_range = |k: &str| k.starts_with(prefix) && start_after.is_none_or(|s| k > s);
        // Keys changed after `rev`: their value then is what their first later change replaced
        // (None: they did not exist then).
        let first = self.history.partition_point(|e| e.kv.mod_revision <= rev);
        let mut then: BTreeMap<&str, Option<&KeyValue>> = BTreeMap::new();
        for ev in self.history.range(first..) {
            if in_range(&ev.kv.key) {
                then.entry(ev.kv.key.as_str()).or_insert(ev.prev.as_ref());
            }
        }
        let lower = match start_after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Included(prefix),
        };
        let mut now = self
            .kvs
            .range::<str, _>((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .peekable();
        let mut changed = then.into_iter().peekable();
        let (mut items, mut more) = (Vec::new(), false);
        loop {
            // Merge the two key-ordered sequences; a changed key's old value wins.
            let next = match (now.peek(), changed.peek()) {
                (None, None) => break,
                (Some((k, _)), Some((c, _))) if k.as_str() == *c => {
                    now.next();
                    changed.next().and_then(replaced)
                }
                (Some((k, _)), Some((c, _))) if k.as_str() > *c => changed.next().and_then(replaced),
                (Some(_), _) => now.next().map(|(k, v)| Taken::Live(k.clone(), v.clone())),
                (None, Some(_)) => changed.next().and_then(replaced),
            };
            let Some(taken) = next else { continue };
            if limit > 0 && items.len() == limit {
                more = true;
                break;
            }
            items.push(taken);
        }
        TakenPage {
            items,
            revision: rev,
            more,
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: RwLock<State>,
    events: broadcast::Sender<Arc<Event>>,
}

struct Request {
    write: Write,
    reply: oneshot::Sender<Result<Event>>,
}

/// The embedded store. Dropping it stops the writer thread after the queued writes.
#[derive(Debug)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    tx: std::sync::Mutex<Option<mpsc::Sender<Request>>>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("key", &self.write.key()).finish()
    }
}

const SNAPSHOT: &str = "snapshot.db";
const LOG: &str = "wal.log";

fn event_bytes(e: &Event) -> usize {
    e.kv.key.len() + e.kv.value.len() + e.prev.as_ref().map_or(0, |p| p.value.len()) + 96
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `cfg.dir`, recovering from the snapshot and the log.
    pub fn open(cfg: EmbeddedConfig) -> Result<Self> {
        let dir_err = |source| StoreError::Io {
            path: cfg.dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&cfg.dir).map_err(dir_err)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&cfg.dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
        }
        let snap_path = cfg.dir.join(SNAPSHOT);
        let log_path = cfg.dir.join(LOG);
        let mut state = State::default();
        // Recovered as written; the writer thread packs them once it runs (see `Writer::run`).
        let recovered = |r: wal::Record| {
            let live = Live {
                value: Packed::Raw(r.value.into()),
                create_revision: r.create_revision,
                mod_revision: r.revision,
            };
            (r.key, live)
        };
        let snap = wal::read_file(&snap_path)?;
        if !snap.is_empty() {
            let (recs, len) = wal::decode_all(&snap);
            if len != snap.len() || recs.first().map(|r| r.op) != Some(Op::SnapshotHeader) {
                return Err(StoreError::Corrupt {
                    path: snap_path.display().to_string(),
                    reason: format!("valid up to byte {len} of {}", snap.len()),
                });
            }
            state.revision = recs[0].revision;
            state.compacted = recs[0].create_revision;
            state.kvs.extend(recs.into_iter().skip(1).map(recovered));
        }
        let log = wal::read_file(&log_path)?;
        let (recs, valid) = wal::decode_all(&log);
        if let Some(next) = wal::valid_record_after(&log, valid) {
            // Not a torn tail: acknowledged records follow the damage. Keep the file.
            return Err(StoreError::Corrupt {
                path: log_path.display().to_string(),
                reason: format!(
                    "the record at byte {valid} is damaged but valid records follow (at byte {next}); \
                     refusing to drop acknowledged writes (the file is left as it is)"
                ),
            });
        }
        if valid < log.len() {
            tracing::warn!(path = %log_path.display(), dropped_bytes = log.len() - valid, "dropping the log's unacknowledged torn tail");
        }
        for r in recs {
            if r.revision <= state.revision {
                continue; // already in the snapshot
            }
            state.revision = r.revision;
            match r.op {
                Op::Put => {
                    let (key, live) = recovered(r);
                    state.kvs.insert(key, live);
                }
                Op::Delete => {
                    state.kvs.remove(&r.key);
                }
                Op::SnapshotHeader => {}
            }
        }
        let cold = state
            .kvs
            .iter()
            .filter_map(|(key, live)| match &live.value {
                Packed::Raw(value) => Some(Cold {
                    key: key.clone(),
                    mod_revision: live.mod_revision,
                    value: value.clone(),
                }),
                Packed::Lz4 { .. } => None,
            })
            .collect();
        // History does not survive a restart: watches must start at the recovered revision.
        state.compacted = state.revision;
        let log_file = wal::open_log(&log_path, valid as u64)?;
        let (events, _) = broadcast::channel(65_536);
        let shared = Arc::new(Shared {
            state: RwLock::new(state),
            events,
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            shared: shared.clone(),
            cfg,
            log: log_file,
            log_bytes: valid as u64,
            cold,
            last_batch: 0,
        };
        let handle = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| StoreError::Io {
                path: "store writer thread".into(),
                source,
            })?;
        Ok(Self {
            shared,
            tx: std::sync::Mutex::new(Some(tx)),
            writer: std::sync::Mutex::new(Some(handle)),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.shared.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops accepting writes and waits for the writer to finish the queued ones.
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut h) = self.writer.lock()
            && let Some(h) = h.take()
        {
            let _ = h.join();
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long a small batch waits for more writes before its fsync, when the batch before it
/// held several (clients are writing concurrently; a lone client's writes never wait). An
/// fsync costs this VM's writer about 150-180 µs of CPU whatever the batch size, and in
/// `bench scheduler` batches averaged 2.2 writes (18,129 fsyncs for about 40,000 writes in
/// 14 s), so fewer, larger batches leave that CPU to the API.
const COMMIT_DELAY: Duration = Duration::from_millis(1);
/// A batch this large commits without waiting.
const GROUP_TARGET: usize = 16;
/// The most writes one batch takes.
const MAX_BATCH: usize = 4096;

/// How many values the writer packs at a time (about 0.35 ms at 11 µs a value, optimised).
const PACK_CHUNK: usize = 32;

/// A live value to pack, as of its revision.
#[derive(Debug)]
struct Cold {
    key: String,
    mod_revision: Revision,
    value: bytes::Bytes,
}

impl From<KeyValue> for Cold {
    fn from(kv: KeyValue) -> Self {
        Self {
            key: kv.key,
            mod_revision: kv.mod_revision,
            value: kv.value,
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    cfg: EmbeddedConfig,
    log: File,
    log_bytes: u64,
    /// Live values to pack: those a restart recovered, then those whose events left the history.
    cold: VecDeque<Cold>,
    /// How many writes the last batch held.
    last_batch: usize,
}

/// Checks one write against the value it would replace; returns the new value (None = deleted).
fn apply_one(w: &Write, current: Option<&KeyValue>, rev: Revision) -> Result<Event> {
    let check = |key: &str, expected: Option<Revision>| -> Result<KeyValue> {
        let cur = current.ok_or_else(|| StoreError::NotFound { key: key.into() })?;
        if let Some(e) = expected
            && e != cur.mod_revision
        {
            return Err(StoreError::Conflict {
                key: key.into(),
                expected: e,
                actual: cur.mod_revision,
            });
        }
        Ok(cur.clone())
    };
    match w {
        Write::Create { key, value } => {
            if current.is_some() {
                return Err(StoreError::AlreadyExists { key: key.clone() });
            }
            let kv = KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: rev,
                mod_revision: rev,
            };
            Ok(Event {
                kind: EventKind::Put,
                kv,
                prev: None,
            })
        }
        Write::Update { key, value, expected } => {
            let prev = check(key, *expected)?;
            let kv = KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: prev.create_revision,
                mod_revision: rev,
            };
            Ok(Event {
                kind: EventKind::Put,
                kv,
                prev: Some(prev),
            })
        }
        Write::Delete { key, expected } => {
            let prev = check(key, *expected)?;
            let kv = KeyValue {
                mod_revision: rev,
                ..prev.clone()
            };
            Ok(Event {
                kind: EventKind::Delete,
                kv,
                prev: Some(prev),
            })
        }
    }
}

impl Writer {
    /// Commits batches of writes as they come; between them, and while no write waits, packs
    /// cold values a chunk at a time (the values a restart recovered, then those whose events
    /// leave the history), so a write never waits for more than one chunk.
    fn run(mut self, rx: mpsc::Receiver<Request>) {
        loop {
            let first = match rx.try_recv() {
                Ok(r) => r,
                Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) if !self.cold.is_empty() => {
                    self.pack_cold();
                    continue;
                }
                Err(mpsc::TryRecvError::Empty) => match rx.recv() {
                    Ok(r) => r,
                    Err(_) => return,
                },
            };
            let mut batch = vec![first];
            // A small batch waits for more only while clients write concurrently.
            let wait_until = (self.last_batch > 1).then(|| Instant::now() + COMMIT_DELAY);
            while batch.len() < MAX_BATCH {
                let next = match wait_until {
                    Some(t) if batch.len() < GROUP_TARGET => {
                        rx.recv_timeout(t.saturating_duration_since(Instant::now())).ok()
                    }
                    _ => rx.try_recv().ok(),
                };
                match next {
                    Some(r) => batch.push(r),
                    None => break,
                }
            }
            self.last_batch = batch.len();
            self.commit(batch);
            // At least one chunk per batch, so packing keeps up under a steady load.
            self.pack_cold();
            if self.log_bytes > self.cfg.compact_log_bytes
                && let Err(e) = self.snapshot()
            {
                tracing::error!(error = %e, "store snapshot failed; the log keeps growing");
            }
        }
    }

    fn commit(&mut self, batch: Vec<Request>) {
        let mut results: Vec<Result<Event>> = Vec::with_capacity(batch.len());
        let mut buf = Vec::new();
        let mut rev;
        {
            let st = self.shared.state.read().unwrap_or_else(|p| p.into_inner());
            if let Some(reason) = &st.failed {
                let reason = reason.clone();
                drop(st);
                for r in batch {
                    let _ = r.reply.send(Err(StoreError::Corrupt {
                        path: self.cfg.dir.display().to_string(),
                        reason: reason.clone(),
                    }));
                }
                return;
            }
            rev = st.revision;
            let mut overlay: HashMap<String, Option<KeyValue>> = HashMap::new();
            for req in &batch {
                let key = req.write.key();
                // A create needs only to know the key exists: no unpacking.
                let current = match (overlay.get(key), &req.write, st.kvs.get(key)) {
                    (Some(v), _, _) => Ok(v.clone()),
                    (None, _, None) => Ok(None),
                    (None, Write::Create { .. }, Some(_)) => {
                        Err(StoreError::AlreadyExists { key: key.into() })
                    }
                    (None, _, Some(live)) => live.read(key.to_string()).map(Some),
                };
                match current.and_then(|current| apply_one(&req.write, current.as_ref(), rev + 1)) {
                    Ok(ev) => {
                        rev += 1;
                        let op = match ev.kind {
                            EventKind::Put => Op::Put,
                            EventKind::Delete => Op::Delete,
                        };
                        wal::encode(
                            wal::Entry {
                                op,
                                revision: rev,
                                create_revision: ev.kv.create_revision,
                                key,
                                value: if op == Op::Put { &ev.kv.value } else { &[] },
                            },
                            &mut buf,
                        );
                        overlay.insert(key.into(), (ev.kind == EventKind::Put).then(|| ev.kv.clone()));
                        results.push(Ok(ev));
                    }
                    Err(e) => results.push(Err(e)),
                }
            }
        }
        if !buf.is_empty() {
            let durable = self.log.write_all(&buf).and_then(|()| self.log.sync_data());
            if let Err(e) = durable {
                // The log may now hold a partial batch: refuse further writes rather than guess.
                let reason = format!("log write failed: {e}");
                tracing::error!(error = %e, "store log write failed; the store is now read-only");
                self.shared
                    .state
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .failed = Some(reason);
                for r in batch {
                    let _ = r.reply.send(Err(StoreError::Io {
                        path: self.cfg.dir.join(LOG).display().to_string(),
                        source: std::io::Error::new(e.kind(), e.to_string()),
                    }));
                }
                return;
            }
            self.log_bytes += buf.len() as u64;
        }
        let mut committed = Vec::new();
        {
            let mut st = self.shared.state.write().unwrap_or_else(|p| p.into_inner());
            for ev in results.iter().flatten() {
                match ev.kind {
                    EventKind::Put => {
                        // As written, shared with the history's event: packed when that goes.
                        let value = Packed::Raw(ev.kv.value.clone());
                        st.kvs.insert(ev.kv.key.clone(), Live::new(&ev.kv, value));
                    }
                    EventKind::Delete => {
                        st.kvs.remove(&ev.kv.key);
                    }
                }
                let ev = Arc::new(ev.clone());
                st.history_bytes += event_bytes(&ev);
                st.history.push_back(ev.clone());
                committed.push(ev);
            }
            st.revision = rev;
            while st.must_trim(&self.cfg) {
                let Some(old) = st.history.pop_front() else { break };
                st.history_bytes -= event_bytes(&old);
                st.compacted = old.kv.mod_revision;
                // The value this event wrote, if still live, is now read only from the map.
                if old.kind == EventKind::Put
                    && st
                        .kvs
                        .get(&old.kv.key)
                        .is_some_and(|l| l.mod_revision == old.kv.mod_revision)
                {
                    self.cold.push_back(Cold::from(old.kv.clone()));
                }
            }
        }
        for ev in committed {
            let _ = self.shared.events.send(ev);
        }
        for (req, res) in batch.into_iter().zip(results) {
            let _ = req.reply.send(res);
        }
    }

    /// Packs the next [`PACK_CHUNK`] values of [`Writer::cold`] outside the state lock; a value
    /// changed meanwhile is left to its own event.
    fn pack_cold(&mut self) {
        let n = self.cold.len().min(PACK_CHUNK);
        let packed: Vec<(Cold, Packed)> = self
            .cold
            .drain(..n)
            .map(|c| {
                let p = Packed::pack(&c.value);
                (c, p)
            })
            .filter(|(_, p)| !p.is_raw())
            .collect();
        if packed.is_empty() {
            return;
        }
        let mut st = self.shared.state.write().unwrap_or_else(|p| p.into_inner());
        for (c, p) in packed {
            if let Some(live) = st.kvs.get_mut(&c.key)
                && live.mod_revision == c.mod_revision
            {
                live.value = p;
            }
        }
    }

    /// Writes every live key into a new snapshot, then empties the log.
    fn snapshot(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let mut bytes = 0u64;
        {
            let st = self.shared.state.read().unwrap_or_else(|p| p.into_inner());
            wal::write_atomic(&self.cfg.dir.join(SNAPSHOT), |w| {
                let mut buf = Vec::new();
                let header = wal::Entry {
                    op: Op::SnapshotHeader,
                    revision: st.revision,
                    create_revision: st.compacted,
                    key: "",
                    value: &[],
                };
                let mut put = |entry: wal::Entry<'_>| {
                    buf.clear();
                    wal::encode(entry, &mut buf);
                    bytes += buf.len() as u64;
                    w.write_all(&buf)
                };
                put(header)?;
                // Values as written: the snapshot does not depend on this build's dictionary.
                for (key, live) in &st.kvs {
                    let value = live.value.unpack()?;
                    put(wal::Entry {
                        op: Op::Put,
                        revision: live.mod_revision,
                        create_revision: live.create_revision,
                        key,
                        value: &value,
                    })?;
                }
                Ok(())
            })?;
        }
        // A crash between the rename and here is safe: replay skips records the snapshot holds.
        let log_path = self.cfg.dir.join(LOG);
        self.log
            .set_len(0)
            .and_then(|()| self.log.sync_all())
            .map_err(|source| StoreError::Io {
                path: log_path.display().to_string(),
                source,
            })?;
        // Writes wait meanwhile: the snapshot is written by the writer thread.
        tracing::info!(
            snapshot_bytes = bytes,
            folded_log_bytes = self.log_bytes,
            took_ms = started.elapsed().as_millis(),
            "store compacted"
        );
        self.log_bytes = 0;
        Ok(())
    }
}

struct EmbeddedWatch {
    backlog: VecDeque<Arc<Event>>,
    rx: broadcast::Receiver<Arc<Event>>,
    prefix: String,
    last: Revision,
    compacted_hint: Arc<Shared>,
}

impl WatchStream for EmbeddedWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Event>> {
        Box::pin(async move {
            loop {
                let ev = match self.backlog.pop_front() {
                    Some(e) => e,
                    None => match self.rx.recv().await {
                        Ok(e) => e,
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let compacted =
                                self.compacted_hint.state.read().map(|s| s.compacted).unwrap_or(0);
                            return Err(StoreError::Compacted {
                                requested: self.last,
                                compacted,
                            });
                        }
                        Err(broadcast::error::RecvError::Closed) => return Err(StoreError::Closed),
                    },
                };
                if ev.kv.mod_revision > self.last && ev.kv.key.starts_with(&self.prefix) {
                    self.last = ev.kv.mod_revision;
                    return Ok((*ev).clone());
                }
            }
        })
    }
}

impl Store for EmbeddedStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>>> {
        Box::pin(async move {
            let live = self.read().kvs.get(key).cloned();
            live.map(|live| live.read(key.to_string())).transpose()
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage>> {
        Box::pin(async move {
            use std::ops::Bound;
            let page = {
                let st = self.read();
                let lower = match start_after {
                    Some(k) => Bound::Excluded(k.to_string()),
                    None => Bound::Included(prefix.to_string()),
                };
                let mut items = Vec::new();
                let mut more = false;
                for (k, live) in st.kvs.range((lower, Bound::Unbounded)) {
                    if !k.starts_with(prefix) {
                        break;
                    }
                    if limit > 0 && items.len() == limit {
                        more = true;
                        break;
                    }
                    items.push(Taken::Live(k.clone(), live.clone()));
                }
                TakenPage {
                    items,
                    revision: st.revision,
                    more,
                }
            };
            page.read()
        })
    }

    fn list_at<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
        revision: Revision,
    ) -> BoxFuture<'a, Result<ListPage>> {
        Box::pin(async move {
            let st = self.read();
            if revision < st.compacted {
                return Err(StoreError::Compacted {
                    requested: revision,
                    compacted: st.compacted,
                });
            }
            if revision > st.revision {
                return Err(StoreError::FutureRevision {
                    requested: revision,
                    current: st.revision,
                });
            }
            let page = st.range_at(prefix, start_after, limit, revision);
            drop(st);
            page.read()
        })
    }

    fn hold_revision(&self, revision: Revision) -> BoxFuture<'_, Result<RevisionHold>> {
        Box::pin(async move {
            {
                let mut st = self.shared.state.write().unwrap_or_else(|p| p.into_inner());
                if revision < st.compacted {
                    return Err(StoreError::Compacted {
                        requested: revision,
                        compacted: st.compacted,
                    });
                }
                if revision > st.revision {
                    return Err(StoreError::FutureRevision {
                        requested: revision,
                        current: st.revision,
                    });
                }
                *st.holds.entry(revision).or_default() += 1;
            }
            let shared = self.shared.clone();
            Ok(RevisionHold::new(move || {
                let mut st = shared.state.write().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = st.holds.get_mut(&revision) {
                    *n -= 1;
                    if *n == 0 {
                        st.holds.remove(&revision);
                    }
                }
            }))
        })
    }

    fn write(&self, w: Write) -> BoxFuture<'_, Result<Event>> {
        Box::pin(async move {
            super::check_size(&w)?;
            let (reply, rx) = oneshot::channel();
            {
                let tx = self.tx.lock().map_err(|_| StoreError::Closed)?;
                tx.as_ref()
                    .ok_or(StoreError::Closed)?
                    .send(Request { write: w, reply })
                    .map_err(|_| StoreError::Closed)?;
            }
            rx.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, after: Revision) -> BoxFuture<'a, Result<Box<dyn WatchStream>>> {
        Box::pin(async move {
            let st = self.read();
            if after < st.compacted {
                return Err(StoreError::Compacted {
                    requested: after,
                    compacted: st.compacted,
                });
            }
            let rx = self.shared.events.subscribe();
            let backlog = st
                .history
                .iter()
                .filter(|e| e.kv.mod_revision > after && e.kv.key.starts_with(prefix))
                .cloned()
                .collect();
            Ok(Box::new(EmbeddedWatch {
                backlog,
                rx,
                prefix: prefix.into(),
                last: after,
                compacted_hint: self.shared.clone(),
            }) as Box<dyn WatchStream>)
        })
    }

    fn revision(&self) -> BoxFuture<'_, Result<Revision>> {
        Box::pin(async move { Ok(self.read().revision) })
    }

    fn compacted(&self) -> BoxFuture<'_, Result<Revision>> {
        Box::pin(async move { Ok(self.read().compacted) })
    }

    fn failure(&self) -> Option<String> {
        self.read().failed.clone()
    }
}

impl EmbeddedStore {
    /// Puts the store in the state a failed log write leaves it in (read-only), for tests of
    /// what depends on it.
    #[cfg(any(test, feature = "testing"))]
    pub fn fail_for_test(&self, reason: &str) {
        self.shared
            .state
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .failed = Some(reason.to_string());
    }
}

/// Opens a store for tests and tools at `dir` with default tuning.
pub fn open_default(dir: &Path) -> Result<EmbeddedStore> {
    EmbeddedStore::open(EmbeddedConfig::new(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> Result<tempfile::TempDir> {
        tempfile::tempdir().map_err(|e| StoreError::Io {
            path: "tmp".into(),
            source: e,
        })
    }

    fn put(key: &str, v: &str) -> Write {
        Write::Create {
            key: key.into(),
            value: bytes::Bytes::copy_from_slice(v.as_bytes()),
        }
    }

    #[tokio::test]
    async fn create_get_update_delete_with_cas() -> Result<()> {
        let dir = tmp()?;
        let s = open_default(dir.path())?;
        let e1 = s.write(put("/pods/a", "1")).await?;
        assert_eq!(e1.kv.mod_revision, 1);
        assert!(matches!(
            s.write(put("/pods/a", "x")).await,
            Err(StoreError::AlreadyExists { .. })
        ));
        let stale = Write::Update {
            key: "/pods/a".into(),
            value: bytes::Bytes::from_static(b"2"),
            expected: Some(0),
        };
        assert!(matches!(
            s.write(stale).await,
            Err(StoreError::Conflict {
                expected: 0,
                actual: 1,
                ..
            })
        ));
        let e2 = s
            .write(Write::Update {
                key: "/pods/a".into(),
                value: bytes::Bytes::from_static(b"2"),
                expected: Some(1),
            })
            .await?;
        assert_eq!((e2.kv.mod_revision, e2.kv.create_revision), (2, 1));
        assert_eq!(
            s.get("/pods/a").await?.map(|kv| kv.value),
            Some(bytes::Bytes::from_static(b"2"))
        );
        let e3 = s
            .write(Write::Delete {
                key: "/pods/a".into(),
                expected: None,
            })
            .await?;
        assert_eq!(e3.kind, EventKind::Delete);
        assert_eq!(s.get("/pods/a").await?, None);
        assert!(matches!(
            s.write(Write::Delete {
                key: "/pods/a".into(),
                expected: None
            })
            .await,
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(s.revision().await?, 3);
        Ok(())
    }

    #[tokio::test]
    async fn list_pages_by_prefix() -> Result<()> {
        let dir = tmp()?;
        let s = open_default(dir.path())?;
        for k in ["/a/1", "/a/2", "/a/3", "/b/1"] {
            s.write(put(k, "v")).await?;
        }
        let p1 = s.list("/a/", None, 2).await?;
        assert_eq!(
            p1.items.iter().map(|kv| kv.key.as_str()).collect::<Vec<_>>(),
            ["/a/1", "/a/2"]
        );
        assert!(p1.more);
        let p2 = s.list("/a/", Some("/a/2"), 2).await?;
        assert_eq!(p2.items.len(), 1);
        assert!(!p2.more);
        assert_eq!(s.list("/", None, 0).await?.items.len(), 4);
        Ok(())
    }

    #[tokio::test]
    async fn recovers_after_reopen_and_compaction() -> Result<()> {
        let dir = tmp()?;
        let mut cfg = EmbeddedConfig::new(dir.path());
        cfg.compact_log_bytes = 2_000;
        {
            let s = EmbeddedStore::open(cfg.clone())?;
            for i in 0..200 {
                s.write(put(&format!("/k/{i:03}"), &"x".repeat(50))).await?;
            }
            for i in 0..100 {
                s.write(Write::Delete {
                    key: format!("/k/{i:03}"),
                    expected: None,
                })
                .await?;
            }
        }
        let log_len = std::fs::metadata(dir.path().join(LOG))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(log_len < 4_000, "log was not compacted: {log_len} bytes");
        let s = EmbeddedStore::open(cfg)?;
        assert_eq!(s.revision().await?, 300);
        let all = s.list("/k/", None, 0).await?;
        assert_eq!(all.items.len(), 100);
        assert_eq!(all.items[0].key, "/k/100");
        // History did not survive: a watch from the past is compacted, from now is fine.
        assert!(matches!(
            s.watch("/k/", 10).await,
            Err(StoreError::Compacted { .. })
        ));
        assert!(s.watch("/k/", 300).await.is_ok());
        Ok(())
    }

    #[tokio::test]
    async fn torn_log_tail_is_dropped() -> Result<()> {
        let dir = tmp()?;
        {
            let s = open_default(dir.path())?;
            s.write(put("/a", "1")).await?;
            s.write(put("/b", "2")).await?;
        }
        let log = dir.path().join(LOG);
        let mut data = std::fs::read(&log).map_err(|e| StoreError::Io {
            path: "log".into(),
            source: e,
        })?;
        data.extend_from_slice(&[40, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&log, &data).map_err(|e| StoreError::Io {
            path: "log".into(),
            source: e,
        })?;
        let s = open_default(dir.path())?;
        assert_eq!(s.revision().await?, 2);
        s.write(put("/c", "3")).await?;
        drop(s);
        let s = open_default(dir.path())?;
        assert_eq!(s.list("/", None, 0).await?.items.len(), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_damaged_record_before_acknowledged_ones_stops_the_store_and_keeps_the_file() -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp()?;
        {
            let s = open_default(dir.path())?;
            for (k, v) in [("/a", "1"), ("/b", "2"), ("/c", "3")] {
                s.write(put(k, v)).await?;
            }
        }
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).ok();
        assert_eq!(mode(dir.path()), Some(0o700));
        assert_eq!(mode(&dir.path().join(LOG)), Some(0o600));
        let log = dir.path().join(LOG);
        let io = |e| StoreError::Io {
            path: "log".into(),
            source: e,
        };
        let mut data = std::fs::read(&log).map_err(io)?;
        let first_len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        // Flip a byte inside the second record's payload.
        data[8 + first_len + 8 + 3] ^= 0xff;
        std::fs::write(&log, &data).map_err(io)?;
        let err = open_default(dir.path()).expect_err("mid-log damage");
        let text = err.to_string();
        assert!(
            matches!(err, StoreError::Corrupt { .. }) && text.contains("valid records follow"),
            "{text}"
        );
        assert_eq!(
            std::fs::read(&log).map_err(io)?,
            data,
            "the file is kept as it was"
        );
        Ok(())
    }

    #[tokio::test]
    async fn values_over_the_etcd_limit_are_refused_before_they_are_written() -> Result<()> {
        let dir = tmp()?;
        let s = open_default(dir.path())?;
        let big = "x".repeat(super::super::MAX_VALUE + 1);
        let err = s.write(put("/big", &big)).await.expect_err("too large");
        assert_eq!(err.to_string(), "etcdserver: request is too large");
        assert_eq!(s.revision().await?, 0);
        let fits = "x".repeat(super::super::MAX_VALUE);
        s.write(put("/fits", &fits)).await?;
        drop(s);
        let s = open_default(dir.path())?;
        assert_eq!(
            s.get("/fits").await?.map(|kv| kv.value.len()),
            Some(super::super::MAX_VALUE)
        );
        Ok(())
    }

    #[tokio::test]
    async fn watch_replays_history_then_follows() -> Result<()> {
        let dir = tmp()?;
        let s = open_default(dir.path())?;
        s.write(put("/pods/a", "1")).await?;
        s.write(put("/svc/x", "1")).await?;
        s.write(put("/pods/b", "1")).await?;
        let mut w = s.watch("/pods/", 1).await?;
        let e = w.next().await?;
        assert_eq!((e.kv.key.as_str(), e.kv.mod_revision), ("/pods/b", 3));
        s.write(Write::Delete {
            key: "/pods/a".into(),
            expected: None,
        })
        .await?;
        let e = w.next().await?;
        assert_eq!(
            (e.kind, e.kv.key.as_str(), e.kv.mod_revision),
            (EventKind::Delete, "/pods/a", 4)
        );
        Ok(())
    }

    fn keys(p: &ListPage) -> Vec<(&str, &[u8])> {
        p.items
            .iter()
            .map(|kv| (kv.key.as_str(), &kv.value[..]))
            .collect()
    }

    #[tokio::test]
    async fn list_at_reads_the_past_through_history() -> Result<()> {
        let dir = tmp()?;
        let s = open_default(dir.path())?;
        for k in ["/a/1", "/a/2", "/a/4", "/b/1"] {
            s.write(put(k, "old")).await?;
        }
        let then = s.revision().await?;
        // After `then`: an update, a delete, a creation in the middle and at the end, and a key
        // deleted and created again.
        s.write(Write::Update {
            key: "/a/1".into(),
            value: bytes::Bytes::from_static(b"new"),
            expected: None,
        })
        .await?;
        s.write(Write::Delete {
            key: "/a/2".into(),
            expected: None,
        })
        .await?;
        s.write(put("/a/3", "new")).await?;
        s.write(put("/a/5", "new")).await?;
        s.write(Write::Delete {
            key: "/a/4".into(),
            expected: None,
        })
        .await?;
        s.write(put("/a/4", "again")).await?;
        let past = s.list_at("/a/", None, 0, then).await?;
        assert_eq!(past.revision, then);
        assert_eq!(
            keys(&past),
            [("/a/1", &b"old"[..]), ("/a/2", b"old"), ("/a/4", b"old")]
        );
        assert!(past.items.iter().all(|kv| kv.mod_revision <= then));
        // Pages at the same revision, as a paged read of many requests sees them.
        let p1 = s.list_at("/a/", None, 2, then).await?;
        assert!(p1.more);
        let p2 = s.list_at("/a/", Some("/a/2"), 2, then).await?;
        assert_eq!(keys(&p2), [("/a/4", &b"old"[..])]);
        assert!(!p2.more);
        // At the current revision it is a plain list.
        let now = s.revision().await?;
        assert_eq!(
            s.list_at("/a/", None, 0, now).await?,
            s.list("/a/", None, 0).await?
        );
        assert!(matches!(
            s.list_at("/a/", None, 0, now + 1).await,
            Err(StoreError::FutureRevision { .. })
        ));
        Ok(())
    }

    #[tokio::test]
    async fn a_held_revision_keeps_its_history_within_bounds() -> Result<()> {
        let dir = tmp()?;
        let mut cfg = EmbeddedConfig::new(dir.path());
        (cfg.history_events, cfg.held_history_events) = (4, 12);
        let s = EmbeddedStore::open(cfg)?;
        for i in 0..3 {
            s.write(put(&format!("/k/{i}"), "v0")).await?;
        }
        let held = s.revision().await?;
        let hold = s.hold_revision(held).await?;
        let update = |i: usize, v: &str| Write::Update {
            key: format!("/k/{i}"),
            value: bytes::Bytes::copy_from_slice(v.as_bytes()),
            expected: None,
        };
        for round in 1..=3 {
            for i in 0..3 {
                s.write(update(i, &format!("v{round}"))).await?;
            }
        }
        // Nine changes since the hold: past the usual 4, within the held 12.
        let past = s.list_at("/k/", None, 0, held).await?;
        assert!(past.items.iter().all(|kv| kv.value == b"v0"[..]), "{past:?}");
        drop(hold);
        assert!(matches!(
            s.hold_revision(held + 100).await,
            Err(StoreError::FutureRevision { .. })
        ));
        s.write(update(0, "v4")).await?;
        assert!(matches!(
            s.list_at("/k/", None, 0, held).await,
            Err(StoreError::Compacted { .. })
        ));
        assert!(matches!(
            s.hold_revision(held).await,
            Err(StoreError::Compacted { .. })
        ));
        // A hold does not keep history beyond the held bounds.
        let held = s.revision().await?;
        let _hold = s.hold_revision(held).await?;
        for round in 5..=9 {
            for i in 0..3 {
                s.write(update(i, &format!("v{round}"))).await?;
            }
        }
        assert!(matches!(
            s.list_at("/k/", None, 0, held).await,
            Err(StoreError::Compacted { .. })
        ));
        Ok(())
    }

    #[tokio::test]
    async fn concurrent_writers_get_distinct_revisions() -> Result<()> {
        let dir = tmp()?;
        let s = Arc::new(open_default(dir.path())?);
        let mut tasks = Vec::new();
        for t in 0..8 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut revs = Vec::new();
                for i in 0..50 {
                    revs.push(s.write(put(&format!("/c/{t}/{i}"), "v")).await?.kv.mod_revision);
                }
                Ok::<_, StoreError>(revs)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.map_err(|_| StoreError::Closed)??);
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 400);
        assert_eq!(s.revision().await?, 400);
        Ok(())
    }

    /// A stored pod (as in `packed`'s tests) named `name`, with `phase`.
    fn pod(name: &str, phase: &str) -> bytes::Bytes {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("packed_test_pod.json")).expect("the test pod is JSON");
        v["metadata"]["name"] = name.into();
        v["status"]["phase"] = phase.into();
        bytes::Bytes::from(serde_json::to_vec(&v).expect("JSON"))
    }

    #[tokio::test]
    async fn packed_values_read_back_as_written_through_every_read() -> Result<()> {
        let dir = tmp()?;
        let mut cfg = EmbeddedConfig::new(dir.path());
        cfg.compact_log_bytes = 20_000;
        // The history keeps the last 5 events: values of older events are packed.
        cfg.history_events = 5;
        let s = EmbeddedStore::open(cfg.clone())?;
        let mut want = BTreeMap::new();
        for i in 0..20 {
            let (key, value) = (format!("/pods/p{i:02}"), pod(&format!("p{i:02}"), "Pending"));
            s.write(Write::Create {
                key: key.clone(),
                value: value.clone(),
            })
            .await?;
            want.insert(key, value);
        }
        for i in 0..10 {
            let (key, value) = (format!("/pods/p{i:02}"), pod(&format!("p{i:02}"), "Running"));
            s.write(Write::Update {
                key: key.clone(),
                value: value.clone(),
                expected: None,
            })
            .await?;
            want.insert(key, value);
        }
        let then = s.revision().await?;
        let at_then = want.clone();
        for i in 17..20 {
            let key = format!("/pods/p{i:02}");
            s.write(Write::Delete {
                key: key.clone(),
                expected: None,
            })
            .await?;
            want.remove(&key);
        }
        // The history holds the last two updates (p08, p09) and the deletes: those two values
        // are kept as written, every other one packed (else this test reads nothing through
        // the packing).
        assert_eq!(raw_once_packed(&s, 2).await, ["/pods/p08", "/pods/p09"]);
        let as_map = |p: ListPage| -> BTreeMap<String, bytes::Bytes> {
            p.items.into_iter().map(|kv| (kv.key, kv.value)).collect()
        };
        assert_eq!(as_map(s.list("/pods/", None, 0).await?), want);
        assert_eq!(as_map(s.list_at("/pods/", None, 0, then).await?), at_then);
        for (key, value) in &want {
            assert_eq!(s.get(key).await?.map(|kv| kv.value).as_ref(), Some(value));
        }
        // An update's event carries the value it replaced, unpacked from the map.
        let ev = s
            .write(Write::Update {
                key: "/pods/p15".into(),
                value: pod("p15", "Succeeded"),
                expected: None,
            })
            .await?;
        assert_eq!(ev.prev.map(|p| p.value), want.get("/pods/p15").cloned());
        want.insert("/pods/p15".into(), pod("p15", "Succeeded"));
        // The snapshot (the log passed 20,000 bytes) and the log hold them as written.
        assert!(dir.path().join(SNAPSHOT).exists());
        drop(s);
        let s = EmbeddedStore::open(cfg)?;
        assert_eq!(as_map(s.list("/pods/", None, 0).await?), want);
        // Nothing is in the history after a restart: every value is packed.
        assert!(raw_once_packed(&s, 0).await.is_empty());
        Ok(())
    }

    /// The keys whose values the map keeps as written, once the writer thread, which packs
    /// after it has answered, has left at most `raw` of them (or 10 s have passed).
    async fn raw_once_packed(s: &EmbeddedStore, raw: usize) -> Vec<String> {
        let raw_keys = || -> Vec<String> {
            let st = s.read();
            st.kvs
                .iter()
                .filter(|(_, l)| l.value.is_raw())
                .map(|(k, _)| k.clone())
                .collect()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while raw_keys().len() > raw && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        raw_keys()
    }
}
