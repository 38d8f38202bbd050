//! The Deployment controller through `controlplane serve` with hollow nodes and the real kubectl:
//! revisions as ReplicaSets, rolling updates, rollback, pause/resume, restart, Recreate, the
//! progress deadline, and a control plane restarted in the middle of a rollout.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

fn cluster(nodes: usize) -> TestCluster {
    TestCluster::start(bin(), &[], &[("node", nodes, &[])])
}

/// A Deployment `name` of `replicas` busybox pods with `image` and extra spec lines (indented
/// two spaces, under `spec:`).
fn deployment(name: &str, replicas: u32, image: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n{extra_spec}  \
         selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    \
         spec:\n      containers:\n      - name: app\n        image: {image}\n"
    )
}

/// `kubectl rollout status` until it succeeds (90 s).
fn rollout_status(c: &TestCluster, what: &str) -> String {
    let (ok, out, err) = c.kubectl_result(&["rollout", "status", what, "--timeout=90s"], None);
    if !ok {
        // What the controllers saw last: each set's spec and status, and the pods.
        let sets = c.jsonpath(
            &["rs"],
            "{range .items[*]}{.metadata.name} spec={.spec.replicas} status={.status.replicas} rv={.metadata.resourceVersion} observed={.status.observedGeneration} gen={.metadata.generation}{\"\\n\"}{end}",
        );
        let deployments = c.jsonpath(
            &["deploy"],
            "{range .items[*]}{.metadata.name} {.status}{\"\\n\"}{end}",
        );
        panic!(
            "rollout status {what}: {out}{err}\nsets:\n{sets}\n{}\ndeployments:\n{deployments}",
            c.pods_summary()
        );
    }
    out
}

/// The names of the Deployment's ReplicaSets with their sizes and revisions:
/// `name=replicas@revision`, sorted by revision.
fn sets(c: &TestCluster, app: &str) -> Vec<(String, String, String)> {
    let out = c.jsonpath(
        &["rs", "-l", &format!("app={app}")],
        "{range .items[*]}{.metadata.name} {.spec.replicas} {.metadata.annotations.deployment\\.kubernetes\\.io/revision}{\"\\n\"}{end}",
    );
    let mut v: Vec<(String, String, String)> = out
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            Some((
                p.next()?.into(),
                p.next()?.into(),
                p.next().unwrap_or_default().into(),
            ))
        })
        .collect();
    v.sort_by_key(|(_, _, r)| r.parse::<i64>().unwrap_or(0));
    v
}

fn pods_of(c: &TestCluster, app: &str) -> Vec<String> {
    c.jsonpath(
        &["pods", "-l", &format!("app={app}")],
        "{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Waits until `f` holds (`secs` seconds).
fn eventually(secs: u64, what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn create_scale_set_image_undo_and_history() {
    let c = cluster(3);
    c.apply(&deployment("web", 3, "busybox:1", ""));
    let out = rollout_status(&c, "deployment/web");
    assert!(
        out.contains("deployment \"web\" successfully rolled out"),
        "{out}"
    );
    let first = sets(&c, "web");
    assert_eq!(first.len(), 1, "{first:?}");
    let (rs1, replicas, revision) = first[0].clone();
    assert_eq!((replicas.as_str(), revision.as_str()), ("3", "1"));
    // The ReplicaSet carries the hash in its name, labels and selector (CTL-4, CTL-5).
    let hash = c.jsonpath(&["rs", &rs1], "{.metadata.labels.pod-template-hash}");
    assert_eq!(rs1, format!("web-{hash}"));
    assert_eq!(
        c.jsonpath(&["rs", &rs1], "{.spec.selector.matchLabels.pod-template-hash}"),
        hash
    );
    let table = c.kubectl(&["get", "rs", "-L", "pod-template-hash"]);
    assert!(table.contains(&rs1) && table.contains(&hash), "{table}");
    // CTL-6: max-replicas = 3 + 1 (25% of 3 rounds up).
    assert_eq!(
        c.jsonpath(
            &["rs", &rs1],
            "{.metadata.annotations.deployment\\.kubernetes\\.io/desired-replicas} {.metadata.annotations.deployment\\.kubernetes\\.io/max-replicas}"
        ),
        "3 4"
    );
    assert_eq!(pods_of(&c, "web").len(), 3);
    for p in pods_of(&c, "web") {
        assert!(p.starts_with(&format!("{rs1}-")), "{p}");
    }
    assert_eq!(
        c.jsonpath(
            &["deploy", "web"],
            "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}"
        ),
        "1"
    );
    // Status and conditions.
    assert_eq!(
        c.jsonpath(
            &["deploy", "web"],
            "{.status.replicas} {.status.updatedReplicas} {.status.readyReplicas} {.status.availableReplicas}"
        ),
        "3 3 3 3"
    );
    assert_eq!(
        c.jsonpath(
            &["deploy", "web"],
            "{.status.conditions[?(@.type==\"Progressing\")].reason} {.status.conditions[?(@.type==\"Available\")].reason}"
        ),
        "NewReplicaSetAvailable MinimumReplicasAvailable"
    );
    // A single revision: nothing to roll back to (CTL-8, kubectl's text).
    let (ok, _, err) = c.kubectl_result(&["rollout", "undo", "deployment/web", "--dry-run=server"], None);
    assert!(!ok);
    assert!(
        err.contains("error: no rollout history found for deployment \"web\""),
        "{err}"
    );
    // Scaling is not a revision (CTL-7).
    c.kubectl(&["scale", "deployment/web", "--replicas=4"]);
    rollout_status(&c, "deployment/web");
    assert_eq!(sets(&c, "web").len(), 1);
    assert_eq!(sets(&c, "web")[0].1, "4");
    // A new image is revision 2; the old set ends at 0 (CTL-11).
    // (The change-cause comes with the change: annotated alone it would describe the running
    // revision, as upstream copies it to the current set.)
    let out = c.kubectl(&[
        "set",
        "image",
        "deployment/web",
        "app=busybox:2",
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    let manifest = out.replacen(
        "annotations:\n",
        "annotations:\n    kubernetes.io/change-cause: image 2\n",
        1,
    );
    assert_ne!(manifest, out, "{out}");
    c.apply(&manifest);
    rollout_status(&c, "deployment/web");
    eventually(60, "the old pods to go", || pods_of(&c, "web").len() == 4);
    let second = sets(&c, "web");
    assert_eq!(second.len(), 2, "{second:?}");
    assert_eq!(
        (second[0].0.as_str(), second[0].1.as_str(), second[0].2.as_str()),
        (rs1.as_str(), "0", "1")
    );
    assert_eq!((second[1].1.as_str(), second[1].2.as_str()), ("4", "2"));
    let rs2 = second[1].0.clone();
    assert_eq!(
        c.jsonpath(
            &["rs", &rs2],
            "{.metadata.annotations.kubernetes\\.io/change-cause}"
        ),
        "image 2"
    );
    let history = c.kubectl(&["rollout", "history", "deployment/web"]);
    assert!(history.starts_with("deployment.apps/web"), "{history}");
    assert!(history.contains("\nREVISION  CHANGE-CAUSE\n"), "{history}");
    assert!(
        history.contains("1         <none>") && history.contains("2         image 2"),
        "{history}"
    );
    // Events: upstream's texts, shown by describe.
    let describe = c.kubectl(&["describe", "deployment", "web"]);
    for text in [
        format!("Scaled up replica set {rs1} from 0 to 3"),
        format!("Scaled up replica set {rs1} from 3 to 4"),
        format!("Scaled up replica set {rs2} from 0 to 1"),
        format!("NewReplicaSet:   {rs2} (4/4 replicas created)"),
        "ScalingReplicaSet".to_string(),
        "deployment-controller".to_string(),
    ] {
        assert!(describe.contains(&text), "{text:?} not in\n{describe}");
    }
    // The old set's last step down ends at 0 (from 1 or 2: maxUnavailable 1 lets two go at once
    // when the new set is complete and available).
    assert!(
        describe.contains(&format!("Scaled down replica set {rs1} from 1 to 0"))
            || describe.contains(&format!("Scaled down replica set {rs1} from 2 to 0")),
        "no scale-down of {rs1} to 0 in\n{describe}"
    );
    // CTL-8: a dry run to the revision already running is skipped.
    let out = c.kubectl(&[
        "rollout",
        "undo",
        "deployment/web",
        "--to-revision=2",
        "--dry-run=server",
    ]);
    assert_eq!(
        out.trim(),
        "deployment.apps/web skipped rollback (current template already matches revision 2) (server dry run)"
    );
    // Undo: back to the first template; its set becomes revision 3 with history 1.
    let out = c.kubectl(&["rollout", "undo", "deployment/web"]);
    assert!(out.contains("deployment.apps/web rolled back"), "{out}");
    rollout_status(&c, "deployment/web");
    eventually(60, "revision 3", || {
        c.jsonpath(
            &["rs", &rs1],
            "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
        ) == "3"
    });
    assert_eq!(
        c.jsonpath(
            &["rs", &rs1],
            "{.metadata.annotations.deployment\\.kubernetes\\.io/revision-history}"
        ),
        "1"
    );
    assert_eq!(sets(&c, "web").len(), 2, "rollback reuses the old set");
    let history = c.kubectl(&["rollout", "history", "deployment/web"]);
    assert!(
        history.contains("2         image 2") && history.contains("3         <none>"),
        "{history}"
    );
    assert!(!history.contains("\n1 "), "{history}");
    eventually(60, "the deployment's revision annotation", || {
        c.jsonpath(
            &["deploy", "web"],
            "{.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
        ) == "3"
    });
    eventually(60, "4 pods of the first template", || {
        let pods = pods_of(&c, "web");
        pods.len() == 4 && pods.iter().all(|p| p.starts_with(&format!("{rs1}-")))
    });
}

#[test]
fn pause_resume_and_restart() {
    let c = cluster(2);
    c.apply(&deployment("api", 2, "busybox:1", ""));
    rollout_status(&c, "deployment/api");
    let out = c.kubectl(&["rollout", "pause", "deployment/api"]);
    assert!(out.contains("deployment.apps/api paused"), "{out}");
    c.wait_for(
        &["deploy", "api"],
        "{.status.conditions[?(@.type==\"Progressing\")].reason}",
        |r| r == "DeploymentPaused",
    );
    assert_eq!(
        c.jsonpath(
            &["deploy", "api"],
            "{.status.conditions[?(@.type==\"Progressing\")].status} {.status.conditions[?(@.type==\"Progressing\")].message}"
        ),
        "Unknown Deployment is paused"
    );
    // No rollout while paused.
    let out = c.kubectl(&["set", "image", "deployment/api", "app=busybox:2"]);
    assert!(out.contains("deployment.apps/api image updated"), "{out}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(sets(&c, "api").len(), 1, "no new revision while paused");
    let out = c.kubectl(&["rollout", "resume", "deployment/api"]);
    assert!(out.contains("deployment.apps/api resumed"), "{out}");
    rollout_status(&c, "deployment/api");
    let s = sets(&c, "api");
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(
        (s[0].1.as_str(), s[1].1.as_str(), s[1].2.as_str()),
        ("0", "2", "2")
    );
    // Restart: the restartedAt annotation makes a new revision.
    let out = c.kubectl(&["rollout", "restart", "deployment/api"]);
    assert!(out.contains("deployment.apps/api restarted"), "{out}");
    rollout_status(&c, "deployment/api");
    let s = sets(&c, "api");
    assert_eq!(s.len(), 3, "{s:?}");
    assert_eq!((s[2].1.as_str(), s[2].2.as_str()), ("2", "3"));
    assert!(
        !c.jsonpath(
            &["rs", &s[2].0],
            "{.spec.template.metadata.annotations.kubectl\\.kubernetes\\.io/restartedAt}"
        )
        .is_empty()
    );
    // kubectl refuses to roll back a paused Deployment.
    c.kubectl(&["rollout", "pause", "deployment/api"]);
    let (ok, _, err) = c.kubectl_result(&["rollout", "undo", "deployment/api"], None);
    assert!(
        !ok && err.contains("you cannot rollback a paused deployment"),
        "{err}"
    );
}

#[test]
fn recreate_starts_new_pods_after_the_old_ones_are_gone() {
    let c = cluster(2);
    c.apply(&deployment(
        "db",
        2,
        "busybox:1",
        "  strategy:\n    type: Recreate\n",
    ));
    rollout_status(&c, "deployment/db");
    let old = sets(&c, "db")[0].0.clone();
    // Watch pods while the rollout runs: no new pod while an old one exists.
    c.kubectl(&["set", "image", "deployment/db", "app=busybox:2"]);
    let t0 = Instant::now();
    let mut saw_new = false;
    while t0.elapsed() < Duration::from_secs(60) {
        let pods = pods_of(&c, "db");
        let olds = pods.iter().filter(|p| p.starts_with(&format!("{old}-"))).count();
        let news = pods.len() - olds;
        assert!(olds == 0 || news == 0, "old and new pods at once: {pods:?}");
        if news == 2 {
            saw_new = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(saw_new, "the new pods did not come");
    rollout_status(&c, "deployment/db");
    let s = sets(&c, "db");
    assert_eq!((s[0].1.as_str(), s[1].1.as_str()), ("0", "2"));
    assert_eq!(
        c.jsonpath(
            &["rs", &s[1].0],
            "{.metadata.annotations.deployment\\.kubernetes\\.io/max-replicas}"
        ),
        "2",
        "no surge with Recreate"
    );
}

#[test]
fn a_rollout_that_cannot_progress_exceeds_its_deadline() {
    let c = cluster(2);
    c.apply(&deployment(
        "stuck",
        2,
        "busybox:1",
        "  progressDeadlineSeconds: 5\n",
    ));
    rollout_status(&c, "deployment/stuck");
    // The new pods cannot be scheduled anywhere.
    let patch = r#"{"spec":{"template":{"spec":{"nodeSelector":{"disk":"none"}}}}}"#;
    c.kubectl(&["patch", "deployment/stuck", "-p", patch]);
    c.wait_for(
        &["deploy", "stuck"],
        "{.status.conditions[?(@.type==\"Progressing\")].reason}",
        |r| r == "ProgressDeadlineExceeded",
    );
    let new = sets(&c, "stuck")[1].0.clone();
    assert_eq!(
        c.jsonpath(
            &["deploy", "stuck"],
            "{.status.conditions[?(@.type==\"Progressing\")].status} {.status.conditions[?(@.type==\"Progressing\")].message}"
        ),
        format!("False ReplicaSet \"{new}\" has timed out progressing.")
    );
    let (ok, _, err) = c.kubectl_result(&["rollout", "status", "deployment/stuck", "--timeout=20s"], None);
    assert!(!ok);
    assert!(
        err.contains("deployment \"stuck\" exceeded its progress deadline"),
        "{err}"
    );
    // The old pods keep serving (maxUnavailable rounds down to 0 of 2).
    assert_eq!(
        c.jsonpath(&["deploy", "stuck"], "{.status.availableReplicas}"),
        "2"
    );
}

#[test]
fn a_control_plane_restart_mid_rollout_loses_nothing() {
    let mut c = cluster(3);
    c.apply(&deployment(
        "slow",
        6,
        "busybox:1",
        "  minReadySeconds: 2\n  strategy:\n    rollingUpdate:\n      maxSurge: 1\n      maxUnavailable: 0\n",
    ));
    rollout_status(&c, "deployment/slow");
    c.kubectl(&["set", "image", "deployment/slow", "app=busybox:2"]);
    // Mid-rollout: the new set has started but not finished.
    eventually(60, "the rollout to start", || {
        let s = sets(&c, "slow");
        s.len() == 2 && s[1].1 != "0" && s[1].1 != "6"
    });
    c.restart_server();
    // Until the rollout completes, never more than replicas + maxSurge pods that count (not
    // terminating), and never a third ReplicaSet.
    let t0 = Instant::now();
    loop {
        let active = pods_of(&c, "slow")
            .iter()
            .filter(|p| p.split_whitespace().nth(1).is_none())
            .count();
        assert!(active <= 7, "{active} pods for 6 replicas with maxSurge 1");
        assert!(sets(&c, "slow").len() <= 2);
        let status = c.jsonpath(
            &["deploy", "slow"],
            "{.status.updatedReplicas} {.status.availableReplicas} {.status.replicas}",
        );
        if status == "6 6 6" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "rollout stuck at {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    rollout_status(&c, "deployment/slow");
    let s = sets(&c, "slow");
    assert_eq!(s.len(), 2, "no extra revision: {s:?}");
    assert_eq!((s[0].1.as_str(), s[0].2.as_str()), ("0", "1"));
    assert_eq!((s[1].1.as_str(), s[1].2.as_str()), ("6", "2"));
    eventually(60, "exactly 6 pods", || {
        let pods = pods_of(&c, "slow");
        pods.len() == 6 && pods.iter().all(|p| p.starts_with(&format!("{}-", s[1].0)))
    });
    let history = c.kubectl(&["rollout", "history", "deployment/slow"]);
    assert!(
        history.contains("1         <none>") && history.contains("2         <none>"),
        "{history}"
    );
}
