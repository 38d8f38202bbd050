//! ControllerRevisions, the history of StatefulSets and DaemonSets (upstream's
//! `controller/history` and the two controllers' `getPatch`): a revision holds a strategic merge
//! patch that puts its pod template back (`{"spec": {"template": {..., "$patch": "replace"}}}`,
//! which `kubectl rollout undo` sends as is), a number (`revision`), the owner's template labels
//! (so `kubectl rollout history` finds it by the owner's selector) and the owner's annotations
//! (the change cause). Names are `<owner>-<hash>`, the hash in Kubernetes' safe alphabet.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};

use super::podutil::controller_owner;

/// The label with a revision's hash (upstream's `ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// FNV-1a, 32 bits.
pub fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Kubernetes' `rand.SafeEncodeString`: each byte mapped onto an alphabet without vowels and
/// look-alike digits (so hashes never spell words).
pub fn safe_encode(s: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    s.bytes()
        .map(|b| char::from(ALPHANUMS[usize::from(b) % ALPHANUMS.len()]))
        .collect()
}

/// The hash of `data` (and of `collision_count`, when given) as a name suffix.
pub fn hash_data(data: &Value, collision_count: Option<i32>) -> String {
    let mut bytes = serde_json::to_vec(data).unwrap_or_default();
    if let Some(c) = collision_count {
        bytes.extend_from_slice(c.to_string().as_bytes());
    }
    safe_encode(&fnv32a(&bytes).to_string())
}

/// The hash of a pod template (a DaemonSet's `controller-revision-hash`, upstream's
/// `ComputeHash`).
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    hash_data(
        &serde_json::to_value(template).unwrap_or_default(),
        collision_count,
    )
}

/// The patch a revision of `template` stores.
pub fn template_patch(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Some(m) = t.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The pod template a revision puts back.
pub fn template_of(rev: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = rev.data.as_ref()?.0.get("spec")?.get("template")?.clone();
    if let Some(m) = t.as_object_mut() {
        m.remove("$patch");
    }
    serde_json::from_value(t).ok()
}

/// Whether two revisions hold the same state (upstream's `EqualRevision`: the same data).
pub fn same_data(a: &ControllerRevision, b: &Value) -> bool {
    a.data.as_ref().is_some_and(|d| d.0 == *b)
}

/// `<prefix>-<hash>`, the prefix cut so the name fits in 253 characters.
pub fn revision_name(prefix: &str, hash: &str) -> String {
    let keep = prefix.len().min(223);
    let mut end = keep;
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{hash}", &prefix[..end])
}

/// A new revision of `owner` (a `kind` of `apps/v1`) holding `data`.
pub fn new_revision(
    owner: &ObjectMeta,
    kind: &str,
    template: &PodTemplateSpec,
    data: Value,
    revision: i64,
    hash: &str,
) -> ControllerRevision {
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(owner.name.as_deref().unwrap_or_default(), hash)),
            namespace: owner.namespace.clone(),
            labels: Some(labels),
            annotations: owner.annotations.clone().map(|mut a| {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
                a
            }),
            owner_references: Some(vec![controller_owner("apps/v1", kind, owner)]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data)),
        revision,
    }
}

/// Sorts revisions by number, then by creation time and name (upstream's `SortControllerRevisions`).
pub fn sort(revs: &mut [Arc<ControllerRevision>]) {
    revs.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then_with(|| {
                let t = |r: &ControllerRevision| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// The number after the highest of `revs` (1 for none).
pub fn next_number(revs: &[Arc<ControllerRevision>]) -> i64 {
    revs.iter().map(|r| r.revision).max().unwrap_or(0) + 1
}

/// Revisions to delete so that at most `limit` of those not in `live` remain, oldest first.
pub fn surplus<'a>(
    sorted: &'a [Arc<ControllerRevision>],
    live: &dyn Fn(&str) -> bool,
    limit: i32,
) -> Vec<&'a Arc<ControllerRevision>> {
    let old: Vec<&Arc<ControllerRevision>> = sorted
        .iter()
        .filter(|r| !live(r.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    let limit = usize::try_from(limit).unwrap_or(0);
    let n = old.len().saturating_sub(limit);
    old.into_iter().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_encoding_maps_digits_like_upstream() {
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
    }

    #[test]
    fn a_template_round_trips_through_its_patch() {
        let t: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
        }))
        .expect("template");
        let data = template_patch(&t);
        assert_eq!(data["spec"]["template"]["$patch"], "replace");
        let owner = ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("u".into()),
            ..ObjectMeta::default()
        };
        let hash = hash_data(&data, None);
        let rev = new_revision(&owner, "StatefulSet", &t, data.clone(), 1, &hash);
        assert_eq!(rev.metadata.name.as_deref(), Some(format!("web-{hash}").as_str()));
        assert_eq!(template_of(&rev), Some(t));
        assert!(same_data(&rev, &data));
        assert_ne!(
            hash,
            hash_data(&data, Some(1)),
            "a collision count changes the name"
        );
    }
}
