//! Runs `controlplane serve` as a child process on a free loopback port and waits until it
//! serves (for tests, benchmarks and the VM harness). The process is killed on drop.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

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
        let mut child = Command::new(bin)
            .args(["serve", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
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
        let mut last = std::io::Error::other("etcd did not start");
        for _ in 0..3 {
            match Self::spawn_once(data_dir) {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn spawn_once(data_dir: &Path) -> std::io::Result<Self> {
        let free = || -> std::io::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
        };
        let (client, peer) = (free()?, free()?);
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
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
            endpoint: format!("http://127.0.0.1:{client}"),
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
            .stderr(Stdio::null())
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
