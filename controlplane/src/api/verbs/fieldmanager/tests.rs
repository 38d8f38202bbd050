use serde_json::json;

use super::fieldset::Step;
use super::*;

fn deploy() -> Type {
    Type::of_kind("apps/v1", "Deployment")
}

fn writer(manager: &str) -> Writer<'_> {
    Writer {
        manager,
        api_version: "apps/v1".into(),
        scope: Scope::Main {
            status_is_separate: true,
        },
        now: "2026-11-29T17:00:00Z",
    }
}

fn config(replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "nginx", "image": image, "ports": [{"containerPort": 80}]}]}}
        }
    })
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or_default().into(),
                        e["operation"].as_str().unwrap_or_default().into(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn create_records_fields_v1() {
    let mut obj = config(2, "nginx:1.26");
    obj["metadata"]["uid"] = json!("u");
    obj["status"] = json!({"replicas": 0});
    record_update(deploy(), None, &mut obj, writer("kubectl-create"));
    let entries = obj["metadata"]["managedFields"].as_array().expect("entries");
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(
        (e["manager"].as_str(), e["operation"].as_str()),
        (Some("kubectl-create"), Some("Update"))
    );
    assert_eq!(
        (e["apiVersion"].as_str(), e["fieldsType"].as_str()),
        (Some("apps/v1"), Some("FieldsV1"))
    );
    assert_eq!(
        e["fieldsV1"],
        json!({
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {
                "f:replicas": {},
                "f:selector": {"f:matchLabels": {"f:app": {}}},
                "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"nginx\"}": {
                        ".": {}, "f:image": {}, "f:name": {},
                        "f:ports": {"k:{\"containerPort\":80}": {".": {}, "f:containerPort": {}}}
                    }}}
                }
            }
        })
    );
    // Reading the entries back gives the same set.
    let again = read_entries(&obj, false);
    assert_eq!(to_fields_v1(&again[0].fields), e["fieldsV1"]);
}

#[test]
fn apply_conflicts_force_and_shared_ownership() {
    let a = apply(
        deploy(),
        &Value::Null,
        &config(2, "nginx:1.26"),
        false,
        writer("alice"),
    )
    .expect("first apply");
    assert_eq!(managers(&a), [("alice".into(), "Apply".into())]);
    // The same values from another manager: shared, no conflict.
    let b = apply(deploy(), &a, &config(2, "nginx:1.26"), false, writer("bob")).expect("same values");
    assert_eq!(managers(&b).len(), 2);
    // A different replica count: conflict with alice (an Apply manager: no "using").
    let err = apply(deploy(), &b, &config(3, "nginx:1.26"), false, writer("carol")).expect_err("conflict");
    assert_eq!((err.code, err.reason), (409, "Conflict"));
    assert_eq!(
        err.message,
        "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.replicas\nconflicts with \"bob\":\n- .spec.replicas"
    );
    let causes = &err.details.as_ref().expect("details")["causes"];
    assert_eq!(
        causes[0],
        json!({"type": "FieldManagerConflict", "message": "conflict with \"alice\"", "field": ".spec.replicas"})
    );
    // Forced: carol takes .spec.replicas from both.
    let c = apply(deploy(), &b, &config(3, "nginx:1.26"), true, writer("carol")).expect("forced");
    assert_eq!(c["spec"]["replicas"], 3);
    for e in read_entries(&c, false) {
        let owns = e
            .fields
            .contains(&vec![Step::Field("spec".into()), Step::Field("replicas".into())]);
        assert_eq!(owns, e.manager == "carol", "{}", e.manager);
    }
    // An Update manager is named with its API version; container fields print with their key.
    let mut scaled = c.clone();
    scaled["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    record_update(deploy(), Some(&c), &mut scaled, writer("kubectl-set"));
    let err = apply(
        deploy(),
        &scaled,
        &config(3, "nginx:1.26"),
        false,
        writer("alice"),
    )
    .expect_err("conflict");
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-set\" using apps/v1: .spec.template.spec.containers[name=\"nginx\"].image"
    );
}

#[test]
fn apply_removes_what_the_manager_stopped_applying() {
    let mut cfg = config(1, "nginx");
    cfg["metadata"]["labels"] = json!({"app": "web", "tier": "fe", "team": "x"});
    let a = apply(deploy(), &Value::Null, &cfg, false, writer("alice")).expect("apply");
    // bob also sets team (same value: shared).
    let mut bob_cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"team": "x"}}});
    let b = apply(deploy(), &a, &bob_cfg, false, writer("bob")).expect("bob");
    cfg["metadata"]["labels"] = json!({"app": "web"});
    let again = apply(deploy(), &b, &cfg, false, writer("alice")).expect("re-apply");
    assert_eq!(
        again["metadata"]["labels"],
        json!({"app": "web", "team": "x"}),
        "tier removed, team kept for bob"
    );
    // bob drops team too: now nobody owns it and it goes.
    bob_cfg["metadata"]["labels"] = json!({});
    let last = apply(deploy(), &again, &bob_cfg, false, writer("bob")).expect("bob again");
    assert_eq!(last["metadata"]["labels"], json!({"app": "web"}));
}

#[test]
fn apply_merges_keyed_lists_by_the_types_keys() {
    let a = apply(
        deploy(),
        &Value::Null,
        &config(1, "nginx"),
        false,
        writer("alice"),
    )
    .expect("apply");
    let sidecar = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [{"name": "log", "image": "busybox"}]}}}});
    let b = apply(deploy(), &a, &sidecar, false, writer("bob")).expect("bob");
    let names: Vec<&str> = b["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["nginx", "log"]);
    // bob withdraws his container: only it goes.
    let none = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}});
    let c = apply(deploy(), &b, &none, false, writer("bob")).expect("withdraw");
    assert_eq!(
        c["spec"]["template"]["spec"]["containers"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(c["spec"]["template"]["spec"]["containers"][0]["name"], "nginx");
}

#[test]
fn updates_take_changed_fields_from_others() {
    let a = apply(
        deploy(),
        &Value::Null,
        &config(2, "nginx"),
        false,
        writer("alice"),
    )
    .expect("apply");
    let mut scaled = a.clone();
    scaled["spec"]["replicas"] = json!(5);
    record_update(deploy(), Some(&a), &mut scaled, writer("kubectl-scale"));
    let entries = read_entries(&scaled, false);
    let replicas = vec![Step::Field("spec".into()), Step::Field("replicas".into())];
    let owner: Vec<&str> = entries
        .iter()
        .filter(|e| e.fields.contains(&replicas))
        .map(|e| e.manager.as_str())
        .collect();
    assert_eq!(owner, ["kubectl-scale"]);
    // A client that clears managedFields clears them.
    let mut cleared = scaled.clone();
    cleared["metadata"]["managedFields"] = json!([]);
    record_update(deploy(), Some(&scaled), &mut cleared, writer("x"));
    assert!(cleared["metadata"].get("managedFields").is_none());
}

/// A secondary list key the server defaults (a Service port's protocol) does not make a second
/// item on the next apply, and a change to that item's fields conflicts with its Update owner.
#[test]
fn defaulted_secondary_keys_name_the_same_item() {
    let svc = Type::of_kind("v1", "Service");
    let w = |m| Writer {
        api_version: "v1".into(),
        ..writer(m)
    };
    let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
    let mut live = apply(svc, &Value::Null, &cfg, false, w("alice")).expect("apply");
    live["spec"]["ports"][0]["protocol"] = json!("TCP"); // what admission defaults
    let again = apply(svc, &live, &cfg, false, w("alice")).expect("re-apply");
    assert_eq!(
        again["spec"]["ports"],
        json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}])
    );
    let mut edited = again.clone();
    edited["spec"]["ports"][0]["targetPort"] = json!(9090);
    record_update(svc, Some(&again), &mut edited, w("kubectl-edit"));
    let err = apply(svc, &edited, &cfg, false, w("alice")).expect_err("conflict");
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1: .spec.ports[port=80].targetPort"
    );
    // Two items with one port number are told apart by the protocol.
    let dns = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"},
        "spec": {"ports": [{"port": 53, "protocol": "UDP", "name": "dns"}, {"port": 53, "protocol": "TCP", "name": "dns-tcp"}]}});
    let d = apply(svc, &Value::Null, &dns, false, w("alice")).expect("apply");
    let d2 = apply(svc, &d, &dns, false, w("alice")).expect("re-apply");
    assert_eq!(d2["spec"]["ports"].as_array().map(Vec::len), Some(2));
}

/// The one-walk change detection agrees with comparing the values at every path.
#[test]
fn one_walk_finds_the_changes_path_comparison_finds() {
    use super::fieldset::changed;
    let pod = Type::of_kind("v1", "Pod");
    let base = json!({"metadata": {"name": "p", "labels": {"a": "1"}, "finalizers": ["x", "y"]},
        "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                                 "env": [{"name": "E", "value": "1"}]}],
                 "nodeSelector": {"zone": "a"}, "tolerations": [{"key": "k", "operator": "Exists"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}});
    let mut variants = vec![base.clone(), json!({})];
    for (path, v) in [
        ("/metadata/labels/a", json!("2")),
        ("/metadata/finalizers", json!(["y", "z"])),
        ("/spec/containers/0/image", json!("j")),
        (
            "/spec/containers/0/env",
            json!([{"name": "E", "value": "2"}, {"name": "F"}]),
        ),
        (
            "/spec/containers/0/ports",
            json!([{"containerPort": 80, "protocol": "UDP"}, {"containerPort": 80, "protocol": "TCP"}]),
        ),
        (
            "/spec/containers",
            json!([{"name": "d", "image": "i"}, {"image": "nameless"}]),
        ),
        ("/spec/nodeSelector", json!({})),
        ("/spec/tolerations", json!("not a list")),
        ("/status/conditions/0/status", json!("False")),
        ("/status", json!({"phase": "Failed"})),
    ] {
        let mut o = base.clone();
        if let Some(at) = o.pointer_mut(path) {
            *at = v;
        }
        variants.push(o);
    }
    for scope in [
        Scope::Main {
            status_is_separate: true,
        },
        Scope::Status,
    ] {
        for old in &variants {
            for new in &variants {
                let (fields, changes) = fields_and_changes(Some(old), new, pod, scope);
                assert_eq!(fields, fields_of(new, pod, scope));
                let expected: FieldSet = fields.iter().filter(|p| changed(old, new, p)).cloned().collect();
                assert_eq!(changes, expected, "{old} -> {new}");
            }
            let (fields, changes) = fields_and_changes(None, old, pod, scope);
            assert_eq!(changes, fields, "a create changes every field it sets");
        }
    }
}

/// The managedFields of `obj` as they come out when every entry is decoded and encoded again.
fn reencoded(obj: &Value) -> Value {
    let mut again = obj.clone();
    write_entries(&mut again, read_entries(obj, false));
    again["metadata"]["managedFields"].clone()
}

#[test]
fn untouched_entries_are_written_back_as_stored_and_changed_ones_encoded_again() {
    let mut obj = config(2, "nginx:1.26");
    record_update(deploy(), None, &mut obj, writer("kubectl-create"));
    let created = obj["metadata"]["managedFields"][0].clone();

    // Another manager changes the replicas: the creator's entry loses that field.
    let mut scaled = obj.clone();
    scaled["spec"]["replicas"] = json!(5);
    record_update(deploy(), Some(&obj), &mut scaled, writer("hpa"));
    assert_eq!(
        managers(&scaled),
        [
            ("kubectl-create".into(), "Update".into()),
            ("hpa".into(), "Update".into())
        ]
    );
    let creator = &scaled["metadata"]["managedFields"][0];
    assert_ne!(creator["fieldsV1"], created["fieldsV1"]);
    assert!(creator["fieldsV1"]["f:spec"].get("f:replicas").is_none());
    assert_eq!(scaled["metadata"]["managedFields"], reencoded(&scaled));

    // A third manager labels it: the two entries it does not touch come back exactly as stored.
    let mut labelled = scaled.clone();
    labelled["metadata"]["labels"]["tier"] = json!("front");
    record_update(deploy(), Some(&scaled), &mut labelled, writer("kubectl-label"));
    let before = scaled["metadata"]["managedFields"].as_array().expect("entries");
    let after = labelled["metadata"]["managedFields"].as_array().expect("entries");
    assert_eq!(after.len(), 3);
    assert_eq!(after[..2], before[..]);
    assert_eq!(
        after[2]["fieldsV1"]["f:metadata"]["f:labels"],
        json!({"f:tier": {}})
    );
    assert_eq!(labelled["metadata"]["managedFields"], reencoded(&labelled));

    // An update that sends the entries back as it read them (a controller's PUT) and takes the
    // image from the creator: the creator's entry loses it, the others stay.
    let mut updated = labelled.clone();
    updated["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    record_update(deploy(), Some(&labelled), &mut updated, writer("rollout"));
    let entries = updated["metadata"]["managedFields"].as_array().expect("entries");
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[1..3], after[1..3]);
    assert_ne!(entries[0]["fieldsV1"], after[0]["fieldsV1"]);
    assert_eq!(updated["metadata"]["managedFields"], reencoded(&updated));
}

#[test]
fn managed_fields_a_client_sends_are_encoded_again_not_kept() {
    let mut obj = config(2, "nginx:1.26");
    record_update(deploy(), None, &mut obj, writer("kubectl-create"));
    // The client sends the entry with a field the decoder does not know (no "f:" prefix).
    let mut sent = obj.clone();
    sent["metadata"]["managedFields"][0]["fieldsV1"]["bogus"] = json!({});
    sent["metadata"]["labels"]["tier"] = json!("front");
    record_update(deploy(), Some(&obj), &mut sent, writer("kubectl-label"));
    let creator = &sent["metadata"]["managedFields"][0];
    assert_eq!(creator["manager"], "kubectl-create");
    assert!(creator["fieldsV1"].get("bogus").is_none());
    assert_eq!(
        creator["fieldsV1"],
        obj["metadata"]["managedFields"][0]["fieldsV1"]
    );
}
