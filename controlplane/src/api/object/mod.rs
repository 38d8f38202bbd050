//! Object helpers shared by every layer of the API: names, UIDs, timestamps, name rules, base64,
//! label and field selectors ([`selector`], decoding only what they read: `sparse`) and the
//! stored form of objects (`stored`). Nothing here knows the verbs or the request handling.

pub mod selector;
pub(crate) mod sparse;
pub(crate) mod stored;

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::Value;

pub use kcore::time::{parse_rfc3339, rfc3339};

/// The containers of a pod spec (JSON) in the lists named `lists`, to default in place. A list
/// the spec lacks is skipped, not created: indexing a missing key (`spec[list]`) inserts `null`.
pub(crate) fn containers_mut<'a>(
    spec: &'a mut Value,
    lists: &'a [&str],
) -> impl Iterator<Item = &'a mut Value> {
    spec.as_object_mut()
        .into_iter()
        .flat_map(|m| m.iter_mut())
        .filter(move |(k, _)| lists.contains(&k.as_str()))
        .filter_map(|(_, v)| v.as_array_mut())
        .flatten()
}

/// `metadata.name` of an object ("" when it has none).
pub(crate) fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// Standard base64 of bytes.
pub(crate) fn b64_bytes(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Standard base64 of a string.
pub(crate) fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The string a standard base64 text encodes (None if it is not base64 of UTF-8).
pub(crate) fn unb64(s: &str) -> Option<String> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

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

/// DNS-1123 subdomain (upstream's `IsDNS1123Subdomain`): at most 253 characters; dot-separated
/// labels of [a-z0-9-], each starting and ending alphanumeric. The first of upstream's messages.
pub fn dns1123_subdomain_error(name: &str) -> Option<String> {
    if name.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    let label = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    };
    (!name.split('.').all(label)).then(|| {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string()
    })
}

/// A path segment name (upstream's `IsValidPathSegmentName`, the rule for RBAC objects such
/// as `system:coredns`): not `.` or `..`, no `/` or `%`.
pub fn path_segment_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("name or generateName is required".into());
    }
    if name == "." || name == ".." {
        return Some(format!("may not be '{name}'"));
    }
    ["/", "%"]
        .into_iter()
        .find(|bad| name.contains(bad))
        .map(|bad| format!("may not contain '{bad}'"))
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

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in ["a..b", "a.-b", "a-.b", ".a", "a.", ""] {
            assert!(dns1123_subdomain_error(bad).is_some(), "{bad}");
        }
        let long = format!("{}.example", "a".repeat(250));
        assert_eq!(
            dns1123_subdomain_error(&long).as_deref(),
            Some("must be no more than 253 characters")
        );
        assert!(dns1123_label_error("a.b").is_some());
        assert!(dns1123_label_error(&"a".repeat(64)).is_some());
        assert!(path_segment_error("system:coredns").is_none());
        assert_eq!(path_segment_error("a/b").as_deref(), Some("may not contain '/'"));
        assert_eq!(path_segment_error("..").as_deref(), Some("may not be '..'"));
    }
}
