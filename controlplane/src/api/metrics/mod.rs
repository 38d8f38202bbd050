//! The resource metrics API, `metrics.k8s.io/v1beta1` (what metrics-server serves, for
//! `kubectl top` and the HorizontalPodAutoscaler): `NodeMetrics` and `PodMetrics`, computed from
//! what the nodes report rather than stored.
//!
//! The model is metrics-server's: a scraper GETs every Ready node's kubelet Summary API
//! (`/stats/summary`) over the same dial as logs and exec ([`Api::agent_get`]), at most
//! [`CONCURRENCY`] nodes at once, each answer at most [`SUMMARY_LIMIT`] bytes, every
//! [`RESOLUTION`]; a node that fails is logged and has no metrics until it answers again, and a
//! node that is gone or not Ready is dropped. The scraper starts with the first metrics request
//! (a cluster where nobody asks, such as a scheduler benchmark, pays nothing), and a request finds
//! samples no older than [`RESOLUTION`]: an older cache is refreshed before it is answered.
//!
//! Answers follow metrics-server: objects carry the Node's or Pod's name and labels, a
//! `creationTimestamp` of the request time, the sample `timestamp` and `window`; lists filter
//! Nodes and Pods by `labelSelector` and `fieldSelector` and leave out those without metrics; a
//! GET of a Node or Pod that exists without metrics is `nodemetrics.metrics.k8s.io "<name>" not
//! found` / `podmetrics.metrics.k8s.io "<ns>/<name>" not found`, of one that does not exist the
//! Node's or Pod's own 404.
//!
//! Unlike metrics-server, CPU is the kubelet's `usageNanoCores` (its own rate) rather than a rate
//! computed from two cumulative samples, so the `window` reported is [`RESOLUTION`].

pub mod quantity;
pub mod summary;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use serde_json::Value;

use crate::api::Api;
use crate::api::object::selector::Filter;
use crate::api::object::stored::decode;
use crate::api::registry::{self, Resource};
use crate::api::request::{Query, Target, Want};
use crate::api::status::ApiError;
use summary::{NodeSamples, PodUsage, Usage};

/// Why one node was not scraped.
#[derive(Debug, thiserror::Error)]
enum ScrapeError {
    #[error("no summary within {0:?}")]
    Timeout(Duration),
    /// The node's answer, or the dial's error, as the API reports it.
    #[error("{0}")]
    Node(String),
    #[error(transparent)]
    Summary(#[from] summary::SummaryError),
}

/// The API group served here.
pub const GROUP: &str = "metrics.k8s.io";
/// How often nodes are scraped, and the oldest cache a request is answered from.
pub const RESOLUTION: Duration = Duration::from_secs(15);
/// Nodes scraped at once.
pub const CONCURRENCY: usize = 64;
/// Largest Summary answer read from a node.
pub const SUMMARY_LIMIT: usize = 8 << 20;
/// Longest wait for one node's summary.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// The samples of the last scrape.
#[derive(Debug, Default)]
struct Samples {
    /// When the scrape finished (None: never scraped).
    at: Option<Instant>,
    nodes: HashMap<String, Usage>,
    /// By (namespace, name).
    pods: HashMap<(String, String), PodUsage>,
}

/// The scraper's state, shared by the API's clones.
#[derive(Debug, Default)]
pub(crate) struct MetricsState {
    samples: RwLock<Arc<Samples>>,
    /// Held while scraping (a request and the loop never scrape at once).
    scraping: tokio::sync::Mutex<()>,
    /// The periodic scraper runs.
    started: AtomicBool,
    /// Nodes whose last scrape failed (their errors are logged once, then at debug level).
    failing: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl MetricsState {
    fn current(&self) -> Arc<Samples> {
        self.samples
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, s: Samples) {
        *self
            .samples
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(s);
    }

    /// Records a node's scrape result; true when it changed from working to failing.
    fn note(&self, node: &str, ok: bool) -> bool {
        let mut f = self
            .failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ok {
            f.remove(node);
            false
        } else {
            f.insert(node.to_string())
        }
    }
}

fn is_ready(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn core(plural: &str) -> Result<&'static Resource, ApiError> {
    registry::find("", "v1", plural).ok_or_else(|| ApiError::internal(format!("{plural} not served")))
}

fn not_found(kind: &str, name: &str) -> ApiError {
    ApiError {
        code: 404,
        reason: "NotFound",
        message: format!("{kind}.{GROUP} \"{name}\" not found"),
        details: Some(serde_json::json!({"name": name, "group": GROUP, "kind": kind})),
    }
}

impl Api {
    /// GET of `nodes` or `pods` in `metrics.k8s.io` (one, or a list).
    pub(crate) async fn metrics(&self, t: &Target, q: &Query, want: Want) -> Result<Value, ApiError> {
        let samples = self.fresh_samples().await;
        let now = kcore::time::rfc3339(SystemTime::now());
        let pods = t.res.plural == "pods";
        let kind = if pods { "PodMetrics" } else { "NodeMetrics" };
        let res = core(t.res.plural)?;
        let metric_of = |obj: &Value| -> Option<Value> {
            let name = obj["metadata"]["name"].as_str()?;
            if pods {
                let ns = obj["metadata"]["namespace"].as_str()?;
                let p = samples.pods.get(&(ns.to_string(), name.to_string()))?;
                let uid = obj["metadata"]["uid"].as_str().unwrap_or_default();
                // A pod re-created under the same name is not the one sampled.
                if !p.pod.uid.is_empty() && p.pod.uid != uid {
                    return None;
                }
                Some(summary::pod_metrics(obj, p, RESOLUTION, &now))
            } else {
                let u = samples.nodes.get(name)?;
                Some(summary::node_metrics(obj, u, RESOLUTION, &now))
            }
        };
        let items = match &t.name {
            Some(name) => {
                let ns = t.namespace.as_deref().filter(|_| pods);
                let (obj, _) = self.read_object(res, ns, name).await?;
                let m = metric_of(&obj).ok_or_else(|| match ns {
                    Some(ns) => not_found("podmetrics", &format!("{ns}/{name}")),
                    None => not_found("nodemetrics", name),
                })?;
                if want != Want::Table {
                    return Ok(m);
                }
                vec![m]
            }
            None => {
                let filter = Filter::new(
                    res,
                    q.get("labelSelector").unwrap_or_default(),
                    q.get("fieldSelector").unwrap_or_default(),
                )?;
                let target = Target {
                    res,
                    namespace: t.namespace.clone().filter(|_| pods),
                    name: None,
                    sub: None,
                };
                let listed = self.list_matching(&target, &Query::default(), &filter, 0).await?;
                let mut items = Vec::new();
                for kv in &listed.items {
                    if let Some(m) = metric_of(&decode(kv)?) {
                        items.push(m);
                    }
                }
                if want != Want::Table {
                    return Ok(summary::list(kind, items));
                }
                items
            }
        };
        Ok(summary::table(&items))
    }

    /// The samples, scraped first when they are older than [`RESOLUTION`]; starts the periodic
    /// scraper on first use.
    async fn fresh_samples(&self) -> Arc<Samples> {
        let state = self.metrics.clone();
        if !state.started.swap(true, Ordering::AcqRel) {
            let api = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(RESOLUTION);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    api.refresh(RESOLUTION / 2).await;
                }
            });
        }
        self.refresh(RESOLUTION).await
    }

    /// Scrapes unless the samples are younger than `max_age`.
    async fn refresh(&self, max_age: Duration) -> Arc<Samples> {
        let fresh = |s: &Samples| s.at.is_some_and(|at| at.elapsed() < max_age);
        let current = self.metrics.current();
        if fresh(&current) {
            return current;
        }
        let _scraping = self.metrics.scraping.lock().await;
        let current = self.metrics.current();
        if fresh(&current) {
            return current;
        }
        match self.scrape().await {
            Ok(samples) => self.metrics.replace(samples),
            // Keep what there is; the next request or tick tries again.
            Err(e) => tracing::warn!(error = %e.message, "metrics: cannot list nodes"),
        }
        self.metrics.current()
    }

    /// One scrape of every Ready node.
    async fn scrape(&self) -> Result<Samples, ApiError> {
        let started = Instant::now();
        let nodes = self.ready_nodes().await?;
        let total = nodes.len();
        let results: Vec<(String, Result<NodeSamples, ScrapeError>)> = futures::stream::iter(nodes)
            .map(|node| async move {
                let name = node["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let got = tokio::time::timeout(
                    SCRAPE_TIMEOUT,
                    self.agent_get(&node, "/stats/summary", SUMMARY_LIMIT),
                )
                .await;
                let r = match got {
                    Err(_) => Err(ScrapeError::Timeout(SCRAPE_TIMEOUT)),
                    Ok(Err(e)) => Err(ScrapeError::Node(e.message)),
                    Ok(Ok(body)) => summary::parse(&name, &body).map_err(ScrapeError::from),
                };
                (name, r)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut s = Samples::default();
        let mut failed = 0usize;
        for (node, r) in results {
            match r {
                Ok(samples) => {
                    self.metrics.note(&node, true);
                    if let Some(u) = samples.node {
                        s.nodes.insert(node, u);
                    }
                    for p in samples.pods {
                        s.pods.insert((p.pod.namespace.clone(), p.pod.name.clone()), p);
                    }
                }
                Err(e) => {
                    failed += 1;
                    if self.metrics.note(&node, false) {
                        tracing::warn!(node = %node, error = %e, "metrics: node not scraped");
                    } else {
                        tracing::debug!(node = %node, error = %e, "metrics: node not scraped");
                    }
                }
            }
        }
        tracing::debug!(nodes = total, failed, pods = s.pods.len(), elapsed = ?started.elapsed(), "metrics: scraped");
        s.at = Some(Instant::now());
        Ok(s)
    }

    /// The Ready nodes (the ones scraped).
    async fn ready_nodes(&self) -> Result<Vec<Value>, ApiError> {
        let res = core("nodes")?;
        let target = Target {
            res,
            namespace: None,
            name: None,
            sub: None,
        };
        let filter = Filter::new(res, "", "")?;
        let listed = self.list_matching(&target, &Query::default(), &filter, 0).await?;
        let mut out = Vec::new();
        for kv in &listed.items {
            let n = decode(kv)?;
            if is_ready(&n) {
                out.push(n);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_ready_nodes_are_scraped() {
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let unknown = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        assert!(is_ready(&ready));
        assert!(!is_ready(&unknown));
        assert!(!is_ready(&json!({})));
    }

    #[test]
    fn not_found_as_metrics_server_says_it() {
        let e = not_found("podmetrics", "default/web");
        assert_eq!(e.code, 404);
        assert_eq!(e.message, "podmetrics.metrics.k8s.io \"default/web\" not found");
    }
}
