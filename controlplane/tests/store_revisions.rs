//! Reads at a past revision (`Store::list_at`, `Store::hold_revision`) behave the same on both
//! backends: the embedded store and a real etcd.

use controlplane::process::EtcdProcess;
use controlplane::storage::embedded::open_default;
use controlplane::storage::etcd::EtcdStore;
use controlplane::storage::{KeyValue, Store, StoreError, Write};

fn put(key: &str, v: &str) -> Write {
    Write::Create {
        key: key.into(),
        value: v.as_bytes().to_vec().into(),
    }
}

fn update(key: &str, v: &str) -> Write {
    Write::Update {
        key: key.into(),
        value: v.as_bytes().to_vec().into(),
        expected: None,
    }
}

fn pairs(items: &[KeyValue]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|kv| (kv.key.clone(), String::from_utf8_lossy(&kv.value).into_owned()))
        .collect()
}

/// Pages through `prefix` at `rev`, `page` keys at a time.
async fn read_all_at(s: &dyn Store, prefix: &str, page: usize, rev: i64) -> Vec<KeyValue> {
    let mut out: Vec<KeyValue> = Vec::new();
    loop {
        let after = out.last().map(|kv| kv.key.clone());
        let p = s
            .list_at(prefix, after.as_deref(), page, rev)
            .await
            .expect("list_at");
        assert_eq!(p.revision, rev);
        out.extend(p.items);
        if !p.more {
            return out;
        }
    }
}

async fn past_reads(s: &dyn Store) {
    for i in 0..20 {
        s.write(put(&format!("/r/pods/{i:02}"), "v0")).await.expect("put");
    }
    let rev = s.revision().await.expect("revision");
    let _hold = s.hold_revision(rev).await.expect("hold");
    let before = s.list("/r/pods/", None, 0).await.expect("list");
    assert_eq!(before.items.len(), 20);
    // Writers change every kind of thing while a paged read at `rev` runs.
    for i in (0..20).step_by(3) {
        s.write(update(&format!("/r/pods/{i:02}"), "v1"))
            .await
            .expect("update");
    }
    for i in (1..20).step_by(4) {
        s.write(Write::Delete {
            key: format!("/r/pods/{i:02}"),
            expected: None,
        })
        .await
        .expect("delete");
    }
    s.write(put("/r/pods/05a", "new")).await.expect("put");
    s.write(put("/r/pods/99", "new")).await.expect("put");
    let at = read_all_at(s, "/r/pods/", 3, rev).await;
    assert_eq!(pairs(&at), pairs(&before.items));
    assert_eq!(at, before.items, "revisions too");
    let now = s.revision().await.expect("revision");
    let current = s.list("/r/pods/", None, 0).await.expect("list");
    assert_eq!(read_all_at(s, "/r/pods/", 7, now).await, current.items);
    assert!(matches!(
        s.list_at("/r/pods/", None, 0, now + 100).await,
        Err(StoreError::FutureRevision { .. })
    ));
}

#[tokio::test]
async fn embedded_store_reads_at_a_past_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open_default(dir.path()).expect("store");
    past_reads(&s).await;
}

#[tokio::test]
async fn etcd_reads_at_a_past_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd =
        EtcdProcess::spawn(&dir.path().join("etcd")).expect("start etcd (apt-get install etcd-server)");
    let s = EtcdStore::new(&etcd.endpoint, None).expect("etcd store");
    past_reads(&s).await;
    // Once etcd compacts past a revision, reads at it fail as compacted.
    let old = s.revision().await.expect("revision");
    s.write(put("/r/later", "v")).await.expect("put");
    let client = transport::client::http_client::<http_body_util::Full<bytes::Bytes>>(None).expect("client");
    let body = format!(r#"{{"revision":"{}","physical":true}}"#, old + 1);
    let req = hyper::Request::post(format!(
        "{}/v3/kv/compaction",
        etcd.endpoint.trim_end_matches('/')
    ))
    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
    .expect("request");
    let resp = transport::client::send(&client, req, std::time::Duration::from_secs(10))
        .await
        .expect("compaction");
    assert_eq!(resp.status(), 200);
    assert!(matches!(
        s.list_at("/r/", None, 0, old).await,
        Err(StoreError::Compacted { requested, .. }) if requested == old
    ));
}
