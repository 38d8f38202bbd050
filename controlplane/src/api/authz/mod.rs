//! Authorization of every authenticated request: its attributes as upstream's `RequestInfo`
//! (verb, API group, resource, subresource, namespace, name, or a non-resource path), the
//! authorizer chain (`system:masters` always, then RBAC over an in-memory index, [`rbac`]), the
//! upstream 403 texts, the bootstrap policy ([`policy`]) and ClusterRole aggregation.

mod bootstrap;
pub(crate) mod escalation;
pub(crate) mod node;
pub(crate) use bootstrap::ObservedStore;
pub(crate) mod policy;
pub(crate) mod rbac;
pub(crate) mod reviews;
pub(crate) mod rules;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::Method;
use serde_json::json;
use tokio::sync::Notify;

use crate::api::request::{Caller, Query};
use crate::api::status::ApiError;
use crate::storage::{Event, EventKind, Store};

/// The group every authenticated caller is in.
pub(crate) const AUTHENTICATED: &str = "system:authenticated";
/// The group that passes every check.
pub(crate) const MASTERS: &str = "system:masters";

/// Who a decision is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UserInfo<'a> {
    pub name: &'a str,
    pub groups: &'a [String],
}

impl<'a> UserInfo<'a> {
    pub(crate) fn of(c: &'a Caller) -> Self {
        UserInfo {
            name: &c.user,
            groups: &c.groups,
        }
    }

    /// Group membership; every authenticated caller is in `system:authenticated`.
    pub(crate) fn in_group(&self, g: &str) -> bool {
        g == AUTHENTICATED || self.groups.iter().any(|x| x == g)
    }
}

/// What a request asks to do (upstream's `authorizer.Attributes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attributes<'a> {
    pub verb: &'a str,
    pub api_group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub resource_request: bool,
    /// The URL path (non-resource requests).
    pub path: &'a str,
}

/// Attributes of a request, owning their strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RequestInfo {
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub namespace: String,
    pub resource_request: bool,
    pub path: String,
}

/// Why a request is not allowed: the authorizers' reasons, as upstream appends them to the 403
/// message (empty when no authorizer had one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Denied(pub(crate) String);

impl From<String> for Denied {
    fn from(reason: String) -> Self {
        Self(reason)
    }
}

impl From<&str> for Denied {
    fn from(reason: &str) -> Self {
        Self(reason.to_string())
    }
}

impl RequestInfo {
    /// Upstream's `RequestInfoFactory`: `/api/v1/...` and `/apis/<g>/<v>/...` are resource
    /// requests (namespace, resource, name, subresource; GET of a collection is list or watch,
    /// DELETE of one is deletecollection; a list's `metadata.name` field selector names the
    /// object); anything else is a non-resource request whose verb is the method.
    pub(crate) fn of(method: &Method, path: &str, q: &Query) -> Self {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut info = RequestInfo {
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
            ..RequestInfo::default()
        };
        let (group, mut parts) = match segs.as_slice() {
            ["api", _, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", g, _, rest @ ..] if !rest.is_empty() => (*g, rest),
            _ => return info,
        };
        info.resource_request = true;
        info.api_group = group.to_string();
        info.verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "get",
        }
        .to_string();
        if parts[0] == "namespaces" && parts.len() > 1 {
            info.namespace = parts[1].to_string();
            if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
                parts = &parts[2..];
            }
        }
        info.resource = parts[0].to_string();
        if let Some(n) = parts.get(1) {
            info.name = n.to_string();
        }
        if parts.len() >= 3 {
            info.subresource = parts[2].to_string();
        }
        if info.name.is_empty() {
            if info.verb == "get" {
                info.verb = if q.flag("watch") { "watch" } else { "list" }.into();
                if let Some(n) = q.get("fieldSelector").and_then(|f| {
                    f.split(',').find_map(|t| {
                        t.strip_prefix("metadata.name=")
                            .or(t.strip_prefix("metadata.name=="))
                    })
                }) {
                    info.name = n.to_string();
                }
            } else if info.verb == "delete" {
                info.verb = "deletecollection".into();
            }
        }
        info
    }

    pub(crate) fn attributes(&self) -> Attributes<'_> {
        Attributes {
            verb: &self.verb,
            api_group: &self.api_group,
            resource: &self.resource,
            subresource: &self.subresource,
            name: &self.name,
            namespace: &self.namespace,
            resource_request: self.resource_request,
            path: &self.path,
        }
    }
}

/// The 403 of a denied request, worded as upstream's `responsewriters.Forbidden`.
pub(crate) fn forbidden(user: &str, a: &Attributes<'_>, reason: &str) -> ApiError {
    let tail = if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    };
    if !a.resource_request {
        return ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "forbidden: User {user:?} cannot {} path {:?}{tail}",
                a.verb, a.path
            ),
            details: None,
        };
    }
    let resource = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let what = if a.namespace.is_empty() {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.verb, a.api_group
        )
    } else {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            a.verb, a.api_group, a.namespace
        )
    };
    let qualified = if a.api_group.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}.{}", a.resource, a.api_group)
    };
    let message = if a.name.is_empty() {
        format!("{qualified} is forbidden: {what}{tail}")
    } else {
        format!("{qualified} {:?} is forbidden: {what}{tail}", a.name)
    };
    let mut details = json!({"group": a.api_group, "kind": a.resource});
    if !a.name.is_empty() {
        details["name"] = json!(a.name);
    }
    ApiError {
        code: 403,
        reason: "Forbidden",
        message,
        details: Some(details),
    }
}

tokio::task_local! {
    /// The caller of the request being handled (for admission that depends on who writes).
    pub(crate) static CALLER: Caller;
}

/// NodeRestriction for the current request's write of `res` (nothing unless a node writes).
pub(crate) fn node_restriction(
    res: &crate::api::registry::Resource,
    sub: Option<&str>,
    w: node::Write<'_>,
) -> Result<(), ApiError> {
    if !res.group.is_empty() && res.group != "coordination.k8s.io" {
        return Ok(());
    }
    CALLER
        .try_with(|c| match node::node_name(&c.user, &c.groups) {
            Some(n) => node::admit(n, res.plural, sub, w),
            None => Ok(()),
        })
        .unwrap_or(Ok(()))
}

/// The authorizer chain and the RBAC index behind it.
#[derive(Debug, Default)]
pub(crate) struct Authz {
    index: RwLock<rbac::Index>,
    /// Pods bound to nodes and what they reference (the Node authorizer's graph).
    graph: RwLock<node::Graph>,
    /// Woken when a ClusterRole changes (the aggregation controller waits on it).
    cluster_roles_changed: Notify,
}

impl Authz {
    /// The decision for `user` doing `a` (a list or watch narrowed by `field_selector`):
    /// allowed, or the reasons it is not. The chain: `system:masters`, the Node authorizer, RBAC.
    pub(crate) fn decide(
        &self,
        user: &UserInfo<'_>,
        a: &Attributes<'_>,
        field_selector: &str,
    ) -> Result<(), Denied> {
        if user.groups.iter().any(|g| g == MASTERS) {
            return Ok(());
        }
        let mut reasons = Vec::new();
        if let Some(node) = node::node_name(user.name, user.groups) {
            let decision = self
                .graph
                .read()
                .ok()
                .and_then(|g| node::authorize(&g, node, a, field_selector));
            match decision {
                Some(Ok(())) => return Ok(()),
                Some(Err(Denied(r))) => reasons.push(r),
                None => {}
            }
        }
        match self.index.read() {
            Ok(ix) => match ix.authorize(user, a) {
                Ok(()) => return Ok(()),
                Err(Denied(r)) if !r.is_empty() => reasons.push(r),
                Err(_) => {}
            },
            Err(_) => reasons.push("authorizer unavailable".into()),
        }
        Err(Denied(reasons.join("\n")))
    }

    /// [`Self::decide`] as the API answers it.
    pub(crate) fn authorize(
        &self,
        caller: &Caller,
        a: &Attributes<'_>,
        field_selector: &str,
    ) -> Result<(), ApiError> {
        self.decide(&UserInfo::of(caller), a, field_selector)
            .map_err(|Denied(reason)| forbidden(&caller.user, a, &reason))
    }

    /// Reads the index.
    pub(crate) fn with_index<T>(&self, f: impl FnOnce(&rbac::Index) -> T) -> Option<T> {
        self.index.read().ok().map(|ix| f(&ix))
    }

    /// Takes in one store change (writes of this server as they are made, and the watch).
    pub(crate) fn observe(&self, ev: &Event) {
        if !ev.kv.key.starts_with(rbac::PREFIX) {
            return;
        }
        let value = (ev.kind == EventKind::Put).then_some(&ev.kv.value[..]);
        let changed = match self.index.write() {
            Ok(mut ix) => ix.apply(&ev.kv.key, value, ev.kv.mod_revision),
            Err(_) => false,
        };
        if changed {
            self.cluster_roles_changed.notify_one();
        }
    }

    /// Takes in one pod or claim change of the store's watch (the node graph's ordered
    /// sources: a write is in the graph as soon as the watch delivers it).
    fn observe_graph(&self, ev: &Event) {
        let value = (ev.kind == EventKind::Put).then_some(&ev.kv.value[..]);
        if let Ok(mut g) = self.graph.write() {
            g.apply(&ev.kv.key, value);
        }
    }

    /// Loads every object under `prefix` (RBAC objects, or pods or claims for the node graph)
    /// from `store`; returns the revision read at.
    pub(crate) async fn load(&self, store: &dyn Store, prefix: &str) -> crate::storage::Result<i64> {
        if node::GRAPH_PREFIXES.contains(&prefix) {
            // A page at a time at one revision: a large cluster's pods are not all held at once.
            let mut page = store.list(prefix, None, 1000).await?;
            let rev = page.revision;
            if let Ok(mut g) = self.graph.write() {
                g.clear(prefix);
            }
            loop {
                if let Ok(mut g) = self.graph.write() {
                    for kv in &page.items {
                        g.apply(&kv.key, Some(&kv.value));
                    }
                }
                let Some(last) = page.items.last().map(|kv| kv.key.clone()).filter(|_| page.more) else {
                    return Ok(rev);
                };
                page = store.list_at(prefix, Some(&last), 1000, rev).await?;
            }
        }
        let page = store.list(prefix, None, 0).await?;
        if let Ok(mut ix) = self.index.write() {
            *ix = rbac::Index::default();
            for kv in &page.items {
                ix.apply(&kv.key, Some(&kv.value), kv.mod_revision);
            }
        }
        self.cluster_roles_changed.notify_one();
        Ok(page.revision)
    }

    /// Keeps what was loaded from `prefix` current with the store's watch from `rev` (the
    /// writes of other API servers on a shared etcd); relists after a compaction or an error.
    pub(crate) async fn follow(self: Arc<Self>, store: Arc<dyn Store>, prefix: &'static str, mut rev: i64) {
        loop {
            match store.watch(prefix, rev).await {
                Ok(mut w) => loop {
                    match w.next().await {
                        Ok(ev) => {
                            rev = rev.max(ev.kv.mod_revision);
                            if node::GRAPH_PREFIXES.contains(&prefix) {
                                self.observe_graph(&ev);
                            } else {
                                self.observe(&ev);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, prefix, "authorization watch ended");
                            break;
                        }
                    }
                },
                Err(e) => tracing::debug!(error = %e, "RBAC watch failed"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.load(store.as_ref(), prefix).await {
                Ok(r) => rev = r,
                Err(e) => tracing::warn!(error = %e, "RBAC relist failed"),
            }
        }
    }

    /// Waits until a ClusterRole changed.
    pub(crate) async fn cluster_roles_changed(&self) {
        self.cluster_roles_changed.notified().await;
    }
}

/// The authorizer's in-process speed: decisions per second for a caller allowed through a
/// RoleBinding, with the bootstrap policy plus 10 Roles and 100 RoleBindings in its namespace
/// (the API benchmark's RBAC figure; the last binding is the caller's, so every decision scans
/// the cluster bindings and the namespace's).
pub fn decisions_per_second(iterations: usize) -> f64 {
    let authz = Authz::default();
    let mut rev = 0;
    let mut put = |key: String, v: serde_json::Value| {
        rev += 1;
        if let Ok(mut ix) = authz.index.write() {
            ix.apply(&key, Some(&serde_json::to_vec(&v).unwrap_or_default()), rev);
        }
    };
    for spec in policy::cluster_roles() {
        put(
            format!("{}clusterroles/{}", rbac::PREFIX, spec.name),
            policy::cluster_role_object(&spec),
        );
    }
    for spec in policy::cluster_role_bindings() {
        put(
            format!("{}clusterrolebindings/{}", rbac::PREFIX, spec.0),
            policy::cluster_role_binding_object(&spec),
        );
    }
    for i in 0..10 {
        put(
            format!("{}roles/bench/role-{i}", rbac::PREFIX),
            json!({"rules": [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["create", "get"]}]}),
        );
    }
    for i in 0..100 {
        put(
            format!("{}rolebindings/bench/binding-{i}", rbac::PREFIX),
            json!({"subjects": [{"kind": "User", "name": format!("user-{i}")}],
                   "roleRef": {"kind": "Role", "name": format!("role-{}", i % 10)}}),
        );
    }
    let groups = vec![AUTHENTICATED.to_string()];
    let user = UserInfo {
        name: "user-99",
        groups: &groups,
    };
    let a = Attributes {
        verb: "create",
        resource: "pods",
        namespace: "bench",
        resource_request: true,
        ..Attributes::default()
    };
    let started = std::time::Instant::now();
    let mut allowed = 0usize;
    for _ in 0..iterations {
        allowed += usize::from(authz.decide(&user, &a, "").is_ok());
    }
    let secs = started.elapsed().as_secs_f64();
    if allowed != iterations {
        return 0.0;
    }
    iterations as f64 / secs.max(f64::EPSILON)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str, query: Option<&str>) -> RequestInfo {
        RequestInfo::of(&method, path, &Query::parse(query))
    }

    #[test]
    fn request_info_as_upstream() {
        let i = info(Method::GET, "/api/v1/namespaces/default/pods", Some("watch=true"));
        assert_eq!(
            (i.verb.as_str(), i.resource.as_str(), i.namespace.as_str()),
            ("watch", "pods", "default")
        );
        let i = info(
            Method::GET,
            "/api/v1/namespaces/default/pods",
            Some("fieldSelector=metadata.name%3Dweb"),
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("list", "web"));
        let i = info(Method::DELETE, "/apis/apps/v1/namespaces/ns/deployments", None);
        assert_eq!(
            (i.verb.as_str(), i.api_group.as_str()),
            ("deletecollection", "apps")
        );
        let i = info(Method::GET, "/api/v1/namespaces/kube-system", None);
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.namespace.as_str()),
            ("namespaces", "kube-system", "kube-system")
        );
        let i = info(Method::PUT, "/api/v1/namespaces/gone/finalize", None);
        assert_eq!(
            (i.resource.as_str(), i.subresource.as_str()),
            ("namespaces", "finalize")
        );
        let i = info(Method::POST, "/api/v1/namespaces/d/pods/web/exec", None);
        assert_eq!(
            (i.verb.as_str(), i.subresource.as_str(), i.name.as_str()),
            ("create", "exec", "web")
        );
        let i = info(Method::GET, "/apis/apps/v1", None);
        assert!(!i.resource_request);
        assert_eq!((i.verb.as_str(), i.path.as_str()), ("get", "/apis/apps/v1"));
        let i = info(Method::GET, "/api/v1/nodes/n1/status", None);
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.subresource.as_str()),
            ("nodes", "n1", "status")
        );
    }

    #[test]
    fn forbidden_texts() {
        let i = info(Method::GET, "/api/v1/namespaces/default/pods", None);
        assert_eq!(
            forbidden("system:serviceaccount:default:robot", &i.attributes(), "").message,
            "pods is forbidden: User \"system:serviceaccount:default:robot\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let i = info(Method::GET, "/apis/apps/v1/deployments", None);
        assert_eq!(
            forbidden("bob", &i.attributes(), "").message,
            "deployments.apps is forbidden: User \"bob\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
        );
        let i = info(Method::GET, "/api/v1/namespaces/kube-system/secrets/token", None);
        assert_eq!(
            forbidden("bob", &i.attributes(), "RBAC: [x]").message,
            "secrets \"token\" is forbidden: User \"bob\" cannot get resource \"secrets\" in API group \"\" in the namespace \"kube-system\": RBAC: [x]"
        );
        let i = info(Method::GET, "/metrics", None);
        assert_eq!(
            forbidden("bob", &i.attributes(), "").message,
            "forbidden: User \"bob\" cannot get path \"/metrics\""
        );
    }
}
