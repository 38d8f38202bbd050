//! The encoder: the JSON form of an object into its protobuf document, the inverse of the
//! decoder over the same field table. An object with a field the table does not have, or a value
//! of another type than its field's, has no protobuf form ([`EncodeError`]); callers then answer
//! JSON.

use base64::Engine;
use serde_json::Value;

use super::{MAGIC, body_message};
use crate::api::schema::{Field, Kind, MESSAGES, Special, kind_message};

/// Nested messages deeper than this are refused (the served kinds nest far less).
const MAX_DEPTH: usize = 64;

/// Why an object has no protobuf form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error("no protobuf message for kind {kind:?} in {api_version:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("{path}: not a field of {message}")]
    UnknownField { message: &'static str, path: String },
    #[error("{path}: expected {expected}")]
    Type { path: String, expected: &'static str },
    #[error("{path}: {reason}")]
    Value { path: String, reason: String },
    #[error("messages nest deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

impl EncodeError {
    /// The error with its path one level further up (`spec` + `.replicas`, `containers` + `[0]`).
    fn under(mut self, segment: &str) -> Self {
        if let Self::UnknownField { path, .. } | Self::Type { path, .. } | Self::Value { path, .. } =
            &mut self
        {
            *path = match path.as_str() {
                "" => segment.to_string(),
                p if p.starts_with('[') => format!("{segment}{p}"),
                p => format!("{segment}.{p}"),
            };
        }
        self
    }

    fn type_of(expected: &'static str) -> Self {
        Self::Type {
            path: String::new(),
            expected,
        }
    }

    fn value(reason: impl Into<String>) -> Self {
        Self::Value {
            path: String::new(),
            reason: reason.into(),
        }
    }
}

/// Encodes an object (with its `apiVersion` and `kind`) as a Kubernetes protobuf document.
pub fn encode(obj: &Value) -> Result<Vec<u8>, EncodeError> {
    encode_with(obj, Mode::Strict)
}

/// Like [`encode`], but fields without a protobuf form are left out instead of failing (for
/// watch streams, which cannot change their content type half-way).
pub(crate) fn encode_lenient(obj: &Value) -> Result<Vec<u8>, EncodeError> {
    encode_with(obj, Mode::Lenient)
}

fn encode_with(obj: &Value, mode: Mode) -> Result<Vec<u8>, EncodeError> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let idx = body_message(api_version, kind).ok_or_else(|| EncodeError::UnknownKind {
        api_version: api_version.into(),
        kind: kind.into(),
    })?;
    let mut raw = Vec::with_capacity(512);
    Encoder { mode }.message(idx, obj, &mut raw, Keys::Top, 0)?;
    let mut out = Vec::with_capacity(raw.len() + 64);
    envelope_head(api_version, kind, raw.len(), &mut out);
    out.extend_from_slice(&raw);
    envelope_tail(&mut out);
    Ok(out)
}

/// `k8s\0`, then a `runtime.Unknown` up to its `raw` bytes (`raw_len` of them follow).
pub(super) fn envelope_head(api_version: &str, kind: &str, raw_len: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    let mut type_meta = Vec::with_capacity(api_version.len() + kind.len() + 4);
    put_str(&mut type_meta, 1, api_version);
    put_str(&mut type_meta, 2, kind);
    put_bytes(out, 1, &type_meta);
    put_key(out, 2, 2);
    put_varint(out, raw_len as u64);
}

/// The rest of a `runtime.Unknown` after its `raw`: `contentEncoding` and `contentType`, empty
/// (Go writes them, as every non-pointer field).
pub(super) fn envelope_tail(out: &mut Vec<u8>) {
    put_str(out, 3, "");
    put_str(out, 4, "");
}

/// A List answer in protobuf, written item by item. A protobuf message's length comes before
/// its content, so the items' total size must be known before the first is written: a
/// streaming caller encodes every item once to add up [`ListEncoder::item_size`]s, then again to
/// write them.
#[derive(Debug)]
pub(crate) struct ListEncoder {
    item_message: usize,
    api_version: String,
    list_kind: String,
}

impl ListEncoder {
    /// The encoder of `<kind>List` in `api_version` (None: the kind has no protobuf message).
    pub(crate) fn new(api_version: &str, kind: &str) -> Option<Self> {
        Some(Self {
            item_message: kind_message(api_version, kind)?,
            api_version: api_version.into(),
            list_kind: format!("{kind}List"),
        })
    }

    /// An item's message (no envelope: the list's `items` are bare messages) from its `Value`
    /// (lists transcode stored JSON: [`Self::item_stored`]; this is their reference).
    #[cfg(test)]
    pub(crate) fn item(&self, obj: &Value) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(512);
        Encoder { mode: Mode::Strict }.message(self.item_message, obj, &mut out, Keys::Top, 0)?;
        Ok(out)
    }

    /// An item's message from its stored JSON (no `Value` built), with `resource_version` set.
    pub(crate) fn item_stored(&self, json: &[u8], resource_version: &str) -> Result<Vec<u8>, EncodeError> {
        super::transcode::transcode(json, self.item_message, Some(resource_version))
    }

    /// The bytes an item message of `len` bytes takes in the list.
    pub(crate) fn item_size(len: usize) -> usize {
        1 + varint_len(len as u64) + len
    }

    /// Appends an item message to the list.
    pub(crate) fn write_item(item: &[u8], out: &mut Vec<u8>) {
        put_bytes(out, 2, item);
    }

    /// The list's beginning: the envelope, then its `metadata`; `items_size` is the sum of the
    /// items' [`Self::item_size`]s.
    pub(crate) fn head(&self, resource_version: &str, next: Option<&str>, items_size: usize) -> Vec<u8> {
        let mut meta = Vec::with_capacity(32);
        put_str(&mut meta, 2, resource_version);
        if let Some(c) = next {
            put_str(&mut meta, 3, c);
        }
        let mut list_meta = Vec::with_capacity(meta.len() + 4);
        put_bytes(&mut list_meta, 1, &meta);
        let mut out = Vec::with_capacity(list_meta.len() + 64);
        envelope_head(
            &self.api_version,
            &self.list_kind,
            list_meta.len() + items_size,
            &mut out,
        );
        out.extend_from_slice(&list_meta);
        out
    }

    /// The list's end, after its items.
    pub(crate) fn tail(out: &mut Vec<u8>) {
        envelope_tail(out);
    }
}

/// One frame of a protobuf watch stream: the length, then a `WatchEvent` of `event_type` whose
/// object is the document `object` (an [`encode`] output).
pub(crate) fn watch_frame(event_type: &str, object: &[u8]) -> Vec<u8> {
    let mut raw_extension = Vec::with_capacity(object.len() + 8);
    put_bytes(&mut raw_extension, 1, object);
    let mut event = Vec::with_capacity(raw_extension.len() + event_type.len() + 8);
    put_str(&mut event, 1, event_type);
    put_bytes(&mut event, 2, &raw_extension);
    let mut frame = Vec::with_capacity(event.len() + 4);
    frame.extend_from_slice(&u32::try_from(event.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&event);
    frame
}

/// A watch frame of `event_type` for `obj`: its protobuf form with fields that have none left out.
pub(crate) fn watch_frame_of(event_type: &str, obj: &Value) -> Result<Vec<u8>, EncodeError> {
    Ok(watch_frame(event_type, &encode_lenient(obj)?))
}

/// What to do with a field without a protobuf form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Lenient,
}

/// Which keys of an object a message must own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// A top-level object: all but `apiVersion` and `kind` (they are in the envelope).
    Top,
    /// A nested object: all.
    All,
    /// The fields of a Go embedded struct, read from its parent's object: not checked here.
    Parent,
}

struct Encoder {
    mode: Mode,
}

impl Encoder {
    /// Encodes `v` as message `idx` (its content, without key or length).
    fn message(
        &self,
        idx: usize,
        v: &Value,
        out: &mut Vec<u8>,
        keys: Keys,
        depth: usize,
    ) -> Result<(), EncodeError> {
        if depth > MAX_DEPTH {
            return Err(EncodeError::TooDeep);
        }
        let msg = &MESSAGES[idx];
        if let Some(special) = msg.special {
            return special_value(special, v, out);
        }
        let obj = match v {
            Value::Object(m) => m,
            // A null message is an empty one (Go decodes `null` into a zero struct).
            Value::Null => return Ok(()),
            _ => return Err(EncodeError::type_of("an object")),
        };
        if self.mode == Mode::Strict && keys != Keys::Parent {
            for k in obj.keys() {
                let envelope = keys == Keys::Top && (k == "apiVersion" || k == "kind");
                if !envelope && !owns(idx, k, 0) {
                    return Err(EncodeError::UnknownField {
                        message: msg.name,
                        path: k.clone(),
                    });
                }
            }
        }
        for f in msg.fields {
            if f.json.is_empty() {
                // A Go embedded struct: its fields are this object's keys; Go always writes it.
                if let Kind::Msg(i) = f.kind {
                    let mut sub = Vec::new();
                    self.message(i, v, &mut sub, Keys::Parent, depth + 1)?;
                    put_bytes(out, f.tag, &sub);
                }
                continue;
            }
            let Some(value) = obj.get(f.json).filter(|v| !v.is_null()) else {
                continue;
            };
            let before = out.len();
            match self.field(f, value, out, depth) {
                Ok(()) => {}
                Err(_) if self.mode == Mode::Lenient => out.truncate(before),
                Err(e) => return Err(e.under(f.json)),
            }
        }
        Ok(())
    }

    fn field(&self, f: &Field, v: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), EncodeError> {
        match (&f.kind, v) {
            (Kind::Map(value_kind), Value::Object(entries)) => {
                // Go writes map entries sorted by key, key and value always.
                let mut keys: Vec<&String> = entries.keys().collect();
                keys.sort_unstable();
                let mut entry = Vec::new();
                for k in keys {
                    entry.clear();
                    put_str(&mut entry, 1, k);
                    self.value(value_kind, 2, &entries[k], &mut entry, depth)
                        .map_err(|e| e.under(k))?;
                    put_bytes(out, f.tag, &entry);
                }
                Ok(())
            }
            (Kind::Map(_), _) => Err(EncodeError::type_of("an object")),
            (kind, Value::Array(items)) if f.repeated => {
                for (i, item) in items.iter().enumerate() {
                    self.value(kind, f.tag, item, out, depth)
                        .map_err(|e| e.under(&format!("[{i}]")))?;
                }
                Ok(())
            }
            _ if f.repeated => Err(EncodeError::type_of("an array")),
            (kind, v) => self.value(kind, f.tag, v, out, depth),
        }
    }

    /// One value of `kind` as field `tag` (a null is the kind's zero value, as in Go).
    fn value(
        &self,
        kind: &Kind,
        tag: u32,
        v: &Value,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), EncodeError> {
        match kind {
            Kind::Str => match v {
                Value::String(s) => put_str(out, tag, s),
                Value::Null => put_str(out, tag, ""),
                _ => return Err(EncodeError::type_of("a string")),
            },
            Kind::Bytes => {
                let bytes = match v {
                    Value::String(s) => base64::engine::general_purpose::STANDARD
                        .decode(s)
                        .map_err(|e| EncodeError::value(format!("not base64: {e}")))?,
                    Value::Null => Vec::new(),
                    _ => return Err(EncodeError::type_of("a base64 string")),
                };
                put_bytes(out, tag, &bytes);
            }
            Kind::Bool => {
                let b = match v {
                    Value::Bool(b) => *b,
                    Value::Null => false,
                    _ => return Err(EncodeError::type_of("a boolean")),
                };
                put_key(out, tag, 0);
                put_varint(out, u64::from(b));
            }
            Kind::Int => {
                // int32 and int64 alike: negative values sign-extended to 64 bits.
                let n = match v {
                    Value::Number(n) => n
                        .as_i64()
                        .map(|i| i as u64)
                        .or_else(|| n.as_u64())
                        .ok_or_else(|| EncodeError::type_of("an integer"))?,
                    Value::Null => 0,
                    _ => return Err(EncodeError::type_of("an integer")),
                };
                put_key(out, tag, 0);
                put_varint(out, n);
            }
            Kind::Double => {
                let d = match v {
                    Value::Number(n) => n.as_f64().ok_or_else(|| EncodeError::type_of("a number"))?,
                    Value::Null => 0.0,
                    _ => return Err(EncodeError::type_of("a number")),
                };
                put_key(out, tag, 1);
                out.extend_from_slice(&d.to_le_bytes());
            }
            Kind::Msg(i) => {
                let mut sub = Vec::new();
                self.message(*i, v, &mut sub, Keys::All, depth + 1)?;
                put_bytes(out, tag, &sub);
            }
            Kind::Map(_) => return Err(EncodeError::type_of("a map value")),
        }
        Ok(())
    }
}

/// Whether message `idx` (or a Go struct embedded in it) has the JSON field `key`.
fn owns(idx: usize, key: &str, depth: usize) -> bool {
    MESSAGES[idx].fields.iter().any(|f| {
        f.json == key
            || (f.json.is_empty() && depth < 4 && matches!(f.kind, Kind::Msg(i) if owns(i, key, depth + 1)))
    })
}

/// The content of a message with a JSON form of its own.
pub(super) fn special_value(special: Special, v: &Value, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match special {
        Special::Time | Special::MicroTime => {
            let Value::String(s) = v else {
                return Err(EncodeError::type_of("an RFC 3339 time"));
            };
            let t = chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|e| EncodeError::value(format!("not an RFC 3339 time: {e}")))?;
            // metav1.Time carries seconds only (Go writes nanos 0); MicroTime its microseconds.
            let nanos = if special == Special::MicroTime {
                t.timestamp_subsec_nanos()
            } else {
                0
            };
            put_key(out, 1, 0);
            put_varint(out, t.timestamp() as u64);
            put_key(out, 2, 0);
            put_varint(out, u64::from(nanos));
        }
        Special::Duration => return Err(EncodeError::value("durations have no protobuf encoder")),
        Special::RawJson => {
            let raw = serde_json::to_vec(v).map_err(|e| EncodeError::value(e.to_string()))?;
            put_bytes(out, 1, &raw);
        }
        Special::Quantity => match v {
            Value::String(s) => put_str(out, 1, s),
            Value::Number(n) => put_str(out, 1, &n.to_string()),
            _ => return Err(EncodeError::type_of("a quantity")),
        },
        Special::IntOrString => {
            let (ty, int, text) = match v {
                Value::Number(n) => (
                    0,
                    n.as_i64()
                        .ok_or_else(|| EncodeError::type_of("an integer or a string"))?,
                    "",
                ),
                Value::String(s) => (1, 0, s.as_str()),
                _ => return Err(EncodeError::type_of("an integer or a string")),
            };
            put_key(out, 1, 0);
            put_varint(out, ty);
            put_key(out, 2, 0);
            put_varint(out, int as u64);
            put_str(out, 3, text);
        }
    }
    Ok(())
}

pub(super) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn put_key(out: &mut Vec<u8>, tag: u32, wire: u8) {
    put_varint(out, (u64::from(tag) << 3) | u64::from(wire));
}

pub(super) fn put_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    put_key(out, tag, 2);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(super) fn put_str(out: &mut Vec<u8>, tag: u32, s: &str) {
    put_bytes(out, tag, s.as_bytes());
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
