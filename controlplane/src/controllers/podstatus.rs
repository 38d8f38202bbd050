//! Pod status writes of the node controllers: a pod condition set as upstream's
//! `UpdatePodCondition` does (the transition time moves only when the status changes; nothing
//! is written when nothing changes), the `DisruptionTarget` condition before a deletion, the
//! Ready condition of a pod on a lost node, and `Failed` before a forced deletion.

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// A condition by type.
pub fn pod_condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The strategic-merge status patch that sets condition `type_` to `status` with `reason` and
/// `message`, or None when the pod already has exactly that.
pub fn condition_patch(
    pod: &Pod,
    type_: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<&str>,
    now: DateTime<Utc>,
) -> Option<Value> {
    let old = pod_condition(pod, type_);
    if let Some(c) = old
        && c.status == status
        && c.reason.as_deref() == reason
        && c.message.as_deref() == message
    {
        return None;
    }
    let transition = match old {
        Some(c) if c.status == status => c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now),
        _ => now,
    };
    Some(json!({"status": {"conditions": [{
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": rfc3339(transition),
    }]}}))
}

fn api(client: &kube::Client, pod: &Pod) -> kube::Api<Pod> {
    kube::Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

async fn patch_status(client: &kube::Client, pod: &Pod, patch: &Value) -> Result<(), kube::Error> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match api(client, pod)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets `DisruptionTarget` (True, `reason`, `message`) on `pod` unless it has it.
pub async fn set_disruption_target(
    client: &kube::Client,
    pod: &Pod,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    match condition_patch(
        pod,
        "DisruptionTarget",
        "True",
        Some(reason),
        Some(message),
        Utc::now(),
    ) {
        Some(patch) => patch_status(client, pod, &patch).await,
        None => Ok(()),
    }
}

/// Whether `pod`'s Ready condition would change to False (it has one that is not False).
pub fn needs_not_ready(pod: &Pod) -> bool {
    pod_condition(pod, "Ready").is_some_and(|c| c.status != "False")
}

/// Sets a pod's Ready condition False (upstream's `MarkPodsNotReady` for one pod); returns
/// whether it was changed.
pub async fn mark_not_ready(client: &kube::Client, pod: &Pod) -> Result<bool, kube::Error> {
    let Some(c) = pod_condition(pod, "Ready").filter(|c| c.status != "False") else {
        return Ok(false);
    };
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": c.reason, "message": c.message,
        "lastTransitionTime": rfc3339(Utc::now()),
    }]}});
    patch_status(client, pod, &patch).await?;
    Ok(true)
}

/// Moves a pod that has not finished to `Failed`, with `condition` (reason, message) as its
/// `DisruptionTarget` (upstream's `markFailedAndDeletePodWithCondition`, before the deletion).
pub async fn mark_failed(
    client: &kube::Client,
    pod: &Pod,
    condition: Option<(&str, &str)>,
) -> Result<(), kube::Error> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Ok(());
    }
    let mut patch = json!({"status": {"phase": "Failed"}});
    if let Some((reason, message)) = condition
        && let Some(c) = condition_patch(
            pod,
            "DisruptionTarget",
            "True",
            Some(reason),
            Some(message),
            Utc::now(),
        )
    {
        patch["status"]["conditions"] = c["status"]["conditions"].clone();
    }
    patch_status(client, pod, &patch).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(conditions: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": {"conditions": conditions}}))
            .expect("pod")
    }

    #[test]
    fn a_condition_keeps_its_transition_time_unless_its_status_changes() {
        let now: DateTime<Utc> = "2026-06-01T12:00:00Z".parse().expect("time");
        let p = pod(
            json!([{"type": "DisruptionTarget", "status": "True", "reason": "Old",
            "lastTransitionTime": "2026-06-01T11:00:00Z"}]),
        );
        let patch =
            condition_patch(&p, "DisruptionTarget", "True", Some("New"), Some("m"), now).expect("changed");
        assert_eq!(
            patch["status"]["conditions"][0]["lastTransitionTime"],
            "2026-06-01T11:00:00Z"
        );
        let fresh = condition_patch(
            &pod(json!([])),
            "DisruptionTarget",
            "True",
            Some("New"),
            None,
            now,
        )
        .expect("new");
        assert_eq!(
            fresh["status"]["conditions"][0]["lastTransitionTime"],
            "2026-06-01T12:00:00Z"
        );
        let same =
            pod(json!([{"type": "DisruptionTarget", "status": "True", "reason": "New", "message": "m"}]));
        assert!(condition_patch(&same, "DisruptionTarget", "True", Some("New"), Some("m"), now).is_none());
        assert!(needs_not_ready(&pod(
            json!([{"type": "Ready", "status": "True"}])
        )));
        assert!(
            !needs_not_ready(&pod(json!([]))),
            "no Ready condition: left alone"
        );
    }
}
