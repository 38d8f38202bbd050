//! Each API request runs in one `request` span naming its verb, resource, namespace, name, user,
//! status code and latency; what happens inside carries them (`RUST_LOG=controlplane=debug`).
//!
//! A test binary of its own: tracing caches per call site whether anyone listens, and with a
//! single (scoped) subscriber it asks the dispatcher of whichever thread reaches a call site
//! first, so tests running in parallel threads of the same process could cache "never" for the
//! call sites this test checks.

use std::sync::Arc;

use bytes::Bytes;
use controlplane::api::{Api, Caller};
use controlplane::storage::embedded::open_default;
use http::{Method, Request};
use serde_json::json;

/// Collects what a `fmt` subscriber writes.
#[derive(Clone, Default)]
struct LogSink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut out) = self.0.lock() {
            out.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn call(api: &Api, who: Option<&Caller>, method: Method, uri: &str, body: &str) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Bytes::from(body.to_string()))
        .expect("request");
    api.handle(who, req).await.status().as_u16()
}

#[test]
fn requests_run_in_one_span_each() {
    let sink = LogSink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = Caller {
        user: "admin".into(),
        groups: vec!["system:masters".into()],
    };
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let api = Api::new(
                Arc::new(open_default(dir.path()).expect("store")),
                "CA-PEM".into(),
            );
            api.bootstrap().await.expect("bootstrap");
            let scale = "/apis/apps/v1/namespaces/default/deployments/web/scale";
            assert_eq!(call(&api, Some(&admin), Method::GET, scale, "").await, 404);
            // An unknown field dropped with a warning: the event carries the request's span.
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "bogus": 1});
            let cms = "/api/v1/namespaces/default/configmaps";
            assert_eq!(
                call(&api, Some(&admin), Method::POST, cms, &cm.to_string()).await,
                201
            );
            assert_eq!(call(&api, None, Method::GET, "/api/v1/pods", "").await, 401);
            assert_eq!(call(&api, Some(&admin), Method::GET, "/version", "").await, 200);
        });
    });
    let out = sink
        .0
        .lock()
        .map(|o| String::from_utf8_lossy(&o).into_owned())
        .unwrap_or_default();
    let done: Vec<&str> = out.lines().filter(|l| l.ends_with("request done")).collect();
    assert_eq!(done.len(), 4, "{out}");
    assert!(
        done[0].contains(
            "request{verb=get resource=deployments.apps/scale namespace=default name=web user=admin code=404 latency="
        ),
        "{out}"
    );
    assert!(
        done[1].contains("request{verb=create resource=configmaps namespace=default user=admin code=201"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("request{verb=create resource=configmaps")
                && l.contains("unknown fields dropped")),
        "{out}"
    );
    assert!(
        done[2].contains("request{verb=list resource=pods code=401"),
        "{out}"
    );
    assert!(
        done[3].contains("request{verb=get path=/version user=admin code=200"),
        "{out}"
    );
}
