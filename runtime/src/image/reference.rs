//! Image references, normalised as Kubernetes does (docs/SEEDS-SPEC.md NODE-56): no registry means the
//! Docker public registry, a one-part name there gets `library/`, no tag means `latest`, and a
//! reference with both a tag and a digest is pulled by the digest.

use std::fmt;

/// The registry used when a reference names none.
pub const DEFAULT_REGISTRY: &str = "docker.io";
/// Where `docker.io` is actually served.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

/// Why a reference does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReferenceError {
    #[error("image reference is empty")]
    Empty,
    #[error("invalid image reference {reference:?}: {reason}")]
    Invalid { reference: String, reason: String },
}

fn invalid(reference: &str, reason: impl Into<String>) -> ReferenceError {
    ReferenceError::Invalid {
        reference: reference.into(),
        reason: reason.into(),
    }
}

/// `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`
fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// `algorithm:hex`; only sha256 is accepted for pulls (what registries serve).
pub fn valid_digest(d: &str) -> bool {
    match d.split_once(':') {
        Some(("sha256", hex)) => {
            hex.len() == 64 && hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        }
        _ => false,
    }
}

/// One path component: lower-case alphanumerics separated by `.`, `_`, `__` or runs of `-`.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_lowercase() && !b[0].is_ascii_digit() {
        return false;
    }
    if !b[b.len() - 1].is_ascii_lowercase() && !b[b.len() - 1].is_ascii_digit() {
        return false;
    }
    b.iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-'))
        && !c.contains("..")
        && !c.contains("___")
}

impl Reference {
    /// Parses and normalises `name[:tag][@digest]` with an optional `host[:port]/` prefix.
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if s.len() > 4096 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(s, "contains whitespace or is too long"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                if !valid_digest(d) {
                    return Err(invalid(s, format!("digest {d:?} is not sha256:<64 hex digits>")));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        // A tag is after the last ':' that follows the last '/'.
        let slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(i) if slash.is_none_or(|sl| i > sl) => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag
            && !valid_tag(t)
        {
            return Err(invalid(
                s,
                format!("tag {t:?} does not match [a-zA-Z0-9_][a-zA-Z0-9._-]{{0,127}}"),
            ));
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if first.contains('.') || first.contains(':') || first == "localhost" => {
                (first.to_string(), path.to_string())
            }
            _ => (DEFAULT_REGISTRY.to_string(), name.to_string()),
        };
        let repository = if registry == DEFAULT_REGISTRY && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        if repository.split('/').any(|c| !valid_component(c)) {
            return Err(invalid(
                s,
                "repository must be lower-case alphanumerics separated by '/', '.', '_' or '-'",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry: registry.to_ascii_lowercase(),
            repository,
            tag,
            digest,
        })
    }

    /// What the registry is asked for: the digest when there is one (tag + digest pulls the digest).
    pub fn manifest_ref(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }

    /// `host[:port]` the distribution API is served from.
    pub fn api_host(&self) -> &str {
        if self.registry == DEFAULT_REGISTRY {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        Reference::parse(s)
            .map(|r| r.to_string())
            .unwrap_or_else(|e| format!("ERR {e}"))
    }

    #[test]
    fn normalises_like_kubernetes() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.32.0"), "docker.io/library/busybox:1.32.0");
        assert_eq!(norm("bitnami/redis"), "docker.io/bitnami/redis:latest");
        assert_eq!(norm("registry.k8s.io/pause:3.10"), "registry.k8s.io/pause:3.10");
        assert_eq!(norm("localhost:5000/a/b"), "localhost:5000/a/b:latest");
        assert_eq!(norm("10.0.2.100:5000/busybox:1"), "10.0.2.100:5000/busybox:1");
        let d = "sha256:1ff6c18fbef2045af6b9c16bf034cc421a29027b800e4f9b68ae9b1cb3e9ae07";
        let r = Reference::parse(&format!("busybox:1.37@{d}")).expect("parses");
        assert_eq!(r.manifest_ref(), d, "tag + digest pulls the digest");
        let r = Reference::parse(&format!("busybox@{d}")).expect("parses");
        assert_eq!(r.tag, None);
        assert_eq!(r.to_string(), format!("docker.io/library/busybox@{d}"));
        assert_eq!(r.api_host(), DOCKER_HUB_API);
    }

    #[test]
    fn rejects_bad_references() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            &format!("busybox:{}", "a".repeat(129)),
            "busybox@sha256:abc",
            "busybox@md5:0123",
            "a//b",
            "bad name",
            "a/../b",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(Reference::parse(&format!("busybox:{}", "a".repeat(128))).is_ok());
    }
}
