//! `controllers-bench OUT.json`: the controllers benchmark, through our API server with the
//! scheduler and the controllers in process and hollow nodes (no VMs), in one run:
//! - **deployment**: with 1,000 nodes, a 3,000-replica Deployment applied, until 3,000 pods are
//!   Ready (the hollow nodes report them Running and Ready once bound), then a rolling update
//!   of its image until every replica is updated and ready;
//! - **namespace**: a namespace holding 10,000 ConfigMaps deleted, until it is gone;
//! - the control plane's CPU seconds per phase and its RSS (peak and after).
//!
//! Sizes are overridable for quick runs: `BENCH_NODES`, `BENCH_REPLICAS`, `BENCH_OBJECTS`.
//! Absolute numbers on shared machines are noise; the ratios against the targets are the figures.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use controlplane::process::{HollowProcess, LARGE_CLUSTER_ARGS, ServerProcess, cpu_seconds, proc_status};

/// How long one phase may take before the benchmark gives up.
const PHASE_LIMIT: Duration = Duration::from_secs(600);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn deployment(replicas: usize, image: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "bench"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image,
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
            }
        }
    }))?)
}

/// Polls the Deployment until `done` holds for its status; returns the seconds it took.
async fn wait_deployment(
    api: &kube::Api<Deployment>,
    t0: Instant,
    what: &str,
    done: impl Fn(&Deployment) -> bool,
) -> Result<f64> {
    loop {
        let d = api.get("web").await?;
        if done(&d) {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > PHASE_LIMIT {
            bail!("{what}: not done after {PHASE_LIMIT:?}: {:?}", d.status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn counts(d: &Deployment) -> (i32, i32, i32, i32) {
    let st = d.status.clone().unwrap_or_default();
    (
        st.replicas.unwrap_or(0),
        st.updated_replicas.unwrap_or(0),
        st.ready_replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0),
    )
}

async fn deployment_phase(client: &kube::Client, pid: u32, replicas: usize) -> Result<Value> {
    let api: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), "bench");
    let want = i32::try_from(replicas)?;
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    api.create(&PostParams::default(), &deployment(replicas, "busybox:1")?)
        .await?;
    let ready_s = wait_deployment(&api, t0, "create", |d| {
        let (_, updated, ready, _) = counts(d);
        updated == want && ready == want
    })
    .await?;
    let create_cpu = cpu_seconds(pid) - cpu0;
    eprintln!("controllers-bench: {replicas} replicas ready in {ready_s:.1} s");

    let cpu1 = cpu_seconds(pid);
    let t1 = Instant::now();
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "busybox:2"}]}}}});
    let patched = api
        .patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    let generation = patched.metadata.generation.unwrap_or(0);
    let rolled_s = wait_deployment(&api, t1, "rolling update", |d| {
        let (total, updated, ready, available) = counts(d);
        d.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
            && total == want
            && updated == want
            && ready == want
            && available == want
    })
    .await?;
    eprintln!("controllers-bench: rolling update done in {rolled_s:.1} s");
    Ok(json!({
        "replicas": replicas,
        "apply_to_all_ready_s": ready_s,
        "pods_ready_per_s": replicas as f64 / ready_s,
        "create_control_plane_cpu_s": create_cpu,
        "rolling_update_s": rolled_s,
        "rolling_update_control_plane_cpu_s": cpu_seconds(pid) - cpu1,
    }))
}

async fn namespace_phase(client: &kube::Client, pid: u32, objects: usize) -> Result<Value> {
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "bulk"}}))?,
        )
        .await?;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "bulk");
    let t = Instant::now();
    let results: Vec<Result<ConfigMap, kube::Error>> = futures::stream::iter(0..objects)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("cm-{i}")}, "data": {"k": "v"}}))
                .map_err(kube::Error::SerdeError)?;
                cms.create(&PostParams::default(), &cm).await
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        bail!("creating the ConfigMaps: {e}");
    }
    let fill_s = t.elapsed().as_secs_f64();
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    namespaces.delete("bulk", &DeleteParams::default()).await?;
    loop {
        if namespaces.get_opt("bulk").await?.is_none() {
            break;
        }
        if t0.elapsed() > PHASE_LIMIT {
            bail!("namespace bulk still there after {PHASE_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone_s = t0.elapsed().as_secs_f64();
    eprintln!("controllers-bench: namespace with {objects} objects gone in {gone_s:.1} s");
    Ok(json!({
        "objects": objects,
        "fill_s": fill_s,
        "delete_to_gone_s": gone_s,
        "control_plane_cpu_s": cpu_seconds(pid) - cpu0,
    }))
}

fn main() -> Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: controllers-bench OUT.json")?,
    );
    let nodes = env_usize("BENCH_NODES", 1_000);
    let replicas = env_usize("BENCH_REPLICAS", 3_000);
    let objects = env_usize("BENCH_OBJECTS", 10_000);
    let bin = std::env::current_exe()?.with_file_name("controlplane");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let results = rt.block_on(async {
        let tmp = tempfile::tempdir()?;
        let server = ServerProcess::spawn(&bin, tmp.path(), &LARGE_CLUSTER_ARGS)?;
        let pid = server.pid();
        let kubeconfig = tmp.path().join("admin.kubeconfig");
        let client = transport::kubeapi::from_kubeconfig(&kubeconfig, "controllers-bench").await?;
        eprintln!("controllers-bench: registering {nodes} hollow nodes");
        let _hollow = HollowProcess::spawn(&bin, &kubeconfig, nodes, "node", &[])?;
        let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "bench"}}))?,
            )
            .await?;
        let rss_nodes = proc_status(pid, "VmRSS:");
        let deployment = deployment_phase(&client, pid, replicas).await?;
        let namespace = namespace_phase(&client, pid, objects).await?;
        Ok::<_, anyhow::Error>(json!({
            "benchmark": "controllers",
            "nodes": nodes,
            "deployment": deployment,
            "namespace_deletion": namespace,
            "rss_mib": {
                "with_nodes_only": rss_nodes as f64 / 1024.0,
                "peak": proc_status(pid, "VmHWM:") as f64 / 1024.0,
                "after": proc_status(pid, "VmRSS:") as f64 / 1024.0,
            },
            "targets": {"apply_to_all_ready_s_max": 30},
            "bounds": "no client-side rate limit: the controllers write through the in-process transport; creation is bounded by the ReplicaSet controller's slow start (batches of 1, 2, 4, ..., at most 500 pods per sync, as upstream) and the API server's write path",
        }))
    })?;
    std::fs::write(&out, serde_json::to_string_pretty(&results)?)?;
    println!("{}", serde_json::to_string_pretty(&results)?);
    Ok(())
}
