//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! Every write names a manager (`fieldManager`, else the client's user-agent prefix). A create,
//! update or patch is an `Update` operation: the manager takes the fields whose values it
//! changed, away from everybody else. An apply (`application/apply-patch+yaml`) is an `Apply`
//! operation: the applied configuration is merged into the object (lists by the Go types' list
//! keys, see [`Type`]); a field that another manager owns and the apply would change is a
//! conflict (409 with one `FieldManagerConflict` cause per field, the Go server's messages)
//! unless `force=true`, which takes it over; fields the manager applied before and no longer
//! applies are removed unless someone else owns them too.
//!
//! Field sets are stored in the `FieldsV1` form (`f:<field>`, `k:<key object>` for items of
//! keyed lists, `v:<value>` for set items, `.` for an owned item that also has owned fields).
//!
//! Not modelled: per-field ownership inside atomic maps (`selector` counts as its keys), and
//! ownership of fields the server defaults after an apply (nobody owns them, as upstream).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::status::ApiError;
use super::types::{ListKind, Type};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// `f:name`: a struct field or map key.
    Field(String),
    /// `k:{...}`: the item of a keyed list with these key fields (canonical JSON).
    Key(String),
    /// `v:...`: the item of a set (canonical JSON).
    Value(String),
}

type Path = Vec<Step>;
type FieldSet = BTreeSet<Path>;

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
fn path_string(p: &Path) -> String {
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
fn fields_of(obj: &Value, ty: Type, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Value::Object(m) = obj else { return out };
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
        let mut path = vec![Step::Field(k.clone())];
        if k == "metadata" {
            if let Value::Object(meta) = v {
                for (mk, mv) in meta
                    .iter()
                    .filter(|(mk, _)| !UNTRACKED_METADATA.contains(&mk.as_str()))
                {
                    path.push(Step::Field(mk.clone()));
                    collect_field(mv, ty.child("metadata"), mk, &mut path, &mut out);
                    path.pop();
                }
            }
            continue;
        }
        collect_field(v, ty, k, &mut path, &mut out);
    }
    out
}

/// Collects field `name` of a `parent`-typed object holding `v`; `path` ends at the field.
fn collect_field(v: &Value, parent: Type, name: &str, path: &mut Path, out: &mut FieldSet) {
    let field = parent.field(name);
    let ty = field.map_or(Type::UNKNOWN, |f| f.ty);
    match v {
        Value::Object(m) if !m.is_empty() => {
            if field.is_some_and(|f| f.is_map) {
                for (k, child) in m {
                    path.push(Step::Field(k.clone()));
                    collect_value(child, ty, path, out);
                    path.pop();
                }
            } else {
                collect_object(m, ty, path, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let list = field.and_then(|f| f.list).unwrap_or(ListKind::Atomic);
            match list {
                ListKind::Atomic => {
                    out.insert(path.clone());
                }
                ListKind::Set => {
                    for it in items {
                        path.push(Step::Value(it.to_string()));
                        out.insert(path.clone());
                        path.pop();
                    }
                }
                ListKind::Map(keys) => {
                    let Some(item_keys) = list_keys(items, keys) else {
                        // Items without their keys: the list can only be owned as a whole.
                        out.insert(path.clone());
                        return;
                    };
                    for (it, key) in items.iter().zip(item_keys) {
                        path.push(Step::Key(key));
                        out.insert(path.clone());
                        if let Value::Object(m) = it {
                            collect_object(m, ty, path, out);
                        }
                        path.pop();
                    }
                }
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// A map value or the like: a struct of type `ty` if it is an object, else a leaf.
fn collect_value(v: &Value, ty: Type, path: &mut Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => collect_object(m, ty, path, out),
        _ => {
            out.insert(path.clone());
        }
    }
}

fn collect_object(m: &Map<String, Value>, ty: Type, path: &mut Path, out: &mut FieldSet) {
    for (k, child) in m {
        path.push(Step::Field(k.clone()));
        collect_field(child, ty, k, path, out);
        path.pop();
    }
}

/// The key objects of a keyed list's items (canonical JSON; None if an item lacks its first
/// key). A list whose items differ in their first key is keyed by it alone: secondary keys such
/// as a port's `protocol` are often defaulted by the server, and an applied configuration that
/// leaves them out must still name the same items. Items that share a first key (53/TCP and
/// 53/UDP) are keyed by every key they carry.
fn list_keys(items: &[Value], keys: &[&str]) -> Option<Vec<String>> {
    let first = keys.first()?;
    let primary: Vec<String> = items
        .iter()
        .map(|it| it.get(*first).filter(|v| !v.is_null()).map(Value::to_string))
        .collect::<Option<_>>()?;
    let mut seen = std::collections::HashSet::new();
    let unique = primary.iter().all(|p| seen.insert(p));
    let used = if unique { &keys[..1] } else { keys };
    Some(items.iter().map(|it| item_key(it, used)).collect())
}

/// The key object of one item over `keys` (the ones it has).
fn item_key(item: &Value, keys: &[&str]) -> String {
    let m: Map<String, Value> = keys
        .iter()
        .filter_map(|k| {
            item.get(*k)
                .filter(|v| !v.is_null())
                .map(|v| ((*k).to_string(), v.clone()))
        })
        .collect();
    Value::Object(m).to_string()
}

/// Whether `item` has every field of the key object `key` with the same value.
fn has_key(item: &Value, key: &str) -> bool {
    let keys: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
    !keys.is_empty() && keys.iter().all(|(k, v)| item.get(k) == Some(v))
}

/// The value at `path` in `obj`.
fn value_at<'a>(obj: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut cur = obj;
    for step in path {
        cur = match step {
            Step::Field(f) => cur.get(f)?,
            Step::Key(k) => cur.as_array()?.iter().find(|it| has_key(it, k))?,
            Step::Value(v) => {
                let want: Value = serde_json::from_str(v).ok()?;
                cur.as_array()?.iter().find(|it| **it == want)?
            }
        };
    }
    Some(cur)
}

/// Removes the value at `path` from `obj` (nothing if absent).
fn remove_at(obj: &mut Value, path: &Path) {
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
fn changed(a: &Value, b: &Value, path: &Path) -> bool {
    match (value_at(a, path), value_at(b, path)) {
        (Some(Value::Object(_)), Some(Value::Object(_))) => false,
        (x, y) => x != y,
    }
}

fn to_fields_v1(set: &FieldSet) -> Value {
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

fn from_fields_v1(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
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

/// One `managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: String,
    fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// How the Go server names a manager in conflict messages.
    fn display(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s = format!("{s} with subresource {:?}", self.subresource);
        }
        if self.operation == "Update" {
            s = format!("{s} using {}", self.api_version);
        }
        s
    }

    fn to_value(&self) -> Value {
        let mut v = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(&self.fields),
        });
        if !self.subresource.is_empty() {
            v["subresource"] = json!(self.subresource);
        }
        v
    }
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let mut fields = FieldSet::new();
            from_fields_v1(&e["fieldsV1"], &mut Vec::new(), &mut fields);
            Some(Entry {
                manager: e["manager"].as_str()?.to_string(),
                operation: e["operation"].as_str().unwrap_or("Update").to_string(),
                api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
                time: e["time"].as_str().unwrap_or_default().to_string(),
                subresource: e["subresource"].as_str().unwrap_or_default().to_string(),
                fields,
            })
        })
        .collect()
}

fn write_entries(obj: &mut Value, entries: Vec<Entry>) {
    // Callers check shapes first; a non-object metadata is left for validation to refuse.
    if !obj["metadata"].is_object() {
        return;
    }
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(Entry::to_value)
        .collect();
    if list.is_empty() {
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
    } else {
        obj["metadata"]["managedFields"] = Value::Array(list);
    }
}

/// Who writes, and where.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: String,
    pub scope: Scope,
    /// The time stamp of the write (RFC 3339).
    pub now: &'a str,
}

impl Writer<'_> {
    fn subresource(&self) -> &'static str {
        if self.scope == Scope::Status { "status" } else { "" }
    }
}

/// Records an `Update` by `w` that turned `old` (None for a create) into `new`.
///
/// The entries start from `new`'s own `managedFields` when the client sent them (an empty list
/// clears them and records nothing), else from `old`'s.
pub fn record_update(ty: Type, old: Option<&Value>, new: &mut Value, w: Writer<'_>) {
    let sent = new["metadata"].get("managedFields").cloned();
    if sent.as_ref().and_then(Value::as_array).is_some_and(Vec::is_empty) {
        write_entries(new, Vec::new());
        return;
    }
    let mut entries = match (sent, old) {
        (Some(_), _) => read_entries(new),
        (None, Some(o)) => read_entries(o),
        (None, None) => Vec::new(),
    };
    let empty = Value::Null;
    let old_obj = old.unwrap_or(&empty);
    let old_set = old.map(|o| fields_of(o, ty, w.scope)).unwrap_or_default();
    let new_set = fields_of(new, ty, w.scope);
    let changed_set: FieldSet = new_set
        .iter()
        .filter(|p| changed(old_obj, new, p))
        .cloned()
        .collect();
    let removed: FieldSet = old_set.difference(&new_set).cloned().collect();
    let sub = w.subresource();
    for e in &mut entries {
        e.fields.retain(|p| !removed.contains(p));
        if !e.is(w.manager, "Update", sub) {
            e.fields.retain(|p| !changed_set.contains(p));
        }
    }
    if !changed_set.is_empty() {
        match entries.iter_mut().find(|e| e.is(w.manager, "Update", sub)) {
            Some(e) => {
                e.fields.extend(changed_set);
                e.time = w.now.to_string();
                e.api_version = w.api_version.to_string();
            }
            None => entries.push(Entry {
                manager: w.manager.to_string(),
                operation: "Update".into(),
                api_version: w.api_version.to_string(),
                time: w.now.to_string(),
                subresource: sub.to_string(),
                fields: changed_set,
            }),
        }
    }
    write_entries(new, entries);
}

/// Server-side apply of `config` by `w` onto `live` (Null for a missing object): the new object
/// with its managed fields, or a 409 listing the conflicts when `force` is false.
pub fn apply(ty: Type, live: &Value, config: &Value, force: bool, w: Writer<'_>) -> Result<Value, ApiError> {
    if !config.is_object() {
        return Err(ApiError::bad_request("an apply configuration must be an object"));
    }
    let mut entries = read_entries(live);
    let mut merged = if live.is_object() { live.clone() } else { json!({}) };
    merge_applied(&mut merged, config, ty, None);
    let applied = fields_of(config, ty, w.scope);
    let sub = w.subresource();
    let mine = |e: &Entry| e.is(w.manager, "Apply", sub);

    let mut conflicts: Vec<(usize, Path)> = Vec::new();
    for (i, e) in entries.iter().enumerate().filter(|(_, e)| !mine(e)) {
        for p in e.fields.intersection(&applied) {
            if changed(live, &merged, p) {
                conflicts.push((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&entries, &conflicts));
    }
    for (i, p) in &conflicts {
        entries[*i].fields.remove(p);
    }

    // Fields this manager applied before and no longer applies go, unless someone else has them.
    let previous = entries
        .iter()
        .find(|e| mine(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: Vec<&FieldSet> = entries.iter().filter(|e| !mine(e)).map(|e| &e.fields).collect();
    let mut dropped: Vec<&Path> = previous
        .difference(&applied)
        .filter(|p| !others.iter().any(|o| o.iter().any(|q| q.starts_with(p))))
        .collect();
    // Outermost first; what lies inside a removed item goes with it.
    dropped.sort_by_key(|p| p.len());
    let mut gone: Vec<&Path> = Vec::new();
    for p in dropped {
        if !gone.iter().any(|g| p.starts_with(g)) {
            remove_at(&mut merged, p);
            gone.push(p);
        }
    }

    entries.retain(|e| !mine(e));
    entries.push(Entry {
        manager: w.manager.to_string(),
        operation: "Apply".into(),
        api_version: w.api_version.to_string(),
        time: w.now.to_string(),
        subresource: sub.to_string(),
        fields: applied,
    });
    write_entries(&mut merged, entries);
    Ok(merged)
}

/// Merges an applied configuration: structs and maps field by field, keyed lists item by item,
/// sets as unions; atomic lists and scalars are replaced. Nulls in the configuration are skipped.
fn merge_applied(target: &mut Value, config: &Value, ty: Type, map_of: Option<Type>) {
    let (Value::Object(t), Value::Object(c)) = (&mut *target, config) else {
        *target = config.clone();
        return;
    };
    for (k, v) in c {
        if v.is_null() {
            continue;
        }
        if let Some(value_ty) = map_of {
            merge_applied(t.entry(k.clone()).or_insert(Value::Null), v, value_ty, None);
            continue;
        }
        let field = ty.field(k);
        let child = field.map_or(Type::UNKNOWN, |f| f.ty);
        match (v, field.and_then(|f| f.list)) {
            (Value::Array(items), Some(ListKind::Map(keys))) => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if !cur.is_array() {
                    *cur = Value::Array(Vec::new());
                }
                let Value::Array(list) = cur else { continue };
                let Some(item_keys) = list_keys(items, keys) else {
                    *list = items.clone();
                    continue;
                };
                for (it, key) in items.iter().zip(item_keys) {
                    match list.iter_mut().find(|x| has_key(x, &key)) {
                        Some(existing) => merge_applied(existing, it, child, None),
                        None => list.push(it.clone()),
                    }
                }
            }
            (Value::Array(items), Some(ListKind::Set)) => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if let Value::Array(list) = cur {
                    for it in items {
                        if !list.contains(it) {
                            list.push(it.clone());
                        }
                    }
                } else {
                    *cur = v.clone();
                }
            }
            (Value::Object(_), _) => {
                let map_value = field.filter(|f| f.is_map).map(|f| f.ty);
                merge_applied(t.entry(k.clone()).or_insert(Value::Null), v, child, map_value);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn conflict_error(entries: &[Entry], conflicts: &[(usize, Path)]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(i, p)| {
            json!({
                "type": "FieldManagerConflict",
                "message": format!("conflict with {}", entries[*i].display()),
                "field": path_string(p),
            })
        })
        .collect();
    let message = if let [(i, p)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            entries[*i].display(),
            path_string(p)
        )
    } else {
        let mut by_manager: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (i, p) in conflicts {
            by_manager
                .entry(entries[*i].display())
                .or_default()
                .push(path_string(p));
        }
        let mut lines = Vec::new();
        for (m, paths) in by_manager {
            lines.push(format!("conflicts with {m}:"));
            lines.extend(paths.into_iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    ApiError {
        code: 409,
        reason: "Conflict",
        message,
        details: Some(json!({"causes": causes})),
    }
}

#[cfg(test)]
mod tests;
