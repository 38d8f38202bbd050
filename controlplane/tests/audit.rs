//! The audit log (issue 13, item 6) through `controlplane serve --audit-policy-file` and the
//! real kubectl: what the policy says is recorded at its level, secrets' data never at
//! Metadata, and what it leaves out is not recorded.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources:
  - group: \"\"
    resources: [secrets]
- level: RequestResponse
  verbs: [create]
  resources:
  - group: \"\"
    resources: [configmaps]
- level: None
";

/// The events of the log whose objectRef names `resource`/`name` (waiting up to 10 s for them).
fn events(log: &Path, resource: &str, name: &str, want: usize) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("a JSON event per line"))
            .filter(|e| e["objectRef"]["resource"] == resource && e["objectRef"]["name"] == name)
            .collect();
        if found.len() >= want || t0.elapsed() > Duration::from_secs(10) {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A control plane auditing with `policy`, its log's path, and the directory holding both.
fn audited(policy: &str) -> (TestCluster, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy).expect("policy");
    let log = dir.path().join("audit.log");
    let (p, l) = (policy_file.display().to_string(), log.display().to_string());
    let c = TestCluster::start(
        bin(),
        &[
            "--no-scheduler",
            "--no-controllers",
            "--audit-policy-file",
            &p,
            "--audit-log-path",
            &l,
        ],
        &[],
    );
    (c, log, dir)
}

#[test]
fn the_policy_decides_what_is_recorded() {
    let (c, log, _dir) = audited(POLICY);
    c.kubectl(&["create", "secret", "generic", "s", "--from-literal=k=topsecret"]);
    c.kubectl(&["get", "secret", "s"]);
    c.kubectl(&["create", "configmap", "cm", "--from-literal=colour=blue"]);
    c.kubectl(&["get", "pods"]);

    let secret = events(&log, "secrets", "s", 2);
    assert_eq!(secret.len(), 2, "{secret:?}");
    let verbs: Vec<&str> = secret.iter().filter_map(|e| e["verb"].as_str()).collect();
    assert_eq!(verbs, ["create", "get"]);
    for e in &secret {
        assert_eq!(e["kind"], "Event");
        assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(e["level"], "Metadata");
        assert_eq!(e["stage"], "ResponseComplete");
        assert_eq!(e["objectRef"]["namespace"], "default");
        assert_eq!(e["sourceIPs"][0], "127.0.0.1");
        assert!(
            e["user"]["groups"]
                .as_array()
                .is_some_and(|g| g.iter().any(|g| g == "system:masters")),
            "{e}"
        );
        assert!(
            e.get("requestObject").is_none() && e.get("responseObject").is_none(),
            "{e}"
        );
    }
    assert_eq!(secret[0]["responseStatus"]["code"], 201);
    assert_eq!(secret[1]["responseStatus"]["code"], 200);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        !text.contains("topsecret") && !text.contains("dG9wc2VjcmV0"),
        "secret data in the log"
    );

    let cm = events(&log, "configmaps", "cm", 1);
    let created: Vec<&Value> = cm.iter().filter(|e| e["verb"] == "create").collect();
    assert_eq!(created.len(), 1, "{cm:?}");
    let e = created[0];
    assert_eq!(e["level"], "RequestResponse");
    assert_eq!(e["requestObject"]["data"]["colour"], "blue", "{e}");
    assert_eq!(e["responseObject"]["metadata"]["name"], "cm", "{e}");
    assert!(!text.contains("\"resource\":\"pods\""), "pods are not audited");
}

/// Without `omitStages`, a request is recorded twice under one auditID: `RequestReceived`
/// (no response status yet), then `ResponseComplete`; a rule's `omitStages` adds to the
/// policy's.
#[test]
fn request_received_comes_first_unless_omitted() {
    let (c, log, _dir) = audited(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  omitStages: [RequestReceived]\n  resources:\n  - group: \"\"\n    resources: [secrets]\n- level: Metadata\n  resources:\n  - group: \"\"\n    resources: [configmaps]\n- level: None\n",
    );
    c.kubectl(&["create", "configmap", "cm", "--from-literal=a=1"]);
    c.kubectl(&["get", "configmap", "cm"]);
    c.kubectl(&["create", "secret", "generic", "s", "--from-literal=k=v"]);
    let got = events(&log, "configmaps", "cm", 3);
    // The get names its object in the path, so both of its stages carry the name; the create's
    // name comes from the body, read after RequestReceived.
    let stages: Vec<(&str, &str)> = got
        .iter()
        .filter_map(|e| Some((e["verb"].as_str()?, e["stage"].as_str()?)))
        .collect();
    assert_eq!(
        stages,
        [
            ("create", "ResponseComplete"),
            ("get", "RequestReceived"),
            ("get", "ResponseComplete")
        ],
        "{got:?}"
    );
    assert_eq!(got[1]["auditID"], got[2]["auditID"]);
    assert!(got[1].get("responseStatus").is_none(), "{}", got[1]);
    assert_eq!(got[2]["responseStatus"]["code"], 200);
    let received = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .filter(|l| l.contains("\"stage\":\"RequestReceived\"") && l.contains("\"resource\":\"configmaps\""))
        .count();
    assert_eq!(received, 2, "create and get of the ConfigMap each arrive once");
    let secret = events(&log, "secrets", "s", 1);
    assert_eq!(secret.len(), 1, "{secret:?}");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        !text
            .lines()
            .any(|l| l.contains("\"stage\":\"RequestReceived\"") && l.contains("\"resource\":\"secrets\"")),
        "the secrets rule omits RequestReceived"
    );
}
