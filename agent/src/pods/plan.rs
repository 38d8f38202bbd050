//! What to do next for one pod: a pure function of its spec and of what the agent observed
//! (docs/SEEDS-SPEC.md NODE-2, NODE-3, NODE-18..NODE-21). The worker (`worker.rs`) observes,
//! asks [`plan`], carries the steps out through the runtime, and observes again.
//!
//! The order is the kubelet's `computePodActions`: a sandbox first (a lost one is replaced with
//! `ATTEMPT`+1 and every container starts again, unless the pod never restarts), then the init
//! containers one at a time (native sidecars, `restartPolicy: Always`, stay running and do not
//! hold the next one back once started), then every main container; exited containers restart
//! per `restartPolicy` after their back-off ([`Backoff`]).

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, PodSpec};

use super::backoff::Backoff;
use super::eviction::PodFailure;
use super::probe::{Kind, Prober};

/// How a container instance ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminated {
    pub id: String,
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// `Completed`, `Error`, `OOMKilled`.
    pub reason: String,
    pub started: Option<SystemTime>,
    pub finished: SystemTime,
}

/// A container instance as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    Created,
    Running { started: SystemTime },
    Exited(Terminated),
}

/// The container instance in the pod's current sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    /// The image the runtime resolved (the status' `imageID`).
    pub image_id: String,
    pub run: Run,
}

/// Why the last start of a container failed (its waiting reason and message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

/// What the agent knows of one container of the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ctr {
    /// The instance in the current sandbox; None before the first start in it.
    pub current: Option<Instance>,
    /// Why the last start failed; cleared when one succeeds.
    pub failure: Option<Failure>,
    /// Back-off between failed starts (image pulls, create errors).
    pub start_backoff: Backoff,
    /// Back-off between restarts after exits (CrashLoopBackOff).
    pub backoff: Backoff,
    pub restarts: u32,
    /// The previous instance's end (the status' `lastState`).
    pub last: Option<Terminated>,
    /// The current instance's probes (cleared for each new instance).
    pub probes: BTreeMap<Kind, Prober>,
}

impl Ctr {
    fn run(&self) -> Option<&Run> {
        self.current.as_ref().map(|i| &i.run)
    }

    /// Whether the running instance passed its startup probe (or has none), and whether it is
    /// ready (its readiness probe, if any, succeeded): the status' `started` and `ready`.
    pub fn started_and_ready(&self, c: &Container) -> (bool, bool) {
        if !matches!(self.run(), Some(Run::Running { .. })) {
            return (false, false);
        }
        let passed = |k: Kind| k.of(c).is_none() || self.probes.get(&k).and_then(|p| p.result) == Some(true);
        let started = passed(Kind::Startup);
        (started, started && passed(Kind::Readiness))
    }

    /// Whether an instance of this container ran before (so the next start is a restart).
    pub fn ever_ran(&self) -> bool {
        self.current.as_ref().is_some_and(|i| i.run != Run::Created)
            || self.last.is_some()
            || self.restarts > 0
    }
}

/// The pod's sandbox as last observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub attempt: u32,
    /// False once the runtime reports it not ready or no longer has it.
    pub ready: bool,
    pub ip: Option<String>,
}

/// Everything [`plan`] and `status::pod_status` read besides the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub sandbox: Option<Sandbox>,
    /// By container name (init and main containers share the name space).
    pub containers: BTreeMap<String, Ctr>,
    /// Set when the node failed the pod (its deadline passed, it was evicted): it is terminal.
    pub failed: Option<PodFailure>,
}

impl Observed {
    /// The containers with an instance that runs (or was created and not yet ended): name, id.
    pub fn running(&self) -> Vec<(String, String)> {
        self.containers
            .iter()
            .filter(|(_, c)| matches!(c.run(), Some(Run::Running { .. } | Run::Created)))
            .filter_map(|(n, c)| Some((n.clone(), c.current.as_ref()?.id.clone())))
            .collect()
    }
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run a sandbox with this attempt number; `changed` when it replaces a lost one (every
    /// container of the old one goes first: `SandboxChanged`).
    RunSandbox { attempt: u32, changed: bool },
    /// Create and start this container (the first time, after a failed start, or after it
    /// exited: the worker moves the old instance to `lastState`).
    Start { name: String },
    /// Stop whatever still runs: the sandbox is lost and the pod never restarts.
    KillPod,
}

/// The steps for now, and when to look again if nothing else happens first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub wake: Option<SystemTime>,
}

impl Plan {
    fn wake_at(&mut self, at: SystemTime) {
        self.wake = earliest(self.wake, at);
    }
}

/// The earlier of a wake-up time (if any) and `at`.
pub fn earliest(wake: Option<SystemTime>, at: SystemTime) -> Option<SystemTime> {
    Some(wake.map_or(at, |w| w.min(at)))
}

/// The pod's `restartPolicy` (`Always` when unset, as the API defaults it).
pub fn restart_policy(spec: &PodSpec) -> &str {
    spec.restart_policy.as_deref().unwrap_or("Always")
}

/// A native sidecar: an init container with `restartPolicy: Always` (NODE-21).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether `name` is one of the pod's ephemeral containers (`kubectl debug`): started once,
/// never restarted, never counted for readiness or phase.
pub fn is_ephemeral(spec: &PodSpec, name: &str) -> bool {
    spec.ephemeral_containers.iter().flatten().any(|e| e.name == name)
}

/// An ephemeral container as the container it runs as (the fields are the same; its target is
/// the runtime's business, see the worker).
pub fn ephemeral_as_container(e: &EphemeralContainer) -> Container {
    let e = e.clone();
    Container {
        args: e.args,
        command: e.command,
        env: e.env,
        env_from: e.env_from,
        image: e.image,
        image_pull_policy: e.image_pull_policy,
        lifecycle: e.lifecycle,
        liveness_probe: e.liveness_probe,
        name: e.name,
        ports: e.ports,
        readiness_probe: e.readiness_probe,
        resize_policy: e.resize_policy,
        resources: e.resources,
        restart_policy: e.restart_policy,
        security_context: e.security_context,
        startup_probe: e.startup_probe,
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        termination_message_path: e.termination_message_path,
        termination_message_policy: e.termination_message_policy,
        tty: e.tty,
        volume_devices: e.volume_devices,
        volume_mounts: e.volume_mounts,
        working_dir: e.working_dir,
    }
}

/// Whether a main container that exited with `exit_code` is started again.
pub fn restarts_after(policy: &str, exit_code: i32) -> bool {
    policy == "Always" || (policy == "OnFailure" && exit_code != 0)
}

/// A container that is not running: start it now, or when its failed-start back-off ends.
fn start(plan: &mut Plan, name: &str, c: Option<&Ctr>, now: SystemTime) {
    match c
        .filter(|c| c.failure.is_some())
        .and_then(|c| c.start_backoff.retry_at())
    {
        Some(at) if at > now => plan.wake_at(at),
        _ => plan.steps.push(Step::Start { name: name.into() }),
    }
}

/// A container that exited and is to run again: now, or when its back-off ends.
fn restart(plan: &mut Plan, name: &str, c: &Ctr, t: &Terminated, now: SystemTime) {
    let at = c.backoff.restart_at(t.finished);
    if at > now {
        plan.wake_at(at);
    } else {
        plan.steps.push(Step::Start { name: name.into() });
    }
}

/// The next steps for a pod that is neither terminal nor being deleted.
pub fn plan(spec: &PodSpec, obs: &Observed, now: SystemTime) -> Plan {
    let mut plan = Plan::default();
    let policy = restart_policy(spec);
    match &obs.sandbox {
        Some(sb) if sb.ready => {}
        lost => {
            // The runtime still holds instances of the pod's containers (after a reboot it
            // holds none, and the pod starts again as the kubelet starts it).
            let held = obs.containers.values().any(|c| c.current.is_some());
            if lost.is_some() && policy == "Never" && held {
                if !obs.running().is_empty() {
                    plan.steps.push(Step::KillPod);
                }
                return plan;
            }
            let attempt = lost.as_ref().map_or(0, |sb| sb.attempt + 1);
            plan.steps.push(Step::RunSandbox {
                attempt,
                changed: lost.is_some(),
            });
            return plan;
        }
    }
    // Ephemeral containers start once the sandbox runs, initialized or not, and never again
    // once they ran (the kubelet's computePodActions).
    for e in spec.ephemeral_containers.iter().flatten() {
        let seen = obs.containers.get(&e.name);
        if matches!(seen.and_then(Ctr::run), None | Some(Run::Created)) {
            start(&mut plan, &e.name, seen, now);
        }
    }
    let mains_started = spec
        .containers
        .iter()
        .any(|c| obs.containers.get(&c.name).is_some_and(|c| c.current.is_some()));
    for c in spec.init_containers.iter().flatten() {
        let sidecar = is_sidecar(c);
        let seen = obs.containers.get(&c.name);
        match seen.and_then(Ctr::run) {
            None if mains_started && !sidecar => {}
            None => {
                start(&mut plan, &c.name, seen, now);
                return plan;
            }
            // Created and never started: an agent that died between the two (the start runs
            // right after the create within one life). Start it (a new instance replaces it).
            Some(Run::Created) => {
                start(&mut plan, &c.name, seen, now);
                return plan;
            }
            Some(Run::Running { .. }) if sidecar => {}
            Some(Run::Running { .. }) => return plan,
            Some(Run::Exited(t)) if !sidecar && t.exit_code == 0 => {}
            Some(Run::Exited(t)) => {
                if let Some(seen) = seen
                    && (sidecar || policy != "Never")
                {
                    restart(&mut plan, &c.name, seen, t, now);
                }
                if !(sidecar && mains_started) {
                    return plan;
                }
            }
        }
    }
    for c in &spec.containers {
        let seen = obs.containers.get(&c.name);
        match seen.and_then(Ctr::run) {
            // Created and never started (see the init containers above): start it.
            None | Some(Run::Created) => start(&mut plan, &c.name, seen, now),
            Some(Run::Exited(t)) if restarts_after(policy, t.exit_code) => {
                if let Some(seen) = seen {
                    restart(&mut plan, &c.name, seen, t, now);
                }
            }
            Some(_) => {}
        }
    }
    plan
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;

    pub fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    pub fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            ..Container::default()
        }
    }

    pub fn sidecar(name: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(name)
        }
    }

    pub fn spec(policy: &str, init: &[Container], main: &[&str]) -> PodSpec {
        PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!init.is_empty()).then(|| init.to_vec()),
            containers: main.iter().map(|n| container(n)).collect(),
            ..PodSpec::default()
        }
    }

    pub fn sandbox(ready: bool) -> Option<Sandbox> {
        Some(Sandbox {
            id: "sb".into(),
            attempt: 0,
            ready,
            ip: Some("10.244.1.5".into()),
        })
    }

    pub fn running() -> Ctr {
        instance(Run::Running { started: at(0) })
    }

    pub fn exited(code: i32, finished: u64) -> Ctr {
        instance(Run::Exited(terminated(code, finished)))
    }

    pub fn terminated(code: i32, finished: u64) -> Terminated {
        Terminated {
            id: format!("c{finished}"),
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            started: Some(at(0)),
            finished: at(finished),
        }
    }

    pub fn instance(run: Run) -> Ctr {
        Ctr {
            current: Some(Instance {
                id: "c1".into(),
                image_id: "sha256:b".into(),
                run,
            }),
            ..Ctr::default()
        }
    }

    pub fn observed(sb: Option<Sandbox>, ctrs: &[(&str, Ctr)]) -> Observed {
        Observed {
            sandbox: sb,
            containers: ctrs.iter().map(|(n, c)| (n.to_string(), c.clone())).collect(),
            failed: None,
        }
    }

    /// `spec` with an ephemeral container `dbg` (as `kubectl debug` adds it).
    fn debugged(mut spec: PodSpec) -> PodSpec {
        spec.ephemeral_containers = Some(vec![EphemeralContainer {
            name: "dbg".into(),
            image: Some("busybox".into()),
            target_container_name: Some("main".into()),
            ..EphemeralContainer::default()
        }]);
        spec
    }

    #[test]
    fn ephemeral_containers_are_known_and_run_as_containers() {
        let spec = debugged(spec("Always", &[], &["main"]));
        assert!(is_ephemeral(&spec, "dbg") && !is_ephemeral(&spec, "main"));
        let e = &spec.ephemeral_containers.as_deref().unwrap_or_default()[0];
        let c = ephemeral_as_container(e);
        assert_eq!((c.name.as_str(), c.image.as_deref()), ("dbg", Some("busybox")));
    }

    fn starts(names: &[&str]) -> Vec<Step> {
        names
            .iter()
            .map(|n| Step::Start { name: n.to_string() })
            .collect()
    }

    /// A start of a container whose only instance never ran is its first start, not a restart.
    #[test]
    fn a_created_instance_has_not_run() {
        assert!(!instance(Run::Created).ever_ran());
        assert!(running().ever_ran());
        assert!(exited(0, 5).ever_ran());
        assert!(!Ctr::default().ever_ran());
    }

    #[test]
    fn steps_follow_the_kubelets_order() {
        let init = [container("init-a"), container("init-b")];
        let with_sidecar = [sidecar("proxy"), container("init-b")];
        let crashed_twice = Ctr {
            restarts: 2,
            ..exited(1, 100)
        };
        let mut backed_off = crashed_twice.clone();
        backed_off.backoff.step(at(50), at(50));
        backed_off.backoff.step(at(90), at(90));
        let failed_pull = Ctr {
            failure: Some(Failure {
                reason: "ErrImagePull".into(),
                message: "unreachable".into(),
            }),
            start_backoff: {
                let mut b = Backoff::default();
                b.step(at(105), at(105));
                b
            },
            ..Ctr::default()
        };
        let lost = Some(Sandbox {
            attempt: 2,
            ..sandbox(false).unwrap_or_else(|| unreachable!())
        });
        type Case<'a> = (&'a str, PodSpec, Observed, Vec<Step>, Option<u64>);
        let table: Vec<Case> = vec![
            (
                "a new pod gets its sandbox first",
                spec("Always", &[], &["main"]),
                observed(None, &[]),
                vec![Step::RunSandbox {
                    attempt: 0,
                    changed: false,
                }],
                None,
            ),
            (
                "then every main container",
                spec("Always", &[], &["a", "b"]),
                observed(sandbox(true), &[]),
                starts(&["a", "b"]),
                None,
            ),
            (
                "a container created but never started (the agent died in between) is started",
                spec("Always", &[], &["a", "b"]),
                observed(sandbox(true), &[("a", instance(Run::Created)), ("b", running())]),
                starts(&["a"]),
                None,
            ),
            (
                "so is such an init container, before anything after it",
                spec("Always", &init, &["main"]),
                observed(sandbox(true), &[("init-a", instance(Run::Created))]),
                starts(&["init-a"]),
                None,
            ),
            (
                "init containers one at a time",
                spec("Always", &init, &["main"]),
                observed(sandbox(true), &[]),
                starts(&["init-a"]),
                None,
            ),
            (
                "the next init container waits for the running one",
                spec("Always", &init, &["main"]),
                observed(sandbox(true), &[("init-a", running())]),
                vec![],
                None,
            ),
            (
                "after an init container exits 0 the next one starts",
                spec("Always", &init, &["main"]),
                observed(sandbox(true), &[("init-a", exited(0, 10))]),
                starts(&["init-b"]),
                None,
            ),
            (
                "mains start when every init container is done",
                spec("Always", &init, &["main"]),
                observed(
                    sandbox(true),
                    &[("init-a", exited(0, 10)), ("init-b", exited(0, 20))],
                ),
                starts(&["main"]),
                None,
            ),
            (
                "a failed init container restarts (first time at once)",
                spec("OnFailure", &init, &["main"]),
                observed(sandbox(true), &[("init-a", exited(1, 100))]),
                starts(&["init-a"]),
                None,
            ),
            (
                "a failed init container of a Never pod ends the pod",
                spec("Never", &init, &["main"]),
                observed(sandbox(true), &[("init-a", exited(1, 100))]),
                vec![],
                None,
            ),
            (
                "a running sidecar lets the next init container start",
                spec("Always", &with_sidecar, &["main"]),
                observed(sandbox(true), &[("proxy", running())]),
                starts(&["init-b"]),
                None,
            ),
            (
                "an exited sidecar restarts even in a Never pod, mains keep running",
                spec("Never", &with_sidecar, &["main"]),
                observed(
                    sandbox(true),
                    &[
                        ("proxy", exited(0, 100)),
                        ("init-b", exited(0, 20)),
                        ("main", running()),
                    ],
                ),
                starts(&["proxy"]),
                None,
            ),
            (
                "Always restarts a main container that exited 0",
                spec("Always", &[], &["main"]),
                observed(sandbox(true), &[("main", exited(0, 100))]),
                starts(&["main"]),
                None,
            ),
            (
                "OnFailure leaves a container that exited 0",
                spec("OnFailure", &[], &["main"]),
                observed(sandbox(true), &[("main", exited(0, 100))]),
                vec![],
                None,
            ),
            (
                "Never restarts nothing",
                spec("Never", &[], &["main"]),
                observed(sandbox(true), &[("main", exited(3, 100))]),
                vec![],
                None,
            ),
            (
                "a container in back-off waits until finished + delay",
                spec("Always", &[], &["main"]),
                observed(sandbox(true), &[("main", backed_off.clone())]),
                vec![],
                Some(120),
            ),
            (
                "a failed pull is retried after its back-off",
                spec("Always", &[], &["main"]),
                observed(sandbox(true), &[("main", failed_pull.clone())]),
                vec![],
                Some(115),
            ),
            (
                "a lost sandbox is replaced with ATTEMPT+1",
                spec("Always", &[], &["main"]),
                observed(lost.clone(), &[("main", running())]),
                vec![Step::RunSandbox {
                    attempt: 3,
                    changed: true,
                }],
                None,
            ),
            (
                "a Never pod whose sandbox is lost is stopped, not restarted",
                spec("Never", &[], &["main"]),
                observed(lost.clone(), &[("main", running())]),
                vec![Step::KillPod],
                None,
            ),
            (
                "a Never pod whose sandbox is lost after its containers ended: nothing to do",
                spec("Never", &[], &["main"]),
                observed(lost, &[("main", exited(0, 100))]),
                vec![],
                None,
            ),
            (
                "an ephemeral container starts even while the pod initializes",
                debugged(spec("Always", &init, &["main"])),
                observed(sandbox(true), &[("init-a", running())]),
                starts(&["dbg"]),
                None,
            ),
            (
                "it is not started again while it runs, nor after it exited, whatever the policy",
                debugged(spec("Always", &[], &["main"])),
                observed(sandbox(true), &[("main", running()), ("dbg", exited(1, 100))]),
                vec![],
                None,
            ),
            (
                "a failed start of one is retried after its back-off",
                debugged(spec("Always", &[], &["main"])),
                observed(
                    sandbox(true),
                    &[("main", running()), ("dbg", failed_pull.clone())],
                ),
                vec![],
                Some(115),
            ),
        ];
        for (what, spec, obs, steps, wake) in table {
            let p = plan(&spec, &obs, at(110));
            assert_eq!(p.steps, steps, "{what}");
            assert_eq!(p.wake, wake.map(at), "{what}");
        }
    }
}
