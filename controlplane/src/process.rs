//! Test and benchmark helpers: `controlplane serve`, etcd and hollow nodes as child processes on
//! free loopback ports (killed on drop), and [`TestCluster`], a control plane with hollow nodes
//! driven by the real kubectl.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// How long one kubectl command of a test may run.
const KUBECTL_DEADLINE: Duration = Duration::from_secs(180);

/// Where a child's stderr goes: a file `<name>-<pid of this test process>.log` in the directory
/// `NODEOS_TEST_LOG_DIR` names (to read a failed test's server and hollow-node logs), else
/// nowhere.
fn log_sink(name: &str) -> Stdio {
    let Some(dir) = std::env::var_os("NODEOS_TEST_LOG_DIR") else {
        return Stdio::null();
    };
    let path = Path::new(&dir).join(format!("{name}-{}.log", std::process::id()));
    match std::fs::OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => Stdio::from(f),
        Err(_) => Stdio::null(),
    }
}
use std::time::{Duration, Instant};

/// `serve` arguments for clusters of thousands of nodes: a pod network with a /24 for each of up
/// to 32,768 nodes (the default 10.244.0.0/16 has 256, and every node past them is retried
/// and reported as CIDRNotAvailable, as upstream's range allocator does). Benchmarks with
/// more than 256 nodes pass these, as such a cluster would be configured.
pub const LARGE_CLUSTER_ARGS: [&str; 2] = ["--cluster-cidr", "10.128.0.0/9"];

/// A running `controlplane serve`.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
}

impl ServerProcess {
    /// Starts `bin serve --data-dir DIR --listen 127.0.0.1:<free port> EXTRA...` and waits for
    /// its `serving on` banner.
    pub fn spawn(bin: &Path, data_dir: &Path, extra: &[&str]) -> std::io::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Self::spawn_on(bin, data_dir, port, extra)
    }

    /// Starts `bin serve` on the loopback port `port` (e.g. again on the port of a server that
    /// was stopped, so that its clients reconnect).
    pub fn spawn_on(bin: &Path, data_dir: &Path, port: u16, extra: &[&str]) -> std::io::Result<Self> {
        let mut child = Command::new(bin)
            .args(["serve", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log_sink(&format!("serve-{port}")))
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if !line.contains("serving on https://") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "{} did not start: {line:?}",
                bin.display()
            )));
        }
        Ok(Self { child, port })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The files of an etcd serving clients over TLS: its certificate and key, and the CA its
/// clients' certificates must chain to.
#[derive(Debug, Clone)]
pub struct EtcdServerTls {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    pub ca_file: std::path::PathBuf,
}

/// A real etcd (Debian's `etcd`) on free loopback ports with its own data directory, for tests
/// and benchmarks. Killed on drop.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Child,
    /// `http://127.0.0.1:<client port>`.
    pub endpoint: String,
}

impl EtcdProcess {
    /// Starts etcd and waits (up to 30 s) until it accepts connections. Ports are picked free
    /// and may be taken by someone else before etcd binds them (tests start many etcds in
    /// parallel): when etcd exits early it is started again on new ports, up to three times.
    pub fn spawn(data_dir: &Path) -> std::io::Result<Self> {
        Self::spawn_with(data_dir, None)
    }

    /// Like [`EtcdProcess::spawn`], serving clients over TLS with `tls`'s certificate and
    /// accepting only clients with a certificate from its CA (`endpoint` is `https://...`).
    pub fn spawn_tls(data_dir: &Path, tls: &EtcdServerTls) -> std::io::Result<Self> {
        Self::spawn_with(data_dir, Some(tls))
    }

    fn spawn_with(data_dir: &Path, tls: Option<&EtcdServerTls>) -> std::io::Result<Self> {
        let mut last = std::io::Error::other("etcd did not start");
        for _ in 0..3 {
            match Self::spawn_once(data_dir, tls) {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn spawn_once(data_dir: &Path, tls: Option<&EtcdServerTls>) -> std::io::Result<Self> {
        let free = || -> std::io::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
        };
        let (client, peer) = (free()?, free()?);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut cmd = Command::new("etcd");
        if let Some(t) = tls {
            cmd.arg("--cert-file")
                .arg(&t.cert_file)
                .arg("--key-file")
                .arg(&t.key_file)
                .arg("--trusted-ca-file")
                .arg(&t.ca_file)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", &format!("{scheme}://127.0.0.1:{client}")])
            .args([
                "--advertise-client-urls",
                &format!("{scheme}://127.0.0.1:{client}"),
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut me = Self {
            child,
            endpoint: format!("{scheme}://127.0.0.1:{client}"),
        };
        let t0 = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            if let Some(status) = me.child.try_wait()? {
                return Err(std::io::Error::other(format!("etcd exited at start ({status})")));
            }
            if t0.elapsed() > std::time::Duration::from_secs(30) {
                return Err(std::io::Error::other("etcd did not start listening within 30 s"));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(me)
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `controlplane hollow-nodes` as a child process (killed on drop: its nodes are lost).
#[derive(Debug)]
pub struct HollowProcess {
    child: Child,
}

impl HollowProcess {
    /// Starts `count` hollow nodes named `<prefix>-<i>` against the API server of `kubeconfig`
    /// and waits until they are registered.
    pub fn spawn(
        bin: &Path,
        kubeconfig: &Path,
        count: usize,
        prefix: &str,
        extra: &[&str],
    ) -> std::io::Result<Self> {
        let mut child = Command::new(bin)
            .args(["hollow-nodes", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--count", &count.to_string(), "--name-prefix", prefix])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log_sink(&format!("hollow-{prefix}")))
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if !line.contains("nodes registered") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "hollow nodes did not start: {line:?}"
            )));
        }
        Ok(Self { child })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HollowProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A control plane (`controlplane serve`, scheduler and controllers in process) with hollow
/// node groups, driven by the real kubectl; everything is killed on drop. For integration tests.
#[derive(Debug)]
pub struct TestCluster {
    pub server: Option<ServerProcess>,
    pub hollow: Vec<HollowProcess>,
    pub dir: tempfile::TempDir,
    bin: PathBuf,
    serve_args: Vec<String>,
    /// The port of the server this cluster started (it restarts there).
    port: Option<u16>,
}

impl TestCluster {
    /// A control plane started from `bin` with `serve_args`, and hollow node groups
    /// `(prefix, count, extra hollow-nodes arguments)`.
    pub fn start(bin: &Path, serve_args: &[&str], groups: &[(&str, usize, &[&str])]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = ServerProcess::spawn(bin, dir.path(), serve_args).expect("start controlplane");
        let port = Some(server.port);
        let mut c = Self {
            port,
            server: Some(server),
            hollow: Vec::new(),
            dir,
            bin: bin.to_path_buf(),
            serve_args: serve_args.iter().map(|a| a.to_string()).collect(),
        };
        for (prefix, count, extra) in groups {
            c.add_nodes(prefix, *count, extra);
        }
        c
    }

    /// kubectl and hollow nodes for the data directory `dir` of a server started elsewhere.
    pub fn adopt(bin: &Path, dir: tempfile::TempDir) -> Self {
        Self {
            server: None,
            hollow: Vec::new(),
            dir,
            bin: bin.to_path_buf(),
            serve_args: Vec::new(),
            port: None,
        }
    }

    /// Kills the control plane and starts it again on the same data directory and port (the
    /// hollow nodes and kubectl reconnect). Panics when there is no server of this cluster.
    pub fn restart_server(&mut self) {
        let args = self.serve_args.clone();
        self.restart_server_with(&args);
    }

    /// Like [`TestCluster::restart_server`], with `serve_args` from now on.
    /// (It may have been stopped with [`TestCluster::stop_server`].)
    pub fn restart_server_with(&mut self, serve_args: &[impl AsRef<str>]) {
        self.serve_args = serve_args.iter().map(|a| a.as_ref().to_string()).collect();
        let port = self.port.expect("a server started by this cluster");
        self.stop_server();
        let args: Vec<&str> = self.serve_args.iter().map(String::as_str).collect();
        // The port was just freed; retry a little in case the kernel has not released it yet.
        let t0 = Instant::now();
        let server = loop {
            match ServerProcess::spawn_on(&self.bin, self.dir.path(), port, &args) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                    tracing::debug!(error = %e, "restart: retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("restart controlplane: {e}"),
            }
        };
        self.server = Some(server);
    }

    /// Kills the control plane (e.g. to read its store directly); `restart_server*` starts it
    /// again.
    pub fn stop_server(&mut self) {
        drop(self.server.take());
    }

    /// Starts another group of hollow nodes.
    pub fn add_nodes(&mut self, prefix: &str, count: usize, extra: &[&str]) {
        let h =
            HollowProcess::spawn(&self.bin, &self.kubeconfig(), count, prefix, extra).expect("hollow nodes");
        self.hollow.push(h);
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// Runs kubectl (with `stdin`); returns (success, stdout, stderr).
    /// A kubectl that has not finished after `KUBECTL_DEADLINE` is stopped (coreutils `timeout`)
    /// and fails, so a hung command fails its test instead of holding the whole suite.
    pub fn kubectl_result(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut child = Command::new("timeout")
            .arg(KUBECTL_DEADLINE.as_secs().to_string())
            .arg("kubectl")
            .env("KUBECONFIG", self.kubeconfig())
            .arg("--cache-dir")
            .arg(self.dir.path().join("kube-cache"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(s) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(s.as_bytes())
                .expect("write stdin");
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().expect("kubectl output");
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.code() == Some(124) {
            stderr.push_str(&format!(
                "kubectl {args:?} still running after {KUBECTL_DEADLINE:?}: stopped"
            ));
        }
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        )
    }

    /// Runs kubectl and asserts it succeeded; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl_result(args, None);
        assert!(ok, "kubectl {args:?} failed: {err}");
        out
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON).
    pub fn apply(&self, manifest: &str) {
        let (ok, _, err) = self.kubectl_result(&["apply", "-f", "-"], Some(manifest));
        assert!(ok, "kubectl apply failed: {err}\n{manifest}");
    }

    /// `kubectl get <what> -o jsonpath=<path>` (empty on errors).
    pub fn jsonpath(&self, what: &[&str], path: &str) -> String {
        let jp = format!("jsonpath={path}");
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-o", &jp]);
        let (_, out, _) = self.kubectl_result(&args, None);
        out
    }

    /// Polls `kubectl get <what> -o jsonpath=<path>` until `ok` holds (60 s).
    pub fn wait_for(&self, what: &[&str], path: &str, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let v = self.jsonpath(what, path);
            if ok(&v) {
                return v;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "kubectl get {what:?} {path}: still {v:?}\n{}",
                self.pods_summary()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// One line per pod in the default namespace (node, image, deletion, phase, readiness), for
    /// the message of a test that timed out.
    pub fn pods_summary(&self) -> String {
        let pods = self.jsonpath(
            &["pods"],
            "{range .items[*]}{.metadata.name} node={.spec.nodeName} image={.spec.containers[0].image} deleting={.metadata.deletionTimestamp} phase={.status.phase} ready={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        );
        format!("pods:\n{pods}")
    }

    /// The message of a pod's `PodScheduled` condition, once there is one.
    pub fn unschedulable_message(&self, pod: &str) -> String {
        self.wait_for(
            &["pod", pod],
            "{.status.conditions[?(@.type==\"PodScheduled\")].message}",
            |m| !m.is_empty(),
        )
    }
}

/// A `/proc/PID/status` value in KiB (`VmRSS:`, `VmHWM:`), 0 when unreadable.
pub fn proc_status(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// utime + stime of a process, in seconds (clock ticks of 1/100 s).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // After the ')' field 0 is the state; utime and stime are fields 14 and 15 of the line (11, 12 here).
    (ticks(11) + ticks(12)) / 100.0
}
