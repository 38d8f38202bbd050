//! The resource metrics API (`metrics.k8s.io/v1beta1`) through `controlplane serve` with hollow
//! nodes and the real kubectl: hollow nodes report the usage annotated on their pods, the API
//! server scrapes their Summary API, and `kubectl top` prints it; the JSON shape, 404s, RBAC and
//! discovery.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

/// A pod pinned to `node` with `containers`, label `app=<name>` and, if given, the hollow
/// usage annotation.
fn pod(name: &str, node: &str, containers: &[&str], usage: Option<&str>) -> String {
    let annotations = usage
        .map(|u| format!("  annotations:\n    hollow.nodeos.dev/usage: '{u}'\n"))
        .unwrap_or_default();
    let containers: String = containers
        .iter()
        .map(|c| format!("  - name: {c}\n    image: busybox\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: {name}\n{annotations}spec:\n  \
         nodeName: {node}\n  containers:\n{containers}"
    )
}

/// The rows of a kubectl table, split on whitespace.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .filter(|r: &Vec<String>| !r.is_empty())
        .collect()
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Runs `kubectl args` until its rows are `want` (60 s: the metrics are at most 15 s old).
fn wait_rows(c: &TestCluster, args: &[&str], want: &[Vec<String>]) -> String {
    let t0 = Instant::now();
    loop {
        let (ok, out, err) = c.kubectl_result(args, None);
        if ok && rows(&out) == want {
            return out;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "kubectl {args:?}: want {want:?}\ngot ({ok}): {out}{err}\n{}",
            c.pods_summary()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn raw(c: &TestCluster, path: &str) -> Value {
    let out = c.kubectl(&["get", "--raw", path]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"))
}

#[test]
fn kubectl_top_prints_what_hollow_nodes_report() {
    let c = TestCluster::start(bin(), &[], &[("node", 2, &[])]);
    c.apply(&pod(
        "web",
        "node-0",
        &["app", "side"],
        Some(r#"{"cpu":"250m","memory":"64Mi"}"#),
    ));
    c.apply(&pod(
        "db",
        "node-1",
        &["db"],
        Some(r#"{"cpu":"1","memory":"1Gi"}"#),
    ));
    c.apply(&pod("idle", "node-1", &["idle"], None));
    c.wait_for(&["pods"], "{range .items[*]}{.status.phase} {end}", |p| {
        p == "Running Running Running "
    });

    // Discovery: kubectl top looks for the group there.
    let resources = c.kubectl(&["api-resources", "--api-group=metrics.k8s.io", "--no-headers"]);
    assert_eq!(
        rows(&resources),
        vec![
            row(&["nodes", "metrics.k8s.io/v1beta1", "false", "NodeMetrics"]),
            row(&["pods", "metrics.k8s.io/v1beta1", "true", "PodMetrics"]),
        ]
    );

    let out = wait_rows(
        &c,
        &["top", "pod"],
        &[
            row(&["NAME", "CPU(cores)", "MEMORY(bytes)"]),
            row(&["db", "1000m", "1024Mi"]),
            row(&["idle", "0m", "0Mi"]),
            row(&["web", "500m", "128Mi"]),
        ],
    );
    println!("kubectl top pod:\n{out}");
    let out = wait_rows(
        &c,
        &["top", "pod", "web", "--containers"],
        &[
            row(&["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"]),
            row(&["web", "app", "250m", "64Mi"]),
            row(&["web", "side", "250m", "64Mi"]),
        ],
    );
    println!("kubectl top pod web --containers:\n{out}");
    // Hollow nodes have 4 CPUs and 16Gi: 500m is 12%, 1000m 25%, 1Gi 6%.
    let out = wait_rows(
        &c,
        &["top", "node"],
        &[
            row(&["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]),
            row(&["node-0", "500m", "12%", "128Mi", "0%"]),
            row(&["node-1", "1000m", "25%", "1024Mi", "6%"]),
        ],
    );
    println!("kubectl top node:\n{out}");

    // A new annotation is new usage, seen within the metrics' resolution.
    c.kubectl(&[
        "annotate",
        "pod",
        "web",
        "--overwrite",
        r#"hollow.nodeos.dev/usage={"cpu":"750m","memory":"1Gi","containers":{"side":{"cpu":"5m"}}}"#,
    ]);
    wait_rows(
        &c,
        &["top", "pod", "-l", "app=web", "--containers"],
        &[
            row(&["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"]),
            row(&["web", "app", "750m", "1024Mi"]),
            row(&["web", "side", "5m", "1024Mi"]),
        ],
    );

    // `kubectl get` prints metrics-server's table (a pod's usage summed over its containers).
    wait_rows(
        &c,
        &["get", "pods.metrics.k8s.io", "web"],
        &[
            row(&["NAME", "CPU", "MEMORY", "WINDOW"]),
            row(&["web", "755m", "2Gi", "15s"]),
        ],
    );

    // The objects in metrics-server's shape.
    let m = raw(&c, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web");
    assert_eq!(m["kind"], "PodMetrics");
    assert_eq!(m["apiVersion"], "metrics.k8s.io/v1beta1");
    assert_eq!(m["metadata"]["name"], "web");
    assert_eq!(m["metadata"]["namespace"], "default");
    assert_eq!(m["metadata"]["labels"], serde_json::json!({"app": "web"}));
    assert!(
        m["metadata"]["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert!(m["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(m["window"], "15s");
    assert_eq!(
        m["containers"],
        serde_json::json!([{"name": "app", "usage": {"cpu": "750m", "memory": "1Gi"}},
                           {"name": "side", "usage": {"cpu": "5m", "memory": "1Gi"}}])
    );
    let nodes = raw(
        &c,
        "/apis/metrics.k8s.io/v1beta1/nodes?labelSelector=kubernetes.io%2Fhostname%3Dnode-1",
    );
    assert_eq!(nodes["kind"], "NodeMetricsList");
    assert_eq!(nodes["apiVersion"], "metrics.k8s.io/v1beta1");
    let items = nodes["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{nodes}");
    assert_eq!(items[0]["kind"], "NodeMetrics");
    assert_eq!(items[0]["metadata"]["name"], "node-1");
    assert_eq!(items[0]["metadata"]["labels"]["node.nodeos.dev/hollow"], "true");
    assert_eq!(
        items[0]["usage"],
        serde_json::json!({"cpu": "1", "memory": "1Gi"})
    );
    let pods = raw(
        &c,
        "/apis/metrics.k8s.io/v1beta1/pods?fieldSelector=metadata.name%3Didle",
    );
    assert_eq!(pods["kind"], "PodMetricsList");
    assert_eq!(
        pods["items"][0]["containers"],
        serde_json::json!([{"name": "idle", "usage": {"cpu": "0", "memory": "0"}}])
    );
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(1));

    // 404s: a pod that does not exist, and one that exists without metrics (not running).
    let (ok, _, err) = c.kubectl_result(
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope",
        ],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains(r#"Error from server (NotFound): pods "nope" not found"#),
        "{err}"
    );
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pending\nspec:\n  nodeSelector:\n    nowhere: \"true\"\n  \
         containers:\n  - name: c\n    image: busybox\n",
    );
    let (ok, _, err) = c.kubectl_result(
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/pending",
        ],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains(
            r#"Error from server (NotFound): podmetrics.metrics.k8s.io "default/pending" not found"#
        ),
        "{err}"
    );
    let (ok, _, err) = c.kubectl_result(
        &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes/node-9"],
        None,
    );
    assert!(!ok);
    assert!(err.contains(r#"nodes "node-9" not found"#), "{err}");

    // Authorization: a user without a role is refused; `view` includes metrics through
    // aggregation (system:aggregated-metrics-reader).
    let (ok, _, err) = c.kubectl_result(&["top", "pod", "--as=jane"], None);
    assert!(!ok);
    assert!(
        err.contains(r#"pods.metrics.k8s.io is forbidden: User "jane" cannot list resource "pods" in API group "metrics.k8s.io" in the namespace "default""#),
        "{err}"
    );
    c.kubectl(&[
        "create",
        "rolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ]);
    wait_rows(
        &c,
        &["top", "pod", "db", "--as=jane"],
        &[
            row(&["NAME", "CPU(cores)", "MEMORY(bytes)"]),
            row(&["db", "1000m", "1024Mi"]),
        ],
    );
    let (ok, _, err) = c.kubectl_result(&["top", "node", "--as=jane"], None);
    assert!(!ok, "a namespace's view role does not reach node metrics");
    assert!(err.contains("forbidden"), "{err}");
}
