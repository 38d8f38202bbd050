//! `scheduler-bench OUT.json`: the scheduler benchmark, through our API server with hollow nodes
//! (no VMs), in one run:
//! - **basic**: 5,000 nodes, 10,000 pending pods with small requests (the shape of upstream
//!   scheduler_perf's SchedulingBasic), from the first create to the last binding: pods/s, p50 and
//!   p99 create→bound;
//! - **affinity**: 1,000 nodes in 10 zones, 1,000 pods with a zone topology spread constraint
//!   (DoNotSchedule, maxSkew 1) and required pod anti-affinity on the hostname;
//! - **idle**: 1,000 pods that can never fit, then the control plane's CPU over 30 s of quiet
//!   (a scheduler that retried them in a loop would show here);
//! - the control plane's RSS (peak and after) with 5,000 nodes and 10,000 pods.
//!
//! Sizes are overridable for quick runs: `BENCH_NODES`, `BENCH_PODS`, `BENCH_AFFINITY_NODES`.
//! Absolute numbers on shared machines are noise; the ratios against the targets are the figures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use controlplane::process::{HollowProcess, LARGE_CLUSTER_ARGS, ServerProcess, cpu_seconds, proc_status};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns: kube::Api<Namespace> = kube::Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}}))?,
    )
    .await?;
    Ok(())
}

/// The API server over the workspace's HTTP client with the admin certificate: the harness sends
/// pre-serialized JSON and scans watch lines instead of decoding them, so its own CPU (on the same
/// two cores as the server) stays small.
#[derive(Clone)]
struct Raw {
    base: String,
    client: transport::client::HttpClient<http_body_util::Full<bytes::Bytes>>,
}

impl Raw {
    fn new(dir: &Path, port: u16) -> Result<Self> {
        let read = |f: &str| std::fs::read_to_string(dir.join("pki").join(f)).with_context(|| f.to_string());
        let (ca, cert, key) = (read("ca.crt")?, read("admin.crt")?, read("admin.key")?);
        let tls = transport::tls::client_config(transport::tls::ServerAuth::Ca(&ca), Some((&cert, &key)))?;
        Ok(Self {
            base: format!("https://127.0.0.1:{port}"),
            client: transport::client::http_client(Some(Arc::new(tls)))?,
        })
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: bytes::Bytes,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(body))?;
        Ok(self.client.request(req).await?)
    }
}

/// Creates pods from `make(i)` with 64 concurrent clients; returns the send time of each.
async fn create_pods(
    raw: &Raw,
    ns: &str,
    count: usize,
    make: Arc<dyn Fn(usize) -> Value + Send + Sync>,
) -> Result<HashMap<String, Instant>> {
    let bodies: Vec<(String, bytes::Bytes)> = (0..count)
        .map(|i| {
            let v = make(i);
            let name = v["metadata"]["name"].as_str().unwrap_or_default().to_string();
            (name, bytes::Bytes::from(v.to_string()))
        })
        .collect();
    let bodies = Arc::new(bodies);
    let sent = Arc::new(Mutex::new(HashMap::with_capacity(count)));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let path = format!("/api/v1/namespaces/{ns}/pods");
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (raw, sent, next, bodies, path) = (
            raw.clone(),
            sent.clone(),
            next.clone(),
            bodies.clone(),
            path.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, body)) = bodies.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let t = Instant::now();
                let resp = raw.send("POST", &path, body.clone()).await?;
                let code = resp.status().as_u16();
                let _ = resp.into_body().collect().await;
                if code != 201 {
                    bail!("creating {name}: HTTP {code}");
                }
                sent.lock().await.insert(name.clone(), t);
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let map = std::mem::take(&mut *sent.lock().await);
    Ok(map)
}

/// The pod name in a watch line (pods of this harness are named `<prefix>-<n>`).
fn pod_name<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let pat = format!("\"name\":\"{prefix}-");
    let start = line.find(&pat)? + 8;
    let end = line[start..].find('"')? + start;
    Some(&line[start..end])
}

/// Watches `ns` until `count` pods have a node; returns when each was first seen bound.
async fn watch_bound(
    raw: Raw,
    ns: String,
    prefix: String,
    count: usize,
    timeout: Duration,
) -> Result<HashMap<String, Instant>> {
    let resp = raw
        .send(
            "GET",
            &format!("/api/v1/namespaces/{ns}/pods?watch=true&timeoutSeconds=900"),
            bytes::Bytes::new(),
        )
        .await?;
    let mut body = resp.into_body();
    let mut bound: HashMap<String, Instant> = HashMap::with_capacity(count);
    let mut buf: Vec<u8> = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while bound.len() < count {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .map_err(|_| anyhow::anyhow!("only {} of {count} pods bound within {timeout:?}", bound.len()))?;
        let Some(Ok(frame)) = frame else {
            bail!("watch ended")
        };
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            if line.contains("\"nodeName\":\"")
                && let Some(name) = pod_name(&line, &prefix)
            {
                bound.entry(name.to_string()).or_insert_with(Instant::now);
            }
        }
    }
    Ok(bound)
}

/// Creates pods and measures until all are bound.
async fn run_scenario(
    client: &kube::Client,
    raw: &Raw,
    ns: &str,
    prefix: &str,
    count: usize,
    make: Arc<dyn Fn(usize) -> Value + Send + Sync>,
    server_pid: u32,
) -> Result<Value> {
    create_namespace(client, ns).await?;
    let watch = tokio::spawn(watch_bound(
        raw.clone(),
        ns.to_string(),
        prefix.to_string(),
        count,
        Duration::from_secs(900),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu0 = cpu_seconds(server_pid);
    let t0 = Instant::now();
    let sent = create_pods(raw, ns, count, make).await?;
    let created_in = t0.elapsed();
    let bound = watch.await??;
    let last = bound.values().max().copied().unwrap_or(t0);
    let elapsed = last.duration_since(t0);
    let mut lat: Vec<f64> = bound
        .iter()
        .filter_map(|(n, b)| {
            sent.get(n)
                .map(|s| b.saturating_duration_since(*s).as_secs_f64() * 1000.0)
        })
        .collect();
    let cpu = cpu_seconds(server_pid) - cpu0;
    Ok(json!({
        "pods": count,
        "first_create_to_last_binding_s": elapsed.as_secs_f64(),
        "pods_per_s": count as f64 / elapsed.as_secs_f64(),
        "create_phase_s": created_in.as_secs_f64(),
        "create_to_bound_ms": {"p50": percentile(&mut lat, 0.5), "p99": percentile(&mut lat, 0.99)},
        "control_plane_cpu_s": cpu,
        // The cost per pod, next to the rate (both move with the machine's load).
        "control_plane_cpu_ms_per_pod": cpu * 1000.0 / count as f64,
    }))
}

fn small_pod(i: usize, prefix: &str) -> Value {
    json!({"metadata": {"name": format!("{prefix}-{i}")},
           "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})
}

fn main() -> Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: scheduler-bench OUT.json")?,
    );
    let nodes = env_usize("BENCH_NODES", 5_000);
    let pods = env_usize("BENCH_PODS", 10_000);
    let affinity_nodes = env_usize("BENCH_AFFINITY_NODES", 1_000);
    let bin = std::env::current_exe()?.with_file_name("controlplane");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let results = rt.block_on(async {
        // Basic: its own control plane.
        let tmp = tempfile::tempdir()?;
        let basic = basic(&bin, tmp.path(), nodes, pods).await?;
        drop(tmp);
        let tmp = tempfile::tempdir()?;
        let affinity = affinity(&bin, tmp.path(), affinity_nodes).await?;
        Ok::<_, anyhow::Error>(json!({
            "benchmark": "scheduler",
            "basic": basic,
            "affinity_and_spread": affinity,
            "targets": {"basic_pods_per_s_min": 1000, "rss_max_mib": 300,
                        "upstream_kube_scheduler_1_32_reference": {"pods_per_s": "152-183", "rss_mib": 300}},
        }))
    })?;
    std::fs::write(&out, serde_json::to_string_pretty(&results)?)?;
    println!("{}", serde_json::to_string_pretty(&results)?);
    Ok(())
}

async fn client_of(dir: &Path) -> Result<kube::Client> {
    Ok(transport::kubeapi::from_kubeconfig(&dir.join("admin.kubeconfig"), "scheduler-bench").await?)
}

/// `serve` arguments: a pod network for thousands of nodes, and extra arguments for experiments
/// (`SCHEDULER_BENCH_SERVE_ARGS="--no-controllers"`).
fn serve_args() -> Vec<String> {
    let extra = std::env::var("SCHEDULER_BENCH_SERVE_ARGS").unwrap_or_default();
    LARGE_CLUSTER_ARGS
        .into_iter()
        .chain(extra.split_whitespace())
        .map(str::to_string)
        .collect()
}

async fn basic(bin: &Path, dir: &Path, nodes: usize, pods: usize) -> Result<Value> {
    let args = serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ServerProcess::spawn(bin, dir, &args)?;
    let pid = server.pid();
    let client = client_of(dir).await?;
    let raw = Raw::new(dir, server.port)?;
    eprintln!("scheduler-bench: registering {nodes} hollow nodes");
    let t = Instant::now();
    let hollow = HollowProcess::spawn(
        bin,
        &dir.join("admin.kubeconfig"),
        nodes,
        "hollow",
        &["--cpu", "32", "--memory", "256Gi"],
    )?;
    let registered_s = t.elapsed().as_secs_f64();
    let rss_nodes = proc_status(pid, "VmRSS:");
    eprintln!("scheduler-bench: basic, {pods} pods");
    let make: Arc<dyn Fn(usize) -> Value + Send + Sync> = Arc::new(|i| small_pod(i, "basic"));
    let mut run = run_scenario(&client, &raw, "basic", "basic", pods, make, pid).await?;
    // Settle (hollow nodes report the pods Running), then the memory figures.
    tokio::time::sleep(Duration::from_secs(10)).await;
    run["rss_mib"] = json!({
        "with_nodes_only": rss_nodes as f64 / 1024.0,
        "peak": proc_status(pid, "VmHWM:") as f64 / 1024.0,
        "after": proc_status(pid, "VmRSS:") as f64 / 1024.0,
    });
    run["nodes"] = json!(nodes);
    run["hollow_nodes_registered_s"] = json!(registered_s);
    // Idle: pods that never fit must cost nothing while nothing changes.
    eprintln!("scheduler-bench: idle with 1000 unschedulable pods");
    let make: Arc<dyn Fn(usize) -> Value + Send + Sync> = Arc::new(|i| {
        json!({"metadata": {"name": format!("huge-{i}")},
               "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1000"}}}]}})
    });
    create_namespace(&client, "idle").await?;
    create_pods(&raw, "idle", 1000, make).await?;
    let pods_api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "idle");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let list = pods_api.list(&ListParams::default()).await?;
        let failed = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False"))
            })
            .count();
        if failed == 1000 {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {failed}/1000 pods reported unschedulable");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (c0, h0) = (cpu_seconds(pid), cpu_seconds(hollow.pid()));
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (c1, h1) = (cpu_seconds(pid), cpu_seconds(hollow.pid()));
    run["idle_with_1000_unschedulable_pods"] = json!({
        "window_s": 30,
        "control_plane_cpu_percent": (c1 - c0) / 30.0 * 100.0,
        "hollow_nodes_cpu_percent": (h1 - h0) / 30.0 * 100.0,
        "note": "the control plane also serves the hollow nodes' lease renewals (nodes/10 per second) in this window",
    });
    drop(hollow);
    drop(server);
    Ok(run)
}

async fn affinity(bin: &Path, dir: &Path, nodes: usize) -> Result<Value> {
    let server = ServerProcess::spawn(bin, dir, &LARGE_CLUSTER_ARGS)?;
    let pid = server.pid();
    let client = client_of(dir).await?;
    let raw = Raw::new(dir, server.port)?;
    let zones = 10;
    let mut hollow = Vec::new();
    for z in 0..zones {
        let labels = format!("topology.kubernetes.io/zone=zone-{z}");
        hollow.push(HollowProcess::spawn(
            bin,
            &dir.join("admin.kubeconfig"),
            nodes / zones,
            &format!("z{z}"),
            &["--labels", &labels],
        )?);
    }
    eprintln!("scheduler-bench: affinity and spread, {nodes} pods on {nodes} nodes");
    let make: Arc<dyn Fn(usize) -> Value + Send + Sync> = Arc::new(|i| {
        json!({"metadata": {"name": format!("spread-{i}"), "labels": {"app": "spread"}},
               "spec": {
                 "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                     "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "spread"}}}],
                 "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"labelSelector": {"matchLabels": {"app": "spread"}}, "topologyKey": "kubernetes.io/hostname"}]}},
                 "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})
    });
    let mut run = run_scenario(&client, &raw, "spread", "spread", nodes, make, pid).await?;
    // Every node got exactly one pod and every zone the same number.
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "spread");
    let list = pods.list(&ListParams::default()).await?;
    let mut per_node: HashMap<String, usize> = HashMap::new();
    for p in &list.items {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *per_node.entry(n).or_default() += 1;
        }
    }
    let max_per_node = per_node.values().max().copied().unwrap_or(0);
    let mut per_zone: HashMap<String, usize> = HashMap::new();
    for n in per_node.keys() {
        let zone = n.split('-').next().unwrap_or_default().to_string();
        *per_zone.entry(zone).or_default() += 1;
    }
    let (zmin, zmax) = (
        per_zone.values().min().copied().unwrap_or(0),
        per_zone.values().max().copied().unwrap_or(0),
    );
    run["nodes"] = json!(nodes);
    run["check"] = json!({"max_pods_per_node": max_per_node, "zone_skew": zmax - zmin});
    if max_per_node != 1 || zmax - zmin > 1 {
        bail!("anti-affinity or spread violated: {}", run["check"]);
    }
    run["rss_mib_peak"] = json!(proc_status(pid, "VmHWM:") as f64 / 1024.0);
    drop(hollow);
    drop(server);
    Ok(run)
}
