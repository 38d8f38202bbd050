//! RFC 6902 JSON patch, applied by the `json-patch` crate.
//!
//! The crate reports a failed operation by kind only ("path is invalid"); the API has always
//! answered with where the path breaks (`path segment "x" not found`, `array index 3 out of
//! range`, `test failed at "/a"`, ...). So operations are parsed and applied one at a time, in
//! order, and a failure is explained by walking its path in the document it ran on
//! ([`explain`]), with the texts of [`PatchError`].
//!
//! Where the crate is stricter than the hand-written code it replaces, it follows the RFCs: array
//! indices with a sign or leading zeros (`+1`, `01`) and `~` escapes other than `~0`/`~1` are
//! refused (RFC 6901), and so is a `move` into its own child (RFC 6902 §4.4; it used to remove
//! the value first and fail on the path, or shift an array under it). A `test` of a missing path
//! fails, as before (Go's json-patch lets a missing path equal `null`).

use json_patch::jsonptr::index::Index;
use json_patch::jsonptr::{Pointer, PointerBuf, Token};
use json_patch::{
    AddOperation, CopyOperation, MoveOperation, PatchErrorKind, PatchOperation, RemoveOperation,
    ReplaceOperation, TestOperation,
};
use serde_json::Value;

use super::PatchError;

/// Most operations in one JSON patch (upstream's `maxJSONPatchOperations`).
pub const MAX_OPERATIONS: usize = 10_000;
/// Most bytes all `copy` operations of one patch may add (the request body limit: a patch may
/// not grow a document by more than it could have sent).
pub const MAX_COPY_BYTES: usize = crate::api::request::body::MAX_BODY;

/// Applies the JSON patch `ops` to `doc`. On an error `doc` is left part-patched: callers patch
/// a copy. At most [`MAX_OPERATIONS`] operations and [`MAX_COPY_BYTES`] copied, so a small
/// patch of doubling copies cannot exhaust memory.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let ops = ops.as_array().ok_or(PatchError::NotAnArray)?;
    if ops.len() > MAX_OPERATIONS {
        return Err(PatchError::TooManyOperations {
            limit: MAX_OPERATIONS,
            got: ops.len(),
        });
    }
    let mut copied = 0usize;
    for op in ops {
        let op = operation(doc, op)?;
        if let PatchOperation::Copy(c) = &op {
            copied = copied.saturating_add(doc.pointer(c.from.as_str()).map_or(0, encoded_len));
            if copied > MAX_COPY_BYTES {
                return Err(PatchError::CopyTooLarge {
                    size: copied,
                    limit: MAX_COPY_BYTES,
                });
            }
        }
        if let Err(e) = json_patch::patch_unsafe(doc, std::slice::from_ref(&op)) {
            return Err(explain(doc, &op, &e.kind));
        }
    }
    Ok(())
}

/// The length of `v` as compact JSON (what a copy of it adds to the document).
fn encoded_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// One operation, checked in the order the API always checked it (a `replace` looks at its
/// target before its value, a `move` at its source before its path).
fn operation(doc: &Value, op: &Value) -> Result<PatchOperation, PatchError> {
    let kind = op["op"].as_str().ok_or(PatchError::NoOp)?;
    let path = op["path"].as_str().ok_or(PatchError::NoPath)?;
    let pointer = |p: &str| PointerBuf::parse(p).map_err(|_| PatchError::InvalidPointer(p.into()));
    let value = |of: &'static str| op.get("value").cloned().ok_or(PatchError::NoValue(of));
    Ok(match kind {
        "add" => {
            let value = value("add")?;
            PatchOperation::Add(AddOperation {
                path: pointer(path)?,
                value,
            })
        }
        "remove" => PatchOperation::Remove(RemoveOperation { path: pointer(path)? }),
        "replace" => {
            let path = pointer(path)?;
            if op.get("value").is_none() && !path.is_root() {
                check_remove(doc, &path)?;
            }
            PatchOperation::Replace(ReplaceOperation {
                value: value("replace")?,
                path,
            })
        }
        "move" => {
            let from = pointer(op["from"].as_str().ok_or(PatchError::NoFrom)?)?;
            let Ok(path) = PointerBuf::parse(path) else {
                check_remove(doc, &from)?;
                return Err(PatchError::InvalidPointer(path.into()));
            };
            PatchOperation::Move(MoveOperation { from, path })
        }
        "copy" => {
            let from = op["from"].as_str().ok_or(PatchError::NoFrom)?;
            let found = PointerBuf::parse(from)
                .ok()
                .filter(|f| doc.pointer(f.as_str()).is_some());
            PatchOperation::Copy(CopyOperation {
                from: found.ok_or_else(|| PatchError::PathNotFound(from.into()))?,
                path: pointer(path)?,
            })
        }
        "test" => {
            let value = value("test")?;
            let path = PointerBuf::parse(path).map_err(|_| PatchError::TestFailed(path.into()))?;
            PatchOperation::Test(TestOperation { path, value })
        }
        other => return Err(PatchError::UnknownOp(other.into())),
    })
}

/// Why `op` failed on `doc` (as the crate left it: a failed `move` has removed its value).
fn explain(doc: &Value, op: &PatchOperation, kind: &PatchErrorKind) -> PatchError {
    let found = match (op, kind) {
        (PatchOperation::Add(o), _) => check_add(doc, &o.path),
        (PatchOperation::Remove(o), _) => check_remove(doc, &o.path),
        (PatchOperation::Replace(o), _) => check_remove(doc, &o.path),
        (PatchOperation::Move(o), PatchErrorKind::InvalidFromPointer) => check_remove(doc, &o.from),
        (PatchOperation::Move(o), PatchErrorKind::CannotMoveInsideItself) => {
            check_remove(doc, &o.from).and_then(|()| moved_into_itself(doc, o))
        }
        (PatchOperation::Move(o), _) => check_add(doc, &o.path),
        (PatchOperation::Copy(o), PatchErrorKind::InvalidFromPointer) => {
            Err(PatchError::PathNotFound(o.from.as_str().into()))
        }
        (PatchOperation::Copy(o), _) => check_add(doc, &o.path),
        (PatchOperation::Test(o), _) => Err(PatchError::TestFailed(o.path.as_str().into())),
    };
    // The walk finds what the crate found; should they ever disagree, name the path.
    found
        .err()
        .unwrap_or_else(|| PatchError::PathNotFound(op.path().as_str().into()))
}

/// Why adding at `ptr` fails (Ok: it would not).
fn check_add(doc: &Value, ptr: &Pointer) -> Result<(), PatchError> {
    let Some((parent, last)) = ptr.split_back() else {
        return Ok(());
    };
    match walk(doc, parent)? {
        Value::Object(_) => Ok(()),
        Value::Array(_) if last.decoded() == "-" => Ok(()),
        Value::Array(a) => match index(&last)? {
            i if i > a.len() => Err(PatchError::IndexOutOfRange(i)),
            _ => Ok(()),
        },
        _ => Err(PatchError::CannotAdd(ptr.as_str().into())),
    }
}

/// Why removing (or replacing) `ptr` fails (Ok: it would not).
fn check_remove(doc: &Value, ptr: &Pointer) -> Result<(), PatchError> {
    let Some((parent, last)) = ptr.split_back() else {
        return Err(PatchError::RemoveRoot);
    };
    match walk(doc, parent)? {
        Value::Object(m) if m.contains_key(last.decoded().as_ref()) => Ok(()),
        Value::Array(a) => match index(&last)? {
            i if i >= a.len() => Err(PatchError::IndexOutOfRange(i)),
            _ => Ok(()),
        },
        _ => Err(PatchError::PathNotFound(ptr.as_str().into())),
    }
}

/// A `move` into its own child. Removing the value first left an object parent without the
/// path's next step; any other case has no older wording.
fn moved_into_itself(doc: &Value, o: &MoveOperation) -> Result<(), PatchError> {
    match o.from.split_back() {
        Some((parent, last)) if walk(doc, parent).is_ok_and(Value::is_object) => {
            Err(PatchError::SegmentNotFound(last.decoded().into_owned()))
        }
        _ => Err(PatchError::MoveIntoItself(o.from.as_str().into())),
    }
}

/// The value at `ptr`, or where the path breaks.
fn walk<'a>(doc: &'a Value, ptr: &Pointer) -> Result<&'a Value, PatchError> {
    let mut cur = doc;
    for token in ptr.tokens() {
        cur = match cur {
            Value::Object(m) => m
                .get(token.decoded().as_ref())
                .ok_or_else(|| PatchError::SegmentNotFound(token.decoded().into_owned()))?,
            Value::Array(a) => {
                let i = index(&token)?;
                a.get(i).ok_or(PatchError::IndexOutOfRange(i))?
            }
            _ => return Err(PatchError::CannotDescend(token.decoded().into_owned())),
        };
    }
    Ok(cur)
}

/// An array index token (RFC 6901: digits without leading zeros).
fn index(token: &Token<'_>) -> Result<usize, PatchError> {
    match token.to_index() {
        Ok(Index::Num(i)) => Ok(i),
        _ => Err(PatchError::InvalidIndex(token.decoded().into_owned())),
    }
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
    fn patch_bombs_are_refused_within_their_limits() {
        // 40 doubling copies of 1 KiB would make a terabyte; the limit stops it at 3 MiB.
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": ["x".repeat(1024)]})];
        for _ in 0..40 {
            ops.push(json!({"op": "copy", "from": "/a", "path": "/b"}));
            ops.push(json!({"op": "move", "from": "/b", "path": "/a/-"}));
        }
        let mut d = json!({});
        let err = json_patch(&mut d, &Value::Array(ops)).expect_err("bomb");
        assert!(
            matches!(err, PatchError::CopyTooLarge { size, limit } if size > limit && limit == MAX_COPY_BYTES),
            "{err}"
        );
        assert!(encoded_len(&d) < 2 * MAX_COPY_BYTES, "stopped within the limit");
        let many = Value::Array(vec![
            json!({"op": "test", "path": "", "value": {}});
            MAX_OPERATIONS + 1
        ]);
        assert_eq!(
            json_patch(&mut json!({}), &many).map_err(|e| e.to_string()),
            Err("The allowed maximum operations in a JSON patch is 10000, got 10001".into())
        );
        let ok = Value::Array(vec![
            json!({"op": "test", "path": "/a", "value": 1});
            MAX_OPERATIONS
        ]);
        assert!(json_patch(&mut json!({"a": 1}), &ok).is_ok());
        assert_eq!(encoded_len(&json!({"a": [1, "b"]})), r#"{"a":[1,"b"]}"#.len());
    }

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

    /// Where the crate follows the RFCs more strictly than the code it replaced.
    #[test]
    fn json_patch_follows_rfc_6901_and_6902() {
        let doc = json!({"list": [1, 2], "arr": [{"x": 1}, {"y": 2}]});
        for (ops, want) in [
            (
                json!([{"op": "remove", "path": "/list/01"}]),
                "invalid array index \"01\"",
            ),
            (
                json!([{"op": "add", "path": "/list/+1", "value": 0}]),
                "invalid array index \"+1\"",
            ),
            (
                json!([{"op": "add", "path": "/a~2", "value": 0}]),
                "invalid JSON pointer \"/a~2\"",
            ),
            (
                json!([{"op": "move", "from": "/arr/0", "path": "/arr/0/z"}]),
                "cannot move \"/arr/0\" into itself",
            ),
        ] {
            let mut d = doc.clone();
            let got = json_patch(&mut d, &ops).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "{ops}");
        }
        let mut d = doc.clone();
        json_patch(
            &mut d,
            &json!([{"op": "move", "from": "/arr/1", "path": "/arr/0"}]),
        )
        .expect("move");
        assert_eq!(d["arr"], json!([{"y": 2}, {"x": 1}]));
    }
}
