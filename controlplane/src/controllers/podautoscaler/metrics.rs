//! The resource metrics API's answer (`metrics.k8s.io/v1beta1` `PodMetricsList`; k8s-openapi
//! has no metrics types) and the per-pod samples the calculator reads from it (upstream's
//! `resourceMetricsClient.GetResourceMetric`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::calculator::{PodMetric, PodMetrics, milli_value};

/// `PodMetricsList`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMetricsList {
    #[serde(default)]
    pub items: Vec<PodMetricsItem>,
}

/// One pod's `PodMetrics`.
#[derive(Debug, Clone, Deserialize)]
pub struct PodMetricsItem {
    pub metadata: ItemMeta,
    pub timestamp: DateTime<Utc>,
    /// A Go duration (`30s`, `1m0.5s`).
    #[serde(default)]
    pub window: String,
    #[serde(default)]
    pub containers: Vec<ContainerMetrics>,
}

/// The name of the pod sampled.
#[derive(Debug, Clone, Deserialize)]
pub struct ItemMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// One container's usage (`cpu`, `memory` quantities).
#[derive(Debug, Clone, Deserialize)]
pub struct ContainerMetrics {
    pub name: String,
    #[serde(default)]
    pub usage: BTreeMap<String, String>,
}

/// Why the samples of a resource are not available (upstream's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    #[error("unable to fetch metrics from resource metrics API: {0}")]
    Fetch(String),
    #[error("no metrics returned from resource metrics API")]
    Empty,
}

/// A Go `time.Duration` string (`30s`, `1m30s`, `1.5s`, `250ms`) as a duration; zero when
/// malformed.
pub fn go_duration(s: &str) -> chrono::Duration {
    kcore::time::parse_go_duration(s)
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .unwrap_or_else(chrono::Duration::zero)
}

/// Each pod's usage of `resource` in milli-units: the sum over its containers, or one
/// container's. A pod with no containers, or a container without that resource, has no sample.
pub fn pod_samples(
    list: &PodMetricsList,
    resource: &str,
    container: Option<&str>,
) -> Result<PodMetrics, MetricsError> {
    if list.items.is_empty() {
        return Err(MetricsError::Empty);
    }
    let mut out = PodMetrics::new();
    for item in &list.items {
        let mut sum = 0i64;
        let mut missing = item.containers.is_empty();
        let mut found = container.is_none();
        for c in &item.containers {
            if container.is_some_and(|want| want != c.name) {
                continue;
            }
            found = true;
            match c.usage.get(resource).and_then(|q| milli_value(q)) {
                Some(v) => sum = sum.saturating_add(v),
                None => {
                    missing = true;
                    break;
                }
            }
        }
        if !missing && found {
            out.insert(
                item.metadata.name.clone(),
                PodMetric {
                    timestamp: item.timestamp,
                    window: go_duration(&item.window),
                    value: sum,
                },
            );
        }
    }
    Ok(out)
}
