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
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use controlplane::api::{Api, Caller};
use controlplane::controllers::{self, ControllerConfig};
use controlplane::inprocess::InProcess;
use controlplane::pki::Pki;
use controlplane::scheduler::{self, SchedulerConfig};
use controlplane::server;
use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};

/// jemalloc rather than glibc's malloc: in `bench scheduler` (5,000 hollow nodes, 10,000 pods,
/// a 2-core machine) the control plane's RSS after the pods measured 337-352 MB over 12 runs
/// against 363 MB, and its CPU a median of 20.3 s over those runs against 25.9 s over 5 glibc
/// runs (single runs vary ±25 % either way). Options are read from `_RJEM_MALLOC_CONF` at
/// start; narenas:1, narenas:2 and percpu_arena measured no better than the defaults.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(name = "controlplane", about = "The nodeos control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The API server (with the scheduler in process).
    Serve(Box<ServeArgs>),
    /// The scheduler alone, against the API server of a kubeconfig.
    Scheduler(SchedulerArgs),
    /// The controllers alone, against the API server of a kubeconfig.
    Controllers(ControllersArgs),
    /// Simulated nodes (no containers) that register, heartbeat and run pods bound to them.
    HollowNodes(controlplane::hollow::HollowArgs),
    /// Node bootstrap tokens (`token create`), as `kubeadm token`.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Creates a bootstrap token Secret through the API server and prints the token
    /// (`<id>.<secret>`) for a node's `controlPlane.bootstrapToken`.
    Create {
        #[arg(long)]
        kubeconfig: PathBuf,
        /// How long the token is valid; `0` for never.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
        #[arg(long, default_value = "A node bootstrap token (controlplane token create).")]
        description: String,
    },
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
    /// Share one etcd (`http://HOST:PORT`, or `https://HOST:PORT` with `--etcd-cafile`) with
    /// other API servers instead of the embedded store.
    #[arg(long)]
    etcd: Option<String>,
    /// The CA (PEM) that etcd's serving certificate must chain to (needed for https).
    #[arg(long, requires = "etcd")]
    etcd_cafile: Option<PathBuf>,
    /// The client certificate (PEM) presented to etcd (with `--etcd-keyfile`).
    #[arg(long, requires_all = ["etcd_keyfile", "etcd_cafile"])]
    etcd_certfile: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// An `apiserver.config.k8s.io/v1` EncryptionConfiguration: the resources it names are
    /// encrypted in the store (aescbc, aesgcm; identity to read or write plain values).
    #[arg(long)]
    encryption_provider_config: Option<PathBuf>,
    /// Read the encryption configuration again every 10 s and put a changed, valid one in
    /// force without a restart (a file that does not parse is logged and changes nothing).
    #[arg(long, requires = "encryption_provider_config")]
    encryption_provider_config_automatic_reload: bool,
    /// How long the node bootstrap token of the first start (`DIR/pki/bootstrap.token`) stays
    /// valid (kubeadm's default, 24h); `0` for a token that never expires. Nodes that joined
    /// keep their own certificates (on their state partition) and do not need it again; more
    /// tokens: `controlplane token create`.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    bootstrap_token_ttl: Duration,
    /// Where Service ClusterIPs come from (IPv4 CIDR, /8 to /30); the first address is the
    /// `kubernetes` Service's.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: controlplane::api::ServiceRange,
    /// Do not run the scheduler in process (e.g. to run another one against this server).
    #[arg(long)]
    no_scheduler: bool,
    /// Do not run the controllers in process.
    #[arg(long)]
    no_controllers: bool,
    #[command(flatten)]
    scheduling: SchedulingArgs,
    #[command(flatten)]
    tunables: ControllerTunables,
    #[command(flatten)]
    audit: AuditArgs,
}

/// kube-apiserver's audit log flags (no policy file: nothing is audited).
#[derive(Debug, Clone, clap::Args)]
struct AuditArgs {
    /// An `audit.k8s.io/v1` Policy (YAML or JSON) deciding what is recorded.
    #[arg(long)]
    audit_policy_file: Option<PathBuf>,
    /// Where audit events go, one JSON object per line (required with a policy).
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// Rotate the log at this many megabytes (0: never).
    #[arg(long, default_value_t = 100)]
    audit_log_maxsize: u64,
    /// Rotated files kept.
    #[arg(long, default_value_t = 10)]
    audit_log_maxbackup: usize,
}

impl AuditArgs {
    fn start(&self) -> anyhow::Result<Option<controlplane::audit::Auditor>> {
        match (&self.audit_policy_file, &self.audit_log_path) {
            (None, _) => Ok(None),
            (Some(_), None) => anyhow::bail!("--audit-policy-file needs --audit-log-path"),
            (Some(policy), Some(log)) => Ok(Some(controlplane::audit::Auditor::start(
                policy,
                log,
                self.audit_log_maxsize,
                self.audit_log_maxbackup,
            )?)),
        }
    }
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
    /// The CA (PEM file) the root-ca-cert-publisher publishes as `kube-root-ca.crt` (default:
    /// the kubeconfig's cluster CA).
    #[arg(long)]
    root_ca_file: Option<PathBuf>,
    #[command(flatten)]
    tunables: ControllerTunables,
}

impl ControllersArgs {
    fn config(&self) -> anyhow::Result<ControllerConfig> {
        let defaults = ControllerConfig::default();
        let root_ca = match &self.root_ca_file {
            Some(f) => {
                Some(std::fs::read_to_string(f).with_context(|| format!("--root-ca-file {}", f.display()))?)
            }
            None => kubeconfig_ca(&self.kubeconfig),
        };
        let cfg = ControllerConfig {
            leader_elect: !self.no_leader_elect,
            identity: self.identity.clone().unwrap_or(defaults.identity.clone()),
            root_ca,
            ..defaults
        };
        Ok(self.tunables.apply(cfg))
    }
}

/// The CA of the kubeconfig's current cluster (PEM), if it names one.
fn kubeconfig_ca(path: &std::path::Path) -> Option<String> {
    use base64::Engine;
    let kc = kube::config::Kubeconfig::read_from(path).ok()?;
    let context = kc.current_context.as_deref();
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| Some(c.name.as_str()) == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    let cluster = kc
        .clusters
        .iter()
        .find(|c| cluster_name.as_deref().is_none_or(|n| n == c.name))?
        .cluster
        .as_ref()?;
    if let Some(data) = &cluster.certificate_authority_data {
        let pem = base64::engine::general_purpose::STANDARD.decode(data).ok()?;
        return String::from_utf8(pem).ok();
    }
    std::fs::read_to_string(cluster.certificate_authority.as_ref()?).ok()
}

/// The controllers' tunables, kube-controller-manager's flags with its defaults (durations
/// as Go writes them: `5s`, `1m30s`, `500ms`).
#[derive(Debug, Clone, clap::Args)]
struct ControllerTunables {
    /// Controllers to run: `*` for all, a name to add one, `-name` to leave one out.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    controllers: Vec<String>,
    /// How often node health is checked.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    node_monitor_period: Duration,
    /// A node silent this long is marked Unknown.
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    node_monitor_grace_period: Duration,
    /// The same for a node that never posted its status.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    node_startup_grace_period: Duration,
    /// Nodes per second per zone whose pods are evicted (their NoExecute taint).
    #[arg(long, default_value_t = 0.1)]
    node_eviction_rate: f64,
    /// The rate in an unhealthy zone of a large cluster.
    #[arg(long, default_value_t = 0.01)]
    secondary_node_eviction_rate: f64,
    /// Share of unready nodes that makes a zone unhealthy.
    #[arg(long, default_value_t = 0.55)]
    unhealthy_zone_threshold: f64,
    /// Nodes above which an unhealthy zone still evicts (at the secondary rate).
    #[arg(long, default_value_t = 50)]
    large_cluster_size_threshold: usize,
    /// Terminated pods kept before the garbage collector deletes the oldest (0: never).
    #[arg(long, default_value_t = 12_500)]
    terminated_pod_gc_threshold: usize,
    /// How often the pod garbage collector runs.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pod_gc_period: Duration,
    /// How long a missing node is waited for before its pods are taken for orphans.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pod_gc_quarantine: Duration,
    /// Give every node a pod CIDR from --cluster-cidr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allocate_node_cidrs: bool,
    /// The pod network the node CIDRs are cut from.
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: controllers::nodeipam::reconcile::Cidr,
    /// The prefix length of each node's CIDR.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
}

impl ControllerTunables {
    fn apply(&self, mut cfg: ControllerConfig) -> ControllerConfig {
        cfg.controllers = self.controllers.clone();
        let n = &mut cfg.node_lifecycle;
        n.monitor_period = self.node_monitor_period;
        n.grace_period = self.node_monitor_grace_period;
        n.startup_grace_period = self.node_startup_grace_period;
        n.eviction_rate = self.node_eviction_rate;
        n.secondary_eviction_rate = self.secondary_node_eviction_rate;
        n.unhealthy_zone_threshold = self.unhealthy_zone_threshold;
        n.large_cluster_threshold = self.large_cluster_size_threshold;
        cfg.podgc.terminated_threshold = self.terminated_pod_gc_threshold;
        cfg.podgc.period = self.pod_gc_period;
        cfg.podgc.quarantine = self.pod_gc_quarantine;
        cfg.node_ipam.enabled = self.allocate_node_cidrs;
        cfg.node_ipam.cluster_cidr = self.cluster_cidr;
        cfg.node_ipam.node_mask = self.node_cidr_mask_size;
        cfg
    }
}

/// A Go duration: numbers with units `h`, `m`, `s`, `ms` (e.g. `1m30s`, `500ms`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    kcore::time::parse_go_duration(s).ok_or_else(|| format!("invalid duration {s:?} (e.g. 5s, 1m30s, 500ms)"))
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
        Command::Serve(args) => rt.block_on(serve(*args)),
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
            controllers::run(client, args.config()?).await;
            Ok(())
        }),
        Command::HollowNodes(args) => rt.block_on(controlplane::hollow::run(args)),
        Command::Token {
            command:
                TokenCommand::Create {
                    kubeconfig,
                    ttl,
                    description,
                },
        } => rt.block_on(async move {
            use controlplane::api::{new_token, token_secret};
            let client = transport::kubeapi::from_kubeconfig(&kubeconfig, "controlplane-token nodeos")
                .await
                .context("--kubeconfig")?;
            let token = new_token().map_err(|e| anyhow::anyhow!("random token: {e}"))?;
            let (id, secret) = token.split_once('.').context("a new token has the token shape")?;
            let ttl = Some(ttl).filter(|t| !t.is_zero());
            let obj = token_secret(id, secret, &description, ttl, std::time::SystemTime::now());
            let secret: k8s_openapi::api::core::v1::Secret =
                serde_json::from_value(obj).context("the token Secret")?;
            kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, "kube-system")
                .create(&kube::api::PostParams::default(), &secret)
                .await
                .context("creating the bootstrap token Secret")?;
            println!("{token}");
            Ok(())
        }),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // A connection to each node's kubelet while metrics are scraped.
    controlplane::rlimit::raise_open_files_limit();
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
    // Bad audit flags stop the start, before anything is served unaudited.
    let audit = args.audit.start()?;
    // A bad encryption configuration stops the start before the store is opened.
    let encryption = match &args.encryption_provider_config {
        Some(path) => {
            let text = std::fs::read(path)
                .with_context(|| format!("--encryption-provider-config: reading {}", path.display()))?;
            let config = controlplane::storage::encryption::EncryptionConfig::parse(&text)
                .context("--encryption-provider-config")?;
            Some((path, text, config))
        }
        None => None,
    };
    let first_start = !data_dir.join("pki").exists();
    let pki = Arc::new(Pki::load_or_create(&data_dir.join("pki"), &sans).context("cluster PKI")?);
    let mut store: Arc<dyn controlplane::storage::Store> = match &args.etcd {
        Some(url) => {
            let read =
                |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
            let tls = match (&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile) {
                (None, _, _) => None,
                (Some(ca), cert, key) => Some(controlplane::storage::etcd::EtcdTls {
                    ca_pem: read(ca)?,
                    client: match (cert, key) {
                        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                        _ => None,
                    },
                }),
            };
            Arc::new(controlplane::storage::etcd::EtcdStore::new(url, tls.as_ref()).context("--etcd")?)
        }
        None => Arc::new(
            EmbeddedStore::open(EmbeddedConfig::new(data_dir.join("store"))).context("opening the store")?,
        ),
    };
    if let Some((path, text, config)) = encryption {
        let encrypted = controlplane::storage::encryption::EncryptedStore::new(store, config);
        if args.encryption_provider_config_automatic_reload {
            let mut reloader = encrypted.reloader(path, text);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(10));
                loop {
                    tick.tick().await;
                    match reloader.check() {
                        Ok(true) => tracing::info!("encryption configuration reloaded"),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(
                            error = %e,
                            "encryption configuration not reloaded; the previous one stays in force"
                        ),
                    }
                }
            });
        }
        store = Arc::new(encrypted);
    }
    let api = Api::new(store, pki.ca_pem.clone())
        .with_signer(pki.clone())
        .with_service_range(args.service_cluster_ip_range);
    api.bootstrap()
        .await
        .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
    api.start_authorization()
        .await
        .map_err(|e| anyhow::anyhow!("authorization: {e}"))?;
    // The node bootstrap token of DIR/pki/bootstrap.token authenticates through its Secret
    // (RBAC lets `system:bootstrappers` only create and read CSRs), written at the first start
    // only: a restart never revives it once it expired or was deleted.
    if first_start {
        let ttl = Some(args.bootstrap_token_ttl).filter(|t| !t.is_zero());
        api.ensure_bootstrap_token(&pki.bootstrap_token, ttl)
            .await
            .map_err(|e| anyhow::anyhow!("bootstrap token: {e}"))?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    api.ensure_kubernetes_service(addr.port())
        .await
        .map_err(|e| anyhow::anyhow!("the kubernetes Service: {e}"))?;
    let kubeconfig = pki.write_kubeconfig(data_dir, addr)?;
    let mut tokens = server::Tokens::new();
    tokens.insert(
        pki.admin_token.clone(),
        Caller {
            user: "admin".into(),
            groups: vec!["system:masters".into()],
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
        let cfg = ControllerConfig {
            root_ca: Some(pki.ca_pem.clone()),
            ..args.tunables.apply(ControllerConfig::default())
        };
        tokio::spawn(controllers::run(client, cfg));
    }
    tracing::info!(listen = %addr, kubeconfig = %kubeconfig.display(), "serving");
    println!(
        "controlplane: serving on https://{addr} (kubeconfig {})",
        kubeconfig.display()
    );
    match server::serve(api, listener, server::tls_config(&pki)?, tokens, audit).await {}
}
