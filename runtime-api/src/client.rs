//! A blocking client: one request at a time per connection.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::container::{ContainerConfig, ContainerStatus, ExecSyncResult};
use crate::error::{ErrorKind, ReplyError};
use crate::image::{Auth, Image, PullPolicy};
use crate::protocol::{Reply, Request, recv_some, send_line};
use crate::sandbox::{SandboxConfig, SandboxStatus};
use crate::stats::{ContainerStats, PodStats};

/// What `attach` gives: the container's input, if any, and whether it is a terminal.
#[derive(Debug)]
pub struct Attached {
    pub tty: bool,
    pub input: Option<OwnedFd>,
}

/// Why a call failed: the runtime's own errors by kind (their message as the runtime wrote it),
/// and failures to reach or understand the runtime.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    #[error("runtime socket {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("talking to the runtime: {0}")]
    Io(#[from] io::Error),
    #[error("runtime reply: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("unexpected reply from the runtime: {0:?}")]
    Unexpected(Box<Reply>),
}

impl From<ReplyError> for ClientError {
    fn from(e: ReplyError) -> Self {
        match e.kind {
            ErrorKind::NotFound => ClientError::NotFound(e.message),
            ErrorKind::Invalid => ClientError::Invalid(e.message),
            ErrorKind::Conflict => ClientError::Conflict(e.message),
            ErrorKind::DeadlineExceeded => ClientError::DeadlineExceeded(e.message),
            ErrorKind::Unavailable => ClientError::Unavailable(e.message),
            ErrorKind::Internal => ClientError::Internal(e.message),
        }
    }
}

impl ClientError {
    /// The kind of failure; not reaching the runtime is `Unavailable`, not understanding it
    /// `Internal`.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::NotFound(_) => ErrorKind::NotFound,
            ClientError::Invalid(_) => ErrorKind::Invalid,
            ClientError::Conflict(_) => ErrorKind::Conflict,
            ClientError::DeadlineExceeded(_) => ErrorKind::DeadlineExceeded,
            ClientError::Unavailable(_) | ClientError::Connect { .. } | ClientError::Io(_) => {
                ErrorKind::Unavailable
            }
            ClientError::Internal(_) | ClientError::Decode(_) | ClientError::Unexpected(_) => {
                ErrorKind::Internal
            }
        }
    }
}

fn unexpected(r: Reply) -> ClientError {
    ClientError::Unexpected(Box::new(r))
}

/// A connection to the runtime.
#[derive(Debug)]
pub struct Client {
    sock: UnixStream,
    buf: Vec<u8>,
    /// Descriptors that came with the last reply.
    fds: Vec<OwnedFd>,
    /// Whether every request sent so far had its whole reply read (false from a request's send
    /// until its reply line parsed): only then may the connection carry another request.
    in_step: bool,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let sock = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        Ok(Self::from_stream(sock))
    }

    /// A client on a connected socket (a test's fake runtime on the other end).
    pub fn from_stream(sock: UnixStream) -> Self {
        Client {
            sock,
            buf: Vec::new(),
            fds: Vec::new(),
            in_step: true,
        }
    }

    /// Whether the connection may be used for another request: every reply was read whole
    /// and nothing else came, and the runtime has not closed its end (a closed or restarted
    /// runtime makes the socket readable, at end of file).
    pub fn reusable(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        if !self.in_step || !self.buf.is_empty() {
            return false;
        }
        let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
    }

    /// Another descriptor of this connection's socket (to keep the connection for a later
    /// client, [`Client::from_stream`], once this one is done).
    pub fn try_clone_stream(&self) -> io::Result<UnixStream> {
        self.sock.try_clone()
    }

    /// Waits up to `timeout` for the socket to appear (the runtime starting).
    pub fn connect_wait(path: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            match Self::connect(path) {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Sends one request (with fds) and reads its reply; an error reply becomes the
    /// [`ClientError`] of its kind.
    pub fn call_with_fds(&mut self, req: &Request, fds: &[RawFd]) -> Result<Reply, ClientError> {
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        self.in_step = false;
        send_line(&self.sock, &line, fds)?;
        self.fds.clear();
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let reply = serde_json::from_slice::<Reply>(&line)?;
                self.in_step = true;
                return match reply {
                    Reply::Error(e) => Err(e.into()),
                    r => Ok(r),
                };
            }
            let n = recv_some(self.sock.as_raw_fd(), &mut self.buf, &mut self.fds)?;
            if n == 0 {
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "runtime closed the connection",
                )));
            }
        }
    }

    pub fn call(&mut self, req: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(req, &[])
    }

    pub fn version(&mut self) -> Result<String, ClientError> {
        match self.call(&Request::Version)? {
            Reply::Version { version } => Ok(version),
            r => Err(unexpected(r)),
        }
    }

    pub fn run_sandbox(&mut self, config: SandboxConfig) -> Result<SandboxStatus, ClientError> {
        match self.call(&Request::RunSandbox { config })? {
            Reply::Sandbox { status } => Ok(status),
            r => Err(unexpected(r)),
        }
    }

    pub fn create_container(
        &mut self,
        sandbox_id: &str,
        config: ContainerConfig,
    ) -> Result<ContainerStatus, ClientError> {
        self.container_reply(&Request::CreateContainer {
            sandbox_id: sandbox_id.into(),
            config,
        })
    }

    pub fn start_container(&mut self, id: &str) -> Result<ContainerStatus, ClientError> {
        self.container_reply(&Request::StartContainer { id: id.into() })
    }

    pub fn stop_container(&mut self, id: &str, timeout_seconds: u64) -> Result<ContainerStatus, ClientError> {
        self.container_reply(&Request::StopContainer {
            id: id.into(),
            timeout_seconds,
        })
    }

    pub fn wait_container(&mut self, id: &str) -> Result<ContainerStatus, ClientError> {
        self.container_reply(&Request::WaitContainer { id: id.into() })
    }

    pub fn container_status(&mut self, id: &str) -> Result<ContainerStatus, ClientError> {
        self.container_reply(&Request::ContainerStatus { id: id.into() })
    }

    fn container_reply(&mut self, req: &Request) -> Result<ContainerStatus, ClientError> {
        match self.call(req)? {
            Reply::Container { status } => Ok(status),
            r => Err(unexpected(r)),
        }
    }

    pub fn list_containers(&mut self) -> Result<Vec<ContainerStatus>, ClientError> {
        match self.call(&Request::ListContainers)? {
            Reply::Containers { items } => Ok(items),
            r => Err(unexpected(r)),
        }
    }

    pub fn list_sandboxes(&mut self) -> Result<Vec<SandboxStatus>, ClientError> {
        match self.call(&Request::ListSandboxes)? {
            Reply::Sandboxes { items } => Ok(items),
            r => Err(unexpected(r)),
        }
    }

    fn expect_ok(&mut self, req: &Request) -> Result<(), ClientError> {
        match self.call(req)? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    pub fn remove_container(&mut self, id: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::RemoveContainer { id: id.into() })
    }

    pub fn stop_sandbox(&mut self, id: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::StopSandbox { id: id.into() })
    }

    pub fn remove_sandbox(&mut self, id: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::RemoveSandbox { id: id.into() })
    }

    /// Starts `command` in container `id` with the given stdio fds; returns the exec id.
    pub fn exec(&mut self, id: &str, command: Vec<String>, stdio: [RawFd; 3]) -> Result<String, ClientError> {
        match self.call_with_fds(
            &Request::Exec {
                id: id.into(),
                command,
            },
            &stdio,
        )? {
            Reply::Exec { exec_id } => Ok(exec_id),
            r => Err(unexpected(r)),
        }
    }

    /// A socket connected (or connecting: wait until it is writable, then read its error) to
    /// `localhost:<port>` in the network namespace of sandbox `sandbox_id`.
    pub fn port_forward(&mut self, sandbox_id: &str, port: u16) -> Result<OwnedFd, ClientError> {
        let req = Request::PortForward {
            sandbox_id: sandbox_id.into(),
            port,
        };
        match self.call(&req)? {
            Reply::PortForward => self.fds.pop().ok_or_else(|| {
                ClientError::Internal("the runtime's port-forward reply carried no socket".into())
            }),
            r => Err(unexpected(r)),
        }
    }

    /// Container `id`'s input, if it has one to give (see [`Request::Attach`]), and whether it
    /// runs on a terminal.
    pub fn attach(&mut self, id: &str) -> Result<Attached, ClientError> {
        match self.call(&Request::Attach { id: id.into() })? {
            Reply::Attach { tty, input: false } => Ok(Attached { tty, input: None }),
            Reply::Attach { tty, input: true } => {
                let fd = self.fds.pop().ok_or_else(|| {
                    ClientError::Internal("the runtime's attach reply carried no descriptor".into())
                })?;
                Ok(Attached { tty, input: Some(fd) })
            }
            r => Err(unexpected(r)),
        }
    }

    pub fn wait_exec(&mut self, exec_id: &str) -> Result<i32, ClientError> {
        match self.call(&Request::WaitExec {
            exec_id: exec_id.into(),
        })? {
            Reply::ExecExit { exit_code } => Ok(exit_code),
            r => Err(unexpected(r)),
        }
    }

    /// Runs `command` in container `id` and returns its exit code and output; a command still
    /// running after `timeout` (if any) is killed and `DeadlineExceeded` returned.
    pub fn exec_sync(
        &mut self,
        id: &str,
        command: Vec<String>,
        timeout: Option<Duration>,
    ) -> Result<ExecSyncResult, ClientError> {
        // Whole seconds, rounded up: a timeout never ends earlier than asked.
        let timeout_seconds = timeout.map_or(0, |t| t.as_secs() + u64::from(t.subsec_nanos() > 0));
        match self.call(&Request::ExecSync {
            id: id.into(),
            command,
            timeout_seconds,
        })? {
            Reply::ExecSync { outcome } => Ok(outcome),
            r => Err(unexpected(r)),
        }
    }

    /// Makes `image` present per `policy`; returns it.
    pub fn pull_image(
        &mut self,
        image: &str,
        policy: PullPolicy,
        auth: Option<Auth>,
        insecure_registries: Vec<String>,
    ) -> Result<Image, ClientError> {
        match self.call(&Request::PullImage {
            image: image.into(),
            policy,
            auth,
            insecure_registries,
        })? {
            Reply::Image { image } => Ok(image),
            r => Err(unexpected(r)),
        }
    }

    /// The image if it is present; `Invalid` for a malformed reference.
    pub fn image_status(&mut self, image: &str) -> Result<Option<Image>, ClientError> {
        match self.call(&Request::ImageStatus { image: image.into() })? {
            Reply::ImageStatus { image } => Ok(image),
            r => Err(unexpected(r)),
        }
    }

    pub fn list_images(&mut self) -> Result<Vec<Image>, ClientError> {
        match self.call(&Request::ListImages)? {
            Reply::Images { items } => Ok(items),
            r => Err(unexpected(r)),
        }
    }

    /// Removes an image; `Conflict` while a container uses it.
    pub fn remove_image(&mut self, image: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::RemoveImage { image: image.into() })
    }

    pub fn container_stats(&mut self, id: &str) -> Result<ContainerStats, ClientError> {
        match self.call(&Request::ContainerStats { id: id.into() })? {
            Reply::ContainerStats { stats } => Ok(stats),
            r => Err(unexpected(r)),
        }
    }

    /// A pod's stats; `disk` adds its containers' disk usage (see [`Request::PodStats`]).
    pub fn pod_stats(&mut self, sandbox_id: &str, disk: bool) -> Result<PodStats, ClientError> {
        match self.call(&Request::PodStats {
            sandbox_id: sandbox_id.into(),
            disk,
        })? {
            Reply::PodStats { stats } => Ok(stats),
            r => Err(unexpected(r)),
        }
    }

    /// Hands the runtime the node's pod CIDR (before the first sandbox).
    pub fn update_runtime_config(&mut self, pod_cidr: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::UpdateRuntimeConfig {
            pod_cidr: pod_cidr.into(),
        })
    }

    pub fn list_pod_stats(&mut self) -> Result<Vec<PodStats>, ClientError> {
        match self.call(&Request::ListPodStats)? {
            Reply::PodStatsList { items } => Ok(items),
            r => Err(unexpected(r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};

    use super::*;

    /// A fake runtime answering each request line with the next canned reply.
    fn fake(replies: Vec<&'static str>) -> (Client, std::thread::JoinHandle<Vec<String>>) {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut w = theirs.try_clone().expect("clone");
            let mut lines = BufReader::new(theirs).lines();
            for reply in replies {
                let Some(Ok(l)) = lines.next() else { break };
                seen.push(l);
                w.write_all(reply.as_bytes())
                    .and_then(|()| w.write_all(b"\n"))
                    .expect("reply");
            }
            seen
        });
        (Client::from_stream(ours), server)
    }

    #[test]
    fn error_replies_become_typed_errors() {
        let (mut c, server) = fake(vec![
            r#"{"result":"error","kind":"NotFound","message":"container x not found"}"#,
            r#"{"result":"error","kind":"Conflict","message":"container x is Running, not Created"}"#,
            r#"{"result":"error","kind":"Invalid","message":"invalid reference"}"#,
            r#"{"result":"ok"}"#,
        ]);
        let e = c.container_status("x").expect_err("not found");
        assert!(
            matches!(&e, ClientError::NotFound(m) if m == "container x not found"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "container x not found",
            "the runtime's text, unprefixed"
        );
        let e = c.start_container("x").expect_err("conflict");
        assert_eq!(e.kind(), ErrorKind::Conflict);
        let e = c.image_status("Not A Ref").expect_err("invalid");
        assert_eq!(e.kind(), ErrorKind::Invalid);
        let e = c.version().expect_err("ok is not a version");
        assert!(matches!(e, ClientError::Unexpected(_)), "{e:?}");
        let seen = server.join().expect("server");
        assert_eq!(seen[0], r#"{"op":"containerStatus","id":"x"}"#);
        assert_eq!(seen[2], r#"{"op":"imageStatus","image":"Not A Ref"}"#);
    }

    #[test]
    fn transport_failures_are_unavailable() {
        let e = Client::connect(Path::new("/nonexistent/runtime.sock")).expect_err("no socket");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let (mut c, server) = fake(vec![]);
        server.join().expect("server");
        let e = c.list_images().expect_err("closed");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn exec_sync_rounds_its_timeout_up() {
        let (mut c, server) = fake(vec![r#"{"result":"execSync","outcome":{"exitCode":0}}"#]);
        let _ = c.exec_sync("c", vec!["true".into()], Some(Duration::from_millis(1500)));
        let seen = server.join().expect("server");
        assert!(seen[0].contains(r#""timeout_seconds":2"#), "{}", seen[0]);
    }
}
