//! The decoder: a protobuf document into the JSON form the rest of the server works on.

use serde_json::{Map, Value};

use super::{MAGIC, body_message};
use crate::api::object::b64_bytes;
use crate::api::schema::{Field, Kind, MESSAGES, Message, Special};

/// Nested messages deeper than this are refused (the served kinds nest far less).
const MAX_DEPTH: usize = 64;

/// Scalar fields that are Go pointers in the API types, so a `0` or `false` on the wire was set
/// on purpose and must survive the conversion.
pub(super) const ZERO_IS_A_VALUE: &[&str] = &[
    "replicas",
    "minReplicas",
    "parallelism",
    "completions",
    "backoffLimit",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
    "terminationGracePeriodSeconds",
    "gracePeriodSeconds",
    "deletionGracePeriodSeconds",
    "revisionHistoryLimit",
    "progressDeadlineSeconds",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
    "startingDeadlineSeconds",
    "expirationSeconds",
    "runAsUser",
    "runAsGroup",
    "fsGroup",
    "defaultMode",
    "mode",
    "priority",
    "automountServiceAccountToken",
    "enableServiceLinks",
    "allowPrivilegeEscalation",
    "privileged",
    "runAsNonRoot",
    "readOnlyRootFilesystem",
    "hostUsers",
    "suspend",
    "immutable",
    "optional",
    "allocateLoadBalancerNodePorts",
    "ready",
    "serving",
    "terminating",
    "shareProcessNamespace",
    "setHostnameAsFQDN",
    "unschedulable",
    // intstr pointers: `maxUnavailable: 0`, `kubectl create pdb --min-available=0`.
    "maxSurge",
    "maxUnavailable",
    "minAvailable",
];

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("the body does not start with the Kubernetes protobuf prefix \"k8s\\x00\"")]
    Magic,
    #[error("truncated protobuf data")]
    Truncated,
    #[error("a varint is longer than 10 bytes")]
    Varint,
    #[error("field {tag} of {message} has wire type {wire}, expected {expected}")]
    WireType {
        message: &'static str,
        tag: u32,
        wire: u8,
        expected: u8,
    },
    #[error("unsupported protobuf wire type {0}")]
    UnsupportedWireType(u8),
    #[error("field {field} is not valid UTF-8")]
    Utf8 { field: &'static str },
    #[error("the object's type is missing (runtime.Unknown has no apiVersion/kind)")]
    NoType,
    #[error("no kind {kind:?} is registered for version {api_version:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("unsupported content encoding {0:?}")]
    ContentEncoding(String),
    #[error("embedded raw data of {field} is neither JSON nor protobuf: {reason}")]
    Raw { field: &'static str, reason: String },
    #[error("messages nest deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("timestamp {0} is out of range")]
    Time(i64),
}

/// Decodes a Kubernetes protobuf document into its JSON object (with apiVersion and kind).
pub fn decode(body: &[u8]) -> Result<Value, DecodeError> {
    decode_at(body, 0)
}

fn decode_at(body: &[u8], depth: usize) -> Result<Value, DecodeError> {
    let rest = body.strip_prefix(MAGIC).ok_or(DecodeError::Magic)?;
    let (mut api_version, mut kind, mut raw, mut encoding) =
        (String::new(), String::new(), None, String::new());
    let mut r = Reader::new(rest);
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => {
                let mut tm = Reader::new(r.bytes("runtime.Unknown", tag, wire)?);
                while let Some((t, w)) = tm.key()? {
                    match t {
                        1 => api_version = tm.string("apiVersion", t, w)?.to_string(),
                        2 => kind = tm.string("kind", t, w)?.to_string(),
                        _ => tm.skip(w)?,
                    }
                }
            }
            2 => raw = Some(r.bytes("runtime.Unknown", tag, wire)?),
            3 => encoding = r.string("contentEncoding", tag, wire)?.to_string(),
            _ => r.skip(wire)?,
        }
    }
    if !encoding.is_empty() {
        return Err(DecodeError::ContentEncoding(encoding));
    }
    if api_version.is_empty() || kind.is_empty() {
        return Err(DecodeError::NoType);
    }
    let idx = body_message(&api_version, &kind).ok_or_else(|| DecodeError::UnknownKind {
        api_version: api_version.clone(),
        kind: kind.clone(),
    })?;
    let mut obj = match message(idx, raw.unwrap_or_default(), depth + 1)? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(obj))
}

/// Decodes one message of type `idx`.
fn message(idx: usize, data: &[u8], depth: usize) -> Result<Value, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(DecodeError::TooDeep);
    }
    let msg = &MESSAGES[idx];
    if let Some(special) = msg.special {
        return special_value(msg, special, data, depth);
    }
    let mut out = Map::new();
    let mut r = Reader::new(data);
    while let Some((tag, wire)) = r.key()? {
        let Ok(fi) = msg.fields.binary_search_by_key(&tag, |f| f.tag) else {
            // Fields this table does not know (newer API versions) are skipped, as Go does.
            r.skip(wire)?;
            continue;
        };
        let field = &msg.fields[fi];
        if let Kind::Map(value_kind) = field.kind {
            let entry = r.bytes(msg.name, tag, wire)?;
            let (k, v) = map_entry(msg, field, value_kind, entry, depth)?;
            let map = out.entry(field.json).or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = map {
                m.insert(k, v);
            }
            continue;
        }
        if field.repeated {
            let list = out.entry(field.json).or_insert_with(|| Value::Array(Vec::new()));
            let Value::Array(items) = list else { continue };
            if wire == 2 && matches!(field.kind, Kind::Bool | Kind::Int | Kind::Double) {
                // Packed scalars.
                let mut p = Reader::new(r.bytes(msg.name, tag, wire)?);
                while !p.done() {
                    let w = if matches!(field.kind, Kind::Double) { 1 } else { 0 };
                    items.push(scalar(msg, field, &field.kind, &mut p, w, depth)?);
                }
            } else {
                items.push(scalar(msg, field, &field.kind, &mut r, wire, depth)?);
            }
            continue;
        }
        let v = scalar(msg, field, &field.kind, &mut r, wire, depth)?;
        let merges = matches!(field.kind, Kind::Msg(i) if MESSAGES[i].special.is_none());
        if field.json.is_empty() {
            // Embedded Go struct: its fields are the parent's.
            if let Value::Object(m) = v {
                for (k, v) in m {
                    merge_field(&mut out, k, v);
                }
            }
        } else if merges {
            merge_field(&mut out, field.json.to_string(), v);
        } else {
            out.insert(field.json.to_string(), v);
        }
    }
    out.retain(|k, v| !omitted(k, v));
    Ok(Value::Object(out))
}

/// Sets a message field seen again the protobuf way: a message merges into the one before
/// (its fields set again replace, its lists grow), where a scalar would replace it. Encoders
/// may split a message so (the list encoder sends `metadata.resourceVersion` apart).
fn merge_field(out: &mut Map<String, Value>, key: String, v: Value) {
    match (out.get_mut(&key), v) {
        (Some(Value::Object(old)), Value::Object(new)) => {
            for (k, v) in new {
                merge_field(old, k, v);
            }
        }
        (Some(Value::Array(old)), Value::Array(new)) => old.extend(new),
        (_, v) => {
            out.insert(key, v);
        }
    }
}

/// Whether Go's JSON encoder would leave this (non-list) field out.
fn omitted(name: &str, v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Bool(false) => !ZERO_IS_A_VALUE.contains(&name),
        Value::Number(n) => n.as_f64() == Some(0.0) && !ZERO_IS_A_VALUE.contains(&name),
        _ => false,
    }
}

fn map_entry(
    msg: &'static Message,
    field: &'static Field,
    value_kind: &'static Kind,
    entry: &[u8],
    depth: usize,
) -> Result<(String, Value), DecodeError> {
    let mut e = Reader::new(entry);
    let (mut key, mut value) = (String::new(), None);
    while let Some((t, w)) = e.key()? {
        match t {
            1 => key = e.string(field.json, t, w)?.to_string(),
            2 => value = Some(scalar(msg, field, value_kind, &mut e, w, depth)?),
            _ => e.skip(w)?,
        }
    }
    let value = value.unwrap_or_else(|| match value_kind {
        Kind::Msg(_) => Value::Object(Map::new()),
        _ => Value::String(String::new()),
    });
    Ok((key, value))
}

/// Reads one value of `kind` at the reader's position.
fn scalar(
    msg: &'static Message,
    field: &'static Field,
    kind: &Kind,
    r: &mut Reader<'_>,
    wire: u8,
    depth: usize,
) -> Result<Value, DecodeError> {
    let expect = |expected: u8| {
        if wire == expected {
            Ok(())
        } else {
            Err(DecodeError::WireType {
                message: msg.name,
                tag: field.tag,
                wire,
                expected,
            })
        }
    };
    Ok(match kind {
        Kind::Str => Value::String(r.string(field.json, field.tag, wire)?.to_string()),
        Kind::Bytes => Value::String(b64_bytes(r.bytes(msg.name, field.tag, wire)?)),
        Kind::Bool => {
            expect(0)?;
            Value::Bool(r.varint()? != 0)
        }
        Kind::Int => {
            expect(0)?;
            // int32 and int64 both arrive sign-extended to 64 bits.
            Value::from(r.varint()? as i64)
        }
        Kind::Double => {
            expect(1)?;
            let b = r.take(8)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            serde_json::Number::from_f64(f64::from_le_bytes(a))
                .map(Value::Number)
                .unwrap_or(Value::Null)
        }
        Kind::Msg(idx) => {
            let data = r.bytes(msg.name, field.tag, wire)?;
            message(*idx, data, depth + 1)?
        }
        Kind::Map(_) => {
            return Err(DecodeError::WireType {
                message: msg.name,
                tag: field.tag,
                wire,
                expected: 2,
            });
        }
    })
}

fn special_value(
    msg: &'static Message,
    special: Special,
    data: &[u8],
    depth: usize,
) -> Result<Value, DecodeError> {
    let mut r = Reader::new(data);
    let (mut ints, mut text, mut raw) = ([0i64; 3], None::<String>, None::<&[u8]>);
    while let Some((tag, wire)) = r.key()? {
        match (special, tag, wire) {
            (Special::Quantity, 1, _) | (Special::IntOrString, 3, _) => {
                text = Some(r.string(msg.name, tag, wire)?.to_string())
            }
            (Special::RawJson, 1, _) => raw = Some(r.bytes(msg.name, tag, wire)?),
            (_, 1..=3, 0) => ints[tag as usize - 1] = r.varint()? as i64,
            _ => r.skip(wire)?,
        }
    }
    Ok(match special {
        Special::Time | Special::MicroTime => {
            let (secs, nanos) = (ints[0], ints[1]);
            if secs == 0 && nanos == 0 {
                return Ok(Value::Null);
            }
            let t = u64::try_from(secs)
                .ok()
                .and_then(|s| {
                    std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(s, u32::try_from(nanos).ok()?))
                })
                .ok_or(DecodeError::Time(secs))?;
            Value::String(if special == Special::Time {
                kcore::time::rfc3339(t)
            } else {
                kcore::time::rfc3339_micros(t)
            })
        }
        Special::Duration => Value::String(go_duration(ints[0])),
        Special::Quantity => text.map(Value::String).unwrap_or(Value::Null),
        Special::IntOrString => match (ints[0], text) {
            (1, Some(s)) => Value::String(s),
            (1, None) => Value::String(String::new()),
            _ => Value::from(ints[1]),
        },
        Special::RawJson => match raw {
            None | Some([]) => Value::Null,
            Some(b) if b.starts_with(MAGIC) => decode_at(b, depth)?,
            Some(b) => serde_json::from_slice(b).map_err(|e| DecodeError::Raw {
                field: msg.name,
                reason: e.to_string(),
            })?,
        },
    })
}

/// Go's `time.Duration.String()` for a count of nanoseconds.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    let frac = |v: u64, unit: u64, suffix: &str| {
        let (whole, rest) = (v / unit, v % unit);
        if rest == 0 {
            format!("{whole}{suffix}")
        } else {
            let digits = unit.ilog10() as usize;
            let f = format!("{rest:0digits$}");
            format!("{whole}.{}{suffix}", f.trim_end_matches('0'))
        }
    };
    if n < 1_000 {
        return format!("{sign}{n}ns");
    }
    if n < 1_000_000 {
        return format!("{sign}{}", frac(n, 1_000, "µs"));
    }
    if n < 1_000_000_000 {
        return format!("{sign}{}", frac(n, 1_000_000, "ms"));
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, s) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let secs = frac(s, 1_000_000_000, "s");
    match (h, m) {
        (0, 0) => format!("{sign}{secs}"),
        (0, m) => format!("{sign}{m}m{secs}"),
        (h, m) => format!("{sign}{h}h{m}m{secs}"),
    }
}

/// A cursor over protobuf wire data.
pub(super) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.data.len())
            .ok_or(DecodeError::Truncated)?;
        let b = &self.data[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self.data.get(self.pos).ok_or(DecodeError::Truncated)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Varint)
    }

    /// The next field key, or None at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>, DecodeError> {
        if self.done() {
            return Ok(None);
        }
        let k = self.varint()?;
        let wire = (k & 7) as u8;
        let tag = u32::try_from(k >> 3).map_err(|_| DecodeError::Varint)?;
        Ok(Some((tag, wire)))
    }

    fn bytes(&mut self, message: &'static str, tag: u32, wire: u8) -> Result<&'a [u8], DecodeError> {
        if wire != 2 {
            return Err(DecodeError::WireType {
                message,
                tag,
                wire,
                expected: 2,
            });
        }
        let n = usize::try_from(self.varint()?).map_err(|_| DecodeError::Truncated)?;
        self.take(n)
    }

    fn string(&mut self, field: &'static str, tag: u32, wire: u8) -> Result<&'a str, DecodeError> {
        let b = self.bytes(field, tag, wire)?;
        std::str::from_utf8(b).map_err(|_| DecodeError::Utf8 { field })
    }

    fn skip(&mut self, wire: u8) -> Result<(), DecodeError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| DecodeError::Truncated)?;
                self.take(n).map(drop)
            }
            5 => self.take(4).map(drop),
            w => Err(DecodeError::UnsupportedWireType(w)),
        }
    }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
