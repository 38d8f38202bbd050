//! Protobuf on every verb and in answers, checked with an independent decoder (k8s-pb's prost
//! types): objects, lists (whole and streamed), `Status` errors, watch frames, DELETE with a
//! protobuf `DeleteOptions` body, and the JSON fallback for objects without a protobuf form.

use http_body_util::BodyExt;
use k8s_pb::api::autoscaling::v1 as autoscaling;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{Value, json};

use super::*;
use crate::api::object::stored::encode;
use crate::api::verbs::list::PAGE;
use crate::storage::Write;

const PB: &str = "application/vnd.kubernetes.protobuf";
/// What client-go sends with the protobuf content type.
const CLIENT_GO_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// A request's answer: status, content type, body.
async fn call_raw(
    f: &Fixture,
    method: Method,
    uri: &str,
    ct: &str,
    body: Vec<u8>,
    accept: &str,
) -> (u16, String, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ct)
        .header("accept", accept)
        .body(Bytes::from(body))
        .expect("request");
    let resp = f.api.handle(Some(&admin()), req).await;
    let code = resp.status().as_u16();
    let ct = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, ct, body.to_vec())
}

/// (apiVersion, kind, raw) of a protobuf document, through prost.
fn unwrap(doc: &[u8]) -> (String, String, Vec<u8>) {
    let unknown = Unknown::decode(doc.strip_prefix(b"k8s\0").expect("magic")).expect("Unknown");
    let tm = unknown.type_meta.expect("typeMeta");
    (
        tm.api_version.unwrap_or_default(),
        tm.kind.unwrap_or_default(),
        unknown.raw.unwrap_or_default(),
    )
}

/// A protobuf document of a message, as client-go sends it.
fn document(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat()
}

fn delete_options(grace: Option<i64>, uid: Option<&str>, api_version: &str) -> Vec<u8> {
    let opts = meta::DeleteOptions {
        grace_period_seconds: grace,
        preconditions: uid.map(|u| meta::Preconditions {
            uid: Some(u.into()),
            resource_version: None,
        }),
        propagation_policy: Some("Background".into()),
        ..Default::default()
    };
    document(api_version, "DeleteOptions", opts.encode_to_vec())
}

fn names(pods: &core::PodList) -> Vec<String> {
    pods.items
        .iter()
        .filter_map(|p| p.metadata.as_ref()?.name.clone())
        .collect()
}

#[tokio::test]
async fn objects_and_errors_answer_protobuf_when_asked() {
    let f = fixture().await;
    let (code, created) = f.post(PODS, pod("web")).await;
    assert_eq!(code, 201);
    for accept in [
        PB,
        CLIENT_GO_ACCEPT,
        "application/json;q=0.5, application/vnd.kubernetes.protobuf",
    ] {
        let (code, ct, body) = call_raw(&f, Method::GET, &format!("{PODS}/web"), "", vec![], accept).await;
        assert_eq!((code, ct.as_str()), (200, PB), "{accept}");
        let (api_version, kind, raw) = unwrap(&body);
        assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "Pod"));
        let p = core::Pod::decode(raw.as_slice()).expect("prost decodes the Pod");
        let m = p.metadata.expect("metadata");
        assert_eq!(m.name.as_deref(), Some("web"));
        assert_eq!(
            m.resource_version.as_deref(),
            created["metadata"]["resourceVersion"].as_str()
        );
        assert_eq!(m.uid.as_deref(), created["metadata"]["uid"].as_str());
        assert_eq!(
            p.spec.expect("spec").containers[0].image.as_deref(),
            Some("busybox")
        );
    }
    // JSON when JSON is preferred.
    let (_, ct, _) = call_raw(
        &f,
        Method::GET,
        &format!("{PODS}/web"),
        "",
        vec![],
        "application/json, application/vnd.kubernetes.protobuf",
    )
    .await;
    assert_eq!(ct, "application/json");
    // Errors are protobuf Status documents.
    let (code, ct, body) = call_raw(
        &f,
        Method::GET,
        &format!("{PODS}/nope"),
        "",
        vec![],
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!((code, ct.as_str()), (404, PB));
    let (_, kind, raw) = unwrap(&body);
    assert_eq!(kind, "Status");
    let st = meta::Status::decode(raw.as_slice()).expect("prost decodes the Status");
    assert_eq!(st.code, Some(404));
    assert_eq!(st.reason.as_deref(), Some("NotFound"));
    assert_eq!(st.message.as_deref(), Some("pods \"nope\" not found"));
    assert_eq!(st.details.and_then(|d| d.name).as_deref(), Some("nope"));
    // A create answers in protobuf too; a table stays JSON.
    let (code, ct, body) = call_raw(
        &f,
        Method::POST,
        PODS,
        "application/json",
        pod("web2").to_string().into_bytes(),
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, PB));
    assert_eq!(unwrap(&body).1, "Pod");
    let (code, ct, _) = call_raw(
        &f,
        Method::GET,
        PODS,
        "",
        vec![],
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
}

#[tokio::test]
async fn lists_answer_protobuf_whole_paged_and_streamed() {
    let f = fixture().await;
    for n in ["a", "b", "c", "d"] {
        f.post(PODS, pod(n)).await;
    }
    let (_, json_list) = f.get(PODS).await;
    let (code, ct, body) = call_raw(&f, Method::GET, PODS, "", vec![], CLIENT_GO_ACCEPT).await;
    assert_eq!((code, ct.as_str()), (200, PB));
    let (api_version, kind, raw) = unwrap(&body);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "PodList"));
    let pods = core::PodList::decode(raw.as_slice()).expect("prost decodes the PodList");
    assert_eq!(names(&pods), ["a", "b", "c", "d"]);
    let rvs: Vec<_> = pods
        .items
        .iter()
        .map(|p| p.metadata.as_ref().and_then(|m| m.resource_version.clone()))
        .collect();
    let json_rvs: Vec<_> = json_list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|p| p["metadata"]["resourceVersion"].as_str().map(str::to_string))
        .collect();
    assert_eq!(rvs, json_rvs);
    // Pages with continue tokens and a selector.
    let selector = "labelSelector=app%20in%20(a%2Cb%2Cd)";
    let uri = format!("{PODS}?limit=2&{selector}");
    let (_, _, body) = call_raw(&f, Method::GET, &uri, "", vec![], CLIENT_GO_ACCEPT).await;
    let p1 = core::PodList::decode(unwrap(&body).2.as_slice()).expect("page 1");
    assert_eq!(names(&p1), ["a", "b"]);
    let cont = p1.metadata.and_then(|m| m.r#continue).expect("a continue token");
    let (_, json_page) = f.get(&uri).await;
    assert_eq!(json_page["metadata"]["continue"], json!(cont));
    let uri = format!("{PODS}?limit=2&{selector}&continue={}", cont.replace('=', "%3D"));
    let (_, _, body) = call_raw(&f, Method::GET, &uri, "", vec![], CLIENT_GO_ACCEPT).await;
    let p2 = core::PodList::decode(unwrap(&body).2.as_slice()).expect("page 2");
    assert_eq!(names(&p2), ["d"]);
    assert_eq!(p2.metadata.and_then(|m| m.r#continue), None);

    // A collection larger than a store page streams (its length computed first).
    let cms = registry::find("", "v1", "configmaps").expect("served");
    let n = PAGE * 2 + 3;
    let writes = (0..n).map(|i| {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm-{i:05}"), "namespace": "default"}, "data": {"i": i.to_string()}});
        let store = f.api.store.clone();
        async move {
            store
                .write(Write::Create {
                    key: cms.key(Some("default"), &format!("cm-{i:05}")),
                    value: encode(&cm),
                })
                .await
                .expect("write")
        }
    });
    futures::future::join_all(writes).await;
    let uri = "/api/v1/namespaces/default/configmaps";
    let (code, ct, body) = call_raw(&f, Method::GET, uri, "", vec![], CLIENT_GO_ACCEPT).await;
    assert_eq!((code, ct.as_str()), (200, PB));
    let (_, kind, raw) = unwrap(&body);
    assert_eq!(kind, "ConfigMapList");
    let list = core::ConfigMapList::decode(raw.as_slice()).expect("prost decodes the streamed list");
    // The bootstrap's kube-root-ca.crt comes last.
    assert_eq!(list.items.len(), n + 1);
    let name = |i: usize| list.items[i].metadata.as_ref().and_then(|m| m.name.clone());
    assert_eq!(name(n - 1), Some(format!("cm-{:05}", n - 1)));
    assert_eq!(name(n).as_deref(), Some("kube-root-ca.crt"));
    assert_eq!(list.items[n - 1].data.get("i"), Some(&(n - 1).to_string()));

    // A stored object with a field that has no protobuf form: JSON, for one object and lists.
    let odd = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "odd", "namespace": "kube-public"}, "data": {"k": "v"}, "colour": "red"});
    f.api
        .store
        .write(Write::Create {
            key: cms.key(Some("kube-public"), "odd"),
            value: encode(&odd),
        })
        .await
        .expect("write");
    let (code, ct, body) = call_raw(
        &f,
        Method::GET,
        "/api/v1/namespaces/kube-public/configmaps/odd",
        "",
        vec![],
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).expect("JSON")["colour"],
        "red"
    );
    let (_, ct, _) = call_raw(
        &f,
        Method::GET,
        "/api/v1/namespaces/kube-public/configmaps",
        "",
        vec![],
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!(ct, "application/json");
    let (code, ct, body) = call_raw(
        &f,
        Method::GET,
        "/api/v1/configmaps",
        "",
        vec![],
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!(
        (code, ct.as_str()),
        (200, "application/json"),
        "a streamed list falls back too"
    );
    let all: Value = serde_json::from_slice(&body).expect("JSON");
    assert!(all["items"].as_array().is_some_and(|i| i.len() > n + 1));
}

#[tokio::test]
async fn watch_streams_protobuf_frames() {
    let f = fixture().await;
    let (_, a) = f.post(PODS, pod("a")).await;
    let rv = a["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    let req = Request::builder()
        .uri(format!("{PODS}?watch=true&resourceVersion={rv}&timeoutSeconds=5"))
        .header("accept", CLIENT_GO_ACCEPT)
        .body(Bytes::new())
        .expect("request");
    let resp = f.api.handle(Some(&admin()), req).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf;stream=watch")
    );
    let mut body = resp.into_body();
    f.post(PODS, pod("b")).await;
    f.call(Method::DELETE, &format!("{PODS}/a"), "", "").await;
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while events.len() < 2 {
        let Some(Ok(frame)) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            let ev = meta::WatchEvent::decode(&buf[4..4 + len]).expect("prost decodes the WatchEvent");
            buf.drain(..4 + len);
            let (_, kind, raw) = unwrap(&ev.object.and_then(|o| o.raw).expect("object"));
            assert_eq!(kind, "Pod");
            let p = core::Pod::decode(raw.as_slice()).expect("prost decodes the Pod");
            events.push((
                ev.r#type.unwrap_or_default(),
                p.metadata.and_then(|m| m.name).unwrap_or_default(),
            ));
        }
    }
    assert_eq!(
        events,
        [
            ("ADDED".to_string(), "b".to_string()),
            ("DELETED".to_string(), "a".to_string())
        ]
    );
}

#[tokio::test]
async fn deletes_take_protobuf_delete_options() {
    let f = fixture().await;
    let (_, p) = f.post(PODS, pod("a")).await;
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    // A precondition that does not hold is honoured, so the body was read.
    let (code, ct, body) = call_raw(
        &f,
        Method::DELETE,
        &format!("{PODS}/a"),
        PB,
        delete_options(Some(0), Some("other-uid"), "v1"),
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!(
        (code, ct.as_str()),
        (409, PB),
        "{:?}",
        String::from_utf8_lossy(&body)
    );
    let (code, _, _) = call_raw(
        &f,
        Method::DELETE,
        &format!("{PODS}/a"),
        PB,
        delete_options(Some(0), Some(&uid), "v1"),
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(f.get(&format!("{PODS}/a")).await.0, 404);
    // A namespace, with DeleteOptions as client-go's core client sends them.
    f.post("/api/v1/namespaces", json!({"metadata": {"name": "gone"}}))
        .await;
    let (code, _, body) = call_raw(
        &f,
        Method::DELETE,
        "/api/v1/namespaces/gone",
        PB,
        delete_options(None, None, "v1"),
        "application/json",
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    // deletecollection of nodes; DeleteOptions may name another group version.
    for n in ["n1", "n2"] {
        f.post("/api/v1/nodes", json!({"metadata": {"name": n}})).await;
    }
    let (code, _, body) = call_raw(
        &f,
        Method::DELETE,
        "/api/v1/nodes",
        "application/vnd.kubernetes.protobuf; charset=utf-8",
        delete_options(None, None, "meta.k8s.io/v1"),
        "application/json",
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let (_, nodes) = f.get("/api/v1/nodes").await;
    assert_eq!(nodes["items"], json!([]));
    // A deployment (apps/v1 DeleteOptions) and a JSON body without a content type still work.
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {"metadata": {"labels": {"app": "d"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    let deps = "/apis/apps/v1/namespaces/default/deployments";
    f.post(deps, dep.clone()).await;
    let (code, _, _) = call_raw(
        &f,
        Method::DELETE,
        &format!("{deps}/d"),
        PB,
        delete_options(None, None, "apps/v1"),
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!(code, 200);
    f.post(deps, dep).await;
    let (code, _, _) = call_raw(
        &f,
        Method::DELETE,
        &format!("{deps}/d"),
        "",
        br#"{"propagationPolicy":"Foreground"}"#.to_vec(),
        "application/json",
    )
    .await;
    assert_eq!(code, 200);
    // A protobuf body that is not protobuf is a bad request.
    let (code, ct, _) = call_raw(
        &f,
        Method::DELETE,
        "/api/v1/nodes",
        PB,
        b"{}".to_vec(),
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!((code, ct.as_str()), (400, PB));
}

#[tokio::test]
async fn scale_takes_and_answers_protobuf() {
    let f = fixture().await;
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}}, "template": {"metadata": {"labels": {"app": "d"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    f.post("/apis/apps/v1/namespaces/default/deployments", dep).await;
    let uri = "/apis/apps/v1/namespaces/default/deployments/d/scale";
    let scale = autoscaling::Scale {
        metadata: Some(meta::ObjectMeta {
            name: Some("d".into()),
            namespace: Some("default".into()),
            ..Default::default()
        }),
        spec: Some(autoscaling::ScaleSpec { replicas: Some(0) }),
        status: None,
    };
    let (code, ct, body) = call_raw(
        &f,
        Method::PUT,
        uri,
        PB,
        document("autoscaling/v1", "Scale", scale.encode_to_vec()),
        CLIENT_GO_ACCEPT,
    )
    .await;
    assert_eq!(
        (code, ct.as_str()),
        (200, PB),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (_, kind, raw) = unwrap(&body);
    assert_eq!(kind, "Scale");
    let got = autoscaling::Scale::decode(raw.as_slice()).expect("prost decodes the Scale");
    assert_eq!(got.spec.and_then(|s| s.replicas), Some(0));
    let (_, d) = f.get("/apis/apps/v1/namespaces/default/deployments/d").await;
    assert_eq!(d["spec"]["replicas"], 0);
}

#[tokio::test]
async fn a_protobuf_watch_from_now_starts_with_added_frames() {
    let f = fixture().await;
    for n in ["a", "b"] {
        f.post(PODS, pod(n)).await;
    }
    let req = Request::builder()
        .uri(format!("{PODS}?watch=true&timeoutSeconds=2"))
        .header("accept", CLIENT_GO_ACCEPT)
        .body(Bytes::new())
        .expect("request");
    let resp = f.api.handle(Some(&admin()), req).await;
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let mut rest = &body[..];
    let mut added = Vec::new();
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let ev = meta::WatchEvent::decode(&rest[4..4 + len]).expect("WatchEvent");
        rest = &rest[4 + len..];
        let (_, _, raw) = unwrap(&ev.object.and_then(|o| o.raw).expect("object"));
        let p = core::Pod::decode(raw.as_slice()).expect("Pod");
        added.push((
            ev.r#type.unwrap_or_default(),
            p.metadata.and_then(|m| m.name).unwrap_or_default(),
        ));
    }
    assert_eq!(
        added,
        [
            ("ADDED".to_string(), "a".to_string()),
            ("ADDED".to_string(), "b".to_string())
        ]
    );
}
