//! The stored form of objects: JSON without `resourceVersion`, which is the store's revision of
//! the key and is set on every read; and the mapping of store errors to API errors.
//!
//! Lists do not decode what they send: [`write_listed`] copies the stored bytes and inserts
//! `"resourceVersion":"<rev>"` into `metadata` where serde_json's map order puts it, which is
//! what decoding, setting the field and encoding again would give, byte for byte (the stored
//! form is serde_json's compact output of a map, so its shape is known; anything else is
//! decoded the slow way).

use serde_json::{Value, json};

use crate::api::registry::Resource;
use crate::api::status::ApiError;
use crate::storage::{KeyValue, StoreError};

/// Maps a store error to an API error (a compacted revision is 410 Gone).
pub(crate) fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Compacted { requested, compacted } => {
            ApiError::gone(format!("too old resource version: {requested} ({compacted})"))
        }
        e @ StoreError::TooLarge { .. } => ApiError {
            code: 413,
            reason: "RequestEntityTooLarge",
            message: e.to_string(),
            details: None,
        },
        other => ApiError::internal(other.to_string()),
    }
}

/// Maps a store error on object `name` of `res`: missing, existing and stale objects become
/// 404, 409 AlreadyExists and 409 Conflict.
pub(crate) fn store_err_for<'a>(
    res: &'a Resource,
    name: &'a str,
) -> impl FnOnce(StoreError) -> ApiError + 'a {
    move |e| match e {
        StoreError::NotFound { .. } => ApiError::not_found(res, name),
        StoreError::AlreadyExists { .. } => ApiError::already_exists(res, name),
        StoreError::Conflict { .. } => ApiError::conflict(res, name),
        other => store_err(other),
    }
}

/// Decodes a stored object and sets its resourceVersion.
pub(crate) fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut v: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("stored object {}: {e}", kv.key)))?;
    let meta = v.as_object_mut().map(|o| {
        let m = o.entry("metadata").or_insert(Value::Null);
        if m.is_null() {
            *m = json!({});
        }
        m
    });
    match meta {
        Some(Value::Object(meta)) => {
            meta.insert(
                "resourceVersion".into(),
                Value::String(kv.mod_revision.to_string()),
            );
        }
        _ => {
            return Err(ApiError::internal(format!(
                "stored object {} has no metadata object",
                kv.key
            )));
        }
    }
    Ok(v)
}

/// The `PartialObjectMetadata` of an object's `metadata` (`meta.k8s.io/v1`).
pub(crate) fn partial_metadata(metadata: Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
}

/// The `PartialObjectMetadata` of a stored object: only its metadata is decoded.
pub(crate) fn decode_metadata(kv: &KeyValue) -> Result<Value, ApiError> {
    static METADATA: std::sync::OnceLock<crate::api::object::sparse::Paths> = std::sync::OnceLock::new();
    let paths = METADATA.get_or_init(|| crate::api::object::sparse::Paths::new(["metadata"]));
    let mut v = paths
        .decode(&kv.value)
        .map_err(|e| ApiError::internal(format!("stored object {}: {e}", kv.key)))?;
    let mut meta = v["metadata"].take();
    if !meta.is_object() {
        meta = json!({});
    }
    meta["resourceVersion"] = Value::String(kv.mod_revision.to_string());
    Ok(partial_metadata(meta))
}

/// Appends the object of `kv` as the API shows it (its `resourceVersion` set) to `out`: the
/// stored bytes with the field inserted, or, when they are not in the expected shape, the object
/// decoded and encoded again.
pub(crate) fn write_listed(kv: &KeyValue, out: &mut Vec<u8>) -> Result<(), ApiError> {
    if splice_version(&kv.value, kv.mod_revision, out) {
        return Ok(());
    }
    serde_json::to_writer(out, &decode(kv)?)
        .map_err(|e| ApiError::internal(format!("encoding {}: {e}", kv.key)))
}

/// Whether serde_json's maps keep their keys sorted (they do, unless some crate in the build
/// turns on its `preserve_order` feature; then an inserted key goes last).
fn maps_are_sorted() -> bool {
    static SORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SORTED.get_or_init(|| {
        let mut m = serde_json::Map::new();
        m.insert("b".into(), Value::Null);
        m.insert("a".into(), Value::Null);
        m.keys().next().is_some_and(|k| k == "a")
    })
}

/// Appends `stored` with `"resourceVersion":"<rev>"` inserted into its top-level `metadata`
/// object. False (and `out` as it was) when `stored` is not an object with a `metadata` object
/// free of a `resourceVersion`, or its keys there need unescaping to compare.
fn splice_version(stored: &[u8], rev: i64, out: &mut Vec<u8>) -> bool {
    let Some(at) = version_position(stored, maps_are_sorted()) else {
        return false;
    };
    let field = format!("\"resourceVersion\":\"{rev}\"");
    out.reserve(stored.len() + field.len() + 1);
    out.extend_from_slice(&stored[..at.offset]);
    match at.place {
        Place::BeforeMember => {
            out.extend_from_slice(field.as_bytes());
            out.push(b',');
        }
        Place::AfterMembers => {
            out.push(b',');
            out.extend_from_slice(field.as_bytes());
        }
        Place::Alone => out.extend_from_slice(field.as_bytes()),
    }
    out.extend_from_slice(&stored[at.offset..]);
    true
}

/// Where the field goes.
#[derive(Debug, PartialEq, Eq)]
struct Insertion {
    offset: usize,
    place: Place,
}

#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// Before the member starting at `offset`.
    BeforeMember,
    /// At the closing brace (`offset`) of a metadata with members.
    AfterMembers,
    /// At the closing brace of an empty metadata.
    Alone,
}

fn version_position(b: &[u8], sorted: bool) -> Option<Insertion> {
    const FIELD: &[u8] = b"resourceVersion";
    let mut s = Scan { b, i: 0 };
    s.expect(b'{')?;
    if s.peek()? == b'}' {
        return None;
    }
    loop {
        let key = s.key()?;
        s.expect(b':')?;
        if key == b"metadata" {
            s.expect(b'{')?;
            if s.peek()? == b'}' {
                return Some(Insertion {
                    offset: s.i,
                    place: Place::Alone,
                });
            }
            let mut found = None;
            loop {
                let start = s.i;
                let k = s.key()?;
                if k == FIELD {
                    return None;
                }
                if sorted && found.is_none() && k > FIELD {
                    found = Some(start);
                }
                s.expect(b':')?;
                s.skip_value()?;
                match s.next_byte()? {
                    b',' => {}
                    b'}' => {
                        return Some(match found {
                            Some(offset) => Insertion {
                                offset,
                                place: Place::BeforeMember,
                            },
                            None => Insertion {
                                offset: s.i - 1,
                                place: Place::AfterMembers,
                            },
                        });
                    }
                    _ => return None,
                }
            }
        }
        s.skip_value()?;
        match s.next_byte()? {
            b',' => {}
            _ => return None,
        }
    }
}

/// A cursor over compact JSON text that only finds where things are (whitespace between tokens
/// is not compact: such text is left to the decoder).
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&mut self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next_byte(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        (self.next_byte()? == c).then_some(())
    }

    /// An object key without escapes (None for one with escapes: it would need decoding).
    fn key(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.i;
        let len = self.b[start..].iter().position(|c| *c == b'"' || *c == b'\\')?;
        if self.b[start + len] == b'\\' {
            return None;
        }
        self.i = start + len + 1;
        Some(&self.b[start..start + len])
    }

    /// Moves past a string whose opening quote was consumed.
    fn skip_string_rest(&mut self) -> Option<()> {
        loop {
            let n = self.b[self.i..].iter().position(|c| *c == b'"' || *c == b'\\')?;
            self.i += n;
            if self.b[self.i] == b'"' {
                self.i += 1;
                return Some(());
            }
            self.i += 2;
        }
    }

    /// Moves past one value (objects and arrays by bracket depth, strings by their quotes).
    fn skip_value(&mut self) -> Option<()> {
        match self.next_byte()? {
            b'"' => self.skip_string_rest(),
            b'{' | b'[' => {
                let mut depth = 1usize;
                while depth > 0 {
                    let c = *self.b.get(self.i)?;
                    self.i += 1;
                    match c {
                        b'"' => self.skip_string_rest()?,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => depth -= 1,
                        _ => {}
                    }
                }
                Some(())
            }
            _ => {
                // A number or a literal: up to the next delimiter.
                let n = self.b[self.i..]
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']') || c.is_ascii_whitespace())
                    .unwrap_or(self.b.len() - self.i);
                self.i += n;
                Some(())
            }
        }
    }
}

/// The stored form of an object: everything but its resourceVersion (the store's revision),
/// serialized in place (no copy of the object), exactly sized (serde_json's buffer grows by
/// doubling, and a stored value is kept for as long as the object lives).
pub(crate) fn encode(obj: &Value) -> bytes::Bytes {
    bytes::Bytes::from(
        serde_json::to_vec(&Stored(obj))
            .unwrap_or_default()
            .into_boxed_slice(),
    )
}

struct Stored<'a>(&'a Value);

impl serde::Serialize for Stored<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(top) = self.0.as_object() else {
            return self.0.serialize(s);
        };
        let mut map = s.serialize_map(Some(top.len()))?;
        for (k, v) in top {
            match v.as_object() {
                Some(meta) if k == "metadata" => map.serialize_entry(k, &WithoutVersion(meta))?,
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

struct WithoutVersion<'a>(&'a serde_json::Map<String, Value>);

impl serde::Serialize for WithoutVersion<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.0.iter().filter(|(k, _)| k.as_str() != "resourceVersion") {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// `obj` as the store now holds it, at revision `rev` (what decoding the write would give).
pub(crate) fn stored_at(mut obj: Value, rev: i64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(rev.to_string());
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(stored: &[u8], rev: i64) -> Vec<u8> {
        let kv = KeyValue {
            key: "/registry/core/pods/default/p".into(),
            value: bytes::Bytes::copy_from_slice(stored),
            create_revision: 1,
            mod_revision: rev,
        };
        let mut out = b"[".to_vec();
        write_listed(&kv, &mut out).expect("writes");
        out.remove(0);
        out
    }

    /// What lists sent before the splice: decode, set the field, encode.
    fn decoded(stored: &[u8], rev: i64) -> Vec<u8> {
        let kv = KeyValue {
            key: "k".into(),
            value: bytes::Bytes::copy_from_slice(stored),
            create_revision: 1,
            mod_revision: rev,
        };
        serde_json::to_vec(&decode(&kv).expect("decodes")).expect("encodes")
    }

    fn kv(stored: &[u8]) -> KeyValue {
        KeyValue {
            key: "k".into(),
            value: bytes::Bytes::copy_from_slice(stored),
            create_revision: 1,
            mod_revision: 1,
        }
    }

    #[test]
    fn spliced_objects_are_what_decoding_gives() {
        let objects = [
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default",
                "uid": "u", "labels": {"a": "b", "resourceVersion": "x"}, "annotations": {"k": "{\"}]\\\""},
                "creationTimestamp": "2025-01-01T00:00:00Z", "managedFields": [{"manager": "m",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}]},
                "spec": {"containers": [{"name": "c", "image": "i", "args": ["}", "\"", "ü€"]}],
                    "priority": -5, "x": 1.5e300, "y": null, "z": [true, false, []]}}),
            // metadata without keys sorting after resourceVersion, and empty metadata.
            json!({"kind": "Namespace", "metadata": {"name": "default"}}),
            json!({"kind": "Namespace", "metadata": {}, "spec": {}}),
            json!({"metadata": {"uid": "u"}}),
            json!({"a": {"metadata": {"nested": 1}}, "metadata": {"annotations": {}, "zz": 0}}),
        ];
        for obj in objects {
            let stored = encode(&obj);
            assert_eq!(
                String::from_utf8(listed(&stored, 42)).expect("utf8"),
                String::from_utf8(decoded(&stored, 42)).expect("utf8"),
                "{obj}"
            );
            assert!(
                version_position(&stored, true).is_some(),
                "spliced, not decoded: {obj}"
            );
        }
    }

    #[test]
    fn unexpected_shapes_are_decoded() {
        for stored in [
            &br#"{"kind":"Pod"}"#[..],
            br#"{"metadata":{"resourceVersion":"7","name":"p"}}"#,
            br#"{"metadata":{"na\u006de":"p"}}"#,
            br#" { "metadata" : { "name" : "p" } } "#,
        ] {
            let spliced = version_position(stored, true).is_some();
            assert_eq!(
                String::from_utf8(listed(stored, 9)).expect("utf8"),
                String::from_utf8(decoded(stored, 9)).expect("utf8"),
                "{} (spliced: {spliced})",
                String::from_utf8_lossy(stored)
            );
        }
        assert!(version_position(br#"{"metadata":{"resourceVersion":"7"}}"#, true).is_none());
        assert!(version_position(br#"{"metadata":"p"}"#, true).is_none());
        assert!(version_position(b"[1]", true).is_none());
        assert!(version_position(br#"{"metadata":{"name":"p""#, true).is_none());
        assert!(version_position(br#" { "metadata" : { "name" : "p" } }"#, true).is_none());
        // Not an object with a metadata object: an error, not a panic.
        for bad in [&b"{not json"[..], br#"{"metadata":"p"}"#, b"[1]", b"null"] {
            assert_eq!(
                write_listed(&kv(bad), &mut Vec::new()).map_err(|e| e.code),
                Err(500)
            );
            assert_eq!(decode(&kv(bad)).map_err(|e| e.code), Err(500));
        }
    }

    #[test]
    fn without_sorted_maps_the_field_goes_last() {
        let at = version_position(br#"{"metadata":{"uid":"u","name":"p"},"spec":{}}"#, false);
        assert_eq!(
            at,
            Some(Insertion {
                offset: 33,
                place: Place::AfterMembers
            })
        );
    }
}
