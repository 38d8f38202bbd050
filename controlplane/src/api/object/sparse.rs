//! Decoding only some fields of a JSON object: what a selector reads of a stored object
//! (`metadata.labels`, `spec.nodeName`, ...), without building a `Value` of the rest. The other
//! fields are still parsed, as serde's `IgnoredAny`, but nothing of them is allocated.

use std::fmt;

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A set of dotted field paths as a tree: a node without children takes the whole value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Paths {
    children: Vec<(String, Paths)>,
    /// A path ends here (its children, if any, were cleared).
    whole: bool,
}

impl Paths {
    /// The tree of `paths` (`metadata.labels`, `spec.nodeName`). A path that is a prefix of
    /// another takes its whole value.
    pub(crate) fn new<'a>(paths: impl IntoIterator<Item = &'a str>) -> Self {
        let mut root = Paths::default();
        for path in paths {
            let mut node = &mut root;
            let mut parts = path.split('.').peekable();
            while let Some(part) = parts.next() {
                let i = match node.children.iter().position(|(k, _)| k == part) {
                    Some(i) => i,
                    None => {
                        node.children.push((part.to_string(), Paths::default()));
                        node.children.len() - 1
                    }
                };
                let (_, child) = &mut node.children[i];
                if parts.peek().is_none() {
                    // The whole value from here on.
                    child.children.clear();
                    child.whole = true;
                    break;
                }
                if child.whole {
                    break;
                }
                node = child;
            }
        }
        root
    }

    /// Decodes the fields of `json` (an object) on these paths; everything else is skipped.
    pub(crate) fn decode(&self, json: &[u8]) -> serde_json::Result<Value> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let v = Node(self).deserialize(&mut de)?;
        de.end()?;
        Ok(v)
    }
}

/// A node of the tree as a deserializer seed.
#[derive(Clone, Copy)]
struct Node<'p>(&'p Paths);

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0.children.is_empty() {
            return Value::deserialize(d);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(child) = map.next_key_seed(Key(self.0))? {
            match child {
                Some(i) => {
                    let (name, paths) = &self.0.children[i];
                    let v = map.next_value_seed(Node(paths))?;
                    out.insert(name.clone(), v);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }

    /// A list where the paths expect an object: nothing on the paths is in it.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// An object key, matched against a node's children without allocating: the child's index, or
/// None for a key off the paths.
struct Key<'p>(&'p Paths);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.children.iter().position(|(k, _)| k == v))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_the_paths_are_decoded() {
        let pod = json!({
            "metadata": {"name": "p", "labels": {"app": "web", "tier": "fe"}, "annotations": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}], "hostNetwork": true},
            "status": [1, 2],
        });
        let bytes = serde_json::to_vec(&pod).expect("encode");
        let paths = Paths::new([
            "metadata.labels",
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.hostNetwork",
            "status.phase",
        ]);
        assert_eq!(
            paths.decode(&bytes).expect("decodes"),
            json!({
                "metadata": {"name": "p", "labels": {"app": "web", "tier": "fe"}},
                "spec": {"nodeName": "n1", "hostNetwork": true},
                "status": null,
            })
        );
        // A prefix takes the whole value, whichever comes first.
        for order in [["spec", "spec.nodeName"], ["spec.nodeName", "spec"]] {
            let v = Paths::new(order).decode(&bytes).expect("decodes");
            assert_eq!(v, json!({"spec": pod["spec"]}));
        }
        assert!(Paths::new(["a"]).decode(b"{\"a\":1} x").is_err());
        assert!(Paths::new(["a"]).decode(b"{\"a\":").is_err());
    }
}
