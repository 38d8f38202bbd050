//! `/configz`: the agent's settings as the kubelet reports its `KubeletConfiguration`
//! (`{"kubeletconfig": {...}}`, v1beta1 field names, no kind/apiVersion), reached through the
//! API server's `nodes/<name>/proxy/configz` (docs/SEEDS-SPEC.md K30). Only fields whose values
//! this agent really uses are listed.

use serde_json::{Value, json};

use crate::pods::pressure::{Amount, Thresholds};
use crate::settings::{AgentSettings, SYSTEM_CRITICAL_PRIORITY, ShutdownGracePeriod};
use kcore::time::go_duration;

/// `evictionHard` (`soft` false) or `evictionSoft` as the kubelet prints them: signal →
/// `<quantity>` or `<N>%`.
fn eviction_map(t: &Thresholds, soft: bool) -> Value {
    let map: serde_json::Map<String, Value> =
        t.0.iter()
            .filter(|t| t.grace_period.is_some() == soft)
            .map(|t| {
                let v = match t.amount {
                    Amount::Quantity(q, binary) => kcore::quantity::format_bytes(q, binary),
                    Amount::Percent(p) => format!("{p}%"),
                };
                (t.signal.name().to_string(), Value::String(v))
            })
            .collect();
    Value::Object(map)
}

/// The graceful node shutdown fields: `shutdownGracePeriod` and
/// `shutdownGracePeriodCriticalPods` when the bands are the two phases those make, else
/// `shutdownGracePeriodByPodPriority`.
fn shutdown(bands: &[ShutdownGracePeriod]) -> Value {
    let secs = |s: u64| go_duration(std::time::Duration::from_secs(s));
    let total = ShutdownGracePeriod::total(bands);
    let critical = match bands {
        [regular, critical] if regular.priority == 0 && critical.priority == SYSTEM_CRITICAL_PRIORITY => {
            Some(critical.shutdown_grace_period_seconds)
        }
        [] => Some(0),
        _ => None,
    };
    match critical {
        Some(c) => json!({
            "shutdownGracePeriod": secs(total),
            "shutdownGracePeriodCriticalPods": secs(c),
        }),
        None => json!({
            "shutdownGracePeriod": "0s",
            "shutdownGracePeriodCriticalPods": "0s",
            "shutdownGracePeriodByPodPriority": bands,
        }),
    }
}

/// The `/configz` document for an agent with `settings`.
pub fn configz(settings: &AgentSettings, thresholds: &Thresholds) -> Value {
    let gc = settings.image_gc.unwrap_or_default();
    let mut kc = json!({
        "enableServer": true,
        "port": 10250,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true, "cacheTTL": go_duration(crate::authz::TOKEN_TTL)},
            "x509": {},
        },
        "authorization": {
            "mode": "Webhook",
            "webhook": {
                "cacheAuthorizedTTL": go_duration(crate::authz::ALLOWED_TTL),
                "cacheUnauthorizedTTL": go_duration(crate::authz::DENIED_TTL),
            },
        },
        "maxPods": 110,
        "nodeStatusUpdateFrequency": go_duration(crate::node::STATUS_UPDATE),
        "nodeLeaseDurationSeconds": crate::node::LEASE_DURATION_SECONDS,
        "evictionHard": eviction_map(thresholds, false),
        "evictionSoft": eviction_map(thresholds, true),
        "evictionSoftGracePeriod": thresholds
            .0
            .iter()
            .filter_map(|t| Some((t.signal.name().to_string(), Value::String(go_duration(t.grace_period?)))))
            .collect::<serde_json::Map<String, Value>>(),
        "evictionMaxPodGracePeriod": settings.eviction.eviction_max_pod_grace_period,
        "evictionMinimumReclaim": settings.eviction.eviction_minimum_reclaim,
        "evictionPressureTransitionPeriod": go_duration(crate::pods::pressure::TRANSITION_PERIOD),
        "mergeDefaultEvictionSettings": false,
        "crashLoopBackOff": {"maxContainerRestartPeriod": go_duration(crate::pods::backoff::MAX)},
        "containerLogMaxSize": kcore::quantity::format_bytes(runtime_api::LOG_MAX_SIZE, true),
        "containerLogMaxFiles": runtime_api::LOG_MAX_FILES,
        "systemReserved": {
            "memory": kcore::quantity::format_bytes(kcore::allocatable::SYSTEM_RESERVED_MEMORY, true),
        },
        "imageGCHighThresholdPercent": gc.high_threshold_percent,
        "imageGCLowThresholdPercent": gc.low_threshold_percent,
        "imageMinimumGCAge": go_duration(std::time::Duration::from_secs(gc.minimum_age_seconds)),
        "cgroupDriver": "cgroupfs",
        "failSwapOn": true,
    });
    if let (Some(kc), Value::Object(s)) = (
        kc.as_object_mut(),
        shutdown(&settings.shutdown_grace_period_by_pod_priority),
    ) {
        kc.extend(s);
    }
    json!({ "kubeletconfig": kc })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(bands: Vec<ShutdownGracePeriod>) -> AgentSettings {
        AgentSettings {
            node_name: "n1".into(),
            node_ip: None,
            control_plane: None,
            insecure_registries: vec![],
            shutdown_grace_period_by_pod_priority: bands,
            eviction: Default::default(),
            image_gc: None,
        }
    }

    #[test]
    fn reports_what_the_agent_runs_with() {
        let c = configz(&settings(vec![]), &Thresholds::default());
        let kc = &c["kubeletconfig"];
        // The fields SEEDS-SPEC K30 reads.
        assert_eq!(
            kc["evictionHard"],
            json!({"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
                   "imagefs.available": "15%", "imagefs.inodesFree": "5%"})
        );
        assert_eq!(kc["mergeDefaultEvictionSettings"], json!(false));
        assert_eq!(
            (
                &kc["evictionSoft"],
                &kc["evictionSoftGracePeriod"],
                &kc["evictionMaxPodGracePeriod"]
            ),
            (&json!({}), &json!({}), &json!(0))
        );
        assert_eq!(
            kc["crashLoopBackOff"],
            json!({"maxContainerRestartPeriod": "5m0s"})
        );
        assert_eq!(kc["containerLogMaxSize"], json!("10Mi"));
        assert_eq!(kc["containerLogMaxFiles"], json!(5));
        assert_eq!(kc["shutdownGracePeriod"], json!("0s"));
        assert_eq!(
            (
                &kc["imageGCHighThresholdPercent"],
                &kc["imageGCLowThresholdPercent"],
                &kc["imageMinimumGCAge"]
            ),
            (&json!(85), &json!(80), &json!("2m0s"))
        );
        assert!(kc.get("kind").is_none() && kc.get("apiVersion").is_none());
        let two = configz(
            &settings(ShutdownGracePeriod::two_phases(30, 10)),
            &Thresholds::parse(&[("memory.available".to_string(), "600Mi".to_string())].into())
                .expect("valid"),
        );
        let kc = &two["kubeletconfig"];
        assert_eq!(
            (&kc["shutdownGracePeriod"], &kc["shutdownGracePeriodCriticalPods"]),
            (&json!("30s"), &json!("10s"))
        );
        assert!(kc.get("shutdownGracePeriodByPodPriority").is_none());
        assert_eq!(kc["evictionHard"], json!({"memory.available": "600Mi"}));
        let bands = vec![
            ShutdownGracePeriod {
                priority: 0,
                shutdown_grace_period_seconds: 60,
            },
            ShutdownGracePeriod {
                priority: 100000,
                shutdown_grace_period_seconds: 10,
            },
        ];
        let mut soft = settings(bands.clone());
        soft.eviction = crate::pods::pressure::EvictionConfig {
            eviction_soft: [("memory.available".to_string(), "300Mi".to_string())].into(),
            eviction_soft_grace_period: [("memory.available".to_string(), "90s".to_string())].into(),
            eviction_max_pod_grace_period: 20,
            ..Default::default()
        };
        let t = soft.thresholds().expect("valid");
        let kc = configz(&soft, &t)["kubeletconfig"].clone();
        assert_eq!(
            (
                &kc["evictionHard"]["memory.available"],
                &kc["evictionSoft"],
                &kc["evictionSoftGracePeriod"],
                &kc["evictionMaxPodGracePeriod"]
            ),
            (
                &json!("100Mi"),
                &json!({"memory.available": "300Mi"}),
                &json!({"memory.available": "1m30s"}),
                &json!(20)
            )
        );
        let by = configz(&settings(bands), &Thresholds::default());
        assert_eq!(
            by["kubeletconfig"]["shutdownGracePeriodByPodPriority"],
            json!([{"priority": 0, "shutdownGracePeriodSeconds": 60},
                   {"priority": 100000, "shutdownGracePeriodSeconds": 10}])
        );
    }
}
