//! RBAC escalation prevention (upstream's role and binding storage checks): a Role or
//! ClusterRole may be written only by a caller who holds every permission it grants or may
//! `escalate` it; a binding only by one who holds the bound role's permissions or may `bind`
//! it. `system:masters` and the server's own writes pass.

use serde_json::Value;

use super::rules::{Rule, uncovered};
use super::{Attributes, Authz, CALLER, MASTERS, UserInfo};
use crate::api::registry::Resource;
use crate::api::request::Caller;
use crate::api::status::ApiError;

const RBAC: &str = "rbac.authorization.k8s.io";

/// Checks the current request's write of the RBAC object `obj` (nothing for other resources).
pub(crate) fn check(authz: &Authz, res: &Resource, obj: &Value) -> Result<(), ApiError> {
    if res.group != RBAC {
        return Ok(());
    }
    let Ok(caller) = CALLER.try_with(Caller::clone) else {
        return Ok(());
    };
    if caller.groups.iter().any(|g| g == MASTERS) {
        return Ok(());
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let user = UserInfo::of(&caller);
    let may = |verb: &str, resource: &str, name: &str| {
        let a = Attributes {
            verb,
            api_group: RBAC,
            resource,
            name,
            namespace: ns,
            resource_request: true,
            ..Attributes::default()
        };
        authz.decide(&user, &a, "").is_ok()
    };
    let granted: Vec<Rule> = match res.plural {
        "roles" | "clusterroles" => {
            if may("escalate", res.plural, name) {
                return Ok(());
            }
            serde_json::from_value(obj["rules"].clone()).unwrap_or_default()
        }
        "rolebindings" | "clusterrolebindings" => {
            let role_kind = obj["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = obj["roleRef"]["name"].as_str().unwrap_or_default();
            let plural = if role_kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            if may("bind", plural, role_name) {
                return Ok(());
            }
            let role_ref = super::rbac::RoleRef {
                kind: role_kind.to_string(),
                name: role_name.to_string(),
            };
            authz
                .with_index(|ix| ix.rules_of(&role_ref, ns).map(<[Rule]>::to_vec))
                .unwrap_or_else(|| Err("authorizer unavailable".into()))
                .map_err(|e| forbid(res, name, &e.0))?
        }
        _ => return Ok(()),
    };
    let (held, errors) = authz
        .with_index(|ix| {
            let mut held: Vec<Rule> = Vec::new();
            let (_, errors) = ix.visit_rules(&user, ns, |r| {
                held.push(r.clone());
                false
            });
            (held, errors)
        })
        .unwrap_or_default();
    let missing = uncovered(&held, &granted);
    if missing.is_empty() {
        return Ok(());
    }
    let mut text = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        caller.user,
        go_strings(&caller.groups),
        describe(&missing)
    );
    if !errors.is_empty() {
        text.push_str(&format!("; resolution errors: [{}]", errors.join(" ")));
    }
    Err(forbid(res, name, &text))
}

fn forbid(res: &Resource, name: &str, why: &str) -> ApiError {
    ApiError {
        code: 403,
        reason: "Forbidden",
        message: format!("{}.{RBAC} {name:?} is forbidden: {why}", res.plural),
        details: Some(serde_json::json!({"name": name, "group": RBAC, "kind": res.plural})),
    }
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_strings(list: &[String]) -> String {
    let quoted: Vec<String> = list.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// Upstream's `rulesToString`: the missing rules with their verbs merged per resource, each as
/// `CompactString` prints it, sorted, one a line.
fn describe(missing: &[Rule]) -> String {
    let mut merged: Vec<Rule> = Vec::new();
    for r in missing {
        match merged.iter_mut().find(|m| {
            m.api_groups == r.api_groups
                && m.resources == r.resources
                && m.resource_names == r.resource_names
                && m.non_resource_urls == r.non_resource_urls
        }) {
            Some(m) => {
                for v in &r.verbs {
                    if !m.verbs.contains(v) {
                        m.verbs.push(v.clone());
                    }
                }
            }
            None => merged.push(r.clone()),
        }
    }
    let mut lines: Vec<String> = merged
        .iter()
        .map(|r| {
            let mut parts = Vec::new();
            if !r.api_groups.is_empty() {
                parts.push(format!("APIGroups:{}", go_strings(&r.api_groups)));
            }
            if !r.resources.is_empty() {
                parts.push(format!("Resources:{}", go_strings(&r.resources)));
            }
            if !r.non_resource_urls.is_empty() {
                parts.push(format!("NonResourceURLs:{}", go_strings(&r.non_resource_urls)));
            }
            if !r.resource_names.is_empty() {
                parts.push(format!("ResourceNames:{}", go_strings(&r.resource_names)));
            }
            if !r.verbs.is_empty() {
                parts.push(format!("Verbs:{}", go_strings(&r.verbs)));
            }
            format!("{{{}}}", parts.join(", "))
        })
        .collect();
    lines.sort();
    lines.dedup();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_rules_print_as_upstream() {
        let missing = vec![
            Rule::new(&["get"], &[""], &["secrets"]),
            Rule::new(&["list"], &[""], &["secrets"]),
            Rule::new(&["create"], &["apps"], &["deployments"]),
        ];
        assert_eq!(
            describe(&missing),
            "{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}\n{APIGroups:[\"apps\"], Resources:[\"deployments\"], Verbs:[\"create\"]}"
        );
    }
}
