//! Label and field selectors: parsing, matching, a workload's selector object as requirements,
//! and the compiled list/watch `Filter` with the field sets each kind can be selected by.

use serde_json::Value;

use super::sparse::Paths;
use crate::api::registry::Resource;
use crate::api::status::ApiError;

/// Why a selector string does not parse (the texts are the API's 400 messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A set requirement (`k in (a,b)`) without its parentheses.
    #[error("invalid selector {0:?}")]
    Set(String),
    /// A label requirement of no known form.
    #[error("unable to parse requirement: {0:?}")]
    Requirement(String),
    /// A field selector term without `=`, `==` or `!=`: (whole selector, term).
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Parses a label selector string (`a=b,c!=d,e in (f,g),!h,i`).
pub fn parse_label_selector(s: &str) -> Result<Vec<Requirement>, SelectorError> {
    let mut out = Vec::new();
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    for p in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let set = |rest: &str| -> Result<Vec<String>, SelectorError> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| SelectorError::Set(p.to_string()))?;
            Ok(inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect())
        };
        let req = if let Some(k) = p.strip_prefix('!') {
            Requirement::NotExists(k.trim().into())
        } else if let Some((k, v)) = p.split_once("!=") {
            Requirement::NotEq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = p.split_once("==") {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = p.split_once('=') {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, rest)) = p.split_once(" notin ") {
            Requirement::NotIn(k.trim().into(), set(rest)?)
        } else if let Some((k, rest)) = p.split_once(" in ") {
            Requirement::In(k.trim().into(), set(rest)?)
        } else if p.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
            Requirement::Exists(p.into())
        } else {
            return Err(SelectorError::Requirement(p.to_string()));
        };
        out.push(req);
    }
    Ok(out)
}

/// Whether `labels` (a JSON object or null) satisfies every requirement.
pub fn labels_match(reqs: &[Requirement], labels: Option<&Value>) -> bool {
    matches_with(reqs, |k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
}

/// Whether the labels `get` reads satisfy every requirement.
pub fn matches_with<'a>(reqs: &[Requirement], get: impl Fn(&str) -> Option<&'a str>) -> bool {
    reqs.iter().all(|r| match r {
        Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
        Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
        Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::NotExists(k) => get(k).is_none(),
    })
}

/// A parsed field selector term: (field, wanted value, equal?).
pub type FieldTerm = (String, String, bool);

/// Parses `a=b,c!=d` field selectors.
pub fn parse_field_selector(s: &str) -> Result<Vec<FieldTerm>, SelectorError> {
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((k, v)) = p.split_once("!=") {
            out.push((k.trim().into(), v.trim().into(), false));
        } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
            out.push((k.trim().into(), v.trim().into(), true));
        } else {
            return Err(SelectorError::Field(s.to_string(), p.to_string()));
        }
    }
    Ok(out)
}

/// The value of a field-selector path in an object (`metadata.name`, `spec.nodeName`, ...).
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for part in path.split('.') {
        match v.get(part) {
            Some(x) => v = x,
            None => return String::new(),
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// The label selector of a workload (`matchLabels` and `matchExpressions`) as requirements.
pub(crate) fn selector_requirements(sel: &Value) -> Vec<Requirement> {
    let mut reqs = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        for (k, v) in m {
            reqs.push(Requirement::Eq(
                k.clone(),
                v.as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default().to_string();
        let values: Vec<String> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        reqs.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => Requirement::In(key, values),
            "NotIn" => Requirement::NotIn(key, values),
            "Exists" => Requirement::Exists(key),
            _ => Requirement::NotExists(key),
        });
    }
    reqs
}

/// Fields each kind can be selected by, besides metadata.name and metadata.namespace.
fn selectable_fields(res: &Resource) -> &'static [&'static str] {
    match (res.group, res.plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "secrets") => &["type"],
        ("apps", "replicasets") => &["status.replicas"],
        ("batch", "jobs") => &["status.successful"],
        ("certificates.k8s.io", "certificatesigningrequests") => &["spec.signerName"],
        _ => &[],
    }
}

/// A compiled list/watch filter.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    labels: Vec<Requirement>,
    fields: Vec<FieldTerm>,
    /// The fields the filter reads (for decoding stored objects sparsely).
    reads: Paths,
}

impl Filter {
    /// The filter of a `labelSelector` and a `fieldSelector` (empty: everything) on `res`.
    pub(crate) fn new(res: &Resource, label_selector: &str, field_selector: &str) -> Result<Self, ApiError> {
        let bad = |e: SelectorError| ApiError::bad_request(e.to_string());
        let labels = parse_label_selector(label_selector).map_err(bad)?;
        let fields = parse_field_selector(field_selector).map_err(bad)?;
        let extra = selectable_fields(res);
        for (f, _, _) in &fields {
            if f != "metadata.name" && f != "metadata.namespace" && !extra.contains(&f.as_str()) {
                let mut known = vec![
                    "\"metadata.name\"".to_string(),
                    "\"metadata.namespace\"".to_string(),
                ];
                known.extend(extra.iter().map(|e| format!("\"{e}\"")));
                return Err(ApiError::bad_request(format!(
                    "\"{f}\" is not a known field selector: only {}",
                    known.join(", ")
                )));
            }
        }
        let mut reads: Vec<&str> = Vec::new();
        if !labels.is_empty() {
            reads.push("metadata.labels");
        }
        reads.extend(fields.iter().map(|(f, _, _)| f.as_str()));
        let reads = Paths::new(reads);
        Ok(Self {
            labels,
            fields,
            reads,
        })
    }

    /// Whether the filter selects everything.
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// [`Self::matches`] on an object's JSON, decoding only the fields the filter reads.
    pub(crate) fn matches_json(&self, json: &[u8]) -> serde_json::Result<bool> {
        if self.is_empty() {
            return Ok(true);
        }
        Ok(self.matches(&self.reads.decode(json)?))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        labels_match(&self.labels, obj["metadata"].get("labels"))
            && self.fields.iter().all(|(f, want, eq)| {
                let got = field_value(obj, f);
                let got = if got.is_empty() && f == "spec.unschedulable" {
                    "false".to_string()
                } else {
                    got
                };
                (got == *want) == *eq
            })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors() {
        let l = json!({"app": "web", "tier": "fe"});
        let m = |s: &str| labels_match(&parse_label_selector(s).expect("parse"), Some(&l));
        assert!(m("app=web"));
        assert!(m("app==web,tier!=be"));
        assert!(m("app in (web,api),!missing"));
        assert!(m("tier notin (be)"));
        assert!(m("tier"));
        assert!(!m("app=api"));
        assert!(!m("missing"));
        assert!(parse_label_selector("a b c").is_err());
    }

    #[test]
    fn stored_objects_match_as_decoded_ones() {
        let pods = crate::api::registry::find("", "v1", "pods").expect("pods");
        let objects = [
            json!({"metadata": {"name": "a", "namespace": "x", "labels": {"app": "web"}},
                   "spec": {"nodeName": "n1", "hostNetwork": true}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "b", "namespace": "y"}, "spec": {"containers": []}}),
            json!({"metadata": {"name": "c", "labels": {"app": "db", "tier": "be"}}, "spec": [], "status": null}),
        ];
        for (labels, fields) in [
            ("", ""),
            ("app=web", ""),
            ("app", "spec.nodeName="),
            ("!tier", "metadata.namespace!=x"),
            ("", "spec.hostNetwork=true,status.phase=Running"),
            ("app in (db,web),tier notin (fe)", "metadata.name!=a"),
        ] {
            let f = Filter::new(pods, labels, fields).expect("filter");
            for o in &objects {
                let json = serde_json::to_vec(o).expect("encode");
                assert_eq!(
                    f.matches_json(&json).expect("decodes"),
                    f.matches(o),
                    "{labels:?} {fields:?} on {o}"
                );
            }
        }
    }

    #[test]
    fn field_selectors() {
        let pod =
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let t = parse_field_selector("spec.nodeName=n1,status.phase!=Pending").expect("parse");
        assert_eq!(t.len(), 2);
        assert_eq!(field_value(&pod, "spec.nodeName"), "n1");
        assert_eq!(field_value(&pod, "spec.missing"), "");
    }
}
