//! `controlplane serve --data-dir DIR [--listen ADDR]`: the API server on its embedded store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use controlplane::api::{Api, Caller};
use controlplane::pki::Pki;
use controlplane::server;
use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if args.first().map(String::as_str) != Some("serve") {
        bail!(
            "usage: controlplane serve --data-dir DIR [--listen ADDR (default 127.0.0.1:6443)] [--san NAME_OR_IP]... [--etcd http://HOST:PORT]"
        );
    }
    let data_dir = PathBuf::from(value("--data-dir").context("--data-dir is required")?);
    let listen: SocketAddr = value("--listen")
        .unwrap_or_else(|| "127.0.0.1:6443".into())
        .parse()
        .context("--listen")?;
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    // --san NAME_OR_IP (repeatable): extra serving-certificate names, e.g. the address nodes dial.
    for (i, a) in args.iter().enumerate() {
        if a == "--san" {
            sans.push(args.get(i + 1).cloned().context("--san needs a value")?);
        }
    }
    if !listen.ip().is_unspecified() && !sans.contains(&listen.ip().to_string()) {
        sans.push(listen.ip().to_string());
    }
    let pki = Arc::new(Pki::load_or_create(&data_dir.join("pki"), &sans).context("cluster PKI")?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // --etcd http://HOST:PORT: several API servers share one etcd; otherwise the embedded store.
        let store: Arc<dyn controlplane::storage::Store> = match value("--etcd") {
            Some(url) => Arc::new(controlplane::storage::etcd::EtcdStore::new(&url).context("--etcd")?),
            None => Arc::new(
                EmbeddedStore::open(EmbeddedConfig::new(data_dir.join("store")))
                    .context("opening the store")?,
            ),
        };
        let api = Api::new(store, pki.ca_pem.clone()).with_signer(pki.clone());
        api.bootstrap()
            .await
            .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        let kubeconfig = pki.write_kubeconfig(&data_dir, addr)?;
        let mut tokens = server::Tokens::new();
        tokens.insert(
            pki.admin_token.clone(),
            Caller {
                user: "admin".into(),
                groups: vec!["system:masters".into()],
            },
        );
        // The node bootstrap token: it may only ask for a kubelet client certificate (enforced by
        // the CSR signer; RBAC is not enforced yet).
        tokens.insert(
            pki.bootstrap_token.clone(),
            Caller {
                user: format!("system:bootstrap:{}", pki.bootstrap_token_id()),
                groups: vec!["system:bootstrappers".into(), "system:authenticated".into()],
            },
        );
        tracing::info!(listen = %addr, kubeconfig = %kubeconfig.display(), "serving");
        println!(
            "controlplane: serving on https://{addr} (kubeconfig {})",
            kubeconfig.display()
        );
        match server::serve(api, listener, server::tls_config(&pki)?, tokens).await {}
    })
}
