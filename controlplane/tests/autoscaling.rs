//! The horizontal pod autoscaler through `controlplane serve` with hollow nodes and the real
//! kubectl: scaling on the CPU use the hollow nodes report through `metrics.k8s.io` (their
//! `hollow.nodeos.dev/usage` test annotation), the stabilization of a scale-down, the
//! out-of-range corrections and a missing target. The metrics-unavailable paths are table
//! tests in `controllers/podautoscaler/tests.rs`.

use std::path::Path;

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

/// A Deployment `name` of `replicas` pods requesting 100m CPU.
fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  \
         selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    \
         spec:\n      containers:\n      - name: app\n        image: busybox:1\n        resources:\n          \
         requests:\n            cpu: 100m\n"
    )
}

/// An autoscaling/v2 HPA of Deployment `target` at 50 % CPU.
fn hpa(name: &str, target: &str, min: u32, max: u32) -> String {
    format!(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: {name}\nspec:\n  \
         scaleTargetRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: {target}\n  minReplicas: {min}\n  \
         maxReplicas: {max}\n  metrics:\n  - type: Resource\n    resource:\n      name: cpu\n      target:\n        \
         type: Utilization\n        averageUtilization: 50\n"
    )
}

/// `status reason message` of the HPA's condition `type`.
fn condition(c: &TestCluster, hpa: &str, type_: &str) -> String {
    c.jsonpath(
        &["hpa", hpa],
        &format!(
            "{{range .status.conditions[?(@.type==\"{type_}\")]}}{{.status}} {{.reason}} {{.message}}{{end}}"
        ),
    )
}

fn events(c: &TestCluster, object: &str, reason: &str) -> String {
    c.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={object},reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.source.component}|{.type}|{.message}{\"\\n\"}{end}",
    ])
}

/// The pods' CPU use (as their hollow nodes report it) drives the HPA: at twice the target
/// the Deployment doubles (CTL-50), reported in the status, a condition and an event; the new
/// pods use nothing, and the scale-down waits for the 300 s stabilization window (CTL-51).
#[test]
fn the_hpa_scales_on_the_cpu_the_nodes_report() {
    let c = TestCluster::start(bin(), &[], &[("node", 2, &[])]);
    c.apply(&deployment("web", 2));
    c.wait_for(&["deploy", "web"], "{.status.readyReplicas}", |v| v == "2");
    // 100m used of 100m requested: 100 % against a 50 % target.
    c.kubectl(&[
        "annotate",
        "pods",
        "-l",
        "app=web",
        r#"hollow.nodeos.dev/usage={"cpu":"100m","memory":"16Mi"}"#,
    ]);
    c.apply(&hpa("web", "web", 1, 5));
    c.wait_for(&["deploy", "web"], "{.spec.replicas}", |v| v == "4");
    let rescaled = events(&c, "web", "SuccessfulRescale");
    assert!(
        rescaled.starts_with(
            "horizontal-pod-autoscaler|Normal|New size: 4; reason: cpu resource utilization (percentage of request) above target"
        ),
        "{rescaled}"
    );
    assert_eq!(
        condition(&c, "web", "ScalingActive"),
        "True ValidMetricFound the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)"
    );
    assert_eq!(c.jsonpath(&["hpa", "web"], "{.status.desiredReplicas}"), "4");
    // The two new pods use nothing: (200m of 400m) is 50 %, on target; then the annotated
    // pods stop too, and the lower recommendation waits for the stabilization window.
    c.wait_for(&["deploy", "web"], "{.status.readyReplicas}", |v| v == "4");
    c.kubectl(&["annotate", "pods", "-l", "app=web", "hollow.nodeos.dev/usage-"]);
    let held = c.wait_for(
        &["hpa", "web"],
        "{range .status.conditions[?(@.type==\"AbleToScale\")]}{.reason}{end}",
        |v| v == "ScaleDownStabilized",
    );
    assert_eq!(held, "ScaleDownStabilized");
    assert_eq!(c.jsonpath(&["deploy", "web"], "{.spec.replicas}"), "4");
    assert_eq!(
        c.kubectl(&["get", "hpa", "web", "--no-headers"])
            .split_whitespace()
            .take(6)
            .collect::<Vec<_>>(),
        ["web", "Deployment/web", "cpu:", "0%/50%", "1", "5"]
    );
}

#[test]
fn out_of_range_targets_are_scaled_to_the_bounds_and_missing_ones_reported() {
    let c = TestCluster::start(bin(), &[], &[("node", 2, &[])]);
    c.apply(&deployment("big", 7));
    c.apply(&hpa("big", "big", 1, 4));
    c.wait_for(&["deploy", "big"], "{.spec.replicas}", |v| v == "4");
    let rescaled = c.wait_for(
        &["hpa", "big"],
        "{.status.currentReplicas} {.status.desiredReplicas} {.status.lastScaleTime}",
        |v| v.starts_with("7 4 ") || v.starts_with("4 4 "),
    );
    assert!(rescaled.len() > "7 4 ".len(), "lastScaleTime set: {rescaled}");
    assert_eq!(
        events(&c, "big", "SuccessfulRescale"),
        "horizontal-pod-autoscaler|Normal|New size: 4; reason: Current number of replicas above Spec.MaxReplicas\n"
    );
    // A target that does not exist.
    c.apply(&hpa("ghost", "ghost", 1, 4));
    let able = c.wait_for(
        &["hpa", "ghost"],
        "{range .status.conditions[?(@.type==\"AbleToScale\")]}{.status} {.reason} {.message}{end}",
        |v| v.starts_with("False"),
    );
    assert_eq!(
        able,
        "False FailedGetScale the HPA controller was unable to get the target's current scale: deployments.apps \"ghost\" not found"
    );
    assert!(
        events(&c, "ghost", "FailedGetScale").contains("deployments.apps \"ghost\" not found"),
        "event"
    );
}
