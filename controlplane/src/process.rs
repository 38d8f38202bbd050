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
