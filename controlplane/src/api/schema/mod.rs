//! The type schema of the served kinds: which fields a message has, what they hold, and how
//! their lists merge. It is the generated field table in `table.rs` (field numbers, JSON names and
//! the `+listType`/`+patchStrategy`/`+patchMergeKey`/`+listMapKey` markers of the Go types, made
//! by `controlplane/tools/gen-protobuf-schema.py`), seen two ways: as raw `Message`s for the
//! protobuf request decoder, and as a [`Type`] tree so that strategic merge patch and server-side
//! apply follow the same per-type rules as the Go API server (Service `ports` merge by `port`,
//! container `ports` by `containerPort`, ...).

#[rustfmt::skip]
mod table;

use serde_json::{Map, Value};

pub(crate) use table::MESSAGES;

/// Messages with a JSON form of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    /// `metav1.Time`: RFC 3339, seconds.
    Time,
    /// `metav1.MicroTime`: RFC 3339, microseconds.
    MicroTime,
    /// `metav1.Duration`: Go's duration string (no served kind has one today).
    #[allow(dead_code)]
    Duration,
    /// `runtime.RawExtension`, `metav1.FieldsV1`: embedded JSON (or a nested protobuf object).
    RawJson,
    /// `resource.Quantity`: its string.
    Quantity,
    /// `intstr.IntOrString`: a number or a string.
    IntOrString,
}

/// What a field holds.
#[derive(Debug)]
pub(crate) enum Kind {
    Str,
    Bytes,
    Bool,
    Int,
    /// (No served kind has a double today.)
    #[allow(dead_code)]
    Double,
    /// A message: index into the message table.
    Msg(usize),
    /// `map<string, V>`.
    Map(&'static Kind),
}

/// One field of a message.
#[derive(Debug)]
pub(crate) struct Field {
    pub tag: u32,
    /// JSON name; empty for a Go embedded struct whose fields are inlined into the parent.
    pub json: &'static str,
    pub kind: Kind,
    pub repeated: bool,
    /// `+listType` (atomic, set, map), `+patchStrategy`, `+patchMergeKey`, `+listMapKey`s.
    pub list_type: &'static str,
    pub patch_strategy: &'static str,
    pub merge_key: &'static str,
    pub map_keys: &'static [&'static str],
}

/// One protobuf message type.
#[derive(Debug)]
pub(crate) struct Message {
    pub name: &'static str,
    pub special: Option<Special>,
    /// Sorted by tag.
    pub fields: &'static [Field],
}

/// The message index of a top-level kind.
pub(crate) fn kind_message(api_version: &str, kind: &str) -> Option<usize> {
    table::KINDS
        .binary_search_by(|(v, k, _)| (*v, *k).cmp(&(api_version, kind)))
        .ok()
        .map(|i| table::KINDS[i].2)
}

/// The index of the message with the full protobuf `name` (the table is sorted by name).
pub(crate) fn message_named(name: &str) -> Option<usize> {
    MESSAGES.binary_search_by(|m| m.name.cmp(name)).ok()
}

/// The list markers of the table as OpenAPI extensions: (schema name, JSON field, extensions),
/// e.g. `("io.k8s.api.core.v1.PodSpec", "containers", {"x-kubernetes-patch-merge-key": "name", ...})`.
pub(crate) fn list_markers() -> Vec<(String, &'static str, Map<String, Value>)> {
    let mut out = Vec::new();
    for m in MESSAGES {
        let Some(rest) = m.name.strip_prefix("k8s.io.") else {
            continue;
        };
        let def = format!("io.k8s.{rest}");
        for f in m.fields.iter().filter(|f| !f.json.is_empty()) {
            let mut ext = Map::new();
            for (key, v) in [
                ("x-kubernetes-list-type", f.list_type),
                ("x-kubernetes-patch-strategy", f.patch_strategy),
                ("x-kubernetes-patch-merge-key", f.merge_key),
            ] {
                if !v.is_empty() {
                    ext.insert(key.into(), Value::String(v.into()));
                }
            }
            if !f.map_keys.is_empty() {
                ext.insert(
                    "x-kubernetes-list-map-keys".into(),
                    f.map_keys.iter().map(|k| Value::from(*k)).collect(),
                );
            }
            if !ext.is_empty() {
                out.push((def.clone(), f.json, ext));
            }
        }
    }
    out
}

/// A position in the type tree: a message, or unknown (no schema: lists are atomic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Type(Option<usize>);

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced as a whole.
    Atomic,
    /// A set of scalars.
    Set,
    /// Items identified by these key fields.
    Map(&'static [&'static str]),
}

/// What strategic merge patch and apply need to know about one field.
#[derive(Debug, Clone, Copy)]
pub struct FieldType {
    /// The type of the value (of each item for lists, of each value for maps).
    pub ty: Type,
    /// Some for list fields.
    pub list: Option<ListKind>,
    /// The key strategic merge patch merges list items by (`patchStrategy: merge`), if any.
    pub patch_merge_key: Option<&'static str>,
    /// `patchStrategy` includes `merge` (lists of scalars merge as sets under SMP).
    pub patch_merge: bool,
    /// `patchStrategy` includes `retainKeys`.
    pub retain_keys: bool,
    /// A `map<string, V>` field (labels, resources.limits, ...): its keys are not fields of a type.
    pub is_map: bool,
}

impl Type {
    /// No type information.
    pub const UNKNOWN: Type = Type(None);

    /// The type of a top-level kind.
    pub fn of_kind(api_version: &str, kind: &str) -> Type {
        Type(kind_message(api_version, kind))
    }

    /// The type of field `name` of this message (looking through inlined Go structs).
    pub fn field(self, name: &str) -> Option<FieldType> {
        let f = find_field(self.0?, name, 0)?;
        let ty = match f.kind {
            Kind::Msg(i) | Kind::Map(&Kind::Msg(i)) => Type(Some(i)),
            _ => Type::UNKNOWN,
        };
        let scalar = !matches!(f.kind, Kind::Msg(_));
        let list = f.repeated.then(|| {
            let keys: &'static [&'static str] = if !f.map_keys.is_empty() {
                f.map_keys
            } else if !f.merge_key.is_empty() {
                std::slice::from_ref(&f.merge_key)
            } else {
                &[]
            };
            match f.list_type {
                "map" | "" if !keys.is_empty() && !scalar => ListKind::Map(keys),
                "set" => ListKind::Set,
                "" if scalar && f.patch_strategy.contains("merge") => ListKind::Set,
                _ => ListKind::Atomic,
            }
        });
        let patch_merge = f.patch_strategy.split(',').any(|s| s == "merge");
        Some(FieldType {
            ty,
            list,
            patch_merge_key: (patch_merge && !f.merge_key.is_empty()).then_some(f.merge_key),
            patch_merge,
            retain_keys: f.patch_strategy.split(',').any(|s| s == "retainKeys"),
            is_map: matches!(f.kind, Kind::Map(_)),
        })
    }

    /// The type of a field's value (UNKNOWN when the field is not known).
    pub fn child(self, name: &str) -> Type {
        self.field(name).map_or(Type::UNKNOWN, |f| f.ty)
    }

    /// Whether the message has a field `name` (always true for an unknown type).
    pub fn has_field(self, name: &str) -> bool {
        self.0.is_none() || self.field(name).is_some()
    }
}

fn find_field(msg: usize, name: &str, depth: usize) -> Option<&'static Field> {
    let fields = MESSAGES.get(msg)?.fields;
    if let Some(f) = fields.iter().find(|f| f.json == name) {
        return Some(f);
    }
    if depth > 4 {
        return None;
    }
    fields
        .iter()
        .filter(|f| f.json.is_empty())
        .find_map(|f| match f.kind {
            Kind::Msg(i) => find_field(i, name, depth + 1),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::registry::RESOURCES;

    /// The generated table is consistent: sorted tags, indices in range, kinds sorted for lookup.
    #[test]
    fn table_is_consistent() {
        for m in MESSAGES {
            assert!(
                m.fields.windows(2).all(|w| w[0].tag < w[1].tag),
                "{} tags unsorted",
                m.name
            );
            for f in m.fields {
                if let Kind::Msg(i) | Kind::Map(&Kind::Msg(i)) = f.kind {
                    assert!(i < MESSAGES.len());
                }
            }
        }
        assert!(
            table::KINDS
                .windows(2)
                .all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1))
        );
        assert!(MESSAGES.windows(2).all(|w| w[0].name < w[1].name));
        for name in [
            "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions",
            "k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta",
            "k8s.io.apimachinery.pkg.apis.meta.v1.Status",
            "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent",
        ] {
            let i = message_named(name).expect(name);
            assert_eq!(MESSAGES[i].name, name);
        }
        for (v, k) in [
            ("v1", "Pod"),
            ("apps/v1", "Deployment"),
            ("batch/v1", "Job"),
            ("v1", "Namespace"),
        ] {
            assert!(table::KINDS.iter().any(|(a, b, _)| (*a, *b) == (v, k)), "{v} {k}");
        }
    }

    #[test]
    fn every_served_kind_has_a_type() {
        for r in RESOURCES.iter().filter(|r| r.has_schema()) {
            assert_ne!(
                Type::of_kind(&r.api_version(), r.kind),
                Type::UNKNOWN,
                "{} {}",
                r.api_version(),
                r.kind
            );
        }
    }

    #[test]
    fn list_kinds_follow_the_go_markers() {
        let pod_spec = Type::of_kind("v1", "Pod").child("spec");
        let containers = pod_spec.field("containers").expect("containers");
        assert_eq!(containers.list, Some(ListKind::Map(&["name"])));
        assert_eq!(containers.patch_merge_key, Some("name"));
        let ports = containers.ty.field("ports").expect("ports");
        assert_eq!(ports.list, Some(ListKind::Map(&["containerPort", "protocol"])));
        assert_eq!(ports.patch_merge_key, Some("containerPort"));
        let svc_ports = Type::of_kind("v1", "Service")
            .child("spec")
            .field("ports")
            .expect("ports");
        assert_eq!(svc_ports.patch_merge_key, Some("port"));
        assert_eq!(
            pod_spec.field("tolerations").expect("tolerations").list,
            Some(ListKind::Atomic)
        );
        let meta = Type::of_kind("apps/v1", "Deployment").child("metadata");
        assert_eq!(
            meta.field("finalizers").expect("finalizers").list,
            Some(ListKind::Set)
        );
        assert_eq!(meta.field("labels").expect("labels").list, None);
        let cmd = containers.ty.field("command").expect("command");
        assert_eq!(cmd.list, Some(ListKind::Atomic));
        // Inlined Go structs: a volume's emptyDir lives in the embedded VolumeSource.
        let volumes = pod_spec.field("volumes").expect("volumes");
        assert!(volumes.ty.field("emptyDir").is_some());
        let strategy = Type::of_kind("apps/v1", "Deployment")
            .child("spec")
            .field("strategy")
            .expect("strategy");
        assert!(strategy.retain_keys);
    }
}
