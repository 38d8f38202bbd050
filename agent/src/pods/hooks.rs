//! Lifecycle hooks (docs/SEEDS-SPEC.md NODE-26..NODE-30): postStart right after a container
//! starts (a failure kills it: `FailedPostStartHook`), preStop before it is stopped, inside the
//! grace period (`FailedPreStopHook`); handlers exec (in the container, through the runtime),
//! httpGet and tcpSocket (from the agent to the pod's IP) and sleep (counted by the agent). The
//! failure texts are the kubelet's (`handlerRunner.Run`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use super::probe::{self, ProbeError};
use super::status::pod_label;

/// Which hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    PostStart,
    PreStop,
}

impl Hook {
    /// The hook's handler in container `c`, if it has one.
    pub fn of(self, c: &Container) -> Option<&LifecycleHandler> {
        let l = c.lifecycle.as_ref()?;
        match self {
            Hook::PostStart => l.post_start.as_ref(),
            Hook::PreStop => l.pre_stop.as_ref(),
        }
    }

    /// The event reason of a failure.
    pub fn failed_reason(self) -> &'static str {
        match self {
            Hook::PostStart => "FailedPostStartHook",
            Hook::PreStop => "FailedPreStopHook",
        }
    }
}

/// Go's `%v` of a string slice: `[sh -c exit 1]`.
fn go_list(v: &[String]) -> String {
    format!("[{}]", v.join(" "))
}

/// Why a hook failed: the kubelet's `handlerRunner.Run` texts (the `FailedPostStartHook` /
/// `FailedPreStopHook` event messages).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "Exec lifecycle hook ({}) {who} failed - error: command '{}' exited with {code}: {output}, message: {output:?}",
        go_list(.cmd),
        .cmd.join(" ")
    )]
    ExecExit {
        cmd: Vec<String>,
        who: String,
        code: i32,
        output: String,
    },
    #[error("Exec lifecycle hook ({}) {who} failed - error: {source}, message: \"\"", go_list(.cmd))]
    Exec {
        cmd: Vec<String>,
        who: String,
        source: ProbeError,
    },
    #[error("HTTP lifecycle hook ({path}) {who} failed - error: {source}")]
    Http {
        path: String,
        who: String,
        source: ProbeError,
    },
    #[error("TCP lifecycle hook {who} failed - error: {source}")]
    Tcp { who: String, source: ProbeError },
    #[error("Cannot run handler: no handler in the lifecycle hook {who}")]
    NoHandler { who: String },
}

/// Runs handler `h` of container `c` (instance `container_id`) within `timeout`.
pub async fn run(
    h: &LifecycleHandler,
    c: &Container,
    container_id: &str,
    pod: &Pod,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), HookError> {
    let who = format!("for Container {:?} in Pod {:?}", c.name, pod_label(pod));
    if let Some(exec) = &h.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return match probe::exec(container_id, cmd.clone(), timeout).await {
            Ok(out) if out.exit_code == 0 => Ok(()),
            Ok(out) => Err(HookError::ExecExit {
                output: probe::exec_text(&out),
                code: out.exit_code,
                cmd,
                who,
            }),
            Err(source) => Err(HookError::Exec { cmd, who, source }),
        };
    }
    if let Some(s) = &h.sleep {
        let secs = u64::try_from(s.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(secs).min(timeout)).await;
        return Ok(());
    }
    let ip = pod_ip.unwrap_or("127.0.0.1");
    if let Some(g) = &h.http_get {
        let path = g.path.clone().unwrap_or_else(|| "/".into());
        return probe::http_action(c, g, ip, timeout)
            .await
            .map_err(|source| HookError::Http { path, who, source });
    }
    if let Some(t) = &h.tcp_socket {
        return probe::tcp_action(c, t, ip, timeout)
            .await
            .map_err(|source| HookError::Tcp { who, source });
    }
    Err(HookError::NoHandler { who })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Lifecycle, SleepAction};

    #[tokio::test]
    async fn sleep_is_counted_by_the_agent_and_bounded_by_the_grace_period() {
        let c = Container {
            name: "main".into(),
            lifecycle: Some(Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    sleep: Some(SleepAction { seconds: 30 }),
                    ..LifecycleHandler::default()
                }),
                ..Lifecycle::default()
            }),
            ..Container::default()
        };
        let h = Hook::PreStop.of(&c).expect("preStop");
        let started = std::time::Instant::now();
        let r = run(h, &c, "id", &Pod::default(), None, Duration::from_millis(200)).await;
        assert_eq!(r.map_err(|e| e.to_string()), Ok(()));
        assert!(started.elapsed() < Duration::from_secs(5), "cut at the timeout");
        assert!(Hook::PostStart.of(&c).is_none());
        assert_eq!(Hook::PreStop.failed_reason(), "FailedPreStopHook");
    }

    #[tokio::test]
    async fn network_hooks_say_what_failed() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"}}))
        .expect("pod");
        let c: Container = serde_json::from_value(serde_json::json!({"name": "main",
            "lifecycle": {"postStart": {"httpGet": {"path": "/hook", "port": port, "host": "127.0.0.1"}}}}))
        .expect("container");
        let h = Hook::PostStart.of(&c).expect("postStart");
        let r = run(h, &c, "id", &pod, None, Duration::from_secs(1))
            .await
            .map_err(|e| e.to_string());
        assert_eq!(
            r,
            Err(format!(
                "HTTP lifecycle hook (/hook) for Container \"main\" in Pod \"web_default(u1)\" failed - error: \
                 Get \"http://127.0.0.1:{port}/hook\": dial tcp 127.0.0.1:{port}: connect: connection refused"
            ))
        );
    }
}
