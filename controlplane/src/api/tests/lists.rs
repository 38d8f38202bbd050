//! Lists at informer scale: the spliced output is what the decoding path gave, byte for byte;
//! large lists stream at one revision while writers go on.

use std::collections::BTreeMap;

use futures::future::join_all;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::*;
use crate::api::object::selector::Filter;
use crate::api::object::stored::{decode, encode};
use crate::api::object::{b64, unb64};
use crate::api::verbs::list::PAGE;
use crate::storage::Write;

/// Writes `objects` straight into the store, concurrently (one group commit for many).
async fn store_all(f: &Fixture, res: &registry::Resource, objects: Vec<Value>) {
    let writes = objects.into_iter().map(|o| {
        let key = res.key(o["metadata"]["namespace"].as_str(), object::name_of(&o));
        let store = f.api.store.clone();
        async move {
            store
                .write(Write::Create {
                    key,
                    value: encode(&o),
                })
                .await
                .expect("write")
        }
    });
    join_all(writes).await;
}

fn config_map(ns: &str, i: usize) -> Value {
    let colour = ["red", "green", "blue"][i % 3];
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("cm-{i:05}"), "namespace": ns, "uid": format!("uid-{i}"),
            "labels": {"colour": colour, "i": i.to_string()},
            "annotations": {"note": "quotes \" and \\ and ünïcödé"},
            "creationTimestamp": "2025-01-01T00:00:00Z"},
        "data": {"k": "v".repeat(i % 7)}})
}

/// The list the server answered before lists were spliced: every object decoded, filtered and
/// encoded again in a `Value`, the store read `limit` keys at a time.
async fn decoding_list(
    f: &Fixture,
    res: &'static registry::Resource,
    ns: Option<&str>,
    q: &Query,
) -> Vec<u8> {
    let filter = Filter::new(
        res,
        q.get("labelSelector").unwrap_or_default(),
        q.get("fieldSelector").unwrap_or_default(),
    )
    .expect("filter");
    let prefix = ns.map_or_else(|| res.key_prefix(), |ns| res.namespace_prefix(ns));
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let mut start = q.get("continue").and_then(unb64);
    let (mut items, mut next) = (Vec::new(), None);
    let revision = loop {
        let page = f
            .api
            .store
            .list(&prefix, start.as_deref(), limit)
            .await
            .expect("list");
        let last = page.items.last().map(|kv| kv.key.clone());
        for kv in &page.items {
            let o = decode(kv).expect("decode");
            if filter.matches(&o) {
                items.push(o);
            }
        }
        if !page.more {
            break page.revision;
        }
        if limit > 0 && items.len() >= limit {
            next = last.map(|k| b64(&k));
            break page.revision;
        }
        start = last;
    };
    let mut meta = json!({ "resourceVersion": revision.to_string() });
    if let Some(c) = &next {
        meta["continue"] = json!(c);
    }
    serde_json::to_vec(
        &json!({ "kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
        "metadata": meta, "items": items }),
    )
    .expect("encode")
}

/// Percent-encodes a query value.
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn raw_get(f: &Fixture, uri: &str) -> (u16, Vec<u8>) {
    let req = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header("accept", "application/json")
        .body(Bytes::new())
        .expect("request");
    let resp = f.api.handle(Some(&admin()), req).await;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, body.to_vec())
}

#[tokio::test]
async fn lists_are_byte_for_byte_what_decoding_gave() {
    let f = fixture().await;
    let cms = registry::find("", "v1", "configmaps").expect("served");
    // More than a store page in one namespace (so the no-limit list streams), a few elsewhere.
    let mut objects: Vec<Value> = (0..PAGE + 37).map(|i| config_map("default", i)).collect();
    objects.extend((0..5).map(|i| config_map("kube-public", i)));
    store_all(&f, cms, objects).await;
    for (ns, query) in [
        (Some("default"), ""),
        (None, ""),
        (Some("default"), "labelSelector=colour%3Dred"),
        (None, "labelSelector=colour%20in%20(red%2Cblue),i!%3D4"),
        (Some("default"), "fieldSelector=metadata.name%3Dcm-00042"),
        (Some("default"), "fieldSelector=metadata.name%3Dnone"),
        (None, "fieldSelector=metadata.namespace!%3Ddefault"),
        (Some("default"), "limit=100"),
        (Some("default"), "limit=7&labelSelector=colour%3Dgreen"),
        (None, "limit=1000&fieldSelector=metadata.namespace%3Dkube-public"),
    ] {
        let base = match ns {
            Some(ns) => format!("/api/v1/namespaces/{ns}/configmaps"),
            None => "/api/v1/configmaps".to_string(),
        };
        // Every page of the list, following its continue tokens.
        let asked = query;
        let mut query = query.to_string();
        let mut pages = 0;
        loop {
            let uri = format!("{base}?{query}");
            let (code, got) = raw_get(&f, &uri).await;
            assert_eq!(code, 200, "{uri}: {}", String::from_utf8_lossy(&got));
            let want = decoding_list(&f, cms, ns, &Query::parse(Some(&query))).await;
            assert!(
                got == want,
                "{uri}: the spliced list differs from the decoded one"
            );
            pages += 1;
            let v: Value = serde_json::from_slice(&got).expect("JSON");
            let Some(c) = v["metadata"]["continue"].as_str() else {
                break;
            };
            let q = Query::parse(Some(&query));
            let mut params: BTreeMap<String, String> = BTreeMap::new();
            for k in ["limit", "labelSelector", "fieldSelector"] {
                if let Some(v) = q.get(k) {
                    params.insert(k.into(), pct(v));
                }
            }
            params.insert("continue".into(), pct(c));
            query = params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&");
        }
        if asked == "limit=100" {
            assert_eq!(pages, (PAGE + 37).div_ceil(100), "{base}?{asked}");
        }
    }
}

#[tokio::test]
async fn a_streamed_list_is_one_revision_while_writes_go_on() {
    let f = fixture().await;
    let cms = registry::find("", "v1", "configmaps").expect("served");
    let n = 3 * PAGE + 11;
    store_all(&f, cms, (0..n).map(|i| config_map("default", i)).collect()).await;
    let before = decoding_list(&f, cms, Some("default"), &Query::default()).await;
    let before: Value = serde_json::from_slice(&before).expect("JSON");
    let req = Request::builder()
        .uri("/api/v1/namespaces/default/configmaps")
        .header("accept", "application/json")
        .body(Bytes::new())
        .expect("request");
    let resp = f.api.handle(Some(&admin()), req).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers().get(http::header::CONTENT_LENGTH).is_none(),
        "streamed"
    );
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let first = body.frame().await.expect("a chunk").expect("data");
    got.extend_from_slice(first.data_ref().expect("data"));
    // While the rest is unread: change objects of later pages, delete some, add some.
    for i in (PAGE..n).step_by(5) {
        let mut cm = config_map("default", i);
        cm["data"]["k"] = json!("changed");
        f.api
            .store
            .write(Write::Update {
                key: cms.key(Some("default"), &format!("cm-{i:05}")),
                value: encode(&cm),
                expected: None,
            })
            .await
            .expect("update");
    }
    for i in (PAGE + 1..n).step_by(7) {
        let key = cms.key(Some("default"), &format!("cm-{i:05}"));
        // Some were updated above; deleting those too is fine.
        f.api
            .store
            .write(Write::Delete { key, expected: None })
            .await
            .expect("delete");
    }
    store_all(&f, cms, (n..n + 50).map(|i| config_map("default", i)).collect()).await;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            got.extend_from_slice(&data);
        }
    }
    let got: Value = serde_json::from_slice(&got).expect("the streamed list parses");
    assert_eq!(
        got, before,
        "the list is the collection as it was at its revision"
    );
    let rev: i64 = got["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("revision");
    assert!(got["items"].as_array().expect("items").iter().all(|o| {
        o["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            <= Some(rev)
    }));
    // Afterwards the list shows the writes.
    let (_, after) = f.get("/api/v1/namespaces/default/configmaps").await;
    assert_ne!(after["items"], got["items"]);
    assert!(after["metadata"]["resourceVersion"].as_str() > Some(""));
}

#[tokio::test]
async fn a_watch_from_now_starts_with_every_object_read_a_page_at_a_time() {
    let f = fixture().await;
    let cms = registry::find("", "v1", "configmaps").expect("served");
    let n = 2 * PAGE + 5;
    store_all(&f, cms, (0..n).map(|i| config_map("default", i)).collect()).await;
    let expected = decoding_list(
        &f,
        cms,
        Some("default"),
        &Query::parse(Some("labelSelector=colour%3Dred")),
    )
    .await;
    let expected: Value = serde_json::from_slice(&expected).expect("JSON");
    let expected = expected["items"].as_array().expect("items").clone();
    let req = Request::builder()
        .uri("/api/v1/namespaces/default/configmaps?watch=true&labelSelector=colour%3Dred&timeoutSeconds=5")
        .header("accept", "application/json")
        .body(Bytes::new())
        .expect("request");
    let resp = f.api.handle(Some(&admin()), req).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut buf = Vec::new();
    while lines.len() < expected.len() {
        let Some(Ok(frame)) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            lines.push(buf.drain(..=pos).collect());
        }
    }
    assert_eq!(lines.len(), expected.len());
    for (line, want) in lines.iter().zip(&expected) {
        // Byte for byte what encoding the event as a Value gives.
        let event = json!({"type": "ADDED", "object": want});
        let mut encoded = serde_json::to_vec(&event).expect("encode");
        encoded.push(b'\n');
        assert!(line == &encoded, "{}", String::from_utf8_lossy(line));
    }
}
