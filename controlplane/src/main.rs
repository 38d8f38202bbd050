//! `controlplane`: the bundled control plane and its standalone components.
//!
//! - `serve --data-dir DIR [--listen ADDR]`: the API server on its embedded store (or `--etcd`),
//!   with the scheduler and the controllers in process;
//! - `scheduler --kubeconfig FILE`: the scheduler alone, against any API server;
//! - `controllers --kubeconfig FILE`: the controllers alone, against any API server;
//! - `hollow-nodes --kubeconfig FILE --count N`: simulated nodes for tests and benchmarks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use controlplane::api::{Api, Caller};
use controlplane::controllers::{self, ControllerConfig};
use controlplane::inprocess::InProcess;
use controlplane::pki::Pki;
use controlplane::scheduler::{self, SchedulerConfig};
use controlplane::server;
use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};

#[derive(Debug, Parser)]
#[command(name = "controlplane", about = "The nodeos control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The API server (with the scheduler in process).
    Serve(ServeArgs),
    /// The scheduler alone, against the API server of a kubeconfig.
    Scheduler(SchedulerArgs),
    /// The controllers alone, against the API server of a kubeconfig.
    Controllers(ControllersArgs),
    /// Simulated nodes (no containers) that register, heartbeat and run pods bound to them.
    HollowNodes(controlplane::hollow::HollowArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Where the PKI, the store and admin.kubeconfig live.
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Extra serving-certificate names (e.g. the address nodes dial); repeatable.
    #[arg(long = "san")]
    sans: Vec<String>,
    /// Share one etcd (`http://HOST:PORT`) with other API servers instead of the embedded store.
    #[arg(long)]
    etcd: Option<String>,
    /// Do not run the scheduler in process (e.g. to run another one against this server).
    #[arg(long)]
    no_scheduler: bool,
    /// Do not run the controllers in process.
    #[arg(long)]
    no_controllers: bool,
    #[command(flatten)]
    scheduling: SchedulingArgs,
}

#[derive(Debug, Clone, clap::Args)]
struct SchedulingArgs {
    /// Percentage of nodes to find feasible before scoring (0: adaptive, 50 − nodes/125, ≥ 5).
    #[arg(long, default_value_t = 0)]
    percentage_of_nodes_to_score: u32,
    /// Run without leader election (one scheduler per cluster is then up to you).
    #[arg(long)]
    no_leader_elect: bool,
    /// This instance's name in the Lease (default: `<hostname>_<random>`).
    #[arg(long)]
    identity: Option<String>,
}

impl SchedulingArgs {
    fn config(&self) -> SchedulerConfig {
        let defaults = SchedulerConfig::default();
        SchedulerConfig {
            percentage_of_nodes_to_score: self.percentage_of_nodes_to_score,
            leader_elect: !self.no_leader_elect,
            identity: self.identity.clone().unwrap_or(defaults.identity.clone()),
            ..defaults
        }
    }
}

#[derive(Debug, clap::Args)]
struct ControllersArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Run without leader election.
    #[arg(long)]
    no_leader_elect: bool,
    /// This instance's name in the Lease (default: `<hostname>_<random>`).
    #[arg(long)]
    identity: Option<String>,
}

impl ControllersArgs {
    fn config(&self) -> ControllerConfig {
        let defaults = ControllerConfig::default();
        ControllerConfig {
            leader_elect: !self.no_leader_elect,
            identity: self.identity.clone().unwrap_or(defaults.identity.clone()),
            ..defaults
        }
    }
}

#[derive(Debug, clap::Args)]
struct SchedulerArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    #[command(flatten)]
    scheduling: SchedulingArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.command {
        Command::Serve(args) => rt.block_on(serve(args)),
        Command::Scheduler(args) => rt.block_on(async move {
            let client =
                transport::kubeapi::from_kubeconfig(&args.kubeconfig, "kube-scheduler/v1.32.0 nodeos")
                    .await
                    .context("--kubeconfig")?;
            scheduler::run(client, args.scheduling.config()).await;
            Ok(())
        }),
        Command::Controllers(args) => rt.block_on(async move {
            let client = transport::kubeapi::from_kubeconfig(
                &args.kubeconfig,
                "kube-controller-manager/v1.32.0 nodeos",
            )
            .await
            .context("--kubeconfig")?;
            controllers::run(client, args.config()).await;
            Ok(())
        }),
        Command::HollowNodes(args) => rt.block_on(controlplane::hollow::run(args)),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    sans.extend(args.sans.iter().cloned());
    if !args.listen.ip().is_unspecified() && !sans.contains(&args.listen.ip().to_string()) {
        sans.push(args.listen.ip().to_string());
    }
    let data_dir = &args.data_dir;
    let pki = Arc::new(Pki::load_or_create(&data_dir.join("pki"), &sans).context("cluster PKI")?);
    let store: Arc<dyn controlplane::storage::Store> = match &args.etcd {
        Some(url) => Arc::new(controlplane::storage::etcd::EtcdStore::new(url).context("--etcd")?),
        None => Arc::new(
            EmbeddedStore::open(EmbeddedConfig::new(data_dir.join("store"))).context("opening the store")?,
        ),
    };
    let api = Api::new(store, pki.ca_pem.clone()).with_signer(pki.clone());
    api.bootstrap()
        .await
        .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let kubeconfig = pki.write_kubeconfig(data_dir, addr)?;
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
    if !args.no_scheduler {
        let caller = Caller {
            user: "system:kube-scheduler".into(),
            groups: vec!["system:authenticated".into()],
        };
        let client = InProcess::new(api.clone(), caller, "kube-scheduler").client();
        tokio::spawn(scheduler::run(client, args.scheduling.config()));
    }
    if !args.no_controllers {
        let caller = Caller {
            user: "system:kube-controller-manager".into(),
            groups: vec!["system:authenticated".into()],
        };
        let client = InProcess::new(api.clone(), caller, "kube-controller-manager").client();
        tokio::spawn(controllers::run(client, ControllerConfig::default()));
    }
    tracing::info!(listen = %addr, kubeconfig = %kubeconfig.display(), "serving");
    println!(
        "controlplane: serving on https://{addr} (kubeconfig {})",
        kubeconfig.display()
    );
    match server::serve(api, listener, server::tls_config(&pki)?, tokens).await {}
}
