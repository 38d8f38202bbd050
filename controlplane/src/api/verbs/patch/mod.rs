//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.
//!
//! Strategic merge follows the Go types' markers ([`Type`]): lists with `patchStrategy: merge`
//! and a merge key (containers by `name`, container ports by `containerPort`, Service ports by
//! `port`, ...) are merged element by element, lists of scalars with `patchStrategy: merge`
//! (finalizers) as sets; `$patch: delete|replace` on map and list elements,
//! `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>` and `$retainKeys` are honoured;
//! other lists are replaced.

use std::time::SystemTime;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{Fields, fieldmanager, writer};
use crate::api::Api;
use crate::api::admission::check_shape;
use crate::api::object;
use crate::api::request::body::parse_json_body;
use crate::api::request::{Query, Target};
use crate::api::schema::Type;
use crate::api::status::ApiError;

pub use kcore::json::merge_patch;

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn pointer_parts(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, parts: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for p in &parts[..parts.len().saturating_sub(1)] {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(p)
                .ok_or_else(|| format!("path segment {p:?} not found"))?,
            Value::Array(a) => {
                let i: usize = p.parse().map_err(|_| format!("invalid array index {p:?}"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("array index {i} out of range"))?
            }
            _ => return Err(format!("cannot descend into {p:?}")),
        };
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let parts = pointer_parts(path)?;
    let Some(last) = parts.last().cloned() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, &parts)? {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i > a.len() {
                return Err(format!("array index {i} out of range"));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("cannot add at {path:?}")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let parts = pointer_parts(path)?;
    let last = parts.last().cloned().ok_or("cannot remove the whole document")?;
    match parent_mut(doc, &parts)? {
        Value::Object(m) => m.remove(&last).ok_or_else(|| format!("path {path:?} not found")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("array index {i} out of range"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("path {path:?} not found")),
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        let kind = op["op"].as_str().ok_or("operation without \"op\"")?;
        let path = op["path"].as_str().ok_or("operation without \"path\"")?;
        match kind {
            "add" => add(doc, path, op.get("value").cloned().ok_or("add without value")?)?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                remove(doc, path).or_else(|e| if path.is_empty() { Ok(Value::Null) } else { Err(e) })?;
                add(
                    doc,
                    path,
                    op.get("value").cloned().ok_or("replace without value")?,
                )?;
            }
            "move" | "copy" => {
                let from = op["from"].as_str().ok_or("move/copy without from")?;
                let v = if kind == "move" {
                    remove(doc, from)?
                } else {
                    doc.pointer(from)
                        .cloned()
                        .ok_or_else(|| format!("path {from:?} not found"))?
                };
                add(doc, path, v)?;
            }
            "test" => {
                let want = op.get("value").ok_or("test without value")?;
                if doc.pointer(path) != Some(want) {
                    return Err(format!("test failed at {path:?}"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

/// Strategic merge patch of `patch` into `target`, of type `ty`.
pub fn strategic_merge(target: &mut Value, patch: &Value, ty: Type) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = p.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return Ok(()) };
    if let Some(retain) = p.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), v.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        let field = ty.field(k);
        match (v, field.and_then(|f| f.patch_merge_key)) {
            (Value::Array(items), Some(key)) => {
                let order = p
                    .get(&format!("$setElementOrder/{k}"))
                    .and_then(Value::as_array)
                    .cloned();
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(cur, items, key, order.as_deref(), ty.child(k))?;
            }
            (Value::Array(items), None) if field.is_some_and(|f| f.patch_merge) => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if let Value::Array(c) = cur {
                    for it in items {
                        if !c.contains(it) {
                            c.push(it.clone());
                        }
                    }
                }
            }
            (Value::Object(_), _) => {
                if v.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else {
                    strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v, ty.child(k))?;
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(
    cur: &mut Value,
    items: &[Value],
    key: &str,
    order: Option<&[Value]>,
    item_ty: Type,
) -> Result<(), String> {
    if !cur.is_array() {
        *cur = Value::Array(Vec::new());
    }
    let Value::Array(list) = cur else { return Ok(()) };
    for it in items {
        let Some(kv) = it.get(key) else {
            return Err(format!(
                "strategic merge patch: list element without merge key {key:?}"
            ));
        };
        let pos = list.iter().position(|x| x.get(key) == Some(kv));
        match (it.get("$patch").and_then(Value::as_str), pos) {
            (Some("delete"), Some(i)) => {
                list.remove(i);
            }
            (Some("delete"), None) => {}
            (Some("replace"), Some(i)) => {
                let mut clean = it.clone();
                if let Value::Object(m) = &mut clean {
                    m.remove("$patch");
                }
                list[i] = clean;
            }
            (_, Some(i)) => strategic_merge(&mut list[i], it, item_ty)?,
            (_, None) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, it, item_ty)?;
                list.push(fresh);
            }
        }
    }
    if let Some(order) = order {
        let rank = |x: &Value| {
            order
                .iter()
                .position(|o| o.get(key) == x.get(key))
                .unwrap_or(usize::MAX)
        };
        list.sort_by_key(rank);
    }
    Ok(())
}

impl Api {
    /// PATCH (merge, JSON, strategic, apply). Server-side apply creates missing objects.
    pub(crate) async fn patch(
        &self,
        t: &Target,
        ct: &str,
        body: &Bytes,
        q: &Query,
    ) -> Result<(u16, Value), ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let media = ct.split(';').next().unwrap_or_default().trim().to_string();
        let ty = Type::of_kind(&t.res.api_version(), t.res.kind);
        let patch_doc = parse_json_body(&media, body)?;
        if media == "application/apply-patch+yaml" {
            check_shape(t.res, &patch_doc)?;
        }
        for attempt in 0..5 {
            let (old, rev) = match self.read_object(t.res, t.namespace.as_deref(), &name).await {
                Ok(x) => x,
                Err(e) if e.code == 404 && media == "application/apply-patch+yaml" => {
                    let target = Target {
                        name: None,
                        ..t.clone()
                    };
                    let now = object::rfc3339(SystemTime::now());
                    let obj = match writer(t, q, &now) {
                        Some(w) => fieldmanager::apply(ty, &Value::Null, &patch_doc, q.flag("force"), w)?,
                        None => patch_doc,
                    };
                    return self.create_as(&target, obj, q, None, Fields::Recorded).await;
                }
                Err(e) => return Err(e),
            };
            let mut new = old.clone();
            let mut fields = Fields::Record;
            match media.as_str() {
                "application/merge-patch+json" => merge_patch(&mut new, &patch_doc),
                "application/json-patch+json" => json_patch(&mut new, &patch_doc).map_err(|e| ApiError {
                    code: 422,
                    reason: "Invalid",
                    message: e,
                    details: None,
                })?,
                "application/strategic-merge-patch+json" => {
                    strategic_merge(&mut new, &patch_doc, ty).map_err(ApiError::bad_request)?
                }
                "application/apply-patch+yaml" => {
                    let now = object::rfc3339(SystemTime::now());
                    if let Some(w) = writer(t, q, &now) {
                        new = fieldmanager::apply(ty, &old, &patch_doc, q.flag("force"), w)?;
                        fields = Fields::Recorded;
                    } else {
                        strategic_merge(&mut new, &patch_doc, ty).map_err(ApiError::bad_request)?
                    }
                }
                other => return Err(ApiError::unsupported_media_type(other)),
            }
            // A resourceVersion in the patch is a precondition (kubectl diff sends one).
            if let Some(want) = patch_doc["metadata"]["resourceVersion"].as_str()
                && want != rev.to_string()
            {
                return Err(ApiError::conflict(t.res, &name));
            }
            check_shape(t.res, &new)?;
            new["metadata"]["resourceVersion"] = json!(rev.to_string());
            match self.replace(t, &old, new, rev, q, fields).await {
                Err(e)
                    if e.reason == "Conflict"
                        && attempt < 4
                        && patch_doc["metadata"]["resourceVersion"].is_null() =>
                {
                    continue;
                }
                other => return other.map(|v| (200, v)),
            }
        }
        Err(ApiError::conflict(t.res, &name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_sets_and_removes() {
        let mut d = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        merge_patch(&mut d, &json!({"metadata": {"labels": {"a": null, "c": "3"}}}));
        assert_eq!(d, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"spec": {"template": {"x": 1}}, "list": [1, 2]});
        json_patch(
            &mut d,
            &json!([
                {"op": "replace", "path": "/spec/template", "value": {"y": 2}},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "remove", "path": "/list/0"},
                {"op": "test", "path": "/list/0", "value": 2},
                {"op": "add", "path": "/metadata~1x", "value": true}
            ]),
        )
        .expect("patch");
        assert_eq!(
            d,
            json!({"spec": {"template": {"y": 2}}, "list": [2, 3], "metadata/x": true})
        );
        assert!(json_patch(&mut d, &json!([{"op": "test", "path": "/list/0", "value": 9}])).is_err());
        assert!(json_patch(&mut d, &json!({"op": "add"})).is_err());
    }

    fn deployment() -> Type {
        Type::of_kind("apps/v1", "Deployment")
    }

    #[test]
    fn strategic_merge_by_container_name() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "x:1", "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "y:1"}]}}}});
        strategic_merge(
            &mut d,
            &json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "a", "image": "x:2"}]}}}}),
            deployment(),
        )
        .expect("smp");
        let cs = &d["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0]["name"], "b");
        assert_eq!(cs[1]["image"], "x:2");
        assert_eq!(cs[1]["ports"][0]["containerPort"], 80);
        strategic_merge(
            &mut d,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}}}),
            deployment(),
        )
        .expect("smp");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn strategic_merge_null_and_replace_lists() {
        let mut d = json!({"spec": {"unschedulable": true, "args": ["a", "b"]}});
        strategic_merge(
            &mut d,
            &json!({"spec": {"unschedulable": null, "args": ["c"]}}),
            Type::UNKNOWN,
        )
        .expect("smp");
        assert_eq!(d, json!({"spec": {"args": ["c"]}}));
    }

    /// Merge keys come from the type: Service ports merge by `port`, container ports by
    /// `containerPort`; tolerations (no patch strategy) are replaced; finalizers merge as a set.
    #[test]
    fn strategic_merge_follows_the_types() {
        let svc = Type::of_kind("v1", "Service");
        let mut d = json!({"metadata": {"finalizers": ["a"]}, "spec": {"ports": [
            {"port": 80, "targetPort": 8080, "name": "http"},
            {"port": 443, "targetPort": 8443, "name": "https"}]}});
        strategic_merge(
            &mut d,
            &json!({"metadata": {"finalizers": ["b"]}, "spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
            svc,
        )
        .expect("smp");
        assert_eq!(
            d["spec"]["ports"][0],
            json!({"port": 80, "targetPort": 9090, "name": "http"})
        );
        assert_eq!(d["spec"]["ports"][1]["port"], 443);
        assert_eq!(d["metadata"]["finalizers"], json!(["a", "b"]));
        let pod = Type::of_kind("v1", "Pod");
        let mut p = json!({"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}});
        strategic_merge(&mut p, &json!({"spec": {"tolerations": [{"key": "c"}]}}), pod).expect("smp");
        assert_eq!(p["spec"]["tolerations"], json!([{"key": "c"}]));
    }
}
