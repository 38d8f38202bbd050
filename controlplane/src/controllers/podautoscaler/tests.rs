//! Table tests of the autoscaler's decisions (docs/SEEDS-SPEC.md CTL-49..CTL-52): the replica
//! calculator, the stabilization windows and scaling policies, and whole passes with their
//! conditions and events.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscaler, HorizontalPodAutoscalerBehavior};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::behavior::{History, Normalized, Recommendation, ScaleEvent, normalize};
use super::calculator::{
    CalcError, PodMetric, PodMetrics, Timing, Tolerances, plain_replicas, resource_replicas,
};
use super::metrics::{PodMetricsList, go_duration, pod_samples};
use super::reconcile::{HpaEvent, Inputs, ScaleView, milli_quantity, plan, scale_unavailable, set_condition};
use crate::events::Kind;

fn now() -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse().expect("time")
}

fn ago(secs: i64) -> String {
    (now() - Duration::seconds(secs)).to_rfc3339()
}

/// A pod of `app=web` started `started` s ago, with one container requesting `request` of
/// `resource`, and a Ready condition (status, changed `since` s ago) or none.
fn pod_with(
    name: &str,
    resource: &str,
    request: &str,
    phase: &str,
    started: i64,
    ready: Option<(bool, i64)>,
) -> Pod {
    let conds = ready.map(|(r, since)| {
        json!([{"type": "Ready", "status": if r { "True" } else { "False" }, "lastTransitionTime": ago(since)}])
    });
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "resources": {"requests": {resource: request}}}]},
        "status": {"phase": phase, "startTime": ago(started), "conditions": conds},
    }))
    .expect("pod")
}

/// A running pod, ready for an hour, requesting 100m CPU.
fn pod(name: &str) -> Pod {
    pod_with(name, "cpu", "100m", "Running", 7200, Some((true, 3600)))
}

fn sample(value: i64) -> PodMetric {
    PodMetric {
        timestamp: now(),
        window: Duration::seconds(30),
        value,
    }
}

fn samples(values: &[(&str, i64)]) -> PodMetrics {
    values.iter().map(|(n, v)| (n.to_string(), sample(*v))).collect()
}

fn timing() -> Timing {
    Timing::at(now())
}

/// `resource_replicas` for CPU at `target` % over `pods` with `metrics`.
fn cpu(current: i32, target: i32, pods: &[Pod], metrics: &[(&str, i64)]) -> Result<i32, CalcError> {
    let refs: Vec<&Pod> = pods.iter().collect();
    resource_replicas(
        current,
        target,
        "cpu",
        None,
        Tolerances::default(),
        &refs,
        samples(metrics),
        &timing(),
    )
    .map(|u| u.replicas)
}

fn pods(names: &[&str]) -> Vec<Pod> {
    names.iter().map(|n| pod(n)).collect()
}

#[test]
fn utilization_scales_by_the_ratio_of_usage_to_target() {
    let four = pods(&["a", "b", "c", "d"]);
    let ten: Vec<Pod> = (0..10).map(|i| pod(&format!("p{i}"))).collect();
    let each = |v: i64, n: usize| -> Vec<(&'static str, i64)> {
        ["a", "b", "c", "d"].iter().take(n).map(|p| (*p, v)).collect()
    };
    let each10 = |v: i64| -> Vec<(String, i64)> { (0..10).map(|i| (format!("p{i}"), v)).collect() };
    let cpu10 = |v: i64| {
        let m = each10(v);
        let m: Vec<(&str, i64)> = m.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        cpu(10, 50, &ten, &m)
    };
    // (case, replicas asked for, expected)
    let cases: Vec<(&str, Result<i32, CalcError>, i32)> = vec![
        (
            "usage twice the target doubles",
            cpu(4, 50, &four, &each(100, 4)),
            8,
        ),
        (
            "ratio 1.1 (upper band edge) keeps the count",
            cpu(4, 50, &four, &each(55, 4)),
            4,
        ),
        (
            "ratio 1.12 scales up: ceil(1.12 × 4)",
            cpu(4, 50, &four, &each(56, 4)),
            5,
        ),
        ("ratio 0.9 (lower band edge) keeps the count", cpu10(45), 10),
        ("ratio 0.88 scales down: ceil(0.88 × 10)", cpu10(44), 9),
        ("ratio 0.1 scales down to ceil(0.1 × 10)", cpu10(5), 1),
    ];
    for (case, got, want) in cases {
        assert_eq!(got, Ok(want), "{case}");
    }
}

#[test]
fn utilization_percent_is_truncated_as_upstream() {
    // 301m of 300m requested is 100 % (not 100.33 %): ratio 2.0 gives 6, not ceil(6.02) = 7.
    let three = pods(&["a", "b", "c"]);
    assert_eq!(cpu(3, 50, &three, &[("a", 101), ("b", 100), ("c", 100)]), Ok(6));
}

#[test]
fn pods_without_samples_damp_the_change_in_both_directions() {
    let four = pods(&["a", "b", "c", "d"]);
    // Scale-down (ratio 0.8): the missing pod uses its full request: 220/400 = 55 % → ratio
    // 1.1, in the band: no change. Without it, ceil(0.8 × 3) = 3.
    assert_eq!(cpu(4, 50, &four, &[("a", 40), ("b", 40), ("c", 40)]), Ok(4));
    assert_eq!(cpu(4, 50, &four[..3], &[("a", 40), ("b", 40), ("c", 40)]), Ok(3));
    // Target above 100 %: a missing pod uses the target (200m), not its request:
    // (50+50+200+200)/400 = 125 % → 0.625 → ceil(2.5) = 3 (with 100 % it would be 2).
    assert_eq!(cpu(4, 200, &four, &[("a", 50), ("b", 50)]), Ok(3));
    // Scale-up (ratio 2.0): the missing pod uses nothing: 300/400 = 75 % → ceil(1.5 × 4) = 6.
    assert_eq!(cpu(4, 50, &four, &[("a", 100), ("b", 100), ("c", 100)]), Ok(6));
    // Scale-up at 1.2 with two pods missing: 120/400 = 30 % → 0.6 reverses the direction: no
    // change (the samples alone would give ceil(1.2 × 2) = 3, a scale-down).
    assert_eq!(cpu(4, 50, &four, &[("a", 60), ("b", 60)]), Ok(4));
}

#[test]
fn unready_pods_count_as_idle_on_scale_up_only() {
    let ready = pod("a");
    let unready = pod_with("b", "cpu", "300m", "Running", 7200, Some((false, 7195)));
    let pending = pod_with("c", "cpu", "100m", "Pending", 10, None);
    // Up: 260 % over the ready pod; the unready one (300m requested) counts as 0:
    // 260/400 = 65 % → 1.3 → ceil(1.3 × 2) = 3 (the ready pod alone would give 6).
    assert_eq!(
        cpu(
            2,
            50,
            &[ready.clone(), unready.clone()],
            &[("a", 260), ("b", 300)]
        ),
        Ok(3)
    );
    // Down: the unready and pending pods are left out: 20 % → 0.4 → ceil(0.4 × 1) = 1.
    assert_eq!(
        cpu(
            3,
            50,
            &[ready.clone(), unready, pending.clone()],
            &[("a", 20), ("b", 300)]
        ),
        Ok(1)
    );
    // A pending pod on scale-up counts as 0 too: 100/200 = 50 % → in the band.
    assert_eq!(cpu(2, 50, &[ready, pending], &[("a", 100)]), Ok(2));
}

#[test]
fn cpu_samples_of_starting_pods_follow_the_initialization_rules() {
    // Pod a is ready with 100m; pod b has a 300m sample. Counted, b makes 400/200 = 200 % → 8;
    // left out as unready, a's 100 % with b at 0 is 50 % → in the band → 2.
    // (case, resource, started s ago, Ready (status, changed s ago), expected)
    type Case = (&'static str, &'static str, i64, Option<(bool, i64)>, i32);
    let cases: Vec<Case> = vec![
        (
            "started long ago, ready long ago",
            "cpu",
            600,
            Some((true, 590)),
            8,
        ),
        (
            "starting, ready for longer than the sample window",
            "cpu",
            120,
            Some((true, 60)),
            8,
        ),
        (
            "starting, ready for less than the sample window",
            "cpu",
            120,
            Some((true, 10)),
            2,
        ),
        ("starting, not ready", "cpu", 120, Some((false, 110)), 2),
        ("no Ready condition", "cpu", 600, None, 2),
        (
            "started long ago, never ready (changed 10 s after start)",
            "cpu",
            600,
            Some((false, 590)),
            2,
        ),
        (
            "started long ago, ready once then unready",
            "cpu",
            600,
            Some((false, 300)),
            8,
        ),
        (
            "not CPU: readiness does not matter",
            "memory",
            120,
            Some((false, 110)),
            8,
        ),
    ];
    for (case, resource, started, ready, want) in cases {
        let a = pod_with("a", resource, "100m", "Running", 7200, Some((true, 3600)));
        let b = pod_with("b", resource, "100m", "Running", started, ready);
        let got = resource_replicas(
            2,
            50,
            resource,
            None,
            Tolerances::default(),
            &[&a, &b],
            samples(&[("a", 100), ("b", 300)]),
            &timing(),
        )
        .map(|u| u.replicas);
        assert_eq!(got, Ok(want), "{case}");
    }
}

#[test]
fn deleted_and_failed_pods_are_ignored() {
    let mut gone = pod("b");
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let failed = pod_with("c", "cpu", "100m", "Failed", 600, None);
    // Only a counts: 100 % → 2.0 → ceil(2 × 1) = 2.
    assert_eq!(
        cpu(
            3,
            50,
            &[pod("a"), gone, failed],
            &[("a", 100), ("b", 500), ("c", 500)]
        ),
        Ok(2)
    );
}

#[test]
fn calculator_errors_carry_upstream_texts() {
    assert_eq!(cpu(1, 50, &[], &[]), Err(CalcError::NoPods));
    assert_eq!(
        CalcError::NoPods.to_string(),
        "no pods returned by selector while calculating replica count"
    );
    // a has no sample (missing) and nothing else has one.
    assert_eq!(cpu(1, 50, &[pod("a")], &[]), Err(CalcError::NoMetrics));
    // A sample of no selected pod matches no request.
    assert_eq!(
        cpu(1, 50, &[pod("a")], &[("x", 10)]),
        Err(CalcError::NoMatchingRequests)
    );
    assert_eq!(
        CalcError::NoMetrics.to_string(),
        "did not receive metrics for targeted pods (pods might be unready)"
    );
    let no_request = pod_with("a", "memory", "1Mi", "Running", 7200, Some((true, 3600)));
    let err = cpu(1, 50, &[no_request], &[("a", 10)]).expect_err("no cpu request");
    assert_eq!(
        err.to_string(),
        "missing request for cpu in container app of Pod a"
    );
}

#[test]
fn average_values_scale_by_the_ratio_of_average_to_target() {
    let three = pods(&["a", "b", "c"]);
    let refs: Vec<&Pod> = three.iter().collect();
    let run = |current, target, m: &[(&str, i64)]| {
        plain_replicas(
            current,
            target,
            None,
            Tolerances::default(),
            &refs,
            samples(m),
            &timing(),
        )
    };
    // 150 average over a 100 target: ceil(1.5 × 3) = 5.
    assert_eq!(run(3, 100, &[("a", 150), ("b", 150), ("c", 150)]), Ok((5, 150)));
    // In the band: no change.
    assert_eq!(run(3, 100, &[("a", 105), ("b", 105), ("c", 105)]), Ok((3, 105)));
    // Scale-down with a missing pod counted at the target: (50+50+100)/3 = 66 → 0.66 →
    // ceil(1.98) = 2.
    assert_eq!(run(3, 100, &[("a", 50), ("b", 50)]), Ok((2, 50)));
}

#[test]
fn container_metrics_and_metrics_api_answers_parse() {
    let list: PodMetricsList = serde_json::from_value(json!({
        "kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
        "items": [
            {"metadata": {"name": "a", "namespace": "default"}, "timestamp": "2026-06-01T12:00:00Z",
             "window": "30s", "containers": [
                {"name": "app", "usage": {"cpu": "150000000n", "memory": "64Mi"}},
                {"name": "sidecar", "usage": {"cpu": "400m", "memory": "1Mi"}}]},
            {"metadata": {"name": "b", "namespace": "default"}, "timestamp": "2026-06-01T12:00:00Z",
             "window": "1m0.5s", "containers": [{"name": "app", "usage": {"memory": "1Mi"}}]},
        ]
    }))
    .expect("list");
    let all = pod_samples(&list, "cpu", None).expect("samples");
    assert_eq!(all.get("a").map(|m| m.value), Some(550));
    assert_eq!(all.get("a").map(|m| m.window), Some(Duration::seconds(30)));
    assert!(
        !all.contains_key("b"),
        "a container without cpu makes the pod's sample missing"
    );
    let app = pod_samples(&list, "cpu", Some("app")).expect("samples");
    assert_eq!(app.get("a").map(|m| m.value), Some(150));
    let mem = pod_samples(&list, "memory", None).expect("samples");
    assert_eq!(mem.get("b").map(|m| m.value), Some(1_048_576_000));
    assert_eq!(go_duration("1m0.5s"), Duration::milliseconds(60_500));
    assert_eq!(
        pod_samples(&PodMetricsList::default(), "cpu", None).map_err(|e| e.to_string()),
        Err("no metrics returned from resource metrics API".to_string())
    );
    // One container of two pods: 150m used of app's 100m → 150 % over a 50 % target → 3.
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"containers": [
            {"name": "app", "resources": {"requests": {"cpu": "100m"}}},
            {"name": "sidecar", "resources": {"requests": {"cpu": "400m"}}}]},
        "status": {"phase": "Running", "startTime": ago(7200),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ago(3600)}]},
    }))
    .expect("pod");
    let run = |container| {
        resource_replicas(
            1,
            50,
            "cpu",
            container,
            Tolerances::default(),
            &[&p],
            app.clone(),
            &timing(),
        )
    };
    assert_eq!(
        run(Some("app")).map(|u| (u.replicas, u.utilization)),
        Ok((3, 150))
    );
    assert_eq!(
        run(Some("db")).map_err(|e| e.to_string()),
        Err("container db not found in Pod a".to_string())
    );
}

fn behavior(v: Value) -> HorizontalPodAutoscalerBehavior {
    serde_json::from_value(v).expect("behavior")
}

/// The behavior the API gives `behavior: {}` (API-50).
fn defaulted() -> HorizontalPodAutoscalerBehavior {
    behavior(json!({
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15}]},
        "scaleDown": {"selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
    }))
}

/// CTL-49's example behavior.
fn ctl49() -> HorizontalPodAutoscalerBehavior {
    behavior(json!({
        "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 100, "periodSeconds": 30}]},
        "scaleDown": {"stabilizationWindowSeconds": 300, "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
    }))
}

fn norm(
    h: &mut History,
    b: Option<&HorizontalPodAutoscalerBehavior>,
    current: i32,
    desired: i32,
    (min, max): (i32, i32),
    at: DateTime<Utc>,
) -> (i32, &'static str, bool, &'static str) {
    let Normalized {
        replicas,
        able_to_scale,
        limited,
        scaling_limited,
    } = normalize(h, b, current, desired, min, max, at);
    (replicas, able_to_scale.reason, limited, scaling_limited.reason)
}

#[test]
fn without_behavior_growth_is_limited_to_twice_or_four() {
    let cases = [
        // (current, desired, (min, max), expected)
        (3, 10, (1, 20), (6, "ReadyForNewScale", true, "ScaleUpLimit")),
        (1, 10, (1, 20), (4, "ReadyForNewScale", true, "ScaleUpLimit")),
        (10, 30, (1, 15), (15, "ReadyForNewScale", true, "TooManyReplicas")),
        (
            3,
            5,
            (1, 20),
            (5, "ReadyForNewScale", false, "DesiredWithinRange"),
        ),
        (3, 1, (2, 20), (2, "ReadyForNewScale", true, "TooFewReplicas")),
    ];
    for (current, desired, range, want) in cases {
        let mut h = History::default();
        assert_eq!(
            norm(&mut h, None, current, desired, range, now()),
            want,
            "{current} → {desired}"
        );
    }
}

#[test]
fn defaulted_behavior_allows_4_pods_or_100_percent_per_15s() {
    // Unlike the no-behavior path (max(2 × current, 4)): 1 → 5 (1 + 4 pods), 3 → 7, 10 → 20.
    let b = defaulted();
    let cases = [(1, 10, 5), (3, 10, 7), (10, 40, 20), (3, 6, 6)];
    for (current, desired, want) in cases {
        let mut h = History::default();
        assert_eq!(
            norm(&mut h, Some(&b), current, desired, (1, 100), now()).0,
            want,
            "{current} → {desired}"
        );
    }
    // Scale-down: 100 % per 15 s, but the default window of 300 s holds the highest
    // recommendation (the initial one).
    let mut h = History::default();
    h.record_initial(10, now() - Duration::seconds(60));
    assert_eq!(
        norm(&mut h, Some(&b), 10, 2, (1, 100), now()),
        (10, "ScaleDownStabilized", false, "DesiredWithinRange")
    );
    // Past the window the recommendation goes through: 10 → 2.
    let mut h = History::default();
    h.record_initial(10, now() - Duration::seconds(301));
    assert_eq!(
        norm(&mut h, Some(&b), 10, 2, (1, 100), now()),
        (2, "ReadyForNewScale", false, "DesiredWithinRange")
    );
}

#[test]
fn rate_policies_count_the_changes_made_within_their_period() {
    let b = ctl49();
    let mut h = History::default();
    let t0 = now();
    // Percent 100 per 30 s: 4 → 8.
    assert_eq!(
        norm(&mut h, Some(&b), 4, 40, (4, 40), t0),
        (8, "ReadyForNewScale", true, "ScaleUpLimit")
    );
    h.store_scale_event(Some(&b), 4, 8, t0);
    // 15 s later the period started at 4: the limit is still 8.
    assert_eq!(
        norm(&mut h, Some(&b), 8, 40, (4, 40), t0 + Duration::seconds(15)),
        (8, "ReadyForNewScale", true, "ScaleUpLimit")
    );
    // 31 s later the change has left the period: 8 → 16.
    assert_eq!(
        norm(&mut h, Some(&b), 8, 40, (4, 40), t0 + Duration::seconds(31)).0,
        16
    );
    // Scale-down: 10 % per 60 s after a 300 s window; 20 → 18 (truncated from 18.0).
    let mut h = History::default();
    h.record_initial(20, t0 - Duration::seconds(400));
    assert_eq!(
        norm(&mut h, Some(&b), 20, 5, (4, 40), t0),
        (18, "ReadyForNewScale", true, "ScaleDownLimit")
    );
    h.store_scale_event(Some(&b), 20, 18, t0);
    // 30 s later the period started at 20: floor(18) = 18 = current, no change.
    let later = t0 + Duration::seconds(30);
    assert_eq!(norm(&mut h, Some(&b), 18, 5, (4, 40), later).0, 18);
    // A Percent 10 period of 15 s from 15 replicas: trunc(13.5) = 13.
    let b = behavior(json!({"scaleDown": {"stabilizationWindowSeconds": 0,
        "policies": [{"type": "Percent", "value": 10, "periodSeconds": 15}]}}));
    let mut h = History::default();
    assert_eq!(norm(&mut h, Some(&b), 15, 1, (1, 40), t0).0, 13);
}

#[test]
fn select_policy_picks_the_largest_or_smallest_change_or_none() {
    let with = |select: &str| {
        behavior(json!({"scaleUp": {"selectPolicy": select, "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 60},
            {"type": "Percent", "value": 100, "periodSeconds": 60}]},
            "scaleDown": {"selectPolicy": select, "stabilizationWindowSeconds": 0, "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 60},
            {"type": "Percent", "value": 50, "periodSeconds": 60}]}}))
    };
    let cases = [
        ("Max", 10, 30, 20),
        ("Min", 10, 30, 14),
        ("Disabled", 10, 30, 10),
        ("Max", 10, 1, 5),
        ("Min", 10, 1, 6),
        ("Disabled", 10, 1, 10),
    ];
    for (select, current, desired, want) in cases {
        let b = with(select);
        let mut h = History::default();
        let (got, _, limited, reason) = norm(&mut h, Some(&b), current, desired, (1, 100), now());
        assert_eq!(got, want, "{select}: {current} → {desired}");
        assert!(limited);
        let want_reason = if desired > current {
            "ScaleUpLimit"
        } else {
            "ScaleDownLimit"
        };
        assert_eq!(reason, want_reason, "{select}");
    }
}

#[test]
fn stabilization_windows_hold_recent_recommendations() {
    let t = now();
    let rec = |replicas, secs| Recommendation {
        replicas,
        at: t - Duration::seconds(secs),
    };
    // Scale-down window 300 s: the highest recent recommendation (10, 200 s ago) wins.
    let b = behavior(json!({"scaleDown": {"stabilizationWindowSeconds": 300}}));
    let mut h = History {
        recommendations: vec![rec(10, 200), rec(7, 100)],
        ..History::default()
    };
    assert_eq!(
        norm(&mut h, Some(&b), 10, 4, (1, 20), t),
        (10, "ScaleDownStabilized", false, "DesiredWithinRange")
    );
    // 7 (100 s ago) is the highest once 10 is older than the window.
    let mut h = History {
        recommendations: vec![rec(10, 301), rec(7, 100)],
        ..History::default()
    };
    assert_eq!(norm(&mut h, Some(&b), 10, 4, (1, 20), t).0, 7);
    // The outdated one was replaced by this pass's recommendation.
    assert_eq!(h.recommendations, vec![rec(4, 0), rec(7, 100)]);
    // Scale-up window 60 s: the lowest recent recommendation (3) holds the count.
    let b = behavior(json!({"scaleUp": {"stabilizationWindowSeconds": 60}}));
    let mut h = History {
        recommendations: vec![rec(3, 30)],
        ..History::default()
    };
    assert_eq!(
        norm(&mut h, Some(&b), 3, 8, (1, 20), t),
        (3, "ScaleUpStabilized", false, "DesiredWithinRange")
    );
    // Without behavior: the highest recommendation of the last 300 s.
    let mut h = History {
        recommendations: vec![rec(8, 100), rec(5, 400)],
        ..History::default()
    };
    assert_eq!(
        norm(&mut h, None, 8, 3, (1, 20), t),
        (8, "ScaleDownStabilized", false, "DesiredWithinRange")
    );
    assert_eq!(h.recommendations, vec![rec(8, 100), rec(3, 0)]);
}

#[test]
fn scale_events_older_than_the_longest_period_are_reused() {
    let b = ctl49();
    let t = now();
    let mut h = History::default();
    h.store_scale_event(Some(&b), 4, 8, t - Duration::seconds(40));
    h.store_scale_event(Some(&b), 8, 10, t);
    assert_eq!(
        h.scale_ups,
        vec![ScaleEvent {
            change: 2,
            at: t,
            outdated: false
        }]
    );
    h.store_scale_event(Some(&b), 10, 9, t);
    assert_eq!(h.scale_downs.len(), 1);
    // Without behavior nothing is kept.
    let mut h = History::default();
    h.store_scale_event(None, 4, 8, t);
    assert_eq!(h, History::default());
}

fn hpa(spec: Value) -> HorizontalPodAutoscaler {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u1", "generation": 2},
        "spec": spec,
    }))
    .expect("hpa")
}

fn cpu_hpa(min: i32, max: i32, target: i32) -> HorizontalPodAutoscaler {
    hpa(json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": min, "maxReplicas": max,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": target}}}],
    }))
}

fn metrics_list(values: &[(&str, &str)]) -> PodMetricsList {
    let items: Vec<Value> = values
        .iter()
        .map(|(n, cpu)| {
            json!({"metadata": {"name": n, "namespace": "default"}, "timestamp": now().to_rfc3339(),
                "window": "30s", "containers": [{"name": "app", "usage": {"cpu": cpu}}]})
        })
        .collect();
    serde_json::from_value(json!({ "items": items })).expect("list")
}

fn condition(
    h: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerStatus,
    t: &str,
) -> (String, String, String) {
    let c = h
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition"));
    (
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    )
}

fn cond(status: &str, reason: &str, message: &str) -> (String, String, String) {
    (status.into(), reason.into(), message.into())
}

fn ev(kind: Kind, reason: &'static str, message: &str) -> HpaEvent {
    HpaEvent {
        kind,
        reason,
        message: message.into(),
    }
}

struct Pass {
    scale: i32,
    selector: Option<&'static str>,
    metrics: Result<PodMetricsList, String>,
    pods_metrics: BTreeMap<String, Result<PodMetrics, String>>,
}

impl Pass {
    fn new(scale: i32, metrics: Result<PodMetricsList, String>) -> Self {
        Self {
            scale,
            selector: Some("app=web"),
            metrics,
            pods_metrics: BTreeMap::new(),
        }
    }

    fn run(
        &self,
        h: &HorizontalPodAutoscaler,
        pods: &[Pod],
        history: &mut History,
    ) -> super::reconcile::Plan {
        let refs: Vec<&Pod> = pods.iter().collect();
        let inputs = Inputs {
            scale: ScaleView {
                replicas: self.scale,
                selector: self.selector.map(String::from),
            },
            pods: &refs,
            resource_metrics: &self.metrics,
            pods_metrics: &self.pods_metrics,
            timing: timing(),
        };
        plan(h, history, &inputs)
    }
}

const NOT_FOUND: &str = "the server could not find the requested resource (get pods.metrics.k8s.io)";

#[test]
fn ctl49_example_takes_the_largest_proposal_within_the_scale_up_policy() {
    let h = hpa(json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": 4, "maxReplicas": 40,
        "metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}},
            {"type": "Pods", "pods": {"metric": {"name": "http_requests_per_second"},
                "target": {"type": "AverageValue", "averageValue": "120"}}}],
        "behavior": serde_json::to_value(ctl49()).expect("behavior"),
    }));
    let names = ["a", "b", "c", "d"];
    let four = pods(&names);
    let mut pass = Pass::new(
        4,
        Ok(metrics_list(&[
            ("a", "90m"),
            ("b", "90m"),
            ("c", "90m"),
            ("d", "90m"),
        ])),
    );
    // CPU: 90 % of requests over a 60 % target → ceil(1.5 × 4) = 6. Requests: 300 per pod over
    // 120 → ceil(2.5 × 4) = 10, the largest; 100 % per 30 s allows 8.
    let rps: PodMetrics = names.iter().map(|n| (n.to_string(), sample(300_000))).collect();
    pass.pods_metrics
        .insert("http_requests_per_second".into(), Ok(rps));
    let mut history = History::default();
    let p = pass.run(&h, &four, &mut history);
    let r = p.rescale.clone().expect("rescale");
    assert_eq!(r.desired, 8);
    assert_eq!(r.reason, "pods metric http_requests_per_second above target");
    let p = p.rescaled(&h, &mut history, Ok(()), now());
    assert_eq!(p.status.current_replicas, Some(4));
    assert_eq!(p.status.desired_replicas, 8);
    assert_eq!(p.status.observed_generation, Some(2));
    assert_eq!(p.status.last_scale_time.as_ref().map(|t| t.0), Some(now()));
    assert_eq!(
        condition(&p.status, "AbleToScale"),
        cond(
            "True",
            "SucceededRescale",
            "the HPA controller was able to update the target scale to 8"
        )
    );
    assert_eq!(
        condition(&p.status, "ScalingActive"),
        cond(
            "True",
            "ValidMetricFound",
            "the HPA was able to successfully calculate a replica count from pods metric http_requests_per_second"
        )
    );
    assert_eq!(
        condition(&p.status, "ScalingLimited"),
        cond(
            "True",
            "ScaleUpLimit",
            "the desired replica count is increasing faster than the maximum scale rate"
        )
    );
    let order: Vec<&str> = p
        .status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(order, ["AbleToScale", "ScalingActive", "ScalingLimited"]);
    let current = serde_json::to_value(&p.status.current_metrics).expect("json");
    assert_eq!(
        current,
        json!([
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 90, "averageValue": "90m"}}},
            {"type": "Pods", "pods": {"metric": {"name": "http_requests_per_second"}, "current": {"averageValue": "300"}}}
        ])
    );
    assert_eq!(
        p.events,
        vec![ev(
            Kind::Normal,
            "SuccessfulRescale",
            "New size: 8; reason: pods metric http_requests_per_second above target"
        )]
    );
    assert_eq!(p.error, None);
    assert_eq!(history.scale_ups.len(), 1);
}

#[test]
fn an_absent_metrics_api_makes_scaling_inactive() {
    let h = cpu_hpa(1, 10, 50);
    let pass = Pass::new(2, Err(NOT_FOUND.into()));
    let p = pass.run(&h, &pods(&["a", "b"]), &mut History::default());
    assert_eq!(p.rescale, None);
    let inner = format!(
        "failed to get cpu utilization: unable to get metrics for resource cpu: unable to fetch metrics from \
         resource metrics API: {NOT_FOUND}"
    );
    assert_eq!(
        condition(&p.status, "ScalingActive"),
        cond(
            "False",
            "FailedGetResourceMetric",
            &format!("the HPA was unable to compute the replica count: {inner}")
        )
    );
    assert_eq!(
        condition(&p.status, "AbleToScale"),
        cond(
            "True",
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale"
        )
    );
    let outer = format!(
        "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value: {inner}"
    );
    assert_eq!(
        p.events,
        vec![
            ev(Kind::Warning, "FailedGetResourceMetric", &inner),
            ev(Kind::Warning, "FailedComputeMetricsReplicas", &outer),
        ]
    );
    assert_eq!(p.error.as_deref(), Some(outer.as_str()));
    assert_eq!(p.status.current_replicas, Some(2));
    assert_eq!(p.status.desired_replicas, 0);
    let metrics = serde_json::to_value(&p.status.current_metrics).expect("json");
    assert_eq!(
        metrics,
        json!([{"type": ""}]),
        "upstream leaves an empty status per failed metric"
    );
}

#[test]
fn an_unavailable_metric_never_lets_the_others_scale_down() {
    let h = hpa(json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": 1, "maxReplicas": 10,
        "metrics": [
            {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": "Value", "value": "10"}}},
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
    }));
    let four = pods(&["a", "b", "c", "d"]);
    // CPU alone says 4 → 1 (10 %): with the External metric unavailable, no change.
    let low = Pass::new(
        4,
        Ok(metrics_list(&[
            ("a", "10m"),
            ("b", "10m"),
            ("c", "10m"),
            ("d", "10m"),
        ])),
    );
    let p = low.run(&h, &four, &mut History::default());
    assert_eq!(p.rescale, None);
    let (status, reason, _) = condition(&p.status, "ScalingActive");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "FailedGetExternalMetric")
    );
    assert!(
        p.events
            .iter()
            .any(|e| e.reason == "FailedComputeMetricsReplicas")
    );
    // CPU says 4 → 8 (100 %): it scales up, and the pass still reports the failure.
    let high = Pass::new(
        4,
        Ok(metrics_list(&[
            ("a", "100m"),
            ("b", "100m"),
            ("c", "100m"),
            ("d", "100m"),
        ])),
    );
    let p = high.run(&h, &four, &mut History::default());
    assert_eq!(p.rescale.as_ref().map(|r| r.desired), Some(8));
    let (status, reason, _) = condition(&p.status, "ScalingActive");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ValidMetricFound"));
    assert!(
        p.error.as_deref().is_some_and(|e| e.starts_with(
            "invalid metrics (1 invalid out of 2), first error is: failed to get queue external metric value"
        )),
        "{:?}",
        p.error
    );
    assert_eq!(
        p.events.first().map(|e| e.reason),
        Some("FailedGetExternalMetric")
    );
}

#[test]
fn out_of_range_and_disabled_targets() {
    let h = cpu_hpa(2, 5, 50);
    let none = || Err::<PodMetricsList, String>("not fetched".into());
    // Zero replicas: autoscaling is off.
    let p = Pass::new(0, none()).run(&h, &[], &mut History::default());
    assert_eq!(p.rescale, None);
    assert_eq!(
        condition(&p.status, "ScalingActive"),
        cond(
            "False",
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero"
        )
    );
    assert_eq!((p.status.current_replicas, p.status.desired_replicas), (None, 0));
    // Above max / below min: set to the bound without metrics.
    let p = Pass::new(9, none()).run(&h, &[], &mut History::default());
    let r = p.rescale.clone().expect("rescale");
    assert_eq!(
        (r.desired, r.reason.as_str()),
        (5, "Current number of replicas above Spec.MaxReplicas")
    );
    let p = p.rescaled(&h, &mut History::default(), Ok(()), now());
    assert_eq!(
        p.events,
        vec![ev(
            Kind::Normal,
            "SuccessfulRescale",
            "New size: 5; reason: Current number of replicas above Spec.MaxReplicas"
        )]
    );
    let p = Pass::new(1, none()).run(&h, &[], &mut History::default());
    let r = p.rescale.expect("rescale");
    assert_eq!(
        (r.desired, r.reason.as_str()),
        (2, "Current number of replicas below Spec.MinReplicas")
    );
    // minReplicas defaults to 1.
    let h = hpa(
        json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "maxReplicas": 5, "metrics": []}),
    );
    let p = Pass::new(0, none()).run(&h, &[], &mut History::default());
    assert_eq!(condition(&p.status, "ScalingActive").1, "ScalingDisabled");
}

#[test]
fn scale_down_reason_and_default_cpu_metric() {
    // No metrics named: the API's default, CPU at 80 %. 4 pods at 20 % → ceil(0.25 × 4) = 1.
    let h = hpa(
        json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "maxReplicas": 5}),
    );
    let four = pods(&["a", "b", "c", "d"]);
    let pass = Pass::new(
        4,
        Ok(metrics_list(&[
            ("a", "20m"),
            ("b", "20m"),
            ("c", "20m"),
            ("d", "20m"),
        ])),
    );
    let mut history = History::default();
    history.record_initial(4, now() - Duration::seconds(400));
    let p = pass.run(&h, &four, &mut history);
    let r = p.rescale.expect("rescale");
    assert_eq!((r.desired, r.reason.as_str()), (1, "All metrics below target"));
    assert_eq!(
        condition(&p.status, "ScalingActive").2,
        "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)"
    );
    // The same pass on a fresh history holds 4 (the initial recommendation is in the window).
    let p = pass.run(&h, &four, &mut History::default());
    assert_eq!(p.rescale, None);
    assert_eq!(
        condition(&p.status, "AbleToScale"),
        cond(
            "True",
            "ScaleDownStabilized",
            "recent recommendations were higher than current one, applying the highest recent recommendation"
        )
    );
    assert_eq!(p.status.desired_replicas, 4);
}

#[test]
fn selector_and_scale_failures() {
    let h = cpu_hpa(1, 10, 50);
    let mut pass = Pass::new(2, Err(NOT_FOUND.into()));
    pass.selector = None;
    let p = pass.run(&h, &[], &mut History::default());
    assert_eq!(
        condition(&p.status, "ScalingActive"),
        cond(
            "False",
            "InvalidSelector",
            "the HPA target's scale is missing a selector"
        )
    );
    assert_eq!(
        p.events,
        vec![
            ev(Kind::Warning, "SelectorRequired", "selector is required"),
            ev(
                Kind::Warning,
                "FailedComputeMetricsReplicas",
                "selector is required"
            ),
        ]
    );
    let p = scale_unavailable(&h, "deployments.apps \"web\" not found", now());
    assert_eq!(
        condition(&p.status, "AbleToScale"),
        cond(
            "False",
            "FailedGetScale",
            "the HPA controller was unable to get the target's current scale: deployments.apps \"web\" not found"
        )
    );
    assert_eq!(
        p.events,
        vec![ev(
            Kind::Warning,
            "FailedGetScale",
            "deployments.apps \"web\" not found"
        )]
    );
    // A failed scale update.
    let four = pods(&["a", "b", "c", "d"]);
    let pass = Pass::new(
        4,
        Ok(metrics_list(&[
            ("a", "100m"),
            ("b", "100m"),
            ("c", "100m"),
            ("d", "100m"),
        ])),
    );
    let mut history = History::default();
    let p = pass.run(&h, &four, &mut history);
    let p = p.rescaled(&h, &mut history, Err("conflict".into()), now());
    assert_eq!(
        condition(&p.status, "AbleToScale"),
        cond(
            "False",
            "FailedUpdateScale",
            "the HPA controller was unable to update the target scale: conflict"
        )
    );
    assert_eq!(
        p.events,
        vec![ev(
            Kind::Warning,
            "FailedRescale",
            "New size: 8; reason: cpu resource utilization (percentage of request) above target; error: conflict"
        )]
    );
    assert_eq!(
        (p.status.desired_replicas, p.status.last_scale_time.clone()),
        (0, None)
    );
    assert_eq!(history.scale_ups, Vec::new(), "no behavior: no scale events kept");
}

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let mut s = Default::default();
    set_condition(&mut s, "AbleToScale", true, "A", "a", now());
    set_condition(
        &mut s,
        "AbleToScale",
        true,
        "B",
        "b",
        now() + Duration::seconds(15),
    );
    let at = |s: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerStatus| {
        s.conditions
            .as_ref()
            .and_then(|c| c[0].last_transition_time.clone())
            .map(|t| t.0)
    };
    assert_eq!(at(&s), Some(now()));
    set_condition(
        &mut s,
        "AbleToScale",
        false,
        "C",
        "c",
        now() + Duration::seconds(30),
    );
    assert_eq!(at(&s), Some(now() + Duration::seconds(30)));
}

#[test]
fn milli_quantities_print_as_go_does() {
    let cases = [
        (90, "90m"),
        (1000, "1"),
        (1500, "1500m"),
        (300_000, "300"),
        (2_000_000, "2k"),
        (0, "0"),
    ];
    for (v, want) in cases {
        assert_eq!(milli_quantity(v).0, want, "{v}");
    }
}
