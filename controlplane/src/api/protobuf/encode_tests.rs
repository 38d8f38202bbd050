//! The encoder against the decoder (round trips) and against an independent decoder: `k8s-pb`'s
//! prost bindings of the same types.

use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Value, json};

use super::*;
use crate::api::protobuf::decode;

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

/// The object of a document, through prost: (apiVersion, kind, raw message).
fn unwrap(doc: &[u8]) -> (String, String, Vec<u8>) {
    let unknown = Unknown::decode(doc.strip_prefix(MAGIC).expect("magic")).expect("prost decodes Unknown");
    let tm = unknown.type_meta.expect("typeMeta");
    assert_eq!(unknown.content_encoding.as_deref(), Some(""));
    (
        tm.api_version.unwrap_or_default(),
        tm.kind.unwrap_or_default(),
        unknown.raw.unwrap_or_default(),
    )
}

/// What kubectl sends: `k8s\0` + runtime.Unknown{typeMeta, raw} (contentEncoding and contentType
/// empty, as Go writes them).
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: s(api_version),
            kind: s(kind),
        }),
        raw: Some(raw),
        content_encoding: s(""),
        content_type: s(""),
    };
    [MAGIC.to_vec(), unknown.encode_to_vec()].concat()
}

fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "web-0", "namespace": "default", "uid": "5d0e7a26-7b5e-4b0e-9c3a-7f0c1b2d3e4f",
            "resourceVersion": "42", "generation": 1,
            "creationTimestamp": "2025-11-29T14:00:00Z",
            "labels": {"app": "web", "tier": "fe"}, "annotations": {"note": "ü \" \\"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                "uid": "u-1", "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["x/y"],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                "time": "2025-11-29T14:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}],
        },
        "spec": {
            "containers": [{
                "name": "c", "image": "nginx", "command": ["sh", "-c"], "args": ["sleep 1"],
                "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}],
                "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": 1}},
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
                "livenessProbe": {"tcpSocket": {"port": 80}},
                "securityContext": {"runAsUser": 0, "privileged": false},
                "imagePullPolicy": "IfNotPresent",
            }],
            "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cm", "defaultMode": 420}}],
            "nodeName": "n1", "hostNetwork": true, "priority": -5,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
        },
        "status": {
            "phase": "Running", "podIP": "10.244.0.2", "qosClass": "Burstable",
            "startTime": "2025-11-29T14:00:01Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2025-11-29T14:00:02Z"}],
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2, "image": "nginx",
                "imageID": "", "state": {"running": {"startedAt": "2025-11-29T14:00:01Z"}}}],
        },
    })
}

/// What the decoder gives for what the encoder wrote: the object itself, with the zeros JSON
/// omits (`imageID: ""`) left out as the decoder leaves them out, and quantities as strings.
#[test]
fn round_trips_through_the_decoder() {
    let mut want = pod();
    want["status"]["containerStatuses"][0]
        .as_object_mut()
        .expect("object")
        .remove("imageID");
    want["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("1");
    let objects = [
        (pod(), want),
        (
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}]}}},
                "status": {"replicas": 3, "conditions": [{"type": "Available", "status": "True",
                    "lastUpdateTime": "2025-11-29T14:00:00Z", "reason": "MinimumReplicasAvailable"}]}}),
            Value::Null,
        ),
        (
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "type": "Opaque",
                "data": {"password": "czNjcv9ldA==", "empty": ""}, "immutable": false}),
            Value::Null,
        ),
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
                "spec": {"ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"},
                    {"name": "h", "port": 81, "targetPort": "http"}],
                    "clusterIP": "10.0.0.10", "clusterIPs": ["10.0.0.10"], "type": "ClusterIP",
                    "selector": {"app": "web"}}}),
            Value::Null,
        ),
        (
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "e", "namespace": "default"},
                "eventTime": "2025-11-29T14:00:00.123456Z", "reportingController": "x",
                "reportingInstance": "y", "action": "Scheduled", "reason": "Scheduled", "type": "Normal",
                "regarding": {"kind": "Pod", "name": "web-0", "namespace": "default"}}),
            Value::Null,
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "r"},
                "revision": 3, "data": {"spec": {"template": {"x": [1, 2]}}}}),
            Value::Null,
        ),
        (
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                    "nodeInfo": {"kubeletVersion": "v1.32.0", "architecture": "amd64"}}}),
            Value::Null,
        ),
    ];
    for (obj, want) in objects {
        let want = if want.is_null() { obj.clone() } else { want };
        let doc = encode(&obj).unwrap_or_else(|e| panic!("{e}: {obj}"));
        let back = decode(&doc).expect("decodes");
        assert_eq!(back, want);
    }
}

/// A ConfigMap's document is byte for byte what prost writes for the same message (its fields
/// are declared in field-number order, so prost's order is Go's).
#[test]
fn a_config_map_is_what_prost_writes() {
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "default", "labels": {"b": "2", "a": "1"},
            "creationTimestamp": "2025-11-29T14:00:00Z"},
        "data": {"z": "last", "k": "v"}, "binaryData": {"bin": "AAEC"}, "immutable": true});
    let cm = core::ConfigMap {
        metadata: Some(meta::ObjectMeta {
            name: s("cm"),
            namespace: s("default"),
            creation_timestamp: Some(meta::Time {
                seconds: Some(1_764_424_800),
                nanos: Some(0),
            }),
            labels: [("a".into(), "1".into()), ("b".into(), "2".into())].into(),
            ..Default::default()
        }),
        data: [("k".into(), "v".into()), ("z".into(), "last".into())].into(),
        binary_data: [("bin".into(), vec![0, 1, 2])].into(),
        immutable: Some(true),
    };
    let doc = encode(&obj).expect("encodes");
    assert_eq!(doc, envelope("v1", "ConfigMap", cm.encode_to_vec()));
}

/// prost reads what the encoder wrote as the same object the JSON describes.
#[test]
fn prost_decodes_what_the_encoder_wrote() {
    let doc = encode(&pod()).expect("encodes");
    let (api_version, kind, raw) = unwrap(&doc);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "Pod"));
    let p = core::Pod::decode(raw.as_slice()).expect("prost decodes Pod");
    let m = p.metadata.expect("metadata");
    assert_eq!(m.name.as_deref(), Some("web-0"));
    assert_eq!(m.resource_version.as_deref(), Some("42"));
    assert_eq!(m.labels.get("tier").map(String::as_str), Some("fe"));
    assert_eq!(
        m.creation_timestamp,
        Some(meta::Time {
            seconds: Some(1_764_424_800),
            nanos: Some(0)
        })
    );
    let owner = &m.owner_references[0];
    assert_eq!(
        (owner.controller, owner.kind.as_deref()),
        (Some(true), Some("ReplicaSet"))
    );
    let fields = m.managed_fields[0].fields_v1.as_ref().and_then(|f| f.raw.clone());
    assert_eq!(
        serde_json::from_slice::<Value>(&fields.unwrap_or_default()).expect("JSON"),
        json!({"f:metadata": {"f:labels": {"f:app": {}}}})
    );
    let spec = p.spec.expect("spec");
    assert_eq!(spec.priority, Some(-5));
    assert_eq!(spec.termination_grace_period_seconds, Some(0));
    assert_eq!(spec.host_network, Some(true));
    let c = &spec.containers[0];
    assert_eq!(c.command, ["sh", "-c"]);
    let res = c.resources.as_ref().expect("resources");
    assert_eq!(res.requests.get("cpu"), Some(&Quantity { string: s("100m") }));
    assert_eq!(res.limits.get("cpu"), Some(&Quantity { string: s("1") }));
    let probe = c.readiness_probe.as_ref().and_then(|p| p.handler.as_ref());
    assert_eq!(
        probe
            .and_then(|h| h.http_get.as_ref())
            .and_then(|g| g.port.clone()),
        Some(IntOrString {
            r#type: Some(1),
            int_val: Some(0),
            str_val: s("http")
        })
    );
    let env_ref = c.env[0]
        .value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
        .expect("configMapKeyRef");
    assert_eq!(
        env_ref
            .local_object_reference
            .as_ref()
            .and_then(|r| r.name.as_deref()),
        Some("cm"),
        "inlined Go structs are their own message"
    );
    let volume = &spec.volumes[1].volume_source.as_ref().expect("volumeSource");
    assert_eq!(volume.config_map.as_ref().and_then(|c| c.default_mode), Some(420));
    assert!(
        spec.volumes[0]
            .volume_source
            .as_ref()
            .is_some_and(|v| v.empty_dir.is_some())
    );
    let status = p.status.expect("status");
    assert_eq!(status.container_statuses[0].restart_count, Some(2));
    assert_eq!(status.phase.as_deref(), Some("Running"));

    // A Deployment with an IntOrString 0 and replicas 0.
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 0, "strategy": {"rollingUpdate": {"maxUnavailable": 0}}}});
    let (_, _, raw) = unwrap(&encode(&dep).expect("encodes"));
    let d = apps::Deployment::decode(raw.as_slice()).expect("prost decodes");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(0));
    assert_eq!(
        spec.strategy
            .and_then(|s| s.rolling_update)
            .and_then(|r| r.max_unavailable),
        Some(IntOrString {
            r#type: Some(0),
            int_val: Some(0),
            str_val: s("")
        })
    );
}

#[test]
fn statuses_lists_and_watch_frames_decode_with_prost() {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "pods \"x\" not found", "reason": "NotFound", "code": 404,
        "details": {"name": "x", "kind": "pods", "causes": [{"reason": "FieldValueInvalid", "field": "spec"}]}});
    let (api_version, kind, raw) = unwrap(&encode(&status).expect("encodes"));
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "Status"));
    let st = meta::Status::decode(raw.as_slice()).expect("prost decodes Status");
    assert_eq!(st.code, Some(404));
    assert_eq!(st.reason.as_deref(), Some("NotFound"));
    assert_eq!(
        st.details.and_then(|d| d.causes[0].field.clone()).as_deref(),
        Some("spec")
    );

    let list = ListEncoder::new("v1", "Pod").expect("pods have a message");
    let items: Vec<Vec<u8>> = ["a", "b"]
        .iter()
        .map(|n| {
            let mut p = pod();
            p["metadata"]["name"] = json!(n);
            list.item(&p).expect("encodes")
        })
        .collect();
    let size = items.iter().map(|i| ListEncoder::item_size(i.len())).sum();
    let mut doc = list.head("77", Some("next"), size);
    for i in &items {
        ListEncoder::write_item(i, &mut doc);
    }
    ListEncoder::tail(&mut doc);
    let (api_version, kind, raw) = unwrap(&doc);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "PodList"));
    let pods = core::PodList::decode(raw.as_slice()).expect("prost decodes PodList");
    let meta = pods.metadata.expect("metadata");
    assert_eq!(
        (meta.resource_version.as_deref(), meta.r#continue.as_deref()),
        (Some("77"), Some("next"))
    );
    let names: Vec<_> = pods
        .items
        .iter()
        .filter_map(|p| p.metadata.as_ref()?.name.as_deref())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(list.item(&json!({"metadata": {"bogus": 1}})).is_err());

    let frame = watch_frame_of("MODIFIED", &pod()).expect("encodes");
    let len = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
    assert_eq!(len, frame.len() - 4);
    let ev = meta::WatchEvent::decode(&frame[4..]).expect("prost decodes WatchEvent");
    assert_eq!(ev.r#type.as_deref(), Some("MODIFIED"));
    let (_, kind, raw) = unwrap(&ev.object.and_then(|o| o.raw).expect("raw"));
    assert_eq!(kind, "Pod");
    assert!(core::Pod::decode(raw.as_slice()).is_ok());
}

#[test]
fn objects_without_a_protobuf_form_are_refused() {
    let mut p = pod();
    p["spec"]["containers"][0]["colour"] = json!("red");
    assert_eq!(
        encode(&p),
        Err(EncodeError::UnknownField {
            message: "k8s.io.api.core.v1.Container",
            path: "spec.containers[0].colour".into()
        })
    );
    // The lenient encoder leaves the field out.
    let doc = encode_lenient(&p).expect("lenient");
    assert_eq!(
        decode(&doc).expect("decodes")["spec"]["containers"][0].get("colour"),
        None
    );
    let mut p = pod();
    p["spec"]["priority"] = json!("high");
    assert!(matches!(encode(&p), Err(EncodeError::Type { path, .. }) if path == "spec.priority"));
    let mut p = pod();
    p["metadata"]["creationTimestamp"] = json!("yesterday");
    assert!(matches!(encode(&p), Err(EncodeError::Value { .. })));
    assert!(matches!(
        encode(&json!({"apiVersion": "v1", "kind": "Gadget"})),
        Err(EncodeError::UnknownKind { .. })
    ));
    assert_eq!(varint_len(0), 1);
    assert_eq!(varint_len(127), 1);
    assert_eq!(varint_len(128), 2);
    assert_eq!(varint_len(u64::MAX), 10);
}
