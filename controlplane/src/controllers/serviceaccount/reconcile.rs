//! The ServiceAccounts controller's decision, free of I/O.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::ObjectMeta;

/// The accounts every namespace has (kube-controller-manager's default `--service-account-names`
/// is just `default`).
pub const ACCOUNTS: &[&str] = &["default"];

/// Whether objects may be created in `ns` (Active, not terminating).
pub fn active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Active")
}

/// The accounts to create in `ns`, given which exist (`exists(name)`).
pub fn missing(ns: &Namespace, exists: impl Fn(&str) -> bool) -> Vec<ServiceAccount> {
    if !active(ns) {
        return Vec::new();
    }
    ACCOUNTS
        .iter()
        .filter(|a| !exists(a))
        .map(|a| ServiceAccount {
            metadata: ObjectMeta {
                name: Some(a.to_string()),
                namespace: ns.metadata.name.clone(),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        })
        .collect()
}
