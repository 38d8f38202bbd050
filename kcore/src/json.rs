//! JSON document helpers.

use serde_json::{Map, Value};

/// RFC 7386 JSON merge patch: objects merge key by key, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc7386_examples() {
        let mut d = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut d, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(d, json!({"a": "z", "c": {"d": "e"}}));
        let mut d = json!({"a": [1]});
        merge_patch(&mut d, &json!({"a": [2, 3], "b": {"x": 1}}));
        assert_eq!(d, json!({"a": [2, 3], "b": {"x": 1}}));
        let mut d = json!([1]);
        merge_patch(&mut d, &json!({"a": 1}));
        assert_eq!(d, json!({"a": 1}));
    }
}
