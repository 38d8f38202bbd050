//! Object helpers shared by the handlers: timestamps, UIDs, name rules, label and field selectors.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

pub use kcore::time::{parse_rfc3339, rfc3339};

/// kubectl's short age: `45s`, `3m`, `2h`, `5d`.
pub fn age(created: &str, now: SystemTime) -> String {
    let Some(t) = parse_rfc3339(created) else {
        return "<unknown>".into();
    };
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let s = (now - t).max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7_199 => format!("{}m", s / 60),
        7_200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A random (version 4) UUID.
pub fn new_uid() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // Extremely unlikely; fall back to time and a counter so UIDs stay unique in this process.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b[..8].copy_from_slice(&(t as u64).to_le_bytes());
        b[8..].copy_from_slice(&N.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Five random characters from Kubernetes' generateName alphabet (no vowels, no ambiguous chars).
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    let _ = getrandom::fill(&mut b);
    b.iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect()
}

/// DNS-1123 subdomain: at most 253 chars of [a-z0-9-.], starting and ending alphanumeric.
pub fn dns1123_subdomain_error(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    (!ok).then(|| {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string()
    })
}

/// DNS-1123 label: at most 63 chars of [a-z0-9-], starting and ending alphanumeric.
pub fn dns1123_label_error(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    (!ok).then(|| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_string()
    })
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
pub fn parse_label_selector(s: &str) -> Result<Vec<Requirement>, String> {
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
        let set = |rest: &str| -> Result<Vec<String>, String> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or(format!("invalid selector {p:?}"))?;
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
            return Err(format!("unable to parse requirement: {p:?}"));
        };
        out.push(req);
    }
    Ok(out)
}

/// Whether `labels` (a JSON object or null) satisfies every requirement.
pub fn labels_match(reqs: &[Requirement], labels: Option<&Value>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
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
pub fn parse_field_selector(s: &str) -> Result<Vec<FieldTerm>, String> {
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((k, v)) = p.split_once("!=") {
            out.push((k.trim().into(), v.trim().into(), false));
        } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
            out.push((k.trim().into(), v.trim().into(), true));
        } else {
            return Err(format!("invalid selector: '{s}'; can't understand '{p}'"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ages() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        assert_eq!(age(&rfc3339(t), t + std::time::Duration::from_secs(300)), "5m");
        assert_eq!(
            age(&rfc3339(t), t + std::time::Duration::from_secs(3 * 86_400)),
            "3d"
        );
    }

    #[test]
    fn uids_are_v4_and_unique() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn names() {
        assert!(dns1123_subdomain_error("web-1.example").is_none());
        assert!(dns1123_subdomain_error("Web").is_some());
        assert!(dns1123_label_error("a.b").is_some());
        assert!(dns1123_label_error(&"a".repeat(64)).is_some());
    }

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
    fn field_selectors() {
        let pod =
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let t = parse_field_selector("spec.nodeName=n1,status.phase!=Pending").expect("parse");
        assert_eq!(t.len(), 2);
        assert_eq!(field_value(&pod, "spec.nodeName"), "n1");
        assert_eq!(field_value(&pod, "spec.missing"), "");
    }
}
