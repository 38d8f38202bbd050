//! The etcd backend (for HA: several API servers on one etcd cluster), over etcd's v3 JSON
//! gateway (`/v3/kv/range`, `/v3/kv/txn`, `/v3/watch`) through the workspace's pooled HTTP
//! client (`transport::client`): plain HTTP, or HTTPS verified against a given CA with an
//! optional client certificate (kube-apiserver's `--etcd-cafile/--etcd-certfile/--etcd-keyfile`).
//! Compare-and-swap maps to a transaction comparing `mod_revision` (or `create_revision = 0` for
//! creates); the etcd revision is the resourceVersion, as in Kubernetes.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use transport::client::HttpClient;

use super::{
    BoxFuture, Event, EventKind, KeyValue, ListPage, Result, Revision, RevisionHold, Store, StoreError,
    WatchStream, Write,
};

/// An etcd v3 endpoint such as `http://127.0.0.1:2379`.
#[derive(Debug)]
pub struct EtcdStore {
    /// `http` or `https`.
    scheme: &'static str,
    addr: String,
    client: HttpClient<Full<Bytes>>,
}

/// TLS to etcd: the CA its serving certificate must chain to, and the client certificate and
/// key (PEM) to present.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: String,
    pub client: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

/// Longest wait for etcd's answer to one request (watches excepted: their answer streams).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read (a range of a whole resource included).
const MAX_ANSWER: usize = 1 << 30;

fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// The gateway writes int64 as strings.
fn int(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn kv_of(v: &Value) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(&unb64(&v["key"])).into_owned(),
        value: unb64(&v["value"]).into(),
        create_revision: int(&v["create_revision"]),
        mod_revision: int(&v["mod_revision"]),
    }
}

fn io_err(addr: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        path: format!("etcd {addr}"),
        source: std::io::Error::other(e.to_string()),
    }
}

impl EtcdStore {
    /// A store on `endpoint` (`http://HOST:PORT`, or `https://HOST:PORT` with `tls`); nothing
    /// is contacted until the first request.
    pub fn new(endpoint: &str, tls: Option<&EtcdTls>) -> Result<Self> {
        let (scheme, rest) = match (endpoint.split_once("://"), tls) {
            (Some(("http", rest)), None) => ("http", rest),
            (Some(("https", rest)), Some(_)) => ("https", rest),
            (Some(("http", _)), Some(_)) => {
                return Err(io_err(
                    endpoint,
                    "TLS files are given but the etcd endpoint is http://",
                ));
            }
            (Some(("https", _)), None) => {
                return Err(io_err(endpoint, "an https:// etcd endpoint needs --etcd-cafile"));
            }
            _ => {
                return Err(io_err(
                    endpoint,
                    "the etcd endpoint must be http://HOST:PORT or https://HOST:PORT",
                ));
            }
        };
        let addr = rest.trim_end_matches('/').to_string();
        let config = match tls {
            Some(t) => Some(std::sync::Arc::new(
                transport::tls::client_config(
                    transport::tls::ServerAuth::Ca(&t.ca_pem),
                    t.client.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
                )
                .map_err(|e| io_err(&addr, e))?,
            )),
            None => None,
        };
        let client = transport::client::http_client(config).map_err(|e| io_err(&addr, e))?;
        Ok(Self { scheme, addr, client })
    }

    fn request(&self, path: &str, body: &Value) -> Result<hyper::Request<Full<Bytes>>> {
        hyper::Request::post(format!("{}://{}{path}", self.scheme, self.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| io_err(&self.addr, e))
    }

    /// POSTs `body` to `path` and returns the JSON answer (pooled keep-alive connections).
    async fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let (code, v) = self.call_status(path, body).await?;
        if code >= 300 {
            return Err(self.answer_err(path, code, &v));
        }
        Ok(v)
    }

    /// Like [`Self::call`], but an error answer is returned with its HTTP status.
    async fn call_status(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        let req = self.request(path, body)?;
        let resp = transport::client::send(&self.client, req, REQUEST_TIMEOUT)
            .await
            .map_err(|e| io_err(&self.addr, e.with_causes()))?;
        let code = resp.status().as_u16();
        let bytes = transport::client::read_body(resp.into_body(), MAX_ANSWER)
            .await
            .map_err(|e| io_err(&self.addr, e))?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| io_err(&self.addr, e))?;
        Ok((code, v))
    }

    fn answer_err(&self, path: &str, code: u16, v: &Value) -> StoreError {
        io_err(
            &self.addr,
            format!(
                "{path}: HTTP {code}: {}",
                v["message"].as_str().unwrap_or_default()
            ),
        )
    }

    /// A range read of `limit` keys (0 = all) under `prefix` after `start_after`, at `revision`
    /// (None: the current one).
    async fn range(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<Revision>,
    ) -> Result<ListPage> {
        let start = match start_after {
            Some(k) => {
                let mut s = k.as_bytes().to_vec();
                s.push(0);
                s
            }
            None => prefix.as_bytes().to_vec(),
        };
        let mut body = json!({ "key": b64(&start), "range_end": b64(&prefix_end(prefix.as_bytes())) });
        if limit > 0 {
            body["limit"] = json!(limit.to_string());
        }
        if let Some(rev) = revision {
            body["revision"] = json!(rev.to_string());
        }
        let (code, r) = self.call_status("/v3/kv/range", &body).await?;
        if code >= 300 {
            // etcd's texts for a range at a revision it no longer has, or does not have yet.
            let message = r["message"].as_str().unwrap_or_default();
            return Err(match revision {
                Some(requested) if message.contains("required revision has been compacted") => {
                    StoreError::Compacted {
                        requested,
                        compacted: 0,
                    }
                }
                Some(requested) if message.contains("required revision is a future revision") => {
                    StoreError::FutureRevision {
                        requested,
                        current: self.revision().await.unwrap_or(0),
                    }
                }
                _ => self.answer_err("/v3/kv/range", code, &r),
            });
        }
        Ok(ListPage {
            items: r["kvs"].as_array().into_iter().flatten().map(kv_of).collect(),
            revision: revision.unwrap_or_else(|| int(&r["header"]["revision"])),
            more: r["more"].as_bool().unwrap_or(false),
        })
    }

    /// Runs a one-key transaction: `compare` on success puts/deletes, on failure reads the key.
    async fn txn(&self, key: &str, compare: Value, op: Value) -> Result<(bool, Value)> {
        let body = json!({
            "compare": [compare],
            "success": [op],
            "failure": [{ "request_range": { "key": b64(key.as_bytes()) } }],
        });
        let r = self.call("/v3/kv/txn", &body).await?;
        Ok((r["succeeded"].as_bool().unwrap_or(false), r))
    }

    fn exists_or(&self, key: &str, expected: Option<Revision>) -> Value {
        match expected {
            Some(rev) => {
                json!({ "key": b64(key.as_bytes()), "target": "MOD", "result": "EQUAL", "mod_revision": rev.to_string() })
            }
            None => {
                json!({ "key": b64(key.as_bytes()), "target": "CREATE", "result": "GREATER", "create_revision": "0" })
            }
        }
    }

    fn failure(key: &str, r: &Value, expected: Option<Revision>) -> StoreError {
        let current = r["responses"][0]["response_range"]["kvs"]
            .as_array()
            .and_then(|k| k.first())
            .map(kv_of);
        match (current, expected) {
            (None, _) => StoreError::NotFound { key: key.into() },
            (Some(kv), Some(e)) => StoreError::Conflict {
                key: key.into(),
                expected: e,
                actual: kv.mod_revision,
            },
            (Some(_), None) => StoreError::AlreadyExists { key: key.into() },
        }
    }
}

struct EtcdWatch {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
    pending: std::collections::VecDeque<Event>,
    last: Revision,
}

impl WatchStream for EtcdWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Event>> {
        Box::pin(async move {
            loop {
                if let Some(e) = self.pending.pop_front() {
                    return Ok(e);
                }
                // One JSON message per line; read frames until a whole line is there.
                while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = self.buf.drain(..=pos).collect();
                    let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    let r = &msg["result"];
                    if r["canceled"].as_bool() == Some(true) || int(&r["compact_revision"]) > 0 {
                        return Err(StoreError::Compacted {
                            requested: self.last,
                            compacted: int(&r["compact_revision"]),
                        });
                    }
                    for ev in r["events"].as_array().into_iter().flatten() {
                        let kind = if ev["type"].as_str() == Some("DELETE") {
                            EventKind::Delete
                        } else {
                            EventKind::Put
                        };
                        let prev = ev.get("prev_kv").filter(|p| p.is_object()).map(kv_of);
                        let mut kv = kv_of(&ev["kv"]);
                        if kind == EventKind::Delete {
                            // etcd's delete event carries only the key and the revision.
                            let rev = kv.mod_revision;
                            kv = prev
                                .clone()
                                .map(|p| KeyValue {
                                    mod_revision: rev,
                                    ..p
                                })
                                .unwrap_or(kv);
                        }
                        self.last = kv.mod_revision;
                        self.pending.push_back(Event { kind, kv, prev });
                    }
                }
                if !self.pending.is_empty() {
                    continue;
                }
                match self.body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.buf.extend_from_slice(&data);
                        }
                    }
                    _ => return Err(StoreError::Closed),
                }
            }
        })
    }
}

impl Store for EtcdStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>>> {
        Box::pin(async move {
            let r = self
                .call("/v3/kv/range", &json!({ "key": b64(key.as_bytes()) }))
                .await?;
            Ok(r["kvs"].as_array().and_then(|k| k.first()).map(kv_of))
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage>> {
        Box::pin(self.range(prefix, start_after, limit, None))
    }

    fn list_at<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
        revision: Revision,
    ) -> BoxFuture<'a, Result<ListPage>> {
        Box::pin(self.range(prefix, start_after, limit, Some(revision)))
    }

    fn hold_revision(&self, _revision: Revision) -> BoxFuture<'_, Result<RevisionHold>> {
        // etcd keeps every revision until the cluster is compacted (which the operator or
        // etcd's auto-compaction decides, as for kube-apiserver); reads then fail as compacted.
        Box::pin(async move { Ok(RevisionHold::none()) })
    }

    fn write(&self, w: Write) -> BoxFuture<'_, Result<Event>> {
        Box::pin(async move {
            super::check_size(&w)?;
            match w {
                Write::Create { key, value } => {
                    let compare = json!({ "key": b64(key.as_bytes()), "target": "CREATE", "result": "EQUAL", "create_revision": "0" });
                    let put = json!({ "request_put": { "key": b64(key.as_bytes()), "value": b64(&value) } });
                    let (ok, r) = self.txn(&key, compare, put).await?;
                    if !ok {
                        return Err(StoreError::AlreadyExists { key });
                    }
                    let rev = int(&r["header"]["revision"]);
                    Ok(Event {
                        kind: EventKind::Put,
                        kv: KeyValue {
                            key,
                            value,
                            create_revision: rev,
                            mod_revision: rev,
                        },
                        prev: None,
                    })
                }
                Write::Update { key, value, expected } => {
                    let put = json!({ "request_put": { "key": b64(key.as_bytes()), "value": b64(&value), "prev_kv": true } });
                    let (ok, r) = self.txn(&key, self.exists_or(&key, expected), put).await?;
                    if !ok {
                        return Err(Self::failure(&key, &r, expected));
                    }
                    let rev = int(&r["header"]["revision"]);
                    let prev = r["responses"][0]["response_put"].get("prev_kv").map(kv_of);
                    let create_revision = prev.as_ref().map_or(rev, |p| p.create_revision);
                    Ok(Event {
                        kind: EventKind::Put,
                        kv: KeyValue {
                            key,
                            value,
                            create_revision,
                            mod_revision: rev,
                        },
                        prev,
                    })
                }
                Write::Delete { key, expected } => {
                    let del =
                        json!({ "request_delete_range": { "key": b64(key.as_bytes()), "prev_kv": true } });
                    let (ok, r) = self.txn(&key, self.exists_or(&key, expected), del).await?;
                    if !ok {
                        return Err(Self::failure(&key, &r, expected));
                    }
                    let rev = int(&r["header"]["revision"]);
                    let prev = r["responses"][0]["response_delete_range"]["prev_kvs"]
                        .as_array()
                        .and_then(|p| p.first())
                        .map(kv_of)
                        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
                    Ok(Event {
                        kind: EventKind::Delete,
                        kv: KeyValue {
                            mod_revision: rev,
                            ..prev.clone()
                        },
                        prev: Some(prev),
                    })
                }
            }
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, after: Revision) -> BoxFuture<'a, Result<Box<dyn WatchStream>>> {
        Box::pin(async move {
            // The response streams for the watch's lifetime (the pool opens another connection
            // for other requests meanwhile).
            let body = json!({ "create_request": {
                "key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix.as_bytes())),
                "start_revision": (after + 1).to_string(), "prev_kv": true } });
            let req = self.request("/v3/watch", &body)?;
            let resp = transport::client::send(&self.client, req, REQUEST_TIMEOUT)
                .await
                .map_err(|e| io_err(&self.addr, e.with_causes()))?;
            let mut w = EtcdWatch {
                body: resp.into_body(),
                buf: Vec::new(),
                pending: Default::default(),
                last: after,
            };
            // The first message confirms the watch (or reports the start revision compacted).
            loop {
                if let Some(pos) = w.buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = w.buf[..=pos].to_vec();
                    let msg: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                    let r = &msg["result"];
                    if int(&r["compact_revision"]) > 0 || r["canceled"].as_bool() == Some(true) {
                        return Err(StoreError::Compacted {
                            requested: after,
                            compacted: int(&r["compact_revision"]),
                        });
                    }
                    if r["created"].as_bool() == Some(true)
                        && r["events"].as_array().is_none_or(Vec::is_empty)
                    {
                        w.buf.drain(..=pos);
                    }
                    break;
                }
                match w.body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            w.buf.extend_from_slice(&data);
                        }
                    }
                    _ => return Err(StoreError::Closed),
                }
            }
            Ok(Box::new(w) as Box<dyn WatchStream>)
        })
    }

    fn revision(&self) -> BoxFuture<'_, Result<Revision>> {
        Box::pin(async move {
            let r = self
                .call("/v3/kv/range", &json!({ "key": b64(b"/"), "count_only": true }))
                .await?;
            Ok(int(&r["header"]["revision"]))
        })
    }

    fn compacted(&self) -> BoxFuture<'_, Result<Revision>> {
        // Not exposed by the gateway; watches report compaction themselves.
        Box::pin(async move { Ok(0) })
    }

    /// etcd takes writes or refuses them itself; there is no local state to report.
    fn failure(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(int(&json!("42")), 42);
        assert_eq!(int(&json!(7)), 7);
    }
}
