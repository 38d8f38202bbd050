//! The resources upstream's scheduler and controller manager list and watch: served, stored,
//! defaulted, in discovery, with their subresources; componentstatuses read-only.

use serde_json::json;

use super::*;

#[tokio::test]
async fn informer_resources_are_served_and_discovered() {
    let f = fixture().await;
    let (_, core) = f.get("/api/v1").await;
    let (_, storage) = f.get("/apis/storage.k8s.io/v1").await;
    let (_, admission) = f.get("/apis/admissionregistration.k8s.io/v1").await;
    let names = |v: &Value| -> Vec<String> {
        v["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect()
    };
    for (doc, want) in [
        (
            &core,
            &[
                "replicationcontrollers",
                "replicationcontrollers/status",
                "replicationcontrollers/scale",
                "podtemplates",
                "componentstatuses",
            ][..],
        ),
        (
            &storage,
            &[
                "storageclasses",
                "csidrivers",
                "csinodes",
                "csistoragecapacities",
                "volumeattachments",
                "volumeattachments/status",
            ],
        ),
        (
            &admission,
            &[
                "mutatingwebhookconfigurations",
                "validatingwebhookconfigurations",
                "validatingadmissionpolicies",
                "validatingadmissionpolicies/status",
                "validatingadmissionpolicybindings",
            ],
        ),
    ] {
        let have = names(doc);
        for w in want {
            assert!(have.iter().any(|h| h == w), "{w} missing from {have:?}");
        }
    }
    let cs = core["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "componentstatuses"))
        .expect("componentstatuses");
    assert_eq!(cs["verbs"], json!(["get", "list"]));
    assert_eq!(cs["shortNames"], json!(["cs"]));

    // Every new resource stores, lists and watches like any other.
    for (uri, obj) in [
        (
            "/apis/storage.k8s.io/v1/storageclasses",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"},
                "provisioner": "example.com/fast"}),
        ),
        (
            "/apis/storage.k8s.io/v1/csidrivers",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "csi.example.com"},
                "spec": {}}),
        ),
        (
            "/apis/storage.k8s.io/v1/csinodes",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n1"},
                "spec": {"drivers": [{"name": "csi.example.com", "nodeID": "n1"}]}}),
        ),
        (
            "/apis/storage.k8s.io/v1/namespaces/default/csistoragecapacities",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": {"name": "cap"},
                "storageClassName": "fast", "capacity": "10Gi"}),
        ),
        (
            "/apis/storage.k8s.io/v1/volumeattachments",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "va"},
                "spec": {"attacher": "csi.example.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}}}),
        ),
        (
            "/api/v1/namespaces/default/podtemplates",
            json!({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tpl"},
                "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}),
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": "p"}, "spec": {"validations": [{"expression": "true"}]}}),
        ),
    ] {
        let (code, created) = f.post(uri, obj).await;
        assert_eq!(code, 201, "{uri}: {created}");
        let name = created["metadata"]["name"].as_str().expect("name");
        assert_eq!(f.get(&format!("{uri}/{name}")).await.0, 200, "{uri}");
        let (code, list) = f.get(uri).await;
        assert_eq!(code, 200);
        assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{uri}");
    }
    let (_, sc) = f.get("/apis/storage.k8s.io/v1/storageclasses/fast").await;
    assert_eq!(
        (&sc["reclaimPolicy"], &sc["volumeBindingMode"]),
        (&json!("Delete"), &json!("Immediate"))
    );
    let (_, driver) = f.get("/apis/storage.k8s.io/v1/csidrivers/csi.example.com").await;
    assert_eq!(driver["spec"]["attachRequired"], true);
    assert_eq!(driver["spec"]["volumeLifecycleModes"], json!(["Persistent"]));
    let (_, table) = f
        .call_as(
            Some(&admin()),
            Method::GET,
            "/apis/storage.k8s.io/v1/storageclasses",
            "",
            "",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .await;
    assert_eq!(
        table["rows"][0]["cells"],
        json!([
            "fast",
            "example.com/fast",
            "Delete",
            "Immediate",
            "false",
            table["rows"][0]["cells"][5]
        ])
    );
}

#[tokio::test]
async fn replication_controllers_default_scale_and_report_status() {
    let f = fixture().await;
    let rcs = "/api/v1/namespaces/default/replicationcontrollers";
    let rc = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "web"},
        "spec": {"template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    let (code, created) = f.post(rcs, rc).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["replicas"], 1);
    assert_eq!(created["spec"]["selector"], json!({"app": "web"}));
    assert_eq!(created["metadata"]["labels"], json!({"app": "web"}));
    let (_, scale) = f.get(&format!("{rcs}/web/scale")).await;
    assert_eq!(scale["spec"]["replicas"], 1);
    assert_eq!(scale["status"]["selector"], "app=web");
    let (code, _) = f
        .call(
            Method::PATCH,
            &format!("{rcs}/web/scale"),
            "application/merge-patch+json",
            r#"{"spec":{"replicas":3}}"#,
        )
        .await;
    assert_eq!(code, 200);
    let (code, st) = f
        .call(
            Method::PATCH,
            &format!("{rcs}/web/status"),
            "application/merge-patch+json",
            r#"{"status":{"replicas":3,"readyReplicas":2}}"#,
        )
        .await;
    assert_eq!(code, 200, "{st}");
    let (_, web) = f.get(&format!("{rcs}/web")).await;
    assert_eq!(web["spec"]["replicas"], 3);
    assert_eq!(web["status"]["readyReplicas"], 2);
    let (_, table) = f
        .call_as(
            Some(&admin()),
            Method::GET,
            rcs,
            "",
            "",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .await;
    let cells = &table["rows"][0]["cells"];
    assert_eq!(
        (&cells[0], &cells[1], &cells[3]),
        (&json!("web"), &json!(3), &json!(2))
    );
}

#[tokio::test]
async fn component_statuses_are_read_only() {
    let f = fixture().await;
    let (code, list) = f.get("/api/v1/componentstatuses").await;
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "ComponentStatusList");
    assert_eq!(list["items"][0]["metadata"]["name"], "etcd-0");
    assert_eq!(
        list["items"][0]["conditions"][0],
        json!({"type": "Healthy", "status": "True", "message": "ok"})
    );
    let (code, one) = f.get("/api/v1/componentstatuses/etcd-0").await;
    assert_eq!((code, &one["kind"]), (200, &json!("ComponentStatus")));
    assert_eq!(f.get("/api/v1/componentstatuses/scheduler").await.0, 404);
    let (code, _) = f
        .post("/api/v1/componentstatuses", json!({"metadata": {"name": "x"}}))
        .await;
    assert_eq!(code, 405);
    assert_eq!(f.get("/api/v1/componentstatuses?watch=true").await.0, 405);
    let (_, table) = f
        .call_as(
            Some(&admin()),
            Method::GET,
            "/api/v1/componentstatuses",
            "",
            "",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .await;
    assert_eq!(table["rows"][0]["cells"], json!(["etcd-0", "Healthy", "ok", ""]));
}
