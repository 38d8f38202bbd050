//! The horizontal pod autoscaler through `controlplane serve` with hollow nodes and the real
//! kubectl. No resource metrics API is served here, so what can be checked end to end is the
//! part that needs no samples: the target's `/scale` read and written, the out-of-range
//! corrections, and the `ScalingActive` False report when the metrics are unavailable.
//! Scaling on CPU usage needs `metrics.k8s.io` (covered by the table tests in
//! `controllers/podautoscaler/tests.rs`).

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

#[test]
fn without_metrics_the_hpa_reports_scaling_inactive_and_keeps_the_count() {
    let c = TestCluster::start(bin(), &[], &[("node", 2, &[])]);
    c.apply(&deployment("web", 2));
    c.apply(&hpa("web", "web", 1, 5));
    let not_found = "unable to get metrics for resource cpu: unable to fetch metrics from resource metrics API: \
                     the server could not find the requested resource (get pods.metrics.k8s.io)";
    let active = c.wait_for(
        &["hpa", "web"],
        "{range .status.conditions[?(@.type==\"ScalingActive\")]}{.status} {.reason} {.message}{end}",
        |v| v.starts_with("False FailedGetResourceMetric"),
    );
    assert_eq!(
        active,
        format!(
            "False FailedGetResourceMetric the HPA was unable to compute the replica count: failed to get cpu utilization: {not_found}"
        )
    );
    assert_eq!(
        condition(&c, "web", "AbleToScale"),
        "True SucceededGetScale the HPA controller was able to get the target's current scale"
    );
    assert_eq!(
        c.jsonpath(
            &["hpa", "web"],
            "{.status.currentReplicas} {.status.desiredReplicas}"
        ),
        "2 0"
    );
    let warnings = events(&c, "web", "FailedGetResourceMetric");
    assert!(
        warnings.starts_with(&format!(
            "horizontal-pod-autoscaler|Warning|failed to get cpu utilization: {not_found}"
        )),
        "{warnings}"
    );
    let computed = events(&c, "web", "FailedComputeMetricsReplicas");
    assert!(
        computed.contains(
            "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value"
        ),
        "{computed}"
    );
    // Two more passes (15 s apart) change nothing.
    std::thread::sleep(std::time::Duration::from_secs(31));
    assert_eq!(c.jsonpath(&["deploy", "web"], "{.spec.replicas}"), "2");
    assert_eq!(events(&c, "web", "SuccessfulRescale"), "");
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
