//! The node controllers through `controlplane serve` with hollow nodes and the real kubectl
//! (docs/SEEDS-SPEC.md CTL-39..CTL-47): a node whose kubelet dies goes Unknown and gets the
//! unreachable taint, its pods are marked not ready and evicted after their toleration; NoExecute
//! taints evict; pods of a deleted node are garbage collected; every node gets a pod CIDR; a
//! PodDisruptionBudget's status follows its pods and holds `kubectl drain` back.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

/// Hollow nodes that renew their Lease every second.
const FAST_LEASE: &[&str] = &["--node-lease-duration-seconds", "4"];

/// Node health checked every second, a node silent for 6 s is Unknown, taints at 10 nodes/s.
const FAST_LIFECYCLE: &[&str] = &[
    "--node-monitor-period=1s",
    "--node-monitor-grace-period=6s",
    "--node-eviction-rate=10",
];

fn pod_on(name: &str, node: &str, tolerations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n{tolerations}  containers:\n  - name: c\n    image: busybox\n"
    )
}

fn toleration(key: &str, seconds: Option<u32>) -> String {
    let secs = seconds.map_or(String::new(), |s| format!("    tolerationSeconds: {s}\n"));
    format!("  tolerations:\n  - key: {key}\n    operator: Exists\n    effect: NoExecute\n{secs}")
}

/// The messages of the events with `reason`, one per line.
fn events(c: &TestCluster, reason: &str) -> String {
    c.kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ])
}

fn wait_events(c: &TestCluster, reason: &str, needle: &str) -> String {
    let t0 = Instant::now();
    loop {
        let out = events(c, reason);
        if out.contains(needle) {
            return out;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no {reason} event with {needle:?}: {out}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn ready(c: &TestCluster, kind: &str, name: &str) -> String {
    c.jsonpath(&[kind, name], "{.status.conditions[?(@.type==\"Ready\")].status}")
}

fn taints(c: &TestCluster, node: &str) -> String {
    c.jsonpath(&["node", node], "{range .spec.taints[*]}{.key}:{.effect} {end}")
}

#[test]
fn a_lost_node_goes_unknown_is_tainted_and_its_pods_are_evicted_after_their_toleration() {
    let mut c = TestCluster::start(
        bin(),
        FAST_LIFECYCLE,
        &[("live", 2, FAST_LEASE), ("lost", 2, FAST_LEASE)],
    );
    c.apply(&pod_on(
        "brief",
        "lost-0",
        &toleration("node.kubernetes.io/unreachable", Some(3)),
    ));
    c.apply(&pod_on("patient", "lost-0", ""));
    c.apply(&pod_on("elsewhere", "live-0", ""));
    for p in ["brief", "patient", "elsewhere"] {
        c.wait_for(&["pod", p], "{.status.phase}", |s| s == "Running");
    }
    // The admission plugin gave `patient` the default 300 s tolerations.
    assert_eq!(
        c.jsonpath(
            &["pod", "patient"],
            "{.spec.tolerations[?(@.key==\"node.kubernetes.io/unreachable\")].tolerationSeconds}"
        ),
        "300"
    );
    c.hollow.remove(1); // the `lost` kubelets die
    c.wait_for(
        &["node", "lost-0"],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        |s| s == "Unknown",
    );
    let reason = c.jsonpath(
        &["node", "lost-0"],
        "{.status.conditions[?(@.type==\"Ready\")].reason}/{.status.conditions[?(@.type==\"Ready\")].message}",
    );
    assert_eq!(reason, "NodeStatusUnknown/Kubelet stopped posting node status.");
    assert_eq!(
        c.jsonpath(
            &["node", "lost-0"],
            "{.status.conditions[?(@.type==\"MemoryPressure\")].status}"
        ),
        "Unknown"
    );
    // Its pods are marked not ready at once.
    c.wait_for(
        &["pod", "patient"],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        |s| s == "False",
    );
    wait_events(&c, "NodeNotReady", "Node lost-0 status is now: NodeNotReady");
    wait_events(&c, "NodeNotReady", "Node is not ready");
    // The taints: unreachable, NoSchedule and NoExecute.
    let t = c.wait_for(
        &["node", "lost-0"],
        "{range .spec.taints[*]}{.key}:{.effect} {end}",
        |t| {
            t.contains("node.kubernetes.io/unreachable:NoExecute")
                && t.contains("node.kubernetes.io/unreachable:NoSchedule")
        },
    );
    assert!(!t.contains("not-ready"), "{t}");
    // `brief` tolerated it for 3 s: then it is deleted (Terminating: nobody runs it now).
    c.wait_for(&["pod", "brief"], "{.metadata.deletionTimestamp}", |s| {
        !s.is_empty()
    });
    wait_events(
        &c,
        "TaintManagerEviction",
        "Marking for deletion Pod default/brief",
    );
    assert_eq!(
        c.jsonpath(
            &["pod", "brief"],
            "{.status.conditions[?(@.type==\"DisruptionTarget\")].reason}"
        ),
        "DeletionByTaintManager"
    );
    // The others stay: `patient` has 300 s, `elsewhere` is on a live node.
    assert!(
        c.jsonpath(&["pod", "patient"], "{.metadata.deletionTimestamp}")
            .is_empty()
    );
    assert_eq!(ready(&c, "pod", "elsewhere"), "True");
    assert_eq!(ready(&c, "node", "live-0"), "True");
    assert!(taints(&c, "live-0").is_empty());
    // The kubelets come back: Ready again, the taints go, `patient` stays and is ready again.
    c.add_nodes("lost", 2, FAST_LEASE);
    c.wait_for(
        &["node", "lost-0"],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        |s| s == "True",
    );
    c.wait_for(&["node", "lost-0"], "{.spec.taints}", str::is_empty);
    c.wait_for(&["pod", "brief"], "{.metadata.name}", str::is_empty);
    c.wait_for(
        &["pod", "patient"],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        |s| s == "True",
    );
    let cancelled = events(&c, "TaintManagerEviction");
    assert!(
        cancelled.contains("Cancelling deletion of Pod default/patient"),
        "the planned deletion of patient was cancelled: {cancelled}"
    );
}

#[test]
fn noexecute_taints_evict_untolerated_pods_at_once_and_tolerating_ones_in_time() {
    let c = TestCluster::start(bin(), &[], &[("node", 2, &[])]);
    c.apply(&pod_on("plain", "node-0", ""));
    c.apply(&pod_on("tolerant", "node-0", &toleration("maint", None)));
    c.apply(&pod_on("brief", "node-0", &toleration("maint", Some(2))));
    c.apply(&pod_on("saved", "node-1", &toleration("maint", Some(30))));
    for p in ["plain", "tolerant", "brief", "saved"] {
        c.wait_for(&["pod", p], "{.status.phase}", |s| s == "Running");
    }
    let t0 = Instant::now();
    c.kubectl(&["taint", "node", "node-0", "maint=now:NoExecute"]);
    c.kubectl(&["taint", "node", "node-1", "maint=now:NoExecute"]);
    // Untolerated: deleted at once (the live node finishes it).
    c.wait_for(&["pod", "plain"], "{.metadata.name}", str::is_empty);
    wait_events(
        &c,
        "TaintManagerEviction",
        "Marking for deletion Pod default/plain",
    );
    // Tolerated for 2 s.
    c.wait_for(&["pod", "brief"], "{.metadata.name}", str::is_empty);
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "brief went before its tolerationSeconds"
    );
    // The taint removed in time: the planned deletion of `saved` is cancelled.
    c.kubectl(&["taint", "node", "node-1", "maint-"]);
    wait_events(
        &c,
        "TaintManagerEviction",
        "Cancelling deletion of Pod default/saved",
    );
    // Tolerated for ever: stays.
    assert_eq!(c.jsonpath(&["pod", "tolerant"], "{.status.phase}"), "Running");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        c.jsonpath(&["pod", "saved"], "{.metadata.deletionTimestamp}")
            .is_empty()
    );
}

#[test]
fn the_pods_of_a_deleted_node_are_garbage_collected() {
    let c = TestCluster::start(
        bin(),
        &["--pod-gc-period=1s", "--pod-gc-quarantine=2s"],
        &[("node", 2, &[])],
    );
    c.apply(&pod_on("orphan", "node-1", ""));
    c.apply(&pod_on("kept", "node-0", ""));
    c.wait_for(&["pod", "orphan"], "{.status.phase}", |s| s == "Running");
    c.kubectl(&["delete", "node", "node-1"]);
    c.wait_for(&["pod", "orphan"], "{.metadata.name}", str::is_empty);
    // Its name is free again.
    c.apply(&pod_on("orphan", "node-0", ""));
    c.wait_for(&["pod", "orphan"], "{.status.phase}", |s| s == "Running");
    assert_eq!(c.jsonpath(&["pod", "kept"], "{.status.phase}"), "Running");
}

#[test]
fn terminated_pods_beyond_the_threshold_are_collected_oldest_first() {
    let c = TestCluster::start(
        bin(),
        &["--pod-gc-period=1s", "--terminated-pod-gc-threshold=2"],
        &[("node", 1, &[])],
    );
    for name in ["done-1", "done-2", "done-3"] {
        c.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations:\n    nodeos.dev/hollow-run-seconds: \"0\"\nspec:\n  restartPolicy: Never\n  nodeName: node-0\n  containers:\n  - name: c\n    image: busybox\n"
        ));
        c.wait_for(&["pod", name], "{.status.phase}", |s| s == "Succeeded");
        std::thread::sleep(Duration::from_millis(1100));
    }
    c.wait_for(&["pod", "done-1"], "{.metadata.name}", str::is_empty);
    assert_eq!(c.jsonpath(&["pod", "done-2"], "{.status.phase}"), "Succeeded");
    assert_eq!(c.jsonpath(&["pod", "done-3"], "{.status.phase}"), "Succeeded");
}

#[test]
fn every_node_gets_its_own_pod_cidr() {
    let mut c = TestCluster::start(bin(), &[], &[("node", 3, &[])]);
    let cidrs = |c: &TestCluster| {
        c.wait_for(
            &["nodes"],
            "{range .items[*]}{.metadata.name}={.spec.podCIDR}={.spec.podCIDRs[0]} {end}",
            |s| !s.is_empty() && s.split_whitespace().all(|n| !n.contains("==")),
        )
    };
    let all = cidrs(&c);
    let mut seen: Vec<String> = Vec::new();
    for entry in all.split_whitespace() {
        let parts: Vec<&str> = entry.split('=').collect();
        assert_eq!(parts[1], parts[2], "podCIDRs = [podCIDR]: {entry}");
        assert!(
            parts[1].starts_with("10.244.") && parts[1].ends_with(".0/24"),
            "{entry}"
        );
        assert!(!seen.contains(&parts[1].to_string()), "{all}");
        seen.push(parts[1].to_string());
    }
    assert_eq!(seen.len(), 3);
    // A deleted node's CIDR is not handed to the next node at once.
    let freed = c.jsonpath(&["node", "node-2"], "{.spec.podCIDR}");
    c.kubectl(&["delete", "node", "node-2"]);
    c.add_nodes("more", 1, &[]);
    let new = c.wait_for(&["node", "more-0"], "{.spec.podCIDR}", |s| !s.is_empty());
    assert!(!seen.contains(&new), "{new} is held by another node");
    assert_ne!(new, freed);
}

const REPLICASET: &str = "apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web
spec:
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
      - name: c
        image: busybox
";

fn budget(c: &TestCluster) -> String {
    c.jsonpath(
        &["pdb", "web"],
        "{.status.expectedPods}/{.status.currentHealthy}/{.status.desiredHealthy}/{.status.disruptionsAllowed}/{.status.observedGeneration}",
    )
}

#[test]
fn a_budget_status_follows_its_pods_and_holds_drain_back() {
    let c = TestCluster::start(bin(), &[], &[("node", 3, &[])]);
    c.apply(REPLICASET);
    c.kubectl(&["create", "pdb", "web", "--selector=app=web", "--min-available=2"]);
    // expected/current/desired/allowed/observedGeneration, from the controller.
    c.wait_for(&["pdb", "web"], "{.status.currentHealthy}", |s| s == "3");
    assert_eq!(budget(&c), "3/3/2/1/1");
    assert_eq!(
        c.jsonpath(
            &["pdb", "web"],
            "{.status.conditions[?(@.type==\"DisruptionAllowed\")].reason}"
        ),
        "SufficientPods"
    );
    // One disruption is allowed: a drain of the node of one pod goes through, the eviction
    // marks the pod, and the ReplicaSet replaces it elsewhere.
    let victim_node = c.jsonpath(&["pods", "-l", "app=web"], "{.items[0].spec.nodeName}");
    let (ok, out, err) = c.kubectl_result(
        &["drain", &victim_node, "--ignore-daemonsets", "--timeout=60s"],
        None,
    );
    assert!(ok, "drain failed: {out}\n{err}");
    assert!(out.contains("evicted"), "{out}");
    c.wait_for(
        &["pods", "-l", "app=web"],
        "{range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{end}",
        |s| s == "TrueTrueTrue",
    );
    c.wait_for(&["pdb", "web"], "{.status.currentHealthy}", |s| s == "3");
    // The budget now asks for all three: the controller's status (generation 2) allows none,
    // and a drain is held back with the 429 kubectl retries on.
    c.kubectl(&[
        "patch",
        "pdb",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":3}}"#,
    ]);
    c.wait_for(&["pdb", "web"], "{.status.observedGeneration}", |s| s == "2");
    assert_eq!(budget(&c), "3/3/3/0/2");
    assert_eq!(
        c.jsonpath(
            &["pdb", "web"],
            "{.status.conditions[?(@.type==\"DisruptionAllowed\")].reason}"
        ),
        "InsufficientPods"
    );
    let other = c
        .jsonpath(&["pods", "-l", "app=web"], "{.items[*].spec.nodeName}")
        .split_whitespace()
        .find(|n| *n != victim_node)
        .map(str::to_string)
        .expect("a pod on another node");
    let (ok, out, err) = c.kubectl_result(&["drain", &other, "--ignore-daemonsets", "--timeout=7s"], None);
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            "(will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget."
        ),
        "{err}"
    );
    assert_eq!(
        c.kubectl(&["get", "pods", "-l", "app=web", "-o", "name"])
            .lines()
            .count(),
        3
    );
    // Fewer pods than wanted: the status follows.
    c.kubectl(&["scale", "rs", "web", "--replicas=2"]);
    c.wait_for(&["pdb", "web"], "{.status.currentHealthy}", |s| s == "2");
    assert_eq!(budget(&c), "2/2/3/0/2");
}
