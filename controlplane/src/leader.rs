//! Leader election through a `coordination.k8s.io` Lease, as upstream's components do it: the
//! holder renews `renewTime` every retry period; another instance takes over once the record has
//! not changed for the lease duration (measured on its own clock, so clock skew between machines
//! does not matter); a leader that cannot renew within the renew deadline stops leading. Writes
//! are compare-and-swap on the Lease's resourceVersion, so two instances never both win.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use serde_json::json;

/// Lease timing (upstream's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// `kube-system/<name>` with upstream's timings.
    pub fn new(name: &str, identity: &str) -> Self {
        Self {
            namespace: "kube-system".into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// A unique identity for this process: `<hostname>_<random>`.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "controlplane".into());
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{host}_{hex}")
}

/// What one attempt saw.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Acquired,
    Renewed,
    HeldByOther,
}

struct Elector {
    api: kube::Api<Lease>,
    cfg: LeaseConfig,
    /// The other holder's record and when we first saw it unchanged.
    observed: Option<(String, Instant)>,
}

fn now_micro() -> String {
    kcore::time::rfc3339_micros(SystemTime::now())
}

impl Elector {
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let duration = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(15);
        let current = match self.api.get_opt(&self.cfg.name).await? {
            Some(l) => l,
            None => {
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                    "spec": {"holderIdentity": self.cfg.identity, "leaseDurationSeconds": duration,
                             "acquireTime": now_micro(), "renewTime": now_micro(), "leaseTransitions": 0},
                }))
                .map_err(kube::Error::SerdeError)?;
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(Attempt::Acquired),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldByOther),
                    Err(e) => Err(e),
                };
            }
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.cfg.identity;
        if !mine && !holder.is_empty() {
            // The record (holder + renew time) must stay unchanged for a whole lease duration.
            let record = format!(
                "{holder}/{:?}/{:?}",
                spec.renew_time.as_ref().map(|t| t.0),
                current.metadata.resource_version
            );
            let since = match &self.observed {
                Some((r, t)) if *r == record => *t,
                _ => {
                    self.observed = Some((record, Instant::now()));
                    return Ok(Attempt::HeldByOther);
                }
            };
            let held_for = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(duration)).unwrap_or(15),
            );
            if since.elapsed() < held_for {
                return Ok(Attempt::HeldByOther);
            }
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let mut next = current.clone();
        next.spec = Some(
            serde_json::from_value(json!({
                "holderIdentity": self.cfg.identity, "leaseDurationSeconds": duration,
                "acquireTime": if mine { json!(spec.acquire_time) } else { json!(now_micro()) },
                "renewTime": now_micro(), "leaseTransitions": transitions,
            }))
            .map_err(kube::Error::SerdeError)?,
        );
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => {
                self.observed = None;
                Ok(if mine { Attempt::Renewed } else { Attempt::Acquired })
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldByOther),
            Err(e) => Err(e),
        }
    }
}

/// Runs `work` whenever this process holds the lease, for ever: `work` is started on acquiring
/// and aborted when the lease cannot be renewed within the renew deadline (then the election
/// starts again). `work` gets a fresh start each time it leads.
pub async fn run_as_leader<F, Fut>(client: kube::Client, cfg: LeaseConfig, work: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut elector = Elector {
        api: kube::Api::namespaced(client, &cfg.namespace),
        cfg: cfg.clone(),
        observed: None,
    };
    loop {
        // Candidate: try until acquired.
        loop {
            match elector.try_acquire_or_renew().await {
                Ok(Attempt::Acquired | Attempt::Renewed) => break,
                Ok(Attempt::HeldByOther) => {}
                Err(e) => tracing::debug!(lease = %cfg.name, error = %e, "lease not acquired"),
            }
            tokio::time::sleep(cfg.retry_period).await;
        }
        tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, "became leader");
        let task = tokio::spawn(work());
        let mut last_renew = Instant::now();
        loop {
            tokio::time::sleep(cfg.retry_period).await;
            match elector.try_acquire_or_renew().await {
                Ok(Attempt::Renewed | Attempt::Acquired) => last_renew = Instant::now(),
                Ok(Attempt::HeldByOther) => {
                    tracing::warn!(lease = %cfg.name, "lease taken by another instance");
                    break;
                }
                Err(e) => {
                    tracing::warn!(lease = %cfg.name, error = %e, "lease renewal failed");
                    if last_renew.elapsed() >= cfg.renew_deadline {
                        break;
                    }
                }
            }
            if task.is_finished() {
                break;
            }
        }
        task.abort();
        tracing::warn!(lease = %cfg.name, identity = %cfg.identity, "stopped leading");
    }
}

/// Background tasks that stop when their owner does: every task spawned through a scope is
/// aborted when the scope is dropped. The leader loop stops leading by dropping the work's
/// future, and a plain `tokio::spawn` inside it would outlive it (informers watching on, whole
/// controllers still reconciling beside the new leader's).
#[derive(Debug, Default)]
pub struct Scope {
    tasks: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Scope {
    /// Spawns `fut` on the runtime; it is aborted when this scope is dropped.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = tokio::spawn(fut);
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task.abort_handle());
        task
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_a_scope_aborts_its_tasks_and_only_them() {
        let scope = Scope::default();
        let forever = scope.spawn(futures::future::pending::<()>());
        let done = scope.spawn(async { 7 });
        assert_eq!(done.await.ok(), Some(7));
        let outside = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            1
        });
        drop(scope);
        let err = forever.await.expect_err("aborted");
        assert!(err.is_cancelled());
        assert_eq!(outside.await.ok(), Some(1));
    }
}
