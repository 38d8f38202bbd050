//! The workspace's client stack against the API server: a `kube::Client` over the in-process
//! transport ([`InProcess`]) reaches the handler as its component identity and goes through
//! admission like any remote client; the remote stack (`transport::kubeapi`) reaches a real
//! `controlplane serve` over TLS with a bearer token, a client certificate, or a kubeconfig.

use std::sync::Arc;

use controlplane::api::{Api, Caller};
use controlplane::inprocess::InProcess;
use controlplane::process::ServerProcess;
use controlplane::storage::embedded::open_default;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use transport::kubeapi::{self, Credentials};

async fn api(dir: &std::path::Path) -> Api {
    let api = Api::new(Arc::new(open_default(dir).expect("store")), "CA".into());
    api.bootstrap().await.expect("bootstrap");
    api.start_authorization().await.expect("authorization");
    api
}

/// The caller of the in-process client: these tests are about the transport and admission, not
/// authorization, so it is in `system:masters` (the component name still names the field
/// manager).
fn scheduler() -> Caller {
    Caller {
        user: "system:kube-scheduler".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    }
}

#[tokio::test]
async fn kube_client_goes_through_admission_as_its_component() {
    let dir = tempfile::tempdir().expect("tempdir");
    let client = InProcess::new(api(dir.path()).await, scheduler(), "kube-scheduler").client();

    // Admission: a pod created without restartPolicy, dnsPolicy or pull policy comes back defaulted.
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .expect("pod");
    let created = pods.create(&PostParams::default(), &pod).await.expect("create");
    let spec = created.spec.expect("spec");
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(created.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    // The write is recorded under the component's field manager.
    let managers: Vec<String> = created
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, vec!["kube-scheduler".to_string()]);
    assert_eq!(
        pods.list(&ListParams::default()).await.expect("list").items.len(),
        1
    );

    // Authentication: the API records the requester of a CSR; it is the transport's caller.
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(client);
    let csr: CertificateSigningRequest = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c1"},
        "spec": {"request": "", "signerName": "example.com/x", "usages": ["digital signature"]},
    }))
    .expect("csr");
    let created = csrs.create(&PostParams::default(), &csr).await;
    let spec = created.expect("create csr").spec;
    assert_eq!(spec.username.as_deref(), Some("system:kube-scheduler"));
    assert_eq!(
        spec.groups,
        Some(vec![
            "system:masters".to_string(),
            "system:authenticated".to_string()
        ])
    );
}

#[tokio::test]
async fn errors_come_back_as_kube_api_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let client = InProcess::new(api(dir.path()).await, scheduler(), "kube-scheduler").client();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client, "default");
    match pods.get("missing").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.message, "pods \"missing\" not found");
        }
        other => panic!("want a 404, got {other:?}"),
    }
}

#[tokio::test]
async fn remote_clients_reach_a_real_server_with_every_credential() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_controlplane"));
    let server = ServerProcess::spawn(bin, dir.path(), &[]).expect("start controlplane");
    let url = format!("https://{}", server.addr());
    let pki = dir.path().join("pki");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("pki file");
    let ca = read("ca.crt");
    let names = |client: kube::Client| async move {
        let ns: kube::Api<Namespace> = kube::Api::all(client);
        let mut names: Vec<String> = ns
            .list(&ListParams::default())
            .await
            .expect("list namespaces")
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        names.sort();
        names
    };
    let want = vec!["default", "kube-node-lease", "kube-public", "kube-system"];

    let token = kubeapi::client(
        &url,
        &ca,
        Credentials::Bearer(read("admin.token").trim().into()),
        "test/1",
    )
    .expect("token client");
    assert_eq!(names(token).await, want);

    let cert = kubeapi::client(
        &url,
        &ca,
        Credentials::Certificate {
            cert_pem: read("admin.crt"),
            key_pem: read("admin.key"),
        },
        "test/1",
    )
    .expect("certificate client");
    assert_eq!(names(cert).await, want);

    let kubeconfig = kubeapi::from_kubeconfig(&dir.path().join("admin.kubeconfig"), "test/1")
        .await
        .expect("kubeconfig client");
    assert_eq!(names(kubeconfig).await, want);

    // A server whose certificate is not from the given CA is refused by the handshake.
    let other = tempfile::tempdir().expect("tempdir");
    let other_server = ServerProcess::spawn(bin, other.path(), &[]).expect("second controlplane");
    let other_ca = std::fs::read_to_string(other.path().join("pki/ca.crt")).expect("ca");
    drop(other_server);
    let wrong = kubeapi::client(&url, &other_ca, Credentials::Bearer("x".into()), "test/1").expect("client");
    let ns: kube::Api<Namespace> = kube::Api::all(wrong);
    assert!(matches!(ns.list(&ListParams::default()).await, Err(e) if !matches!(e, kube::Error::Api(_))));

    // An unknown token: 401 from the server.
    let bad =
        kubeapi::client(&url, &ca, Credentials::Bearer("not-a-token".into()), "test/1").expect("client");
    let ns: kube::Api<Namespace> = kube::Api::all(bad);
    match ns.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 401),
        other => panic!("want a 401, got {other:?}"),
    }
}

/// A PATCH of `/scale` and a PUT without a resourceVersion carry no precondition: racing
/// writers all succeed (the server retries on a fresh read, as upstream's GuaranteedUpdate
/// does), while a PUT with a stale resourceVersion still gets its 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unconditional_writes_retry_lost_races() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Patch, PatchParams};

    let dir = tempfile::tempdir().expect("tempdir");
    let client = InProcess::new(api(dir.path()).await, scheduler(), "kube-scheduler").client();
    let deployments: kube::Api<Deployment> = kube::Api::namespaced(client, "default");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }))
    .expect("deployment");
    let created = deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create");

    let mut writers = tokio::task::JoinSet::new();
    for w in 0..8 {
        let deployments = deployments.clone();
        writers.spawn(async move {
            for i in 0..10 {
                if w % 2 == 0 {
                    let scale = serde_json::json!({"spec": {"replicas": w * 10 + i}});
                    deployments
                        .patch_scale("web", &PatchParams::default(), &Patch::Merge(&scale))
                        .await
                        .map_err(|e| format!("scale patch {w}/{i}: {e}"))?;
                } else {
                    let mut current = deployments.get("web").await.map_err(|e| e.to_string())?;
                    current.metadata.resource_version = None;
                    current
                        .metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(format!("writer-{w}"), i.to_string());
                    deployments
                        .replace("web", &PostParams::default(), &current)
                        .await
                        .map_err(|e| format!("unconditional put {w}/{i}: {e}"))?;
                }
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer task")
            .expect("every unconditional write succeeds");
    }

    // The stale resourceVersion of the first read is a precondition that fails.
    let stale = deployments
        .replace("web", &PostParams::default(), &created)
        .await
        .expect_err("a PUT with a stale resourceVersion");
    match stale {
        kube::Error::Api(status) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("expected a 409 Status, got {other}"),
    }
}
