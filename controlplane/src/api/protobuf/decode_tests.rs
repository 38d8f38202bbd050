//! The decoder against an independent encoder: `k8s-pb`'s prost bindings of the same types.

use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::json;

use super::*;

/// What kubectl puts on the wire: `k8s\0` + runtime.Unknown{typeMeta, raw}.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(unknown.encode_to_vec());
    out
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

/// Go writes non-pointer fields even when zero: a zero creationTimestamp, empty strings.
fn go_meta(name: &str, labels: &[(&str, &str)]) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: s(name),
        generate_name: s(""),
        namespace: s(""),
        resource_version: s(""),
        generation: Some(0),
        creation_timestamp: Some(meta::Time {
            seconds: Some(0),
            nanos: Some(0),
        }),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// `kubectl create deployment web --image=nginx --replicas=0` as Go encodes it.
#[test]
fn deployment_like_kubectl_create() {
    let labels = [("app", "web")];
    let dep = apps::Deployment {
        metadata: Some(go_meta("web", &labels)),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(0),
            selector: Some(meta::LabelSelector {
                match_labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                match_expressions: vec![],
            }),
            template: Some(core::PodTemplateSpec {
                metadata: Some(go_meta("", &labels)),
                spec: Some(core::PodSpec {
                    containers: vec![core::Container {
                        name: s("nginx"),
                        image: s("nginx"),
                        working_dir: s(""),
                        image_pull_policy: s(""),
                        stdin: Some(false),
                        resources: Some(core::ResourceRequirements::default()),
                        ..Default::default()
                    }],
                    restart_policy: s(""),
                    host_network: Some(false),
                    ..Default::default()
                }),
            }),
            strategy: Some(apps::DeploymentStrategy::default()),
            min_ready_seconds: Some(0),
            paused: Some(false),
            ..Default::default()
        }),
        status: Some(apps::DeploymentStatus {
            replicas: Some(0),
            ..Default::default()
        }),
    };
    let got = decode(&envelope("apps/v1", "Deployment", dep.encode_to_vec())).expect("decodes");
    assert_eq!(
        got,
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}]}
                },
                "strategy": {}
            },
            "status": {"replicas": 0}
        })
    );
}

/// Maps of bytes become base64, maps of strings stay strings, inlined Go structs are flattened,
/// Quantity, IntOrString and Time take their JSON forms, acronym field names are exact.
#[test]
fn special_types_and_names() {
    let secret = core::Secret {
        metadata: Some(go_meta("creds", &[])),
        data: [("password".to_string(), b"s3cr\xffet".to_vec())].into(),
        string_data: Default::default(),
        r#type: s("Opaque"),
        immutable: Some(false),
    };
    let got = decode(&envelope("v1", "Secret", secret.encode_to_vec())).expect("decodes");
    assert_eq!(got["data"], json!({"password": b64_bytes(b"s3cr\xffet")}));
    assert_eq!(got["immutable"], json!(false), "a pointer bool keeps its false");

    let svc = core::Service {
        metadata: Some(meta::ObjectMeta {
            name: s("web"),
            creation_timestamp: Some(meta::Time {
                seconds: Some(1_764_424_800),
                nanos: Some(0),
            }),
            ..Default::default()
        }),
        spec: Some(core::ServiceSpec {
            ports: vec![
                core::ServicePort {
                    name: s("80-8080"),
                    protocol: s("TCP"),
                    port: Some(80),
                    target_port: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(8080),
                        str_val: s(""),
                    }),
                    node_port: Some(0),
                    ..Default::default()
                },
                core::ServicePort {
                    name: s("http"),
                    port: Some(81),
                    target_port: Some(IntOrString {
                        r#type: Some(1),
                        int_val: Some(0),
                        str_val: s("http"),
                    }),
                    ..Default::default()
                },
            ],
            cluster_ip: s("10.0.0.10"),
            external_ips: vec!["192.0.2.1".into()],
            r#type: s("ClusterIP"),
            ..Default::default()
        }),
        status: None,
    };
    let got = decode(&envelope("v1", "Service", svc.encode_to_vec())).expect("decodes");
    assert_eq!(
        got["metadata"]["creationTimestamp"],
        json!("2025-11-29T14:00:00Z")
    );
    assert_eq!(
        got["spec"]["ports"],
        json!([
            {"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080},
            {"name": "http", "port": 81, "targetPort": "http"}
        ])
    );
    assert_eq!(got["spec"]["clusterIP"], json!("10.0.0.10"));
    assert_eq!(got["spec"]["externalIPs"], json!(["192.0.2.1"]));

    let pod = core::Pod {
        metadata: Some(go_meta("p", &[])),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: s("c"),
                image: s("busybox"),
                resources: Some(core::ResourceRequirements {
                    limits: [("memory".to_string(), Quantity { string: s("128Mi") })].into(),
                    ..Default::default()
                }),
                env: vec![core::EnvVar {
                    name: s("K"),
                    value_from: Some(core::EnvVarSource {
                        config_map_key_ref: Some(core::ConfigMapKeySelector {
                            local_object_reference: Some(core::LocalObjectReference { name: s("cm") }),
                            key: s("k"),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            volumes: vec![core::Volume {
                name: s("scratch"),
                volume_source: Some(core::VolumeSource {
                    empty_dir: Some(core::EmptyDirVolumeSource::default()),
                    ..Default::default()
                }),
            }],
            host_pid: Some(true),
            ..Default::default()
        }),
        status: Some(core::PodStatus {
            pod_ip: s("10.244.0.2"),
            start_time: Some(meta::Time {
                seconds: Some(1),
                nanos: Some(0),
            }),
            ..Default::default()
        }),
    };
    let got = decode(&envelope("v1", "Pod", pod.encode_to_vec())).expect("decodes");
    let c = &got["spec"]["containers"][0];
    assert_eq!(c["resources"], json!({"limits": {"memory": "128Mi"}}));
    assert_eq!(
        c["env"],
        json!([{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}])
    );
    assert_eq!(
        got["spec"]["volumes"],
        json!([{"name": "scratch", "emptyDir": {}}])
    );
    assert_eq!(got["spec"]["hostPID"], json!(true));
    assert_eq!(got["status"]["podIP"], json!("10.244.0.2"));
    assert_eq!(got["status"]["startTime"], json!("1970-01-01T00:00:01Z"));
}

/// Lists of scalars arrive packed or unpacked; both decode.
#[test]
fn packed_and_unpacked_repeated_scalars() {
    // Job podFailurePolicy rules[].onExitCodes.values: repeated int32, unpacked from prost.
    let req = k8s_pb::api::batch::v1::PodFailurePolicyOnExitCodesRequirement {
        container_name: s("main"),
        operator: s("In"),
        values: vec![1, 42],
    };
    let rule = k8s_pb::api::batch::v1::PodFailurePolicyRule {
        action: s("FailJob"),
        on_exit_codes: Some(req),
        on_pod_conditions: vec![],
    };
    let job = k8s_pb::api::batch::v1::Job {
        metadata: Some(go_meta("j", &[])),
        spec: Some(k8s_pb::api::batch::v1::JobSpec {
            pod_failure_policy: Some(k8s_pb::api::batch::v1::PodFailurePolicy { rules: vec![rule] }),
            ..Default::default()
        }),
        status: None,
    };
    let unpacked = job.encode_to_vec();
    let got = decode(&envelope("batch/v1", "Job", unpacked)).expect("decodes");
    let path = "/spec/podFailurePolicy/rules/0/onExitCodes/values";
    assert_eq!(got.pointer(path), Some(&json!([1, 42])));

    // The same list packed: field 3 of the requirement as one length-delimited run of varints.
    let mut packed_req = Vec::new();
    for (tag, v) in [(1u8, "main"), (2, "In")] {
        packed_req.push(tag << 3 | 2);
        packed_req.push(v.len() as u8);
        packed_req.extend(v.as_bytes());
    }
    packed_req.extend([3 << 3 | 2, 2, 1, 42]);
    let mut rule = vec![1 << 3 | 2, 7];
    rule.extend(b"FailJob");
    rule.push(2 << 3 | 2);
    rule.push(packed_req.len() as u8);
    rule.extend(&packed_req);
    let mut pfp = vec![1 << 3 | 2, rule.len() as u8];
    pfp.extend(rule);
    let spec_field = 11u8; // JobSpec.podFailurePolicy
    let mut spec = vec![spec_field << 3 | 2, pfp.len() as u8];
    spec.extend(pfp);
    let mut raw = vec![2 << 3 | 2, spec.len() as u8];
    raw.extend(spec);
    let got = decode(&envelope("batch/v1", "Job", raw)).expect("decodes");
    assert_eq!(got.pointer(path), Some(&json!([1, 42])));
}

#[test]
fn bad_input_is_refused() {
    let cm = core::ConfigMap {
        metadata: Some(go_meta("cm", &[])),
        data: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let good = envelope("v1", "ConfigMap", cm.encode_to_vec());
    assert_eq!(decode(&good).expect("decodes")["data"], json!({"k": "v"}));

    assert_eq!(decode(b"{\"kind\":\"Pod\"}"), Err(DecodeError::Magic));
    assert_eq!(decode(b"k8s\0"), Err(DecodeError::NoType));
    assert!(matches!(
        decode(&envelope("v1", "Gadget", vec![])),
        Err(DecodeError::UnknownKind { .. })
    ));
    assert!(matches!(
        decode(&envelope("apps/v1", "ConfigMap", vec![])),
        Err(DecodeError::UnknownKind { .. })
    ));
    // Every truncation of a valid body is an error or a smaller object, never a panic.
    for n in 0..good.len() {
        let _ = decode(&good[..n]);
    }
    assert_eq!(decode(&good[..good.len() - 1]), Err(DecodeError::Truncated));
    // Every single-byte corruption is handled without a panic.
    for i in 4..good.len() {
        for b in [0x00, 0x7f, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] = b;
            let _ = decode(&bad);
        }
    }
    // A string field sent as a varint.
    let raw = vec![1 << 3 | 2, 2, 1 << 3, 5];
    assert!(matches!(
        decode(&envelope("v1", "ConfigMap", raw)),
        Err(DecodeError::WireType { expected: 2, .. })
    ));
    // An over-long varint.
    let raw = [vec![1 << 3 | 2], vec![0xff; 11]].concat();
    assert_eq!(
        decode(&envelope("v1", "ConfigMap", raw)),
        Err(DecodeError::Varint)
    );
    // Invalid UTF-8 in a string.
    let raw = vec![1 << 3 | 2, 3, 1 << 3 | 2, 1, 0xff];
    assert!(matches!(
        decode(&envelope("v1", "ConfigMap", raw)),
        Err(DecodeError::Utf8 { .. })
    ));
    // A compressed body is not supported.
    let mut unknown = Unknown::decode(&good[4..]).expect("prost decodes");
    unknown.content_encoding = s("gzip");
    let body = [MAGIC.to_vec(), unknown.encode_to_vec()].concat();
    assert_eq!(decode(&body), Err(DecodeError::ContentEncoding("gzip".into())));
}

#[test]
fn go_durations() {
    assert_eq!(go_duration(0), "0s");
    assert_eq!(go_duration(1_500), "1.5µs");
    assert_eq!(go_duration(2_000_000), "2ms");
    assert_eq!(go_duration(90_000_000_000), "1m30s");
    assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
    assert_eq!(go_duration(-1_500_000_000), "-1.5s");
}
