//! A control plane on the host for node VMs: `controlplane serve` on loopback with a fresh data
//! directory, reachable from guests at [`CP_GUEST_IP`]:6443 through a QEMU guest forward, and the
//! machine config that makes a node join it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use controlplane::process::ServerProcess;

use crate::vm::{Nic, target_dir};

/// The address nodes dial; QEMU forwards it to the host's control plane.
pub const CP_GUEST_IP: &str = "10.0.2.100";

/// A running control plane (killed on drop).
#[derive(Debug)]
pub struct ControlPlane {
    process: ServerProcess,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts `target/debug/controlplane` (built by `./build.sh build`).
    pub fn start() -> Result<Self> {
        Self::start_bin(&target_dir().join("debug/controlplane"))
    }

    /// Starts the control plane binary `bin` (the pods benchmark runs the release build, as
    /// users do).
    pub fn start_bin(bin: &Path) -> Result<Self> {
        ensure!(bin.exists(), "{} not built", bin.display());
        let dir = tempfile::tempdir()?;
        let process = ServerProcess::spawn(bin, dir.path(), &["--san", CP_GUEST_IP])
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self { process, dir })
    }

    /// The data directory (PKI, store, `admin.kubeconfig`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The machine config of a node named `hostname` that joins this control plane.
    pub fn machine_config(&self, hostname: &str) -> Result<String> {
        let ca = std::fs::read(self.dir().join("pki/ca.crt"))?;
        let token = std::fs::read_to_string(self.dir().join("pki/bootstrap.token"))?;
        Ok(serde_json::json!({
            "apiVersion": "nodeos/v1alpha1",
            "hostname": hostname,
            "controlPlane": {
                "server": format!("https://{CP_GUEST_IP}:6443"),
                "caData": base64::engine::general_purpose::STANDARD.encode(ca),
                "bootstrapToken": token.trim(),
            },
        })
        .to_string())
    }

    /// The machine config of a node that also pulls from `registry` (seen by guests at
    /// [`crate::guest::REGISTRY_GUEST`], over plain HTTP).
    pub fn machine_config_with_registry(&self, hostname: &str) -> Result<String> {
        let mut v: serde_json::Value = serde_json::from_str(&self.machine_config(hostname)?)?;
        let (ip, port) = crate::guest::REGISTRY_GUEST;
        v["registries"] = serde_json::json!({"insecure": [format!("{ip}:{port}")]});
        Ok(v.to_string())
    }

    /// Lets this control plane reach the node's agent (`kubectl logs`): forwards a free host port
    /// on `nic` to the guest's port 10250 and returns `machine_config` with the node advertising
    /// it (`controlPlane.kubeletEndpoint`).
    pub fn expose_agent(&self, nic: &mut Nic, machine_config: &str) -> Result<String> {
        let port = crate::vm::free_port()?;
        nic.forwards.push((port, 10250));
        let mut v: serde_json::Value = serde_json::from_str(machine_config)?;
        v["controlPlane"]["kubeletEndpoint"] = serde_json::json!(format!("127.0.0.1:{port}"));
        Ok(v.to_string())
    }

    /// Creates an object from a manifest (`kubectl create -f`).
    pub fn create(&self, manifest: &serde_json::Value) -> Result<String> {
        let file = self.dir().join(format!("manifest-{}.json", std::process::id()));
        std::fs::write(&file, manifest.to_string())?;
        let out = self.kubectl(&["create", "-f", &file.to_string_lossy()]);
        let _ = std::fs::remove_file(&file);
        out
    }

    /// Polls `kubectl get <what> -o jsonpath=<path>` until `ok` accepts the value.
    pub fn wait_for(
        &self,
        what: &[&str],
        path: &str,
        ok: impl Fn(&str) -> bool,
        timeout: std::time::Duration,
    ) -> Result<String> {
        let deadline = std::time::Instant::now() + timeout;
        let mut args: Vec<&str> = vec!["get"];
        args.extend_from_slice(what);
        let jp = format!("jsonpath={path}");
        args.extend_from_slice(&["-o", &jp]);
        loop {
            let v = self.kubectl(&args).unwrap_or_default();
            if ok(&v) {
                return Ok(v);
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "kubectl get {what:?} {path}: still {v:?} after {timeout:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }

    /// A NIC whose guest reaches this control plane at [`CP_GUEST_IP`]:6443.
    pub fn nic(&self) -> Nic {
        Nic {
            guest_forwards: vec![(CP_GUEST_IP.into(), 6443, self.process.port)],
            ..Nic::default()
        }
    }

    /// Runs the real kubectl with the admin kubeconfig; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("kubectl")
            .env("KUBECONFIG", self.dir().join("admin.kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir().join("kube-cache"))
            .args(args)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
