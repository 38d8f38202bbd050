//! Watch: a chunked stream of newline-delimited `{"type","object"}` events from a store watch
//! (or, for protobuf clients, length-prefixed `WatchEvent` frames), with label/field selectors
//! (objects moving out of the selection arrive as DELETED), bookmarks, `timeoutSeconds`, and 410
//! Expired as an ERROR event when the start revision is compacted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use serde_json::{Value, json};

use super::filter_of;
use crate::api::Api;
use crate::api::object::stored::{decode, decode_metadata, partial_metadata, write_listed};
use crate::api::output::{Body, Format, table};
use crate::api::protobuf::{self, watch_frame_of};
use crate::api::request::{Query, Target, Want};
use crate::api::schema::kind_message;
use crate::api::status::ApiError;
use crate::storage::{EventKind, KeyValue, StoreError};

/// How often a watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(30);
/// The most a watch holds for a client that does not read (events are shared between watchers,
/// so this overcounts what it costs); beyond it the watch waits for the client...
const WATCH_BUFFER_BYTES: usize = 16 << 20;
/// ...this long, and is then dropped (upstream's "Forcing watcher close due to
/// unresponsiveness"): the client's informer lists and watches again.
const SLOW_WATCHER_PATIENCE: Duration = Duration::from_secs(10);
/// The most all watches of the server hold together for clients that have not read it; over it,
/// every watch with unread bytes waits as if its own buffer were full (see
/// `transport::body::budget_channel`).
pub(crate) const ALL_WATCHES_BUFFER_BYTES: usize = 128 << 20;

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// `{"type":KIND,"object":<already serialized object>}` plus a newline.
fn line_raw(kind: &str, object_json: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(object_json.len() + 32);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(kind.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    v.extend_from_slice(object_json);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

/// How a watch stream frames its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// One JSON `{"type","object"}` per line.
    Json,
    /// Length-prefixed protobuf `WatchEvent`s.
    Protobuf,
}

impl Framing {
    /// The event `kind` with `object`, framed.
    fn event(self, kind: &str, object: &Value) -> Bytes {
        match self {
            Framing::Json => line(kind, object),
            Framing::Protobuf => match watch_frame_of(kind, object) {
                Ok(frame) => Bytes::from(frame),
                Err(e) => {
                    // Only objects of kinds without a message get here (the stream checks its
                    // kind first); an empty event keeps the stream going.
                    tracing::warn!(error = %e, "watch event without a protobuf form");
                    Bytes::from(protobuf::watch_frame(kind, &[]))
                }
            },
        }
    }
}

/// One store event made ready once for every watcher that receives it (a thousand watchers of
/// one resource would otherwise each parse and re-serialize the same object). The JSON object
/// is the stored bytes with the resourceVersion spliced in; the object is decoded only when a
/// watcher needs it as a value (tables, protobuf frames).
#[derive(Debug)]
pub(crate) struct Decoded {
    kv: KeyValue,
    obj_json: Bytes,
    obj: std::sync::OnceLock<Option<Value>>,
    /// The event lines of the object's `PartialObjectMetadata` (metadata clients).
    metadata_lines: [std::sync::OnceLock<Option<Bytes>>; 3],
    /// The framed event lines (ADDED, MODIFIED, DELETED), built once for all watchers.
    lines: [std::sync::OnceLock<Bytes>; 3],
    /// The same as protobuf frames.
    frames: [std::sync::OnceLock<Bytes>; 3],
}

impl Decoded {
    fn new(kv: KeyValue) -> Option<Self> {
        let mut obj_json = Vec::new();
        write_listed(&kv, &mut obj_json).ok()?;
        Some(Self {
            kv,
            obj_json: Bytes::from(obj_json),
            obj: std::sync::OnceLock::new(),
            metadata_lines: Default::default(),
            lines: Default::default(),
            frames: Default::default(),
        })
    }

    /// The object as a value (decoded on first use).
    fn obj(&self) -> Option<&Value> {
        self.obj.get_or_init(|| decode(&self.kv).ok()).as_ref()
    }

    /// The JSON event line of the object's `PartialObjectMetadata` (only the metadata decoded).
    fn metadata_line(&self, kind: &'static str) -> Option<Bytes> {
        self.metadata_lines[kind_index(kind)]
            .get_or_init(|| decode_metadata(&self.kv).ok().map(|m| line(kind, &m)))
            .clone()
    }

    fn line(&self, kind: &'static str, framing: Framing) -> Option<Bytes> {
        let i = kind_index(kind);
        Some(
            match framing {
                Framing::Json => self.lines[i].get_or_init(|| line_raw(kind, &self.obj_json)),
                Framing::Protobuf => {
                    let obj = self.obj()?;
                    self.frames[i].get_or_init(|| framing.event(kind, obj))
                }
            }
            .clone(),
        )
    }
}

fn kind_index(kind: &str) -> usize {
    match kind {
        "ADDED" => 0,
        "MODIFIED" => 1,
        _ => 2,
    }
}

/// The most recent events made ready, shared by all watches, by (revision, key).
#[derive(Debug, Default)]
pub(crate) struct WatchCache {
    entries: Mutex<CacheEntries>,
}

#[derive(Debug, Default)]
struct CacheEntries {
    by_event: HashMap<(i64, String), Arc<Decoded>>,
    order: VecDeque<(i64, String)>,
}

const WATCH_CACHE_ENTRIES: usize = 1024;

impl WatchCache {
    fn get(&self, kv: &KeyValue) -> Option<Arc<Decoded>> {
        let id = (kv.mod_revision, kv.key.clone());
        if let Some(d) = self
            .entries
            .lock()
            .ok()
            .and_then(|q| q.by_event.get(&id).cloned())
        {
            return Some(d);
        }
        let d = Arc::new(Decoded::new(kv.clone())?);
        if let Ok(mut q) = self.entries.lock() {
            if let Some(existing) = q.by_event.get(&id) {
                return Some(existing.clone());
            }
            q.by_event.insert(id.clone(), d.clone());
            q.order.push_back(id);
            while q.order.len() > WATCH_CACHE_ENTRIES {
                if let Some(old) = q.order.pop_front() {
                    q.by_event.remove(&old);
                }
            }
        }
        Some(d)
    }
}

/// The ADDED events of a page of stored objects, in one chunk. JSON objects go out as stored,
/// their resourceVersion spliced in, in the field order encoding the event as a `Value` gives.
fn added_events(
    page: &[KeyValue],
    want: Want,
    framing: Framing,
    render: &impl Fn(&Value, &str) -> Value,
) -> Result<Bytes, ApiError> {
    let mut out = Vec::new();
    for kv in page {
        if (want, framing) == (Want::Object, Framing::Json) {
            out.extend_from_slice(b"{\"object\":");
            write_listed(kv, &mut out)?;
            out.extend_from_slice(b",\"type\":\"ADDED\"}\n");
        } else {
            let obj = decode(kv)?;
            let rev = kv.mod_revision.to_string();
            out.extend_from_slice(&framing.event("ADDED", &render(&obj, &rev)));
        }
    }
    Ok(Bytes::from(out))
}

impl Api {
    pub(crate) async fn watch(
        &self,
        t: &Target,
        q: &Query,
        want: Want,
        format: Format,
    ) -> Result<Response<Body>, ApiError> {
        let filter = filter_of(t.res, q)?;
        let framing = if format == Format::Protobuf
            && want == Want::Object
            && kind_message(&t.res.api_version(), t.res.kind).is_some()
        {
            Framing::Protobuf
        } else {
            Framing::Json
        };
        let prefix = match &t.namespace {
            Some(ns) => t.res.namespace_prefix(ns),
            None => t.res.key_prefix(),
        };
        let rv = q.get("resourceVersion").unwrap_or_default();
        let timeout = watch_timeout(q.get("timeoutSeconds"));
        let bookmarks = q.flag("allowWatchBookmarks");
        let (tx, body) = transport::body::budget_channel(
            WATCH_BUFFER_BYTES,
            SLOW_WATCHER_PATIENCE,
            self.watch_budget.clone(),
        );
        let res = t.res;
        let render = move |obj: &Value, rev: &str| -> Value {
            match want {
                Want::Table => table::table(res, std::slice::from_ref(obj), rev, None, false),
                Want::Metadata => partial_metadata(obj["metadata"].clone()),
                Want::Object => obj.clone(),
            }
        };
        // Starting point: unset or "0" means "now", preceded by ADDED for every existing object
        // (read as a list is: a page at a time at one revision, stored bytes spliced).
        let (start, initial) = if rv.is_empty() || rv == "0" {
            let snapshot = self.read_snapshot(prefix.clone(), None, filter.clone()).await?;
            (snapshot.revision, Some(snapshot))
        } else {
            let r = rv
                .parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
            (r, None)
        };
        let watch = self.store.watch(&prefix, start).await;
        let store = self.store.clone();
        let cache = self.watch_cache.clone();
        tokio::spawn(async move {
            let mut w = match watch {
                Ok(w) => w,
                Err(StoreError::Compacted { requested, compacted }) => {
                    let e = ApiError::gone(format!("too old resource version: {requested} ({compacted})"));
                    let _ = tx.send(framing.event("ERROR", &e.to_status())).await;
                    return;
                }
                Err(e) => {
                    let status = ApiError::internal(e.to_string()).to_status();
                    let _ = tx.send(framing.event("ERROR", &status)).await;
                    return;
                }
            };
            if let Some(mut snapshot) = initial {
                loop {
                    let page = match snapshot.next_page().await {
                        Ok(Some(page)) => page,
                        Ok(None) => break,
                        Err(e) => {
                            let _ = tx.send(framing.event("ERROR", &e.to_status())).await;
                            return;
                        }
                    };
                    let chunk = match added_events(&page, want, framing, &render) {
                        Ok(chunk) => chunk,
                        Err(e) => {
                            let _ = tx.send(framing.event("ERROR", &e.to_status())).await;
                            return;
                        }
                    };
                    if !chunk.is_empty() && !sent(&tx, chunk, res.plural).await {
                        return;
                    }
                }
            }
            let deadline = tokio::time::Instant::now() + timeout;
            let mut last_rev = start;
            loop {
                let next = tokio::select! {
                    e = w.next() => Some(e),
                    _ = tokio::time::sleep(BOOKMARK_EVERY), if bookmarks => None,
                    _ = tokio::time::sleep_until(deadline) => return,
                    _ = tx.closed() => return,
                };
                let msg = match next {
                    None => {
                        let rev = store.revision().await.unwrap_or(last_rev).max(last_rev);
                        let obj = json!({ "kind": res.kind, "apiVersion": res.api_version(),
                            "metadata": { "resourceVersion": rev.to_string() } });
                        Some(framing.event("BOOKMARK", &obj))
                    }
                    Some(Err(StoreError::Compacted { requested, compacted })) => {
                        let e =
                            ApiError::gone(format!("too old resource version: {requested} ({compacted})"));
                        let _ = tx.send(framing.event("ERROR", &e.to_status())).await;
                        return;
                    }
                    Some(Err(_)) => return,
                    Some(Ok(ev)) => {
                        last_rev = ev.kv.mod_revision;
                        let rev = ev.kv.mod_revision.to_string();
                        // Stored objects without resourceVersion: selectors never read it.
                        let selected = |kv: &KeyValue| filter.matches_json(&kv.value).unwrap_or(false);
                        let was = ev.prev.as_ref().is_some_and(selected);
                        let is = selected(&ev.kv);
                        let kind = match (ev.kind, was, is) {
                            (EventKind::Delete, true, _) => Some("DELETED"),
                            (EventKind::Delete, false, _) => None,
                            (EventKind::Put, _, true) if ev.prev.is_none() || !was => Some("ADDED"),
                            (EventKind::Put, _, true) => Some("MODIFIED"),
                            (EventKind::Put, true, false) => Some("DELETED"),
                            (EventKind::Put, false, false) => None,
                        };
                        // The event is made ready (or found ready) only when it goes out.
                        let Some(kind) = kind else { continue };
                        let Some(d) = cache.get(&ev.kv) else { continue };
                        match want {
                            Want::Object => d.line(kind, framing),
                            Want::Table => d.obj().map(|o| line(kind, &render(o, &rev))),
                            Want::Metadata => d.metadata_line(kind),
                        }
                    }
                };
                if let Some(m) = msg
                    && !sent(&tx, m, res.plural).await
                {
                    return;
                }
            }
        });
        let mut resp = Response::new(body);
        let ct = match framing {
            Framing::Json => "application/json",
            Framing::Protobuf => protobuf::WATCH_MEDIA_TYPE,
        };
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        resp.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache, private"),
        );
        Ok(resp)
    }
}

/// Sends one chunk of a watch; false when the watch is over (the client left, or did not read
/// and was dropped).
async fn sent(tx: &transport::body::BudgetSender, chunk: Bytes, resource: &str) -> bool {
    match tx.send(chunk).await {
        Ok(()) => true,
        Err(transport::body::SendError::Closed) => false,
        Err(e @ transport::body::SendError::Slow { .. }) => {
            tracing::warn!(resource, error = %e, "forcing watcher close due to unresponsiveness");
            false
        }
    }
}

/// The default watch timeout (kube-apiserver's `--min-request-timeout`).
const WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// The longest watch a client may ask for: twice the default, as upstream's randomized
/// timeouts reach (a larger `timeoutSeconds` would hold a watcher for ever and overflow the
/// deadline arithmetic).
const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long a watch runs: `timeoutSeconds` clamped to [`MAX_WATCH_TIMEOUT`]; without it (or
/// 0, as upstream) the default.
fn watch_timeout(asked: Option<&str>) -> Duration {
    asked
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(WATCH_TIMEOUT, |s| Duration::from_secs(s).min(MAX_WATCH_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_timeouts_are_clamped() {
        let cases = [
            (None, 1800),
            (Some("5"), 5),
            (Some("0"), 1800),
            (Some("3600"), 3600),
            (Some("18446744073709551615"), 3600),
            (Some("-1"), 1800),
            (Some("soon"), 1800),
        ];
        for (asked, want) in cases {
            assert_eq!(watch_timeout(asked), Duration::from_secs(want), "{asked:?}");
        }
    }
}
