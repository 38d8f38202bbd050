//! The API server's streams to node agents (issue 13, item 2): agents get serving certificates
//! through `kubernetes.io/kubelet-serving` CSRs, approved automatically only for a node's own
//! name and reported addresses; `kubectl certificate approve` needs `approve` on the signer;
//! the API server reaches an agent only if it presents the cluster's certificate for that node's
//! name (a forged endpoint gets no request), and authenticates as `kube-apiserver-kubelet-client`,
//! which holds nothing beyond `system:kubelet-api-admin`.

use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use controlplane::pki::Pki;
use controlplane::process::TestCluster;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use transport::kubeapi::Credentials;
use transport::tls::SwappableCert;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

/// A key and a CSR (PEM) for node `node` with `names` as SANs.
fn node_csr(node: &str, names: &[&str]) -> (rcgen::KeyPair, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    controlplane::pki::node_csr(node, &names).expect("csr")
}

/// Creates a kubelet-serving CSR as `client`; returns its name.
async fn serving_csr(client: &kube::Client, csr_pem: &str) -> String {
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"generateName": "serving-"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr_pem),
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "key encipherment", "server auth"],
        },
    }))
    .expect("csr");
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .expect("create csr");
    created.metadata.name.expect("name")
}

/// The certificate PEM of CSR `name` (empty while it has none).
fn certificate(c: &TestCluster, name: &str) -> String {
    let b64 = c.jsonpath(&["csr", name], "{.status.certificate}");
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .expect("base64"),
    )
    .expect("utf-8")
}

/// A fake agent: answers every request with one log line and records who asked for what.
struct FakeAgent {
    port: u16,
    cert: Arc<SwappableCert>,
    requests: Arc<AtomicUsize>,
    callers: Arc<Mutex<Vec<String>>>,
}

/// Starts a fake agent serving `cert`, verifying client certificates against `ca_pem`.
async fn fake_agent(cert: SwappableCert, ca_pem: &str) -> FakeAgent {
    let cert = Arc::new(cert);
    let tls = transport::tls::server_config_with(cert.clone(), Some(ca_pem)).expect("tls");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let requests = Arc::new(AtomicUsize::new(0));
    let callers = Arc::new(Mutex::new(Vec::new()));
    let (r, who) = (requests.clone(), callers.clone());
    tokio::spawn(async move {
        let serve = transport::server::serve(
            listener,
            Arc::new(tls),
            transport::server::Limits::default(),
            move |peer, req: hyper::Request<hyper::body::Incoming>| {
                let (r, who) = (r.clone(), who.clone());
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    let id = peer
                        .identity
                        .as_ref()
                        .map(|i| format!("{} {:?}", i.user, i.groups));
                    let target = req
                        .uri()
                        .path_and_query()
                        .map(|p| p.to_string())
                        .unwrap_or_default();
                    who.lock()
                        .expect("lock")
                        .push(format!("{} {target}", id.unwrap_or_default()));
                    hyper::Response::new(transport::body::full("fake-log-line\n"))
                }
            },
        );
        match serve.await {}
    });
    FakeAgent {
        port,
        cert,
        requests,
        callers,
    }
}

#[test]
fn agents_are_reached_only_with_the_nodes_own_serving_certificate() {
    let c = TestCluster::start(bin(), &[], &[]);
    let pki_dir = c.dir.path().join("pki");
    let pki = Pki::load_or_create(&pki_dir, &[]).expect("pki");
    let server = format!("https://{}", c.server.as_ref().expect("server").addr());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _guard = rt.enter();

    // Node n1's client identity, as TLS bootstrap would give it.
    let (key, csr) = node_csr("n1", &[]);
    let cert = pki.sign_node_csr(&csr).expect("node cert");
    let n1 = transport::kubeapi::client(
        &server,
        &pki.ca_pem,
        Credentials::Certificate {
            cert_pem: cert,
            key_pem: key.serialize_pem(),
        },
        "kubelet/test",
    )
    .expect("client");

    // The fake agent starts with a self-signed certificate for the right name.
    let self_key = rcgen::KeyPair::generate().expect("key");
    let self_signed = rcgen::CertificateParams::new(vec!["n1".to_string()])
        .and_then(|p| p.self_signed(&self_key))
        .expect("self-signed");
    let agent = rt.block_on(fake_agent(
        SwappableCert::new(&self_signed.pem(), &self_key.serialize_pem()).expect("cert"),
        &pki.ca_pem,
    ));

    // n1 registers with a loopback address and its endpoint.
    rt.block_on(async {
        let nodes: kube::Api<Node> = kube::Api::all(n1.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "annotations": {"nodeos.dev/kubelet-endpoint": format!("127.0.0.1:{}", agent.port)}},
        }))
        .expect("node");
        nodes.create(&PostParams::default(), &node).await.expect("create node");
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": "n1"}]}});
        nodes
            .patch_status("n1", &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("node status");
    });

    // Auto-approval: its own name and reported address, nothing else.
    let (own_key, own_csr) = node_csr("n1", &["n1", "127.0.0.1"]);
    let own = rt.block_on(serving_csr(&n1, &own_csr));
    assert_eq!(
        c.jsonpath(
            &["csr", &own],
            "{.status.conditions[0].type}/{.status.conditions[0].reason}"
        ),
        "Approved/AutoApproved"
    );
    let own_cert = certificate(&c, &own);
    assert!(own_cert.starts_with("-----BEGIN CERTIFICATE-----"), "{own_cert}");
    let (other_key, other_csr) = node_csr("n2", &["n2"]);
    let other = rt.block_on(serving_csr(&n1, &other_csr));
    let (_, foreign_ip_csr) = node_csr("n1", &["n1", "10.9.9.9"]);
    let foreign_ip = rt.block_on(serving_csr(&n1, &foreign_ip_csr));
    for pending in [&other, &foreign_ip] {
        assert_eq!(
            c.jsonpath(&["csr", pending], "{.status.conditions}"),
            "",
            "{pending} stays pending"
        );
    }
    let table = c.kubectl(&["get", "csr", &foreign_ip, "--no-headers"]);
    assert!(table.contains("Pending"), "{table}");

    // Approving needs `approve` on the signer, not only the approval subresource.
    c.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: csr-updater\nrules:\n\
         - apiGroups: [certificates.k8s.io]\n  resources: [certificatesigningrequests]\n  verbs: [get, list]\n\
         - apiGroups: [certificates.k8s.io]\n  resources: [certificatesigningrequests/approval]\n  verbs: [update]\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: csr-updater\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: csr-updater\n\
         subjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: mallory\n",
    );
    let (ok, _, err) = c.kubectl_result(&["certificate", "approve", &other, "--as=mallory"], None);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "certificatesigningrequests.certificates.k8s.io \"{other}\" is forbidden: user not permitted to approve requests with signerName \"kubernetes.io/kubelet-serving\""
        )),
        "{err}"
    );
    assert_eq!(c.jsonpath(&["csr", &other], "{.status.conditions}"), "");
    // An administrator may approve it; the signer issues it at once.
    c.kubectl(&["certificate", "approve", &other]);
    let other_cert = certificate(&c, &other);
    assert!(
        other_cert.starts_with("-----BEGIN CERTIFICATE-----"),
        "{other_cert}"
    );

    c.apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox\n");

    // Self-signed, then the cluster's certificate for another node: no request reaches it.
    for (cert_pem, key_pem) in [
        (self_signed.pem(), self_key.serialize_pem()),
        (other_cert.clone(), other_key.serialize_pem()),
    ] {
        agent.cert.replace(&cert_pem, &key_pem).expect("swap");
        let (ok, out, err) = c.kubectl_result(&["logs", "p"], None);
        assert!(!ok, "logs through a forged endpoint: {out}");
        assert!(
            err.contains("cannot reach the agent of node n1") && err.contains("invalid peer certificate"),
            "{err}"
        );
    }
    assert_eq!(agent.requests.load(Ordering::SeqCst), 0);

    // The node's own certificate: the request arrives, as the API server's kubelet client.
    agent
        .cert
        .replace(&own_cert, &own_key.serialize_pem())
        .expect("swap");
    assert_eq!(c.kubectl(&["logs", "p"]), "fake-log-line\n");
    assert_eq!(agent.requests.load(Ordering::SeqCst), 1);
    let callers = agent.callers.lock().expect("lock").clone();
    assert_eq!(callers.len(), 1);
    assert!(
        callers[0].starts_with("kube-apiserver-kubelet-client [] /containerLogs/default/p/c"),
        "{callers:?}"
    );

    // The node proxy relays a GET with its path and query, to callers allowed `nodes/proxy`.
    assert_eq!(
        c.kubectl(&["get", "--raw", "/api/v1/nodes/n1/proxy/configz?pretty=1"]),
        "fake-log-line\n"
    );
    assert_eq!(
        agent
            .callers
            .lock()
            .expect("lock")
            .last()
            .cloned()
            .unwrap_or_default(),
        "kube-apiserver-kubelet-client [] /configz?pretty=1"
    );
    let (ok, _, err) = c.kubectl_result(
        &["get", "--raw", "/api/v1/nodes/n1/proxy/configz", "--as=mallory"],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains("nodes \"n1\" is forbidden: User \"mallory\" cannot get resource \"nodes/proxy\""),
        "{err}"
    );
    let (ok, _, err) = c.kubectl_result(&["get", "--raw", "/api/v1/nodes/nope/proxy/configz"], None);
    assert!(!ok && err.contains("NotFound"), "{err}");
    assert_eq!(agent.requests.load(Ordering::SeqCst), 2);

    // That identity may use the kubelet API and nothing else.
    let can = |args: &[&str]| {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        a.push("--as=kube-apiserver-kubelet-client");
        c.kubectl_result(&a, None).1.trim().to_string()
    };
    assert_eq!(can(&["get", "nodes", "--subresource=proxy"]), "yes");
    assert_eq!(can(&["create", "nodes", "--subresource=proxy"]), "yes");
    assert_eq!(can(&["get", "secrets", "-A"]), "no");
    assert_eq!(can(&["create", "pods"]), "no");
}
