//! Table tests of the scheduling cycle with the specification's examples (docs/SEEDS-SPEC.md §2).

use std::sync::Arc;

use serde_json::{Value, json};

use super::cache::{Cache, Nominations};
use super::framework::{CycleInput, FitError, Scheduled, num_feasible_nodes_to_find, schedule};
use super::pod::PodInfo;
use super::preemption::{self, Budget, Outcome};

fn node(
    name: &str,
    cpu: &str,
    mem: &str,
    labels: Value,
    taints: Value,
) -> Arc<k8s_openapi::api::core::v1::Node> {
    let mut l = json!({"kubernetes.io/hostname": name});
    if let Some(m) = labels.as_object() {
        for (k, v) in m {
            l[k] = v.clone();
        }
    }
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": l},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": mem, "pods": "110", "ephemeral-storage": "10Gi"}},
        }))
        .expect("node"),
    )
}

fn plain(name: &str) -> Arc<k8s_openapi::api::core::v1::Node> {
    node(name, "4", "8Gi", json!({}), json!([]))
}

fn pod_info(v: Value) -> Arc<PodInfo> {
    let mut v = v;
    if v["metadata"]["namespace"].is_null() {
        v["metadata"]["namespace"] = json!("default");
    }
    if v["metadata"]["uid"].is_null() {
        v["metadata"]["uid"] = v["metadata"]["name"].clone();
    }
    let pod = serde_json::from_value(v).expect("pod");
    Arc::new(PodInfo::new(Arc::new(pod), &|_| None))
}

fn pod(name: &str, spec: Value) -> Arc<PodInfo> {
    pod_info(json!({"metadata": {"name": name}, "spec": spec}))
}

fn requesting(name: &str, cpu: &str, mem: &str) -> Arc<PodInfo> {
    pod(
        name,
        json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}),
    )
}

fn cache(nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>>, placed: Vec<(Arc<PodInfo>, &str)>) -> Cache {
    let mut c = Cache::default();
    for n in nodes {
        c.upsert_node(n);
    }
    // As the watch files bound pods: without their objects (what filters and scores read of a
    // placed pod must be in its precomputed fields).
    for (p, n) in placed {
        c.assume(Arc::new((*p).clone().placed()), n);
    }
    c
}

fn run(pod: &PodInfo, c: &Cache) -> Result<Scheduled, FitError> {
    let noms = Nominations::default();
    let input = CycleInput {
        cache: c,
        nominations: &noms,
        default_selector: None,
        percentage_of_nodes_to_score: 0,
    };
    let mut seed = 7u64;
    schedule(pod, &input, 0, &mut || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        seed >> 33
    })
}

fn message(pod: &PodInfo, c: &Cache) -> String {
    let fit = run(pod, c).expect_err("must not fit");
    fit.message()
}

#[test]
fn feasible_nodes_to_find_follow_sch_2() {
    for (all, want) in [
        (50, 50),
        (100, 100),
        (200, 100),
        (1000, 420),
        (5000, 500),
        (20_000, 1000),
    ] {
        assert_eq!(num_feasible_nodes_to_find(all, 0), want, "{all} nodes");
    }
    assert_eq!(num_feasible_nodes_to_find(1000, 50), 500);
    assert_eq!(num_feasible_nodes_to_find(1000, 1), 100, "never fewer than 100");
}

#[test]
fn at_most_420_of_1000_nodes_reach_scoring() {
    let nodes = (0..1000).map(|i| plain(&format!("n{i}"))).collect();
    let c = cache(nodes, vec![]);
    let s = run(&requesting("p", "100m", "64Mi"), &c).expect("fits");
    assert_eq!(s.feasible, 420);
    assert_eq!(s.evaluated, 420);
}

#[test]
fn billing_counts_as_300m_and_192mi() {
    // app 250m/128Mi + a native sidecar 50m/64Mi (SCH-4).
    let billing = pod(
        "billing",
        json!({"containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}}],
               "initContainers": [{"name": "proxy", "image": "x", "restartPolicy": "Always",
                                   "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]}),
    );
    let fits = cache(vec![node("a", "300m", "192Mi", json!({}), json!([]))], vec![]);
    assert_eq!(run(&billing, &fits).expect("fits").node, "a");
    let short = cache(vec![node("a", "299m", "192Mi", json!({}), json!([]))], vec![]);
    assert_eq!(
        message(&billing, &short),
        "0/1 nodes are available: 1 Insufficient cpu."
    );
    // A `migrate` init container asking 2 GiB makes the whole pod count as 2 GiB.
    let migrating = pod(
        "billing",
        json!({"containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}}],
               "initContainers": [{"name": "migrate", "image": "x", "resources": {"requests": {"memory": "2Gi"}}}]}),
    );
    let c = cache(vec![node("a", "1", "1Gi", json!({}), json!([]))], vec![]);
    assert_eq!(
        message(&migrating, &c),
        "0/1 nodes are available: 1 Insufficient memory."
    );
}

#[test]
fn requests_are_counted_against_what_the_node_already_runs() {
    let c = cache(
        vec![node("a", "1", "1Gi", json!({}), json!([]))],
        vec![(requesting("old", "800m", "100Mi"), "a")],
    );
    assert_eq!(
        message(&requesting("new", "300m", "100Mi"), &c),
        "0/1 nodes are available: 1 Insufficient cpu."
    );
    // A pod without requests weighs zero in Filter.
    assert!(
        run(
            &pod("free", json!({"containers": [{"name": "c", "image": "x"}]})),
            &c
        )
        .is_ok()
    );
    let full = cache(
        vec![node("a", "1", "1Gi", json!({}), json!([]))],
        (0..110)
            .map(|i| (pod(&format!("p{i}"), json!({"containers": []})), "a"))
            .collect(),
    );
    assert_eq!(
        message(&pod("x", json!({"containers": []})), &full),
        "0/1 nodes are available: 1 Too many pods."
    );
}

#[test]
fn messages_count_and_sort_reasons_like_upstream() {
    let nodes = vec![
        node(
            "t1",
            "4",
            "8Gi",
            json!({}),
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
        ),
        node(
            "t2",
            "4",
            "8Gi",
            json!({}),
            json!([{"key": "x", "effect": "NoExecute"}]),
        ),
        node("small", "100m", "8Gi", json!({"disk": "ssd"}), json!([])),
        plain("a1"),
        plain("a2"),
    ];
    let c = cache(nodes, vec![]);
    let p = pod(
        "p",
        json!({"nodeSelector": {"disk": "ssd"},
               "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}),
    );
    assert_eq!(
        message(&p, &c),
        "0/5 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector, 2 node(s) had untolerated taint(s)."
    );
}

#[test]
fn untolerated_taint_message_and_preemption_suffix_of_sch_12() {
    let c = cache(
        vec![node(
            "cp",
            "4",
            "8Gi",
            json!({}),
            json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
        )],
        vec![],
    );
    let p = pod("coredns", json!({"containers": [{"name": "c", "image": "x"}]}));
    let mut fit = run(&p, &c).expect_err("tainted");
    let outcome = preemption::preempt(&p, &fit, &c, &Nominations::default(), &[]);
    fit.post_filter_msg = outcome.message();
    assert_eq!(
        fit.message(),
        "0/1 nodes are available: 1 node(s) had untolerated taint(s). preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    );
}

#[test]
fn a_toleration_permits_but_does_not_attract() {
    let c = cache(
        vec![
            node(
                "dedicated",
                "4",
                "8Gi",
                json!({}),
                json!([{"key": "dedicated", "value": "backend", "effect": "NoSchedule"}]),
            ),
            plain("ordinary"),
        ],
        vec![],
    );
    let p = pod(
        "billing",
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "backend", "effect": "NoSchedule"}],
               "containers": [{"name": "c", "image": "x"}]}),
    );
    let noms = Nominations::default();
    let input = CycleInput {
        cache: &c,
        nominations: &noms,
        default_selector: None,
        percentage_of_nodes_to_score: 0,
    };
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..64u64 {
        let mut s = seed;
        let got = schedule(&p, &input, 0, &mut || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s >> 33
        })
        .expect("fits");
        seen.insert(got.node);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["dedicated", "ordinary"]);
}

#[test]
fn topology_spread_on_zones_without_zone_labels_leaves_pods_pending() {
    let c = cache(vec![plain("a"), plain("b"), plain("c")], vec![]);
    let p = pod_info(json!({
        "metadata": {"name": "web-1", "labels": {"app": "web"}},
        "spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                  "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                 "containers": [{"name": "c", "image": "x"}]}
    }));
    assert_eq!(
        message(&p, &c),
        "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints (missing required label)."
    );
}

#[test]
fn topology_spread_skew_counts_the_emptiest_domain() {
    let web = |name: &str| {
        pod_info(
            json!({"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                           "labelSelector": {"matchLabels": {"app": "web"}}}],
            "containers": [{"name": "c", "image": "x"}]}}),
        )
    };
    let c = cache(
        vec![
            node("a1", "4", "8Gi", json!({"zone": "a"}), json!([])),
            node("b1", "4", "8Gi", json!({"zone": "b"}), json!([])),
        ],
        vec![(web("w1"), "a1")],
    );
    // Zone a has 1, zone b 0: a second pod in a would make the skew 2.
    assert_eq!(run(&web("w2"), &c).expect("fits").node, "b1");
}

#[test]
fn required_anti_affinity_leaves_the_extra_replica_pending() {
    let replica = |name: &str| {
        pod_info(
            json!({"metadata": {"name": name, "labels": {"app": "coredns"}}, "spec": {
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "coredns"}}, "topologyKey": "kubernetes.io/hostname"}]}},
            "containers": [{"name": "c", "image": "x"}]}}),
        )
    };
    let c = cache(
        vec![plain("n1"), plain("n2")],
        vec![(replica("r1"), "n1"), (replica("r2"), "n2")],
    );
    let fit = run(&replica("r3"), &c).expect_err("pending");
    assert_eq!(
        fit.message(),
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    );
    // A pod without anti-affinity of its own is kept off nodes by the placed pods' rules.
    let other = pod_info(json!({"metadata": {"name": "o", "labels": {"app": "coredns"}},
                                "spec": {"containers": [{"name": "c", "image": "x"}]}}));
    assert_eq!(
        message(&other, &c),
        "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."
    );
}

#[test]
fn required_affinity_lets_the_first_pod_of_a_group_in() {
    let member = |name: &str| {
        pod_info(
            json!({"metadata": {"name": name, "labels": {"app": "cache"}}, "spec": {
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}]}},
            "containers": [{"name": "c", "image": "x"}]}}),
        )
    };
    let c = cache(vec![plain("n1"), plain("n2")], vec![]);
    assert!(run(&member("first"), &c).is_ok());
    let c = cache(vec![plain("n1"), plain("n2")], vec![(member("first"), "n2")]);
    assert_eq!(run(&member("second"), &c).expect("fits").node, "n2");
    let stranger = pod_info(
        json!({"metadata": {"name": "s", "labels": {"app": "web"}}, "spec": {
        "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}},
        "containers": [{"name": "c", "image": "x"}]}}),
    );
    assert_eq!(
        message(&stranger, &c),
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."
    );
}

#[test]
fn host_ports_conflict_only_on_the_same_port_and_protocol() {
    let hp = |name: &str, port: i32, proto: &str| {
        pod(
            name,
            json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": port, "protocol": proto}]}]}),
        )
    };
    let c = cache(vec![plain("a")], vec![(hp("web", 8080, "TCP"), "a")]);
    assert_eq!(
        message(&hp("clash", 8080, "TCP"), &c),
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
    );
    assert!(run(&hp("udp", 8080, "UDP"), &c).is_ok());
    assert!(run(&hp("other", 8081, "TCP"), &c).is_ok());
}

#[test]
fn required_node_affinity_and_scores_prefer_what_is_asked() {
    let c = cache(
        vec![
            node("ssd", "4", "8Gi", json!({"disk": "ssd"}), json!([])),
            node("hdd", "4", "8Gi", json!({"disk": "hdd"}), json!([])),
        ],
        vec![],
    );
    let preferring = pod(
        "p",
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}},
               "containers": [{"name": "c", "image": "x"}]}),
    );
    for _ in 0..10 {
        assert_eq!(run(&preferring, &c).expect("fits").node, "ssd");
    }
    // PreferNoSchedule lowers a node's score; least allocated prefers the emptier node.
    let c = cache(
        vec![
            node(
                "soft",
                "4",
                "8Gi",
                json!({}),
                json!([{"key": "k", "effect": "PreferNoSchedule"}]),
            ),
            plain("clean"),
        ],
        vec![],
    );
    assert_eq!(
        run(&requesting("p", "100m", "100Mi"), &c).expect("fits").node,
        "clean"
    );
    let c = cache(
        vec![plain("busy"), plain("idle")],
        vec![(requesting("load", "3", "6Gi"), "busy")],
    );
    assert_eq!(
        run(&requesting("p", "100m", "100Mi"), &c).expect("fits").node,
        "idle"
    );
}

#[test]
fn cordoned_nodes_get_no_new_pods_unless_tolerated() {
    let mut cordoned = (*plain("a")).clone();
    cordoned.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    let c = cache(vec![Arc::new(cordoned)], vec![]);
    assert_eq!(
        message(&pod("p", json!({"containers": []})), &c),
        "0/1 nodes are available: 1 node(s) were unschedulable."
    );
    let daemon = pod(
        "ds",
        json!({"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
               "containers": []}),
    );
    assert!(run(&daemon, &c).is_ok());
}

#[test]
fn no_nodes_at_all() {
    let c = cache(vec![], vec![]);
    assert_eq!(
        message(&pod("p", json!({"containers": []})), &c),
        "no nodes available to schedule pods"
    );
}

fn prioritized(name: &str, priority: i32, cpu: &str, labels: Value) -> Arc<PodInfo> {
    pod_info(
        json!({"metadata": {"name": name, "labels": labels}, "spec": {"priority": priority,
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}}),
    )
}

#[test]
fn preemption_evicts_the_fewest_lowest_priority_pods() {
    let c = cache(
        vec![node("a", "2", "8Gi", json!({}), json!([]))],
        vec![
            (prioritized("low", 0, "1", json!({})), "a"),
            (prioritized("mid", 100, "1", json!({})), "a"),
        ],
    );
    let urgent = prioritized("urgent", 1000, "1", json!({}));
    let fit = run(&urgent, &c).expect_err("full");
    match preemption::preempt(&urgent, &fit, &c, &Nominations::default(), &[]) {
        Outcome::Chosen(cand) => {
            assert_eq!(cand.node, "a");
            let names: Vec<&str> = cand.victims.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(names, ["low"], "mid is reprieved: one victim is enough");
        }
        other => panic!("want a candidate, got {other:?}"),
    }
    // Equal priority pods are never victims.
    let peer = prioritized("peer", 0, "1", json!({}));
    let fit = run(&peer, &c).expect_err("full");
    let outcome = preemption::preempt(&peer, &fit, &c, &Nominations::default(), &[]);
    assert_eq!(
        outcome.message().as_deref(),
        Some("preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")
    );
    let never = pod_info(
        json!({"metadata": {"name": "n"}, "spec": {"priority": 1000, "preemptionPolicy": "Never",
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}),
    );
    let fit = run(&never, &c).expect_err("full");
    assert_eq!(
        preemption::preempt(&never, &fit, &c, &Nominations::default(), &[])
            .message()
            .as_deref(),
        Some("preemption: not eligible due to preemptionPolicy=Never.")
    );
}

#[test]
fn preemption_prefers_nodes_where_no_budget_is_violated() {
    let c = cache(
        vec![
            node("guarded", "1", "8Gi", json!({}), json!([])),
            node("free", "1", "8Gi", json!({}), json!([])),
        ],
        vec![
            (prioritized("db-0", 0, "1", json!({"app": "db"})), "guarded"),
            (prioritized("batch", 0, "1", json!({"app": "batch"})), "free"),
        ],
    );
    let budget = Budget {
        namespace: "default".into(),
        selector: serde_json::from_value(json!({"matchLabels": {"app": "db"}})).ok(),
        allowed: 0,
        disrupted: Default::default(),
    };
    let urgent = prioritized("urgent", 1000, "1", json!({}));
    let fit = run(&urgent, &c).expect_err("full");
    match preemption::preempt(&urgent, &fit, &c, &Nominations::default(), &[budget]) {
        Outcome::Chosen(cand) => {
            assert_eq!(cand.node, "free");
            assert_eq!(cand.violations, 0);
        }
        other => panic!("want a candidate, got {other:?}"),
    }
}

#[test]
fn nominated_pods_keep_their_room() {
    let c = cache(vec![node("a", "1", "8Gi", json!({}), json!([]))], vec![]);
    let mut noms = Nominations::default();
    noms.set(prioritized("urgent", 1000, "1", json!({})), "a");
    let input = CycleInput {
        cache: &c,
        nominations: &noms,
        default_selector: None,
        percentage_of_nodes_to_score: 0,
    };
    let low = prioritized("low", 0, "500m", json!({}));
    assert!(
        schedule(&low, &input, 0, &mut || 0).is_err(),
        "the room is nominated"
    );
    let higher = prioritized("higher", 2000, "500m", json!({}));
    assert!(
        schedule(&higher, &input, 0, &mut || 0).is_ok(),
        "a higher priority pod ignores it"
    );
}

#[test]
fn a_node_update_reports_what_filters_read_and_not_heartbeats() {
    let ready = |status: &str, heartbeat: &str| {
        let mut n = (*node("a", "4", "8Gi", json!({"zone": "z1"}), json!([]))).clone();
        n.status.get_or_insert_with(Default::default).conditions = Some(vec![
            serde_json::from_value(json!({"type": "Ready", "status": status,
                "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-01-01T00:00:00Z"}))
            .expect("condition"),
        ]);
        Arc::new(n)
    };
    let mut c = Cache::default();
    assert!(c.upsert_node(ready("True", "2026-01-01T00:00:00Z")).added);
    let heartbeat = c.upsert_node(ready("True", "2026-01-01T00:00:10Z"));
    assert!(
        !heartbeat.any(),
        "a heartbeat alone changes nothing: {heartbeat:?}"
    );
    let not_ready = c.upsert_node(ready("False", "2026-01-01T00:00:20Z"));
    assert!(
        not_ready.conditions && !not_ready.labels && !not_ready.allocatable,
        "{not_ready:?}"
    );
    let relabelled = c.upsert_node(node("a", "4", "8Gi", json!({"zone": "z2"}), json!([])));
    assert!(relabelled.labels && !relabelled.allocatable, "{relabelled:?}");
    // What node affinity matches the cached node against: its name and current labels.
    let view = c.node("a").expect("cached").view();
    assert_eq!(view.name, Some("a"));
    assert_eq!(view.labels.get("zone").map(String::as_str), Some("z2"));
}
