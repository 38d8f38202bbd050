//! Audit logging (kube-apiserver's `--audit-policy-file` and log backend): a policy
//! (`audit.k8s.io/v1` Policy, YAML or JSON) picks a level per request, the first matching rule
//! winning and no match meaning `None`; each audited request becomes one `audit.k8s.io/v1` Event
//! as a JSON line, with the request body at `Request` and the response body too at
//! `RequestResponse`. The file rotates at `--audit-log-maxsize` MB, keeping
//! `--audit-log-maxbackup` old files named `<path>-<UTC time>`.
//!
//! Stages: `RequestReceived` as soon as the request is authenticated (no response status, no
//! objects yet), then `ResponseComplete`, or `ResponseStarted` for watches and other
//! long-running requests (logs, exec), whose end is not recorded. A policy's or rule's
//! `omitStages` drops those stages. Events are written by one thread behind a bounded queue;
//! a request waits for room rather than going unaudited.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::authz::RequestInfo;

/// Why the audit log cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("audit policy {path}: {source}")]
    Policy {
        path: PathBuf,
        #[source]
        source: PolicyError,
    },
}

/// Why a policy file's text is not a policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("want kind Policy in audit.k8s.io/v1")]
    NotAPolicy,
    #[error("{0}")]
    Shape(#[from] serde_json::Error),
}

/// How much of a request is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

/// A resource selector of a rule.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
}

/// One policy rule (an empty list matches everything).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub level: Level,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub user_groups: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub resources: Vec<GroupResources>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
    #[serde(default)]
    pub omit_stages: Vec<String>,
}

/// An `audit.k8s.io/v1` Policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub omit_stages: Vec<String>,
}

impl Policy {
    /// Parses a policy file's text (YAML, which includes JSON).
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let v: Value = serde_yaml::from_str(text)?;
        if v["kind"] != "Policy"
            || !v["apiVersion"]
                .as_str()
                .is_some_and(|a| a.starts_with("audit.k8s.io/"))
        {
            return Err(PolicyError::NotAPolicy);
        }
        Ok(serde_json::from_value(v)?)
    }

    /// The level and omitted stages for a request (upstream's `policyRuleEvaluator`).
    pub(crate) fn decide(&self, user: &str, groups: &[String], info: &RequestInfo) -> (Level, Vec<String>) {
        for r in &self.rules {
            if rule_matches(r, user, groups, info) {
                let mut omit = self.omit_stages.clone();
                omit.extend(r.omit_stages.iter().cloned());
                return (r.level, omit);
            }
        }
        (Level::None, Vec::new())
    }
}

fn rule_matches(r: &Rule, user: &str, groups: &[String], info: &RequestInfo) -> bool {
    if !r.users.is_empty() && !r.users.iter().any(|u| u == user) {
        return false;
    }
    if !r.user_groups.is_empty() && !r.user_groups.iter().any(|g| groups.contains(g)) {
        return false;
    }
    if !r.verbs.is_empty() && !r.verbs.contains(&info.verb) {
        return false;
    }
    if !info.resource_request {
        // Only rules without resource criteria apply; URLs match exactly or by a trailing `*`.
        if !r.resources.is_empty() || !r.namespaces.is_empty() {
            return false;
        }
        return r.non_resource_urls.is_empty()
            || r.non_resource_urls.iter().any(|u| match u.strip_suffix('*') {
                Some(prefix) => info.path.starts_with(prefix),
                None => *u == info.path,
            });
    }
    if !r.non_resource_urls.is_empty() {
        return false;
    }
    if !r.namespaces.is_empty() && !r.namespaces.contains(&info.namespace) {
        return false;
    }
    if r.resources.is_empty() {
        return true;
    }
    let full = if info.subresource.is_empty() {
        info.resource.clone()
    } else {
        format!("{}/{}", info.resource, info.subresource)
    };
    r.resources.iter().any(|gr| {
        gr.group == info.api_group
            && (gr.resources.is_empty()
                || gr.resources.iter().any(|res| {
                    *res == "*"
                        || *res == full
                        || (!info.subresource.is_empty()
                            && (*res == format!("{}/*", info.resource)
                                || *res == format!("*/{}", info.subresource)))
                }))
            && (gr.resource_names.is_empty() || gr.resource_names.contains(&info.name))
    })
}

/// The stage recorded when a request arrives.
pub(crate) const RECEIVED: &str = "RequestReceived";

/// What an audit event is made of (the request side is read before the handler runs).
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub level: Level,
    pub stage: &'static str,
    pub audit_id: String,
    pub request_uri: String,
    pub info: RequestInfo,
    pub user: String,
    pub groups: Vec<String>,
    pub impersonated: Option<String>,
    pub source_ip: String,
    pub user_agent: String,
    pub received: SystemTime,
    pub code: u16,
    pub request_body: Option<Value>,
    pub response_body: Option<Value>,
}

/// The `audit.k8s.io/v1` Event of `r` at `now`.
pub(crate) fn event(r: &Record, now: SystemTime) -> Value {
    let level = match r.level {
        Level::None => "None",
        Level::Metadata => "Metadata",
        Level::Request => "Request",
        Level::RequestResponse => "RequestResponse",
    };
    let mut e = json!({
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": level,
        "auditID": r.audit_id,
        "stage": r.stage,
        "requestURI": r.request_uri,
        "verb": r.info.verb,
        "user": {"username": r.user, "groups": r.groups},
        "sourceIPs": [r.source_ip],
        "userAgent": r.user_agent,
        "requestReceivedTimestamp": kcore::time::rfc3339_micros(r.received),
        "stageTimestamp": kcore::time::rfc3339_micros(now),
    });
    if r.stage != RECEIVED {
        e["responseStatus"] = json!({"metadata": {}, "code": r.code});
    }
    if let Some(u) = &r.impersonated {
        e["impersonatedUser"] = json!({"username": u});
    }
    if r.info.resource_request {
        let mut o = json!({"resource": r.info.resource, "apiVersion": version_of(&r.request_uri)});
        for (k, v) in [
            ("namespace", &r.info.namespace),
            ("name", &r.info.name),
            ("apiGroup", &r.info.api_group),
            ("subresource", &r.info.subresource),
        ] {
            if !v.is_empty() {
                o[k] = json!(v);
            }
        }
        e["objectRef"] = o;
    }
    if r.level >= Level::Request
        && let Some(b) = &r.request_body
    {
        e["requestObject"] = b.clone();
    }
    if r.level >= Level::RequestResponse
        && let Some(b) = &r.response_body
    {
        e["responseObject"] = b.clone();
    }
    e
}

/// The API version in a resource path (`/api/v1/...` or `/apis/<group>/<version>/...`).
fn version_of(uri: &str) -> String {
    let segs: Vec<&str> = uri.split('?').next().unwrap_or_default().split('/').collect();
    match segs.as_slice() {
        ["", "api", v, ..] => v.to_string(),
        ["", "apis", _, v, ..] => v.to_string(),
        _ => String::new(),
    }
}

/// A size-rotated JSON-lines file.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    file: std::fs::File,
    written: u64,
    max_bytes: u64,
    max_backups: usize,
}

impl RotatingFile {
    /// Opens (appends to) `path`; rotates past `max_bytes` (0: never), keeping `max_backups`.
    pub fn open(path: &Path, max_bytes: u64, max_backups: usize) -> Result<Self, AuditError> {
        let file = open_append(path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Self {
            path: path.into(),
            file,
            written,
            max_bytes,
            max_backups,
        })
    }

    /// Appends one line, rotating first when it would pass the size limit.
    pub fn write_line(&mut self, line: &[u8]) -> Result<(), AuditError> {
        if self.max_bytes > 0 && self.written > 0 && self.written + line.len() as u64 + 1 > self.max_bytes {
            self.rotate()?;
        }
        let io = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.write_all(line).map_err(io)?;
        self.file.write_all(b"\n").map_err(io)?;
        self.written += line.len() as u64 + 1;
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), AuditError> {
        let stamp = chrono::Utc::now().format("%Y-%m-%dT%H-%M-%S%.3f");
        let backup = PathBuf::from(format!("{}-{stamp}", self.path.display()));
        std::fs::rename(&self.path, &backup).map_err(|source| AuditError::Io {
            path: backup.clone(),
            source,
        })?;
        self.file = open_append(&self.path)?;
        self.written = 0;
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut backups: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{name}-")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        backups.sort();
        while backups.len() > self.max_backups {
            let old = backups.remove(0);
            let _ = std::fs::remove_file(old);
        }
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<std::fs::File, AuditError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| AuditError::Io {
            path: path.into(),
            source,
        })
}

/// The audit backend of a running API server: the policy and the writer thread's queue.
#[derive(Debug, Clone)]
pub struct Auditor {
    policy: std::sync::Arc<Policy>,
    tx: tokio::sync::mpsc::Sender<Value>,
}

impl Auditor {
    /// Loads `policy_path` and starts writing to `log_path`.
    pub fn start(
        policy_path: &Path,
        log_path: &Path,
        max_mb: u64,
        max_backups: usize,
    ) -> Result<Self, AuditError> {
        let text = std::fs::read_to_string(policy_path).map_err(|source| AuditError::Io {
            path: policy_path.into(),
            source,
        })?;
        let policy = Policy::parse(&text).map_err(|source| AuditError::Policy {
            path: policy_path.into(),
            source,
        })?;
        let mut out = RotatingFile::open(log_path, max_mb * 1024 * 1024, max_backups)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(10_000);
        std::thread::Builder::new()
            .name("audit".into())
            .spawn(move || {
                while let Some(e) = rx.blocking_recv() {
                    let line = serde_json::to_vec(&e).unwrap_or_default();
                    if let Err(err) = out.write_line(&line) {
                        tracing::error!(error = %err, "audit event not written");
                    }
                }
            })
            .map_err(|source| AuditError::Io {
                path: log_path.into(),
                source,
            })?;
        Ok(Self {
            policy: std::sync::Arc::new(policy),
            tx,
        })
    }

    /// The level and omitted stages for a request.
    pub(crate) fn decide(&self, user: &str, groups: &[String], info: &RequestInfo) -> (Level, Vec<String>) {
        self.policy.decide(user, groups, info)
    }

    /// Records `r` (unless its level is None or its stage is omitted).
    pub(crate) async fn record(&self, r: Record, omit: &[String]) {
        if r.level == Level::None || omit.iter().any(|s| s == r.stage) {
            return;
        }
        let _ = self.tx.send(event(&r, SystemTime::now())).await;
    }
}

/// A new audit ID (a random UUID v4, as upstream's).
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::request::Query;

    fn info(method: &str, path: &str) -> RequestInfo {
        let (p, q) = path.split_once('?').unwrap_or((path, ""));
        RequestInfo::of(&method.parse().expect("method"), p, &Query::parse(Some(q)))
    }

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["system:kube-proxy"]
- level: None
  nonResourceURLs: ["/healthz*", "/version"]
- level: Metadata
  resources:
  - group: ""
    resources: ["secrets", "configmaps/status"]
- level: RequestResponse
  verbs: ["create", "update", "patch"]
  resources:
  - group: ""
    resources: ["configmaps"]
  namespaces: ["team-a"]
- level: Request
  userGroups: ["system:serviceaccounts"]
  omitStages: ["ResponseStarted"]
- level: Metadata
"#;

    #[test]
    fn the_first_matching_rule_decides() {
        let p = Policy::parse(POLICY).expect("policy");
        let sa = vec!["system:serviceaccounts".to_string()];
        let cases: Vec<(&str, Vec<String>, RequestInfo, Level)> = vec![
            (
                "system:kube-proxy",
                vec![],
                info("GET", "/api/v1/secrets"),
                Level::None,
            ),
            ("alice", vec![], info("GET", "/healthz/ready"), Level::None),
            ("alice", vec![], info("GET", "/version"), Level::None),
            (
                "alice",
                vec![],
                info("GET", "/api/v1/namespaces/x/secrets/s"),
                Level::Metadata,
            ),
            (
                "alice",
                vec![],
                info("POST", "/api/v1/namespaces/x/secrets"),
                Level::Metadata,
            ),
            (
                "alice",
                vec![],
                info("PUT", "/api/v1/namespaces/x/configmaps/c/status"),
                Level::Metadata,
            ),
            (
                "alice",
                vec![],
                info("POST", "/api/v1/namespaces/team-a/configmaps"),
                Level::RequestResponse,
            ),
            (
                "alice",
                vec![],
                info("POST", "/api/v1/namespaces/team-b/configmaps"),
                Level::Metadata,
            ),
            (
                "alice",
                vec![],
                info("GET", "/api/v1/namespaces/team-a/configmaps/c"),
                Level::Metadata,
            ),
            ("bot", sa.clone(), info("GET", "/api/v1/pods"), Level::Request),
            ("bot", sa, info("GET", "/api/v1/secrets"), Level::Metadata),
            (
                "alice",
                vec![],
                info("GET", "/api/v1/namespaces/x/configmaps/c/status"),
                Level::Metadata,
            ),
            (
                "alice",
                vec![],
                info("GET", "/apis/apps/v1/deployments?watch=1"),
                Level::Metadata,
            ),
        ];
        for (user, groups, i, want) in cases {
            assert_eq!(p.decide(user, &groups, &i).0, want, "{user} {}", i.path);
        }
        let (_, omit) = p.decide(
            "bot",
            &["system:serviceaccounts".into()],
            &info("GET", "/api/v1/pods"),
        );
        assert_eq!(omit, ["RequestReceived", "ResponseStarted"]);
        let empty = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\n").expect("empty");
        assert_eq!(
            empty.decide("a", &[], &info("GET", "/api/v1/pods")).0,
            Level::None
        );
        assert!(Policy::parse("kind: Pod\n").is_err());
        assert!(Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud\n").is_err());
    }

    #[test]
    fn events_carry_what_the_level_allows() {
        let mut r = Record {
            level: Level::Metadata,
            stage: "ResponseComplete",
            audit_id: new_id(),
            request_uri: "/api/v1/namespaces/a/secrets".into(),
            info: info("POST", "/api/v1/namespaces/a/secrets"),
            user: "alice".into(),
            groups: vec!["system:authenticated".into()],
            impersonated: None,
            source_ip: "127.0.0.1".into(),
            user_agent: "kubectl/v1.32.0".into(),
            received: SystemTime::UNIX_EPOCH,
            code: 201,
            request_body: Some(json!({"data": {"k": "c2VjcmV0"}})),
            response_body: Some(json!({"kind": "Secret"})),
        };
        let e = event(&r, SystemTime::UNIX_EPOCH);
        assert_eq!(
            e["objectRef"],
            json!({"resource": "secrets", "namespace": "a", "apiVersion": "v1"})
        );
        assert_eq!(e["verb"], "create");
        assert_eq!(e["responseStatus"]["code"], 201);
        assert_eq!(e["requestReceivedTimestamp"], "1970-01-01T00:00:00.000000Z");
        assert!(e.get("requestObject").is_none() && e.get("responseObject").is_none());
        r.level = Level::Request;
        let e = event(&r, SystemTime::UNIX_EPOCH);
        assert!(e.get("requestObject").is_some() && e.get("responseObject").is_none());
        r.level = Level::RequestResponse;
        let e = event(&r, SystemTime::UNIX_EPOCH);
        assert_eq!(e["responseObject"], json!({"kind": "Secret"}));
        let id = new_id();
        assert_eq!((id.len(), id.as_bytes()[14]), (36, b'4'));
    }

    #[test]
    fn the_log_rotates_and_keeps_its_backups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let mut f = RotatingFile::open(&path, 100, 2).expect("open");
        for i in 0..10 {
            f.write_line(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(30)).as_bytes())
                .expect("write");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        let current = std::fs::read_to_string(&path).expect("log");
        assert!(current.len() <= 100 && current.ends_with("\"}\n"), "{current}");
        assert!(current.contains("\"n\":9"));
    }
}
