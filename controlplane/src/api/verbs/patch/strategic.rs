//! Strategic merge patch. It follows the Go types' markers ([`Type`]): lists with
//! `patchStrategy: merge` and a merge key (containers by `name`, container ports by
//! `containerPort`, Service ports by `port`, ...) are merged element by element, lists of scalars
//! with `patchStrategy: merge` (finalizers) as sets; `$patch: delete|replace` on map and list
//! elements, `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>` and `$retainKeys` are
//! honoured; other lists are replaced.

use serde_json::{Map, Value};

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
) -> Result<(), PatchError> {
    if !cur.is_array() {
        *cur = Value::Array(Vec::new());
    }
    let Value::Array(list) = cur else { return Ok(()) };
    for it in items {
        let Some(kv) = it.get(key) else {
            return Err(PatchError::NoMergeKey(key.into()));
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
}
