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

mod fieldset;

use std::collections::BTreeMap;

use serde_json::{Value, json};

pub use fieldset::Scope;
use fieldset::{
    FieldSet, Path, changed, fields_and_changes, fields_of, from_fields_v1, has_key, list_keys, path_string,
    remove_at, to_fields_v1,
};

use crate::api::schema::{ListKind, Type};
use crate::api::status::ApiError;

/// One `managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: String,
    fields: FieldSet,
    /// The entry's `fieldsV1` as stored, while `fields` is still what it was read from:
    /// written back as it is instead of encoding `fields` again (most writes change one
    /// manager's entry and leave the others alone). Cleared by every change of `fields`.
    stored_fields: Option<Value>,
}

impl Entry {
    /// `w`'s entry for an `operation` ("Update" or "Apply") of `fields`.
    fn new(operation: &str, w: &Writer<'_>, fields: FieldSet) -> Self {
        Entry {
            manager: w.manager.to_string(),
            operation: operation.into(),
            api_version: w.api_version.to_string(),
            time: w.now.to_string(),
            subresource: w.subresource().to_string(),
            fields,
            stored_fields: None,
        }
    }

    /// The fields, to change.
    fn fields_mut(&mut self) -> &mut FieldSet {
        self.stored_fields = None;
        &mut self.fields
    }

    /// Keeps the fields `keep` accepts; the stored form stays when all are kept.
    fn retain_fields(&mut self, keep: impl FnMut(&Path) -> bool) {
        let before = self.fields.len();
        self.fields.retain(keep);
        if self.fields.len() != before {
            self.stored_fields = None;
        }
    }

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

    fn into_value(self) -> Value {
        let fields = match self.stored_fields {
            Some(f) => f,
            None => to_fields_v1(&self.fields),
        };
        let mut v = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        });
        if !self.subresource.is_empty() {
            v["subresource"] = json!(self.subresource);
        }
        v
    }
}

/// The `managedFields` entries of `obj`; `stored` says that `obj` is as this server stored it,
/// so each entry's `fieldsV1` is already in the form [`to_fields_v1`] gives and can be kept
/// (what a client sends is always decoded and encoded again).
fn read_entries(obj: &Value, stored: bool) -> Vec<Entry> {
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
                stored_fields: stored.then(|| e["fieldsV1"].clone()),
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
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(Entry::into_value)
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
    let sent = new["metadata"].get("managedFields");
    if sent.and_then(Value::as_array).is_some_and(Vec::is_empty) {
        write_entries(new, Vec::new());
        return;
    }
    let mut entries = match (sent, old) {
        // Sent back unchanged, as an update of an object read before usually does.
        (Some(s), Some(o)) if Some(s) == o["metadata"].get("managedFields") => read_entries(o, true),
        (Some(_), _) => read_entries(new, false),
        (None, Some(o)) => read_entries(o, true),
        (None, None) => Vec::new(),
    };
    let (new_set, changed_set) = fields_and_changes(old, new, ty, w.scope);
    // Fields `old` set and `new` does not are nobody's any more. Owned fields are usually all
    // still set, so `old`'s fields are only walked when some owned field is gone from `new`.
    let gone = entries
        .iter()
        .any(|e| e.fields.iter().any(|p| !new_set.contains(p)));
    let removed: FieldSet = match old {
        Some(o) if gone => fields_of(o, ty, w.scope).difference(&new_set).cloned().collect(),
        _ => FieldSet::new(),
    };
    let sub = w.subresource();
    for e in &mut entries {
        e.retain_fields(|p| !removed.contains(p));
        if !e.is(w.manager, "Update", sub) {
            e.retain_fields(|p| !changed_set.contains(p));
        }
    }
    if !changed_set.is_empty() {
        match entries.iter_mut().find(|e| e.is(w.manager, "Update", sub)) {
            Some(e) => {
                e.fields_mut().extend(changed_set);
                e.time = w.now.to_string();
                e.api_version = w.api_version.to_string();
            }
            None => entries.push(Entry::new("Update", &w, changed_set)),
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
    let mut entries = read_entries(live, true);
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
        entries[*i].fields_mut().remove(p);
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
    entries.push(Entry::new("Apply", &w, applied));
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
