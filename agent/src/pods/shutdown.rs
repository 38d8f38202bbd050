//! Graceful node shutdown (docs/SEEDS-SPEC.md §4.17, NODE-68; the kubelet's
//! `nodeshutdown_manager_linux.go`). There is no systemd inhibitor lock here: init tells the
//! agent ([`crate::NODE_SHUTDOWN_SIGNAL`]) and waits for it before stopping the runtime.
//!
//! The pods are stopped band by band, lowest priority first ([`groups`]): every pod of a band at
//! once, each with the smaller of its own `terminationGracePeriodSeconds` and the band's period,
//! and the next band starts when the band's pods are stopped or its period is over. Empty bands
//! cost nothing. A stopped pod is `Failed` with reason [`REASON`], message [`MESSAGE`] and the
//! `DisruptionTarget` condition (reason `TerminationByKubelet`); pods that reach the node during
//! the shutdown are rejected ([`REJECT_REASON`]), and the Node is NotReady
//! ([`NODE_NOT_READY_MESSAGE`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot};

use super::eviction::PodFailure;
use crate::settings::ShutdownGracePeriod;

pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
pub const REJECT_REASON: &str = "NodeShutdown";
pub const REJECT_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The Ready condition's message while the node shuts down (reason `KubeletNotReady`).
pub const NODE_NOT_READY_MESSAGE: &str = "node is shutting down";

/// Where the node is in its life, shared by the agent's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Running,
    /// A shutdown was requested: the pods are being stopped.
    ShuttingDown,
    /// Every band is done: the agent may exit.
    PodsStopped,
}

/// A request to a pod's worker: fail the pod this way and stop it; `done` when it is stopped.
#[derive(Debug)]
pub struct Kill {
    pub failure: PodFailure,
    pub done: oneshot::Sender<()>,
}

/// The failure a band's pod gets: the pod's own grace period, capped by the band's.
pub fn failure(pod: &Pod, band_seconds: u64) -> PodFailure {
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .and_then(|g| u64::try_from(g).ok());
    PodFailure {
        reason: REASON,
        message: MESSAGE.into(),
        grace: Some(own.map_or(band_seconds, |g| g.min(band_seconds))),
        disruption: true,
    }
}

/// The band of a pod of `priority` among `bands` (sorted by priority): the highest band at or
/// below it; pods below every band go to the lowest, as upstream's `groupByPriority`.
pub fn band_index(bands: &[ShutdownGracePeriod], priority: i32) -> usize {
    bands.iter().rposition(|b| b.priority <= priority).unwrap_or(0)
}

/// The pods of each band, in the order the bands are stopped (lowest priority first).
pub fn groups<T>(
    bands: &[ShutdownGracePeriod],
    pods: impl IntoIterator<Item = (i32, T)>,
) -> Vec<(ShutdownGracePeriod, Vec<T>)> {
    let mut bands = bands.to_vec();
    bands.sort();
    let mut groups: Vec<(ShutdownGracePeriod, Vec<T>)> = bands.iter().map(|b| (*b, Vec::new())).collect();
    for (priority, pod) in pods {
        let i = band_index(&bands, priority);
        if let Some(g) = groups.get_mut(i) {
            g.1.push(pod);
        }
    }
    groups
}

/// A pod to stop: its latest version and its worker.
#[derive(Debug)]
pub struct Target {
    pub pod: Arc<Pod>,
    pub kill: mpsc::Sender<Kill>,
}

/// Stops `targets` band by band; returns when every band is done or its time is over.
pub async fn stop_pods(bands: &[ShutdownGracePeriod], targets: Vec<Target>) {
    let with_priority = targets.into_iter().map(|t| {
        let priority = t.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        (priority, t)
    });
    for (band, targets) in groups(bands, with_priority) {
        if targets.is_empty() {
            continue;
        }
        tracing::info!(
            priority = band.priority,
            grace_s = band.shutdown_grace_period_seconds,
            pods = targets.len(),
            "node shutdown: stopping a priority band"
        );
        let mut done = Vec::with_capacity(targets.len());
        for t in targets {
            let (tx, rx) = oneshot::channel();
            let kill = Kill {
                failure: failure(&t.pod, band.shutdown_grace_period_seconds),
                done: tx,
            };
            // A worker that is gone has nothing left to stop.
            if t.kill.send(kill).await.is_ok() {
                done.push(rx);
            }
        }
        let period = Duration::from_secs(band.shutdown_grace_period_seconds);
        if tokio::time::timeout(period, futures_util::future::join_all(done))
            .await
            .is_err()
        {
            tracing::warn!(
                priority = band.priority,
                "node shutdown: the band's period is over"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::SYSTEM_CRITICAL_PRIORITY;

    fn band(priority: i32, shutdown_grace_period_seconds: u64) -> ShutdownGracePeriod {
        ShutdownGracePeriod {
            priority,
            shutdown_grace_period_seconds,
        }
    }

    #[test]
    fn pods_fall_into_the_band_at_or_below_their_priority() {
        // SEEDS-SPEC NODE-68's example, given out of order.
        let bands = [band(10000, 180), band(100000, 10), band(0, 60), band(1000, 120)];
        let pods = [
            (-5, "below every band"),
            (0, "zero"),
            (999, "just below 1000"),
            (1000, "exactly 1000"),
            (50000, "between"),
            (100000, "exactly the top"),
            (SYSTEM_CRITICAL_PRIORITY, "above every band"),
        ];
        let got: Vec<(i32, u64, Vec<&str>)> = groups(&bands, pods)
            .into_iter()
            .map(|(b, p)| (b.priority, b.shutdown_grace_period_seconds, p))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 60, vec!["below every band", "zero", "just below 1000"]),
                (1000, 120, vec!["exactly 1000"]),
                (10000, 180, vec!["between"]),
                (100000, 10, vec!["exactly the top", "above every band"]),
            ]
        );
    }

    #[test]
    fn two_phases_put_critical_pods_last() {
        let bands = ShutdownGracePeriod::two_phases(30, 10);
        let pods = [
            (SYSTEM_CRITICAL_PRIORITY + 1000, "system-node-critical"),
            (0, "web"),
            (SYSTEM_CRITICAL_PRIORITY, "system-cluster-critical"),
            (1_000_000_000, "user high"),
        ];
        let got: Vec<(u64, Vec<&str>)> = groups(&bands, pods)
            .into_iter()
            .map(|(b, p)| (b.shutdown_grace_period_seconds, p))
            .collect();
        assert_eq!(
            got,
            vec![
                (20, vec!["web", "user high"]),
                (10, vec!["system-node-critical", "system-cluster-critical"]),
            ]
        );
    }

    #[test]
    fn a_pod_gets_the_shorter_of_its_grace_and_the_band() {
        let pod = |grace: Option<i64>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c"}], "terminationGracePeriodSeconds": grace},
            }))
            .expect("pod")
        };
        for (own, band, want) in [
            (Some(30), 20, 20),
            (Some(5), 20, 5),
            (None, 20, 20),
            (Some(0), 20, 0),
        ] {
            let f = failure(&pod(own), band);
            assert_eq!(f.grace, Some(want), "own {own:?}, band {band}");
            assert_eq!(
                (f.reason, f.message.as_str(), f.disruption),
                (REASON, MESSAGE, true)
            );
        }
    }
}
