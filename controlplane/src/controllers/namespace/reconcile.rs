//! The namespace deleter's conditions and decision, free of I/O (upstream's
//! `namespaceConditionUpdater` and the end of `deleteAllContent`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::NamespaceCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The condition types the controller maintains, in upstream's order, with their reason and
/// message when all is well.
pub const CONDITIONS: [(&str, &str, &str); 5] = [
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
];

/// What is left of one resource in the namespace after a deletion pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remaining {
    /// `plural.group` as upstream prints it (`pods.` for the core group).
    pub resource: String,
    pub count: usize,
    /// Finalizer → objects still holding it.
    pub finalizers: BTreeMap<String, usize>,
}

/// One deletion pass over the namespace's content.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// Resources the namespace's listing failed for (upstream's discovery failures).
    pub discovery_errors: Vec<String>,
    /// Deletion errors, one per resource that failed.
    pub delete_errors: Vec<String>,
    pub remaining: Vec<Remaining>,
}

impl Pass {
    /// Whether the namespace is empty and may be finalized.
    pub fn done(&self) -> bool {
        self.discovery_errors.is_empty()
            && self.delete_errors.is_empty()
            && self.remaining.iter().all(|r| r.count == 0)
    }
}

/// The failing conditions of a pass, by type: (reason, message).
fn failures(pass: &Pass) -> BTreeMap<&'static str, (&'static str, String)> {
    let mut out = BTreeMap::new();
    if !pass.discovery_errors.is_empty() {
        out.insert(
            "NamespaceDeletionDiscoveryFailure",
            (
                "DiscoveryFailed",
                format!(
                    "Discovery failed for some groups, {} failing: {}",
                    pass.discovery_errors.len(),
                    pass.discovery_errors.join(", ")
                ),
            ),
        );
    }
    if !pass.delete_errors.is_empty() {
        out.insert(
            "NamespaceDeletionContentFailure",
            (
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    pass.delete_errors.len(),
                    pass.delete_errors.join(", ")
                ),
            ),
        );
    }
    let mut resources: Vec<String> = pass
        .remaining
        .iter()
        .filter(|r| r.count > 0)
        .map(|r| format!("{} has {} resource instances", r.resource, r.count))
        .collect();
    resources.sort();
    if !resources.is_empty() {
        out.insert(
            "NamespaceContentRemaining",
            (
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", resources.join(", ")),
            ),
        );
    }
    let mut finalizers: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &pass.remaining {
        for (f, n) in &r.finalizers {
            *finalizers.entry(f).or_default() += n;
        }
    }
    if !finalizers.is_empty() {
        let list: Vec<String> = finalizers
            .iter()
            .map(|(f, n)| format!("{f} in {n} resource instances"))
            .collect();
        out.insert(
            "NamespaceFinalizersRemaining",
            (
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    list.join(", ")
                ),
            ),
        );
    }
    out
}

/// The namespace's conditions after `pass`: every maintained type, `True` with the failure or
/// `False` with upstream's all-well reason; a condition whose status, reason and message did
/// not change keeps its lastTransitionTime. Other condition types stay as they were.
pub fn conditions(
    current: &[NamespaceCondition],
    pass: &Pass,
    now: DateTime<Utc>,
) -> Vec<NamespaceCondition> {
    let failing = failures(pass);
    let mut out: Vec<NamespaceCondition> = current
        .iter()
        .filter(|c| !CONDITIONS.iter().any(|(t, _, _)| *t == c.type_))
        .cloned()
        .collect();
    for (t, ok_reason, ok_message) in CONDITIONS {
        let (status, reason, message) = match failing.get(t) {
            Some((r, m)) => ("True", *r, m.clone()),
            None => ("False", ok_reason, ok_message.to_string()),
        };
        let old = current.iter().find(|c| c.type_ == t);
        let unchanged = old.is_some_and(|c| {
            c.status == status
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message.as_str())
        });
        let last = match old {
            Some(c) if unchanged => c.last_transition_time.clone(),
            _ => Some(Time(now)),
        };
        out.push(NamespaceCondition {
            type_: t.to_string(),
            status: status.to_string(),
            reason: Some(reason.to_string()),
            message: Some(message),
            last_transition_time: last,
        });
    }
    out
}
