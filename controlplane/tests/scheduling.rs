//! The scheduler through `controlplane serve` with hollow nodes and the real kubectl: pods find
//! nodes by themselves, and what kubectl shows when they cannot is upstream's text.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use controlplane::process::{ServerProcess, TestCluster};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

/// A control plane and hollow node groups.
fn cluster(groups: &[(&str, usize, &[&str])]) -> TestCluster {
    TestCluster::start(bin(), &[], groups)
}

fn pod(name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{extra_spec}  containers:\n  - name: c\n    image: busybox\n"
    )
}

#[test]
fn kubectl_run_lands_on_a_node_and_runs() {
    let c = cluster(&[("node", 3, &[])]);
    c.kubectl(&["run", "web", "--image=busybox", "--", "sleep", "1d"]);
    let node = c.wait_for(&["pod", "web"], "{.spec.nodeName}", |n| n.starts_with("node-"));
    c.wait_for(&["pod", "web"], "{.status.phase}", |p| p == "Running");
    assert_eq!(
        c.jsonpath(
            &["pod", "web"],
            "{.status.conditions[?(@.type==\"PodScheduled\")].status}"
        ),
        "True"
    );
    let events = c.kubectl(&["events", "--for", "pod/web"]);
    assert!(
        events.contains(&format!("Successfully assigned default/web to {node}")),
        "{events}"
    );
    let wide = c.kubectl(&["get", "pods", "-o", "wide"]);
    assert!(wide.contains("Running") && wide.contains(&node), "{wide}");
}

#[test]
fn failed_scheduling_texts_for_cpu_taints_and_affinity() {
    let c = cluster(&[
        ("small", 2, &["--cpu", "2"]),
        ("db", 1, &["--taints", "dedicated=db:NoSchedule"]),
    ]);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hungry\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      requests:\n        cpu: \"3\"\n",
    );
    assert_eq!(
        c.unschedulable_message("hungry"),
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient cpu. \
         preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, \
         2 No preemption victims found for incoming pod."
    );
    c.apply(&pod("picky", "  nodeSelector:\n    disk: ssd\n"));
    assert_eq!(
        c.unschedulable_message("picky"),
        "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    );
    assert_eq!(
        c.jsonpath(
            &["pod", "picky"],
            "{.status.conditions[?(@.type==\"PodScheduled\")].reason}"
        ),
        "Unschedulable"
    );
    let events = c.kubectl(&["events", "--for", "pod/picky"]);
    assert!(events.contains("FailedScheduling"), "{events}");
    // A label change makes the scheduler try again: the same failure is one Event, counted.
    c.kubectl(&["label", "node", "small-0", "tier=web"]);
    c.wait_for(
        &[
            "events",
            "--field-selector",
            "involvedObject.name=picky,reason=FailedScheduling",
        ],
        "{.items[*].count}",
        |n| n == "2",
    );
    // The matching label lets it in.
    c.kubectl(&["label", "node", "small-1", "disk=ssd"]);
    c.wait_for(&["pod", "picky"], "{.spec.nodeName}", |n| n == "small-1");
    // A toleration permits the dedicated node.
    c.apply(&pod(
        "tolerant",
        "  nodeSelector:\n    kubernetes.io/hostname: db-0\n  tolerations:\n  - key: dedicated\n    value: db\n    effect: NoSchedule\n",
    ));
    c.wait_for(&["pod", "tolerant"], "{.spec.nodeName}", |n| n == "db-0");
}

#[test]
fn cordon_and_drain() {
    let c = cluster(&[("node", 2, &[])]);
    c.kubectl(&["run", "a", "--image=busybox"]);
    let first = c.wait_for(&["pod", "a"], "{.spec.nodeName}", |n| !n.is_empty());
    c.wait_for(&["pod", "a"], "{.status.phase}", |p| p == "Running");
    let other = if first == "node-0" { "node-1" } else { "node-0" };
    let out = c.kubectl(&["drain", &first, "--force", "--timeout=60s"]);
    assert!(out.contains("drained"), "{out}");
    // The evicted pod is gone (the node finished its graceful deletion).
    c.wait_for(&["pods", "-o", "name"], "{.items[*].metadata.name}", |n| {
        n.is_empty()
    });
    c.kubectl(&["run", "b", "--image=busybox"]);
    c.wait_for(&["pod", "b"], "{.spec.nodeName}", |n| n == other);
    c.kubectl(&["cordon", other]);
    c.kubectl(&["run", "c", "--image=busybox"]);
    assert_eq!(
        c.unschedulable_message("c"),
        "0/2 nodes are available: 2 node(s) were unschedulable. \
         preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );
    c.kubectl(&["uncordon", &first]);
    c.wait_for(&["pod", "c"], "{.spec.nodeName}", |n| n == first);
}

#[test]
fn preemption_of_a_lower_priority_pod() {
    let c = cluster(&[("node", 1, &["--cpu", "2"])]);
    c.apply(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: low\nvalue: 100\n---\n\
         apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n  name: high\nvalue: 1000\n",
    );
    let sized = |name: &str, class: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  priorityClassName: {class}\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      requests:\n        cpu: 1500m\n"
        )
    };
    c.apply(&sized("victim", "low"));
    c.wait_for(&["pod", "victim"], "{.status.phase}", |p| p == "Running");
    assert_eq!(c.jsonpath(&["pod", "victim"], "{.spec.priority}"), "100");
    // Watch the victim so its DisruptionTarget condition is seen before it is gone.
    let mut watch: Child = Command::new("kubectl")
        .env("KUBECONFIG", c.kubeconfig())
        .args([
            "get",
            "pod",
            "victim",
            "-w",
            "-o",
            "json",
            "--request-timeout=60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("watch");
    std::thread::sleep(Duration::from_millis(1000));
    c.apply(&sized("urgent", "high"));
    c.wait_for(&["pod", "urgent"], "{.spec.nodeName}", |n| n == "node-0");
    c.wait_for(&["pod", "urgent"], "{.status.phase}", |p| p == "Running");
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(seen.contains("\"reason\": \"PreemptionByScheduler\""), "{seen}");
    assert!(
        seen.contains("default-scheduler: preempting to accommodate a higher priority pod"),
        "{seen}"
    );
    let (_, pods, _) = c.kubectl_result(&["get", "pod", "victim"], None);
    assert!(pods.is_empty(), "the victim is deleted: {pods}");
    let events = c.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=Preempted",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(events.starts_with("Preempted by pod "), "{events}");
}

#[test]
fn other_schedulers_gates_and_priority_admission() {
    let c = cluster(&[("node", 1, &[])]);
    c.apply(&pod("elsewhere", "  schedulerName: my-scheduler\n"));
    c.apply(&pod("gated", "  schedulingGates:\n  - name: example.com/wait\n"));
    c.wait_for(
        &["pod", "gated"],
        "{.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        |r| r == "SchedulingGated",
    );
    assert_eq!(
        c.jsonpath(
            &["pod", "gated"],
            "{.status.conditions[?(@.type==\"PodScheduled\")].message}"
        ),
        "Scheduling is blocked due to non-empty scheduling gates"
    );
    c.kubectl(&[
        "patch",
        "pod",
        "gated",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/schedulingGates"}]"#,
    ]);
    c.wait_for(&["pod", "gated"], "{.spec.nodeName}", |n| n == "node-0");
    // The pod of another scheduler was never touched.
    assert_eq!(c.jsonpath(&["pod", "elsewhere"], "{.spec.nodeName}"), "");
    assert_eq!(c.jsonpath(&["pod", "elsewhere"], "{.status.conditions}"), "");
    // Priority admission.
    c.apply(&pod("critical", "  priorityClassName: system-node-critical\n"));
    assert_eq!(c.jsonpath(&["pod", "critical"], "{.spec.priority}"), "2000001000");
    let (ok, _, err) = c.kubectl_result(
        &["apply", "-f", "-"],
        Some(&pod("nope", "  priorityClassName: missing\n")),
    );
    assert!(!ok);
    assert!(
        err.contains("pods \"nope\" is forbidden: no PriorityClass with name missing was found"),
        "{err}"
    );
}

/// Two standalone schedulers against one API server: one leads (the Lease names it), and when it
/// is killed the other takes over.
#[test]
fn standalone_schedulers_elect_one_leader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _server = ServerProcess::spawn(bin(), dir.path(), &["--no-scheduler"]).expect("controlplane");
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let spawn = |identity: &str| {
        Command::new(bin())
            .args(["scheduler", "--identity", identity, "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("scheduler")
    };
    let mut schedulers = vec![("sched-a", spawn("sched-a")), ("sched-b", spawn("sched-b"))];
    let mut c = TestCluster::adopt(bin(), dir);
    c.add_nodes("node", 2, &[]);
    let lease = ["lease", "-n", "kube-system", "kube-scheduler"];
    let holder = c.wait_for(&lease, "{.spec.holderIdentity}", |h| h.starts_with("sched-"));
    c.kubectl(&["run", "one", "--image=busybox"]);
    c.wait_for(&["pod", "one"], "{.spec.nodeName}", |n| n.starts_with("node-"));
    // Only the leader wrote the Scheduled event.
    let reporters = c.jsonpath(
        &["events", "--field-selector", "reason=Scheduled"],
        "{.items[*].reportingInstance}",
    );
    assert_eq!(reporters, holder);
    // Kill the leader: the other one takes over the Lease and schedules.
    let i = schedulers
        .iter()
        .position(|(n, _)| *n == holder)
        .expect("holder is one of ours");
    let (_, mut leader) = schedulers.remove(i);
    let _ = leader.kill();
    let _ = leader.wait();
    let survivor = schedulers[0].0;
    c.wait_for(&lease, "{.spec.holderIdentity}", |h| h == survivor);
    assert_eq!(c.jsonpath(&lease, "{.spec.leaseTransitions}"), "1");
    c.kubectl(&["run", "two", "--image=busybox"]);
    c.wait_for(&["pod", "two"], "{.spec.nodeName}", |n| n.starts_with("node-"));
    for (_, mut s) in schedulers {
        let _ = s.kill();
        let _ = s.wait();
    }
}
