//! API tests through [`Api::handle`] on a real embedded store (no sockets).

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::*;
use crate::storage::embedded::open_default;

struct Fixture {
    api: Api,
    _etcd: Option<crate::process::EtcdProcess>,
    _dir: tempfile::TempDir,
}

fn admin() -> Caller {
    Caller {
        user: "admin".into(),
        groups: vec!["system:masters".into()],
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    // NODEOS_TEST_STORE=etcd runs this whole suite on a real etcd instead of the embedded store.
    let (store, etcd): (Arc<dyn crate::storage::Store>, _) =
        if std::env::var("NODEOS_TEST_STORE").as_deref() == Ok("etcd") {
            let etcd = crate::process::EtcdProcess::spawn(&dir.path().join("etcd")).expect("start etcd");
            (
                Arc::new(crate::storage::etcd::EtcdStore::new(&etcd.endpoint, None).expect("etcd store")),
                Some(etcd),
            )
        } else {
            (Arc::new(open_default(dir.path()).expect("store")), None)
        };
    let api = Api::new(store, "CA-PEM".into());
    api.bootstrap().await.expect("bootstrap");
    api.start_authorization().await.expect("authorization");
    Fixture {
        api,
        _etcd: etcd,
        _dir: dir,
    }
}

impl Fixture {
    async fn call(&self, method: Method, uri: &str, ct: &str, body: &str) -> (u16, Value) {
        self.call_as(Some(&admin()), method, uri, ct, body, "application/json")
            .await
    }

    async fn call_as(
        &self,
        who: Option<&Caller>,
        method: Method,
        uri: &str,
        ct: &str,
        body: &str,
        accept: &str,
    ) -> (u16, Value) {
        self.call_bytes(who, method, uri, ct, Bytes::from(body.to_string()), accept)
            .await
    }

    async fn call_bytes(
        &self,
        who: Option<&Caller>,
        method: Method,
        uri: &str,
        ct: &str,
        body: Bytes,
        accept: &str,
    ) -> (u16, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", ct)
            .header("accept", accept)
            .body(body)
            .expect("request");
        let resp = self.api.handle(who, req).await;
        let code = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn post(&self, uri: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, uri, "application/json", &body.to_string())
            .await
    }

    async fn get(&self, uri: &str) -> (u16, Value) {
        self.call(Method::GET, uri, "", "").await
    }
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

const PODS: &str = "/api/v1/namespaces/default/pods";

#[tokio::test]
async fn bootstrap_creates_namespaces_with_label_account_and_ca() {
    let f = fixture().await;
    let (code, list) = f.get("/api/v1/namespaces").await;
    assert_eq!(code, 200);
    let names: Vec<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    assert_eq!(
        list["items"][0]["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "default"
    );
    assert_eq!(
        f.get("/api/v1/namespaces/kube-system/serviceaccounts/default")
            .await
            .0,
        200
    );
    let (_, cm) = f
        .get("/api/v1/namespaces/kube-public/configmaps/kube-root-ca.crt")
        .await;
    assert_eq!(cm["data"]["ca.crt"], "CA-PEM");
}

#[tokio::test]
async fn anonymous_gets_401_except_health() {
    let f = fixture().await;
    let (code, st) = f
        .call_as(None, Method::GET, PODS, "", "", "application/json")
        .await;
    assert_eq!(code, 401);
    assert_eq!(st["reason"], "Unauthorized");
    let (code, _) = f.call_as(None, Method::GET, "/readyz", "", "", "*/*").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn create_sets_metadata_and_defaults() {
    let f = fixture().await;
    let (code, p) = f.post(PODS, pod("web")).await;
    assert_eq!(code, 201, "{p}");
    assert_eq!(p["metadata"]["namespace"], "default");
    assert_eq!(p["metadata"]["uid"].as_str().map(str::len), Some(36));
    assert_eq!(p["metadata"]["generation"], 1);
    assert!(
        p["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|r| r.parse::<i64>().is_ok())
    );
    assert_eq!(p["status"]["phase"], "Pending");
    assert_eq!(p["status"]["qosClass"], "BestEffort");
    assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 30);
    assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
    // Defaulting leaves out what the pod does not have, as upstream does (no `null` lists).
    for absent in ["initContainers", "ephemeralContainers"] {
        assert_eq!(p["spec"].get(absent), None, "{p}");
    }
    let (code, st) = f.post(PODS, pod("web")).await;
    assert_eq!((code, st["reason"].as_str()), (409, Some("AlreadyExists")));
    assert_eq!(st["message"], "pods \"web\" already exists");
}

#[tokio::test]
async fn generate_name_and_invalid_names() {
    let f = fixture().await;
    let mut p = pod("");
    p["metadata"] = json!({"generateName": "web-"});
    let (code, created) = f.post(PODS, p).await;
    assert_eq!(code, 201);
    let name = created["metadata"]["name"].as_str().unwrap_or_default();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    let (code, st) = f.post(PODS, pod("Bad_Name")).await;
    assert_eq!(code, 422);
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Pod \"Bad_Name\" is invalid: metadata.name: Invalid value")),
        "{st}"
    );
    let mut nocontainers = pod("x");
    nocontainers["spec"]["containers"] = json!([]);
    let (code, st) = f.post(PODS, nocontainers).await;
    assert_eq!(
        (code, st["message"].as_str()),
        (422, Some("Pod \"x\" is invalid: spec.containers: Required value"))
    );
}

#[tokio::test]
async fn bad_bodies_change_nothing() {
    let f = fixture().await;
    let before = f.get(PODS).await.1["metadata"]["resourceVersion"].clone();
    let (code, st) = f.call(Method::POST, PODS, "application/json", "{not json").await;
    assert_eq!((code, st["reason"].as_str()), (400, Some("BadRequest")));
    let (code, _) = f
        .call(
            Method::POST,
            PODS,
            "application/vnd.kubernetes.protobuf",
            "k8s\0junk",
        )
        .await;
    assert_eq!(code, 400);
    let (code, _) = f.call(Method::POST, PODS, "application/cbor", "{}").await;
    assert_eq!(code, 415);
    let (code, _) = f
        .call(Method::POST, PODS, "application/json", &"x".repeat(MAX_BODY + 1))
        .await;
    assert_eq!(code, 413);
    let (code, _) = f.post("/api/v1/namespaces/nope/pods", pod("a")).await;
    assert_eq!(code, 404);
    let (code, _) = f
        .post(
            PODS,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}),
        )
        .await;
    assert_eq!(code, 400);
    let (code, _) = f.get("/apis/nope.example/v1/things").await;
    assert_eq!(code, 404);
    let after = f.get(PODS).await.1["metadata"]["resourceVersion"].clone();
    assert_eq!(before, after);
}

#[tokio::test]
async fn update_conflicts_on_stale_resource_version_and_bumps_generation() {
    let f = fixture().await;
    let (_, p) = f.post(PODS, pod("web")).await;
    let mut stale = p.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    stale["spec"]["activeDeadlineSeconds"] = json!(5);
    let (code, st) = f
        .call(
            Method::PUT,
            &format!("{PODS}/web"),
            "application/json",
            &stale.to_string(),
        )
        .await;
    assert_eq!(code, 409);
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.contains("the object has been modified"))
    );
    let mut fresh = p.clone();
    fresh["spec"]["activeDeadlineSeconds"] = json!(5);
    let (code, updated) = f
        .call(
            Method::PUT,
            &format!("{PODS}/web"),
            "application/json",
            &fresh.to_string(),
        )
        .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["metadata"]["generation"], 2);
    // A label-only change leaves generation alone.
    let (_, labeled) = f
        .call(
            Method::PATCH,
            &format!("{PODS}/web"),
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"x":"y"}}}"#,
        )
        .await;
    assert_eq!(labeled["metadata"]["generation"], 2);
    assert_eq!(labeled["metadata"]["labels"]["x"], "y");
}

#[tokio::test]
async fn status_subresource_only_changes_status() {
    let f = fixture().await;
    f.post(PODS, pod("web")).await;
    let patch = r#"{"status":{"phase":"Running"},"spec":{"nodeName":"sneaky"}}"#;
    let (code, p) = f
        .call(
            Method::PATCH,
            &format!("{PODS}/web/status"),
            "application/merge-patch+json",
            patch,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(p["status"]["phase"], "Running");
    assert!(p["spec"]["nodeName"].is_null());
    // ... and the main resource ignores status.
    let (_, p) = f
        .call(
            Method::PATCH,
            &format!("{PODS}/web"),
            "application/merge-patch+json",
            r#"{"status":{"phase":"Failed"}}"#,
        )
        .await;
    assert_eq!(p["status"]["phase"], "Running");
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let f = fixture().await;
    for n in ["a", "b", "c", "d"] {
        f.post(PODS, pod(n)).await;
    }
    let (_, l) = f.get(&format!("{PODS}?labelSelector=app%20in%20(a%2Cc)")).await;
    assert_eq!(l["items"].as_array().map(Vec::len), Some(2));
    let (_, l) = f.get(&format!("{PODS}?fieldSelector=metadata.name%3Db")).await;
    assert_eq!(l["items"][0]["metadata"]["name"], "b");
    let (code, st) = f.get(&format!("{PODS}?fieldSelector=foo.bar%3Dbaz")).await;
    assert_eq!(code, 400);
    assert!(st["message"].as_str().is_some_and(|m| m.starts_with("\"foo.bar\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\", \"spec.nodeName\"")), "{st}");
    let (_, p1) = f.get(&format!("{PODS}?limit=3")).await;
    assert_eq!(p1["items"].as_array().map(Vec::len), Some(3));
    let cont = p1["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!cont.is_empty());
    let (_, p2) = f.get(&format!("{PODS}?limit=3&continue={cont}")).await;
    assert_eq!(p2["items"].as_array().map(Vec::len), Some(1));
    assert!(p2["metadata"]["continue"].is_null());
    let (_, all) = f.get("/api/v1/pods").await;
    assert_eq!(all["items"].as_array().map(Vec::len), Some(4));
}

#[tokio::test]
async fn table_output_has_pod_columns() {
    let f = fixture().await;
    f.post(PODS, pod("web")).await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let (code, t) = f.call_as(Some(&admin()), Method::GET, PODS, "", "", accept).await;
    assert_eq!(code, 200);
    assert_eq!(t["kind"], "Table");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(&cols[..5], ["Name", "Ready", "Status", "Restarts", "Age"]);
    assert_eq!(t["rows"][0]["cells"][1], "0/1");
    assert_eq!(t["rows"][0]["cells"][2], "Pending");
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
}

#[tokio::test]
async fn dry_run_persists_nothing() {
    let f = fixture().await;
    let (code, p) = f.post(&format!("{PODS}?dryRun=All"), pod("ghost")).await;
    assert_eq!(code, 201);
    assert_eq!(p["metadata"]["name"], "ghost");
    assert_eq!(f.get(&format!("{PODS}/ghost")).await.0, 404);
}

/// The API's part of cascading deletion (upstream's registry): Background removes the owner at
/// once and leaves its dependents to the garbage collector; Foreground and Orphan keep the owner,
/// terminating, with the `foregroundDeletion` or `orphan` finalizer the collector removes.
#[tokio::test]
async fn cascading_delete_sets_the_policy_finalizers() {
    let f = fixture().await;
    let cm = "/api/v1/namespaces/default/configmaps";
    for (i, (policy, finalizer)) in [
        (r#"{"propagationPolicy":"Background"}"#, None),
        (
            r#"{"propagationPolicy":"Foreground"}"#,
            Some("foregroundDeletion"),
        ),
        (r#"{"propagationPolicy":"Orphan"}"#, Some("orphan")),
        (r#"{"orphanDependents":true}"#, Some("orphan")),
        ("", None),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("owner{i}");
        let (_, owner) = f.post(cm, json!({"metadata": {"name": name}})).await;
        let mut dep = pod(&format!("dep{i}"));
        dep["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": name, "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]);
        assert_eq!(f.post(PODS, dep).await.0, 201);
        let uri = format!("{cm}/{name}");
        let (code, out) = f.call(Method::DELETE, &uri, "application/json", policy).await;
        assert_eq!(code, 200, "{policy}: {out}");
        // The dependent is the garbage collector's business in every mode.
        assert_eq!(f.get(&format!("{PODS}/dep{i}")).await.0, 200, "{policy}");
        let (code, got) = f.get(&uri).await;
        match finalizer {
            None => assert_eq!(code, 404, "{policy}"),
            Some(fin) => {
                assert_eq!(code, 200, "{policy}");
                assert_eq!(got["metadata"]["finalizers"], json!([fin]), "{policy}");
                assert!(got["metadata"]["deletionTimestamp"].is_string(), "{policy}");
                // The collector removes the finalizer when done; then the owner goes.
                let (code, _) = f
                    .call(
                        Method::PATCH,
                        &uri,
                        "application/merge-patch+json",
                        r#"{"metadata":{"finalizers":null}}"#,
                    )
                    .await;
                assert_eq!(code, 200);
                assert_eq!(f.get(&uri).await.0, 404, "{policy}");
            }
        }
    }
    let (code, st) = f
        .call(
            Method::DELETE,
            &format!("{PODS}/dep0"),
            "application/json",
            r#"{"propagationPolicy":"Sideways"}"#,
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        st["message"],
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Sideways\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
    );
}

/// batch/v1 Jobs orphan their pods unless asked otherwise (upstream's default for the kind).
#[tokio::test]
async fn jobs_orphan_by_default() {
    let f = fixture().await;
    let jobs = "/apis/batch/v1/namespaces/default/jobs";
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}});
    assert_eq!(f.post(jobs, job).await.0, 201, "job");
    let (code, _) = f
        .call(Method::DELETE, &format!("{jobs}/j"), "application/json", "")
        .await;
    assert_eq!(code, 200);
    let (code, got) = f.get(&format!("{jobs}/j")).await;
    assert_eq!(code, 200);
    assert_eq!(got["metadata"]["finalizers"], json!(["orphan"]));
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let f = fixture().await;
    let mut p = pod("held");
    p["metadata"]["finalizers"] = json!(["example.com/hold"]);
    f.post(PODS, p).await;
    let (code, d) = f
        .call(Method::DELETE, &format!("{PODS}/held"), "application/json", "")
        .await;
    assert_eq!(code, 200);
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(f.get(&format!("{PODS}/held")).await.0, 200);
    let (code, _) = f
        .call(
            Method::PATCH,
            &format!("{PODS}/held"),
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":null}}"#,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(f.get(&format!("{PODS}/held")).await.0, 404);
}

#[tokio::test]
async fn delete_preconditions() {
    let f = fixture().await;
    f.post(PODS, pod("p")).await;
    let body = r#"{"preconditions":{"uid":"00000000-0000-0000-0000-000000000000"}}"#;
    let (code, st) = f
        .call(Method::DELETE, &format!("{PODS}/p"), "application/json", body)
        .await;
    assert_eq!(code, 409);
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.contains("the UID in the precondition"))
    );
    assert_eq!(f.get(&format!("{PODS}/p")).await.0, 200);
}

/// Deleting a namespace makes it Terminating; the namespace controller empties it and removes
/// the `kubernetes` finalizer through /finalize, and then it goes.
#[tokio::test]
async fn namespace_deletion_waits_for_its_finalizer() {
    let f = fixture().await;
    f.post("/api/v1/namespaces", json!({"metadata": {"name": "team"}}))
        .await;
    f.post("/api/v1/namespaces/team/pods", pod("a")).await;
    let (code, ns) = f
        .call(Method::DELETE, "/api/v1/namespaces/team", "application/json", "")
        .await;
    assert_eq!(code, 200);
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert!(ns["metadata"]["deletionTimestamp"].is_string());
    let (code, _) = f.get("/api/v1/namespaces/team").await;
    assert_eq!(code, 200);
    let (code, st) = f
        .call(Method::DELETE, "/api/v1/namespaces/team", "application/json", "")
        .await;
    assert_eq!(code, 409);
    assert_eq!(
        st["message"],
        "Operation cannot be fulfilled on namespaces \"team\": The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system."
    );
    let (code, _) = f.post("/api/v1/namespaces/team/pods", pod("b")).await;
    assert_eq!(code, 403);
    // A status write keeps it; /finalize changes only spec.finalizers, and without any left the
    // namespace goes.
    let mut status = ns.clone();
    status["status"]["conditions"] = json!([{"type": "NamespaceContentRemaining", "status": "False",
        "reason": "ContentRemoved", "message": "All content successfully removed"}]);
    let (code, _) = f
        .call(
            Method::PUT,
            "/api/v1/namespaces/team/status",
            "application/json",
            &status.to_string(),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(f.get("/api/v1/namespaces/team").await.0, 200);
    let (_, mut current) = f.get("/api/v1/namespaces/team").await;
    current["spec"]["finalizers"] = json!([]);
    current["metadata"]["labels"]["sneaky"] = json!("x");
    let (code, out) = f
        .call(
            Method::PUT,
            "/api/v1/namespaces/team/finalize",
            "application/json",
            &current.to_string(),
        )
        .await;
    assert_eq!(code, 200, "{out}");
    assert!(out["metadata"]["labels"]["sneaky"].is_null());
    assert_eq!(f.get("/api/v1/namespaces/team").await.0, 404);
}

#[tokio::test]
async fn scale_subresource() {
    let f = fixture().await;
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    let (code, created) = f.post("/apis/apps/v1/namespaces/default/deployments", d).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["replicas"], 1);
    let uri = "/apis/apps/v1/namespaces/default/deployments/web/scale";
    let (code, s) = f
        .call(
            Method::PATCH,
            uri,
            "application/merge-patch+json",
            r#"{"spec":{"replicas":4}}"#,
        )
        .await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(
        (s["kind"].as_str(), s["spec"]["replicas"].as_i64()),
        (Some("Scale"), Some(4))
    );
    assert_eq!(s["status"]["selector"], "app=web");
    let (_, d) = f.get("/apis/apps/v1/namespaces/default/deployments/web").await;
    assert_eq!(
        (
            d["spec"]["replicas"].as_i64(),
            d["metadata"]["generation"].as_i64()
        ),
        (Some(4), Some(2))
    );
    // Selector must match the template.
    let bad = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "y"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    assert_eq!(
        f.post("/apis/apps/v1/namespaces/default/deployments", bad)
            .await
            .0,
        422
    );
}

impl Fixture {
    /// Starts a watch at `uri` as admin, accepting `accept`; the stream's body.
    async fn watch(&self, uri: &str, accept: &str) -> crate::api::output::Body {
        let req = Request::builder()
            .uri(uri)
            .header(http::header::ACCEPT, accept)
            .body(Bytes::new())
            .expect("request");
        let resp = self.api.handle(Some(&admin()), req).await;
        assert_eq!(resp.status().as_u16(), 200);
        resp.into_body()
    }
}

/// The first `n` events of a JSON watch stream (fewer if it ends).
async fn watch_events(body: &mut crate::api::output::Body, n: usize) -> Vec<Value> {
    let mut events = Vec::new();
    while events.len() < n {
        let Some(Ok(frame)) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                events.push(serde_json::from_slice::<Value>(line).expect("event json"));
            }
        }
    }
    events
}

#[tokio::test]
async fn watch_streams_events_with_selectors() {
    let f = fixture().await;
    f.post(PODS, pod("a")).await;
    let mut body = f
        .watch(
            &format!("{PODS}?watch=true&labelSelector=app%3Da&timeoutSeconds=5"),
            "application/json",
        )
        .await;
    f.call(
        Method::PATCH,
        &format!("{PODS}/a"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"x":"1"}}}"#,
    )
    .await;
    f.post(PODS, pod("other")).await;
    f.call(
        Method::PATCH,
        &format!("{PODS}/a"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"app":"gone"}}}"#,
    )
    .await;
    let types: Vec<(String, Value)> = watch_events(&mut body, 3)
        .await
        .into_iter()
        .map(|v| {
            (
                v["type"].as_str().unwrap_or_default().to_string(),
                v["object"]["metadata"]["name"].clone(),
            )
        })
        .collect();
    // Initial ADDED, the label change, then leaving the selector shows as DELETED; "other" never shows.
    assert_eq!(
        types,
        vec![
            ("ADDED".into(), json!("a")),
            ("MODIFIED".into(), json!("a")),
            ("DELETED".into(), json!("a"))
        ]
    );
}

#[tokio::test]
async fn discovery_documents() {
    let f = fixture().await;
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let req = Request::builder()
        .uri("/apis")
        .header("accept", accept)
        .body(Bytes::new())
        .expect("req");
    let resp = f.api.handle(Some(&admin()), req).await;
    assert_eq!(
        resp.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    );
    let (_, legacy) = f.get("/apis").await;
    assert_eq!(legacy["kind"], "APIGroupList");
    let (code, v) = f.get("/version").await;
    assert_eq!(
        (code, v["major"].as_str(), v["minor"].as_str()),
        (200, Some("1"), Some("32"))
    );
}

/// The fuzz target for request decoding (deterministic, so it runs in CI on stable Rust; a
/// cargo-fuzz harness needs a nightly toolchain): bodies mutated at random (bytes flipped,
/// truncated, spliced, deep nesting, wrong types) against create (JSON and Kubernetes protobuf),
/// merge/strategic/JSON patch, server-side apply and update. Every answer must be a 2xx or a 4xx
/// Status (never a 5xx or a panic), and a 4xx must change nothing.
#[tokio::test]
async fn mutated_bodies_get_4xx_and_change_nothing() {
    let f = fixture().await;
    f.post(PODS, pod("base")).await;
    // The bodies also go through the authorization path: as a node (the Node authorizer and
    // NodeRestriction read the body) and as a service account that RBAC lets edit the namespace
    // (a RoleBinding to `edit`), not only as `system:masters`, which skips both.
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "fuzz-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "fuzzer", "namespace": "default"}]});
    assert_eq!(
        f.post(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            binding
        )
        .await
        .0,
        201
    );
    let callers = [
        admin(),
        Caller {
            user: "system:node:n1".into(),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
        },
        Caller {
            user: "system:serviceaccount:default:fuzzer".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:default".into(),
                "system:authenticated".into(),
            ],
        },
    ];
    let valid = pod("fuzz").to_string().into_bytes();
    let valid_pb = protobuf_pod("fuzz");
    // xorshift64*: deterministic, so a failure reproduces.
    // NODEOS_FUZZ_ROUNDS / NODEOS_FUZZ_SEED run it longer or elsewhere in the input space.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let rounds = env("NODEOS_FUZZ_ROUNDS").unwrap_or(1400) as usize;
    let mut state: u64 = env("NODEOS_FUZZ_SEED").unwrap_or(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let nested = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let specials: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"\"string\"".to_vec(),
        br#"{"metadata":"not an object"}"#.to_vec(),
        br#"{"metadata":{"name":7}}"#.to_vec(),
        br#"{"spec":{"containers":"nope"},"metadata":{"name":"x"}}"#.to_vec(),
        br#"{"metadata":{"name":"x","labels":{"a":1}},"spec":{"containers":[{"name":"c","image":"i"}]}}"#
            .to_vec(),
        nested.into_bytes(),
        vec![0xff, 0xfe, 0x00, 0x01],
    ];
    let targets: [(Method, &str, &str); 7] = [
        (Method::POST, PODS, "application/json"),
        (Method::POST, PODS, "application/vnd.kubernetes.protobuf"),
        (
            Method::PATCH,
            "/api/v1/namespaces/default/pods/base?fieldManager=fuzz&force=true",
            "application/apply-patch+yaml",
        ),
        (
            Method::PATCH,
            "/api/v1/namespaces/default/pods/base",
            "application/merge-patch+json",
        ),
        (
            Method::PATCH,
            "/api/v1/namespaces/default/pods/base",
            "application/strategic-merge-patch+json",
        ),
        (
            Method::PATCH,
            "/api/v1/namespaces/default/pods/base",
            "application/json-patch+json",
        ),
        (
            Method::PUT,
            "/api/v1/namespaces/default/pods/base",
            "application/json",
        ),
    ];
    // Accepted requests per caller: the service account's must pass RBAC and reach admission.
    let mut accepted = [0usize; 3];
    for round in 0..rounds {
        let (method, uri, ct) = &targets[round % targets.len()];
        let protobuf = ct.contains("protobuf");
        let body: Vec<u8> = if round < specials.len() * targets.len() {
            specials[round / targets.len()].clone()
        } else if !protobuf && round % 2 == 0 {
            // Type confusion: one value of a valid object replaced by a value of another type.
            let mut v = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "fuzz", "labels": {"app": "x"}, "annotations": {"a": "b"},
                    "finalizers": ["f/x"], "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"}]},
                "spec": {"nodeName": "n1", "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                    "tolerations": [{"key": "k", "operator": "Exists"}],
                    "volumes": [{"name": "v", "emptyDir": {}}],
                    "containers": [{"name": "c", "image": "busybox", "args": ["sleep", "1"],
                        "env": [{"name": "E", "value": "1"}], "ports": [{"containerPort": 80, "protocol": "TCP"}],
                        "resources": {"limits": {"cpu": "1", "memory": "64Mi"}, "requests": {"cpu": "100m"}},
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                        "securityContext": {"runAsUser": 1000, "capabilities": {"drop": ["ALL"]}}}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
            let mut paths = Vec::new();
            collect_paths(&v, String::new(), &mut paths);
            let path = &paths[(next() as usize) % paths.len()];
            let replacement = [
                json!("s"),
                json!(7),
                json!(-1.5),
                json!(null),
                json!([]),
                json!({}),
                json!([{}]),
                json!(true),
            ][(next() % 8) as usize]
                .clone();
            if let Some(slot) = v.pointer_mut(path) {
                *slot = replacement;
            }
            v.to_string().into_bytes()
        } else {
            let mut b = if protobuf { valid_pb.clone() } else { valid.clone() };
            for _ in 0..=(next() % 4) {
                let pos = (next() as usize) % b.len().max(1);
                match next() % 4 {
                    0 => b[pos] = (next() & 0xff) as u8,
                    1 => b.truncate(pos),
                    2 => b.insert(pos, b"{}[],:\"0-9eE.\\"[(next() % 14) as usize]),
                    _ => {
                        let end = (pos + (next() as usize % 16)).min(b.len());
                        b.drain(pos..end);
                    }
                }
                if b.is_empty() {
                    break;
                }
            }
            b
        };
        let before = f.get(PODS).await.1["metadata"]["resourceVersion"].clone();
        let text = String::from_utf8_lossy(&body).into_owned();
        let who = (round / targets.len()) % callers.len();
        let caller = &callers[who];
        let (code, st) = f
            .call_bytes(
                Some(caller),
                method.clone(),
                uri,
                ct,
                Bytes::from(body),
                "application/json",
            )
            .await;
        assert!(
            code < 500,
            "round {round}: {method} {uri} as {} {text:?} -> {code} {st}",
            caller.user
        );
        if code < 400 {
            accepted[who] += 1;
        }
        if code >= 400 {
            assert_eq!(st["kind"], "Status", "round {round}: {st}");
            let after = f.get(PODS).await.1["metadata"]["resourceVersion"].clone();
            assert_eq!(
                before, after,
                "round {round}: a {code} changed the store ({text:?})"
            );
        }
    }
    assert!(
        accepted[0] > 0 && accepted[2] > 0,
        "the admin and the bound service account got requests through: {accepted:?}"
    );
}

/// Every JSON pointer in `v` (objects' members and arrays' items, recursively).
fn collect_paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{k}");
                out.push(p.clone());
                collect_paths(child, p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                collect_paths(child, p, out);
            }
        }
        _ => {}
    }
}

/// A pod as kubectl would send it in protobuf (`k8s\0` + runtime.Unknown), encoded by k8s-pb.
fn protobuf_pod(name: &str) -> Vec<u8> {
    use k8s_pb::api::core::v1 as core;
    use prost::Message;
    let pod = core::Pod {
        metadata: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            labels: [("app".to_string(), "fuzz".to_string())].into(),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: Some("c".into()),
                image: Some("busybox".into()),
                args: vec!["sleep".into(), "1".into()],
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
        }),
        raw: Some(pod.encode_to_vec()),
        ..Default::default()
    };
    [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat()
}

#[tokio::test]
async fn pods_on_nodes_are_deleted_gracefully() {
    let f = fixture().await;
    // Unscheduled: immediate.
    f.post(PODS, pod("loose")).await;
    f.call(Method::DELETE, &format!("{PODS}/loose"), "application/json", "")
        .await;
    assert_eq!(f.get(&format!("{PODS}/loose")).await.0, 404);
    // Bound and running: stays with deletionTimestamp and the pod's grace period.
    let mut p = pod("bound");
    p["spec"]["nodeName"] = json!("n1");
    p["spec"]["terminationGracePeriodSeconds"] = json!(45);
    f.post(PODS, p).await;
    let (code, d) = f
        .call(Method::DELETE, &format!("{PODS}/bound"), "application/json", "")
        .await;
    assert_eq!(code, 200);
    assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 45);
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let (_, t) = f
        .call_as(
            Some(&admin()),
            Method::GET,
            &format!("{PODS}/bound"),
            "",
            "",
            accept,
        )
        .await;
    assert_eq!(t["rows"][0]["cells"][2], "Terminating");
    // Its node writes status while the containers stop: the pod stays (upstream's
    // shouldDeleteDuringUpdate: no finalizers, but a grace period still running).
    let (code, _) = f
        .call(
            Method::PATCH,
            &format!("{PODS}/bound/status"),
            "application/merge-patch+json",
            r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"False"}]}}"#,
        )
        .await;
    assert_eq!(code, 200);
    let (code, kept) = f.get(&format!("{PODS}/bound")).await;
    assert_eq!(
        (code, &kept["status"]["conditions"][0]["status"]),
        (200, &json!("False"))
    );
    // The node (or --force) finishes it with grace 0.
    let (code, _) = f
        .call(
            Method::DELETE,
            &format!("{PODS}/bound"),
            "application/json",
            r#"{"gracePeriodSeconds":0}"#,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(f.get(&format!("{PODS}/bound")).await.0, 404);
}

/// Status is not the client's to set on create (kinds with a status subresource); a node's is.
#[tokio::test]
async fn create_resets_status_except_for_nodes() {
    let f = fixture().await;
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}},
        "status": {"replicas": 5, "readyReplicas": 5}});
    let (code, d) = f
        .post("/apis/apps/v1/namespaces/default/deployments", deploy)
        .await;
    assert_eq!((code, &d["status"]), (201, &json!({})));
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
        "status": {"capacity": {"cpu": "2"}}});
    let (code, n) = f.post("/api/v1/nodes", node).await;
    assert_eq!((code, &n["status"]["capacity"]["cpu"]), (201, &json!("2")));
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80}]}, "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}});
    let (code, s) = f.post("/api/v1/namespaces/default/services", svc).await;
    assert_eq!((code, &s["status"]), (201, &json!({"loadBalancer": {}})));
}

/// Eviction honours a PodDisruptionBudget: with minAvailable 2 of 3 ready pods one eviction
/// passes and the next gets the 429 kubectl drain retries on; Pending pods always go.
#[tokio::test]
async fn eviction_respects_disruption_budgets() {
    let f = fixture().await;
    for n in ["a", "b", "c"] {
        let mut p = pod(n);
        p["metadata"]["labels"] = json!({"app": "web"});
        f.post(PODS, p).await;
        let (_, mut cur) = f.get(&format!("{PODS}/{n}")).await;
        cur["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        let (code, _) = f
            .call(
                Method::PUT,
                &format!("{PODS}/{n}/status"),
                "application/json",
                &cur.to_string(),
            )
            .await;
        assert_eq!(code, 200);
    }
    f.post("/api/v1/namespaces/default/pods", pod("loner")).await;
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}});
    assert_eq!(
        f.post("/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb)
            .await
            .0,
        201
    );
    let evict = |n: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": n, "namespace": "default"}});
    let (code, _) = f.post(&format!("{PODS}/a/eviction"), evict("a")).await;
    assert_eq!(code, 201);
    let (code, st) = f.post(&format!("{PODS}/b/eviction"), evict("b")).await;
    assert_eq!((code, st["reason"].as_str()), (429, Some("TooManyRequests")));
    assert_eq!(
        st["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        st["details"]["causes"][0]["message"],
        "The disruption budget web needs 2 healthy pods and has 2 currently"
    );
    assert_eq!(f.get(&format!("{PODS}/b")).await.0, 200, "b was not deleted");
    let (_, budget) = f
        .get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web")
        .await;
    assert_eq!(budget["status"]["disruptionsAllowed"], 0);
    assert!(budget["status"]["disruptedPods"]["a"].is_string());
    // Pods the budget does not cover, and Pending pods, are not held back.
    assert_eq!(
        f.post(&format!("{PODS}/loner/eviction"), evict("loner")).await.0,
        201
    );
}

mod authz;
mod lists;
mod protobuf;
mod resources;
mod versions;

/// A store that became read-only makes `/readyz` and `/healthz` fail with the reason; `/livez`
/// stays ok (the process is alive).
#[tokio::test]
async fn readyz_fails_while_the_store_is_read_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(open_default(dir.path()).expect("store"));
    let api = Api::new(store.clone(), "CA-PEM".into());
    let get = |path: &'static str| {
        let api = api.clone();
        async move {
            let req = Request::builder().uri(path).body(Bytes::new()).expect("request");
            let resp = api.handle(None, req).await;
            let code = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            (code, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(get("/readyz").await, (200, "ok".into()));
    store.fail_for_test("log write failed: No space left on device (os error 28)");
    assert_eq!(
        get("/readyz").await,
        (
            500,
            "[-]etcd failed: log write failed: No space left on device (os error 28)\nreadyz check failed"
                .into()
        )
    );
    assert_eq!(get("/healthz").await.0, 500);
    assert_eq!(get("/livez").await, (200, "ok".into()));
}

/// Metadata clients (`as=PartialObjectMetadata[List]`, client-go's metadata informers and kube's
/// `metadata_watcher`) get only metadata, on get, list and watch.
#[tokio::test]
async fn partial_object_metadata_on_get_list_and_watch() {
    let f = fixture().await;
    f.post(PODS, pod("a")).await;
    f.post(PODS, pod("b")).await;
    let one = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
    let (code, m) = f
        .call_as(Some(&admin()), Method::GET, &format!("{PODS}/a"), "", "", one)
        .await;
    assert_eq!(code, 200);
    assert_eq!(m["kind"], "PartialObjectMetadata");
    assert_eq!(m["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(m["metadata"]["name"], "a");
    assert!(m["metadata"]["uid"].is_string() && m["metadata"]["resourceVersion"].is_string());
    assert!(m.get("spec").is_none() && m.get("status").is_none());

    let many = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let (code, l) = f
        .call_as(
            Some(&admin()),
            Method::GET,
            &format!("{PODS}?limit=1"),
            "",
            "",
            many,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(l["kind"], "PartialObjectMetadataList");
    assert_eq!(l["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(l["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(l["items"][0]["metadata"]["name"], "a");
    assert!(l["items"][0].get("spec").is_none());
    assert!(l["metadata"]["continue"].is_string());
    let (_, get) = f.get(&format!("{PODS}/a")).await;
    assert_eq!(
        l["items"][0]["metadata"]["resourceVersion"],
        get["metadata"]["resourceVersion"]
    );

    let mut body = f
        .watch(&format!("{PODS}?watch=true&timeoutSeconds=5"), many)
        .await;
    f.call(
        Method::PATCH,
        &format!("{PODS}/b"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"x":"1"}}}"#,
    )
    .await;
    let events = watch_events(&mut body, 3).await;
    let seen: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default(),
                e["object"]["kind"].as_str().unwrap_or_default(),
                e["object"]["metadata"]["name"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("ADDED", "PartialObjectMetadata", "a"),
            ("ADDED", "PartialObjectMetadata", "b"),
            ("MODIFIED", "PartialObjectMetadata", "b")
        ]
    );
    assert_eq!(events[2]["object"]["metadata"]["labels"]["x"], "1");
    assert!(events.iter().all(|e| e["object"].get("spec").is_none()));
}

/// Service ClusterIPs: allocated from the range (upper band first), asked-for addresses checked,
/// never handed out twice, taken back once their Service is gone, kept across updates.
#[tokio::test]
async fn services_get_cluster_ips_from_the_range() {
    let f = fixture().await;
    const SVCS: &str = "/api/v1/namespaces/default/services";
    let svc = |name: &str, extra: Value| {
        let mut s = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"ports": [{"port": 80}]}});
        if let (Some(spec), Some(extra)) = (s["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        s
    };
    let range: verbs::clusterip::ServiceRange = "10.96.0.0/12".parse().expect("range");
    let (code, a) = f.post(SVCS, svc("a", json!({}))).await;
    assert_eq!(code, 201, "{a}");
    let ip: std::net::Ipv4Addr = a["spec"]["clusterIP"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("an IPv4 address");
    assert!(
        range.index(ip).is_some_and(|i| i >= range.static_band()),
        "{ip} from the upper band"
    );
    assert_eq!(a["spec"]["clusterIPs"], json!([ip.to_string()]));
    assert_eq!(
        (&a["spec"]["ipFamilies"], &a["spec"]["ipFamilyPolicy"]),
        (&json!(["IPv4"]), &json!("SingleStack"))
    );
    // Asked for: granted once, then refused; outside the range refused.
    let (code, b) = f.post(SVCS, svc("b", json!({"clusterIP": "10.96.0.10"}))).await;
    assert_eq!((code, &b["spec"]["clusterIP"]), (201, &json!("10.96.0.10")));
    let (code, st) = f.post(SVCS, svc("c", json!({"clusterIP": "10.96.0.10"}))).await;
    assert_eq!(code, 422);
    assert_eq!(
        st["message"],
        "Service \"c\" is invalid: spec.clusterIPs: Invalid value: []string{\"10.96.0.10\"}: failed to allocate IP 10.96.0.10: provided IP is already allocated"
    );
    let (code, st) = f.post(SVCS, svc("c", json!({"clusterIP": "192.168.0.1"}))).await;
    assert_eq!(code, 422);
    assert_eq!(
        st["message"],
        "Service \"c\" is invalid: spec.clusterIPs: Invalid value: []string{\"192.168.0.1\"}: failed to allocate IP 192.168.0.1: the provided IP (192.168.0.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12"
    );
    // Headless and ExternalName Services get none.
    let (_, h) = f.post(SVCS, svc("h", json!({"clusterIP": "None"}))).await;
    assert_eq!(h["spec"]["clusterIP"], "None");
    let (_, x) = f
        .post(
            SVCS,
            svc(
                "x",
                json!({"type": "ExternalName", "externalName": "db.example.com"}),
            ),
        )
        .await;
    assert!(x["spec"]["clusterIP"].is_null(), "{x}");
    // An update without the address keeps it; another address is refused.
    let mut replaced = svc("b", json!({}));
    replaced["spec"]["ports"] = json!([{"port": 81}]);
    let (code, b2) = f
        .call(
            Method::PUT,
            &format!("{SVCS}/b"),
            "application/json",
            &replaced.to_string(),
        )
        .await;
    assert_eq!(
        (code, &b2["spec"]["clusterIP"]),
        (200, &json!("10.96.0.10")),
        "{b2}"
    );
    let moved = svc("b", json!({"clusterIP": "10.96.0.11"}));
    let (code, st) = f
        .call(
            Method::PUT,
            &format!("{SVCS}/b"),
            "application/json",
            &moved.to_string(),
        )
        .await;
    assert_eq!(code, 422, "{st}");
    // Once its Service is deleted, the address can be had again (its reservation is gone).
    assert_eq!(f.call(Method::DELETE, &format!("{SVCS}/b"), "", "").await.0, 200);
    let reservation = f
        .api
        .store
        .get("/registry/ranges/serviceips/10.96.0.10")
        .await
        .expect("read");
    assert!(reservation.is_none(), "released with its Service");
    let (code, c) = f.post(SVCS, svc("c", json!({"clusterIP": "10.96.0.10"}))).await;
    assert_eq!(
        (code, &c["spec"]["clusterIP"]),
        (201, &json!("10.96.0.10")),
        "{c}"
    );
    // The kubernetes Service takes the first address.
    f.api
        .ensure_kubernetes_service(6443)
        .await
        .expect("kubernetes service");
    let (_, k) = f.get(&format!("{SVCS}/kubernetes")).await;
    assert_eq!(k["spec"]["clusterIP"], "10.96.0.1");
    assert_eq!(
        k["spec"]["ports"][0],
        json!({"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443})
    );
    f.api.ensure_kubernetes_service(6443).await.expect("idempotent");
}
