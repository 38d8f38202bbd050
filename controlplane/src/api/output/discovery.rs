//! Discovery documents: aggregated (apidiscovery.k8s.io/v2) and legacy, and `/version`.

use serde_json::{Value, json};

use crate::api::registry::{self, Resource};

/// The Kubernetes version the server reports (kubectl's dispatcher picks the matching client).
pub const KUBE_MAJOR: &str = "1";
pub const KUBE_MINOR: &str = "32";

/// Content type of aggregated discovery responses.
pub const AGGREGATED_CT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// `GET /version`.
pub fn version() -> Value {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    json!({
        "major": KUBE_MAJOR, "minor": KUBE_MINOR,
        "gitVersion": format!("v{KUBE_MAJOR}.{KUBE_MINOR}.0-nodeos.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust", "compiler": "rustc", "platform": format!("linux/{arch}"),
    })
}

fn resource_entry(r: &Resource) -> Value {
    let subs: Vec<Value> = r
        .subresources
        .iter()
        .map(|s| {
            json!({
                "subresource": s.name,
                "responseKind": { "group": s.group, "version": s.version, "kind": s.kind },
                "verbs": s.verbs,
            })
        })
        .collect();
    let mut e = json!({
        "resource": r.plural,
        "responseKind": { "group": r.group, "version": r.version, "kind": r.kind },
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": r.verbs,
    });
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        e["categories"] = json!(r.categories);
    }
    if !subs.is_empty() {
        e["subresources"] = json!(subs);
    }
    e
}

/// A group in aggregated discovery with every version it is served in, the preferred first.
fn group_entry(group: &str) -> Value {
    let versions: Vec<Value> = registry::versions_of(group)
        .into_iter()
        .map(|version| {
            let resources: Vec<Value> = registry::served()
                .filter(|r| r.group == group && r.version == version)
                .map(resource_entry)
                .collect();
            json!({ "version": version, "resources": resources, "freshness": "Current" })
        })
        .collect();
    let mut meta = json!({ "creationTimestamp": null });
    if !group.is_empty() {
        meta["name"] = json!(group);
    }
    json!({ "metadata": meta, "versions": versions })
}

/// Aggregated `/api` (core only) or `/apis` (every named group).
pub fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![group_entry("")]
    } else {
        registry::groups()
            .into_iter()
            .map(|(g, _)| group_entry(g))
            .collect()
    };
    json!({ "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items })
}

/// Legacy `/api`.
pub fn legacy_api() -> Value {
    json!({ "kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [] })
}

/// Legacy `/apis`.
pub fn legacy_apis() -> Value {
    let groups: Vec<Value> = registry::groups()
        .into_iter()
        .map(|(g, preferred)| {
            let gv = |v: &str| json!({ "groupVersion": format!("{g}/{v}"), "version": v });
            let versions: Vec<Value> = registry::versions_of(g).into_iter().map(gv).collect();
            json!({ "name": g, "versions": versions, "preferredVersion": gv(preferred) })
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// Legacy `/api/v1` or `/apis/<group>/<version>`; None for an unknown group/version.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for r in registry::served().filter(|r| r.group == group && r.version == version) {
        let mut e = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind, "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        list.push(e);
        for s in r.subresources {
            let mut e = json!({
                "name": format!("{}/{}", r.plural, s.name), "singularName": "", "namespaced": r.namespaced,
                "kind": s.kind, "verbs": s.verbs,
            });
            if s.group != r.group || s.version != r.version {
                e["group"] = json!(s.group);
                e["version"] = json!(s.version);
            }
            list.push(e);
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregated_core_lists_pods_with_subresources() {
        let d = aggregated(true);
        let res = &d["items"][0]["versions"][0]["resources"];
        let pods = res
            .as_array()
            .and_then(|a| a.iter().find(|r| r["resource"] == "pods"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert!(pods["subresources"].as_array().is_some_and(|s| {
            s.iter()
                .any(|x| x["subresource"] == "eviction" && x["responseKind"]["group"] == "policy")
        }));
        assert!(d["items"][0]["metadata"].get("name").is_none());
    }

    #[test]
    fn legacy_lists_subresources_with_their_group() {
        let l = resource_list("apps", "v1").unwrap_or_default();
        let scale = l["resources"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["name"] == "deployments/scale"))
            .cloned();
        assert_eq!(scale.map(|s| s["group"].clone()), Some(json!("autoscaling")));
        assert!(resource_list("nope", "v1").is_none());
    }

    #[test]
    fn metrics_group_is_discovered_read_only() {
        let groups = legacy_apis();
        let metrics = groups["groups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["name"] == "metrics.k8s.io"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            metrics["preferredVersion"],
            json!({"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"})
        );
        let d = aggregated(false);
        let entry = d["items"]
            .as_array()
            .and_then(|i| i.iter().find(|g| g["metadata"]["name"] == "metrics.k8s.io"))
            .cloned()
            .unwrap_or_default();
        let res = &entry["versions"][0]["resources"];
        assert_eq!(entry["versions"][0]["version"], "v1beta1");
        assert_eq!(res[0]["resource"], "nodes");
        assert_eq!(res[0]["responseKind"]["kind"], "NodeMetrics");
        assert_eq!(res[0]["scope"], "Cluster");
        assert_eq!(res[1]["resource"], "pods");
        assert_eq!(res[1]["responseKind"]["kind"], "PodMetrics");
        assert_eq!(res[1]["scope"], "Namespaced");
        assert_eq!(res[1]["verbs"], json!(["get", "list"]));
        let list = resource_list("metrics.k8s.io", "v1beta1").unwrap_or_default();
        assert_eq!(list["resources"].as_array().map(Vec::len), Some(2));
    }
}
