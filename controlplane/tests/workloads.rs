//! The StatefulSet and DaemonSet controllers through `controlplane serve` with hollow nodes and
//! the real kubectl: ordered creation with claims, rolling updates (partition, undo), retention
//! of claims, one daemon pod per eligible node as nodes come, change and go.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

fn cluster(groups: &[(&str, usize, &[&str])]) -> TestCluster {
    TestCluster::start(bin(), &[], groups)
}

const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: None
  selector:
    app: web
  ports:
  - port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: nginx
        image: nginx:1
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 1Gi
"#;

/// The messages of `object`'s events with `reason`, oldest first (event names carry the time).
fn messages(c: &TestCluster, object: &str, reason: &str) -> Vec<String> {
    let sel = format!("involvedObject.name={object},reason={reason}");
    c.jsonpath(
        &["events", "--field-selector", &sel],
        "{range .items[*]}{.message}{\"\\n\"}{end}",
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// `kubectl rollout status` until it succeeds (60 s).
fn rollout_status(c: &TestCluster, what: &str) -> String {
    let (ok, out, err) = c.kubectl_result(&["rollout", "status", what, "--timeout=60s"], None);
    if !ok {
        // What the controllers saw last: the object's status and the pods.
        let status = c.jsonpath(&[what], "{.metadata.generation} {.status}");
        panic!(
            "rollout status {what}: {out}{err}\nstatus: {status}\n{}",
            c.pods_summary()
        );
    }
    out
}

fn images(c: &TestCluster, selector: &str) -> String {
    c.jsonpath(
        &["pods", "-l", selector, "--sort-by=.metadata.name"],
        "{range .items[*]}{.metadata.name}={.spec.containers[0].image} {end}",
    )
}

#[test]
fn statefulset_comes_up_in_order_with_claims_and_rolls_from_the_highest_ordinal() {
    let c = cluster(&[("node", 3, &[])]);
    c.apply(WEB);
    c.wait_for(&["sts", "web"], "{.status.readyReplicas}", |r| r == "3");
    // 0, 1, 2 in order, each claim before its pod, each pod after the previous was Ready.
    let created = messages(&c, "web", "SuccessfulCreate");
    assert_eq!(
        created,
        [
            "create Claim data-web-0 Pod web-0 in StatefulSet web success",
            "create Pod web-0 in StatefulSet web successful",
            "create Claim data-web-1 Pod web-1 in StatefulSet web success",
            "create Pod web-1 in StatefulSet web successful",
            "create Claim data-web-2 Pod web-2 in StatefulSet web success",
            "create Pod web-2 in StatefulSet web successful",
        ]
    );
    for (prev, next) in [("web-0", "web-1"), ("web-1", "web-2")] {
        let ready = c.jsonpath(
            &["pod", prev],
            "{.status.conditions[?(@.type==\"Ready\")].lastTransitionTime}",
        );
        let born = c.jsonpath(&["pod", next], "{.metadata.creationTimestamp}");
        assert!(
            ready <= born,
            "{next} created at {born} before {prev} was ready at {ready}"
        );
    }
    assert_eq!(
        c.jsonpath(&["pvc"], "{.items[*].metadata.name}"),
        "data-web-0 data-web-1 data-web-2"
    );
    assert_eq!(
        c.jsonpath(
            &["pod", "web-1"],
            "{.spec.hostname}.{.spec.subdomain} {.spec.volumes[0].persistentVolumeClaim.claimName}"
        ),
        "web-1.web data-web-1"
    );
    assert_eq!(
        c.jsonpath(&["pod", "web-2"], "{.metadata.labels.statefulset\\.kubernetes\\.io/pod-name} {.metadata.labels.apps\\.kubernetes\\.io/pod-index}"),
        "web-2 2"
    );
    let table = c.kubectl(&["get", "sts", "web", "-o", "wide"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]);
    assert!(table.contains("3/3") && table.contains("nginx:1"), "{table}");
    assert!(
        rollout_status(&c, "sts/web")
            .contains("partitioned roll out complete: 3 new pods have been updated..."),
    );
    let rev1 = c.jsonpath(&["sts", "web"], "{.status.currentRevision}");
    assert_eq!(
        c.jsonpath(&["pod", "web-0"], "{.metadata.labels.controller-revision-hash}"),
        rev1
    );
    let uids_before = c.jsonpath(&["pods", "-l", "app=web"], "{.items[*].metadata.uid}");

    // An image update replaces 2, 1, 0, each under its own name with a new uid.
    c.kubectl(&["set", "image", "sts/web", "nginx=nginx:2"]);
    rollout_status(&c, "sts/web");
    c.wait_for(
        &["sts", "web"],
        "{.status.updatedReplicas}/{.status.readyReplicas}",
        |r| r == "3/3",
    );
    assert_eq!(
        images(&c, "app=web"),
        "web-0=nginx:2 web-1=nginx:2 web-2=nginx:2 "
    );
    assert_eq!(
        messages(&c, "web", "SuccessfulDelete"),
        [
            "delete Pod web-2 in StatefulSet web successful",
            "delete Pod web-1 in StatefulSet web successful",
            "delete Pod web-0 in StatefulSet web successful",
        ]
    );
    let uids_after = c.jsonpath(&["pods", "-l", "app=web"], "{.items[*].metadata.uid}");
    for u in uids_after.split_whitespace() {
        assert!(!uids_before.contains(u), "pod {u} was not replaced");
    }
    let rev2 = c.wait_for(&["sts", "web"], "{.status.currentRevision}", |r| r != rev1);
    assert_eq!(c.jsonpath(&["sts", "web"], "{.status.updateRevision}"), rev2);
    let history = c.kubectl(&["rollout", "history", "sts/web"]);
    assert!(
        history.contains("REVISION") && history.contains("1 ") && history.contains("2 "),
        "{history}"
    );
    let revisions = c.kubectl(&["get", "controllerrevisions"]);
    let header: Vec<&str> = revisions
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "CONTROLLER", "REVISION", "AGE"]);
    assert!(
        revisions.contains(&rev2) && revisions.contains("statefulset.apps/web"),
        "{revisions}"
    );

    // Undo: the first template again (revision 1 renumbered 3), all pods back on nginx:1.
    let out = c.kubectl(&["rollout", "undo", "sts/web"]);
    assert!(out.contains("rolled back"), "{out}");
    c.wait_for(&["sts", "web"], "{.status.currentRevision}", |r| r == rev1);
    assert_eq!(
        images(&c, "app=web"),
        "web-0=nginx:1 web-1=nginx:1 web-2=nginx:1 "
    );
    assert_eq!(c.jsonpath(&["controllerrevision", &rev1], "{.revision}"), "3");

    // Partition 2: only web-2 takes the new template.
    c.kubectl(&[
        "patch",
        "sts",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}"#,
    ]);
    c.kubectl(&["set", "image", "sts/web", "nginx=nginx:3"]);
    c.wait_for(
        &["pod", "web-2"],
        "{.spec.containers[0].image}/{.status.phase}",
        |s| s == "nginx:3/Running",
    );
    let out = rollout_status(&c, "sts/web");
    assert!(
        out.contains("partitioned roll out complete: 1 new pods have been updated..."),
        "{out}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        images(&c, "app=web"),
        "web-0=nginx:1 web-1=nginx:1 web-2=nginx:3 "
    );

    // Scale down from the highest ordinal; the claims stay (Retain).
    c.kubectl(&["scale", "sts", "web", "--replicas=2"]);
    c.wait_for(&["pods", "-l", "app=web"], "{.items[*].metadata.name}", |n| {
        n == "web-0 web-1"
    });
    c.kubectl(&["scale", "sts", "web", "--replicas=1"]);
    c.wait_for(&["pods", "-l", "app=web"], "{.items[*].metadata.name}", |n| {
        n == "web-0"
    });
    c.wait_for(&["sts", "web"], "{.status.replicas}", |n| n == "1");
    assert_eq!(
        c.jsonpath(&["pvc"], "{.items[*].metadata.name}"),
        "data-web-0 data-web-1 data-web-2"
    );
}

#[test]
fn statefulset_parallel_and_claim_retention() {
    let c = cluster(&[("node", 2, &[])]);
    c.apply(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
spec:
  serviceName: db
  replicas: 3
  podManagementPolicy: Parallel
  persistentVolumeClaimRetentionPolicy:
    whenScaled: Delete
    whenDeleted: Delete
  selector:
    matchLabels:
      app: db
  template:
    metadata:
      labels:
        app: db
    spec:
      containers:
      - name: db
        image: postgres:16
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 1Gi
"#,
    );
    c.wait_for(&["sts", "db"], "{.status.readyReplicas}", |r| r == "3");
    // whenDeleted: Delete: the set owns its claims.
    c.wait_for(
        &["pvc", "data-db-0"],
        "{.metadata.ownerReferences[0].kind}",
        |k| k == "StatefulSet",
    );
    // whenScaled: Delete: the claims of the pods scaled away go with them.
    c.kubectl(&["scale", "sts", "db", "--replicas=1"]);
    c.wait_for(&["pvc"], "{.items[*].metadata.name}", |n| n == "data-db-0");
    c.wait_for(&["pods", "-l", "app=db"], "{.items[*].metadata.name}", |n| {
        n == "db-0"
    });
    // whenDeleted: Delete: deleting the set deletes the remaining claim.
    c.kubectl(&["delete", "sts", "db"]);
    c.wait_for(&["pvc"], "{.items[*].metadata.name}", str::is_empty);
}

const AGENT: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels:
      app: agent
  template:
    metadata:
      labels:
        app: agent
    spec:
      containers:
      - name: agent
        image: agent:1
"#;

/// `node=image` of the set's pods, by node.
fn pods_by_node(c: &TestCluster, selector: &str) -> Vec<String> {
    let out = c.jsonpath(
        &["pods", "-l", selector],
        "{range .items[*]}{.spec.nodeName}={.spec.containers[0].image} {end}",
    );
    let mut v: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    v.sort();
    v
}

fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn daemonset_runs_one_pod_per_eligible_node_and_follows_the_nodes() {
    let mut c = cluster(&[
        ("node", 3, &[]),
        ("db", 2, &["--taints", "dedicated=db:NoSchedule"]),
    ]);
    c.apply(AGENT);
    c.wait_for(
        &["ds", "agent"],
        "{.status.numberReady}/{.status.desiredNumberScheduled}",
        |s| s == "3/3",
    );
    assert_eq!(
        pods_by_node(&c, "app=agent"),
        ["node-0=agent:1", "node-1=agent:1", "node-2=agent:1"],
        "one per node, none on the tainted group"
    );
    // Upstream's pod shape: node-name affinity and the automatic tolerations.
    let pod = c.jsonpath(&["pods", "-l", "app=agent"], "{.items[0].metadata.name}");
    let affinity = c.jsonpath(
        &["pod", &pod],
        "{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].key}",
    );
    assert_eq!(affinity, "metadata.name");
    let tolerations = c.jsonpath(
        &["pod", &pod],
        "{range .spec.tolerations[*]}{.key}:{.effect}:{.tolerationSeconds} {end}",
    );
    for t in [
        "node.kubernetes.io/not-ready:NoExecute: ",
        "node.kubernetes.io/unreachable:NoExecute: ",
        "node.kubernetes.io/disk-pressure:NoSchedule:",
        "node.kubernetes.io/memory-pressure:NoSchedule:",
        "node.kubernetes.io/pid-pressure:NoSchedule:",
        "node.kubernetes.io/unschedulable:NoSchedule:",
    ] {
        assert!(tolerations.contains(t), "{t} missing in {tolerations}");
    }
    let table = c.kubectl(&["get", "ds", "agent", "-o", "wide"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE",
            "SELECTOR",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..7], ["agent", "3", "3", "3", "3", "3", "<none>"], "{table}");
    let events = messages(&c, "agent", "SuccessfulCreate");
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        events.iter().all(|m| m.starts_with("Created pod: agent-")),
        "{events:?}"
    );

    // A node added later gets its pod.
    c.add_nodes("late", 1, &[]);
    c.wait_for(
        &["ds", "agent"],
        "{.status.numberReady}/{.status.desiredNumberScheduled}",
        |s| s == "4/4",
    );
    assert!(pods_by_node(&c, "app=agent").contains(&"late-0=agent:1".to_string()));

    // A set with a node selector follows the labels.
    c.apply(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: edge\nspec:\n  selector:\n    matchLabels:\n      app: edge\n  template:\n    metadata:\n      labels:\n        app: edge\n    spec:\n      nodeSelector:\n        role: edge\n      containers:\n      - name: e\n        image: edge:1\n",
    );
    c.wait_for(&["ds", "edge"], "{.status.observedGeneration}", |g| g == "1");
    assert_eq!(
        c.jsonpath(&["ds", "edge"], "{.status.desiredNumberScheduled}"),
        "0"
    );
    c.kubectl(&["label", "node", "node-1", "role=edge"]);
    wait_until("an edge pod on node-1", || {
        pods_by_node(&c, "app=edge") == ["node-1=edge:1"]
    });
    c.kubectl(&["label", "node", "node-1", "role-"]);
    wait_until("the edge pod to go", || pods_by_node(&c, "app=edge").is_empty());
    assert_eq!(
        c.wait_for(&["ds", "edge"], "{.status.desiredNumberScheduled}", |d| d == "0"),
        "0"
    );

    // A removed node is no longer counted.
    c.kubectl(&["delete", "node", "late-0"]);
    c.wait_for(&["ds", "agent"], "{.status.desiredNumberScheduled}", |d| d == "3");

    // Rolling update (maxUnavailable 1), history and undo.
    c.kubectl(&["set", "image", "ds/agent", "agent=agent:2"]);
    let out = rollout_status(&c, "ds/agent");
    assert!(
        out.contains("daemon set \"agent\" successfully rolled out"),
        "{out}"
    );
    wait_until("agent:2 everywhere", || {
        pods_by_node(&c, "app=agent") == ["node-0=agent:2", "node-1=agent:2", "node-2=agent:2"]
    });
    let history = c.kubectl(&["rollout", "history", "ds/agent"]);
    assert!(history.contains("1 ") && history.contains("2 "), "{history}");
    let out = c.kubectl(&["rollout", "undo", "ds/agent"]);
    assert!(out.contains("rolled back"), "{out}");
    wait_until("agent:1 everywhere", || {
        pods_by_node(&c, "app=agent") == ["node-0=agent:1", "node-1=agent:1", "node-2=agent:1"]
    });
    rollout_status(&c, "ds/agent");
}

#[test]
fn daemonset_tolerating_the_taint_runs_on_the_tainted_group_too() {
    let c = cluster(&[
        ("node", 1, &[]),
        ("db", 2, &["--taints", "dedicated=db:NoSchedule"]),
    ]);
    c.apply(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: logs\nspec:\n  selector:\n    matchLabels:\n      app: logs\n  template:\n    metadata:\n      labels:\n        app: logs\n    spec:\n      tolerations:\n      - key: dedicated\n        operator: Exists\n        effect: NoSchedule\n      containers:\n      - name: l\n        image: logs:1\n",
    );
    c.wait_for(
        &["ds", "logs"],
        "{.status.numberReady}/{.status.desiredNumberScheduled}",
        |s| s == "3/3",
    );
    assert_eq!(
        pods_by_node(&c, "app=logs"),
        ["db-0=logs:1", "db-1=logs:1", "node-0=logs:1"]
    );
    // A cordoned node keeps its daemon pod (the pod tolerates `unschedulable`).
    c.kubectl(&["cordon", "node-0"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.jsonpath(&["ds", "logs"], "{.status.desiredNumberScheduled}"),
        "3"
    );
    assert_eq!(pods_by_node(&c, "app=logs").len(), 3);
}

#[test]
fn statefulset_on_delete_updates_only_pods_deleted_by_hand() {
    let c = cluster(&[("node", 2, &[])]);
    c.apply(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: kv\nspec:\n  serviceName: kv\n  replicas: 3\n  updateStrategy:\n    type: OnDelete\n  selector:\n    matchLabels:\n      app: kv\n  template:\n    metadata:\n      labels:\n        app: kv\n    spec:\n      containers:\n      - name: kv\n        image: kv:1\n",
    );
    c.wait_for(&["sts", "kv"], "{.status.readyReplicas}", |r| r == "3");
    c.kubectl(&["set", "image", "sts/kv", "kv=kv:2"]);
    c.wait_for(&["sts", "kv"], "{.status.observedGeneration}", |g| g == "2");
    let (cur, upd) = (
        c.jsonpath(&["sts", "kv"], "{.status.currentRevision}"),
        c.jsonpath(&["sts", "kv"], "{.status.updateRevision}"),
    );
    assert_ne!(cur, upd);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(images(&c, "app=kv"), "kv-0=kv:1 kv-1=kv:1 kv-2=kv:1 ");
    let old_uid = c.jsonpath(&["pod", "kv-1"], "{.metadata.uid}");
    // Without waiting: kubectl's wait lists the pod by name and would wait for ever on the
    // same-named replacement the controller creates at once (kubectl's own race, not ours).
    c.kubectl(&["delete", "pod", "kv-1", "--wait=false"]);
    c.wait_for(&["pod", "kv-1"], "{.metadata.uid}/{.status.phase}", |s| {
        !s.starts_with(&old_uid) && s.ends_with("/Running")
    });
    assert_eq!(images(&c, "app=kv"), "kv-0=kv:1 kv-1=kv:2 kv-2=kv:1 ");
    c.wait_for(&["sts", "kv"], "{.status.updatedReplicas}", |n| n == "1");
    let (ok, _, err) = c.kubectl_result(&["rollout", "status", "sts/kv"], None);
    assert!(
        !ok && err.contains("rollout status is only available for RollingUpdate strategy type"),
        "{err}"
    );
}

#[test]
fn daemonset_on_delete_and_surge_updates() {
    let c = cluster(&[("node", 2, &[])]);
    c.apply(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: od\nspec:\n  updateStrategy:\n    type: OnDelete\n  selector:\n    matchLabels:\n      app: od\n  template:\n    metadata:\n      labels:\n        app: od\n    spec:\n      containers:\n      - name: c\n        image: od:1\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: surge\nspec:\n  updateStrategy:\n    type: RollingUpdate\n    rollingUpdate:\n      maxSurge: 1\n      maxUnavailable: 0\n  selector:\n    matchLabels:\n      app: surge\n  template:\n    metadata:\n      labels:\n        app: surge\n    spec:\n      containers:\n      - name: c\n        image: surge:1\n",
    );
    c.wait_for(&["ds", "od"], "{.status.numberReady}", |n| n == "2");
    c.wait_for(&["ds", "surge"], "{.status.numberReady}", |n| n == "2");
    // OnDelete: only a pod deleted by hand comes back with the new template.
    c.kubectl(&["set", "image", "ds/od", "c=od:2"]);
    c.wait_for(&["ds", "od"], "{.status.observedGeneration}", |g| g == "2");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(pods_by_node(&c, "app=od"), ["node-0=od:1", "node-1=od:1"]);
    let on_node0 = c.jsonpath(
        &["pods", "-l", "app=od", "--field-selector", "spec.nodeName=node-0"],
        "{.items[0].metadata.name}",
    );
    c.kubectl(&["delete", "pod", &on_node0]);
    wait_until("od:2 on node-0", || {
        pods_by_node(&c, "app=od") == ["node-0=od:2", "node-1=od:1"]
    });
    c.wait_for(&["ds", "od"], "{.status.updatedNumberScheduled}", |n| n == "1");
    // Surge: the new pod starts next to the old one; the old one goes once the new is available.
    c.kubectl(&["set", "image", "ds/surge", "c=surge:2"]);
    rollout_status(&c, "ds/surge");
    wait_until("surge:2 everywhere", || {
        pods_by_node(&c, "app=surge") == ["node-0=surge:2", "node-1=surge:2"]
    });
}

/// Measurement (run with `--ignored --nocapture`): a DaemonSet over 1,000 hollow nodes and a
/// 500-replica Parallel StatefulSet, from apply to all Ready.
#[test]
#[ignore]
fn bench_daemonset_on_1000_nodes_and_parallel_statefulset() {
    let c = cluster(&[("node", 1000, &["--max-pods", "250"])]);
    let t0 = Instant::now();
    c.apply(AGENT);
    println!("apply took {:.1} s", t0.elapsed().as_secs_f64());
    let t = Instant::now();
    while c.jsonpath(&["ds", "agent"], "{.status.numberReady}") != "1000" {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "DaemonSet not ready in 300 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "DaemonSet on 1000 nodes: all Ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    c.apply(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: big\nspec:\n  serviceName: big\n  replicas: 500\n  podManagementPolicy: Parallel\n  selector:\n    matchLabels:\n      app: big\n  template:\n    metadata:\n      labels:\n        app: big\n    spec:\n      containers:\n      - name: c\n        image: big:1\n",
    );
    while c.jsonpath(&["sts", "big"], "{.status.readyReplicas}") != "500" {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "StatefulSet not ready in 300 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "Parallel StatefulSet of 500: all Ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
