//! `api-bench OUT.json`: the API server benchmark. Side by side in one run:
//! - the embedded store's own durable-write floor (64 concurrent in-process writers, fsync-bound
//!   group commit, no HTTP),
//! - etcd 3.4 (Debian's etcd-server, on loopback) doing the same puts through its v3 JSON gateway,
//! - our API server (a `controlplane serve` process): create, get, list throughput and latency
//!   with 64 concurrent clients (creates also as a user RBAC authorizes through one of 100
//!   RoleBindings, and the authorizer's in-process decisions/s); watch delivery latency with 1,000 watchers; RSS idle and with
//!   10,000 pods stored;
//! - a full list (no `limit`) of 150,000 pods from a second server (`--no-scheduler`, its store
//!   filled before it starts with copies of a pod the first server created): time to the last
//!   byte, and the server's RSS before, during (the peak, sampled every 5 ms) and after.
//!
//! `API_BENCH_SERVER=PATH` runs another `controlplane` binary (e.g. an older build) as the server.
//!
//! Absolute numbers on shared machines are noise; the ratios are the figures.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use transport::client::HttpClient;

use controlplane::process::{EtcdProcess, ServerProcess};
use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};
use controlplane::storage::{Store, Write};
use serde::Deserialize;

/// The API server alone: the scheduler and the controllers would otherwise act on the
/// benchmark's pods (10,240 pending pods are 10,240 scheduling attempts, status writes and
/// events) and the figures would not be the API's.
const API_ONLY: &[&str] = &["--no-scheduler", "--no-controllers"];

const CLIENTS: usize = 64;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx.min(v.len() - 1)]
}

fn summary(ops: usize, elapsed: Duration, lat_ms: &mut [f64]) -> Value {
    json!({
        "ops": ops,
        "ops_per_s": (ops as f64 / elapsed.as_secs_f64()).round(),
        "p50_ms": (percentile(lat_ms, 0.50) * 1000.0).round() / 1000.0,
        "p99_ms": (percentile(lat_ms, 0.99) * 1000.0).round() / 1000.0,
    })
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The API server under test, reached through the workspace's pooled HTTP client (TLS with the
/// admin client certificate): concurrent callers get a connection each.
#[derive(Clone)]
struct Target {
    base: String,
    client: HttpClient<Full<Bytes>>,
    /// The `Accept` header of every request.
    accept: &'static str,
    /// An `Impersonate-User` header (the admin client acting as a user RBAC authorizes).
    impersonate: Option<&'static str>,
}

/// What client-go sends with the protobuf content type.
const PROTOBUF_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

impl Target {
    fn new(addr: &str, pki: &Path) -> Result<Self> {
        let read = |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("reading {f}"));
        let (ca, cert, key) = (read("ca.crt")?, read("admin.crt")?, read("admin.key")?);
        let tls = transport::tls::client_config(transport::tls::ServerAuth::Ca(&ca), Some((&cert, &key)))?;
        Ok(Self {
            base: format!("https://{addr}"),
            client: transport::client::http_client(Some(Arc::new(tls)))?,
            accept: "application/json",
            impersonate: None,
        })
    }

    /// The same server, acting as `user`.
    fn impersonating(&self, user: &'static str) -> Self {
        Self {
            impersonate: Some(user),
            ..self.clone()
        }
    }

    /// The same server, asked for protobuf answers.
    fn protobuf(&self) -> Self {
        Self {
            accept: PROTOBUF_ACCEPT,
            ..self.clone()
        }
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<hyper::Request<Full<Bytes>>> {
        let mut req = hyper::Request::builder();
        if let Some(user) = self.impersonate {
            req = req.header("impersonate-user", user);
        }
        Ok(req
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header("accept", self.accept)
            .body(Full::new(
                body.map(|b| Bytes::from(b.to_string())).unwrap_or_default(),
            ))?)
    }

    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Bytes)> {
        let resp = self.client.request(self.request(method, path, body)?).await?;
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((code, bytes))
    }
}

/// Runs `per_client` requests on each of [`CLIENTS`] connections; `make` builds request i of client c.
async fn load<F>(target: &Target, per_client: usize, make: F) -> Result<Value>
where
    F: Fn(usize, usize) -> (&'static str, String, Option<Value>) + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let target = target.clone();
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let (m, p, b) = make(c, i);
                let t = Instant::now();
                let (code, body) = target.call(m, &p, b.as_ref()).await?;
                if code >= 300 {
                    bail!("{m} {p}: HTTP {code}: {}", String::from_utf8_lossy(&body));
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = t0.elapsed();
    Ok(summary(all.len(), elapsed, &mut all))
}

async fn store_floor(dir: &Path, total: usize) -> Result<Value> {
    let store = Arc::new(EmbeddedStore::open(EmbeddedConfig::new(dir))?);
    let value = vec![b'x'; 600];
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let store = store.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for i in 0..total / CLIENTS {
                let t = Instant::now();
                store
                    .write(Write::Create {
                        key: format!("/floor/{c}/{i}"),
                        value: value.clone().into(),
                    })
                    .await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(summary(all.len(), t0.elapsed(), &mut all))
}

async fn etcd_puts(dir: &Path, total: usize) -> Result<Value> {
    let etcd = EtcdProcess::spawn(dir)
        .context("starting etcd (apt-get install etcd-server; ./build.sh setup does)")?;
    let target = Target {
        base: etcd.endpoint.trim_end_matches('/').to_string(),
        client: transport::client::http_client(None)?,
        accept: "application/json",
        impersonate: None,
    };
    let t0 = Instant::now();
    loop {
        if let Ok((200, _)) = target.call("GET", "/health", None).await {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("etcd did not become healthy");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let value = b64(&"x".repeat(600));
    load(&target, total / CLIENTS, move |c, i| {
        (
            "POST",
            "/v3/kv/put".to_string(),
            Some(json!({ "key": b64(&format!("/bench/{c}/{i}")), "value": value })),
        )
    })
    .await
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "bench"}},
           "spec": {"containers": [{"name": "c", "image": "registry.example/bench:1.0",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})
}

/// The `sent_ns` value in a watch event line (`..."sent_ns":"<digits>"...`).
fn sent_ns(line: &[u8]) -> Option<u128> {
    const KEY: &[u8] = b"\"sent_ns\":\"";
    let start = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = line[start..].iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&line[start..start + len]).ok()?.parse().ok()
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

async fn watch_latency(target: &Target, watchers: usize, events: usize) -> Result<Value> {
    // Each watcher streams the namespace; each event's object carries its send time.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<f64>();
    let mut handles = Vec::new();
    for _ in 0..watchers {
        let target = target.clone();
        let tx = tx.clone();
        let req = target.request(
            "GET",
            "/api/v1/namespaces/watch/configmaps?watch=true&resourceVersion=0&timeoutSeconds=120",
            None,
        )?;
        let resp = target.client.request(req).await?;
        handles.push(tokio::spawn(async move {
            let mut body = resp.into_body();
            let mut buf = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else { continue };
                buf.extend_from_slice(&data);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    // The harness shares the machine's two cores with the server: it finds the
                    // send time with a substring search instead of decoding every event.
                    if let Some(sent) = sent_ns(&line) {
                        let _ = tx.send((now_ns().saturating_sub(sent)) as f64 / 1e6);
                    }
                }
            }
        }));
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..events {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("w{i}")},
                        "data": {"sent_ns": now_ns().to_string()}});
        target
            .call("POST", "/api/v1/namespaces/watch/configmaps", Some(&cm))
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut lat = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lat.len() < watchers * events && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(ms)) => lat.push(ms),
            _ => break,
        }
    }
    for h in handles {
        h.abort();
    }
    let delivered = lat.len();
    Ok(json!({
        "watchers": watchers, "events": events, "deliveries": delivered, "expected": watchers * events,
        "p50_ms": (percentile(&mut lat, 0.5) * 1000.0).round() / 1000.0,
        "p99_ms": (percentile(&mut lat, 0.99) * 1000.0).round() / 1000.0,
    }))
}

/// Fills `dir/store` (a server's data directory, before the server starts) with `n` copies of
/// `template` (a pod as the API server stored it) named `full-<i>` in namespace `ns`, bound to a
/// node so that no scheduler takes them up.
async fn fill_store(dir: &Path, template: &Value, ns: &str, n: usize) -> Result<()> {
    let store = Arc::new(EmbeddedStore::open(EmbeddedConfig::new(dir.join("store")))?);
    let mut pod = template.clone();
    if let Some(meta) = pod["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.insert("namespace".into(), json!(ns));
    }
    pod["spec"]["nodeName"] = json!("bench-node");
    let pod = Arc::new(pod);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (store, pod) = (store.clone(), pod.clone());
        let ns = ns.to_string();
        tasks.push(tokio::spawn(async move {
            for i in (c..n).step_by(CLIENTS) {
                let name = format!("full-{i:06}");
                let mut p = (*pod).clone();
                p["metadata"]["name"] = json!(name);
                p["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{i:012}"));
                store
                    .write(Write::Create {
                        key: format!("/registry/core/pods/{ns}/{name}"),
                        value: serde_json::to_vec(&p)?.into(),
                    })
                    .await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    store.close();
    Ok(())
}

/// The peak RSS of `pid` while `until` is not set, sampled every 5 ms.
fn sample_peak_rss(pid: u32, until: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !until.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(rss_kib(pid));
            std::thread::sleep(Duration::from_millis(5));
        }
        peak.max(rss_kib(pid))
    })
}

/// A list answer's items, counted without keeping them.
#[derive(Deserialize)]
struct ListShape {
    items: Vec<serde::de::IgnoredAny>,
    metadata: ListMeta,
}

#[derive(Deserialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

/// A full list of `n` pods from a server whose store was filled before it started.
async fn full_list(server_bin: &Path, dir: &Path, template: &Value, n: usize) -> Result<Value> {
    eprintln!("api-bench: full list: storing {n} pods");
    fill_store(dir, template, "full", n).await?;
    let server = ServerProcess::spawn(server_bin, dir, API_ONLY)?;
    let pid = server.pid();
    let target = Target::new(&server.addr(), &dir.join("pki"))?;
    // The server answers once its store is loaded; let its start settle.
    target.call("GET", "/api/v1/namespaces/default", None).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = rss_kib(pid);
    let mut runs = Vec::new();
    let mut peak = 0;
    let mut bytes = 0;
    for _ in 0..3 {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = sample_peak_rss(pid, done.clone());
        let t = Instant::now();
        let (code, body) = target.call("GET", "/api/v1/namespaces/full/pods", None).await?;
        let elapsed = t.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        peak = peak.max(
            sampler
                .join()
                .map_err(|_| anyhow::anyhow!("RSS sampler panicked"))?,
        );
        if code != 200 {
            bail!(
                "full list: HTTP {code}: {}",
                String::from_utf8_lossy(&body[..body.len().min(500)])
            );
        }
        let list: ListShape = serde_json::from_slice(&body).context("the full list does not parse")?;
        if list.items.len() != n || list.metadata.resource_version.is_empty() {
            bail!("full list: {} items, expected {n}", list.items.len());
        }
        bytes = body.len();
        runs.push(elapsed.as_secs_f64());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = rss_kib(pid);
    runs.sort_by(|a, b| a.total_cmp(b));
    // Once in protobuf (its length comes first: every item is encoded twice).
    let proto = target.protobuf();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_peak_rss(pid, done.clone());
    let t = Instant::now();
    let (code, body) = proto.call("GET", "/api/v1/namespaces/full/pods", None).await?;
    let proto_s = t.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let proto_peak = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("RSS sampler panicked"))?;
    if code != 200 || !body.starts_with(b"k8s\0") {
        bail!("protobuf full list: HTTP {code}, {} bytes", body.len());
    }
    Ok(json!({
        "pods": n,
        "response_bytes": bytes,
        "seconds": runs.iter().map(|s| (s * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        "median_s": (runs[runs.len() / 2] * 1000.0).round() / 1000.0,
        "rss_kib": { "before": before, "peak_during": peak, "after": after },
        "protobuf": { "seconds": (proto_s * 1000.0).round() / 1000.0, "response_bytes": body.len(),
                      "rss_kib_peak_during": proto_peak },
    }))
}

fn main() -> Result<()> {
    let out = PathBuf::from(std::env::args().nth(1).context("usage: api-bench OUT.json")?);
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let (writes, pods) = if quick { (3_200, 3_200) } else { (10_240, 10_240) };
    let full_pods = if quick { 30_000 } else { 150_000 };
    let server_bin = match std::env::var_os("API_BENCH_SERVER") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?.with_file_name("controlplane"),
    };
    let tmp = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let results = rt.block_on(async {
        eprintln!("api-bench: store floor ({writes} durable writes, {CLIENTS} writers)");
        let floor = store_floor(&tmp.path().join("floor"), writes).await?;
        eprintln!("api-bench: etcd 3.4 puts");
        let etcd = etcd_puts(&tmp.path().join("etcd"), writes).await?;
        let server = ServerProcess::spawn(&server_bin, &tmp.path().join("cp"), API_ONLY)?;
        let (pid, addr) = (server.pid(), server.addr());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle_rss = rss_kib(pid);
        let target = Target::new(&addr, &tmp.path().join("cp/pki"))?;
        // Without controllers nobody makes the namespaces' `default` ServiceAccount, which
        // ServiceAccount admission wants before a pod is created: made here.
        for ns in ["bench", "watch", "bench-rbac"] {
            target.call("POST", "/api/v1/namespaces", Some(&json!({"metadata": {"name": ns}}))).await?;
            let sa = json!({"metadata": {"name": "default"}});
            target.call("POST", &format!("/api/v1/namespaces/{ns}/serviceaccounts"), Some(&sa)).await?;
        }
        eprintln!("api-bench: API creates ({writes} pods)");
        let per = writes / CLIENTS;
        let creates = load(&target, per, |c, i| {
            ("POST", "/api/v1/namespaces/bench/pods".to_string(), Some(pod(&format!("p-{c}-{i}"))))
        })
        .await?;
        // The same creates by a user RBAC authorizes through a RoleBinding among 10 Roles and
        // 100 RoleBindings of its namespace (the admin run above is system:masters, which skips
        // RBAC).
        eprintln!("api-bench: API creates with RBAC ({writes} pods, 10 Roles, 100 RoleBindings)");
        let rbac_base = "/apis/rbac.authorization.k8s.io/v1/namespaces/bench-rbac";
        for i in 0..10 {
            let role = json!({"metadata": {"name": format!("role-{i}")},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}]});
            target.call("POST", &format!("{rbac_base}/roles"), Some(&role)).await?;
        }
        for i in 0..100 {
            let rb = json!({"metadata": {"name": format!("binding-{i}")},
                "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("bench-user-{i}")}],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("role-{}", i % 10)}});
            target.call("POST", &format!("{rbac_base}/rolebindings"), Some(&rb)).await?;
        }
        let rbac_creates = load(&target.impersonating("bench-user-99"), per, |c, i| {
            ("POST", "/api/v1/namespaces/bench-rbac/pods".to_string(), Some(pod(&format!("r-{c}-{i}"))))
        })
        .await?;
        eprintln!("api-bench: authorizer decisions in process");
        let decisions = controlplane::api::authorizer_decisions_per_second(if quick { 100_000 } else { 1_000_000 });
        eprintln!("api-bench: API gets");
        let gets = load(&target, per, move |c, i| {
            ("GET", format!("/api/v1/namespaces/bench/pods/p-{c}-{}", (i * 7) % per), None)
        })
        .await?;
        eprintln!("api-bench: API lists (limit=100)");
        let lists = load(&target, 50, |_, _| ("GET", "/api/v1/namespaces/bench/pods?limit=100".to_string(), None)).await?;
        eprintln!("api-bench: API lists (limit=100, protobuf)");
        let proto_lists = load(&target.protobuf(), 50, |_, _| {
            ("GET", "/api/v1/namespaces/bench/pods?limit=100".to_string(), None)
        })
        .await?;
        eprintln!("api-bench: watch delivery (1000 watchers)");
        let watch = watch_latency(&target, 1000, 20).await?;
        // Fill up to `pods` pods for the RSS figure.
        let stored_already = 2 * writes;
        if pods > stored_already {
            let extra = (pods - stored_already).div_ceil(CLIENTS);
            load(&target, extra, |c, i| ("POST", "/api/v1/namespaces/bench/pods".to_string(), Some(pod(&format!("q-{c}-{i}")))))
                .await?;
        }
        let stored = stored_already.max(pods);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let loaded_rss = rss_kib(pid);
        let (_, template) = target.call("GET", "/api/v1/namespaces/bench/pods/p-0-0", None).await?;
        let template: Value = serde_json::from_slice(&template)?;
        drop(server);
        let full = full_list(&server_bin, &tmp.path().join("full"), &template, full_pods).await?;
        let create_rate = creates["ops_per_s"].as_f64().unwrap_or(0.0);
        let rbac_rate = rbac_creates["ops_per_s"].as_f64().unwrap_or(0.0);
        Ok::<_, anyhow::Error>(json!({
            "benchmark": "api",
            "clients": CLIENTS,
            "store_floor_durable_writes": floor,
            "etcd_3_4_puts": etcd,
            "api_create_pods": creates,
            "api_create_pods_rbac": rbac_creates,
            "authorizer_decisions_per_s": decisions.round(),
            "api_get_pods": gets,
            "api_list_pods_limit_100": lists,
            "api_list_pods_limit_100_protobuf": proto_lists,
            "api_full_list": full,
            "watch_delivery": watch,
            "rss_kib": { "idle": idle_rss, "with_pods": loaded_rss, "pods_stored": stored },
            "ratios": {
                "create_vs_store_floor": create_rate / floor["ops_per_s"].as_f64().unwrap_or(f64::NAN),
                "create_vs_etcd_puts": create_rate / etcd["ops_per_s"].as_f64().unwrap_or(f64::NAN),
                "create_rbac_vs_without": rbac_rate / create_rate,
            },
            "targets": { "list_limit_100_per_s_min": 2000, "full_list_150k_s_max": 2.0,
                         "create_vs_store_floor_min": 0.5, "create_vs_etcd_puts_min": 1.0, "create_p99_ms_max": 50,
                         "watch_p99_ms_max": 10, "idle_rss_kib_max": 40 * 1024,
                         "create_rbac_vs_without_min": 0.9 },
        }))
    })?;
    std::fs::write(&out, serde_json::to_string_pretty(&results)?)?;
    println!("{}", serde_json::to_string_pretty(&results)?);
    Ok(())
}
