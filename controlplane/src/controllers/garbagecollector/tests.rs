//! Table tests of the owner graph and the collector's decisions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::reconcile::*;

fn id(kind: &str, name: &str, uid: &str) -> Identity {
    Identity {
        api_version: if kind == "ReplicaSet" { "apps/v1" } else { "v1" }.into(),
        kind: kind.into(),
        namespace: Some("default".into()),
        name: name.into(),
        uid: uid.into(),
    }
}

fn owner_ref(kind: &str, name: &str, uid: &str, block: bool) -> OwnerReference {
    OwnerReference {
        api_version: if kind == "ReplicaSet" { "apps/v1" } else { "v1" }.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(block),
    }
}

fn obs(kind: &str, name: &str, uid: &str, owners: Vec<OwnerReference>) -> Observed {
    Observed {
        id: id(kind, name, uid),
        owners,
        deleting: false,
        finalizers: Vec::new(),
        monitor: usize::from(kind == "ReplicaSet"),
    }
}

fn terminating(mut o: Observed, finalizer: &str) -> Observed {
    o.deleting = true;
    o.finalizers = vec![finalizer.into()];
    o
}

fn ns(_: &str, _: &str) -> bool {
    true
}

fn del(uid: &str) -> Work {
    Work::AttemptToDelete(uid.into())
}

/// An RS `rs` (uid r) with pods p1, p2 (blocking) and p3 (not blocking).
fn rs_with_pods() -> Graph {
    let mut g = Graph::default();
    assert!(g.upsert(obs("ReplicaSet", "rs", "r", vec![]), ns).is_empty());
    for (p, block) in [("p1", true), ("p2", true), ("p3", false)] {
        let w = g.upsert(
            obs("Pod", p, p, vec![owner_ref("ReplicaSet", "rs", "r", block)]),
            ns,
        );
        assert!(w.is_empty(), "{p}: the owner is known");
    }
    g
}

#[test]
fn background_deleting_an_owner_queues_its_dependents() {
    let mut g = rs_with_pods();
    assert_eq!(g.remove("r"), [del("p1"), del("p2"), del("p3")]);
    // The owner stays as a virtual node while dependents name it.
    assert!(g.nodes["r"].observed.is_none());
    // Each dependent, its owner missing, is deleted in the background.
    let d = attempt_to_delete(&Item::default(), &[("r".into(), OwnerState::Dangling)]);
    assert_eq!(
        d,
        Decision::Delete {
            policy: Policy::Background,
            unblock: false
        }
    );
    for p in ["p1", "p2", "p3"] {
        g.remove(p);
    }
    assert!(
        g.nodes.is_empty(),
        "the virtual owner goes with its last dependent"
    );
}

#[test]
fn an_unknown_owner_is_a_virtual_node_verified_before_anything_happens() {
    let mut g = Graph::default();
    let w = g.upsert(
        obs("Pod", "p", "p", vec![owner_ref("ReplicaSet", "rs", "r", true)]),
        ns,
    );
    assert_eq!(w, [del("r")], "the virtual owner is checked");
    assert!(g.nodes["r"].observed.is_none());
    assert_eq!(g.nodes["r"].id.kind, "ReplicaSet");
    assert_eq!(g.nodes["r"].id.namespace.as_deref(), Some("default"));
    // Observed later: no longer virtual, nothing to do.
    assert!(g.upsert(obs("ReplicaSet", "rs", "r", vec![]), ns).is_empty());
    assert!(g.nodes["r"].observed.is_some());
    assert!(g.nodes["r"].dependents.contains("p"));
    // Found missing instead: its dependents are looked at.
    let mut g2 = Graph::default();
    g2.upsert(
        obs("Pod", "p", "p", vec![owner_ref("ReplicaSet", "rs", "r", true)]),
        ns,
    );
    assert_eq!(g2.remove("r"), [del("p")]);
}

#[test]
fn a_cluster_scoped_owner_has_no_namespace() {
    let mut g = Graph::default();
    let mut r = owner_ref("Node", "n1", "n", false);
    r.api_version = "v1".into();
    g.upsert(obs("Pod", "p", "p", vec![r]), |_, k| k != "Node");
    assert_eq!(g.nodes["n"].id.namespace, None);
}

#[test]
fn decisions_over_owner_states() {
    let solid = ("a".to_string(), OwnerState::Solid);
    let dangling = ("b".to_string(), OwnerState::Dangling);
    let waiting = ("c".to_string(), OwnerState::WaitingForDependents);
    let plain = Item::default();
    let with_dependents = Item {
        dependents: vec![("x".into(), false)],
        ..Item::default()
    };
    let in_cycle = Item {
        dependents: vec![("x".into(), true)],
        ..Item::default()
    };
    let orphan_fin = Item {
        finalizers: vec![ORPHAN.into()],
        ..Item::default()
    };
    let bg = Decision::Delete {
        policy: Policy::Background,
        unblock: false,
    };
    type Case<'a> = (&'a str, &'a Item, Vec<(String, OwnerState)>, Decision);
    let cases: Vec<Case> = vec![
        ("no owners", &plain, vec![], Decision::Nothing),
        (
            "a solid owner keeps it",
            &plain,
            vec![solid.clone()],
            Decision::Nothing,
        ),
        (
            "solid and dangling: drop the dangling reference",
            &plain,
            vec![solid.clone(), dangling.clone()],
            Decision::RemoveOwnerReferences(vec!["b".into()]),
        ),
        (
            "solid and waiting: drop the waiting owner's reference",
            &plain,
            vec![waiting.clone(), solid.clone()],
            Decision::RemoveOwnerReferences(vec!["c".into()]),
        ),
        (
            "only dangling (missing or uid mismatch)",
            &plain,
            vec![dangling.clone()],
            bg.clone(),
        ),
        (
            "waiting owner, no dependents: background",
            &plain,
            vec![waiting.clone()],
            bg.clone(),
        ),
        (
            "waiting owner with dependents: foreground",
            &with_dependents,
            vec![waiting.clone()],
            Decision::Delete {
                policy: Policy::Foreground,
                unblock: false,
            },
        ),
        (
            "waiting owner, a dependent waits too (cycle): unblock first",
            &in_cycle,
            vec![waiting.clone()],
            Decision::Delete {
                policy: Policy::Foreground,
                unblock: true,
            },
        ),
        (
            "its own orphan finalizer is kept as the policy",
            &orphan_fin,
            vec![dangling.clone()],
            Decision::Delete {
                policy: Policy::Orphan,
                unblock: false,
            },
        ),
    ];
    for (what, item, owners, want) in cases {
        assert_eq!(attempt_to_delete(item, &owners), want, "{what}");
    }
}

#[test]
fn foreground_deletion_deletes_blocking_dependents_then_releases_the_owner() {
    let mut g = rs_with_pods();
    let w = g.upsert(terminating(obs("ReplicaSet", "rs", "r", vec![]), FOREGROUND), ns);
    assert_eq!(w, [del("p1"), del("p2"), del("p3"), del("r")]);
    assert_eq!(
        g.blocking_dependents("r"),
        [("p1".to_string(), false), ("p2".to_string(), false)]
    );
    let owner = |g: &Graph| Item {
        deleting: true,
        finalizers: vec![FOREGROUND.into()],
        blocking: g.blocking_dependents("r"),
        ..Item::default()
    };
    assert_eq!(
        attempt_to_delete(&owner(&g), &[]),
        Decision::DeleteDependents(vec!["p1".into(), "p2".into()])
    );
    // A pod sees its owner waiting: deleted (no dependents of its own: background).
    assert_eq!(
        attempt_to_delete(
            &Item::default(),
            &[("r".into(), OwnerState::WaitingForDependents)]
        ),
        Decision::Delete {
            policy: Policy::Background,
            unblock: false
        }
    );
    // Each blocking pod gone re-queues the owner; with none left its finalizer goes, while
    // the non-blocking p3 does not hold it.
    assert_eq!(g.remove("p1"), [del("r")]);
    assert_eq!(
        attempt_to_delete(&owner(&g), &[]),
        Decision::DeleteDependents(vec!["p2".into()])
    );
    assert_eq!(g.remove("p2"), [del("r")]);
    assert_eq!(
        attempt_to_delete(&owner(&g), &[]),
        Decision::RemoveForegroundFinalizer
    );
    // A dependent that drops its blocking reference also releases the owner.
    let mut g = rs_with_pods();
    g.upsert(terminating(obs("ReplicaSet", "rs", "r", vec![]), FOREGROUND), ns);
    let w = g.upsert(
        obs("Pod", "p1", "p1", vec![owner_ref("ReplicaSet", "rs", "r", false)]),
        ns,
    );
    assert_eq!(w, [del("r")]);
    assert_eq!(g.blocking_dependents("r"), [("p2".to_string(), false)]);
}

#[test]
fn a_terminating_item_is_left_alone_unless_it_waits_for_dependents() {
    let item = Item {
        deleting: true,
        finalizers: vec!["example.com/x".into()],
        ..Item::default()
    };
    assert_eq!(
        attempt_to_delete(&item, &[("a".into(), OwnerState::Dangling)]),
        Decision::Nothing
    );
    // Its blocking dependents already wait for theirs: nothing more to start.
    let waiting = Item {
        deleting: true,
        finalizers: vec![FOREGROUND.into()],
        blocking: vec![("d".into(), true)],
        ..Item::default()
    };
    assert_eq!(attempt_to_delete(&waiting, &[]), Decision::Nothing);
}

#[test]
fn orphan_finalizer_queues_an_orphaning_once() {
    let mut g = rs_with_pods();
    let w = g.upsert(terminating(obs("ReplicaSet", "rs", "r", vec![]), ORPHAN), ns);
    assert_eq!(w, [Work::AttemptToOrphan("r".into())]);
    // A later change of the terminating owner does not queue it again.
    let again = g.upsert(terminating(obs("ReplicaSet", "rs", "r", vec![]), ORPHAN), ns);
    assert!(again.is_empty());
    // A pod orphaned (reference removed) leaves the owner's dependents.
    g.upsert(obs("Pod", "p1", "p1", vec![]), ns);
    assert!(!g.nodes["r"].dependents.contains("p1"));
    let refs = vec![
        owner_ref("ReplicaSet", "rs", "r", true),
        owner_ref("ReplicaSet", "other", "o", false),
    ];
    let left = without_owners(&refs, &["r".into()]);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].uid, "o");
}

#[test]
fn a_cycle_of_owners_is_kept_while_both_exist_and_unblocked_on_foreground_deletion() {
    // a owns b, b owns a.
    let mut g = Graph::default();
    g.upsert(obs("Pod", "a", "a", vec![owner_ref("Pod", "b", "b", true)]), ns);
    g.upsert(obs("Pod", "b", "b", vec![owner_ref("Pod", "a", "a", true)]), ns);
    assert!(g.nodes["a"].observed.is_some() && g.nodes["b"].observed.is_some());
    assert_eq!(
        attempt_to_delete(&Item::default(), &[("b".into(), OwnerState::Solid)]),
        Decision::Nothing,
        "both exist: neither is garbage"
    );
    // a is deleted in the foreground: b is queued, and b's dependent a waits, so b's
    // references are unblocked before b is deleted in the foreground.
    let w = g.upsert(
        terminating(
            obs("Pod", "a", "a", vec![owner_ref("Pod", "b", "b", true)]),
            FOREGROUND,
        ),
        ns,
    );
    assert_eq!(w, [del("b"), del("a")]);
    let b = Item {
        dependents: vec![("a".into(), g.nodes["a"].deleting_dependents())],
        ..Item::default()
    };
    assert_eq!(
        attempt_to_delete(&b, &[("a".into(), OwnerState::WaitingForDependents)]),
        Decision::Delete {
            policy: Policy::Foreground,
            unblock: true
        }
    );
    let unblocked_refs = unblocked(&[owner_ref("Pod", "a", "a", true)]);
    assert_eq!(unblocked_refs[0].block_owner_deletion, Some(false));
    // b unblocked: a has no blocking dependent left and loses its finalizer.
    let w = g.upsert(
        terminating(
            obs("Pod", "b", "b", vec![owner_ref("Pod", "a", "a", false)]),
            FOREGROUND,
        ),
        ns,
    );
    assert!(w.contains(&del("a")));
    assert!(g.blocking_dependents("a").is_empty());
}

#[test]
fn a_relist_removes_what_disappeared_meanwhile() {
    let mut g = rs_with_pods();
    let seen = ["r".to_string()].into_iter().collect();
    // Monitor 1 (ReplicaSets) relisted with r: nothing gone.
    assert!(g.resync(1, &seen).is_empty());
    // Monitor 1 relisted without r: r is gone, its pods are looked at.
    let w = g.resync(1, &Default::default());
    assert_eq!(w, [del("p1"), del("p2"), del("p3")]);
}

#[test]
fn uid_mismatch_is_a_different_owner() {
    // The pod names rs with uid r; an rs with uid r2 exists (recreated): the reference is
    // dangling (the graph only trusts an owner observed with the same uid).
    let mut g = Graph::default();
    g.upsert(obs("ReplicaSet", "rs", "r2", vec![]), ns);
    let w = g.upsert(
        obs("Pod", "p", "p", vec![owner_ref("ReplicaSet", "rs", "r", true)]),
        ns,
    );
    assert_eq!(w, [del("r")], "the named uid is not in the graph: checked live");
    assert!(g.nodes["r"].observed.is_none());
    assert!(g.nodes["r2"].dependents.is_empty());
}

#[test]
fn a_cluster_scoped_dependent_cannot_name_a_namespaced_owner() {
    let cases = [
        ("namespaced dependent, namespaced owner", true, true, true),
        ("namespaced dependent, cluster-scoped owner", true, false, true),
        (
            "cluster-scoped dependent, cluster-scoped owner",
            false,
            false,
            true,
        ),
        ("cluster-scoped dependent, namespaced owner", false, true, false),
    ];
    for (what, dep, owner, want) in cases {
        assert_eq!(resolvable(dep, owner), want, "{what}");
    }
}
