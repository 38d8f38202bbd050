//! Field sets: the paths of the fields an object sets, walked by its type (keyed lists by their
//! list keys, sets by value, maps by key), their `FieldsV1` form, and reading, removing and
//! comparing the values at a path.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::api::schema::{ListKind, Type};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Step {
    /// `f:name`: a struct field or map key.
    Field(String),
    /// `k:{...}`: the item of a keyed list with these key fields (canonical JSON).
    Key(String),
    /// `v:...`: the item of a set (canonical JSON).
    Value(String),
}

pub(super) type Path = Vec<Step>;
pub(super) type FieldSet = BTreeSet<Path>;

impl Step {
    fn encode(&self) -> String {
        match self {
            Step::Field(f) => format!("f:{f}"),
            Step::Key(k) => format!("k:{k}"),
            Step::Value(v) => format!("v:{v}"),
        }
    }

    fn decode(s: &str) -> Option<Step> {
        let (kind, rest) = s.split_at_checked(2)?;
        match kind {
            "f:" => Some(Step::Field(rest.into())),
            "k:" => Some(Step::Key(rest.into())),
            "v:" => Some(Step::Value(rest.into())),
            _ => None,
        }
    }
}

/// `.spec.replicas`, `.spec.containers[name="nginx"].image`, `.metadata.finalizers[="x"]`: the
/// way the Go server prints paths in conflicts.
pub(super) fn path_string(p: &Path) -> String {
    let mut out = String::new();
    for step in p {
        match step {
            Step::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Step::Key(k) => {
                let keys: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("[{}]", parts.join(",")));
            }
            Step::Value(v) => out.push_str(&format!("[={v}]")),
        }
    }
    out
}

/// Top-level and metadata fields nobody owns.
const UNTRACKED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Which part of the object a write may own: the status subresource owns `status` only; the
/// main resource everything else (and `status` too when the kind has no status subresource).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Main { status_is_separate: bool },
    Status,
}

/// The fields set in `obj` (of type `ty`), as paths.
pub(super) fn fields_of(obj: &Value, ty: Type, scope: Scope) -> FieldSet {
    let mut walk = Walk {
        out: FieldSet::new(),
        changed: None,
    };
    walk.root(obj, None, ty, scope);
    walk.out
}

/// The fields set in `new`, and those of them whose value differs from `old`'s (what
/// [`changed`] says of each path, found in one walk of both objects).
pub(super) fn fields_and_changes(
    old: Option<&Value>,
    new: &Value,
    ty: Type,
    scope: Scope,
) -> (FieldSet, FieldSet) {
    let mut walk = Walk {
        out: FieldSet::new(),
        changed: Some(FieldSet::new()),
    };
    walk.root(new, old, ty, scope);
    (walk.out, walk.changed.unwrap_or_default())
}

/// A walk of an object by its type that collects its field paths and, when asked, the paths
/// whose value differs in the object walked alongside (`old`: the value at the same path there).
struct Walk {
    out: FieldSet,
    changed: Option<FieldSet>,
}

impl Walk {
    fn root(&mut self, obj: &Value, old: Option<&Value>, ty: Type, scope: Scope) {
        let Value::Object(m) = obj else { return };
        for (k, v) in m {
            let keep = match (scope, k.as_str()) {
                (_, "apiVersion" | "kind") => false,
                (Scope::Status, f) => f == "status",
                (Scope::Main { status_is_separate }, "status") => !status_is_separate,
                _ => true,
            };
            if !keep {
                continue;
            }
            let old_v = old.and_then(|o| o.get(k));
            let mut path = vec![Step::Field(k.clone())];
            if k == "metadata" {
                if let Value::Object(meta) = v {
                    for (mk, mv) in meta
                        .iter()
                        .filter(|(mk, _)| !UNTRACKED_METADATA.contains(&mk.as_str()))
                    {
                        path.push(Step::Field(mk.clone()));
                        let old_mv = old_v.and_then(|o| o.get(mk));
                        self.field(mv, old_mv, ty.child("metadata"), mk, &mut path);
                        path.pop();
                    }
                }
                continue;
            }
            self.field(v, old_v, ty, k, &mut path);
        }
    }

    /// Records `path` (whose value is `v`, and `old` in the other object).
    fn insert(&mut self, path: &Path, v: &Value, old: Option<&Value>) {
        self.out.insert(path.clone());
        if let Some(changed) = &mut self.changed
            && differ(old, Some(v))
        {
            changed.insert(path.clone());
        }
    }

    /// Field `name` of a `parent`-typed object holding `v`; `path` ends at the field.
    fn field(&mut self, v: &Value, old: Option<&Value>, parent: Type, name: &str, path: &mut Path) {
        let field = parent.field(name);
        let ty = field.map_or(Type::UNKNOWN, |f| f.ty);
        match v {
            Value::Object(m) if !m.is_empty() => {
                if field.is_some_and(|f| f.is_map) {
                    for (k, child) in m {
                        path.push(Step::Field(k.clone()));
                        self.value(child, old.and_then(|o| o.get(k)), ty, path);
                        path.pop();
                    }
                } else {
                    self.object(m, old, ty, path);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                let list = field.and_then(|f| f.list).unwrap_or(ListKind::Atomic);
                let old_items = old.and_then(Value::as_array);
                match list {
                    ListKind::Atomic => self.insert(path, v, old),
                    ListKind::Set => {
                        for it in items {
                            path.push(Step::Value(it.to_string()));
                            let old_it = old_items.and_then(|o| o.iter().find(|x| *x == it));
                            self.insert(path, it, old_it);
                            path.pop();
                        }
                    }
                    ListKind::Map(keys) => {
                        let Some(item_keys) = list_key_maps(items, keys) else {
                            // Items without their keys: the list can only be owned as a whole.
                            self.insert(path, v, old);
                            return;
                        };
                        for (it, key) in items.iter().zip(item_keys) {
                            let old_it = old_items.and_then(|o| o.iter().find(|x| matches_key(x, &key)));
                            path.push(Step::Key(Value::Object(key).to_string()));
                            self.insert(path, it, old_it);
                            if let Value::Object(m) = it {
                                self.object(m, old_it, ty, path);
                            }
                            path.pop();
                        }
                    }
                }
            }
            _ => self.insert(path, v, old),
        }
    }

    /// A map value or the like: a struct of type `ty` if it is an object, else a leaf.
    fn value(&mut self, v: &Value, old: Option<&Value>, ty: Type, path: &mut Path) {
        match v {
            Value::Object(m) if !m.is_empty() => self.object(m, old, ty, path),
            _ => self.insert(path, v, old),
        }
    }

    fn object(&mut self, m: &Map<String, Value>, old: Option<&Value>, ty: Type, path: &mut Path) {
        for (k, child) in m {
            path.push(Step::Field(k.clone()));
            self.field(child, old.and_then(|o| o.get(k)), ty, k, path);
            path.pop();
        }
    }
}

/// The key objects of a keyed list's items (canonical JSON; None if an item lacks its first
/// key). A list whose items differ in their first key is keyed by it alone: secondary keys such
/// as a port's `protocol` are often defaulted by the server, and an applied configuration that
/// leaves them out must still name the same items. Items that share a first key (53/TCP and
/// 53/UDP) are keyed by every key they carry.
pub(super) fn list_keys(items: &[Value], keys: &[&str]) -> Option<Vec<String>> {
    Some(
        list_key_maps(items, keys)?
            .into_iter()
            .map(|m| Value::Object(m).to_string())
            .collect(),
    )
}

/// [`list_keys`] as key objects.
fn list_key_maps(items: &[Value], keys: &[&str]) -> Option<Vec<Map<String, Value>>> {
    let first = keys.first()?;
    let primary: Vec<&Value> = items
        .iter()
        .map(|it| it.get(*first).filter(|v| !v.is_null()))
        .collect::<Option<_>>()?;
    let mut seen = std::collections::HashSet::new();
    let unique = primary.iter().all(|p| seen.insert(p.to_string()));
    let used = if unique { &keys[..1] } else { keys };
    Some(items.iter().map(|it| item_key_map(it, used)).collect())
}

/// The key object of one item over `keys` (the ones it has).
fn item_key_map(item: &Value, keys: &[&str]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|k| {
            item.get(*k)
                .filter(|v| !v.is_null())
                .map(|v| ((*k).to_string(), v.clone()))
        })
        .collect()
}

/// Whether `item` has every field of the (non-empty) key object `key` with the same value.
fn matches_key(item: &Value, key: &Map<String, Value>) -> bool {
    !key.is_empty() && key.iter().all(|(k, v)| item.get(k) == Some(v))
}

/// Whether `item` has every field of the key object `key` with the same value.
pub(super) fn has_key(item: &Value, key: &str) -> bool {
    let keys: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
    matches_key(item, &keys)
}

/// The value at `path` in `obj`.
pub(super) fn value_at<'a>(obj: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut cur = obj;
    for step in path {
        cur = match step {
            Step::Field(f) => cur.get(f)?,
            Step::Key(k) => {
                let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                cur.as_array()?.iter().find(|it| matches_key(it, &key))?
            }
            Step::Value(v) => {
                let want: Value = serde_json::from_str(v).ok()?;
                cur.as_array()?.iter().find(|it| **it == want)?
            }
        };
    }
    Some(cur)
}

/// Removes the value at `path` from `obj` (nothing if absent).
pub(super) fn remove_at(obj: &mut Value, path: &Path) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for step in parent {
        let next = match step {
            Step::Field(f) => cur.get_mut(f),
            Step::Key(k) => cur
                .as_array_mut()
                .and_then(|a| a.iter_mut().find(|it| has_key(it, k))),
            Step::Value(v) => cur
                .as_array_mut()
                .and_then(|a| a.iter_mut().find(|it| it.to_string() == *v)),
        };
        let Some(next) = next else { return };
        cur = next;
    }
    match last {
        Step::Field(f) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(f);
            }
        }
        Step::Key(k) => {
            if let Some(a) = cur.as_array_mut() {
                a.retain(|it| !has_key(it, k));
            }
        }
        Step::Value(v) => {
            let want: Value = serde_json::from_str(v).unwrap_or_default();
            if let Some(a) = cur.as_array_mut() {
                a.retain(|it| *it != want);
            }
        }
    }
}

/// Whether the field at `path` differs between `a` and `b` (for structures and list items:
/// whether it appeared or disappeared; their fields are compared on their own).
pub(super) fn changed(a: &Value, b: &Value, path: &Path) -> bool {
    differ(value_at(a, path), value_at(b, path))
}

/// Whether two values at one path differ (two objects do not: their fields are paths of their own).
fn differ(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Object(_)), Some(Value::Object(_))) => false,
        (x, y) => x != y,
    }
}

pub(super) fn to_fields_v1(set: &FieldSet) -> Value {
    build_fields_v1(set.iter().map(Vec::as_slice).collect())
}

/// The FieldsV1 tree of `paths`; an owned node that also has owned children carries ".".
fn build_fields_v1(paths: Vec<&[Step]>) -> Value {
    let mut groups: BTreeMap<String, (bool, Vec<&[Step]>)> = BTreeMap::new();
    for p in paths {
        if let Some((first, rest)) = p.split_first() {
            let g = groups.entry(first.encode()).or_default();
            if rest.is_empty() {
                g.0 = true;
            } else {
                g.1.push(rest);
            }
        }
    }
    let mut m = Map::new();
    for (k, (owned, rest)) in groups {
        let mut child = match build_fields_v1(rest) {
            Value::Object(c) => c,
            _ => Map::new(),
        };
        if owned && !child.is_empty() {
            child.insert(".".into(), json!({}));
        }
        m.insert(k, Value::Object(child));
    }
    Value::Object(m)
}

pub(super) fn from_fields_v1(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
    let Value::Object(m) = v else { return };
    if (m.is_empty() || m.contains_key(".")) && !prefix.is_empty() {
        out.insert(prefix.clone());
    }
    for (k, child) in m {
        let Some(step) = Step::decode(k) else { continue };
        prefix.push(step);
        from_fields_v1(child, prefix, out);
        prefix.pop();
    }
}
