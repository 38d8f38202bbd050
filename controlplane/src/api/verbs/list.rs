//! GET of collections: selectors, `limit`/`continue` pages, tables, and lists at informer scale.
//!
//! Objects are not decoded to be listed: each goes out as its stored JSON with `resourceVersion`
//! spliced in (`stored::write_listed`), and a label or field selector decodes only the fields it
//! reads (`Filter::matches_json`). A list without `limit` that does not fit in one store page
//! streams page by page, every page read at the first one's revision (held meanwhile with
//! `Store::hold_revision`), so the server's memory stays bounded by a page whatever the size of
//! the collection. Tables keep decoding (kubectl asks for them a page at a time). Protobuf lists
//! (`Format::Protobuf`) decode each item to encode it; a streamed one is encoded twice, as its
//! length comes first.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use serde_json::{Value, json};

use super::filter_of;
use crate::api::Api;
use crate::api::object::selector::Filter;
use crate::api::object::stored::{decode, decode_metadata, store_err, write_listed};
use crate::api::object::{b64, unb64};
use crate::api::output::{Body, Format, bytes_response, full, json_response, table};
use crate::api::protobuf::{self, ListEncoder};
use crate::api::registry::Resource;
use crate::api::request::{Query, Target, Want};
use crate::api::status::ApiError;
use crate::storage::{KeyValue, Revision, RevisionHold, Store};

/// Keys read from the store at a time by a list without `limit`.
pub(crate) const PAGE: usize = 500;

/// Chunks of a streamed list waiting for the client (each up to a page).
const STREAM_CHUNKS: usize = 2;

/// The objects of one collection read that match the request's selectors.
#[derive(Debug)]
pub(crate) struct Listed {
    pub items: Vec<KeyValue>,
    pub revision: Revision,
    /// The `continue` token of the next page.
    pub next: Option<String>,
}

/// Where a collection read starts: the collection's key prefix and the key a `continue` token
/// names.
fn range_of(t: &Target, q: &Query) -> Result<(String, Option<String>), ApiError> {
    let prefix = match &t.namespace {
        Some(ns) => t.res.namespace_prefix(ns),
        None => t.res.key_prefix(),
    };
    let start = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(
            unb64(c)
                .filter(|k| k.starts_with(&prefix))
                .ok_or_else(|| ApiError::bad_request("the provided continue parameter is invalid"))?,
        ),
        None => None,
    };
    Ok((prefix, start))
}

/// Keeps the items of `kvs` that `filter` selects.
fn retain_matching(filter: &Filter, kvs: &mut Vec<KeyValue>) -> Result<(), ApiError> {
    if filter.is_empty() {
        return Ok(());
    }
    let mut err = None;
    kvs.retain(|kv| match filter.matches_json(&kv.value) {
        Ok(m) => m,
        Err(e) => {
            err.get_or_insert_with(|| ApiError::internal(format!("stored object {}: {e}", kv.key)));
            false
        }
    });
    err.map_or(Ok(()), Err)
}

/// `{"apiVersion":...,"items":[` — a list's fields come in serde_json's (sorted) map order, so
/// the output is what encoding the list as a `Value` gives.
fn list_head(res: &Resource) -> Vec<u8> {
    let mut out = b"{\"apiVersion\":".to_vec();
    json_string(&mut out, &res.api_version());
    out.extend_from_slice(b",\"items\":[");
    out
}

/// `],"kind":"<Kind>List","metadata":{...}}`.
fn list_tail(res: &Resource, revision: Revision, next: Option<&str>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"],\"kind\":");
    json_string(out, &format!("{}List", res.kind));
    out.extend_from_slice(b",\"metadata\":{");
    if let Some(c) = next {
        out.extend_from_slice(b"\"continue\":");
        json_string(out, c);
        out.push(b',');
    }
    out.extend_from_slice(b"\"resourceVersion\":");
    json_string(out, &revision.to_string());
    out.extend_from_slice(b"}}");
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Appends `items` to a list body, each after a comma unless it is the list's first.
fn write_items(items: &[KeyValue], first: &mut bool, out: &mut Vec<u8>) -> Result<(), ApiError> {
    for kv in items {
        if !std::mem::take(first) {
            out.push(b',');
        }
        write_listed(kv, out)?;
    }
    Ok(())
}

fn json_body_response(body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

impl Api {
    /// GET of a collection: a List (streamed when it is large) or a Table, in `format`.
    pub(crate) async fn list(
        &self,
        t: &Target,
        q: &Query,
        want: Want,
        format: Format,
    ) -> Result<Response<Body>, ApiError> {
        let filter = filter_of(t.res, q)?;
        let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
        if want == Want::Table {
            let listed = self.list_matching(t, q, &filter, limit).await?;
            let objects = listed.items.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
            let table = table::table(
                t.res,
                &objects,
                &listed.revision.to_string(),
                listed.next.as_deref(),
                q.get("includeObject") == Some("Object"),
            );
            return Ok(json_response(200, &table));
        }
        if want == Want::Metadata {
            let listed = self.list_matching(t, q, &filter, limit).await?;
            let items = listed
                .items
                .iter()
                .map(decode_metadata)
                .collect::<Result<Vec<_>, _>>()?;
            let mut meta = json!({"resourceVersion": listed.revision.to_string()});
            if let Some(next) = &listed.next {
                meta["continue"] = json!(next);
            }
            let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": meta, "items": items});
            return Ok(json_response(200, &list));
        }
        let proto = match format {
            Format::Protobuf => ListEncoder::new(&t.res.api_version(), t.res.kind),
            Format::Json => None,
        };
        if limit > 0 {
            let listed = self.list_matching(t, q, &filter, limit).await?;
            return whole_list(t.res, &listed, proto.as_ref());
        }
        let (prefix, start) = range_of(t, q)?;
        let mut snapshot = self.read_snapshot(prefix, start, filter).await?;
        let first = snapshot.first.take().unwrap_or_default();
        let Some(rest) = snapshot.rest.take() else {
            let listed = Listed {
                items: first,
                revision: snapshot.revision,
                next: None,
            };
            return whole_list(t.res, &listed, proto.as_ref());
        };
        // The rest streams, every page read at the first one's revision.
        let hold = snapshot.hold.take();
        if let Some(encoder) = proto {
            match ProtobufStream::prepare(encoder, &first, rest.clone()).await? {
                Some(stream) => return Ok(stream.start(t.res, hold)),
                None => tracing::debug!(resource = %t.res.qualified(), "no protobuf form: listing JSON"),
            }
        }
        let (tx, body) = transport::body::channel(STREAM_CHUNKS);
        let res = t.res;
        tokio::spawn(async move {
            let _hold = hold;
            if let Err(e) = send_json_list(res, first, rest, &tx).await {
                // The status line is gone: the client sees a body cut short, which does not
                // parse, and lists again.
                tracing::warn!(resource = %res.qualified(), error = %e, "list stream cut short");
            }
        });
        Ok(streamed(body, "application/json"))
    }

    /// Starts reading the objects under `prefix` after `start` that `filter` selects, a page at
    /// a time at one revision: the first page at the current revision, the others at the first
    /// one's, held while they are read.
    pub(crate) async fn read_snapshot(
        &self,
        prefix: String,
        start: Option<String>,
        filter: Filter,
    ) -> Result<Snapshot, ApiError> {
        let mut first = self
            .store
            .list(&prefix, start.as_deref(), PAGE)
            .await
            .map_err(store_err)?;
        let after = first.items.last().map(|kv| kv.key.clone());
        retain_matching(&filter, &mut first.items)?;
        let (rest, hold) = if first.more {
            let hold = self
                .store
                .hold_revision(first.revision)
                .await
                .map_err(store_err)?;
            let rest = Pages {
                store: self.store.clone(),
                prefix,
                filter,
                revision: first.revision,
                after,
                done: false,
            };
            (Some(rest), Some(hold))
        } else {
            (None, None)
        };
        Ok(Snapshot {
            revision: first.revision,
            first: Some(first.items),
            rest,
            hold,
        })
    }

    /// The objects of a collection read that `filter` selects, with `limit` (0: all) and
    /// `continue` as the request gives them. The store is read `limit` keys at a time until
    /// `limit` objects matched or the collection ended.
    pub(crate) async fn list_matching(
        &self,
        t: &Target,
        q: &Query,
        filter: &Filter,
        limit: usize,
    ) -> Result<Listed, ApiError> {
        let (prefix, mut start) = range_of(t, q)?;
        let mut items = Vec::new();
        loop {
            let mut page = self
                .store
                .list(&prefix, start.as_deref(), limit)
                .await
                .map_err(store_err)?;
            let last_key = page.items.last().map(|kv| kv.key.clone());
            retain_matching(filter, &mut page.items)?;
            items.append(&mut page.items);
            if !page.more {
                return Ok(Listed {
                    items,
                    revision: page.revision,
                    next: None,
                });
            }
            if limit > 0 && items.len() >= limit {
                return Ok(Listed {
                    items,
                    revision: page.revision,
                    next: last_key.map(|k| b64(&k)),
                });
            }
            start = last_key;
        }
    }

    /// The objects of a collection read, decoded, as a List (what deletecollection answers).
    pub(crate) async fn list_objects(&self, t: &Target, q: &Query) -> Result<Value, ApiError> {
        let filter = filter_of(t.res, q)?;
        let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
        let listed = self.list_matching(t, q, &filter, limit).await?;
        let items = listed.items.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let mut meta = serde_json::json!({ "resourceVersion": listed.revision.to_string() });
        if let Some(c) = &listed.next {
            meta["continue"] = serde_json::json!(c);
        }
        Ok(serde_json::json!({
            "kind": format!("{}List", t.res.kind), "apiVersion": t.res.api_version(),
            "metadata": meta, "items": items,
        }))
    }
}

/// A collection read a page at a time at one revision ([`Api::read_snapshot`]).
pub(crate) struct Snapshot {
    pub(crate) revision: Revision,
    first: Option<Vec<KeyValue>>,
    rest: Option<Pages>,
    hold: Option<RevisionHold>,
}

impl Snapshot {
    /// The matching objects of the next page (None after the last); the revision is released
    /// with the snapshot.
    pub(crate) async fn next_page(&mut self) -> Result<Option<Vec<KeyValue>>, ApiError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        match &mut self.rest {
            Some(rest) => rest.next().await,
            None => Ok(None),
        }
    }
}

/// The pages of a collection after `after`, all read at `revision`, filtered.
#[derive(Clone)]
struct Pages {
    store: Arc<dyn Store>,
    prefix: String,
    filter: Filter,
    revision: Revision,
    after: Option<String>,
    done: bool,
}

impl Pages {
    /// The next page's matching objects (None after the last page).
    async fn next(&mut self) -> Result<Option<Vec<KeyValue>>, ApiError> {
        if self.done {
            return Ok(None);
        }
        let mut page = self
            .store
            .list_at(&self.prefix, self.after.as_deref(), PAGE, self.revision)
            .await
            .map_err(store_err)?;
        self.after = page.items.last().map(|kv| kv.key.clone());
        self.done = !page.more;
        retain_matching(&self.filter, &mut page.items)?;
        Ok(Some(page.items))
    }
}

/// A whole (not streamed) list answer: protobuf with `proto` if every item has a protobuf form,
/// else JSON.
fn whole_list(
    res: &Resource,
    listed: &Listed,
    proto: Option<&ListEncoder>,
) -> Result<Response<Body>, ApiError> {
    if let Some(encoder) = proto {
        match encode_items(encoder, &listed.items)? {
            Ok(items) => {
                let size = items.iter().map(|i| ListEncoder::item_size(i.len())).sum();
                let mut out = encoder.head(&listed.revision.to_string(), listed.next.as_deref(), size);
                for item in &items {
                    ListEncoder::write_item(item, &mut out);
                }
                ListEncoder::tail(&mut out);
                return Ok(bytes_response(200, out, protobuf::MEDIA_TYPE));
            }
            Err(e) => {
                tracing::debug!(resource = %res.qualified(), error = %e, "no protobuf form: listing JSON")
            }
        }
    }
    let mut out = list_head(res);
    write_items(&listed.items, &mut true, &mut out)?;
    list_tail(res, listed.revision, listed.next.as_deref(), &mut out);
    Ok(json_body_response(out))
}

/// The protobuf messages of stored objects (the inner error: one has no protobuf form).
fn encode_items(
    encoder: &ListEncoder,
    items: &[KeyValue],
) -> Result<Result<Vec<Vec<u8>>, protobuf::EncodeError>, ApiError> {
    let mut out = Vec::with_capacity(items.len());
    for kv in items {
        match encoder.item_stored(&kv.value, &kv.mod_revision.to_string()) {
            Ok(m) => out.push(m),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(out))
}

fn streamed(body: Body, ct: &'static str) -> Response<Body> {
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

/// Streams a JSON list: the first page's `items`, then the `rest`, each page a chunk.
async fn send_json_list(
    res: &Resource,
    items: Vec<KeyValue>,
    mut rest: Pages,
    tx: &tokio::sync::mpsc::Sender<Bytes>,
) -> Result<(), ApiError> {
    let mut out = list_head(res);
    let mut first_item = true;
    write_items(&items, &mut first_item, &mut out)?;
    while let Some(page) = rest.next().await? {
        if tx.send(Bytes::from(std::mem::take(&mut out))).await.is_err() {
            return Ok(()); // the client left
        }
        write_items(&page, &mut first_item, &mut out)?;
    }
    list_tail(res, rest.revision, None, &mut out);
    let _ = tx.send(Bytes::from(out)).await;
    Ok(())
}

/// A protobuf list too large for one page. Its length comes first, so every item is encoded
/// twice: once to add up the sizes (before the answer starts, so that an item without a
/// protobuf form can still turn the answer into JSON), once to send it.
struct ProtobufStream {
    encoder: ListEncoder,
    first: Vec<Vec<u8>>,
    rest: Pages,
    size: usize,
}

impl ProtobufStream {
    /// Sizes the list (None: an item has no protobuf form).
    async fn prepare(
        encoder: ListEncoder,
        first: &[KeyValue],
        rest: Pages,
    ) -> Result<Option<Self>, ApiError> {
        let Ok(first) = encode_items(&encoder, first)? else {
            return Ok(None);
        };
        let mut size: usize = first.iter().map(|i| ListEncoder::item_size(i.len())).sum();
        let mut sizing = rest.clone();
        while let Some(page) = sizing.next().await? {
            let Ok(items) = encode_items(&encoder, &page)? else {
                return Ok(None);
            };
            size += items
                .iter()
                .map(|i| ListEncoder::item_size(i.len()))
                .sum::<usize>();
        }
        Ok(Some(Self {
            encoder,
            first,
            rest,
            size,
        }))
    }

    /// Starts sending; the answer's body streams from a task that holds `hold`.
    fn start(self, res: &'static Resource, hold: Option<RevisionHold>) -> Response<Body> {
        let (tx, body) = transport::body::channel(STREAM_CHUNKS);
        tokio::spawn(async move {
            let _hold = hold;
            if let Err(e) = self.send(&tx).await {
                tracing::warn!(resource = %res.qualified(), error = %e, "list stream cut short");
            }
        });
        streamed(body, protobuf::MEDIA_TYPE)
    }

    async fn send(mut self, tx: &tokio::sync::mpsc::Sender<Bytes>) -> Result<(), ApiError> {
        let mut out = self
            .encoder
            .head(&self.rest.revision.to_string(), None, self.size);
        let mut written = 0;
        for item in &self.first {
            written += ListEncoder::item_size(item.len());
            ListEncoder::write_item(item, &mut out);
        }
        while let Some(page) = self.rest.next().await? {
            if tx.send(Bytes::from(std::mem::take(&mut out))).await.is_err() {
                return Ok(());
            }
            let items = encode_items(&self.encoder, &page)?
                .map_err(|e| ApiError::internal(format!("an item lost its protobuf form: {e}")))?;
            for item in &items {
                written += ListEncoder::item_size(item.len());
                ListEncoder::write_item(item, &mut out);
            }
        }
        if written != self.size {
            // The same revision read twice gave other bytes: never send a corrupt length.
            return Err(ApiError::internal(format!(
                "list size changed between passes ({} then {written} bytes)",
                self.size
            )));
        }
        ListEncoder::tail(&mut out);
        let _ = tx.send(Bytes::from(out)).await;
        Ok(())
    }
}
