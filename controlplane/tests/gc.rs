//! Garbage collection and namespace lifecycle through `controlplane serve` with hollow nodes and
//! the real kubectl: cascading deletion in its three modes, a namespace holding objects of
//! several kinds emptied and removed (with upstream's conditions while content is held), and
//! what every namespace holds (`default` ServiceAccount, `kube-root-ca.crt`) coming back.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

fn cluster() -> TestCluster {
    TestCluster::start(bin(), &[], &[("node", 2, &[])])
}

fn replicaset(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: c\n        image: busybox\n"
    )
}

/// The names of the pods labelled `app=<app>`.
fn pods(c: &TestCluster, app: &str) -> Vec<String> {
    c.jsonpath(
        &["pods", "-l", &format!("app={app}")],
        "{range .items[*]}{.metadata.name}{\"\\n\"}{end}",
    )
    .lines()
    .map(str::to_string)
    .collect()
}

fn running(c: &TestCluster, app: &str, n: usize) -> Vec<String> {
    c.wait_for(
        &["pods", "-l", &format!("app={app}")],
        "{range .items[*]}{.status.phase}{\" \"}{end}",
        |p| p.split_whitespace().filter(|x| *x == "Running").count() == n,
    );
    pods(c, app)
}

fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(60), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn deleting_a_replicaset_in_the_three_cascade_modes() {
    let c = cluster();

    // Background (kubectl's default): the set goes at once, its pods after it.
    c.apply(&replicaset("bg", 3));
    running(&c, "bg", 3);
    c.kubectl(&["delete", "rs", "bg"]);
    wait_until("the background set's pods are gone", || pods(&c, "bg").is_empty());

    // Foreground: the set stays visible, terminating with `foregroundDeletion`, while a pod it
    // owns (held here by a finalizer) exists; then it goes.
    c.apply(&replicaset("fg", 2));
    let names = running(&c, "fg", 2);
    c.kubectl(&[
        "patch",
        "pod",
        &names[0],
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ]);
    c.kubectl(&["delete", "rs", "fg", "--cascade=foreground", "--wait=false"]);
    wait_until("the other pod is gone", || pods(&c, "fg").len() == 1);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        c.jsonpath(&["rs", "fg"], "{.metadata.finalizers}"),
        r#"["foregroundDeletion"]"#
    );
    assert!(
        !c.jsonpath(&["rs", "fg"], "{.metadata.deletionTimestamp}")
            .is_empty()
    );
    let rs = c.kubectl(&["get", "rs", "-o", "name"]);
    assert!(rs.contains("replicaset.apps/fg"), "{rs}");
    c.kubectl(&[
        "patch",
        "pod",
        &names[0],
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    wait_until("the foreground set is gone", || {
        !c.kubectl(&["get", "rs", "-o", "name"]).contains("fg")
    });
    assert!(pods(&c, "fg").is_empty());

    // Orphan: the set goes, its pods stay without owner references.
    c.apply(&replicaset("or", 2));
    let names = running(&c, "or", 2);
    c.kubectl(&["delete", "rs", "or", "--cascade=orphan"]);
    assert!(!c.kubectl(&["get", "rs", "-o", "name"]).contains("or"));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(pods(&c, "or"), names);
    assert_eq!(
        c.jsonpath(&["pods", "-l", "app=or"], "{.items[*].metadata.ownerReferences}"),
        ""
    );
}

#[test]
fn a_deleted_namespace_is_emptied_and_disappears() {
    let c = cluster();
    let t0 = Instant::now();
    c.kubectl(&["create", "namespace", "team"]);
    wait_until("the namespace's default account and CA", || {
        let got = c.kubectl(&["get", "sa,cm", "-n", "team", "-o", "name"]);
        got.contains("serviceaccount/default") && got.contains("configmap/kube-root-ca.crt")
    });
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "populated in {:?}",
        t0.elapsed()
    );
    let n = ["-n", "team"];
    let run = |args: &[&str]| c.kubectl(&[&n[..], args].concat());
    run(&["create", "deployment", "web", "--image=busybox", "--replicas=2"]);
    run(&["create", "service", "clusterip", "web", "--tcp=80:80"]);
    run(&["create", "configmap", "settings", "--from-literal=a=b"]);
    run(&["create", "secret", "generic", "token", "--from-literal=t=x"]);
    run(&["create", "job", "once", "--image=busybox"]);
    c.wait_for(
        &["pods", "-n", "team", "-l", "app=web"],
        "{range .items[*]}{.status.phase}{\" \"}{end}",
        |p| p.split_whitespace().filter(|x| *x == "Running").count() == 2,
    );
    // One object held by a finalizer keeps the namespace Terminating, with upstream's
    // conditions saying why.
    c.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  namespace: team\n  finalizers: [example.com/hold]\n",
    );
    c.kubectl(&["delete", "namespace", "team", "--wait=false"]);
    let cond = |t: &str| {
        format!(
            "{{.status.conditions[?(@.type==\"{t}\")].status}}|{{.status.conditions[?(@.type==\"{t}\")].reason}}|{{.status.conditions[?(@.type==\"{t}\")].message}}"
        )
    };
    c.wait_for(&["ns", "team"], &cond("NamespaceContentRemaining"), |v| {
        v == "True|SomeResourcesRemain|Some resources are remaining: configmaps. has 1 resource instances"
    });
    assert_eq!(
        c.jsonpath(&["ns", "team"], &cond("NamespaceFinalizersRemaining")),
        "True|SomeFinalizersRemain|Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
    );
    assert_eq!(
        c.jsonpath(&["ns", "team"], &cond("NamespaceDeletionDiscoveryFailure")),
        "False|ResourcesDiscovered|All resources successfully discovered"
    );
    assert_eq!(c.jsonpath(&["ns", "team"], "{.status.phase}"), "Terminating");
    let (ok, _, err) = c.kubectl_result(&["-n", "team", "create", "configmap", "late"], None);
    assert!(
        !ok && err.contains("unable to create new content in namespace team because it is being terminated"),
        "{err}"
    );
    let left = c.kubectl(&["get", "all,cm,secret,sa", "-n", "team", "-o", "name"]);
    assert_eq!(left.trim(), "configmap/held", "everything else is gone");
    run(&[
        "patch",
        "configmap",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    wait_until("the namespace is gone", || {
        let (ok, _, err) = c.kubectl_result(&["get", "namespace", "team"], None);
        !ok && err.contains("not found")
    });
}

#[test]
fn every_namespace_gets_back_its_account_and_ca() {
    let c = cluster();
    let ca = std::fs::read_to_string(c.dir.path().join("pki").join("ca.crt")).expect("cluster CA");
    let published = c.wait_for(&["cm", "kube-root-ca.crt"], "{.data.ca\\.crt}", |v| {
        v.contains("BEGIN CERTIFICATE")
    });
    assert_eq!(published.trim(), ca.trim());
    c.kubectl(&["delete", "configmap", "kube-root-ca.crt"]);
    let back = c.wait_for(&["cm", "kube-root-ca.crt"], "{.data.ca\\.crt}", |v| {
        v.contains("BEGIN CERTIFICATE")
    });
    assert_eq!(back, published);
    assert!(
        c.jsonpath(&["cm", "kube-root-ca.crt"], "{.metadata.annotations}")
            .contains("Contains a CA bundle that can be used to verify the kube-apiserver")
    );
    // Changed: corrected.
    c.kubectl(&[
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "--type=merge",
        "-p",
        r#"{"data":{"ca.crt":"forged","extra":"x"}}"#,
    ]);
    c.wait_for(&["cm", "kube-root-ca.crt"], "{.data}", |v| {
        v.contains("BEGIN CERTIFICATE") && !v.contains("extra")
    });
    c.kubectl(&["delete", "serviceaccount", "default"]);
    c.wait_for(&["sa", "default"], "{.metadata.name}", |v| v == "default");
}

/// References to owners that do not exist (never did, or another object now has the name) are
/// dangling: a dependent with only such owners is deleted, one that also has an existing owner
/// keeps it and loses the dangling reference; nothing with an existing owner is deleted.
#[test]
fn dangling_owner_references_are_collected() {
    let c = cluster();
    c.kubectl(&["create", "configmap", "owner"]);
    let uid = c.jsonpath(&["cm", "owner"], "{.metadata.uid}");
    let dependent = |name: &str, refs: &[(&str, &str)]| {
        let refs: Vec<String> = refs
            .iter()
            .map(|(owner, uid)| {
                format!(
                    "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"{owner}\",\"uid\":\"{uid}\"}}"
                )
            })
            .collect();
        c.apply(&format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"{name}\",\"ownerReferences\":[{}]}}}}",
            refs.join(",")
        ));
    };
    let missing = "00000000-0000-0000-0000-000000000001";
    dependent("kept", &[("owner", &uid)]);
    dependent("stale", &[("owner", missing)]);
    dependent("ghost", &[("nothere", missing)]);
    dependent("mixed", &[("owner", &uid), ("nothere", missing)]);
    wait_until("the dependents of missing owners are gone", || {
        let names = c.kubectl(&["get", "cm", "-o", "name"]);
        !names.contains("configmap/stale") && !names.contains("configmap/ghost")
    });
    c.wait_for(&["cm", "mixed"], "{.metadata.ownerReferences[*].name}", |v| {
        v == "owner"
    });
    std::thread::sleep(Duration::from_secs(1));
    let names = c.kubectl(&["get", "cm", "-o", "name"]);
    assert!(
        names.contains("configmap/kept") && names.contains("configmap/mixed"),
        "{names}"
    );
    // The owner goes: so do its dependents.
    c.kubectl(&["delete", "cm", "owner"]);
    wait_until("the owner's dependents are gone", || {
        let names = c.kubectl(&["get", "cm", "-o", "name"]);
        !names.contains("configmap/kept") && !names.contains("configmap/mixed")
    });
}
