//! GET of one object and of collections (selectors, `limit`/`continue` pages, tables).

use serde_json::{Value, json};

use super::filter_of;
use crate::api::Api;
use crate::api::object::stored::{decode, store_err};
use crate::api::object::{b64, unb64};
use crate::api::output::table;
use crate::api::request::{Query, Target, Want};
use crate::api::status::ApiError;

impl Api {
    /// GET of one object (or its server-side table row).
    pub(crate) async fn get(&self, t: &Target, want: Want) -> Result<Value, ApiError> {
        let name = t.name.as_deref().unwrap_or_default();
        let (obj, rev) = self.read_object(t.res, t.namespace.as_deref(), name).await?;
        Ok(match want {
            Want::Table => table::table(t.res, &[obj], &rev.to_string(), None, false),
            Want::Object => obj,
        })
    }

    /// GET of a collection: selectors, `limit`/`continue` pages, a List or a Table.
    pub(crate) async fn list(&self, t: &Target, q: &Query, want: Want) -> Result<Value, ApiError> {
        let filter = filter_of(t.res, q)?;
        let prefix = match &t.namespace {
            Some(ns) => t.res.namespace_prefix(ns),
            None => t.res.key_prefix(),
        };
        let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut start = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => Some(
                unb64(c)
                    .filter(|k| k.starts_with(&prefix))
                    .ok_or_else(|| ApiError::bad_request("the provided continue parameter is invalid"))?,
            ),
            None => None,
        };
        let mut items = Vec::new();
        let mut revision;
        let mut next = None;
        // Filters apply after the read: keep reading pages until `limit` matches or the end.
        loop {
            let page = self
                .store
                .list(&prefix, start.as_deref(), if limit > 0 { limit } else { 0 })
                .await
                .map_err(store_err)?;
            revision = page.revision;
            let last_key = page.items.last().map(|kv| kv.key.clone());
            for kv in &page.items {
                let obj = decode(kv)?;
                if filter.matches(&obj) {
                    items.push(obj);
                }
            }
            if !page.more {
                break;
            }
            if limit > 0 && items.len() >= limit {
                next = last_key.map(|k| b64(&k));
                break;
            }
            start = last_key;
        }
        let rv = revision.to_string();
        Ok(match want {
            Want::Table => table::table(
                t.res,
                &items,
                &rv,
                next.as_deref(),
                q.get("includeObject") == Some("Object"),
            ),
            Want::Object => {
                let mut meta = json!({ "resourceVersion": rv });
                if let Some(c) = &next {
                    meta["continue"] = json!(c);
                }
                json!({ "kind": format!("{}List", t.res.kind), "apiVersion": t.res.api_version(), "metadata": meta, "items": items })
            }
        })
    }
}
