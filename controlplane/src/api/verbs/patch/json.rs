//! RFC 6902 JSON patch.

use serde_json::Value;

use super::PatchError;

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn pointer_parts(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| PatchError::InvalidPointer(path.into()))?;
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, parts: &[String]) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for p in &parts[..parts.len().saturating_sub(1)] {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(p)
                .ok_or_else(|| PatchError::SegmentNotFound(p.clone()))?,
            Value::Array(a) => {
                let i: usize = p.parse().map_err(|_| PatchError::InvalidIndex(p.clone()))?;
                a.get_mut(i).ok_or(PatchError::IndexOutOfRange(i))?
            }
            _ => return Err(PatchError::CannotDescend(p.clone())),
        };
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
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
            let i: usize = last.parse().map_err(|_| PatchError::InvalidIndex(last.clone()))?;
            if i > a.len() {
                return Err(PatchError::IndexOutOfRange(i));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(PatchError::CannotAdd(path.into())),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let parts = pointer_parts(path)?;
    let last = parts.last().cloned().ok_or(PatchError::RemoveRoot)?;
    match parent_mut(doc, &parts)? {
        Value::Object(m) => m
            .remove(&last)
            .ok_or_else(|| PatchError::PathNotFound(path.into())),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| PatchError::InvalidIndex(last.clone()))?;
            if i >= a.len() {
                return Err(PatchError::IndexOutOfRange(i));
            }
            Ok(a.remove(i))
        }
        _ => Err(PatchError::PathNotFound(path.into())),
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let ops = ops.as_array().ok_or(PatchError::NotAnArray)?;
    for op in ops {
        let kind = op["op"].as_str().ok_or(PatchError::NoOp)?;
        let path = op["path"].as_str().ok_or(PatchError::NoPath)?;
        match kind {
            "add" => add(
                doc,
                path,
                op.get("value").cloned().ok_or(PatchError::NoValue("add"))?,
            )?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                remove(doc, path).or_else(|e| if path.is_empty() { Ok(Value::Null) } else { Err(e) })?;
                add(
                    doc,
                    path,
                    op.get("value").cloned().ok_or(PatchError::NoValue("replace"))?,
                )?;
            }
            "move" | "copy" => {
                let from = op["from"].as_str().ok_or(PatchError::NoFrom)?;
                let v = if kind == "move" {
                    remove(doc, from)?
                } else {
                    doc.pointer(from)
                        .cloned()
                        .ok_or_else(|| PatchError::PathNotFound(from.into()))?
                };
                add(doc, path, v)?;
            }
            "test" => {
                let want = op.get("value").ok_or(PatchError::NoValue("test"))?;
                if doc.pointer(path) != Some(want) {
                    return Err(PatchError::TestFailed(path.into()));
                }
            }
            other => return Err(PatchError::UnknownOp(other.into())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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

    /// The texts the API answers for patches that do not apply (kubectl prints them).
    #[test]
    fn json_patch_error_texts() {
        let doc = json!({"a": 1, "list": [1], "obj": {"k": {"x": 1}}, "arr": [{"x": 1}, {"y": 2}]});
        let cases = [
            (
                json!({"op": "add"}),
                "a JSON patch must be an array of operations",
            ),
            (json!([{"path": "/a"}]), "operation without \"op\""),
            (json!([{"op": "add", "value": 1}]), "operation without \"path\""),
            (
                json!([{"op": "bogus", "path": "/a"}]),
                "unknown JSON patch operation \"bogus\"",
            ),
            (json!([{"op": "add", "path": "/x"}]), "add without value"),
            (json!([{"op": "test", "path": "/a"}]), "test without value"),
            (json!([{"op": "move", "path": "/x"}]), "move/copy without from"),
            (
                json!([{"op": "add", "path": "x", "value": 1}]),
                "invalid JSON pointer \"x\"",
            ),
            (
                json!([{"op": "remove", "path": "a"}]),
                "invalid JSON pointer \"a\"",
            ),
            (
                json!([{"op": "add", "path": "/x/y", "value": 1}]),
                "path segment \"x\" not found",
            ),
            (
                json!([{"op": "add", "path": "/list/5", "value": 1}]),
                "array index 5 out of range",
            ),
            (
                json!([{"op": "add", "path": "/list/a", "value": 1}]),
                "invalid array index \"a\"",
            ),
            (
                json!([{"op": "add", "path": "/list/9/x", "value": 1}]),
                "array index 9 out of range",
            ),
            (
                json!([{"op": "add", "path": "/a/b/c", "value": 1}]),
                "cannot descend into \"b\"",
            ),
            (
                json!([{"op": "add", "path": "/a/b", "value": 1}]),
                "cannot add at \"/a/b\"",
            ),
            (
                json!([{"op": "remove", "path": ""}]),
                "cannot remove the whole document",
            ),
            (
                json!([{"op": "remove", "path": "/missing"}]),
                "path \"/missing\" not found",
            ),
            (
                json!([{"op": "remove", "path": "/a/b"}]),
                "path \"/a/b\" not found",
            ),
            (
                json!([{"op": "remove", "path": "/list/1"}]),
                "array index 1 out of range",
            ),
            (
                json!([{"op": "remove", "path": "/list/-"}]),
                "invalid array index \"-\"",
            ),
            (
                json!([{"op": "replace", "path": "/missing", "value": 1}]),
                "path \"/missing\" not found",
            ),
            (
                json!([{"op": "replace", "path": "/missing"}]),
                "path \"/missing\" not found",
            ),
            (json!([{"op": "replace", "path": "/a"}]), "replace without value"),
            (
                json!([{"op": "move", "from": "/nope", "path": "/x"}]),
                "path \"/nope\" not found",
            ),
            (
                json!([{"op": "move", "from": "nope", "path": "/x"}]),
                "invalid JSON pointer \"nope\"",
            ),
            (
                json!([{"op": "move", "from": "/a", "path": "/x/y"}]),
                "path segment \"x\" not found",
            ),
            (
                json!([{"op": "move", "from": "/obj/k", "path": "/obj/k/z"}]),
                "path segment \"k\" not found",
            ),
            (
                json!([{"op": "copy", "from": "/nope", "path": "/x"}]),
                "path \"/nope\" not found",
            ),
            (
                json!([{"op": "copy", "from": "nope", "path": "/x"}]),
                "path \"nope\" not found",
            ),
            (
                json!([{"op": "copy", "from": "/a", "path": "/x/y"}]),
                "path segment \"x\" not found",
            ),
            (
                json!([{"op": "test", "path": "/a", "value": 2}]),
                "test failed at \"/a\"",
            ),
            (
                json!([{"op": "test", "path": "/missing", "value": null}]),
                "test failed at \"/missing\"",
            ),
            (
                json!([{"op": "test", "path": "a", "value": 1}]),
                "test failed at \"a\"",
            ),
            // Errors come in the order of the operations.
            (
                json!([{"op": "remove", "path": "/missing"}, {"op": "bogus", "path": "/a"}]),
                "path \"/missing\" not found",
            ),
            (
                json!([{"op": "remove", "path": "/a"}, {"op": "test", "path": "/a", "value": 1}]),
                "test failed at \"/a\"",
            ),
        ];
        for (ops, want) in cases {
            let mut d = doc.clone();
            let got = json_patch(&mut d, &ops).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "{ops}");
        }
    }
}
