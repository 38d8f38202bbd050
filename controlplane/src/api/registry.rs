//! The resources the API server serves: group, version, plural, kind, scope, short names,
//! categories and subresources. Discovery, routing and storage keys all come from this table.

/// One served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for core).
    pub group: &'static str,
    pub version: &'static str,
    /// Plural, lower-case (the URL segment).
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources: (name, response group, response version, response kind, verbs).
    pub subresources: &'static [Subresource],
    /// The verbs the resource serves ([`VERBS`], or [`READ_ONLY`]).
    pub verbs: &'static [&'static str],
}

/// The verbs of a stored resource.
pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The verbs of a computed, read-only resource (componentstatuses, `metrics.k8s.io`).
pub const READ_ONLY: &[&str] = &["get", "list"];

/// The verbs of a review: answered, never stored (`authorization.k8s.io` access reviews,
/// `authentication.k8s.io` SelfSubjectReview; see `api::authz::reviews`).
pub const CREATE_ONLY: &[&str] = &["create"];

/// A subresource as discovery shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subresource {
    pub name: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

impl Resource {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, the way kubectl names a resource in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Store key prefix for the resource (all namespaces).
    pub fn key_prefix(&self) -> String {
        let g = if self.group.is_empty() { "core" } else { self.group };
        format!("/registry/{g}/{}/", self.plural)
    }

    /// Store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/{name}", self.key_prefix()),
            _ => format!("{}{name}", self.key_prefix()),
        }
    }

    /// Store key prefix of one namespace's objects.
    pub fn namespace_prefix(&self, namespace: &str) -> String {
        format!("{}{namespace}/", self.key_prefix())
    }

    pub fn has_subresource(&self, name: &str) -> bool {
        self.subresources.iter().any(|s| s.name == name)
    }

    /// Whether the resource has a Kubernetes OpenAPI schema (the `metrics.k8s.io` kinds, served
    /// by metrics-server upstream, have none in k8s-openapi).
    pub fn has_schema(&self) -> bool {
        self.group != "metrics.k8s.io"
    }

    /// Whether the resource is a review, answered on create and never stored ([`CREATE_ONLY`]).
    pub fn is_create_only(&self) -> bool {
        self.verbs == CREATE_ONLY
    }

    /// Whether the resource is computed rather than stored (only read: [`READ_ONLY`]).
    pub fn is_read_only(&self) -> bool {
        self.verbs == READ_ONLY
    }
}

const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

const fn status(group: &'static str, version: &'static str, kind: &'static str) -> Subresource {
    Subresource {
        name: "status",
        group,
        version,
        kind,
        verbs: STATUS_VERBS,
    }
}

const fn scale() -> Subresource {
    Subresource {
        name: "scale",
        group: "autoscaling",
        version: "v1",
        kind: "Scale",
        verbs: STATUS_VERBS,
    }
}

/// A review resource ([`CREATE_ONLY`]).
const fn review(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Resource {
    Resource {
        group,
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        verbs: CREATE_ONLY,
    }
}

macro_rules! res {
    ($g:expr, $v:expr, $plural:expr, $singular:expr, $kind:expr, $ns:expr, $short:expr, $cat:expr, $sub:expr) => {
        Resource {
            group: $g,
            version: $v,
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $ns,
            short_names: $short,
            categories: $cat,
            subresources: $sub,
            verbs: VERBS,
        }
    };
}

const ALL: &[&str] = &["all"];
const NONE: &[&str] = &[];

/// Every served resource, in discovery order.
pub static RESOURCES: &[Resource] = &[
    res!(
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        true,
        &["po"],
        ALL,
        &[
            status("", "v1", "Pod"),
            Subresource {
                name: "binding",
                group: "",
                version: "v1",
                kind: "Binding",
                verbs: &["create"]
            },
            Subresource {
                name: "eviction",
                group: "policy",
                version: "v1",
                kind: "Eviction",
                verbs: &["create"]
            },
            Subresource {
                name: "log",
                group: "",
                version: "v1",
                kind: "Pod",
                verbs: &["get"]
            },
            Subresource {
                name: "exec",
                group: "",
                version: "v1",
                kind: "PodExecOptions",
                verbs: &["create", "get"]
            },
            Subresource {
                name: "attach",
                group: "",
                version: "v1",
                kind: "PodAttachOptions",
                verbs: &["create", "get"]
            },
            Subresource {
                name: "portforward",
                group: "",
                version: "v1",
                kind: "PodPortForwardOptions",
                verbs: &["create", "get"]
            },
            Subresource {
                name: "ephemeralcontainers",
                group: "",
                version: "v1",
                kind: "Pod",
                verbs: STATUS_VERBS
            },
        ]
    ),
    res!(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        NONE,
        &[status("", "v1", "Namespace")]
    ),
    res!(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        NONE,
        &[status("", "v1", "Node")]
    ),
    res!(
        "",
        "v1",
        "services",
        "service",
        "Service",
        true,
        &["svc"],
        ALL,
        &[status("", "v1", "Service")]
    ),
    res!(
        "",
        "v1",
        "endpoints",
        "endpoints",
        "Endpoints",
        true,
        &["ep"],
        NONE,
        &[]
    ),
    res!(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        NONE,
        &[]
    ),
    res!("", "v1", "secrets", "secret", "Secret", true, NONE, NONE, &[]),
    res!(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        NONE,
        &[Subresource {
            name: "token",
            group: "authentication.k8s.io",
            version: "v1",
            kind: "TokenRequest",
            verbs: &["create"]
        }]
    ),
    res!("", "v1", "events", "event", "Event", true, &["ev"], NONE, &[]),
    res!(
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        NONE,
        &[status("", "v1", "PersistentVolumeClaim")]
    ),
    res!(
        "",
        "v1",
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
        &["quota"],
        NONE,
        &[status("", "v1", "ResourceQuota")]
    ),
    res!(
        "",
        "v1",
        "limitranges",
        "limitrange",
        "LimitRange",
        true,
        &["limits"],
        NONE,
        &[]
    ),
    res!(
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        NONE,
        &[status("", "v1", "PersistentVolume")]
    ),
    res!(
        "",
        "v1",
        "replicationcontrollers",
        "replicationcontroller",
        "ReplicationController",
        true,
        &["rc"],
        ALL,
        &[status("", "v1", "ReplicationController"), scale()]
    ),
    res!(
        "",
        "v1",
        "podtemplates",
        "podtemplate",
        "PodTemplate",
        true,
        NONE,
        NONE,
        &[]
    ),
    // Computed from the server's own health checks; upstream deprecates it since 1.19 but its
    // controller manager and kubectl still read it.
    Resource {
        group: "",
        version: "v1",
        plural: "componentstatuses",
        singular: "componentstatus",
        kind: "ComponentStatus",
        namespaced: false,
        short_names: &["cs"],
        categories: NONE,
        subresources: &[],
        verbs: READ_ONLY,
    },
    res!(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        ALL,
        &[status("apps", "v1", "Deployment"), scale()]
    ),
    res!(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["rs"],
        ALL,
        &[status("apps", "v1", "ReplicaSet"), scale()]
    ),
    res!(
        "apps",
        "v1",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
        &["sts"],
        ALL,
        &[status("apps", "v1", "StatefulSet"), scale()]
    ),
    res!(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        ALL,
        &[status("apps", "v1", "DaemonSet")]
    ),
    res!(
        "apps",
        "v1",
        "controllerrevisions",
        "controllerrevision",
        "ControllerRevision",
        true,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "batch",
        "v1",
        "jobs",
        "job",
        "Job",
        true,
        NONE,
        ALL,
        &[status("batch", "v1", "Job")]
    ),
    res!(
        "batch",
        "v1",
        "cronjobs",
        "cronjob",
        "CronJob",
        true,
        &["cj"],
        ALL,
        &[status("batch", "v1", "CronJob")]
    ),
    res!(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        NONE,
        &[status("policy", "v1", "PodDisruptionBudget")]
    ),
    res!(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        NONE,
        &[]
    ),
    res!(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
        ALL,
        &[status("autoscaling", "v2", "HorizontalPodAutoscaler")]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "ingresses",
        "ingress",
        "Ingress",
        true,
        &["ing"],
        NONE,
        &[status("networking.k8s.io", "v1", "Ingress")]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "ingressclasses",
        "ingressclass",
        "IngressClass",
        false,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        true,
        &["netpol"],
        NONE,
        &[]
    ),
    res!(
        "node.k8s.io",
        "v1",
        "runtimeclasses",
        "runtimeclass",
        "RuntimeClass",
        false,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        false,
        &["pc"],
        NONE,
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        NONE,
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "csidrivers",
        "csidriver",
        "CSIDriver",
        false,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "csinodes",
        "csinode",
        "CSINode",
        false,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "csistoragecapacities",
        "csistoragecapacity",
        "CSIStorageCapacity",
        true,
        NONE,
        NONE,
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        NONE,
        NONE,
        &[status("storage.k8s.io", "v1", "VolumeAttachment")]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
        false,
        NONE,
        &["api-extensions"],
        &[]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        "ValidatingWebhookConfiguration",
        false,
        NONE,
        &["api-extensions"],
        &[]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        false,
        NONE,
        &["api-extensions"],
        &[status(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy"
        )]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        "ValidatingAdmissionPolicyBinding",
        false,
        NONE,
        &["api-extensions"],
        &[]
    ),
    res!(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "certificatesigningrequest",
        "CertificateSigningRequest",
        false,
        &["csr"],
        NONE,
        &[
            status("certificates.k8s.io", "v1", "CertificateSigningRequest"),
            Subresource {
                name: "approval",
                group: "certificates.k8s.io",
                version: "v1",
                kind: "CertificateSigningRequest",
                verbs: STATUS_VERBS
            }
        ]
    ),
    review(
        "authentication.k8s.io",
        "selfsubjectreviews",
        "selfsubjectreview",
        "SelfSubjectReview",
        false,
    ),
    review(
        "authentication.k8s.io",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
        false,
    ),
    review(
        "authorization.k8s.io",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        "LocalSubjectAccessReview",
        true,
    ),
    review(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        false,
    ),
    review(
        "authorization.k8s.io",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        "SelfSubjectRulesReview",
        false,
    ),
    review(
        "authorization.k8s.io",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
        false,
    ),
    // metrics.k8s.io (computed from what nodes report; see `api::metrics`). metrics-server
    // gives them no singular name.
    Resource {
        group: "metrics.k8s.io",
        version: "v1beta1",
        plural: "nodes",
        singular: "",
        kind: "NodeMetrics",
        namespaced: false,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        verbs: READ_ONLY,
    },
    Resource {
        group: "metrics.k8s.io",
        version: "v1beta1",
        plural: "pods",
        singular: "",
        kind: "PodMetrics",
        namespaced: true,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        verbs: READ_ONLY,
    },
];

/// Resources also served in an older version: stored and handled in the preferred version (their
/// entry in [`RESOURCES`]), converted at the edge (`api/versions.rs`).
pub static OLDER_VERSIONS: &[Resource] = &[res!(
    "autoscaling",
    "v1",
    "horizontalpodautoscalers",
    "horizontalpodautoscaler",
    "HorizontalPodAutoscaler",
    true,
    &["hpa"],
    ALL,
    &[status("autoscaling", "v1", "HorizontalPodAutoscaler")]
)];

/// Every served resource in every served version (discovery and OpenAPI).
pub fn served() -> impl Iterator<Item = &'static Resource> {
    RESOURCES.iter().chain(OLDER_VERSIONS)
}

/// The versions `group` is served in, the preferred first.
pub fn versions_of(group: &str) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in served().filter(|r| r.group == group) {
        if !out.contains(&r.version) {
            out.push(r.version);
        }
    }
    out
}

/// Finds a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a resource by apiVersion and kind (for request bodies).
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// The groups in discovery order with their (single) version.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_keys() {
        let pods = find("", "v1", "pods").expect("pods");
        assert_eq!(
            pods.key(Some("default"), "web"),
            "/registry/core/pods/default/web"
        );
        let ns = find("", "v1", "namespaces").expect("namespaces");
        assert_eq!(
            ns.key(Some("ignored"), "default"),
            "/registry/core/namespaces/default"
        );
        let d = find_kind("apps/v1", "Deployment").expect("deployments");
        assert_eq!(d.qualified(), "deployments.apps");
        assert!(d.has_subresource("scale"));
        assert!(groups().contains(&("apps", "v1")));
    }

    #[test]
    fn plural_and_group_are_unique() {
        for (i, a) in RESOURCES.iter().enumerate() {
            for b in &RESOURCES[i + 1..] {
                assert!(
                    !(a.group == b.group && a.plural == b.plural),
                    "{} listed twice",
                    a.qualified()
                );
            }
        }
    }
}
