//! The API server driven by the real kubectl (the machine's `/usr/bin/kubectl` dispatcher, which
//! picks kubectl 1.32 for this server's version) over TLS with the generated admin kubeconfig.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use controlplane::process::{EtcdProcess, ServerProcess};

struct Server {
    process: Option<ServerProcess>,
    /// With `NODEOS_TEST_STORE=etcd` the suite runs on a real etcd instead of the embedded store.
    etcd: Option<EtcdProcess>,
    dir: Option<tempfile::TempDir>,
    cache: PathBuf,
}

fn start_in(dir: tempfile::TempDir, etcd: Option<EtcdProcess>) -> Server {
    let etcd = etcd.or_else(|| {
        (std::env::var("NODEOS_TEST_STORE").as_deref() == Ok("etcd")).then(|| {
            EtcdProcess::spawn(&dir.path().join("etcd")).expect("start etcd (apt-get install etcd-server)")
        })
    });
    let bin = Path::new(env!("CARGO_BIN_EXE_controlplane"));
    let extra: Vec<&str> = etcd
        .as_ref()
        .map(|e| vec!["--etcd", e.endpoint.as_str()])
        .unwrap_or_default();
    let process = ServerProcess::spawn(bin, dir.path(), &extra).expect("start controlplane");
    let cache = dir.path().join("kube-cache");
    Server {
        process: Some(process),
        etcd,
        dir: Some(dir),
        cache,
    }
}

fn start() -> Server {
    start_in(tempfile::tempdir().expect("tempdir"), None)
}

impl Server {
    fn path(&self) -> &Path {
        self.dir.as_ref().map(|d| d.path()).expect("data dir")
    }

    fn kubeconfig(&self) -> PathBuf {
        self.path().join("admin.kubeconfig")
    }

    /// Kills the server (SIGKILL) and hands back its data directory (and its etcd, still running).
    fn kill(mut self) -> (tempfile::TempDir, Option<EtcdProcess>) {
        self.process.take();
        (self.dir.take().expect("data dir"), self.etcd.take())
    }

    /// Starts `kubectl get pods -w -o name`, runs `trigger` once the watch is up, and returns the
    /// first `n` names the watch printed (within 20 s).
    fn watch_pod_names(&self, n: usize, trigger: impl FnOnce()) -> Vec<String> {
        let mut watcher = Command::new("kubectl")
            .env("KUBECONFIG", self.kubeconfig())
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(["get", "pods", "-w", "-o", "name", "--request-timeout=20s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("watch");
        std::thread::sleep(Duration::from_millis(1500));
        trigger();
        let stdout = watcher.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let lines: Vec<String> = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .take(n)
                .collect();
            let _ = tx.send(lines);
        });
        let lines = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("watch output in time");
        let _ = watcher.kill();
        let _ = watcher.wait();
        lines
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        self.kubectl_stdin(args, None)
    }

    fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut cmd = Command::new("kubectl");
        cmd.env("KUBECONFIG", self.kubeconfig())
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            use std::io::Write;
            pipe.write_all(input.as_bytes()).expect("stdin");
        }
        let out = child.wait_with_output().expect("kubectl output");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(args);
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    fn apply(&self, args: &[&str], manifest: &str) -> String {
        let (ok, out, err) = self.kubectl_stdin(args, Some(manifest));
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.26
"#;

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: solo
  labels: {app: solo, tier: fe}
spec:
  containers:
  - name: main
    image: busybox:1.36
"#;

#[test]
fn version_discovery_and_namespaces() {
    let s = start();
    let v = s.ok(&["version"]);
    assert!(v.contains("Server Version: v1.32.0-nodeos"), "{v}");
    let ns = s.ok(&["get", "namespaces"]);
    for n in ["default", "kube-node-lease", "kube-public", "kube-system"] {
        assert!(
            ns.lines().any(|l| l.starts_with(n) && l.contains("Active")),
            "{n} missing:\n{ns}"
        );
    }
    let ar = s.ok(&["api-resources"]);
    assert!(
        ar.lines().any(|l| l.starts_with("deployments")
            && l.contains("deploy")
            && l.contains("apps/v1")
            && l.contains("Deployment")),
        "{ar}"
    );
    let cluster = s.ok(&["api-resources", "--namespaced=false", "-o", "name"]);
    assert!(
        cluster.lines().any(|l| l == "nodes") && !cluster.lines().any(|l| l == "pods"),
        "{cluster}"
    );
}

#[test]
fn create_get_label_annotate_delete_pod() {
    let s = start();
    assert!(s.apply(&["create", "-f", "-"], POD).contains("pod/solo created"));
    let table = s.ok(&["get", "pods"]);
    assert!(
        table.starts_with("NAME   READY   STATUS    RESTARTS   AGE"),
        "{table}"
    );
    assert!(table.contains("solo   0/1     Pending   0"), "{table}");
    let wide = s.ok(&["get", "pods", "-o", "wide"]);
    assert!(
        wide.lines()
            .next()
            .is_some_and(|h| h.contains("IP") && h.contains("NODE")),
        "{wide}"
    );
    assert_eq!(
        s.ok(&["get", "pod", "solo", "-o", "jsonpath={.spec.containers[0].image}"]),
        "busybox:1.36"
    );
    let yaml = s.ok(&["get", "pod", "solo", "-o", "yaml"]);
    assert!(
        yaml.contains("uid: ") && yaml.contains("phase: Pending"),
        "{yaml}"
    );
    assert!(s.ok(&["get", "pods", "-A"]).contains("default     solo"));
    assert!(
        s.ok(&["get", "pods", "-l", "tier=fe", "-o", "name"])
            .contains("pod/solo")
    );
    assert!(
        s.ok(&["get", "pods", "-l", "tier=be", "-o", "name"])
            .trim()
            .is_empty()
    );
    assert!(
        s.ok(&[
            "get",
            "pods",
            "--field-selector",
            "status.phase=Pending",
            "-o",
            "name"
        ])
        .contains("pod/solo")
    );
    let (ok, _, err) = s.kubectl(&["get", "pods", "--field-selector", "foo.bar=baz"]);
    assert!(
        !ok && err.contains(
            "\"foo.bar\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        ),
        "{err}"
    );
    s.ok(&["label", "pod", "solo", "env=prod"]);
    s.ok(&["annotate", "pod", "solo", "owner=team-a"]);
    assert_eq!(
        s.ok(&[
            "get",
            "pod",
            "solo",
            "-o",
            "jsonpath={.metadata.labels.env} {.metadata.annotations.owner}"
        ]),
        "prod team-a"
    );
    s.ok(&["label", "pod", "solo", "env-"]);
    assert_eq!(
        s.ok(&["get", "pod", "solo", "-o", "jsonpath={.metadata.labels.env}"]),
        ""
    );
    let desc = s.ok(&["describe", "pod", "solo"]);
    assert!(
        desc.contains("Name:") && desc.contains("solo") && desc.contains("busybox:1.36"),
        "{desc}"
    );
    assert!(s.ok(&["delete", "pod", "solo"]).contains("pod \"solo\" deleted"));
    let (ok, _, err) = s.kubectl(&["get", "pod", "solo"]);
    assert!(!ok && err.contains("pods \"solo\" not found"), "{err}");
}

#[test]
fn apply_twice_server_side_dry_run_and_diff() {
    let s = start();
    assert!(
        s.apply(&["apply", "-f", "-"], DEPLOYMENT)
            .contains("deployment.apps/web created")
    );
    assert!(
        s.apply(&["apply", "-f", "-"], DEPLOYMENT)
            .contains("deployment.apps/web unchanged")
    );
    let changed = DEPLOYMENT
        .replace("replicas: 2", "replicas: 3")
        .replace("nginx:1.26", "nginx:1.27");
    assert!(
        s.apply(&["apply", "--dry-run=server", "-f", "-"], &changed)
            .contains("configured (server dry run)")
    );
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "2"
    );
    let (ok, diff, _) = s.kubectl_stdin(&["diff", "-f", "-"], Some(&changed));
    assert!(
        !ok && diff.contains("-  replicas: 2") && diff.contains("+  replicas: 3"),
        "{diff}"
    );
    assert!(
        s.apply(&["apply", "-f", "-"], &changed)
            .contains("deployment.apps/web configured")
    );
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image} {.metadata.generation}"
        ]),
        "3 nginx:1.27 2"
    );
    let ssa = DEPLOYMENT.replace("name: web\n  labels", "name: web-ssa\n  labels");
    assert!(
        s.apply(&["apply", "--server-side", "-f", "-"], &ssa)
            .contains("deployment.apps/web-ssa serverside-applied")
    );
    assert!(s.ok(&["get", "deploy"]).contains("web-ssa"));
}

/// Server-side apply tracks field owners: a field another manager changed is a conflict (409,
/// printed by kubectl), `--force-conflicts` takes it over, and a label the applier stops
/// applying is removed.
#[test]
fn server_side_apply_conflicts_and_ownership() {
    let s = start();
    let with_tier = DEPLOYMENT.replace("labels: {app: web}\nspec", "labels: {app: web, tier: fe}\nspec");
    assert!(
        s.apply(&["apply", "--server-side", "-f", "-"], &with_tier)
            .contains("serverside-applied")
    );
    // The deployment controller's own entries (revision annotation, status) aside.
    let owners = "jsonpath={range .metadata.managedFields[?(@.manager!=\"kube-controller-manager\")]}{.manager}/{.operation} {end}";
    assert_eq!(
        s.ok(&["get", "deploy", "web", "--show-managed-fields", "-o", owners]),
        "kubectl/Apply "
    );
    s.ok(&["patch", "deploy", "web", "-p", r#"{"spec":{"replicas":4}}"#]);
    assert_eq!(
        s.ok(&["get", "deploy", "web", "--show-managed-fields", "-o", owners]),
        "kubectl/Apply kubectl-patch/Update "
    );
    // Re-applying replicas: 2 would undo kubectl-patch's change.
    let (ok, _, err) = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&with_tier));
    assert!(!ok);
    assert!(
        err.contains(
            r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using apps/v1: .spec.replicas"#
        ),
        "{err}"
    );
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "4",
        "nothing changed"
    );
    // Forced, and without the tier label: replicas taken over, tier removed.
    s.apply(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        DEPLOYMENT,
    );
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.metadata.labels}"
        ]),
        r#"2 {"app":"web"}"#
    );
    let fields = s.ok(&[
        "get",
        "deploy",
        "web",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[?(@.manager==\"kubectl\")].fieldsV1.f:spec.f:replicas}",
    ]);
    assert_eq!(fields, "{}", "kubectl owns .spec.replicas now");
    // Apply without a field manager is refused.
    let (ok, _, err) = s.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=", "-f", "-"],
        Some(DEPLOYMENT),
    );
    assert!(
        !ok && err.contains("fieldManager: Required value: is required for apply patch"),
        "{err}"
    );
}

#[test]
fn scale_set_image_patch_cordon() {
    let s = start();
    s.apply(&["create", "-f", "-"], DEPLOYMENT);
    s.ok(&["scale", "deployment", "web", "--replicas=5"]);
    s.ok(&["set", "image", "deployment/web", "nginx=nginx:1.27"]);
    s.ok(&[
        "patch",
        "deployment",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/spec/minReadySeconds","value":3}]"#,
    ]);
    s.ok(&["patch", "deployment", "web", "-p", r#"{"spec":{"paused":true}}"#]);
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image} {.spec.minReadySeconds} {.spec.paused} {.metadata.generation}"]),
        "5 nginx:1.27 3 true 5"
    );
    let wide = s.ok(&["get", "deploy", "-o", "wide"]);
    assert!(wide.contains("nginx:1.27") && wide.contains("app=web"), "{wide}");
    let node =
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"kubernetes.io/os":"linux"}}}"#;
    s.apply(&["create", "-f", "-"], node);
    assert!(s.ok(&["cordon", "n1"]).contains("node/n1 cordoned"));
    assert!(s.ok(&["get", "nodes"]).contains("SchedulingDisabled"));
    assert!(s.ok(&["uncordon", "n1"]).contains("node/n1 uncordoned"));
    assert_eq!(
        s.ok(&["get", "node", "n1", "-o", "jsonpath={.spec.unschedulable}"]),
        ""
    );
}

/// The resources upstream's scheduler and controller manager list and watch: `kubectl
/// api-resources` lists them, `kubectl get` shows them (with upstream's columns where kubectl
/// users look at them), a ReplicationController scales, componentstatuses reads.
#[test]
fn informer_resources() {
    let s = start();
    let names = s.ok(&["api-resources", "-o", "name"]);
    for r in [
        "replicationcontrollers",
        "podtemplates",
        "componentstatuses",
        "storageclasses.storage.k8s.io",
        "csidrivers.storage.k8s.io",
        "csinodes.storage.k8s.io",
        "csistoragecapacities.storage.k8s.io",
        "volumeattachments.storage.k8s.io",
        "mutatingwebhookconfigurations.admissionregistration.k8s.io",
        "validatingwebhookconfigurations.admissionregistration.k8s.io",
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    ] {
        assert!(names.lines().any(|l| l == r), "{r} missing:\n{names}");
    }
    let storage_class = r#"{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"fast",
        "annotations":{"storageclass.kubernetes.io/is-default-class":"true"}},"provisioner":"example.com/fast",
        "volumeBindingMode":"WaitForFirstConsumer"}"#;
    assert!(
        s.apply(&["apply", "-f", "-"], storage_class)
            .contains("storageclass.storage.k8s.io/fast created")
    );
    let sc = s.ok(&["get", "sc"]);
    assert!(
        sc.lines().any(|l| l.starts_with("fast (default)")
            && l.contains("example.com/fast")
            && l.contains("Delete")
            && l.contains("WaitForFirstConsumer")),
        "{sc}"
    );
    let rc = r#"{"apiVersion":"v1","kind":"ReplicationController","metadata":{"name":"web"},
        "spec":{"replicas":1,"template":{"metadata":{"labels":{"app":"web"}},
        "spec":{"containers":[{"name":"nginx","image":"nginx:1.26"}]}}}}"#;
    assert!(
        s.apply(&["apply", "-f", "-"], rc)
            .contains("replicationcontroller/web created")
    );
    assert!(
        s.ok(&["scale", "rc", "web", "--replicas=3"])
            .contains("replicationcontroller/web scaled")
    );
    let rcs = s.ok(&["get", "rc", "-o", "wide"]);
    assert!(rcs.starts_with("NAME   DESIRED   CURRENT   READY"), "{rcs}");
    assert!(
        rcs.contains("web    3") && rcs.contains("nginx:1.26") && rcs.contains("app=web"),
        "{rcs}"
    );
    let (ok, cs, err) = s.kubectl(&["get", "componentstatuses"]);
    assert!(
        ok && cs
            .lines()
            .any(|l| l.starts_with("etcd-0") && l.contains("Healthy")),
        "{cs}{err}"
    );
    assert!(
        err.contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
        "{err}"
    );
    for r in [
        "podtemplates",
        "csidrivers",
        "csinodes",
        "csistoragecapacities",
        "volumeattachments",
        "validatingadmissionpolicies",
        "mutatingwebhookconfigurations",
    ] {
        let (ok, out, err) = s.kubectl(&["get", r]);
        assert!(
            ok && err.contains("No resources found"),
            "kubectl get {r}: {out}{err}"
        );
    }
    let (ok, _, err) = s.kubectl(&["delete", "cs", "etcd-0"]);
    assert!(!ok && err.contains("does not allow this method"), "{err}");
}

/// `kubectl create <generator>` sends protobuf bodies (kubectl 1.32): each object arrives with
/// the fields the generator set, nothing Go's zero values would add, and the server's defaults.
#[test]
fn create_generators_send_protobuf() {
    let s = start();
    assert_eq!(
        s.ok(&["create", "namespace", "team"]).trim(),
        "namespace/team created"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "ns",
            "team",
            "-o",
            "jsonpath={.status.phase} {.metadata.labels}"
        ]),
        r#"Active {"kubernetes.io/metadata.name":"team"}"#
    );
    let n = ["-n", "team"];
    let created = |args: &[&str]| s.ok(&[&n[..], args].concat());
    assert!(
        created(&[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.27",
            "--replicas=0"
        ])
        .contains("created")
    );
    assert_eq!(
        s.ok(&[&n[..], &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}|{.spec.selector.matchLabels.app}|{.spec.template.spec.containers[0].name}={.spec.template.spec.containers[0].image}|{.spec.strategy.type} {.spec.strategy.rollingUpdate.maxSurge}|{.spec.paused}|{.metadata.creationTimestamp}"][..]].concat()).split('|').take(5).collect::<Vec<_>>(),
        ["0", "web", "nginx=nginx:1.27", "RollingUpdate 25%", ""]
    );
    let stamp = s.ok(&[
        &n[..],
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.creationTimestamp}",
        ][..],
    ]
    .concat());
    assert!(
        stamp.ends_with('Z') && stamp.len() == 20,
        "creationTimestamp set by the server: {stamp}"
    );

    created(&[
        "create",
        "configmap",
        "cfg",
        "--from-literal=a=1",
        "--from-literal=b=two words",
    ]);
    assert_eq!(
        s.ok(&[&n[..], &["get", "cm", "cfg", "-o", "jsonpath={.data}"][..]].concat()),
        r#"{"a":"1","b":"two words"}"#
    );
    created(&["create", "secret", "generic", "pw", "--from-literal=pw=hunter2"]);
    assert_eq!(
        s.ok(&[
            &n[..],
            &["get", "secret", "pw", "-o", "jsonpath={.type} {.data.pw}"][..]
        ]
        .concat()),
        "Opaque aHVudGVyMg=="
    );
    created(&["create", "service", "clusterip", "web", "--tcp=80:8080"]);
    assert_eq!(
        s.ok(&[&n[..], &["get", "svc", "web", "-o", "jsonpath={.spec.type} {.spec.ports[0].name} {.spec.ports[0].protocol} {.spec.ports[0].port} {.spec.ports[0].targetPort} {.spec.selector}"][..]].concat()),
        r#"ClusterIP 80-8080 TCP 80 8080 {"app":"web"}"#
    );
    created(&[
        "create",
        "job",
        "once",
        "--image=busybox:1.36",
        "--",
        "echo",
        "hi",
    ]);
    assert_eq!(
        s.ok(&[
            &n[..],
            &[
                "get",
                "job",
                "once",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].command} {.spec.template.spec.restartPolicy}"
            ][..]
        ]
        .concat()),
        r#"["echo","hi"] Never"#
    );
    created(&[
        "create",
        "cronjob",
        "tick",
        "--image=busybox:1.36",
        "--schedule=*/5 * * * *",
    ]);
    assert_eq!(
        s.ok(&[
            &n[..],
            &[
                "get",
                "cronjob",
                "tick",
                "-o",
                "jsonpath={.spec.schedule} {.spec.jobTemplate.spec.template.spec.containers[0].image}"
            ][..]
        ]
        .concat()),
        "*/5 * * * * busybox:1.36"
    );
    created(&["create", "serviceaccount", "robot"]);
    created(&["create", "quota", "q", "--hard=pods=10,cpu=2"]);
    assert_eq!(
        s.ok(&[&n[..], &["get", "quota", "q", "-o", "jsonpath={.spec.hard}"][..]].concat()),
        r#"{"cpu":"2","pods":"10"}"#
    );
    created(&["create", "pdb", "zero", "--selector=app=x", "--max-unavailable=0"]);
    assert_eq!(
        s.ok(&[
            &n[..],
            &["get", "pdb", "zero", "-o", "jsonpath={.spec.maxUnavailable}"][..]
        ]
        .concat()),
        "0",
        "an intstr zero survives the protobuf body"
    );
    // A server-side dry run decodes the body and persists nothing.
    assert!(
        created(&[
            "create",
            "configmap",
            "ghost",
            "--from-literal=x=y",
            "--dry-run=server"
        ])
        .contains("(server dry run)")
    );
    let (ok, _, err) = s.kubectl(&["get", "cm", "ghost", "-n", "team"]);
    assert!(!ok && err.contains("not found"), "{err}");
    // A generator whose object fails validation gets the server's message.
    let (ok, _, err) = s.kubectl(&["create", "deployment", "Bad_Name", "--image=nginx", "-n", "team"]);
    assert!(!ok && err.contains("metadata.name: Invalid value"), "{err}");
}

/// `kubectl explain` reads the OpenAPI v3 documents; unknown fields are refused under kubectl's
/// default `--validate=strict` and dropped with `--validate=false`.
#[test]
fn explain_and_field_validation() {
    let s = start();
    let out = s.ok(&["explain", "pods.spec.containers.ports"]);
    assert!(out.contains("KIND:       Pod"), "{out}");
    assert!(out.contains("FIELD: ports <[]ContainerPort>"), "{out}");
    assert!(out.contains("containerPort\t<integer> -required-"), "{out}");
    let out = s.ok(&["explain", "deployment.spec.strategy"]);
    assert!(
        out.contains("GROUP:      apps") && out.contains("rollingUpdate\t<RollingUpdateDeployment>"),
        "{out}"
    );
    let out = s.ok(&["explain", "cronjobs", "--recursive"]);
    assert!(out.contains("schedule\t<string> -required-"), "{out}");

    let typo = DEPLOYMENT.replace("replicas: 2", "replicaz: 2").replace(
        "image: nginx:1.26",
        "image: nginx:1.26\n        imagePullPolizy: Always",
    );
    let (ok, _, err) = s.kubectl_stdin(&["create", "-f", "-"], Some(&typo));
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "Error from server (BadRequest): error when creating \"STDIN\": Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"spec.replicaz\", unknown field \"spec.template.spec.containers[0].imagePullPolizy\""
    );
    let (ok, _, err) = s.kubectl(&["get", "deploy", "web"]);
    assert!(!ok && err.contains("not found"), "nothing was created: {err}");
    let (ok, _, err) = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&typo));
    assert!(
        !ok && err.contains("strict decoding error: unknown field \"spec.replicaz\""),
        "{err}"
    );
    // --validate=warn: created without the unknown fields, which kubectl reports.
    let other = typo.replace("name: web\n", "name: web-warn\n");
    let (ok, _, err) = s.kubectl_stdin(&["create", "--validate=warn", "-f", "-"], Some(&other));
    assert!(
        ok && err.contains(r#"Warning: unknown field "spec.replicaz""#),
        "{err}"
    );
    s.apply(&["apply", "--validate=false", "-f", "-"], &typo);
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0]}"
        ]),
        r#"1 {"image":"nginx:1.26","name":"nginx"}"#,
        "unknown fields dropped, defaults applied"
    );
}

/// `kubectl logs` and `kubectl exec` reach the pod's node agent; a pod on no node gets the
/// upstream message through both the log request and the exec WebSocket upgrade.
#[test]
fn logs_and_exec_need_a_node() {
    let s = start();
    s.apply(&["create", "-f", "-"], POD);
    for args in [&["logs", "solo"][..], &["exec", "solo", "--", "true"][..]] {
        let (ok, _, err) = s.kubectl(args);
        assert!(
            !ok && err.contains("pod solo does not have a host assigned"),
            "{args:?}: {err}"
        );
    }
    let (ok, _, err) = s.kubectl(&["logs", "solo", "-c", "other"]);
    assert!(
        !ok && err.contains("container other is not valid for pod solo"),
        "{err}"
    );
}

/// `kubectl debug` adds an ephemeral container through `pods/ephemeralcontainers` (a strategic
/// merge patch); the subresource writes nothing else, refuses removals, changes and fields an
/// ephemeral container may not set (upstream's texts), and creates cannot set them.
#[test]
fn debug_adds_ephemeral_containers() {
    let s = start();
    s.apply(&["create", "-f", "-"], POD);
    s.ok(&[
        "debug",
        "solo",
        "--image=busybox:1.36",
        "--target=main",
        "-c",
        "dbg",
        "--attach=false",
        "--",
        "sleep",
        "1d",
    ]);
    let got = s.ok(&[
        "get", "pod", "solo", "-o",
        "jsonpath={.spec.ephemeralContainers[0].name} {.spec.ephemeralContainers[0].targetContainerName} {.spec.ephemeralContainers[0].imagePullPolicy} {.spec.ephemeralContainers[0].terminationMessagePath} {.spec.containers[0].name}",
    ]);
    assert_eq!(got, "dbg main IfNotPresent /dev/termination-log main");
    let raw = s.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/pods/solo/ephemeralcontainers",
    ]);
    assert!(
        raw.contains(r#""name":"dbg""#) && raw.contains(r#""kind":"Pod""#),
        "{raw}"
    );
    // A second one, then a duplicate name and a missing target.
    s.ok(&[
        "debug",
        "solo",
        "--image=busybox:1.36",
        "-c",
        "dbg2",
        "--attach=false",
        "--",
        "true",
    ]);
    let (ok, _, err) = s.kubectl(&[
        "debug",
        "solo",
        "--image=busybox:1.36",
        "-c",
        "main",
        "--attach=false",
    ]);
    assert!(
        !ok && err
            .contains(r#"Pod "solo" is invalid: spec.ephemeralContainers[2].name: Duplicate value: "main""#),
        "{err}"
    );
    let (ok, _, err) = s.kubectl(&[
        "debug",
        "solo",
        "--image=busybox:1.36",
        "-c",
        "d3",
        "--target=nope",
        "--attach=false",
    ]);
    assert!(
        !ok && err.contains(r#"spec.ephemeralContainers[2].targetContainerName: Not found: "nope""#),
        "{err}"
    );
    // Ports are not for ephemeral containers; removing one is refused; the pod is unchanged.
    let patch = r#"{"spec":{"ephemeralContainers":[{"name":"dbg","image":"busybox:1.36","targetContainerName":"main","command":["sleep","1d"],"ports":[{"containerPort":80}]}]}}"#;
    let (ok, _, err) = s.kubectl(&[
        "patch",
        "pod",
        "solo",
        "--subresource=ephemeralcontainers",
        "--type=merge",
        "-p",
        patch,
    ]);
    assert!(
        !ok && err.contains("may not be removed") && err.contains("may not be changed"),
        "{err}"
    );
    let (ok, _, err) = s.kubectl(&[
        "patch", "pod", "solo", "--subresource=ephemeralcontainers", "--type=json", "-p",
        r#"[{"op":"add","path":"/spec/ephemeralContainers/-","value":{"name":"p","image":"busybox","ports":[{"containerPort":80}]}}]"#,
    ]);
    assert!(
        !ok && err.contains(
            "spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container"
        ),
        "{err}"
    );
    // The subresource changes nothing but the ephemeral containers; the pod itself cannot
    // change them.
    s.ok(&[
        "patch",
        "pod",
        "solo",
        "--subresource=ephemeralcontainers",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"sneaky":"yes"}}}"#,
    ]);
    s.ok(&[
        "patch",
        "pod",
        "solo",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/ephemeralContainers"}]"#,
    ]);
    let got = s.ok(&[
        "get",
        "pod",
        "solo",
        "-o",
        "jsonpath={.metadata.labels.sneaky}|{.spec.ephemeralContainers[*].name}",
    ]);
    assert_eq!(got, "|dbg dbg2");
    // Creates cannot carry them.
    let with = POD.replace("name: solo", "name: pre").replace(
        "  containers:",
        "  ephemeralContainers:\n  - name: e\n    image: busybox\n  containers:",
    );
    let (ok, _, err) = s.kubectl_stdin(&["create", "-f", "-"], Some(&with));
    assert!(
        !ok && err.contains(
            r#"Pod "pre" is invalid: spec.ephemeralContainers: Forbidden: cannot be set on create"#
        ),
        "{err}"
    );
}

/// `kubectl drain` evicts through pods/eviction; a PodDisruptionBudget (created with
/// `kubectl create pdb`, a protobuf body) that allows no disruption holds it back with the 429
/// kubectl retries on.
#[test]
fn drain_is_held_back_by_a_disruption_budget() {
    let s = start();
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}"#;
    s.apply(&["create", "-f", "-"], node);
    for n in ["a", "b"] {
        let pod = POD
            .replace("name: solo", &format!("name: {n}"))
            .replace("app: solo", "app: web")
            .replace("spec:\n", "spec:\n  nodeName: n1\n");
        s.apply(&["create", "-f", "-"], &pod);
        s.ok(&[
            "patch",
            "pod",
            n,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
        ]);
    }
    s.ok(&["create", "pdb", "web", "--selector=app=web", "--min-available=2"]);
    let (ok, out, err) = s.kubectl(&["drain", "n1", "--force", "--timeout=7s"]);
    assert!(!ok, "{out}");
    assert!(out.contains("node/n1 cordoned"), "{out}");
    assert!(
        err.contains(
            "(will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget."
        ),
        "{err}"
    );
    assert_eq!(
        s.ok(&["get", "pods", "-o", "name"]).lines().count(),
        2,
        "nothing was evicted"
    );
}

/// `kubectl create token` issues a service-account token that authenticates its bearer; a
/// tampered token, or one whose ServiceAccount is gone, does not.
#[test]
fn service_account_tokens() {
    let s = start();
    s.ok(&["create", "serviceaccount", "robot"]);
    let token = s.ok(&["create", "token", "robot"]).trim().to_string();
    assert_eq!(token.matches('.').count(), 2, "a JWT: {token}");
    let admin = std::fs::read_to_string(s.kubeconfig()).expect("kubeconfig");
    let field = |k: &str| {
        admin
            .lines()
            .find_map(|l| l.trim().strip_prefix(k))
            .map(str::trim)
            .expect("field")
            .to_string()
    };
    let (server, ca) = (field("server:"), field("certificate-authority-data:"));
    let as_token = |t: &str| {
        let cfg = s.path().join("token.kubeconfig");
        std::fs::write(
            &cfg,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: {t}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
            ),
        )
        .expect("write kubeconfig");
        let out = Command::new("kubectl")
            .env("KUBECONFIG", &cfg)
            .args(["get", "namespaces", "-o", "name"])
            .output()
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The token authenticates; without a binding its account may list nothing (the exact
    // upstream denial).
    let (ok, err) = as_token(&token);
    assert!(
        !ok && err.contains(
            "Error from server (Forbidden): namespaces is forbidden: User \"system:serviceaccount:default:robot\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope"
        ),
        "the token authenticates: {err}"
    );
    let mut forged = token.clone();
    let last = forged.pop().expect("char");
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let (ok, err) = as_token(&forged);
    assert!(!ok && err.contains("Unauthorized"), "{err}");
    let (ok, _, err) = s.kubectl(&["create", "token", "robot", "--duration=5m"]);
    assert!(
        !ok && err.contains("may not specify a duration less than 10 minutes"),
        "{err}"
    );
    s.ok(&["delete", "serviceaccount", "robot"]);
    let (ok, err) = as_token(&token);
    assert!(
        !ok && err.contains("Unauthorized"),
        "a deleted account's token: {err}"
    );
}

#[test]
fn delete_cascade_modes() {
    let s = start();
    for (mode, survivors) in [("background", 0), ("foreground", 0), ("orphan", 1)] {
        let owner = s.apply(
            &["create", "-f", "-", "-o", "jsonpath={.metadata.uid}"],
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"owner"}}"#,
        );
        let dep = POD.replace("name: solo", &format!(
            "name: dep\n  ownerReferences:\n  - {{apiVersion: v1, kind: ConfigMap, name: owner, uid: {owner}, controller: true}}"
        ));
        s.apply(&["create", "-f", "-"], &dep);
        s.ok(&["delete", "configmap", "owner", &format!("--cascade={mode}")]);
        // The garbage collector removes dependents asynchronously, as upstream's does (kubectl
        // waits for the owner only; a foreground deletion waits for blocking dependents).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let left = loop {
            let left = s.ok(&["get", "pods", "-o", "name"]);
            if left.lines().count() == survivors || std::time::Instant::now() > deadline {
                break left;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(left.lines().count(), survivors, "{mode}: {left}");
        if survivors > 0 {
            // Orphaned: kubectl returned once the owner was gone, after its references were
            // removed from the pod.
            let refs = s.ok(&["get", "pod", "dep", "-o", "jsonpath={.metadata.ownerReferences}"]);
            assert_eq!(refs, "", "{mode}");
            s.ok(&["delete", "pod", "dep"]);
        }
    }
}

#[test]
fn watch_and_wait() {
    let s = start();
    s.apply(&["create", "-f", "-"], POD);
    let lines = s.watch_pod_names(2, || {
        s.apply(&["create", "-f", "-"], &POD.replace("name: solo", "name: second"));
    });
    assert_eq!(lines, vec!["pod/solo", "pod/second"]);
    // wait: a condition that is already true, and deletion.
    s.ok(&[
        "patch",
        "pod",
        "solo",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]);
    assert!(
        s.ok(&["wait", "--for=condition=Ready", "pod/solo", "--timeout=20s"])
            .contains("condition met")
    );
    assert!(
        s.ok(&[
            "wait",
            "--for=jsonpath={.status.phase}=Running",
            "pod/solo",
            "--timeout=20s"
        ])
        .contains("condition met")
    );
    s.ok(&["delete", "pod", "second", "--wait=false"]);
    s.ok(&["wait", "--for=delete", "pod/second", "--timeout=20s"]);
}

#[test]
fn state_survives_restart() {
    let s = start();
    s.apply(&["create", "-f", "-"], POD);
    let uid = s.ok(&["get", "pod", "solo", "-o", "jsonpath={.metadata.uid}"]);
    let (dir, etcd) = s.kill();
    let s = start_in(dir, etcd);
    assert_eq!(
        s.ok(&["get", "pod", "solo", "-o", "jsonpath={.metadata.uid}"]),
        uid
    );
    // The PKI was reused: the old kubeconfig's client certificate still works (checked above),
    // and the CA file did not change.
    assert!(Path::new(&s.path().join("pki/ca.crt")).exists());
}

#[test]
fn bearer_tokens_and_unknown_clients() {
    let s = start();
    let kc = std::fs::read_to_string(s.kubeconfig()).expect("kubeconfig");
    // Same server and CA, a bearer token instead of the client certificate.
    let with_token = |token: &str| -> String {
        kc.lines()
            .filter(|l| !l.contains("client-certificate-data") && !l.contains("client-key-data"))
            .map(|l| {
                if l == "  user:" {
                    format!("  user:\n    token: {token}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let run_args = |name: &str, token: &str, args: &[&str]| {
        let path = s.path().join(name);
        std::fs::write(&path, with_token(token)).expect("write");
        Command::new("kubectl")
            .env("KUBECONFIG", &path)
            .arg("--cache-dir")
            .arg(s.path().join(format!("cache-{name}")))
            .args(args)
            .arg("--request-timeout=10s")
            .stdin(Stdio::null())
            .output()
            .expect("kubectl")
    };
    let run = |name: &str, token: &str| run_args(name, token, &["get", "namespaces", "-o", "name"]);
    let admin_token = std::fs::read_to_string(s.path().join("pki/admin.token")).expect("token");
    let good = run("good.kubeconfig", admin_token.trim());
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
    assert!(String::from_utf8_lossy(&good.stdout).contains("namespace/default"));
    let bad = run("bad.kubeconfig", "not-a-token");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        err.contains("must be logged in") || err.contains("Unauthorized"),
        "{err}"
    );
    // The node bootstrap token (a Secret in kube-system) may create and read CSRs, no more.
    let boot = std::fs::read_to_string(s.path().join("pki/bootstrap.token")).expect("bootstrap token");
    let boot = boot.trim();
    let id = boot.split('.').next().unwrap_or_default();
    let out = run_args("boot.kubeconfig", boot, &["get", "secrets", "-n", "kube-system"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(&format!(
                "secrets is forbidden: User \"system:bootstrap:{id}\" cannot list resource \"secrets\" in API group \"\" in the namespace \"kube-system\""
            )),
        "{err}"
    );
    let out = run_args(
        "boot.kubeconfig",
        boot,
        &["create", "token", "default", "-n", "kube-system"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot create resource \"serviceaccounts/token\""),
        "{err}"
    );
    let out = run_args("boot.kubeconfig", boot, &["get", "csr"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The token of the first start expires a day after it (--bootstrap-token-ttl's default).
    let expiration = |id: &str| {
        let name = format!("bootstrap-token-{id}");
        let args = [
            "-n",
            "kube-system",
            "get",
            "secret",
            &name,
            "-o",
            "jsonpath={.data.expiration}",
        ];
        let out = run_args("good.kubeconfig", admin_token.trim(), &args);
        let b64 = String::from_utf8_lossy(&out.stdout).to_string();
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|e| kcore::time::parse_rfc3339(&e))
    };
    let now = kcore::time::unix_seconds(std::time::SystemTime::now());
    let first = expiration(id).expect("the first token expires");
    assert!(
        (now + 86_400 - 120..=now + 86_400).contains(&first),
        "{first} vs {now}"
    );
    // `controlplane token create` makes more, as `kubeadm token create` does.
    let create = |ttl: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_controlplane"))
            .args(["token", "create", "--kubeconfig"])
            .arg(s.kubeconfig())
            .args(["--ttl", ttl])
            .output()
            .expect("controlplane token create");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let hour = create("1h");
    let (hour_id, _) = hour.split_once('.').expect("<id>.<secret>");
    let out = run_args("hour.kubeconfig", &hour, &["get", "csr"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let at = expiration(hour_id).expect("expires");
    assert!(
        (now + 3_600 - 120..=now + 3_600 + 120).contains(&at),
        "{at} vs {now}"
    );
    let forever = create("0");
    assert!(expiration(forever.split('.').next().unwrap_or_default()).is_none());
}

/// The official Python client (`kubernetes` from PyPI, in the venv `./build.sh setup` makes):
/// list, create, patch, watch, delete and the scale subresource.
#[test]
#[ignore = "needs the Python client: ./build.sh test api"]
fn python_client_list_create_patch_watch() {
    let python = std::env::var("NODEOS_PYTHON")
        .expect("NODEOS_PYTHON (the venv python with `kubernetes`) must be set: run ./build.sh test api");
    let s = start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/client_smoke.py");
    let out = Command::new(python)
        .arg(script)
        .arg(s.kubeconfig())
        .output()
        .expect("python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("python-client: ok"),
        "{text}"
    );
}

/// Two API servers (sharing the cluster PKI) on one real etcd serve one cluster: writes through
/// one are read, watched and version-checked through the other.
#[test]
fn two_api_servers_on_one_etcd() {
    let dir_a = tempfile::tempdir().expect("tempdir");
    let etcd =
        EtcdProcess::spawn(&dir_a.path().join("etcd")).expect("start etcd (apt-get install etcd-server)");
    let endpoint = etcd.endpoint.clone();
    let a = start_in(dir_a, Some(etcd));
    let dir_b = tempfile::tempdir().expect("tempdir");
    let copy = Command::new("cp")
        .arg("-r")
        .arg(a.path().join("pki"))
        .arg(dir_b.path())
        .status()
        .expect("cp");
    assert!(copy.success());
    let bin = Path::new(env!("CARGO_BIN_EXE_controlplane"));
    let process =
        ServerProcess::spawn(bin, dir_b.path(), &["--etcd", &endpoint]).expect("second controlplane");
    let cache = dir_b.path().join("kube-cache");
    let b = Server {
        process: Some(process),
        etcd: None,
        dir: Some(dir_b),
        cache,
    };

    a.apply(&["create", "-f", "-"], POD);
    assert_eq!(
        b.ok(&["get", "pod", "solo", "-o", "jsonpath={.spec.containers[0].image}"]),
        "busybox:1.36"
    );
    b.ok(&["label", "pod", "solo", "via=b"]);
    let rv_a = a.ok(&[
        "get",
        "pod",
        "solo",
        "-o",
        "jsonpath={.metadata.resourceVersion} {.metadata.labels.via}",
    ]);
    let rv_b = b.ok(&[
        "get",
        "pod",
        "solo",
        "-o",
        "jsonpath={.metadata.resourceVersion} {.metadata.labels.via}",
    ]);
    assert_eq!(rv_a, rv_b);
    assert!(rv_a.ends_with(" b"), "{rv_a}");
    // A stale resourceVersion is refused by either server.
    let rv = rv_a.split_whitespace().next().unwrap_or_default().to_string();
    a.ok(&["annotate", "pod", "solo", "bump=1"]);
    let stale = POD.replace("name: solo", &format!("name: solo\n  resourceVersion: \"{rv}\""));
    let (ok, _, err) = b.kubectl_stdin(&["replace", "-f", "-"], Some(&stale));
    assert!(!ok && err.contains("the object has been modified"), "{err}");
    // A watch on B sees a create on A.
    let lines = b.watch_pod_names(2, || {
        a.apply(&["create", "-f", "-"], &POD.replace("name: solo", "name: from-a"));
    });
    assert_eq!(lines, vec!["pod/solo", "pod/from-a"]);
}

/// RBAC through the real kubectl: `auth whoami`, `auth can-i` (with `--as` and `--list`, the
/// seeds' CoreDNS answers), a namespace admin who may grant only what they hold, and
/// impersonation.
#[test]
fn rbac_can_i_whoami_and_escalation() {
    let s = start();
    let who = s.ok(&["auth", "whoami"]);
    assert!(who.contains("Username    admin"), "{who}");
    assert!(who.contains("[system:masters system:authenticated]"), "{who}");
    assert_eq!(s.ok(&["auth", "can-i", "list", "pods"]).trim(), "yes");
    let coredns = "--as=system:serviceaccount:kube-system:coredns";
    let (ok, out, _) = s.kubectl(&["auth", "can-i", "get", "secrets", "-n", "kube-system", coredns]);
    assert!(!ok && out.trim() == "no", "{out}");
    let list = s.ok(&["auth", "can-i", "--list", coredns]);
    assert!(list.starts_with("Resources"), "{list}");
    for row in ["endpoints", "pods", "services", "endpointslices.discovery.k8s.io"] {
        assert!(
            list.lines()
                .any(|l| l.starts_with(&format!("{row} ")) && l.trim_end().ends_with("[list watch]")),
            "{row} in:\n{list}"
        );
    }
    let crb = s.ok(&[
        "get",
        "clusterrolebinding",
        "system:coredns",
        "-o",
        "jsonpath={.roleRef.name} {.subjects}",
    ]);
    assert_eq!(
        crb,
        "system:coredns [{\"kind\":\"ServiceAccount\",\"name\":\"coredns\",\"namespace\":\"kube-system\"}]"
    );
    // A namespace admin grants what they hold, and nothing else.
    s.ok(&[
        "create",
        "rolebinding",
        "dev-admin",
        "--clusterrole=admin",
        "--user=dev",
    ]);
    assert_eq!(
        s.ok(&["auth", "can-i", "create", "roles", "--as=dev"]).trim(),
        "yes"
    );
    s.ok(&[
        "create",
        "role",
        "pod-reader",
        "--verb=get",
        "--resource=pods",
        "--as=dev",
    ]);
    let (ok, _, err) = s.kubectl(&[
        "create",
        "role",
        "node-lister",
        "--verb=list",
        "--resource=nodes",
        "--as=dev",
    ]);
    assert!(!ok, "escalation refused");
    assert!(
        err.contains(
            "roles.rbac.authorization.k8s.io \"node-lister\" is forbidden: user \"dev\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"list\"]}"
        ),
        "{err}"
    );
    let (ok, _, err) = s.kubectl(&[
        "create",
        "rolebinding",
        "steal",
        "--clusterrole=cluster-admin",
        "--user=dev",
        "--as=dev",
    ]);
    assert!(
        !ok && err.contains("is attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    let (ok, _, err) = s.kubectl(&["get", "pods", "-n", "kube-system", "--as=dev"]);
    assert!(
        !ok && err.contains(
            "pods is forbidden: User \"dev\" cannot list resource \"pods\" in API group \"\" in the namespace \"kube-system\""
        ),
        "{err}"
    );
}

/// The reviews are in discovery as upstream lists them (create only), `kubectl create -f` of a
/// SelfSubjectAccessReview answers it (validated against the served OpenAPI), and any other
/// verb is 405.
#[test]
fn reviews_are_discovered_and_only_created() {
    let s = start();
    let wide = s.ok(&[
        "api-resources",
        "--api-group=authorization.k8s.io",
        "-o",
        "wide",
        "--no-headers",
    ]);
    for (plural, namespaced, kind) in [
        ("localsubjectaccessreviews", "true", "LocalSubjectAccessReview"),
        ("selfsubjectaccessreviews", "false", "SelfSubjectAccessReview"),
        ("selfsubjectrulesreviews", "false", "SelfSubjectRulesReview"),
        ("subjectaccessreviews", "false", "SubjectAccessReview"),
    ] {
        let row: Vec<&str> = wide
            .lines()
            .find(|l| l.starts_with(&format!("{plural} ")))
            .unwrap_or_else(|| panic!("{plural} missing:\n{wide}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            row[1..5],
            ["authorization.k8s.io/v1", namespaced, kind, "create"],
            "{row:?}"
        );
    }
    let authn = s.ok(&["api-resources", "--api-group=authentication.k8s.io", "-o", "name"]);
    assert_eq!(
        authn.split_whitespace().collect::<Vec<_>>(),
        [
            "selfsubjectreviews.authentication.k8s.io",
            "tokenreviews.authentication.k8s.io"
        ]
    );
    let ssar = "apiVersion: authorization.k8s.io/v1\nkind: SelfSubjectAccessReview\nspec:\n  resourceAttributes:\n    verb: list\n    resource: pods\n    namespace: default\n";
    let allowed = s.apply(&["create", "-f", "-", "-o", "jsonpath={.status.allowed}"], ssar);
    assert_eq!(allowed.trim(), "true");
    let (ok, _, err) = s.kubectl(&["get", "selfsubjectaccessreviews"]);
    assert!(
        !ok && err.contains("MethodNotAllowed") && err.contains("does not allow this method"),
        "{err}"
    );
}

/// TokenReview (what a kubelet's webhook authentication posts) says who a bearer token is:
/// service-account and bootstrap tokens authenticate, a forged token or another audience does
/// not, an empty token is a 400, and it is never stored.
#[test]
fn token_reviews_say_who_a_token_is() {
    let s = start();
    s.ok(&["create", "serviceaccount", "robot"]);
    let sa_token = s.ok(&["create", "token", "robot"]).trim().to_string();
    let bootstrap = std::fs::read_to_string(s.path().join("pki/bootstrap.token")).expect("bootstrap token");
    let review = |token: &str, audiences: &str| -> serde_json::Value {
        let manifest = format!(
            "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: \"{token}\"\n{audiences}"
        );
        let out = s.apply(&["create", "-f", "-", "-o", "json"], &manifest);
        serde_json::from_str(&out).expect("json")
    };
    let status = review(&sa_token, "")["status"].clone();
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(status["user"]["username"], "system:serviceaccount:default:robot");
    assert_eq!(
        status["user"]["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    assert_eq!(
        status["audiences"],
        serde_json::json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let status = review(bootstrap.trim(), "")["status"].clone();
    assert_eq!(status["authenticated"], true, "{status}");
    assert!(
        status["user"]["username"]
            .as_str()
            .is_some_and(|u| u.starts_with("system:bootstrap:")),
        "{status}"
    );
    let mut forged = sa_token.clone();
    let last = forged.pop().expect("char");
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let status = review(&forged, "")["status"].clone();
    assert_eq!(status["authenticated"], serde_json::Value::Null, "{status}");
    assert_eq!(status["error"], "invalid bearer token", "{status}");
    let status = review(&sa_token, "  audiences: [\"vault\"]\n")["status"].clone();
    assert_eq!(status["authenticated"], serde_json::Value::Null, "{status}");
    let status = review(
        &sa_token,
        "  audiences: [\"vault\", \"https://kubernetes.default.svc.cluster.local\"]\n",
    )["status"]
        .clone();
    assert_eq!(status["authenticated"], true, "{status}");
    let (ok, _, err) = s.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: \"\"\n"),
    );
    assert!(
        !ok && err.contains("token is required for TokenReview in authentication"),
        "{err}"
    );
    let (ok, _, err) = s.kubectl(&["get", "tokenreviews"]);
    assert!(!ok && err.contains("MethodNotAllowed"), "{err}");
}

/// `kubectl autoscale` posts an autoscaling/v1 HPA (protobuf); it is stored as v2 and shown in
/// both versions with upstream's columns; a v1 patch and an invalid size behave as upstream.
#[test]
fn autoscale_posts_v1_and_get_shows_both_versions() {
    let s = start();
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--",
        "sleep",
        "1d",
    ]);
    let out = s.ok(&[
        "autoscale",
        "deployment",
        "web",
        "--min=2",
        "--max=5",
        "--cpu-percent=70",
    ]);
    assert_eq!(out.trim(), "horizontalpodautoscaler.autoscaling/web autoscaled");
    let table = s.ok(&["get", "hpa"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "REFERENCE",
            "TARGETS",
            "MINPODS",
            "MAXPODS",
            "REPLICAS",
            "AGE"
        ]
    );
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        &row[..6],
        ["web", "Deployment/web", "cpu:", "<unknown>/70%", "2", "5"]
    );
    let v2 = s.ok(&[
        "get",
        "hpa",
        "web",
        "-o",
        "jsonpath={.apiVersion} {.spec.metrics[0].resource.target.averageUtilization}",
    ]);
    assert_eq!(v2, "autoscaling/v2 70");
    let v1 = s.ok(&[
        "get",
        "horizontalpodautoscalers.v1.autoscaling",
        "web",
        "-o",
        "jsonpath={.apiVersion} {.spec.targetCPUUtilizationPercentage}",
    ]);
    assert_eq!(v1, "autoscaling/v1 70");
    s.ok(&[
        "patch",
        "horizontalpodautoscalers.v1.autoscaling",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"targetCPUUtilizationPercentage":55}}"#,
    ]);
    let v2 = s.ok(&[
        "get",
        "hpa",
        "web",
        "-o",
        "jsonpath={.spec.metrics[0].resource.target.averageUtilization}",
    ]);
    assert_eq!(v2, "55");
    let (ok, _, err) = s.kubectl(&[
        "patch",
        "hpa",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minReplicas":9}}"#,
    ]);
    assert!(!ok);
    assert!(
        err.contains("spec.maxReplicas: Invalid value: 5: must be greater than or equal to `minReplicas`"),
        "{err}"
    );
    s.ok(&["delete", "horizontalpodautoscalers.v1.autoscaling", "web"]);
    let (ok, _, err) = s.kubectl(&["get", "hpa", "web"]);
    assert!(!ok);
    assert!(err.contains("not found"), "{err}");
}
