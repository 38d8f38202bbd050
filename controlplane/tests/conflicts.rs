//! Controllers under conflicting input, through `controlplane serve` with hollow nodes and the
//! real kubectl (issue "Bad input"): two Deployments whose selectors overlap, two ReplicaSets
//! after the same pods, a pod-template-hash collision with a set that is not the Deployment's,
//! and a Job pod deleted by hand. Each gets upstream's behaviour, never an unbounded loop.

use std::path::Path;

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

fn cluster() -> TestCluster {
    TestCluster::start(bin(), &[], &[("node", 2, &[])])
}

/// A Deployment `name` of `replicas` pods labelled `app: <app>` (its selector too).
fn deployment(name: &str, app: &str, replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  \
         selector:\n    matchLabels:\n      app: {app}\n  template:\n    metadata:\n      labels:\n        app: {app}\n    \
         spec:\n      containers:\n      - name: app\n        image: {image}\n"
    )
}

/// A ReplicaSet `name` of `replicas` pods selected by `app: <app>`.
fn replica_set(name: &str, app: &str, replicas: u32, extra_labels: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: {name}\n  labels:\n    app: {app}\n{extra_labels}spec:\n  \
         replicas: {replicas}\n  selector:\n    matchLabels:\n      app: {app}\n{extra_selector}  template:\n    metadata:\n      \
         labels:\n        app: {app}\n{extra_template}    spec:\n      containers:\n      - name: app\n        image: other\n",
        extra_selector = extra_labels.replace("    ", "      "),
        extra_template = extra_labels.replace("    ", "        "),
    )
}

/// `owner-kind/owner-name` of each pod labelled `app=<app>`, sorted (terminating pods left out).
fn pod_owners(c: &TestCluster, app: &str) -> Vec<String> {
    let out = c.jsonpath(
        &["pods", "-l", &format!("app={app}")],
        "{range .items[*]}{.metadata.deletionTimestamp}|{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
    );
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix('|'))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn deployments_with_overlapping_selectors_keep_to_their_own_sets() {
    let c = cluster();
    c.apply(&deployment("a", "shared", 2, "busybox:1"));
    c.apply(&deployment("b", "shared", 2, "busybox:2"));
    for d in ["a", "b"] {
        c.wait_for(&["deploy", d], "{.status.availableReplicas}", |v| v == "2");
    }
    // Each Deployment owns one set, each set two pods: nobody adopted the other's.
    let sets = c.jsonpath(
        &["rs", "-l", "app=shared"],
        "{range .items[*]}{.metadata.ownerReferences[0].name}={.status.replicas} {end}",
    );
    let mut sets: Vec<&str> = sets.split_whitespace().collect();
    sets.sort();
    assert_eq!(sets, ["a=2", "b=2"]);
    assert_eq!(pod_owners(&c, "shared").len(), 4);
    // Scaling one to zero leaves the other's pods alone.
    c.kubectl(&["scale", "deploy/a", "--replicas=0"]);
    c.wait_for(&["deploy", "a"], "{.status.replicas}", |v| {
        v.is_empty() || v == "0"
    });
    c.wait_for(&["deploy", "b"], "{.status.availableReplicas}", |v| v == "2");
    let owners = pod_owners(&c, "shared");
    assert_eq!(owners.len(), 2, "{owners:?}");
    assert!(
        owners.iter().all(|o| o.starts_with("ReplicaSet/b-")),
        "{owners:?}"
    );
}

#[test]
fn a_replica_set_does_not_take_pods_another_controller_owns() {
    let c = cluster();
    c.apply(&replica_set("first", "web", 1, ""));
    c.wait_for(&["rs", "first"], "{.status.readyReplicas}", |v| v == "1");
    c.apply(&replica_set("second", "web", 2, ""));
    c.wait_for(&["rs", "second"], "{.status.readyReplicas}", |v| v == "2");
    assert_eq!(
        pod_owners(&c, "web"),
        ["ReplicaSet/first", "ReplicaSet/second", "ReplicaSet/second"]
    );
    c.kubectl(&["scale", "rs/second", "--replicas=0"]);
    c.wait_for(&["rs", "second"], "{.status.replicas}", |v| v == "0");
    assert_eq!(pod_owners(&c, "web"), ["ReplicaSet/first"]);
    assert_eq!(c.jsonpath(&["rs", "first"], "{.status.replicas}"), "1");
}

/// CTL-5: a set already holding the name `<deployment>-<hash>` with another template makes the
/// Deployment raise `collisionCount` and name its set with the new hash.
#[test]
fn a_hash_collision_raises_the_collision_count() {
    let c = cluster();
    c.apply(&deployment("web", "web", 1, "busybox:1"));
    c.wait_for(&["deploy", "web"], "{.status.availableReplicas}", |v| v == "1");
    let first = c.jsonpath(&["rs", "-l", "app=web"], "{.items[0].metadata.name}");
    let hash = first.trim_start_matches("web-").to_string();
    c.kubectl(&["delete", "deploy", "web", "--wait=true"]);
    c.wait_for(
        &["rs", "-l", "app=web"],
        "{.items[*].metadata.name}",
        str::is_empty,
    );
    // Someone else's set under the name the Deployment will want, with another template.
    let squatter = replica_set(&first, "web", 0, &format!("    pod-template-hash: {hash}\n"));
    c.apply(&squatter);
    c.apply(&deployment("web", "web", 1, "busybox:1"));
    c.wait_for(&["deploy", "web"], "{.status.collisionCount}", |v| v == "1");
    c.wait_for(&["deploy", "web"], "{.status.availableReplicas}", |v| v == "1");
    let sets = c.jsonpath(
        &["rs", "-l", "app=web"],
        "{range .items[*]}{.metadata.name}={.spec.replicas}={.spec.template.spec.containers[0].image} {end}",
    );
    let new: Vec<&str> = sets
        .split_whitespace()
        .filter(|s| s.ends_with("=1=busybox:1"))
        .collect();
    assert_eq!(new.len(), 1, "{sets}");
    assert!(!new[0].starts_with(&format!("{first}=")), "{sets}");
    // The squatter is never given the Deployment's pods.
    assert!(sets.contains(&format!("{first}=0=other")), "{sets}");
}

/// A running Job pod deleted by hand counts as failed and is replaced (finalizer-tracked pods;
/// `podReplacementPolicy` TerminatingOrFailed by default).
#[test]
fn a_job_pod_deleted_by_hand_counts_as_failed_and_is_replaced() {
    let c = cluster();
    c.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: work\nspec:\n  template:\n    spec:\n      \
         restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox\n",
    );
    let pod = c.wait_for(
        &["pods", "-l", "job-name=work"],
        "{range .items[?(@.status.phase==\"Running\")]}{.metadata.name}{end}",
        |v| !v.is_empty(),
    );
    c.kubectl(&["delete", "pod", &pod, "--wait=false"]);
    c.wait_for(&["job", "work"], "{.status.failed}", |v| v == "1");
    let replacement = c.wait_for(
        &["pods", "-l", "job-name=work"],
        "{range .items[?(@.status.phase==\"Running\")]}{.metadata.name} {end}",
        |v| !v.trim().is_empty() && !v.contains(&pod),
    );
    assert_ne!(replacement.trim(), pod);
    assert_eq!(c.jsonpath(&["job", "work"], "{.status.active}"), "1");
}
