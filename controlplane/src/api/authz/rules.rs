//! RBAC policy rules: what one rule allows (upstream's `RuleAllows`: verbs, API groups, resources
//! with `*/subresource`, resource names, non-resource URLs with a trailing `*`), and whether a set
//! of rules covers another (upstream's `Covers`, for escalation checks and reconciliation).

use serde::{Deserialize, Serialize};

use super::Attributes;

/// One `PolicyRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(default, rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

fn has(list: &[String], x: &str) -> bool {
    list.iter().any(|v| v == x)
}

fn has_all(list: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| has(list, w))
}

impl Rule {
    /// A rule from static lists (the bootstrap policy).
    pub(crate) fn new(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Self {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        Rule {
            verbs: own(verbs),
            api_groups: own(groups),
            resources: own(resources),
            ..Rule::default()
        }
    }

    /// A non-resource rule.
    pub(crate) fn urls(verbs: &[&str], urls: &[&str]) -> Self {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        Rule {
            verbs: own(verbs),
            non_resource_urls: own(urls),
            ..Rule::default()
        }
    }

    /// The same rule limited to `names`.
    #[must_use]
    pub(crate) fn names(mut self, names: &[&str]) -> Self {
        self.resource_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == "*" || v == verb)
    }

    /// Whether the rule allows the request `a`.
    pub(crate) fn allows(&self, a: &Attributes<'_>) -> bool {
        if !self.verb_matches(a.verb) {
            return false;
        }
        if !a.resource_request {
            return self.non_resource_urls.iter().any(|u| url_matches(u, a.path));
        }
        self.api_groups.iter().any(|g| g == "*" || g == a.api_group)
            && self
                .resources
                .iter()
                .any(|r| resource_matches(r, a.resource, a.subresource))
            && (self.resource_names.is_empty() || (!a.name.is_empty() && has(&self.resource_names, a.name)))
    }

    /// Whether `self` allows everything `requested` allows (upstream's `ruleCovers`, applied to
    /// one broken-down rule).
    fn covers(&self, requested: &Rule) -> bool {
        let verbs = has(&self.verbs, "*") || has_all(&self.verbs, &requested.verbs);
        let groups = has(&self.api_groups, "*") || has_all(&self.api_groups, &requested.api_groups);
        let resources = has(&self.resources, "*")
            || requested.resources.iter().all(|r| {
                has(&self.resources, r)
                    || r.split_once('/')
                        .is_some_and(|(_, sub)| has(&self.resources, &format!("*/{sub}")))
            });
        let urls = requested
            .non_resource_urls
            .iter()
            .all(|u| self.non_resource_urls.iter().any(|o| url_matches(o, u)));
        let names = self.resource_names.is_empty()
            || (!requested.resource_names.is_empty()
                && has_all(&self.resource_names, &requested.resource_names));
        verbs && groups && resources && urls && names
    }

    /// One rule per (group, resource, verb, name) or (url, verb) (upstream's `BreakdownRule`).
    fn breakdown(&self) -> Vec<Rule> {
        let mut out = Vec::new();
        let one = |s: &String| vec![s.clone()];
        for g in &self.api_groups {
            for r in &self.resources {
                for v in &self.verbs {
                    if self.resource_names.is_empty() {
                        out.push(Rule {
                            verbs: one(v),
                            api_groups: one(g),
                            resources: one(r),
                            ..Rule::default()
                        });
                    }
                    for n in &self.resource_names {
                        out.push(Rule {
                            verbs: one(v),
                            api_groups: one(g),
                            resources: one(r),
                            resource_names: one(n),
                            ..Rule::default()
                        });
                    }
                }
            }
        }
        for u in &self.non_resource_urls {
            for v in &self.verbs {
                out.push(Rule {
                    verbs: one(v),
                    non_resource_urls: one(u),
                    ..Rule::default()
                });
            }
        }
        out
    }
}

/// `pods`, `pods/log`, `*`, `*/scale` against a request's resource and subresource.
fn resource_matches(rule: &str, resource: &str, sub: &str) -> bool {
    if rule == "*" {
        return true;
    }
    if sub.is_empty() {
        return rule == resource;
    }
    match rule.split_once('/') {
        Some((r, s)) => s == sub && (r == resource || r == "*"),
        None => false,
    }
}

/// A non-resource URL rule: exact, `*`, or a prefix ending in `*`.
fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// The broken-down rules of `requested` that `owner` does not cover (empty: covered).
pub(crate) fn uncovered(owner: &[Rule], requested: &[Rule]) -> Vec<Rule> {
    requested
        .iter()
        .flat_map(Rule::breakdown)
        .filter(|r| !owner.iter().any(|o| o.covers(r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(verb: &'a str, group: &'a str, res: &'a str, sub: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            api_group: group,
            resource: res,
            subresource: sub,
            name,
            namespace: "default",
            resource_request: true,
            path: "",
        }
    }

    #[test]
    fn rule_matching_table() {
        let pods_read = Rule::new(&["get", "list", "watch"], &[""], &["pods"]);
        let all = Rule::new(&["*"], &["*"], &["*"]);
        let scale = Rule::new(&["get"], &["*"], &["*/scale"]);
        let named = Rule::new(&["get"], &[""], &["configmaps"]).names(&["flags"]);
        let logs = Rule::new(&["get"], &[""], &["pods/log"]);
        let cases = [
            (&pods_read, attrs("get", "", "pods", "", "x"), true),
            (&pods_read, attrs("list", "", "pods", "", ""), true),
            (&pods_read, attrs("delete", "", "pods", "", "x"), false),
            (&pods_read, attrs("get", "apps", "pods", "", "x"), false),
            (&pods_read, attrs("get", "", "pods", "log", "x"), false),
            (&logs, attrs("get", "", "pods", "log", "x"), true),
            (&logs, attrs("get", "", "pods", "", "x"), false),
            (
                &all,
                attrs("escalate", "rbac.authorization.k8s.io", "roles", "", ""),
                true,
            ),
            (&all, attrs("get", "", "pods", "exec", "x"), true),
            (&scale, attrs("get", "apps", "deployments", "scale", "d"), true),
            (&scale, attrs("get", "apps", "deployments", "", "d"), false),
            (&named, attrs("get", "", "configmaps", "", "flags"), true),
            (&named, attrs("get", "", "configmaps", "", "other"), false),
            (&named, attrs("get", "", "configmaps", "", ""), false),
        ];
        for (i, (rule, a, want)) in cases.iter().enumerate() {
            assert_eq!(rule.allows(a), *want, "case {i}: {rule:?} {a:?}");
        }
        let urls = Rule::urls(&["get"], &["/healthz", "/apis/*"]);
        let path = |p: &'static str| Attributes {
            verb: "get",
            path: p,
            resource_request: false,
            ..attrs("", "", "", "", "")
        };
        assert!(urls.allows(&path("/healthz")));
        assert!(urls.allows(&path("/apis/apps/v1")));
        assert!(!urls.allows(&path("/api/v1")));
        assert!(!urls.allows(&Attributes {
            verb: "post",
            ..path("/healthz")
        }));
    }

    #[test]
    fn coverage_breaks_rules_down() {
        let owner = vec![
            Rule::new(&["get", "list"], &[""], &["pods", "services"]),
            Rule::new(&["*"], &["apps"], &["deployments"]),
            Rule::new(&["get"], &["*"], &["*/scale"]),
            Rule::urls(&["get"], &["/apis/*"]),
        ];
        assert!(uncovered(&owner, &[Rule::new(&["get"], &[""], &["pods"])]).is_empty());
        assert!(uncovered(&owner, &[Rule::new(&["get"], &[""], &["pods"]).names(&["a"])]).is_empty());
        assert!(
            uncovered(
                &owner,
                &[Rule::new(&["create", "delete"], &["apps"], &["deployments"])]
            )
            .is_empty()
        );
        assert!(uncovered(&owner, &[Rule::new(&["get"], &["apps"], &["deployments/scale"])]).is_empty());
        assert!(uncovered(&owner, &[Rule::urls(&["get"], &["/apis/apps"])]).is_empty());
        let missing = uncovered(&owner, &[Rule::new(&["get", "delete"], &[""], &["pods"])]);
        assert_eq!(missing, vec![Rule::new(&["delete"], &[""], &["pods"])]);
        assert_eq!(
            uncovered(&owner, &[Rule::new(&["get"], &[""], &["secrets"])]).len(),
            1
        );
        let named_owner = vec![Rule::new(&["get"], &[""], &["configmaps"]).names(&["a"])];
        assert_eq!(
            uncovered(&named_owner, &[Rule::new(&["get"], &[""], &["configmaps"])]).len(),
            1
        );
    }
}
