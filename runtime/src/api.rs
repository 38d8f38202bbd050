//! The runtime's interface: requests and replies as newline-delimited JSON over a unix socket,
//! and a blocking client. File descriptors (an exec's stdio) travel as SCM_RIGHTS with the
//! request line that uses them.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::cgroups::Resources;
use crate::seccomp::Profile;

/// Where the runtime listens on a node.
pub const SOCKET: &str = "/run/nodeos/runtime.sock";

/// DNS settings of a pod (`/etc/resolv.conf`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dns {
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub searches: Vec<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

/// A pod sandbox to create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxConfig {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    #[serde(default)]
    pub attempt: u32,
    /// Defaults to the pod name.
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub dns: Dns,
    /// Extra `/etc/hosts` lines (hostAliases).
    #[serde(default)]
    pub host_entries: Vec<String>,
    /// Every container of the pod (init containers included): the QoS class and pod slice values
    /// come from them.
    #[serde(default)]
    pub containers: Vec<Resources>,
    #[serde(default)]
    pub share_process_namespace: bool,
    /// The directory for the pod's container logs (`/var/log/pods/<ns>_<name>_<uid>`).
    #[serde(default)]
    pub log_directory: Option<PathBuf>,
}

/// A bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// A container to create in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerConfig {
    pub name: String,
    /// An image present in the node's store.
    pub image: String,
    /// Replaces the image's entrypoint when not empty.
    #[serde(default)]
    pub command: Vec<String>,
    /// Replaces the image's cmd when not empty.
    #[serde(default)]
    pub args: Vec<String>,
    /// `NAME=value`, after the image's environment.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub run_as_user: Option<u32>,
    #[serde(default)]
    pub run_as_group: Option<u32>,
    #[serde(default)]
    pub supplemental_groups: Vec<u32>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub resources: Resources,
    /// Pods with priority class `system-node-critical` get -997.
    #[serde(default)]
    pub node_critical: bool,
    #[serde(default)]
    pub read_only_root_filesystem: bool,
    /// `allowPrivilegeEscalation: false`. A seccomp profile also implies it (see `seccomp`).
    #[serde(default)]
    pub no_new_privileges: bool,
    #[serde(default)]
    pub seccomp: Profile,
    /// File name of the log under the sandbox's log directory (`<name>/<restart>.log`).
    #[serde(default)]
    pub log_path: Option<String>,
    /// The agent's containerLogMaxSize / containerLogMaxFiles (runtime defaults: 10 MiB, 5).
    #[serde(default)]
    pub log_max_size: Option<u64>,
    #[serde(default)]
    pub log_max_files: Option<usize>,
}

/// What a container is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Created,
    Running,
    Exited,
    Unknown,
}

/// A container as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub image: String,
    pub state: State,
    pub pid: Option<i32>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    /// Set when the process was killed by a signal (exit code is then 128 + signal).
    pub signal: Option<i32>,
    /// `OOMKilled` (memory.events oom_kill > 0), `Error`, `Completed`, or None while running.
    pub reason: Option<String>,
    pub cgroup: String,
    pub log_path: Option<PathBuf>,
}

/// A sandbox as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub ready: bool,
    pub pause_pid: Option<i32>,
    pub ip: Option<String>,
    pub cgroup: String,
    pub qos: crate::cgroups::Qos,
    pub created_at: String,
}

/// Requests.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    Version,
    RunSandbox {
        config: SandboxConfig,
    },
    StopSandbox {
        id: String,
    },
    RemoveSandbox {
        id: String,
    },
    ListSandboxes,
    CreateContainer {
        sandbox_id: String,
        config: ContainerConfig,
    },
    StartContainer {
        id: String,
    },
    /// Signal (SIGTERM), then SIGKILL after `timeout_seconds`; replies once it has exited.
    StopContainer {
        id: String,
        timeout_seconds: u64,
    },
    /// Replies once the container has exited.
    WaitContainer {
        id: String,
    },
    RemoveContainer {
        id: String,
    },
    ContainerStatus {
        id: String,
    },
    ListContainers,
    /// Runs a process in a running container with the three fds sent along as its stdio; replies
    /// with the exec id at once.
    Exec {
        id: String,
        command: Vec<String>,
    },
    /// Replies when the exec has exited, with its exit code.
    WaitExec {
        exec_id: String,
    },
}

/// Replies.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Reply {
    Ok,
    Error { message: String },
    Version { version: String },
    Sandbox { status: SandboxStatus },
    Sandboxes { items: Vec<SandboxStatus> },
    Container { status: ContainerStatus },
    Containers { items: Vec<ContainerStatus> },
    Exec { exec_id: String },
    ExecExit { exit_code: i32 },
}

/// Client-side failures.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("runtime socket {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("talking to the runtime: {0}")]
    Io(#[from] io::Error),
    #[error("runtime reply: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("runtime: {0}")]
    Runtime(String),
    #[error("unexpected reply from the runtime: {0:?}")]
    Unexpected(Box<Reply>),
}

/// Sends `line` with `fds` attached (SCM_RIGHTS).
pub fn send_line(sock: &UnixStream, line: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut sent = 0;
    while sent < line.len() {
        let iov = [IoSlice::new(&line[sent..])];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if sent == 0 && !fds.is_empty() { &cmsg } else { &[] };
        sent += sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
            .map_err(io::Error::from)?;
    }
    Ok(())
}

/// Reads what is available into `buf`, collecting passed fds. Returns bytes read (0 = EOF).
pub fn recv_some(fd: RawFd, buf: &mut Vec<u8>, fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [IoSliceMut::new(&mut chunk)];
    let msg =
        recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).map_err(io::Error::from)?;
    let n = msg.bytes;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(crate::sys::adopt_fds(raw));
        }
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// A connection to the runtime (one request at a time).
#[derive(Debug)]
pub struct Client {
    sock: UnixStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let sock = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        Ok(Client {
            sock,
            buf: Vec::new(),
        })
    }

    /// Waits up to `timeout` for the socket to appear (the runtime starting).
    pub fn connect_wait(path: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match Self::connect(path) {
                Ok(c) => return Ok(c),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Sends one request (with fds) and reads its reply; `Reply::Error` becomes an error.
    pub fn call_with_fds(&mut self, req: &Request, fds: &[RawFd]) -> Result<Reply, ClientError> {
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        send_line(&self.sock, &line, fds)?;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return match serde_json::from_slice::<Reply>(&line)? {
                    Reply::Error { message } => Err(ClientError::Runtime(message)),
                    r => Ok(r),
                };
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.sock.read(&mut chunk)?;
            if n == 0 {
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "runtime closed the connection",
                )));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn call(&mut self, req: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(req, &[])
    }

    pub fn run_sandbox(&mut self, config: SandboxConfig) -> Result<SandboxStatus, ClientError> {
        match self.call(&Request::RunSandbox { config })? {
            Reply::Sandbox { status } => Ok(status),
            r => Err(ClientError::Unexpected(Box::new(r))),
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
            r => Err(ClientError::Unexpected(Box::new(r))),
        }
    }

    pub fn list_containers(&mut self) -> Result<Vec<ContainerStatus>, ClientError> {
        match self.call(&Request::ListContainers)? {
            Reply::Containers { items } => Ok(items),
            r => Err(ClientError::Unexpected(Box::new(r))),
        }
    }

    pub fn list_sandboxes(&mut self) -> Result<Vec<SandboxStatus>, ClientError> {
        match self.call(&Request::ListSandboxes)? {
            Reply::Sandboxes { items } => Ok(items),
            r => Err(ClientError::Unexpected(Box::new(r))),
        }
    }

    fn expect_ok(&mut self, req: &Request) -> Result<(), ClientError> {
        match self.call(req)? {
            Reply::Ok => Ok(()),
            r => Err(ClientError::Unexpected(Box::new(r))),
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
            r => Err(ClientError::Unexpected(Box::new(r))),
        }
    }

    pub fn wait_exec(&mut self, exec_id: &str) -> Result<i32, ClientError> {
        match self.call(&Request::WaitExec {
            exec_id: exec_id.into(),
        })? {
            Reply::ExecExit { exit_code } => Ok(exit_code),
            r => Err(ClientError::Unexpected(Box::new(r))),
        }
    }
}
