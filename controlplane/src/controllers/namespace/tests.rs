//! Table tests of the namespace deleter's conditions.

use chrono::{TimeZone, Utc};
use k8s_openapi::api::core::v1::NamespaceCondition;

use super::reconcile::*;

fn find<'a>(c: &'a [NamespaceCondition], t: &str) -> &'a NamespaceCondition {
    c.iter().find(|c| c.type_ == t).expect(t)
}

fn row(c: &NamespaceCondition) -> (String, String, String) {
    (
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    )
}

#[test]
fn an_empty_namespace_has_every_condition_false_with_upstreams_texts() {
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("time");
    let pass = Pass::default();
    assert!(pass.done());
    let c = conditions(&[], &pass, now);
    let got: Vec<(String, String, String, String)> = c
        .iter()
        .map(|c| {
            let (s, r, m) = row(c);
            (c.type_.clone(), s, r, m)
        })
        .collect();
    let want = [
        (
            "NamespaceDeletionDiscoveryFailure",
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        (
            "NamespaceDeletionGroupVersionParsingFailure",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        (
            "NamespaceDeletionContentFailure",
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        (
            "NamespaceContentRemaining",
            "ContentRemoved",
            "All content successfully removed",
        ),
        (
            "NamespaceFinalizersRemaining",
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
    ]
    .map(|(t, r, m)| (t.to_string(), "False".to_string(), r.to_string(), m.to_string()));
    assert_eq!(got, want);
}

#[test]
fn remaining_content_and_finalizers_are_reported_as_upstream_words_them() {
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("time");
    let pass = Pass {
        remaining: vec![
            Remaining {
                resource: "pods.".into(),
                count: 2,
                ..Remaining::default()
            },
            Remaining {
                resource: "configmaps.".into(),
                count: 1,
                finalizers: [("example.com/hold".to_string(), 1)].into_iter().collect(),
            },
            Remaining {
                resource: "deployments.apps".into(),
                count: 1,
                finalizers: [
                    ("example.com/hold".to_string(), 1),
                    ("foregroundDeletion".to_string(), 1),
                ]
                .into_iter()
                .collect(),
            },
        ],
        delete_errors: vec!["team for gvr: v1, Resource=secrets: boom".into()],
        ..Pass::default()
    };
    assert!(!pass.done());
    let c = conditions(&[], &pass, now);
    assert_eq!(
        row(find(&c, "NamespaceContentRemaining")),
        (
            "True".into(),
            "SomeResourcesRemain".into(),
            "Some resources are remaining: configmaps. has 1 resource instances, deployments.apps has 1 resource instances, pods. has 2 resource instances".into()
        )
    );
    assert_eq!(
        row(find(&c, "NamespaceFinalizersRemaining")),
        (
            "True".into(),
            "SomeFinalizersRemain".into(),
            "Some content in the namespace has finalizers remaining: example.com/hold in 2 resource instances, foregroundDeletion in 1 resource instances".into()
        )
    );
    assert_eq!(
        row(find(&c, "NamespaceDeletionContentFailure")),
        (
            "True".into(),
            "ContentDeletionFailed".into(),
            "Failed to delete all resource types, 1 remaining: team for gvr: v1, Resource=secrets: boom"
                .into()
        )
    );
    assert_eq!(find(&c, "NamespaceDeletionDiscoveryFailure").status, "False");
    let listing = Pass {
        discovery_errors: vec!["v1/pods: timeout".into()],
        ..Pass::default()
    };
    assert!(!listing.done());
    assert_eq!(
        row(find(
            &conditions(&[], &listing, now),
            "NamespaceDeletionDiscoveryFailure"
        )),
        (
            "True".into(),
            "DiscoveryFailed".into(),
            "Discovery failed for some groups, 1 failing: v1/pods: timeout".into()
        )
    );
}

#[test]
fn an_unchanged_condition_keeps_its_transition_time() {
    let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("time");
    let t1 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 9).single().expect("time");
    let remaining = Pass {
        remaining: vec![Remaining {
            resource: "pods.".into(),
            count: 1,
            ..Remaining::default()
        }],
        ..Pass::default()
    };
    let first = conditions(&[], &remaining, t0);
    let again = conditions(&first, &remaining, t1);
    assert_eq!(
        first, again,
        "nothing changed: the same conditions, nothing to write"
    );
    let emptied = conditions(&first, &Pass::default(), t1);
    let c = find(&emptied, "NamespaceContentRemaining");
    assert_eq!(c.status, "False");
    assert_eq!(c.last_transition_time.as_ref().map(|t| t.0), Some(t1));
    let d = find(&emptied, "NamespaceDeletionDiscoveryFailure");
    assert_eq!(d.last_transition_time.as_ref().map(|t| t.0), Some(t0));
}
