//! The bootstrap RBAC policy: upstream's default ClusterRoles and ClusterRoleBindings (read from
//! upstream's `bootstrappolicy`, written here in our own form), kubeadm's `system:coredns`, and
//! the roles of the bundled components, which run as `system:kube-scheduler` and
//! `system:kube-controller-manager`: upstream's roles for those users plus `nodeos:*` roles with
//! what the bundled scheduler and controllers use beyond them (the controllers share one
//! identity instead of upstream's per-controller service accounts).

use serde_json::{Value, json};

use super::rules::Rule;

/// Labels and annotations every bootstrap object carries.
pub(crate) const BOOTSTRAPPING_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
/// Objects with this annotation `"true"` are reconciled at start (missing rules and subjects
/// added); `"false"` leaves them alone.
pub(crate) const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
/// Every verb of a stored resource.
const RW: &[&str] = crate::api::registry::VERBS;
const EVENTS: &[&str] = &["create", "patch", "update"];

const CORE: &str = "";
const APPS: &str = "apps";
const AUTHN: &str = "authentication.k8s.io";
const AUTHZ: &str = "authorization.k8s.io";
const CERTS: &str = "certificates.k8s.io";
const COORD: &str = "coordination.k8s.io";
const RBAC: &str = "rbac.authorization.k8s.io";
const METRICS: &str = "metrics.k8s.io";

/// A bootstrap ClusterRole.
#[derive(Debug, Clone)]
pub(crate) struct RoleSpec {
    pub name: &'static str,
    pub rules: Vec<Rule>,
    /// Extra labels (aggregation targets).
    pub labels: &'static [(&'static str, &'static str)],
    /// `aggregationRule`: the `matchLabels` label (value "true") of each selector.
    pub aggregate_from: &'static [&'static str],
}

fn role(name: &'static str, rules: Vec<Rule>) -> RoleSpec {
    RoleSpec {
        name,
        rules,
        labels: &[],
        aggregate_from: &[],
    }
}

fn events_rule() -> Rule {
    Rule::new(EVENTS, &[CORE, "events.k8s.io"], &["events"])
}

/// The rules of `system:node` (upstream's `NodeRules`).
pub(crate) fn node_rules() -> Vec<Rule> {
    vec![
        Rule::new(&["create"], &[AUTHN], &["tokenreviews"]),
        Rule::new(
            &["create"],
            &[AUTHZ],
            &["localsubjectaccessreviews", "subjectaccessreviews"],
        ),
        Rule::new(READ, &[CORE], &["services"]),
        Rule::new(&["create", "get", "list", "watch"], &[CORE], &["nodes"]),
        Rule::new(&["patch", "update"], &[CORE], &["nodes/status"]),
        Rule::new(&["patch", "update"], &[CORE], &["nodes"]),
        Rule::new(&["create", "patch", "update"], &[CORE], &["events"]),
        Rule::new(READ, &[CORE], &["pods"]),
        Rule::new(&["create", "delete"], &[CORE], &["pods"]),
        Rule::new(&["patch", "update"], &[CORE], &["pods/status"]),
        Rule::new(&["create"], &[CORE], &["pods/eviction"]),
        Rule::new(READ, &[CORE], &["configmaps", "secrets"]),
        Rule::new(
            &["get"],
            &[CORE],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        Rule::new(&["get"], &[CORE], &["endpoints"]),
        Rule::new(
            &["create", "get", "list", "watch"],
            &[CERTS],
            &["certificatesigningrequests"],
        ),
        Rule::new(
            &["create", "delete", "get", "patch", "update"],
            &[COORD],
            &["leases"],
        ),
        Rule::new(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
        Rule::new(&["create"], &[CORE], &["serviceaccounts/token"]),
        Rule::new(
            &["get", "patch", "update"],
            &[CORE],
            &["persistentvolumeclaims/status"],
        ),
        Rule::new(READ, &["storage.k8s.io"], &["csidrivers"]),
        Rule::new(
            &["create", "delete", "get", "patch", "update"],
            &["storage.k8s.io"],
            &["csinodes"],
        ),
        Rule::new(READ, &["node.k8s.io"], &["runtimeclasses"]),
    ]
}

fn approver(name: &'static str, signer: &'static str) -> RoleSpec {
    role(
        name,
        vec![Rule::new(&["approve"], &[CERTS], &["signers"]).names(&[signer])],
    )
}

/// The bootstrap ClusterRoles.
pub(crate) fn cluster_roles() -> Vec<RoleSpec> {
    vec![
        role(
            "cluster-admin",
            vec![Rule::new(&["*"], &["*"], &["*"]), Rule::urls(&["*"], &["*"])],
        ),
        role(
            "system:discovery",
            vec![Rule::urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        role(
            "system:public-info-viewer",
            vec![Rule::urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        role(
            "system:basic-user",
            vec![
                Rule::new(
                    &["create"],
                    &[AUTHZ],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                Rule::new(&["create"], &[AUTHN], &["selfsubjectreviews"]),
            ],
        ),
        RoleSpec {
            aggregate_from: &["rbac.authorization.k8s.io/aggregate-to-admin"],
            ..role("admin", vec![])
        },
        RoleSpec {
            labels: &[("rbac.authorization.k8s.io/aggregate-to-admin", "true")],
            aggregate_from: &["rbac.authorization.k8s.io/aggregate-to-edit"],
            ..role("edit", vec![])
        },
        RoleSpec {
            labels: &[("rbac.authorization.k8s.io/aggregate-to-edit", "true")],
            aggregate_from: &["rbac.authorization.k8s.io/aggregate-to-view"],
            ..role("view", vec![])
        },
        RoleSpec {
            labels: &[("rbac.authorization.k8s.io/aggregate-to-admin", "true")],
            ..role(
                "system:aggregate-to-admin",
                vec![
                    Rule::new(&["create"], &[AUTHZ], &["localsubjectaccessreviews"]),
                    Rule::new(RW, &[RBAC], &["rolebindings", "roles"]),
                ],
            )
        },
        RoleSpec {
            labels: &[("rbac.authorization.k8s.io/aggregate-to-edit", "true")],
            ..role(
                "system:aggregate-to-edit",
                vec![
                    Rule::new(
                        READ,
                        &[CORE],
                        &[
                            "pods/attach",
                            "pods/exec",
                            "pods/portforward",
                            "pods/proxy",
                            "secrets",
                            "services/proxy",
                        ],
                    ),
                    Rule::new(&["impersonate"], &[CORE], &["serviceaccounts"]),
                    Rule::new(
                        WRITE,
                        &[CORE],
                        &[
                            "pods",
                            "pods/attach",
                            "pods/exec",
                            "pods/portforward",
                            "pods/proxy",
                        ],
                    ),
                    Rule::new(&["create"], &[CORE], &["pods/eviction"]),
                    Rule::new(
                        WRITE,
                        &[CORE],
                        &[
                            "configmaps",
                            "events",
                            "persistentvolumeclaims",
                            "replicationcontrollers",
                            "replicationcontrollers/scale",
                            "secrets",
                            "serviceaccounts",
                            "services",
                            "services/proxy",
                        ],
                    ),
                    Rule::new(&["create"], &[CORE], &["serviceaccounts/token"]),
                    Rule::new(
                        WRITE,
                        &[APPS],
                        &[
                            "daemonsets",
                            "deployments",
                            "deployments/rollback",
                            "deployments/scale",
                            "replicasets",
                            "replicasets/scale",
                            "statefulsets",
                            "statefulsets/scale",
                        ],
                    ),
                    Rule::new(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                    Rule::new(WRITE, &["batch"], &["cronjobs", "jobs"]),
                    Rule::new(
                        WRITE,
                        &["extensions"],
                        &[
                            "daemonsets",
                            "deployments",
                            "deployments/rollback",
                            "deployments/scale",
                            "ingresses",
                            "networkpolicies",
                            "replicasets",
                            "replicasets/scale",
                            "replicationcontrollers/scale",
                        ],
                    ),
                    Rule::new(WRITE, &["policy"], &["poddisruptionbudgets"]),
                    Rule::new(WRITE, &["networking.k8s.io"], &["ingresses", "networkpolicies"]),
                    Rule::new(RW, &[COORD], &["leases"]),
                ],
            )
        },
        RoleSpec {
            labels: &[("rbac.authorization.k8s.io/aggregate-to-view", "true")],
            ..role(
                "system:aggregate-to-view",
                vec![
                    Rule::new(
                        READ,
                        &[CORE],
                        &[
                            "configmaps",
                            "endpoints",
                            "persistentvolumeclaims",
                            "persistentvolumeclaims/status",
                            "pods",
                            "replicationcontrollers",
                            "replicationcontrollers/scale",
                            "serviceaccounts",
                            "services",
                            "services/status",
                        ],
                    ),
                    Rule::new(
                        READ,
                        &[CORE],
                        &[
                            "bindings",
                            "events",
                            "limitranges",
                            "namespaces/status",
                            "pods/log",
                            "pods/status",
                            "replicationcontrollers/status",
                            "resourcequotas",
                            "resourcequotas/status",
                        ],
                    ),
                    Rule::new(READ, &[CORE], &["namespaces"]),
                    Rule::new(READ, &["discovery.k8s.io"], &["endpointslices"]),
                    Rule::new(
                        READ,
                        &[APPS],
                        &[
                            "controllerrevisions",
                            "daemonsets",
                            "daemonsets/status",
                            "deployments",
                            "deployments/scale",
                            "deployments/status",
                            "replicasets",
                            "replicasets/scale",
                            "replicasets/status",
                            "statefulsets",
                            "statefulsets/scale",
                            "statefulsets/status",
                        ],
                    ),
                    Rule::new(
                        READ,
                        &["autoscaling"],
                        &["horizontalpodautoscalers", "horizontalpodautoscalers/status"],
                    ),
                    Rule::new(
                        READ,
                        &["batch"],
                        &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                    ),
                    Rule::new(
                        READ,
                        &["policy"],
                        &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                    ),
                    Rule::new(
                        READ,
                        &["networking.k8s.io"],
                        &["ingresses", "ingresses/status", "networkpolicies"],
                    ),
                ],
            )
        },
        // metrics-server's role (its manifest installs it; the metrics API is served here):
        // reading metrics, aggregated into view, edit and admin.
        RoleSpec {
            labels: &[
                ("rbac.authorization.k8s.io/aggregate-to-admin", "true"),
                ("rbac.authorization.k8s.io/aggregate-to-edit", "true"),
                ("rbac.authorization.k8s.io/aggregate-to-view", "true"),
            ],
            ..role(
                "system:aggregated-metrics-reader",
                vec![Rule::new(READ, &[METRICS], &["pods", "nodes"])],
            )
        },
        role(
            "system:auth-delegator",
            vec![
                Rule::new(&["create"], &[AUTHN], &["tokenreviews"]),
                Rule::new(&["create"], &[AUTHZ], &["subjectaccessreviews"]),
            ],
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![Rule::new(
                &["create"],
                &[CERTS],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![Rule::new(
                &["create"],
                &[CERTS],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
        approver(
            "system:certificates.k8s.io:kube-apiserver-client-approver",
            "kubernetes.io/kube-apiserver-client",
        ),
        approver(
            "system:certificates.k8s.io:kube-apiserver-client-kubelet-approver",
            "kubernetes.io/kube-apiserver-client-kubelet",
        ),
        approver(
            "system:certificates.k8s.io:kubelet-serving-approver",
            "kubernetes.io/kubelet-serving",
        ),
        approver(
            "system:certificates.k8s.io:legacy-unknown-approver",
            "kubernetes.io/legacy-unknown",
        ),
        role(
            "system:kube-controller-manager",
            vec![
                events_rule(),
                Rule::new(&["create"], &[COORD], &["leases"]),
                Rule::new(&["get", "update"], &[COORD], &["leases"]).names(&["kube-controller-manager"]),
                Rule::new(&["create"], &[CORE], &["secrets", "serviceaccounts"]),
                Rule::new(&["delete"], &[CORE], &["secrets"]),
                Rule::new(
                    &["get"],
                    &[CORE],
                    &["configmaps", "namespaces", "secrets", "serviceaccounts"],
                ),
                Rule::new(&["update"], &[CORE], &["secrets", "serviceaccounts"]),
                Rule::new(&["create"], &[AUTHN], &["tokenreviews"]),
                Rule::new(&["create"], &[AUTHZ], &["subjectaccessreviews"]),
                Rule::new(&["list", "watch"], &["*"], &["*"]),
                Rule::new(&["create"], &[CORE], &["serviceaccounts/token"]),
            ],
        ),
        role(
            "system:kube-scheduler",
            vec![
                events_rule(),
                Rule::new(&["create"], &[COORD], &["leases"]),
                Rule::new(&["get", "update"], &[COORD], &["leases"]).names(&["kube-scheduler"]),
                Rule::new(READ, &[CORE], &["nodes"]),
                Rule::new(&["delete", "get", "list", "watch"], &[CORE], &["pods"]),
                Rule::new(&["create"], &[CORE], &["bindings", "pods/binding"]),
                Rule::new(&["patch", "update"], &[CORE], &["pods/status"]),
                Rule::new(READ, &[CORE], &["replicationcontrollers", "services"]),
                Rule::new(READ, &[APPS, "extensions"], &["replicasets"]),
                Rule::new(READ, &[APPS], &["statefulsets"]),
                Rule::new(READ, &["policy"], &["poddisruptionbudgets"]),
                Rule::new(READ, &[CORE], &["persistentvolumeclaims", "persistentvolumes"]),
                Rule::new(&["create"], &[AUTHN], &["tokenreviews"]),
                Rule::new(&["create"], &[AUTHZ], &["subjectaccessreviews"]),
                Rule::new(READ, &["storage.k8s.io"], &["csinodes"]),
                Rule::new(READ, &[CORE], &["namespaces"]),
                Rule::new(READ, &["storage.k8s.io"], &["csidrivers"]),
                Rule::new(READ, &["storage.k8s.io"], &["csistoragecapacities"]),
            ],
        ),
        role(
            "system:volume-scheduler",
            vec![
                Rule::new(
                    &["get", "list", "patch", "update", "watch"],
                    &[CORE],
                    &["persistentvolumes"],
                ),
                Rule::new(READ, &["storage.k8s.io"], &["storageclasses"]),
                Rule::new(
                    &["get", "list", "patch", "update", "watch"],
                    &[CORE],
                    &["persistentvolumeclaims"],
                ),
            ],
        ),
        role(
            "system:kube-dns",
            vec![Rule::new(&["list", "watch"], &[CORE], &["endpoints", "services"])],
        ),
        role(
            "system:kubelet-api-admin",
            vec![
                Rule::new(READ, &[CORE], &["nodes"]),
                Rule::new(&["proxy"], &[CORE], &["nodes"]),
                Rule::new(
                    &["*"],
                    &[CORE],
                    &["nodes/log", "nodes/metrics", "nodes/proxy", "nodes/stats"],
                ),
            ],
        ),
        role(
            "system:monitoring",
            vec![Rule::urls(
                &["get"],
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/metrics/slis",
                    "/readyz",
                    "/readyz/*",
                ],
            )],
        ),
        role("system:node", node_rules()),
        role(
            "system:node-bootstrapper",
            vec![Rule::new(
                &["create", "get", "list", "watch"],
                &[CERTS],
                &["certificatesigningrequests"],
            )],
        ),
        role(
            "system:node-proxier",
            vec![
                Rule::new(&["list", "watch"], &[CORE], &["endpoints", "services"]),
                Rule::new(READ, &[CORE], &["nodes"]),
                events_rule(),
                Rule::new(&["list", "watch"], &["discovery.k8s.io"], &["endpointslices"]),
            ],
        ),
        role(
            "system:service-account-issuer-discovery",
            vec![Rule::urls(
                &["get"],
                &["/.well-known/openid-configuration", "/openid/v1/jwks"],
            )],
        ),
        // kubeadm's CoreDNS role (docs/SEEDS-SPEC.md CTL-64).
        role(
            "system:coredns",
            vec![
                Rule::new(
                    &["list", "watch"],
                    &[CORE],
                    &["endpoints", "services", "pods", "namespaces"],
                ),
                Rule::new(&["list", "watch"], &["discovery.k8s.io"], &["endpointslices"]),
            ],
        ),
        // What the bundled scheduler reads beyond upstream's role (it resolves priority and
        // runtime classes itself).
        role(
            "nodeos:kube-scheduler",
            vec![
                Rule::new(READ, &["scheduling.k8s.io"], &["priorityclasses"]),
                Rule::new(READ, &["node.k8s.io"], &["runtimeclasses"]),
            ],
        ),
        // What the bundled controllers write (they run as system:kube-controller-manager, whose
        // upstream role only lists and watches): the union of upstream's controller roles for
        // the controllers we run, with `patch` on status where ours patch it.
        role(
            "nodeos:controller-manager",
            vec![
                events_rule(),
                Rule::new(
                    &["get", "create", "update", "patch", "delete"],
                    &[CORE],
                    &["pods", "persistentvolumeclaims"],
                ),
                Rule::new(&["update", "patch"], &[CORE], &["pods/status"]),
                Rule::new(&["create"], &[CORE], &["pods/binding", "pods/eviction"]),
                Rule::new(&["update"], &[CORE], &["pods/finalizers"]),
                Rule::new(&["get", "update", "patch", "delete"], &[CORE], &["nodes"]),
                Rule::new(&["update", "patch"], &[CORE], &["nodes/status"]),
                // The HorizontalPodAutoscaler reads pod metrics (upstream's
                // `system:controller:horizontal-pod-autoscaler`).
                Rule::new(&["list"], &[METRICS], &["pods"]),
                Rule::new(
                    &["get", "create", "update", "patch", "delete"],
                    &[APPS],
                    &[
                        "deployments",
                        "replicasets",
                        "statefulsets",
                        "daemonsets",
                        "controllerrevisions",
                    ],
                ),
                Rule::new(
                    &["update", "patch"],
                    &[APPS],
                    &[
                        "deployments/status",
                        "replicasets/status",
                        "statefulsets/status",
                        "daemonsets/status",
                        "deployments/finalizers",
                        "replicasets/finalizers",
                        "statefulsets/finalizers",
                        "daemonsets/finalizers",
                    ],
                ),
                Rule::new(
                    &["get", "create", "update", "patch", "delete"],
                    &["batch"],
                    &["jobs", "cronjobs"],
                ),
                Rule::new(
                    &["update", "patch"],
                    &["batch"],
                    &[
                        "jobs/status",
                        "cronjobs/status",
                        "jobs/finalizers",
                        "cronjobs/finalizers",
                    ],
                ),
                Rule::new(&["get"], &["policy"], &["poddisruptionbudgets"]),
                Rule::new(
                    &["update", "patch"],
                    &["policy"],
                    &["poddisruptionbudgets/status"],
                ),
                Rule::new(&["get"], &["*"], &["*/scale"]),
                Rule::new(&["get"], &[CORE], &["replicationcontrollers"]),
                // The horizontal pod autoscaler (upstream's horizontal-pod-autoscaler role).
                Rule::new(
                    &["get", "list", "watch"],
                    &["autoscaling"],
                    &["horizontalpodautoscalers"],
                ),
                Rule::new(
                    &["update", "patch"],
                    &["autoscaling"],
                    &["horizontalpodautoscalers/status"],
                ),
                Rule::new(
                    &["get", "update", "patch"],
                    &[APPS],
                    &["deployments/scale", "replicasets/scale", "statefulsets/scale"],
                ),
                Rule::new(
                    &["get", "update", "patch"],
                    &[CORE],
                    &["replicationcontrollers/scale"],
                ),
                Rule::new(&["get", "list"], &["metrics.k8s.io"], &["pods", "nodes"]),
                // The garbage collector and the namespace controller (upstream's
                // generic-garbage-collector and namespace-controller roles): any object.
                Rule::new(
                    &[
                        "get",
                        "list",
                        "watch",
                        "patch",
                        "update",
                        "delete",
                        "deletecollection",
                    ],
                    &["*"],
                    &["*"],
                ),
                // The ServiceAccount and root-CA publishers.
                Rule::new(&["create"], &[CORE], &["serviceaccounts", "configmaps"]),
            ],
        ),
    ]
}

/// A bootstrap ClusterRoleBinding: (name, role, subjects as (kind, name, namespace)).
pub(crate) type BindingSpec = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str, &'static str)],
);

/// The bootstrap ClusterRoleBindings.
pub(crate) fn cluster_role_bindings() -> Vec<BindingSpec> {
    vec![
        (
            "cluster-admin",
            "cluster-admin",
            &[("Group", "system:masters", "")],
        ),
        (
            "system:basic-user",
            "system:basic-user",
            &[("Group", "system:authenticated", "")],
        ),
        (
            "system:discovery",
            "system:discovery",
            &[("Group", "system:authenticated", "")],
        ),
        (
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[
                ("Group", "system:authenticated", ""),
                ("Group", "system:unauthenticated", ""),
            ],
        ),
        (
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            &[("User", "system:kube-controller-manager", "")],
        ),
        (
            "system:kube-scheduler",
            "system:kube-scheduler",
            &[("User", "system:kube-scheduler", "")],
        ),
        (
            "system:volume-scheduler",
            "system:volume-scheduler",
            &[("User", "system:kube-scheduler", "")],
        ),
        (
            "system:kube-dns",
            "system:kube-dns",
            &[("ServiceAccount", "kube-dns", "kube-system")],
        ),
        (
            "system:monitoring",
            "system:monitoring",
            &[("Group", "system:monitoring", "")],
        ),
        (
            "system:node-proxier",
            "system:node-proxier",
            &[("User", "system:kube-proxy", "")],
        ),
        (
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            &[("Group", "system:serviceaccounts", "")],
        ),
        (
            "system:coredns",
            "system:coredns",
            &[("ServiceAccount", "coredns", "kube-system")],
        ),
        // Node bootstrap (as kubeadm binds it): bootstrap-token holders may ask for a kubelet
        // client certificate, and nodes may renew theirs.
        (
            "nodeos:kubelet-bootstrap",
            "system:node-bootstrapper",
            &[("Group", "system:bootstrappers", "")],
        ),
        (
            "nodeos:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[("Group", "system:bootstrappers", "")],
        ),
        (
            "nodeos:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[("Group", "system:nodes", "")],
        ),
        // The API server's client certificate for node agents (logs, exec, stats) may do
        // what the kubelet API allows and nothing else.
        (
            "nodeos:kube-apiserver-kubelet-client",
            "system:kubelet-api-admin",
            &[("User", crate::pki::KUBELET_CLIENT_USER, "")],
        ),
        // Bound to no one, as upstream: the Node authorizer grants nodes these rules.
        ("system:node", "system:node", &[]),
        (
            "nodeos:kube-scheduler",
            "nodeos:kube-scheduler",
            &[("User", "system:kube-scheduler", "")],
        ),
        (
            "nodeos:controller-manager",
            "nodeos:controller-manager",
            &[("User", "system:kube-controller-manager", "")],
        ),
    ]
}

fn metadata(name: &str, extra_labels: &[(&str, &str)]) -> Value {
    let mut labels = json!({ BOOTSTRAPPING_LABEL.0: BOOTSTRAPPING_LABEL.1 });
    for (k, v) in extra_labels {
        labels[*k] = json!(v);
    }
    json!({"name": name, "labels": labels, "annotations": { AUTOUPDATE: "true" }})
}

/// The ClusterRole object of `spec`.
pub(crate) fn cluster_role_object(spec: &RoleSpec) -> Value {
    let mut obj = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": metadata(spec.name, spec.labels),
        "rules": spec.rules,
    });
    if !spec.aggregate_from.is_empty() {
        let selectors: Vec<Value> = spec
            .aggregate_from
            .iter()
            .map(|l| json!({"matchLabels": { *l: "true" }}))
            .collect();
        obj["aggregationRule"] = json!({ "clusterRoleSelectors": selectors });
    }
    obj
}

/// The ClusterRoleBinding object of `spec`.
pub(crate) fn cluster_role_binding_object(spec: &BindingSpec) -> Value {
    let (name, role, subjects) = spec;
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": metadata(name, &[]),
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
        "subjects": subjects.iter().map(subject_object).collect::<Vec<_>>(),
    })
}

fn subject_object(s: &(&str, &str, &str)) -> Value {
    let (kind, name, ns) = s;
    match *kind {
        "ServiceAccount" => json!({"kind": kind, "name": name, "namespace": ns}),
        _ => json!({"apiGroup": RBAC, "kind": kind, "name": name}),
    }
}
