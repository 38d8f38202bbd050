//! Strategic merge patch. It follows the Go types' markers ([`Type`]): lists with
//! `patchStrategy: merge` and a merge key (containers by `name`, container ports by
//! `containerPort`, Service ports by `port`, ...) are merged element by element, lists of scalars
//! with `patchStrategy: merge` (finalizers) as sets; `$patch: delete|replace` on map and list
//! elements, `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>` and `$retainKeys` are
//! honoured; other lists are replaced.
//!
//! Every list operation is indexed by the elements' merge key (or, for lists of scalars, the
//! values), so a patch of m elements into a list of n costs O(n + m), not O(n × m): a patch of
//! ten thousand entries cannot make the server compare a hundred million pairs.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

/// A hashable identity of a JSON value (merge keys and scalar list elements).
fn ident(v: &Value) -> String {
    v.to_string()
}

use super::PatchError;
use crate::api::schema::Type;

/// Strategic merge patch of `patch` into `target`, of type `ty`.
pub fn strategic_merge(target: &mut Value, patch: &Value, ty: Type) -> Result<(), PatchError> {
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
        let keep: HashSet<&str> = retain.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(k.as_str()));
    }
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), v.as_array()) {
                let del: HashSet<String> = del.iter().map(ident).collect();
                list.retain(|x| !del.contains(&ident(x)));
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
                    let mut present: HashSet<String> = c.iter().map(ident).collect();
                    for it in items {
                        if present.insert(ident(it)) {
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
) -> Result<(), PatchError> {
    if !cur.is_array() {
        *cur = Value::Array(Vec::new());
    }
    let Value::Array(list) = cur else { return Ok(()) };
    // Slots keep positions stable while elements are deleted; the first element with a key
    // is the one a patch element addresses.
    let mut slots: Vec<Option<Value>> = std::mem::take(list).into_iter().map(Some).collect();
    let mut index: HashMap<String, usize> = HashMap::with_capacity(slots.len());
    for (i, x) in slots.iter().enumerate() {
        if let Some(k) = x.as_ref().and_then(|x| x.get(key)) {
            index.entry(ident(k)).or_insert(i);
        }
    }
    for it in items {
        let Some(kv) = it.get(key) else {
            return Err(PatchError::NoMergeKey(key.into()));
        };
        let id = ident(kv);
        let pos = index.get(&id).copied();
        match (it.get("$patch").and_then(Value::as_str), pos) {
            (Some("delete"), Some(i)) => {
                slots[i] = None;
                index.remove(&id);
            }
            (Some("delete"), None) => {}
            (Some("replace"), Some(i)) => {
                let mut clean = it.clone();
                if let Value::Object(m) = &mut clean {
                    m.remove("$patch");
                }
                slots[i] = Some(clean);
            }
            (_, Some(i)) => {
                if let Some(x) = slots[i].as_mut() {
                    strategic_merge(x, it, item_ty)?;
                }
            }
            (_, None) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, it, item_ty)?;
                index.insert(id, slots.len());
                slots.push(Some(fresh));
            }
        }
    }
    *list = slots.into_iter().flatten().collect();
    if let Some(order) = order {
        let mut ranks: HashMap<String, usize> = HashMap::with_capacity(order.len());
        for (i, o) in order.iter().enumerate() {
            if let Some(k) = o.get(key) {
                ranks.entry(ident(k)).or_insert(i);
            }
        }
        // Stable: elements the order does not name keep their relative order, at the end.
        list.sort_by_cached_key(|x| {
            x.get(key)
                .and_then(|k| ranks.get(&ident(k)).copied())
                .unwrap_or(usize::MAX)
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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

    /// Deletes, replaces, merges and additions in one list patch, with an order naming only
    /// some elements, and a scalar set with duplicates and deletions.
    #[test]
    fn list_operations_keep_their_meaning() {
        let pod = Type::of_kind("v1", "Pod");
        let mut p = json!({"metadata": {"finalizers": ["x", "y"]}, "spec": {"containers": [
            {"name": "a", "image": "1"}, {"name": "b", "image": "1"},
            {"name": "c", "image": "1", "tty": true}, {"name": "d", "image": "1"}]}});
        strategic_merge(
            &mut p,
            &json!({"metadata": {"finalizers": ["y", "z", "z"], "$deleteFromPrimitiveList/finalizers": ["x"]},
                "spec": {
                "$setElementOrder/containers": [{"name": "e"}, {"name": "c"}, {"name": "a"}],
                "containers": [
                    {"name": "b", "$patch": "delete"},
                    {"name": "c", "image": "2", "$patch": "replace"},
                    {"name": "a", "image": "2"},
                    {"name": "e", "image": "1"},
                    {"name": "nope", "$patch": "delete"}]}}),
            pod,
        )
        .expect("smp");
        assert_eq!(
            p["spec"]["containers"],
            json!([{"name": "e", "image": "1"}, {"name": "c", "image": "2"},
                {"name": "a", "image": "2"}, {"name": "d", "image": "1"}])
        );
        assert_eq!(p["metadata"]["finalizers"], json!(["y", "z"]));
        let err = strategic_merge(&mut p, &json!({"spec": {"containers": [{"image": "3"}]}}), pod);
        assert!(matches!(err, Err(PatchError::NoMergeKey(k)) if k == "name"));
    }

    /// Ten thousand elements patched into ten thousand (half of them new, every other existing
    /// one deleted): the result is exact. (How long it takes is the API benchmark's business;
    /// indexed, it is linear.)
    #[test]
    fn large_list_patches_are_exact() {
        let svc = Type::of_kind("v1", "Service");
        let ports: Vec<Value> = (0..10_000)
            .map(|i| json!({"port": i, "name": format!("p{i}")}))
            .collect();
        let mut d = json!({"spec": {"ports": ports}});
        let mut patch: Vec<Value> = (0..10_000)
            .step_by(2)
            .map(|i| json!({"port": i, "$patch": "delete"}))
            .collect();
        patch.extend((10_000..15_000).map(|i| json!({"port": i, "name": format!("n{i}")})));
        strategic_merge(&mut d, &json!({"spec": {"ports": patch}}), svc).expect("smp");
        let got: Vec<i64> = d["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter_map(|p| p["port"].as_i64())
            .collect();
        let want: Vec<i64> = (1..10_000).step_by(2).chain(10_000..15_000).collect();
        assert_eq!(got, want);
    }
}
