//! GET of collections: selectors, `limit`/`continue` pages, tables, and lists at informer scale.
//!
//! Objects are not decoded to be listed: each goes out as its stored JSON with `resourceVersion`
//! spliced in (`stored::write_listed`), and a label or field selector decodes only the fields it
//! reads (`Filter::matches_json`). A list without `limit` that does not fit in one store page
//! streams page by page, every page read at the first one's revision (held meanwhile with
//! `Store::hold_revision`), so the server's memory stays bounded by a page whatever the size of
//! the collection. Tables keep decoding (kubectl asks for them a page at a time).

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use serde_json::Value;

use super::filter_of;
use crate::api::Api;
use crate::api::object::selector::Filter;
use crate::api::object::stored::{decode, store_err, write_listed};
use crate::api::object::{b64, unb64};
use crate::api::output::{Body, full, json_response, table};
use crate::api::registry::Resource;
use crate::api::request::{Query, Target, Want};
use crate::api::status::ApiError;
use crate::storage::{KeyValue, Revision, Store};

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
    /// GET of a collection: a List (streamed when it is large) or a Table.
    pub(crate) async fn list(&self, t: &Target, q: &Query, want: Want) -> Result<Response<Body>, ApiError> {
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
        if limit > 0 {
            let listed = self.list_matching(t, q, &filter, limit).await?;
            let mut out = list_head(t.res);
            write_items(&listed.items, &mut true, &mut out)?;
            list_tail(t.res, listed.revision, listed.next.as_deref(), &mut out);
            return Ok(json_body_response(out));
        }
        let (prefix, start) = range_of(t, q)?;
        let mut first = self
            .store
            .list(&prefix, start.as_deref(), PAGE)
            .await
            .map_err(store_err)?;
        let last_key = first.items.last().map(|kv| kv.key.clone());
        retain_matching(&filter, &mut first.items)?;
        let mut out = list_head(t.res);
        let mut first_item = true;
        write_items(&first.items, &mut first_item, &mut out)?;
        if !first.more {
            list_tail(t.res, first.revision, None, &mut out);
            return Ok(json_body_response(out));
        }
        let hold = self
            .store
            .hold_revision(first.revision)
            .await
            .map_err(store_err)?;
        let (tx, body) = transport::body::channel(STREAM_CHUNKS);
        let stream = ListStream {
            store: self.store.clone(),
            res: t.res,
            prefix,
            filter,
            revision: first.revision,
        };
        tokio::spawn(async move {
            let _hold = hold;
            if let Err(e) = stream.send_rest(tx, out, first_item, last_key).await {
                // The status line is gone: the client sees a body cut short, which does not
                // parse, and lists again.
                tracing::warn!(resource = %stream.res.qualified(), error = %e, "list stream cut short");
            }
        });
        let mut resp = Response::new(body);
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(resp)
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

/// The pages after the first of a streamed list, all read at the first page's revision.
struct ListStream {
    store: std::sync::Arc<dyn Store>,
    res: &'static Resource,
    prefix: String,
    filter: Filter,
    revision: Revision,
}

impl ListStream {
    /// Sends `out` (the list so far), then every further page, then the list's end.
    async fn send_rest(
        &self,
        tx: tokio::sync::mpsc::Sender<Bytes>,
        mut out: Vec<u8>,
        mut first_item: bool,
        mut last_key: Option<String>,
    ) -> Result<(), ApiError> {
        loop {
            if tx.send(Bytes::from(std::mem::take(&mut out))).await.is_err() {
                return Ok(()); // the client left
            }
            let mut page = self
                .store
                .list_at(&self.prefix, last_key.as_deref(), PAGE, self.revision)
                .await
                .map_err(store_err)?;
            last_key = page.items.last().map(|kv| kv.key.clone());
            retain_matching(&self.filter, &mut page.items)?;
            write_items(&page.items, &mut first_item, &mut out)?;
            if !page.more {
                list_tail(self.res, self.revision, None, &mut out);
                let _ = tx.send(Bytes::from(out)).await;
                return Ok(());
            }
        }
    }
}
