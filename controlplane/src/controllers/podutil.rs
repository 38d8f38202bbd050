//! Pod facts every workload controller reads: active, ready, available after `minReadySeconds`,
//! and the pod a template makes for an owner.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Not finished (Succeeded/Failed) and not being deleted: the pods a controller counts.
pub fn is_active(p: &Pod) -> bool {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default();
    p.metadata.deletion_timestamp.is_none() && phase != "Succeeded" && phase != "Failed"
}

/// Being deleted.
pub fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// The `Ready` condition is True; returns when it became so.
pub fn ready_since(p: &Pod) -> Option<DateTime<Utc>> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(
        c.last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(DateTime::<Utc>::MIN_UTC),
    )
}

pub fn is_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

/// Ready for at least `min_ready_seconds` at `now` (upstream's `IsPodAvailable`).
pub fn is_available(p: &Pod, min_ready_seconds: i32, now: DateTime<Utc>) -> bool {
    match ready_since(p) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(t) => t + chrono::Duration::seconds(i64::from(min_ready_seconds)) <= now,
    }
}

/// The owner reference a controller puts on what it creates.
pub fn controller_owner(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A pod from `template` for `owner` (upstream's `GetPodFromTemplate`): the template's labels,
/// annotations, finalizers and spec, `generateName` `<prefix>`, the owner reference.
pub fn pod_from_template(
    template: &PodTemplateSpec,
    namespace: &str,
    generate_name: &str,
    owner: OwnerReference,
) -> Pod {
    let tm = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name.into()),
            namespace: Some(namespace.into()),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// An int-or-percent of `total` (upstream's `GetScaledValueFromIntOrPercent`): percentages round
/// up or down as asked; an unparsable value is 0.
pub fn scaled_value(v: &IntOrString, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let Some(pct) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
                return 0;
            };
            let x = pct * i64::from(total);
            let v = if round_up {
                (x + 99).div_euclid(100)
            } else {
                x.div_euclid(100)
            };
            i32::try_from(v).unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn availability_waits_min_ready_seconds() {
        let p = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}));
        let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().expect("time");
        assert!(is_available(&p, 0, t0));
        assert!(!is_available(&p, 10, t0 + chrono::Duration::seconds(9)));
        assert!(is_available(&p, 10, t0 + chrono::Duration::seconds(10)));
        let unready = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}}));
        assert!(!is_available(&unready, 0, t0));
        let done = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}}));
        assert!(!is_active(&done));
    }

    #[test]
    fn int_or_percent_scaling() {
        assert_eq!(scaled_value(&IntOrString::Int(2), 10, false), 2);
        assert_eq!(scaled_value(&IntOrString::String("25%".into()), 10, true), 3);
        assert_eq!(scaled_value(&IntOrString::String("25%".into()), 10, false), 2);
        assert_eq!(scaled_value(&IntOrString::String("x".into()), 10, false), 0);
    }
}
