//! The wire: one JSON request per line, one JSON reply per line, in order per connection (a
//! reply that waits for an event — an exit, a pull — holds the connection's later replies).
//! File descriptors (an exec's stdio) travel as SCM_RIGHTS with the request line that uses them.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::container::{ContainerConfig, ContainerStatus, ExecSyncResult};
use crate::error::ReplyError;
use crate::image::{Auth, Image, PullPolicy};
use crate::sandbox::{SandboxConfig, SandboxStatus};
use crate::stats::{ContainerStats, PodStats};

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
    /// Runs a command in a running container and replies with its exit code and output once it
    /// exits; after `timeout_seconds` (0: none) it is killed and the reply is a
    /// `DeadlineExceeded` error.
    ExecSync {
        id: String,
        command: Vec<String>,
        #[serde(default)]
        timeout_seconds: u64,
    },
    /// Makes `image` present per `policy` and replies with it once it is.
    PullImage {
        image: String,
        #[serde(default)]
        policy: PullPolicy,
        #[serde(default)]
        auth: Option<Auth>,
        /// Registry hosts (`host[:port]`) reached over plain HTTP; loopback always is.
        #[serde(default)]
        insecure_registries: Vec<String>,
    },
    /// The image if present (a reply without one when it is not).
    ImageStatus {
        image: String,
    },
    ListImages,
    /// Removes an image no container uses (nothing to do when it is absent).
    RemoveImage {
        image: String,
    },
    ContainerStats {
        id: String,
    },
    PodStats {
        sandbox_id: String,
        /// Also measure each container's disk usage (writable layer, logs): a walk of their
        /// files, so only for whoever needs it (the agent's local-storage checks), never for
        /// metrics.
        #[serde(default)]
        disk: bool,
    },
    /// Every ready sandbox's stats.
    ListPodStats,
    /// The node's pod CIDR (CRI's `UpdateRuntimeConfig`): sandboxes take their addresses from
    /// it. Refused (`Conflict`) once the pod network is up on another one.
    UpdateRuntimeConfig {
        pod_cidr: String,
    },
    /// A TCP connection to `localhost:<port>` inside the sandbox's network namespace (CRI's
    /// `PortForward`, as containerd dials it): replies `PortForward` with the socket attached
    /// (SCM_RIGHTS), possibly still connecting; a connection refused at once is an error naming
    /// both address families.
    PortForward {
        sandbox_id: String,
        port: u16,
    },
    /// The running container's input (CRI's `Attach`): replies `Attach`, with the write end of
    /// its stdin pipe or its terminal's master attached (SCM_RIGHTS) when it has one to give.
    Attach {
        id: String,
    },
}

/// Replies.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Reply {
    Ok,
    Error(ReplyError),
    Version {
        version: String,
    },
    Sandbox {
        status: SandboxStatus,
    },
    Sandboxes {
        items: Vec<SandboxStatus>,
    },
    Container {
        status: ContainerStatus,
    },
    Containers {
        items: Vec<ContainerStatus>,
    },
    Exec {
        exec_id: String,
    },
    ExecExit {
        exit_code: i32,
    },
    ExecSync {
        outcome: ExecSyncResult,
    },
    Image {
        image: Image,
    },
    ImageStatus {
        image: Option<Image>,
    },
    Images {
        items: Vec<Image>,
    },
    ContainerStats {
        stats: ContainerStats,
    },
    PodStats {
        stats: PodStats,
    },
    PodStatsList {
        items: Vec<PodStats>,
    },
    /// The socket travels with the reply (SCM_RIGHTS).
    PortForward,
    /// `input`: a descriptor travels with the reply (the terminal's master when `tty`, else the
    /// stdin pipe's write end); false when the container has no stdin, or a `stdinOnce`
    /// container's was taken already.
    Attach {
        tty: bool,
        input: bool,
    },
}

impl From<ReplyError> for Reply {
    fn from(e: ReplyError) -> Self {
        Reply::Error(e)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn errors_carry_their_kind_on_the_wire() {
        let r = Reply::Error(ReplyError::new(ErrorKind::NotFound, "container x not found"));
        let line = serde_json::to_string(&r).expect("encode");
        assert_eq!(
            line,
            r#"{"result":"error","kind":"NotFound","message":"container x not found"}"#
        );
        // A reply without a kind (an older runtime) is an internal error.
        let old: Reply = serde_json::from_str(r#"{"result":"error","message":"boom"}"#).expect("decode");
        assert!(matches!(
            old,
            Reply::Error(ReplyError {
                kind: ErrorKind::Internal,
                ..
            })
        ));
    }

    #[test]
    fn requests_keep_their_wire_names() {
        let r = Request::PullImage {
            image: "busybox:1".into(),
            policy: PullPolicy::Always,
            auth: None,
            insecure_registries: vec!["10.0.2.100:5000".into()],
        };
        let v = serde_json::to_value(&r).expect("encode");
        assert_eq!(v["op"], "pullImage");
        assert_eq!(v["policy"], "Always");
        let back: Request = serde_json::from_str(r#"{"op":"execSync","id":"c","command":["true"]}"#)
            .expect("timeout defaults to none");
        assert!(matches!(
            back,
            Request::ExecSync {
                timeout_seconds: 0,
                ..
            }
        ));
    }
}
