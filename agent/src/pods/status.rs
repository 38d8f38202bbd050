//! The pod's status from what the agent observed: one pure function, [`pod_status`]
//! (docs/SEEDS-SPEC.md §4.4, NODE-14..NODE-17, Appendix C; the kubelet's `generateAPIPodStatus`,
//! `getPhase` and `status/generate.go`).
//!
//! The result starts from the pod's current status, so fields the agent does not own
//! (`qosClass`, `nominatedNodeName`, `PodScheduled`, `DisruptionTarget`, readiness-gate
//! conditions) are kept, and a result equal to the current status means there is nothing to
//! write. Times are whole seconds, as the API keeps them.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::chrono::{DateTime, Utc};

use super::plan::{Ctr, Observed, Run, Terminated, is_sidecar, restart_policy, restarts_after};
use kcore::time::go_duration;

/// The prefix of `containerID`s (the runtime's name, as `containerd://` upstream).
pub const CONTAINER_ID_PREFIX: &str = "nodeos://";

/// The conditions the agent owns, in the order the kubelet prints them.
const OWNED: [&str; 4] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
];

/// The condition a pod the node stops on its own gets (node shutdown, node-pressure eviction),
/// with this reason.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// A time as the API keeps it (whole seconds).
pub fn time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Time(DateTime::<Utc>::from(
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
    ))
}

/// `name_namespace(uid)`, as the kubelet names a pod in its messages (`format.Pod`).
pub fn pod_label(pod: &Pod) -> String {
    let m = &pod.metadata;
    format!(
        "{}_{}({})",
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

fn terminated(t: &Terminated) -> ContainerStateTerminated {
    ContainerStateTerminated {
        container_id: Some(format!("{CONTAINER_ID_PREFIX}{}", t.id)),
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        started_at: t.started.map(time),
        finished_at: Some(time(t.finished)),
        message: None,
    }
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message,
        }),
        ..ContainerState::default()
    }
}

/// One container's status. `default_reason` is the waiting reason before its first start
/// (`ContainerCreating`, or `PodInitializing` in a pod with init containers).
/// Which list of the pod's spec a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Init,
    Main,
    Ephemeral,
}

fn container_status(
    pod: &Pod,
    c: &Container,
    seen: Option<&Ctr>,
    list: List,
    default_reason: &str,
    now: SystemTime,
) -> ContainerStatus {
    let policy = pod.spec.as_ref().map_or("Always", restart_policy);
    let sidecar = list == List::Init && is_sidecar(c);
    // Whether the container is started again after exiting with `code`: a sidecar always, a
    // regular init container after a failure unless the pod never restarts, an ephemeral
    // container never.
    let restarts = |code: i32| match list {
        _ if sidecar => true,
        List::Init => code != 0 && policy != "Never",
        List::Main => restarts_after(policy, code),
        List::Ephemeral => false,
    };
    let current = seen.and_then(|s| s.current.as_ref());
    let mut last = seen.and_then(|s| s.last.as_ref()).map(terminated);
    let (state, ready) = match current.map(|i| &i.run) {
        None => {
            let failure = seen.and_then(|s| s.failure.as_ref());
            let pull_backoff = seen
                .and_then(|s| s.start_backoff.retry_at())
                .is_some_and(|at| at > now);
            let state = match failure {
                Some(f) if f.reason == "ErrImagePull" && pull_backoff => waiting(
                    "ImagePullBackOff",
                    Some(format!(
                        "Back-off pulling image \"{}\": ErrImagePull: {}",
                        c.image.as_deref().unwrap_or_default(),
                        f.message
                    )),
                ),
                Some(f) => waiting(&f.reason, Some(f.message.clone())),
                None => waiting(default_reason, None),
            };
            (state, false)
        }
        Some(Run::Created) => (waiting("ContainerCreating", None), false),
        Some(Run::Running { started }) => (
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(time(*started)),
                }),
                ..ContainerState::default()
            },
            seen.is_some_and(|s| s.started_and_ready(c).1),
        ),
        Some(Run::Exited(t)) => {
            let delay = seen.map_or(Duration::ZERO, |s| s.backoff.delay(t.finished));
            let at = seen.map_or(t.finished, |s| s.backoff.restart_at(t.finished));
            if restarts(t.exit_code) && at > now {
                last = Some(terminated(t));
                let message = format!(
                    "back-off {} restarting failed container={} pod={}",
                    go_duration(delay),
                    c.name,
                    pod_label(pod)
                );
                (waiting("CrashLoopBackOff", Some(message)), false)
            } else {
                (
                    ContainerState {
                        terminated: Some(terminated(t)),
                        ..ContainerState::default()
                    },
                    false,
                )
            }
        }
    };
    let started = seen.is_some_and(|s| s.started_and_ready(c).0);
    // Ephemeral containers have no readiness (the kubelet reports them not ready).
    let ready = ready && list != List::Ephemeral;
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: current.map(|i| i.image_id.clone()).unwrap_or_default(),
        container_id: current.map(|i| format!("{CONTAINER_ID_PREFIX}{}", i.id)),
        ready,
        started: Some(started),
        restart_count: seen.map_or(0, |s| i32::try_from(s.restarts).unwrap_or(i32::MAX)),
        state: Some(state),
        last_state: last.map(|t| ContainerState {
            terminated: Some(t),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

fn state_of(s: &ContainerStatus) -> (&ContainerState, bool) {
    static EMPTY: ContainerState = ContainerState {
        running: None,
        terminated: None,
        waiting: None,
    };
    (
        s.state.as_ref().unwrap_or(&EMPTY),
        s.last_state.as_ref().is_some_and(|l| l.terminated.is_some()),
    )
}

/// The phase, as the kubelet's `getPhase` counts the container statuses.
fn phase(
    policy: &str,
    spec_init: &[Container],
    init: &[ContainerStatus],
    main: &[ContainerStatus],
) -> &'static str {
    let (mut pending_init, mut failed_init) = (0, 0);
    for (c, s) in spec_init.iter().zip(init) {
        if is_sidecar(c) {
            continue;
        }
        let (state, had_exit) = state_of(s);
        match (&state.terminated, &state.waiting) {
            (Some(t), _) if t.exit_code == 0 => {}
            (Some(_), _) => failed_init += 1,
            (None, Some(_)) if had_exit => failed_init += 1,
            _ => pending_init += 1,
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in main {
        let (state, had_exit) = state_of(s);
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if had_exit {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    let mains_started = running + stopped > 0;
    if (pending_init > 0 || failed_init > 0) && !mains_started {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

fn names(list: &[&str]) -> String {
    format!("[{}]", list.join(" "))
}

fn condition(kind: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        ..PodCondition::default()
    }
}

/// The status to write for `pod`, given what the agent observed of it at `now`.
pub fn pod_status(pod: &Pod, obs: &Observed, node_ip: Option<&str>, now: SystemTime) -> PodStatus {
    let old = pod.status.clone().unwrap_or_default();
    let Some(spec) = pod.spec.as_ref() else {
        return old;
    };
    let policy = restart_policy(spec);
    let spec_init: &[Container] = spec.init_containers.as_deref().unwrap_or_default();
    let default_reason = if spec_init.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let status_of = |c: &Container, list| {
        container_status(pod, c, obs.containers.get(&c.name), list, default_reason, now)
    };
    let init: Vec<ContainerStatus> = spec_init.iter().map(|c| status_of(c, List::Init)).collect();
    let main: Vec<ContainerStatus> = spec.containers.iter().map(|c| status_of(c, List::Main)).collect();
    let ephemeral: Vec<ContainerStatus> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|e| status_of(&super::plan::ephemeral_as_container(e), List::Ephemeral))
        .collect();

    // Terminal phases stay (NODE-12: a terminal pod never runs again). A pod the node failed
    // is Failed with the node's reason and message.
    let was_terminal = matches!(old.phase.as_deref(), Some("Succeeded" | "Failed"));
    let phase = match (old.phase.as_deref(), &obs.failed) {
        (Some("Succeeded"), _) => "Succeeded",
        (Some("Failed"), _) | (_, Some(_)) => "Failed",
        _ => phase(policy, spec_init, &init, &main),
    };

    let mains_started = main
        .iter()
        .any(|s| s.state.as_ref().is_some_and(|st| st.waiting.is_none()) || state_of(s).1);
    let incomplete: Vec<&str> = spec_init
        .iter()
        .zip(&init)
        .filter(|(c, s)| {
            if is_sidecar(c) {
                s.started != Some(true)
            } else {
                let done = s
                    .state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0);
                !(mains_started || done)
            }
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    let unready: Vec<&str> = spec_init
        .iter()
        .zip(&init)
        .filter(|(c, s)| is_sidecar(c) && !s.ready)
        .chain(spec.containers.iter().zip(&main).filter(|(_, s)| !s.ready))
        .map(|(c, _)| c.name.as_str())
        .collect();

    let sandbox_ready = obs.sandbox.as_ref().is_some_and(|s| s.ready);
    let initialized = condition(
        "Initialized",
        incomplete.is_empty(),
        Some("ContainersNotInitialized"),
        Some(format!(
            "containers with incomplete status: {}",
            names(&incomplete)
        )),
    );
    let containers_ready = if phase == "Succeeded" {
        condition("ContainersReady", false, Some("PodCompleted"), None)
    } else {
        condition(
            "ContainersReady",
            unready.is_empty(),
            Some("ContainersNotReady"),
            Some(format!("containers with unready status: {}", names(&unready))),
        )
    };
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let ready = if containers_ready.status != "True" {
        PodCondition {
            type_: "Ready".into(),
            ..containers_ready.clone()
        }
    } else {
        let gates: Vec<String> = spec
            .readiness_gates
            .iter()
            .flatten()
            .filter_map(
                |g| match old_conditions.iter().find(|c| c.type_ == g.condition_type) {
                    None => Some(format!(
                        "corresponding condition of pod readiness gate \"{}\" does not exist.",
                        g.condition_type
                    )),
                    Some(c) if c.status != "True" => Some(format!(
                        "the status of pod readiness gate \"{}\" is not \"True\", but {}",
                        g.condition_type, c.status
                    )),
                    Some(_) => None,
                },
            )
            .collect();
        condition(
            "Ready",
            gates.is_empty(),
            Some("ReadinessGatesNotReady"),
            Some(gates.join(", ")),
        )
    };
    let ours = [
        condition("PodReadyToStartContainers", sandbox_ready, None, None),
        initialized,
        ready,
        containers_ready,
    ];
    let mut conditions: Vec<PodCondition> = ours
        .into_iter()
        .map(|mut c| {
            let before = old_conditions.iter().find(|o| o.type_ == c.type_);
            c.last_transition_time = match before {
                Some(b) if b.status == c.status => b.last_transition_time.clone(),
                _ => Some(time(now)),
            };
            c
        })
        .collect();
    conditions.extend(
        old_conditions
            .into_iter()
            .filter(|c| !OWNED.contains(&c.type_.as_str())),
    );

    if let (Some(f), false) = (&obs.failed, was_terminal)
        && f.disruption
    {
        let since = conditions
            .iter()
            .find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True")
            .and_then(|c| c.last_transition_time.clone());
        conditions.retain(|c| c.type_ != DISRUPTION_TARGET);
        conditions.push(PodCondition {
            type_: DISRUPTION_TARGET.into(),
            status: "True".into(),
            reason: Some(TERMINATION_BY_KUBELET.into()),
            message: Some(f.message.clone()),
            last_transition_time: since.or_else(|| Some(time(now))),
            ..PodCondition::default()
        });
    }

    let mut status = old;
    if let (Some(f), false) = (&obs.failed, was_terminal) {
        status.reason = Some(f.reason.into());
        status.message = Some(f.message.clone());
    }
    status.phase = Some(phase.into());
    status.conditions = Some(conditions);
    status.init_container_statuses = (!init.is_empty()).then_some(init);
    status.container_statuses = Some(main);
    status.ephemeral_container_statuses = (!ephemeral.is_empty()).then_some(ephemeral);
    if status.start_time.is_none() {
        status.start_time = Some(time(now));
    }
    if let Some(ip) = node_ip {
        status.host_ip = Some(ip.into());
        status.host_ips = Some(vec![HostIP { ip: ip.into() }]);
    }
    if let Some(ip) = pod_ip(pod, obs, node_ip) {
        status.pod_ip = Some(ip.clone());
        status.pod_ips = Some(vec![PodIP { ip }]);
    }
    status
}

/// The pod's address: its sandbox's, or the node's for a pod on the node's network (it has
/// no sandbox address; the kubelet reports the host's).
pub fn pod_ip(pod: &Pod, obs: &Observed, node_ip: Option<&str>) -> Option<String> {
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let sandbox = obs.sandbox.as_ref()?;
    match (&sandbox.ip, host_network) {
        (Some(ip), _) => Some(ip.clone()),
        (None, true) => node_ip.map(str::to_string),
        (None, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::plan::tests::{
        at, container, exited, instance, observed, running, sandbox, sidecar, spec, terminated,
    };
    use crate::pods::plan::{Failure, Sandbox};
    use k8s_openapi::api::core::v1::{PodReadinessGate, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(spec: PodSpec) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    /// phase, then `type=status/reason` per condition, then per container `name:state-reason`.
    fn summary(s: &PodStatus) -> String {
        let conds: Vec<String> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| {
                format!(
                    "{}={}{}",
                    c.type_,
                    c.status,
                    c.reason.as_deref().map(|r| format!("/{r}")).unwrap_or_default()
                )
            })
            .collect();
        let ctr = |c: &ApiContainerStatus| {
            let st = c.state.as_ref().expect("state");
            let what = match (&st.waiting, &st.running, &st.terminated) {
                (Some(w), _, _) => format!("waiting-{}", w.reason.as_deref().unwrap_or_default()),
                (_, Some(_), _) => "running".to_string(),
                (_, _, Some(t)) => format!(
                    "terminated-{}-{}",
                    t.reason.as_deref().unwrap_or_default(),
                    t.exit_code
                ),
                _ => "none".to_string(),
            };
            format!("{}:{what}:{}", c.name, c.restart_count)
        };
        let init: Vec<String> = s.init_container_statuses.iter().flatten().map(ctr).collect();
        let main: Vec<String> = s.container_statuses.iter().flatten().map(ctr).collect();
        format!(
            "{} | {} | {} | {}",
            s.phase.as_deref().unwrap_or_default(),
            conds.join(" "),
            init.join(" "),
            main.join(" ")
        )
    }

    use k8s_openapi::api::core::v1::ContainerStatus as ApiContainerStatus;

    #[test]
    fn phases_conditions_and_container_states() {
        let init = [container("init-a"), container("init-b")];
        let mut crashed = exited(1, 100);
        crashed.restarts = 2;
        crashed.backoff.step(at(40), at(40));
        crashed.backoff.step(at(50), at(50));
        let mut init_crashed = exited(1, 100);
        init_crashed.backoff.step(at(40), at(40));
        init_crashed.backoff.step(at(50), at(50));
        let pulling = crate::pods::plan::Ctr {
            failure: Some(Failure {
                reason: "ErrImagePull".into(),
                message: "unreachable".into(),
            }),
            start_backoff: {
                let mut b = crate::pods::backoff::Backoff::default();
                b.step(at(105), at(105));
                b
            },
            ..crate::pods::plan::Ctr::default()
        };
        let table = [
            (
                "a new pod",
                spec("Always", &[], &["main"]),
                observed(None, &[]),
                "Pending | PodReadyToStartContainers=False Initialized=True Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady |  | main:waiting-ContainerCreating:0",
            ),
            (
                "running",
                spec("Always", &[], &["main"]),
                observed(sandbox(true), &[("main", running())]),
                "Running | PodReadyToStartContainers=True Initialized=True Ready=True ContainersReady=True |  | main:running:0",
            ),
            (
                "crash loop: waiting with the back-off, the pod still Running",
                spec("Always", &[], &["main"]),
                observed(sandbox(true), &[("main", crashed.clone())]),
                "Running | PodReadyToStartContainers=True Initialized=True Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady |  | main:waiting-CrashLoopBackOff:2",
            ),
            (
                "a Never pod whose container failed",
                spec("Never", &[], &["main"]),
                observed(sandbox(true), &[("main", exited(3, 100))]),
                "Failed | PodReadyToStartContainers=True Initialized=True Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady |  | main:terminated-Error-3:0",
            ),
            (
                "an OnFailure pod whose containers all exited 0",
                spec("OnFailure", &[], &["a", "b"]),
                observed(sandbox(true), &[("a", exited(0, 100)), ("b", exited(0, 101))]),
                "Succeeded | PodReadyToStartContainers=True Initialized=True Ready=False/PodCompleted ContainersReady=False/PodCompleted |  | a:terminated-Completed-0:0 b:terminated-Completed-0:0",
            ),
            (
                "OnFailure with one failure keeps running (it restarts)",
                spec("OnFailure", &[], &["a", "b"]),
                observed(sandbox(true), &[("a", exited(0, 100)), ("b", exited(1, 101))]),
                "Running | PodReadyToStartContainers=True Initialized=True Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady |  | a:terminated-Completed-0:0 b:terminated-Error-1:0",
            ),
            (
                "an init container running",
                spec("Always", &init, &["main"]),
                observed(sandbox(true), &[("init-a", running())]),
                "Pending | PodReadyToStartContainers=True Initialized=False/ContainersNotInitialized Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady | init-a:running:0 init-b:waiting-PodInitializing:0 | main:waiting-PodInitializing:0",
            ),
            (
                "a failed init container in a Never pod fails the pod",
                spec("Never", &init, &["main"]),
                observed(sandbox(true), &[("init-a", exited(1, 100))]),
                "Failed | PodReadyToStartContainers=True Initialized=False/ContainersNotInitialized Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady | init-a:terminated-Error-1:0 init-b:waiting-PodInitializing:0 | main:waiting-PodInitializing:0",
            ),
            (
                "a failed init container in back-off (Init:CrashLoopBackOff)",
                spec("Always", &init, &["main"]),
                observed(sandbox(true), &[("init-a", init_crashed)]),
                "Pending | PodReadyToStartContainers=True Initialized=False/ContainersNotInitialized Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady | init-a:waiting-CrashLoopBackOff:0 init-b:waiting-PodInitializing:0 | main:waiting-PodInitializing:0",
            ),
            (
                "a running sidecar counts as initialized and must be ready",
                spec("Always", &[sidecar("proxy")], &["main"]),
                observed(sandbox(true), &[("proxy", running()), ("main", running())]),
                "Running | PodReadyToStartContainers=True Initialized=True Ready=True ContainersReady=True | proxy:running:0 | main:running:0",
            ),
            (
                "a failed pull in back-off",
                spec("Always", &[], &["main"]),
                observed(sandbox(true), &[("main", pulling)]),
                "Pending | PodReadyToStartContainers=True Initialized=True Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady |  | main:waiting-ImagePullBackOff:0",
            ),
        ];
        for (what, spec, obs, want) in table {
            let s = pod_status(&pod(spec), &obs, Some("10.0.2.15"), at(110));
            assert_eq!(summary(&s), want, "{what}");
        }
    }

    /// Ephemeral containers get statuses of their own, are never ready, never restarted
    /// (no CrashLoopBackOff whatever the policy), and change neither phase nor readiness.
    #[test]
    fn ephemeral_containers_have_statuses_of_their_own() {
        let mut s = spec("Always", &[], &["main"]);
        s.ephemeral_containers = Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
            name: "dbg".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }]);
        let p = pod(s);
        let ephemeral = |st: &PodStatus| -> Vec<String> {
            st.ephemeral_container_statuses
                .iter()
                .flatten()
                .map(|c| {
                    let state = c.state.as_ref().expect("state");
                    let what = match (&state.waiting, &state.running, &state.terminated) {
                        (Some(w), _, _) => format!("waiting-{}", w.reason.as_deref().unwrap_or_default()),
                        (_, Some(_), _) => "running".into(),
                        (_, _, Some(t)) => format!("terminated-{}", t.exit_code),
                        _ => "none".into(),
                    };
                    format!("{}:{what}:{}:{}", c.name, c.ready, c.restart_count)
                })
                .collect()
        };
        let table = [
            (
                observed(sandbox(true), &[("main", running())]),
                "dbg:waiting-ContainerCreating:false:0",
            ),
            (
                observed(sandbox(true), &[("main", running()), ("dbg", running())]),
                "dbg:running:false:0",
            ),
            (
                observed(sandbox(true), &[("main", running()), ("dbg", exited(1, 100))]),
                "dbg:terminated-1:false:0",
            ),
        ];
        for (obs, want) in table {
            let st = pod_status(&p, &obs, None, at(110));
            assert_eq!(ephemeral(&st).join(" "), want);
            assert_eq!(
                summary(&st),
                "Running | PodReadyToStartContainers=True Initialized=True Ready=True ContainersReady=True |  | main:running:0"
            );
        }
    }

    #[test]
    fn messages_are_the_kubelets() {
        let mut crashed = exited(1, 100);
        crashed.backoff.step(at(10), at(20));
        crashed.backoff.step(at(60), at(60));
        crashed.last = Some(terminated(1, 50));
        let p = pod(spec("Always", &[container("init-a")], &["main", "side"]));
        let obs = observed(sandbox(true), &[("init-a", exited(0, 5)), ("main", crashed)]);
        let s = pod_status(&p, &obs, Some("10.0.2.15"), at(110));
        let main = &s.container_statuses.as_ref().expect("statuses")[0];
        let waiting = main
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .expect("waiting");
        assert_eq!(
            waiting.message.as_deref(),
            Some("back-off 20s restarting failed container=main pod=web_default(u1)")
        );
        let last = main
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("last");
        assert_eq!(
            (last.exit_code, last.container_id.as_deref()),
            (1, Some("nodeos://c100"))
        );
        let cond = |t: &str| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t)
                .and_then(|c| c.message.clone())
        };
        assert_eq!(
            cond("ContainersReady").as_deref(),
            Some("containers with unready status: [main side]")
        );
        assert_eq!(cond("Initialized"), None);
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.5"));
        assert_eq!(s.host_ips.as_ref().map(|h| h[0].ip.as_str()), Some("10.0.2.15"));

        let p = pod(spec(
            "Always",
            &[container("init-a"), container("init-b")],
            &["main"],
        ));
        let s = pod_status(&p, &observed(sandbox(true), &[]), None, at(110));
        let init = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Initialized")
            .expect("cond");
        assert_eq!(
            init.message.as_deref(),
            Some("containers with incomplete status: [init-a init-b]")
        );
    }

    #[test]
    fn a_pod_stopped_for_node_shutdown_is_a_disruption_target() {
        use crate::pods::eviction::PodFailure;
        use crate::pods::shutdown::{MESSAGE, REASON};
        let mut p = pod(spec("Always", &[], &["main"]));
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        let mut obs = observed(sandbox(true), &[("main", exited(143, 150))]);
        obs.failed = Some(PodFailure {
            reason: REASON,
            message: MESSAGE.into(),
            grace: Some(20),
            disruption: true,
        });
        let s = pod_status(&p, &obs, None, at(160));
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref(), s.message.as_deref()),
            (
                Some("Failed"),
                Some("Terminated"),
                Some("Pod was terminated in response to imminent node shutdown.")
            )
        );
        let conditions = s.conditions.clone().unwrap_or_default();
        let target = conditions
            .iter()
            .find(|c| c.type_ == DISRUPTION_TARGET)
            .expect("DisruptionTarget");
        assert_eq!(
            (
                target.status.as_str(),
                target.reason.as_deref(),
                target.message.as_deref(),
                target.last_transition_time.clone()
            ),
            (
                "True",
                Some("TerminationByKubelet"),
                Some(MESSAGE),
                Some(time(at(160)))
            )
        );
        assert!(
            conditions.iter().any(|c| c.type_ == "PodScheduled"),
            "kept: {conditions:?}"
        );
        // Once written, a later round (the agent restarted and forgot why) keeps it as it is.
        p.status = Some(s.clone());
        let later = pod_status(
            &p,
            &observed(sandbox(false), &[("main", exited(143, 150))]),
            None,
            at(300),
        );
        let target_of = |s: &PodStatus| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == DISRUPTION_TARGET)
                .cloned()
        };
        assert_eq!(target_of(&later), Some(target.clone()));
        assert_eq!(later.reason.as_deref(), Some(REASON));
        // A deadline is not a disruption.
        let mut deadline = obs.clone();
        deadline.failed = Some(PodFailure {
            reason: "DeadlineExceeded",
            message: "past".into(),
            grace: None,
            disruption: false,
        });
        let d = pod_status(&pod(spec("Always", &[], &["main"])), &deadline, None, at(160));
        assert!(
            !d.conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == DISRUPTION_TARGET),
            "a deadline adds no DisruptionTarget"
        );
    }

    #[test]
    fn a_pod_the_node_failed_is_failed_with_its_reason() {
        use crate::pods::eviction::{DEADLINE_MESSAGE, DEADLINE_REASON, PodFailure};
        let mut p = pod(spec("Always", &[], &["main"]));
        let mut obs = observed(sandbox(true), &[("main", running())]);
        obs.failed = Some(PodFailure {
            reason: DEADLINE_REASON,
            message: DEADLINE_MESSAGE.into(),
            grace: None,
            disruption: false,
        });
        let s = pod_status(&p, &obs, None, at(100));
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref(), s.message.as_deref()),
            (Some("Failed"), Some(DEADLINE_REASON), Some(DEADLINE_MESSAGE))
        );
        // Written once, it stays, with its reason, after the agent forgot why (a restart).
        p.status = Some(s);
        let later = pod_status(
            &p,
            &observed(sandbox(true), &[("main", exited(137, 150))]),
            None,
            at(200),
        );
        assert_eq!(
            (later.phase.as_deref(), later.reason.as_deref()),
            (Some("Failed"), Some(DEADLINE_REASON))
        );
        // A pod that already ended keeps its own phase and reason.
        let mut done = pod(spec("Never", &[], &["main"]));
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        let s = pod_status(&done, &obs, None, at(300));
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref()),
            (Some("Succeeded"), None)
        );
    }

    #[test]
    fn foreign_conditions_times_and_terminal_phases_are_kept() {
        let mut p = pod(spec("Always", &[], &["main"]));
        let obs = observed(sandbox(true), &[("main", running())]);
        let first = pod_status(&p, &obs, None, at(100));
        let mut old = first.clone();
        old.conditions.get_or_insert_default().push(PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            ..PodCondition::default()
        });
        old.qos_class = Some("BestEffort".into());
        p.status = Some(old.clone());
        let again = pod_status(&p, &obs, None, at(200));
        assert_eq!(again, old, "nothing changed: nothing to write (times kept)");
        let types: Vec<&str> = again
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            OWNED.iter().copied().chain(["PodScheduled"]).collect::<Vec<_>>()
        );

        // The container crashes: Ready changes at 200, the others keep their time.
        let crashed = observed(sandbox(true), &[("main", exited(1, 150))]);
        let s = pod_status(&p, &crashed, None, at(200));
        for c in s.conditions.iter().flatten() {
            let want = if c.type_.contains("Ready") && c.type_ != "PodReadyToStartContainers" {
                200
            } else {
                100
            };
            if c.type_ != "PodScheduled" {
                assert_eq!(c.last_transition_time, Some(time(at(want))), "{}", c.type_);
            }
        }
        assert_eq!(s.start_time, Some(time(at(100))));

        p.status.get_or_insert_default().phase = Some("Succeeded".into());
        let gone = Observed {
            sandbox: Some(Sandbox {
                ready: false,
                ..sandbox(true).expect("sb")
            }),
            ..Observed::default()
        };
        assert_eq!(
            pod_status(&p, &gone, None, at(300)).phase.as_deref(),
            Some("Succeeded")
        );
    }

    #[test]
    fn probes_decide_started_and_ready() {
        use crate::pods::probe::{Kind, Prober};
        use k8s_openapi::api::core::v1::Probe;
        let mut s = spec("Always", &[], &["main"]);
        s.containers[0].readiness_probe = Some(Probe::default());
        s.containers[0].startup_probe = Some(Probe::default());
        let p = pod(s);
        let flags = |probes: &[(Kind, bool)]| {
            let mut c = running();
            for (k, r) in probes {
                c.probes.insert(*k, Prober::concluded(*r));
            }
            let st = pod_status(&p, &observed(sandbox(true), &[("main", c)]), None, at(100));
            let cs = &st.container_statuses.expect("statuses")[0];
            let ready = st
                .conditions
                .expect("conditions")
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .expect("Ready");
            (cs.started, cs.ready, ready.status)
        };
        assert_eq!(
            flags(&[]),
            (Some(false), false, "False".into()),
            "before the startup probe succeeds"
        );
        assert_eq!(
            flags(&[(Kind::Startup, true)]),
            (Some(true), false, "False".into()),
            "started, not yet ready"
        );
        assert_eq!(
            flags(&[(Kind::Startup, true), (Kind::Readiness, true)]),
            (Some(true), true, "True".into())
        );
        assert_eq!(
            flags(&[(Kind::Startup, true), (Kind::Readiness, false)]),
            (Some(true), false, "False".into()),
            "readiness failed"
        );
        // The readiness result does not count before the startup probe succeeded.
        assert_eq!(
            flags(&[(Kind::Readiness, true)]),
            (Some(false), false, "False".into())
        );
    }

    #[test]
    fn readiness_gates_hold_ready_back() {
        let mut s = spec("Always", &[], &["main"]);
        s.readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
        let mut p = pod(s);
        let obs = observed(sandbox(true), &[("main", running())]);
        let ready = |p: &Pod| {
            let s = pod_status(p, &obs, None, at(100));
            let c = s
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .expect("Ready");
            (c.status, c.reason, c.message)
        };
        assert_eq!(
            ready(&p),
            (
                "False".into(),
                Some("ReadinessGatesNotReady".into()),
                Some(
                    "corresponding condition of pod readiness gate \"example.com/lb\" does not exist.".into()
                )
            )
        );
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "example.com/lb".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        assert_eq!(ready(&p).0, "True");
        let _ = instance;
    }

    #[test]
    fn a_pod_on_the_nodes_network_has_the_nodes_address() {
        let mut host = spec("Always", &[], &["main"]);
        host.host_network = Some(true);
        let no_address = Some(Sandbox {
            ip: None,
            ..sandbox(true).expect("sandbox")
        });
        let cases = [
            (
                spec("Always", &[], &["main"]),
                sandbox(true),
                Some("10.0.2.15"),
                Some("10.244.1.5"),
            ),
            (
                spec("Always", &[], &["main"]),
                no_address.clone(),
                Some("10.0.2.15"),
                None,
            ),
            (
                host.clone(),
                no_address.clone(),
                Some("10.0.2.15"),
                Some("10.0.2.15"),
            ),
            (host.clone(), no_address, None, None),
            // No sandbox yet: no address, even on the node's network.
            (host, None, Some("10.0.2.15"), None),
        ];
        for (i, (spec, sb, node_ip, want)) in cases.into_iter().enumerate() {
            let p = pod(spec);
            let obs = observed(sb, &[]);
            assert_eq!(pod_ip(&p, &obs, node_ip).as_deref(), want, "case {i}");
            let s = pod_status(&p, &obs, node_ip, at(10));
            assert_eq!(s.pod_ip.as_deref(), want, "status, case {i}");
        }
    }
}
