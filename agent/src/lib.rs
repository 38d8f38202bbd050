//! The node agent (the kubelet's job): joins the control plane (TLS bootstrap, Node, Lease), runs
//! the pods bound to its node through the runtime process (`pods`), and serves its TLS endpoint
//! (`/healthz`, container logs, exec and stats for the API server) with a serving certificate
//! the cluster issues (`serving`), authorizing each caller through the control plane (`authz`).

#![forbid(unsafe_code)]

pub mod attach;
pub mod authz;
pub mod configz;
pub mod exec;
pub mod imagegc;
pub mod logs;
pub mod node;
pub mod pods;
pub mod portforward;
mod remotecommand;
mod server;
pub mod serving;
pub mod settings;
mod spdy;
pub mod state;
pub mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pods::shutdown::NodeState;
pub use server::serve;

/// The signal init sends the agent when the machine is going down: stop the pods (graceful
/// node shutdown, NODE-68), then exit. SIGTERM alone stops the agent and leaves every pod
/// running (an agent restart must not touch pods).
pub const NODE_SHUTDOWN_SIGNAL: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGPWR;

/// What the agent gets beyond the pods' grace periods to finish node shutdown.
const NODE_SHUTDOWN_SLACK: Duration = Duration::from_secs(5);

/// Agent settings (from the machine config once the node joins a control plane).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The agent's TLS endpoint (the kubelet's port).
    pub listen: SocketAddr,
    /// Root of the cgroup v2 hierarchy.
    pub cgroup_root: PathBuf,
    /// Names the serving certificate is issued for.
    pub server_names: Vec<String>,
    /// What init hands the agent (node name, address, control plane).
    pub settings_path: PathBuf,
    /// Where the agent keeps its node identity.
    pub identity_dir: PathBuf,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 10250)),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            server_names: vec![hostname(), "localhost".into()],
            settings_path: PathBuf::from(settings::PATH),
            identity_dir: PathBuf::from("/run/nodeos/agent"),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "node".into())
}

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot create the serving certificate: {0}")]
    Certificate(#[source] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] transport::tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Logs the node's cgroup layout: unified (cgroup v2, the only one the runtime supports) when the
/// root has `cgroup.controllers`, and the controllers delegated to children.
fn log_cgroups(root: &std::path::Path) {
    let unified = root.join("cgroup.controllers").is_file();
    match std::fs::read_to_string(root.join("cgroup.subtree_control")) {
        Ok(c) => {
            let controllers: Vec<&str> = c.split_whitespace().collect();
            tracing::info!(unified, controllers = ?controllers, "cgroups");
        }
        Err(e) => tracing::warn!(unified, error = %e, "cannot read the cgroup controllers"),
    }
}

/// Runs the agent until it fails.
pub fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    log_cgroups(&cfg.cgroup_root);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    let settings = settings::AgentSettings::read(&cfg.settings_path).unwrap_or_else(|e| {
        tracing::error!(error = %e, "unreadable agent settings");
        None
    });
    let ca_pem = settings
        .as_ref()
        .and_then(|s| s.control_plane.as_ref())
        .map(|cp| cp.ca_pem.clone());
    let node_name = settings.as_ref().map(|s| s.node_name.clone()).unwrap_or_default();
    let bands = settings
        .as_ref()
        .filter(|s| s.control_plane.is_some())
        .map(|s| s.shutdown_grace_period_by_pod_priority.clone())
        .unwrap_or_default();
    let configz = settings.as_ref().map_or(serde_json::Value::Null, |s| {
        let thresholds = s.thresholds().unwrap_or_default();
        configz::configz(s, &thresholds)
    });
    let cert = Arc::new(server::self_signed(&cfg.server_names)?);
    let authz = Arc::new(authz::Authorizer::new(&node_name));
    let state = Arc::new(tokio::sync::watch::channel(NodeState::Running).0);
    let restart = Arc::new(tokio::sync::Notify::new());
    let known: pods::KnownPods = Arc::new(tokio::sync::watch::channel(Vec::new()).0);
    let partition = state::StateStore::find();
    if let Some(p) = &partition {
        match state::restore(p, &cfg.identity_dir) {
            Ok(n) => tracing::info!(partition = %p.path().display(), restored = n, "state partition read"),
            Err(e) => {
                tracing::warn!(partition = %p.path().display(), error = %e, "state partition unreadable")
            }
        }
    }
    rt.block_on(async {
        if let Some(s) = settings {
            tokio::spawn(node::run(
                s,
                cfg.identity_dir.clone(),
                partition,
                authz.clone(),
                cert.clone(),
                state.clone(),
                restart.clone(),
                known.clone(),
            ));
        }
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(AgentError::Runtime)?;
        let mut power =
            signal(SignalKind::from_raw(NODE_SHUTDOWN_SIGNAL as i32)).map_err(AgentError::Runtime)?;
        tokio::select! {
            r = serve(cfg, ca_pem, node_name, cert, authz, configz, known.subscribe()) => r,
            _ = term.recv() => {
                tracing::info!("SIGTERM: stopping");
                Ok(())
            }
            _ = power.recv() => {
                shut_down(&state, &bands).await;
                Ok(())
            }
            _ = restart.notified() => {
                tracing::info!("restarting (the supervisor starts the agent again)");
                Ok(())
            }
        }
    })
}

/// Graceful node shutdown: reports the node NotReady and stops the pods by priority band, then
/// returns (bounded by the bands' periods). Without bands (the default) nothing is stopped.
async fn shut_down(state: &tokio::sync::watch::Sender<NodeState>, bands: &[settings::ShutdownGracePeriod]) {
    if bands.is_empty() {
        tracing::info!("node shutdown: graceful node shutdown is off; stopping");
        return;
    }
    let total = Duration::from_secs(settings::ShutdownGracePeriod::total(bands));
    tracing::info!(grace_s = total.as_secs(), "node shutdown requested");
    let mut rx = state.subscribe();
    state.send_replace(NodeState::ShuttingDown);
    let stopped = rx.wait_for(|s| *s == NodeState::PodsStopped);
    if tokio::time::timeout(total + NODE_SHUTDOWN_SLACK, stopped)
        .await
        .is_err()
    {
        tracing::warn!("node shutdown: the pods were not all stopped in time");
    }
}
