//! Table tests of the ServiceAccounts controller.

use k8s_openapi::api::core::v1::{Namespace, NamespaceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;

use super::reconcile::missing;

fn ns(phase: Option<&str>, deleting: bool) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some("team".into()),
            deletion_timestamp: deleting.then(|| Time(chrono::Utc::now())),
            ..ObjectMeta::default()
        },
        status: phase.map(|p| NamespaceStatus {
            phase: Some(p.into()),
            ..NamespaceStatus::default()
        }),
        ..Namespace::default()
    }
}

#[test]
fn the_default_account_is_created_in_active_namespaces_only() {
    let cases = [
        ("active, missing", ns(Some("Active"), false), false, 1),
        ("no phase yet, missing", ns(None, false), false, 1),
        ("active, present", ns(Some("Active"), false), true, 0),
        ("terminating", ns(Some("Terminating"), true), false, 0),
        (
            "deleting, phase not updated yet",
            ns(Some("Active"), true),
            false,
            0,
        ),
    ];
    for (what, n, exists, want) in cases {
        let got = missing(&n, |_| exists);
        assert_eq!(got.len(), want, "{what}");
        if let Some(sa) = got.first() {
            assert_eq!(sa.metadata.name.as_deref(), Some("default"));
            assert_eq!(sa.metadata.namespace.as_deref(), Some("team"));
        }
    }
}
