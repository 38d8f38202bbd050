//! Containers: what to create in a sandbox, and what the runtime reports about them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A container's requests and limits (CPU in millicores, memory in bytes): its scope's
/// `cpu.weight`, `cpu.max` and `memory.max`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default)]
    pub cpu_request: Option<u64>,
    #[serde(default)]
    pub cpu_limit: Option<u64>,
    #[serde(default)]
    pub memory_request: Option<u64>,
    #[serde(default)]
    pub memory_limit: Option<u64>,
}

impl Resources {
    /// Requests default to limits when only limits are given (API defaulting).
    pub fn effective_cpu_request(&self) -> Option<u64> {
        self.cpu_request.or(self.cpu_limit)
    }
    pub fn effective_memory_request(&self) -> Option<u64> {
        self.memory_request.or(self.memory_limit)
    }
}

/// A container's seccomp profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SeccompProfile {
    #[default]
    RuntimeDefault,
    Unconfined,
    /// `Localhost`: a profile file on the node. This runtime loads none and refuses the
    /// container (Invalid), so a pod asking for one never runs with another profile.
    Localhost,
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
    /// An image present on the node (see `PullImage`).
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
    /// The process's `oom_score_adj`, as the agent computed it (docs/SEEDS-SPEC.md NODE-45).
    #[serde(default)]
    pub oom_score_adj: i32,
    #[serde(default)]
    pub read_only_root_filesystem: bool,
    /// `allowPrivilegeEscalation: false`. A seccomp profile also implies it.
    #[serde(default)]
    pub no_new_privileges: bool,
    /// `securityContext.capabilities.add`, as Kubernetes writes them (`NET_ADMIN`, `ALL`).
    #[serde(default)]
    pub capabilities_add: Vec<String>,
    /// `securityContext.capabilities.drop`.
    #[serde(default)]
    pub capabilities_drop: Vec<String>,
    #[serde(default)]
    pub seccomp: SeccompProfile,
    /// `securityContext.privileged`: every capability, the node's devices, writable /sys and
    /// cgroupfs, nothing masked, no seccomp (whatever `seccomp` says, as containerd does).
    #[serde(default)]
    pub privileged: bool,
    /// File name of the log under the sandbox's log directory (`<name>/<restart>.log`).
    #[serde(default)]
    pub log_path: Option<String>,
    /// The agent's containerLogMaxSize / containerLogMaxFiles (runtime defaults: 10 MiB, 5).
    #[serde(default)]
    pub log_max_size: Option<u64>,
    #[serde(default)]
    pub log_max_files: Option<usize>,
    /// `stdin: true`: the process reads a pipe (or its terminal) that `Attach` hands out;
    /// otherwise its stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// `stdinOnce: true`: the first `Attach` takes the container's stdin away; when that client
    /// closes it, the process reads EOF, and later attaches get no stdin.
    #[serde(default)]
    pub stdin_once: bool,
    /// `tty: true`: the process runs on a pseudo-terminal (its controlling terminal, made in the
    /// container's own devpts); what it writes there goes to the log as stdout.
    #[serde(default)]
    pub tty: bool,
    /// Runs in the pid namespace of this other container of the sandbox (an ephemeral
    /// container's `targetContainerName`), not in its own or the sandbox's.
    #[serde(default)]
    pub target_container_id: Option<String>,
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

/// What a command run by `ExecSync` left: its exit code and output (each stream cut at
/// [`ExecSyncResult::MAX_OUTPUT`] bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecSyncResult {
    pub exit_code: i32,
    #[serde(default)]
    pub stdout: Vec<u8>,
    #[serde(default)]
    pub stderr: Vec<u8>,
}

impl ExecSyncResult {
    /// Output kept per stream; the rest is read and dropped (probes read 10 KiB of it).
    pub const MAX_OUTPUT: usize = 1 << 20;
}
