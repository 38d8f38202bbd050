//! The kubelet's Summary API (`GET /stats/summary`, `stats/v1alpha1`), the part metrics-server
//! reads, and the usage samples made of it: the node's CPU (`usageNanoCores`) and memory working
//! set, and per pod the same for each container. Also the JSON of `NodeMetrics` and `PodMetrics`
//! built from samples (metrics-server's shape).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::quantity;

/// `metrics.k8s.io/v1beta1`.
pub const API_VERSION: &str = "metrics.k8s.io/v1beta1";

/// Why a summary gives no samples.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("summary is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("summary of node {node:?} has no {what}")]
    Missing { node: String, what: &'static str },
}

pub use kcore::summary::{ContainerStats, CpuStats, MemoryStats, NodeStats, PodRef, PodStats, Summary};

/// One usage sample: CPU in nanocores, memory working set in bytes, at `timestamp` (RFC 3339).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub cpu_nanocores: u64,
    pub memory_bytes: u64,
    pub timestamp: String,
}

/// A pod's sample: its containers' usage, in the summary's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    pub pod: PodRef,
    pub containers: Vec<(String, Usage)>,
    /// The earliest container sample time (what metrics-server reports for the pod).
    pub timestamp: String,
}

/// What one node's summary gives: the node's usage (None when the summary lacks it) and its
/// pods' (pods with a container without CPU or memory left out, as metrics-server does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSamples {
    pub node: Option<Usage>,
    pub pods: Vec<PodUsage>,
}

fn usage(cpu: Option<&CpuStats>, memory: Option<&MemoryStats>) -> Option<Usage> {
    let (cpu, memory) = (cpu?, memory?);
    let timestamp = if cpu.time.is_empty() {
        memory.time.clone()
    } else {
        cpu.time.clone()
    };
    Some(Usage {
        cpu_nanocores: cpu.usage_nano_cores?,
        memory_bytes: memory.working_set_bytes?,
        timestamp,
    })
}

/// The samples of a summary body from node `node`.
pub fn parse(node: &str, body: &[u8]) -> Result<NodeSamples, SummaryError> {
    let s: Summary = serde_json::from_slice(body)?;
    if s.node.node_name != node {
        return Err(SummaryError::Missing {
            node: node.into(),
            what: "matching nodeName",
        });
    }
    let node_usage = usage(s.node.cpu.as_ref(), s.node.memory.as_ref());
    let mut pods = Vec::with_capacity(s.pods.len());
    for p in s.pods {
        let containers: Option<Vec<(String, Usage)>> = p
            .containers
            .iter()
            .map(|c| Some((c.name.clone(), usage(c.cpu.as_ref(), c.memory.as_ref())?)))
            .collect();
        let Some(containers) = containers else {
            tracing::debug!(node, pod = %format!("{}/{}", p.pod_ref.namespace, p.pod_ref.name),
                "pod left out: a container has no CPU or memory sample");
            continue;
        };
        if containers.is_empty() {
            continue;
        }
        let timestamp = containers
            .iter()
            .map(|(_, u)| u.timestamp.clone())
            .min()
            .unwrap_or_default();
        pods.push(PodUsage {
            pod: p.pod_ref,
            containers,
            timestamp,
        });
    }
    Ok(NodeSamples {
        node: node_usage,
        pods,
    })
}

fn usage_json(u: &Usage) -> Value {
    json!({"cpu": quantity::cpu(u.cpu_nanocores), "memory": quantity::memory(u.memory_bytes)})
}

fn metadata(obj: &Value, now: &str, namespaced: bool) -> Value {
    let mut meta = json!({"name": obj["metadata"]["name"], "creationTimestamp": now});
    if namespaced {
        meta["namespace"] = obj["metadata"]["namespace"].clone();
    }
    if let Some(l) = obj["metadata"]["labels"].as_object().filter(|l| !l.is_empty()) {
        meta["labels"] = Value::Object(l.clone());
    }
    meta
}

/// A `NodeMetrics` for the Node object `node` (its name and labels) at request time `now`.
pub fn node_metrics(node: &Value, u: &Usage, window: Duration, now: &str) -> Value {
    json!({
        "kind": "NodeMetrics", "apiVersion": API_VERSION,
        "metadata": metadata(node, now, false),
        "timestamp": u.timestamp, "window": quantity::window(window),
        "usage": usage_json(u),
    })
}

/// A `PodMetrics` for the Pod object `pod` at request time `now`.
pub fn pod_metrics(pod: &Value, p: &PodUsage, window: Duration, now: &str) -> Value {
    let containers: Vec<Value> = p
        .containers
        .iter()
        .map(|(name, u)| json!({"name": name, "usage": usage_json(u)}))
        .collect();
    json!({
        "kind": "PodMetrics", "apiVersion": API_VERSION,
        "metadata": metadata(pod, now, true),
        "timestamp": p.timestamp, "window": quantity::window(window),
        "containers": containers,
    })
}

/// A `NodeMetricsList` or `PodMetricsList`.
pub fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": API_VERSION, "metadata": {}, "items": items})
}

/// A server-side Table of metrics as metrics-server converts them: Name, cpu, memory (a pod's
/// summed over its containers), Window.
pub fn table(items: &[Value]) -> Value {
    let col = |name: &str, format: &str, description: &str| json!({"name": name, "type": "string", "format": format, "description": description, "priority": 0});
    let rows: Vec<Value> = items
        .iter()
        .map(|m| {
            let (cpu, memory) = match m["containers"].as_array() {
                Some(cs) => {
                    let sum = |k: &str, parse: fn(&str) -> Option<u128>| -> u128 {
                        cs.iter()
                            .filter_map(|c| c["usage"][k].as_str().and_then(parse))
                            .sum()
                    };
                    let cpu = sum("cpu", kcore::quantity::nanos);
                    let mem = sum("memory", |s| kcore::quantity::bytes(s).map(u128::from));
                    (
                        quantity::cpu(u64::try_from(cpu).unwrap_or(u64::MAX)),
                        quantity::memory(u64::try_from(mem).unwrap_or(u64::MAX)),
                    )
                }
                None => (
                    m["usage"]["cpu"].as_str().unwrap_or_default().to_string(),
                    m["usage"]["memory"].as_str().unwrap_or_default().to_string(),
                ),
            };
            json!({"cells": [m["metadata"]["name"], cpu, memory, m["window"]],
                   "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": m["metadata"]}})
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {},
        "columnDefinitions": [col("Name", "name", "Name of the resource"), col("cpu", "quantity", ""),
                              col("memory", "quantity", ""), col("Window", "duration", "")],
        "rows": rows,
    })
}

/// A container's name, CPU usage in nanocores and memory working set in bytes.
pub type ContainerUsage = (String, u64, u64);

/// A node's summary as a kubelet answers it, from per-container usage (hollow nodes).
pub fn summary(node: &str, pods: &[(PodRef, Vec<ContainerUsage>)], time: &str) -> Summary {
    let cpu = |n: u64| {
        Some(CpuStats {
            time: time.into(),
            usage_nano_cores: Some(n),
        })
    };
    let mem = |b: u64| {
        Some(MemoryStats {
            time: time.into(),
            working_set_bytes: Some(b),
        })
    };
    let (mut node_cpu, mut node_mem) = (0u64, 0u64);
    let pods = pods
        .iter()
        .map(|(r, cs)| PodStats {
            pod_ref: r.clone(),
            containers: cs
                .iter()
                .map(|(name, c, m)| {
                    node_cpu = node_cpu.saturating_add(*c);
                    node_mem = node_mem.saturating_add(*m);
                    ContainerStats {
                        name: name.clone(),
                        cpu: cpu(*c),
                        memory: mem(*m),
                    }
                })
                .collect(),
        })
        .collect();
    Summary {
        node: NodeStats {
            node_name: node.into(),
            cpu: cpu(node_cpu),
            memory: mem(node_mem),
        },
        pods,
    }
}

/// Containers' usage from a pod's `hollow.nodeos.dev/usage` annotation (test knob, see
/// [`crate::hollow`]): `{"cpu": "250m", "memory": "64Mi"}` for every container, and optionally
/// `"containers": {"<name>": {"cpu": .., "memory": ..}}` for some. None for a malformed value.
pub fn annotated_usage(annotation: &str, containers: &[String]) -> Option<BTreeMap<String, (u64, u64)>> {
    let v: Value = serde_json::from_str(annotation).ok()?;
    let amounts = |o: &Value, default: (u64, u64)| -> Option<(u64, u64)> {
        let cpu = match o.get("cpu") {
            // A quantity in billionths of a core is nanocores.
            Some(c) => u64::try_from(kcore::quantity::nanos(c.as_str()?)?).ok()?,
            None => default.0,
        };
        let mem = match o.get("memory") {
            Some(m) => kcore::quantity::bytes(m.as_str()?)?,
            None => default.1,
        };
        Some((cpu, mem))
    };
    let all = amounts(&v, (0, 0))?;
    containers
        .iter()
        .map(|c| {
            let u = match v["containers"].get(c) {
                Some(o) => amounts(o, all)?,
                None => all,
            };
            Some((c.clone(), u))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "2026-01-01T00:00:10Z";

    fn body() -> Vec<u8> {
        serde_json::to_vec(&json!({
            "node": {"nodeName": "n1", "cpu": {"time": T, "usageNanoCores": 500_000_000u64, "usageCoreNanoSeconds": 9},
                     "memory": {"time": T, "workingSetBytes": 1_265_283_072u64, "rssBytes": 1}},
            "pods": [
                {"podRef": {"name": "web", "namespace": "default", "uid": "u1"},
                 "containers": [
                    {"name": "app", "cpu": {"time": "2026-01-01T00:00:09Z", "usageNanoCores": 250_000_000u64},
                     "memory": {"time": T, "workingSetBytes": 67_108_864u64}},
                    {"name": "side", "cpu": {"time": T, "usageNanoCores": 1_234_567u64},
                     "memory": {"time": T, "workingSetBytes": 1_048_576u64}}]},
                {"podRef": {"name": "half", "namespace": "default", "uid": "u2"},
                 "containers": [{"name": "a", "cpu": {"time": T}}]},
            ],
        }))
        .unwrap_or_default()
    }

    #[test]
    fn summary_gives_node_and_complete_pods() {
        let s = parse("n1", &body()).expect("parse");
        assert_eq!(
            s.node,
            Some(Usage {
                cpu_nanocores: 500_000_000,
                memory_bytes: 1_265_283_072,
                timestamp: T.into()
            })
        );
        assert_eq!(s.pods.len(), 1, "the pod without samples is left out");
        assert_eq!(s.pods[0].pod.uid, "u1");
        assert_eq!(s.pods[0].timestamp, "2026-01-01T00:00:09Z");
        assert!(parse("other", &body()).is_err());
        assert!(parse("n1", b"{").is_err());
    }

    #[test]
    fn metrics_in_metrics_server_shape() {
        let s = parse("n1", &body()).expect("parse");
        let node = json!({"metadata": {"name": "n1", "labels": {"zone": "a"}, "uid": "x"}});
        let now = "2026-01-01T00:00:30Z";
        let m = node_metrics(
            &node,
            s.node.as_ref().expect("node"),
            Duration::from_secs(15),
            now,
        );
        assert_eq!(
            m,
            json!({"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": "n1", "creationTimestamp": now, "labels": {"zone": "a"}},
                "timestamp": T, "window": "15s", "usage": {"cpu": "500m", "memory": "1235628Ki"}})
        );
        let pod = json!({"metadata": {"name": "web", "namespace": "default"}});
        let p = pod_metrics(&pod, &s.pods[0], Duration::from_secs(15), now);
        assert_eq!(
            p,
            json!({"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": "web", "namespace": "default", "creationTimestamp": now},
                "timestamp": "2026-01-01T00:00:09Z", "window": "15s",
                "containers": [{"name": "app", "usage": {"cpu": "250m", "memory": "64Mi"}},
                               {"name": "side", "usage": {"cpu": "1234567n", "memory": "1Mi"}}]})
        );
        let t = table(&[p]);
        assert_eq!(t["rows"][0]["cells"], json!(["web", "251234567n", "65Mi", "15s"]));
        assert_eq!(list("PodMetrics", vec![])["kind"], "PodMetricsList");
    }

    #[test]
    fn hollow_summary_sums_the_node() {
        let r = PodRef {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        };
        let s = summary(
            "h-0",
            &[(r, vec![("a".into(), 250_000_000, 1 << 20), ("b".into(), 5, 3)])],
            T,
        );
        let body = serde_json::to_vec(&s).expect("json");
        let back = parse("h-0", &body).expect("parse");
        assert_eq!(
            back.node.map(|u| (u.cpu_nanocores, u.memory_bytes)),
            Some((250_000_005, (1 << 20) + 3))
        );
        assert_eq!(back.pods[0].containers.len(), 2);
    }

    #[test]
    fn usage_annotation_per_pod_and_per_container() {
        let cs = vec!["app".to_string(), "side".to_string()];
        let u = annotated_usage(r#"{"cpu":"250m","memory":"64Mi"}"#, &cs).expect("usage");
        assert_eq!(u["app"], (250_000_000, 64 << 20));
        assert_eq!(u["side"], (250_000_000, 64 << 20));
        let u = annotated_usage(r#"{"cpu":"1","containers":{"side":{"memory":"1Ki"}}}"#, &cs).expect("usage");
        assert_eq!(u["app"], (1_000_000_000, 0));
        assert_eq!(u["side"], (1_000_000_000, 1024));
        assert!(annotated_usage(r#"{"cpu":"lots"}"#, &cs).is_none());
        assert!(annotated_usage("not json", &cs).is_none());
    }
}
