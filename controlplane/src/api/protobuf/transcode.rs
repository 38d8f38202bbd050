//! The list items' encoder: an object's stored JSON straight into its protobuf message, in one
//! pass over the text and without building a `Value` (what [`super::encode`] needs), over the
//! same field table.
//!
//! Fields are written in the order the JSON has them; a Go embedded struct's fields each go in
//! an occurrence of their own of the embedded field, and the `resourceVersion` (which the stored
//! form does not hold) in a second `metadata`. Protobuf decoders merge the occurrences of a
//! message field (Go's generated code, prost, this module's decoder), so the object decodes as
//! [`super::encode`]'s output does. A nested message's length is written once its content is
//! there: a byte is kept for it and the content moved when the length needs more.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use base64::Engine;
use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::EncodeError;
use super::encode::{put_bytes, put_key, put_str, put_varint, varint_len};
use crate::api::schema::{Field, Kind, MESSAGES, Special};

/// Nested messages deeper than this are refused (the served kinds nest far less).
const MAX_DEPTH: usize = 64;

/// The protobuf message `idx` of the object whose JSON is `json`, with `resource_version` set in
/// its `metadata` (when given).
pub(crate) fn transcode(
    json: &[u8],
    idx: usize,
    resource_version: Option<&str>,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(json.len() / 2 + 16);
    let mut de = serde_json::Deserializer::from_slice(json);
    Message {
        idx,
        out: &mut out,
        top: true,
        depth: 0,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
    .map_err(|e| EncodeError::Value {
        path: String::new(),
        reason: e.to_string(),
    })?;
    if let Some(rv) = resource_version {
        let meta = MESSAGES[idx].fields.iter().find(|f| f.json == "metadata");
        let Some((meta, Kind::Msg(meta_idx))) = meta.map(|f| (f, &f.kind)) else {
            return Err(EncodeError::Value {
                path: "metadata".into(),
                reason: "the kind has no metadata".into(),
            });
        };
        let rv_field = MESSAGES[*meta_idx]
            .fields
            .iter()
            .find(|f| f.json == "resourceVersion");
        if let Some(rv_field) = rv_field {
            let mut inner = Vec::with_capacity(rv.len() + 2);
            put_str(&mut inner, rv_field.tag, rv);
            put_bytes(&mut out, meta.tag, &inner);
        }
    }
    Ok(out)
}

/// Where a JSON key of a message goes: its own field, or a field of an embedded struct (the
/// embedded fields leading to it, outermost first).
#[derive(Debug)]
struct Slot {
    through: Vec<&'static Field>,
    field: &'static Field,
}

/// Per message, the slot of every JSON key (built once).
fn slots(idx: usize) -> &'static HashMap<&'static str, Slot> {
    static SLOTS: OnceLock<Vec<HashMap<&'static str, Slot>>> = OnceLock::new();
    let all = SLOTS.get_or_init(|| {
        (0..MESSAGES.len())
            .map(|i| {
                let mut map = HashMap::new();
                collect_slots(i, &mut Vec::new(), &mut map, 0);
                map
            })
            .collect()
    });
    &all[idx]
}

fn collect_slots(
    idx: usize,
    through: &mut Vec<&'static Field>,
    map: &mut HashMap<&'static str, Slot>,
    depth: usize,
) {
    for f in MESSAGES[idx].fields {
        if f.json.is_empty() {
            if let (Kind::Msg(i), true) = (&f.kind, depth < 4) {
                through.push(f);
                collect_slots(*i, through, map, depth + 1);
                through.pop();
            }
        } else {
            map.entry(f.json).or_insert_with(|| Slot {
                through: through.clone(),
                field: f,
            });
        }
    }
}

/// Starts a length-delimited field: its key and one byte for the length.
fn open(out: &mut Vec<u8>, tag: u32) -> usize {
    put_key(out, tag, 2);
    out.push(0);
    out.len()
}

/// Writes the length of the field opened at `start`, moving its content when the length takes
/// more than the byte kept for it.
fn close(out: &mut Vec<u8>, start: usize) {
    let len = out.len() - start;
    let n = varint_len(len as u64);
    if n > 1 {
        out.resize(out.len() + n - 1, 0);
        out.copy_within(start..start + len, start + n - 1);
    }
    let mut v = len as u64;
    for b in &mut out[start - 1..start - 1 + n] {
        *b = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
        v >>= 7;
    }
}

/// A message's content (its fields) from a JSON object; null is an empty message.
struct Message<'a> {
    idx: usize,
    out: &'a mut Vec<u8>,
    /// A top-level object: its `apiVersion` and `kind` are the envelope's.
    top: bool,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.depth > MAX_DEPTH {
            return Err(de::Error::custom("messages nest too deep"));
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an object for {}", MESSAGES[self.idx].name)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let slots = slots(self.idx);
        while let Some(key) = map.next_key_seed(KeyOf {
            slots,
            top: self.top,
            message: MESSAGES[self.idx].name,
        })? {
            let Some(slot) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let opened: Vec<usize> = slot.through.iter().map(|f| open(self.out, f.tag)).collect();
            map.next_value_seed(FieldValue {
                field: slot.field,
                out: self.out,
                depth: self.depth,
            })?;
            for start in opened.into_iter().rev() {
                close(self.out, start);
            }
        }
        Ok(())
    }
}

/// A key of a message's object: its slot, None for the envelope's keys, an error for a key the
/// message does not have.
struct KeyOf {
    slots: &'static HashMap<&'static str, Slot>,
    top: bool,
    message: &'static str,
}

impl<'de> DeserializeSeed<'de> for KeyOf {
    type Value = Option<&'static Slot>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyOf {
    type Value = Option<&'static Slot>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, k: &str) -> Result<Self::Value, E> {
        match self.slots.get(k) {
            Some(slot) => Ok(Some(slot)),
            None if self.top && (k == "apiVersion" || k == "kind") => Ok(None),
            None => Err(E::custom(format!("{k}: not a field of {}", self.message))),
        }
    }
}

/// A field's value: a map, a list or one value (null: the field is left out).
struct FieldValue<'a> {
    field: &'static Field,
    out: &'a mut Vec<u8>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for FieldValue<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if matches!(self.field.kind, Kind::Map(_)) || self.field.repeated {
            return d.deserialize_any(self);
        }
        One {
            kind: &self.field.kind,
            tag: self.field.tag,
            out: self.out,
            depth: self.depth,
            null_is_zero: false,
        }
        .deserialize(d)
    }
}

impl<'de> Visitor<'de> for FieldValue<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a value for {}", self.field.json)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if !self.field.repeated {
            return Err(de::Error::custom(format!("{}: not a list", self.field.json)));
        }
        while seq
            .next_element_seed(One {
                kind: &self.field.kind,
                tag: self.field.tag,
                out: &mut *self.out,
                depth: self.depth,
                null_is_zero: true,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Kind::Map(value_kind) = self.field.kind else {
            return Err(de::Error::custom(format!("{}: not a map", self.field.json)));
        };
        // Go sorts map entries; protobuf readers do not need it, and JSON maps are sorted.
        loop {
            let mark = self.out.len();
            let start = open(self.out, self.field.tag);
            if map.next_key_seed(MapKey { out: &mut *self.out })?.is_none() {
                self.out.truncate(mark);
                return Ok(());
            }
            map.next_value_seed(One {
                kind: value_kind,
                tag: 2,
                out: &mut *self.out,
                depth: self.depth,
                null_is_zero: true,
            })?;
            close(self.out, start);
        }
    }
}

/// A map entry's key, written as its field 1.
struct MapKey<'a> {
    out: &'a mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for MapKey<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MapKey<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map key")
    }

    fn visit_str<E: de::Error>(self, k: &str) -> Result<(), E> {
        put_str(self.out, 1, k);
        Ok(())
    }
}

/// One value of `kind` as field `tag`.
struct One<'a> {
    kind: &'static Kind,
    tag: u32,
    out: &'a mut Vec<u8>,
    depth: usize,
    /// In a list or a map a null is the zero value (Go decodes it so); a field's null is left out.
    null_is_zero: bool,
}

impl<'de> DeserializeSeed<'de> for One<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if let Kind::Msg(i) = self.kind
            && let Some(special) = MESSAGES[*i].special
        {
            return special_value(special, self.tag, self.out, d);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for One<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a value of kind {:?}", self.kind)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if !self.null_is_zero {
            return Ok(());
        }
        match self.kind {
            Kind::Str | Kind::Bytes => put_str(self.out, self.tag, ""),
            Kind::Bool | Kind::Int => {
                put_key(self.out, self.tag, 0);
                put_varint(self.out, 0);
            }
            Kind::Double => {
                put_key(self.out, self.tag, 1);
                self.out.extend_from_slice(&0f64.to_le_bytes());
            }
            Kind::Msg(_) | Kind::Map(_) => put_bytes(self.out, self.tag, &[]),
        }
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        match self.kind {
            Kind::Bool => {
                put_key(self.out, self.tag, 0);
                put_varint(self.out, u64::from(v));
                Ok(())
            }
            _ => Err(E::custom("unexpected boolean")),
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        match self.kind {
            // int32 and int64 alike: negative values sign-extended to 64 bits.
            Kind::Int => {
                put_key(self.out, self.tag, 0);
                put_varint(self.out, v as u64);
                Ok(())
            }
            Kind::Double => self.visit_f64(v as f64),
            _ => Err(E::custom("unexpected number")),
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        match self.kind {
            Kind::Int => {
                put_key(self.out, self.tag, 0);
                put_varint(self.out, v);
                Ok(())
            }
            Kind::Double => self.visit_f64(v as f64),
            _ => Err(E::custom("unexpected number")),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        match self.kind {
            Kind::Double => {
                put_key(self.out, self.tag, 1);
                self.out.extend_from_slice(&v.to_le_bytes());
                Ok(())
            }
            _ => Err(E::custom("unexpected fraction")),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        match self.kind {
            Kind::Str => {
                put_str(self.out, self.tag, v);
                Ok(())
            }
            Kind::Bytes => {
                let b = base64::engine::general_purpose::STANDARD
                    .decode(v)
                    .map_err(|e| E::custom(format!("not base64: {e}")))?;
                put_bytes(self.out, self.tag, &b);
                Ok(())
            }
            _ => Err(E::custom("unexpected string")),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let Kind::Msg(i) = self.kind else {
            return Err(de::Error::custom("unexpected object"));
        };
        let start = open(self.out, self.tag);
        Message {
            idx: *i,
            out: &mut *self.out,
            top: false,
            depth: self.depth + 1,
        }
        .visit_map(map)?;
        close(self.out, start);
        Ok(())
    }
}

/// A message with a JSON form of its own as field `tag` (null: left out).
fn special_value<'de, D: de::Deserializer<'de>>(
    special: Special,
    tag: u32,
    out: &mut Vec<u8>,
    d: D,
) -> Result<(), D::Error> {
    if special == Special::RawJson {
        // Embedded JSON (managedFields' fieldsV1, in every object) is copied as it is.
        let raw = <&serde_json::value::RawValue>::deserialize(d)?;
        if raw.get() != "null" {
            let start = open(out, tag);
            put_bytes(out, 1, raw.get().as_bytes());
            close(out, start);
        }
        return Ok(());
    }
    d.deserialize_any(SpecialValue { special, tag, out })
}

/// A time, a quantity or an int-or-string, as a string or a number.
struct SpecialValue<'a> {
    special: Special,
    tag: u32,
    out: &'a mut Vec<u8>,
}

impl SpecialValue<'_> {
    fn write<E: de::Error>(self, v: &Value) -> Result<(), E> {
        let start = open(self.out, self.tag);
        super::encode::special_value(self.special, v, self.out).map_err(|e| E::custom(e.to_string()))?;
        close(self.out, start);
        Ok(())
    }
}

impl<'de> Visitor<'de> for SpecialValue<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {:?}", self.special)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        let mark = self.out.len();
        let start = open(self.out, self.tag);
        match self.special {
            Special::Quantity => put_str(self.out, 1, v),
            Special::IntOrString => {
                put_key(self.out, 1, 0);
                put_varint(self.out, 1);
                put_key(self.out, 2, 0);
                put_varint(self.out, 0);
                put_str(self.out, 3, v);
            }
            Special::Time | Special::MicroTime => {
                let t = chrono::DateTime::parse_from_rfc3339(v)
                    .map_err(|e| E::custom(format!("not an RFC 3339 time: {e}")))?;
                let nanos = if self.special == Special::MicroTime {
                    t.timestamp_subsec_nanos()
                } else {
                    0
                };
                put_key(self.out, 1, 0);
                put_varint(self.out, t.timestamp() as u64);
                put_key(self.out, 2, 0);
                put_varint(self.out, u64::from(nanos));
            }
            Special::Duration | Special::RawJson => {
                self.out.truncate(mark);
                return self.write(&Value::String(v.into()));
            }
        }
        close(self.out, start);
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.write(&Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.write(&Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.write(&Value::from(v))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::protobuf::{ListEncoder, decode, encode};

    /// What the Value encoder writes and what the transcoder writes decode to the same object.
    #[test]
    fn transcoded_items_decode_as_encoded_ones() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "default", "uid": "u", "generation": 1,
                "creationTimestamp": "2025-11-29T14:00:00Z", "labels": {"app": "web", "tier": "fe"},
                "annotations": {"note": "ü \" \\"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                    "time": "2025-11-29T14:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]},
            "spec": {
                "containers": [{"name": "c", "image": "nginx", "args": ["a", "b"],
                    "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}],
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": 1024}},
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
                    "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
                "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cm", "defaultMode": 420}}],
                "priority": -5, "terminationGracePeriodSeconds": 0, "hostNetwork": false, "nodeName": null,
                "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 300}],
            },
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "lastTransitionTime": "2025-11-29T14:00:01Z"}]},
        });
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "type": "Opaque", "data": {"a": "czNjcmV0", "b": ""}, "immutable": false});
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
            "spec": {"ports": [{"port": 80, "targetPort": 8080}, {"name": "h", "port": 81, "targetPort": "http"}],
                "clusterIP": "10.0.0.10", "selector": {"app": "web"}}});
        // A message long enough that lengths take two bytes and nested ones move.
        let big = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "big", "annotations": {"x": "y".repeat(300)}},
            "data": {"k": "v".repeat(20_000)}});
        for obj in [pod, secret, svc, big] {
            let av = obj["apiVersion"].as_str().expect("apiVersion");
            let kind = obj["kind"].as_str().expect("kind");
            let list = ListEncoder::new(av, kind).expect("a message");
            let stored = serde_json::to_vec(&obj).expect("JSON");
            let item = list.item_stored(&stored, "42").expect("transcodes");
            let mut with_rv = obj.clone();
            with_rv["metadata"]["resourceVersion"] = json!("42");
            let doc = |raw: &[u8]| {
                let mut out = Vec::new();
                super::super::encode::envelope_head(av, kind, raw.len(), &mut out);
                out.extend_from_slice(raw);
                super::super::encode::envelope_tail(&mut out);
                out
            };
            let reference = list.item(&with_rv).expect("encodes");
            let ours = decode(&doc(&item)).expect("decodes");
            let theirs = decode(&doc(&reference)).expect("decodes");
            assert_eq!(ours, theirs, "{kind}");
            // prost merges the occurrences the same way.
            use k8s_pb::api::core::v1 as core;
            use prost::Message as _;
            match kind {
                "Pod" => assert_eq!(
                    core::Pod::decode(item.as_slice()).expect("prost"),
                    core::Pod::decode(reference.as_slice()).expect("prost")
                ),
                "ConfigMap" => assert_eq!(
                    core::ConfigMap::decode(item.as_slice()).expect("prost"),
                    core::ConfigMap::decode(reference.as_slice()).expect("prost")
                ),
                _ => {}
            }
            assert_eq!(
                decode(&encode(&with_rv).expect("encodes")).map(|v| v["metadata"]["resourceVersion"].clone()),
                Ok(json!("42"))
            );
        }
    }

    #[test]
    fn objects_without_a_protobuf_form_are_refused() {
        let list = ListEncoder::new("v1", "ConfigMap").expect("a message");
        for bad in [
            &br#"{"metadata":{"name":"x"},"colour":"red"}"#[..],
            br#"{"metadata":{"name":1}}"#,
            br#"{"data":{"k":1}}"#,
            br#"{"binaryData":{"k":"not base64!"}}"#,
            br#"{"metadata":{"creationTimestamp":"yesterday"}}"#,
            br#"{"metadata":{"name":"x"}"#,
            b"[]",
        ] {
            assert!(
                list.item_stored(bad, "1").is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lengths_are_moved_when_they_grow() {
        for len in [0usize, 1, 127, 128, 300, 16_383, 16_384, 70_000] {
            let mut out = vec![9u8];
            let start = open(&mut out, 3);
            out.extend(std::iter::repeat_n(7u8, len));
            close(&mut out, start);
            let mut want = vec![9u8];
            put_bytes(&mut want, 3, &vec![7u8; len]);
            assert_eq!(out, want, "{len}");
        }
    }
}
