//! The RBAC authorizer over an in-memory index of Roles, ClusterRoles and their bindings, kept
//! current from the store (every write of this server as it is made, and a watch for the writes
//! of others), so a decision reads no store. Semantics as upstream's `RBACAuthorizer`: cluster
//! role bindings first, then the role bindings of the request's namespace; rules only allow; a
//! binding to a missing role is reported in the denial reason.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::Denied;
use super::rules::Rule;
use super::{Attributes, UserInfo};

/// The store prefix of every RBAC object.
pub(crate) const PREFIX: &str = "/registry/rbac.authorization.k8s.io/";

/// A `Subject` of a binding.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub(crate) struct Subject {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

/// A binding's `roleRef`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct RoleRef {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BindingObject {
    #[serde(default)]
    subjects: Vec<Subject>,
    #[serde(default)]
    role_ref: RoleRef,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RoleObject {
    #[serde(default)]
    rules: Option<Vec<Rule>>,
}

/// A RoleBinding or ClusterRoleBinding.
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub subjects: Vec<Subject>,
    pub role_ref: RoleRef,
}

impl Binding {
    /// Whether the binding (in namespace `ns`, "" for a cluster binding) names `user`.
    pub(crate) fn applies_to(&self, user: &UserInfo<'_>, ns: &str) -> bool {
        self.subjects.iter().any(|s| match s.kind.as_str() {
            "User" => s.name == user.name,
            "Group" => user.in_group(&s.name),
            "ServiceAccount" => {
                let sa_ns = if s.namespace.is_empty() { ns } else { &s.namespace };
                !sa_ns.is_empty()
                    && user
                        .name
                        .strip_prefix("system:serviceaccount:")
                        .and_then(|r| r.split_once(':'))
                        .is_some_and(|(n, name)| n == sa_ns && name == s.name)
            }
            _ => false,
        })
    }
}

/// A ClusterRole as the index keeps it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterRoleEntry {
    pub rules: Vec<Rule>,
    pub labels: Option<Value>,
    /// `aggregationRule.clusterRoleSelectors`, when the role aggregates.
    pub selectors: Option<Vec<Value>>,
}

/// Every RBAC object, decoded.
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub cluster_roles: HashMap<String, ClusterRoleEntry>,
    pub roles: HashMap<(String, String), Vec<Rule>>,
    pub cluster_bindings: HashMap<String, Binding>,
    pub bindings: HashMap<String, HashMap<String, Binding>>,
    /// The revision each key was last seen at (deletions included), so that the write-through
    /// path and the watch may deliver one change twice, in any order.
    revisions: HashMap<String, i64>,
}

/// Which RBAC object a store key names.
enum Key<'a> {
    ClusterRole(&'a str),
    Role(&'a str, &'a str),
    ClusterBinding(&'a str),
    Binding(&'a str, &'a str),
}

fn parse_key(key: &str) -> Option<Key<'_>> {
    let rest = key.strip_prefix(PREFIX)?;
    let (plural, rest) = rest.split_once('/')?;
    match plural {
        "clusterroles" => Some(Key::ClusterRole(rest)),
        "clusterrolebindings" => Some(Key::ClusterBinding(rest)),
        "roles" => rest.split_once('/').map(|(ns, n)| Key::Role(ns, n)),
        "rolebindings" => rest.split_once('/').map(|(ns, n)| Key::Binding(ns, n)),
        _ => None,
    }
}

impl Index {
    /// Applies one stored object (`value` None: deleted) at `rev`; returns whether a
    /// ClusterRole changed (aggregation may need to run).
    pub(crate) fn apply(&mut self, key: &str, value: Option<&[u8]>, rev: i64) -> bool {
        let Some(k) = parse_key(key) else {
            return false;
        };
        if self.revisions.get(key).is_some_and(|seen| *seen >= rev) {
            return false;
        }
        self.revisions.insert(key.to_string(), rev);
        let obj: Option<Value> = value.and_then(|v| serde_json::from_slice(v).ok());
        match k {
            Key::ClusterRole(name) => {
                match obj {
                    Some(o) => {
                        let rules = serde_json::from_value::<RoleObject>(o.clone())
                            .ok()
                            .and_then(|r| r.rules)
                            .unwrap_or_default();
                        let selectors = o["aggregationRule"]["clusterRoleSelectors"].as_array().cloned();
                        let labels = o["metadata"].get("labels").cloned();
                        self.cluster_roles.insert(
                            name.to_string(),
                            ClusterRoleEntry {
                                rules,
                                labels,
                                selectors,
                            },
                        );
                    }
                    None => {
                        self.cluster_roles.remove(name);
                    }
                }
                true
            }
            Key::Role(ns, name) => {
                let id = (ns.to_string(), name.to_string());
                match obj.and_then(|o| serde_json::from_value::<RoleObject>(o).ok()) {
                    Some(r) => {
                        self.roles.insert(id, r.rules.unwrap_or_default());
                    }
                    None => {
                        self.roles.remove(&id);
                    }
                }
                false
            }
            Key::ClusterBinding(name) => {
                match obj.and_then(|o| serde_json::from_value::<BindingObject>(o).ok()) {
                    Some(b) => {
                        self.cluster_bindings.insert(name.to_string(), binding(b));
                    }
                    None => {
                        self.cluster_bindings.remove(name);
                    }
                }
                false
            }
            Key::Binding(ns, name) => {
                match obj.and_then(|o| serde_json::from_value::<BindingObject>(o).ok()) {
                    Some(b) => {
                        self.bindings
                            .entry(ns.to_string())
                            .or_default()
                            .insert(name.to_string(), binding(b));
                    }
                    None => {
                        if let Some(m) = self.bindings.get_mut(ns) {
                            m.remove(name);
                        }
                    }
                }
                false
            }
        }
    }

    /// The rules a role reference grants in `ns` ("" for cluster bindings), or the reason it
    /// grants nothing.
    pub(crate) fn rules_of(&self, r: &RoleRef, ns: &str) -> Result<&[Rule], Denied> {
        match r.kind.as_str() {
            "ClusterRole" => self
                .cluster_roles
                .get(&r.name)
                .map(|c| c.rules.as_slice())
                .ok_or_else(|| {
                    Denied(format!(
                        "clusterrole.rbac.authorization.k8s.io \"{}\" not found",
                        r.name
                    ))
                }),
            "Role" if !ns.is_empty() => self
                .roles
                .get(&(ns.to_string(), r.name.clone()))
                .map(Vec::as_slice)
                .ok_or_else(|| Denied(format!("role.rbac.authorization.k8s.io \"{}\" not found", r.name))),
            _ => Err(Denied(format!(
                "unknown role reference {:?} {:?}",
                r.kind, r.name
            ))),
        }
    }

    /// Calls `visit` with every rule that applies to `user` in `ns` (cluster bindings first),
    /// until it returns true; returns whether one did, and the errors met on the way.
    pub(crate) fn visit_rules(
        &self,
        user: &UserInfo<'_>,
        ns: &str,
        mut visit: impl FnMut(&Rule) -> bool,
    ) -> (bool, Vec<String>) {
        let mut errors = Vec::new();
        let mut scan = |b: &Binding, bns: &str| -> bool {
            if !b.applies_to(user, bns) {
                return false;
            }
            match self.rules_of(&b.role_ref, bns) {
                Ok(rules) => rules.iter().any(&mut visit),
                Err(Denied(e)) => {
                    errors.push(e);
                    false
                }
            }
        };
        for b in self.cluster_bindings.values() {
            if scan(b, "") {
                return (true, errors);
            }
        }
        if !ns.is_empty()
            && let Some(bs) = self.bindings.get(ns)
        {
            for b in bs.values() {
                if scan(b, ns) {
                    return (true, errors);
                }
            }
        }
        (false, errors)
    }

    /// The RBAC decision for `a`: allowed, or the reason (possibly empty) it is not.
    pub(crate) fn authorize(&self, user: &UserInfo<'_>, a: &Attributes<'_>) -> Result<(), Denied> {
        let (allowed, mut errors) = self.visit_rules(user, a.namespace, |r| r.allows(a));
        if allowed {
            return Ok(());
        }
        errors.sort();
        errors.dedup();
        // Upstream prints one error as is and several as a bracketed list.
        Err(Denied(match errors.len() {
            0 => String::new(),
            1 => format!("RBAC: {}", errors[0]),
            _ => format!("RBAC: [{}]", errors.join(", ")),
        }))
    }
}

fn binding(b: BindingObject) -> Binding {
    Binding {
        subjects: b.subjects,
        role_ref: b.role_ref,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(ix: &mut Index, key: &str, v: Value, rev: i64) {
        ix.apply(key, Some(&serde_json::to_vec(&v).expect("json")), rev);
    }

    fn attrs<'a>(verb: &'a str, res: &'a str, ns: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            api_group: "",
            resource: res,
            subresource: "",
            name,
            namespace: ns,
            resource_request: true,
            path: "",
        }
    }

    #[test]
    fn bindings_grant_roles_by_subject() {
        let mut ix = Index::default();
        put(
            &mut ix,
            "/registry/rbac.authorization.k8s.io/roles/default/reader",
            json!({"rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["flags"]}]}),
            2,
        );
        put(
            &mut ix,
            "/registry/rbac.authorization.k8s.io/rolebindings/default/reader",
            json!({"subjects": [{"kind": "ServiceAccount", "name": "orders"}, {"kind": "Group", "name": "team"}],
                   "roleRef": {"kind": "Role", "name": "reader"}}),
            3,
        );
        put(
            &mut ix,
            "/registry/rbac.authorization.k8s.io/clusterrolebindings/ghost",
            json!({"subjects": [{"kind": "User", "name": "alice"}], "roleRef": {"kind": "ClusterRole", "name": "missing"}}),
            4,
        );
        let groups = vec!["system:serviceaccounts".to_string()];
        let sa = UserInfo {
            name: "system:serviceaccount:default:orders",
            groups: &groups,
        };
        assert!(
            ix.authorize(&sa, &attrs("get", "configmaps", "default", "flags"))
                .is_ok()
        );
        assert!(
            ix.authorize(&sa, &attrs("get", "configmaps", "default", "other"))
                .is_err()
        );
        assert!(
            ix.authorize(&sa, &attrs("get", "configmaps", "other", "flags"))
                .is_err()
        );
        let team = vec!["team".to_string()];
        let bob = UserInfo {
            name: "bob",
            groups: &team,
        };
        assert!(
            ix.authorize(&bob, &attrs("get", "configmaps", "default", "flags"))
                .is_ok()
        );
        let alice = UserInfo {
            name: "alice",
            groups: &[],
        };
        assert_eq!(
            ix.authorize(&alice, &attrs("get", "pods", "default", "x")),
            Err("RBAC: clusterrole.rbac.authorization.k8s.io \"missing\" not found".into())
        );
        // A stale event does not undo a newer one; a deletion removes the grant.
        put(
            &mut ix,
            "/registry/rbac.authorization.k8s.io/rolebindings/default/reader",
            json!({"subjects": [], "roleRef": {"kind": "Role", "name": "reader"}}),
            1,
        );
        assert!(
            ix.authorize(&bob, &attrs("get", "configmaps", "default", "flags"))
                .is_ok()
        );
        ix.apply(
            "/registry/rbac.authorization.k8s.io/rolebindings/default/reader",
            None,
            9,
        );
        assert!(
            ix.authorize(&bob, &attrs("get", "configmaps", "default", "flags"))
                .is_err()
        );
    }
}
