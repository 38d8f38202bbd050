//! JSON document helpers.

/// RFC 7386 JSON merge patch: objects merge key by key, `null` removes, anything else replaces.
///
/// Re-exported from the `json-patch` crate (RFC 7386 §2's algorithm, as kube-core uses it).
pub use json_patch::merge as merge_patch;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
