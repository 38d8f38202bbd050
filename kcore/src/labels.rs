//! Label and node selectors over typed objects: `metav1.LabelSelector` (matchLabels and
//! matchExpressions In/NotIn/Exists/DoesNotExist), node selector terms (plus Gt/Lt and
//! `matchFields` on `metadata.name`), a pod's `nodeSelector` and required node affinity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels of an object (empty when it has none).
pub type Labels = BTreeMap<String, String>;

static NO_LABELS: Labels = BTreeMap::new();

/// The labels of an object's metadata (an empty map when absent).
pub fn labels_of(labels: &Option<Labels>) -> &Labels {
    labels.as_ref().unwrap_or(&NO_LABELS)
}

/// Whether `sel` selects `labels`. An empty selector selects everything; an unknown operator
/// selects nothing (the API validates operators, so this is only defence).
pub fn selector_matches(sel: &LabelSelector, labels: &Labels) -> bool {
    if let Some(ml) = &sel.match_labels
        && !ml.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    })
}

/// Whether an optional selector selects `labels`: a missing selector selects nothing (the rule
/// of pod affinity terms and topology spread constraints).
pub fn optional_selector_matches(sel: Option<&LabelSelector>, labels: &Labels) -> bool {
    sel.is_some_and(|s| selector_matches(s, labels))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => match (value.and_then(int), values.first().and_then(|x| int(x))) {
            (Some(v), Some(x)) => v > x,
            _ => false,
        },
        "Lt" => match (value.and_then(int), values.first().and_then(|x| int(x))) {
            (Some(v), Some(x)) => v < x,
            _ => false,
        },
        _ => false,
    }
}

/// What node selection reads of a node: its name (`matchFields` on `metadata.name`) and its
/// labels. A cache that keeps only these can match without holding the whole `Node`.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub name: Option<&'a str>,
    pub labels: &'a Labels,
}

impl<'a> From<&'a Node> for NodeView<'a> {
    fn from(node: &'a Node) -> Self {
        Self {
            name: node.metadata.name.as_deref(),
            labels: labels_of(&node.metadata.labels),
        }
    }
}

/// Whether a node selector term selects `node`: every requirement holds. A term with no
/// requirements selects nothing.
pub fn node_selector_term_matches<'a>(term: &NodeSelectorTerm, node: impl Into<NodeView<'a>>) -> bool {
    let node = node.into();
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node.name).flatten();
            requirement_matches(r, value)
        })
}

/// Whether `node` satisfies the pod's `nodeSelector` and its required node affinity (terms are
/// ORed; an empty term list selects nothing).
pub fn node_matches_pod<'a>(spec: &PodSpec, node: impl Into<NodeView<'a>>) -> bool {
    let node = node.into();
    let labels = node.labels;
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref());
    match required {
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| node_selector_term_matches(t, node)),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n1", "labels": labels}})).expect("node")
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).expect("spec")
    }

    #[test]
    fn label_selectors() {
        let labels: Labels = [("app", "web"), ("tier", "fe")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).expect("sel") };
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["fe"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}),
                false,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(selector_matches(&sel(s.clone()), &labels), want, "{s}");
        }
        assert!(!optional_selector_matches(None, &labels));
    }

    #[test]
    fn node_affinity_and_selector() {
        let n = node(json!({"disk": "ssd", "cores": "8"}));
        let cases = [
            (json!({}), true),
            (json!({"nodeSelector": {"disk": "ssd"}}), true),
            (json!({"nodeSelector": {"disk": "hdd"}}), false),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}]}}}}),
                true,
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]},
                                       {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
                true,
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{}]}}}}),
                false,
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": []}}}}),
                false,
            ),
        ];
        for (mut s, want) in cases {
            s["containers"] = json!([]);
            assert_eq!(node_matches_pod(&spec(s.clone()), &n), want, "{s}");
        }
    }
}
