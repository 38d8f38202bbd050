//! The review APIs (created, answered, never stored): SelfSubjectAccessReview,
//! SubjectAccessReview and LocalSubjectAccessReview (`kubectl auth can-i`),
//! SelfSubjectRulesReview (`kubectl auth can-i --list`), SelfSubjectReview (`kubectl auth
//! whoami`); and impersonation (`Impersonate-User`, `-Group`, `-Uid`, `-Extra-*`), each
//! impersonated attribute authorized with the `impersonate` verb.

use http::HeaderMap;
use serde_json::{Value, json};

use super::rules::Rule;
use super::{Attributes, Authz, Denied, UserInfo, forbidden};
use crate::api::request::Caller;
use crate::api::status::ApiError;

/// A 422 about a review.
fn invalid(kind: &str, name: &str, field: &str, message: &str) -> ApiError {
    ApiError {
        code: 422,
        reason: "Invalid",
        message: format!("{kind}.authorization.k8s.io {name:?} is invalid: {field}: {message}"),
        details: None,
    }
}

/// Which review a path names: (plural, namespace of a local review). TokenReview is answered
/// by the API ([`crate::api::Api::token_review`]: it authenticates), the others by [`answer`].
pub(crate) fn review_of<'a>(segs: &[&'a str]) -> Option<(&'a str, Option<&'a str>)> {
    match segs {
        ["apis", "authorization.k8s.io", "v1", plural]
            if matches!(
                *plural,
                "selfsubjectaccessreviews" | "subjectaccessreviews" | "selfsubjectrulesreviews"
            ) =>
        {
            Some((plural, None))
        }
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "namespaces",
            ns,
            "localsubjectaccessreviews",
        ] => Some(("localsubjectaccessreviews", Some(ns))),
        [
            "apis",
            "authentication.k8s.io",
            "v1",
            plural @ ("selfsubjectreviews" | "tokenreviews"),
        ] => Some((plural, None)),
        _ => None,
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Answers the review `plural` posted by `caller`.
pub(crate) fn answer(
    authz: &Authz,
    caller: &Caller,
    plural: &str,
    local_ns: Option<&str>,
    mut body: Value,
) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the review must be a JSON object"));
    }
    let kind = match plural {
        "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
        "subjectaccessreviews" => "SubjectAccessReview",
        "localsubjectaccessreviews" => "LocalSubjectAccessReview",
        "selfsubjectrulesreviews" => "SelfSubjectRulesReview",
        _ => "SelfSubjectReview",
    };
    let group = if plural == "selfsubjectreviews" {
        "authentication.k8s.io"
    } else {
        "authorization.k8s.io"
    };
    body["apiVersion"] = json!(format!("{group}/v1"));
    body["kind"] = json!(kind);
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    body["metadata"]["creationTimestamp"] = Value::Null;
    let groups_with_authenticated = |c: &Caller| {
        let mut g = c.groups.clone();
        if !g.iter().any(|x| x == super::AUTHENTICATED) {
            g.push(super::AUTHENTICATED.into());
        }
        g
    };
    match plural {
        "selfsubjectreviews" => {
            body["status"] =
                json!({"userInfo": {"username": caller.user, "groups": groups_with_authenticated(caller)}});
        }
        "selfsubjectrulesreviews" => {
            let ns = body["spec"]["namespace"].as_str().unwrap_or_default().to_string();
            body["status"] = rules_review(authz, caller, &ns);
        }
        _ => {
            let subject = if plural == "selfsubjectaccessreviews" {
                caller.clone()
            } else {
                let user = body["spec"]["user"].as_str().unwrap_or_default().to_string();
                let groups = strings(&body["spec"]["groups"]);
                if user.is_empty() && groups.is_empty() {
                    return Err(invalid(
                        kind,
                        "",
                        "spec.user",
                        "Invalid value: \"\": at least one of user or group must be specified",
                    ));
                }
                Caller { user, groups }
            };
            let spec = &body["spec"];
            let ra = &spec["resourceAttributes"];
            let nra = &spec["nonResourceAttributes"];
            let get = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
            let (ns, verb, grp, res, sub, name, path) = if ra.is_object() {
                let ns = local_ns
                    .map(str::to_string)
                    .unwrap_or_else(|| get(ra, "namespace"));
                (
                    ns,
                    get(ra, "verb"),
                    get(ra, "group"),
                    get(ra, "resource"),
                    get(ra, "subresource"),
                    get(ra, "name"),
                    String::new(),
                )
            } else if nra.is_object() {
                (
                    String::new(),
                    get(nra, "verb"),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    get(nra, "path"),
                )
            } else {
                return Err(invalid(
                    kind,
                    "",
                    "spec.resourceAttributes",
                    "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
                ));
            };
            let a = Attributes {
                verb: &verb,
                api_group: &grp,
                resource: &res,
                subresource: &sub,
                name: &name,
                namespace: &ns,
                resource_request: ra.is_object(),
                path: &path,
            };
            body["status"] = match authz.decide(&UserInfo::of(&subject), &a, "") {
                Ok(()) => json!({"allowed": true}),
                Err(Denied(reason)) if reason.is_empty() => json!({"allowed": false}),
                Err(Denied(reason)) => json!({"allowed": false, "reason": reason}),
            };
        }
    }
    Ok(body)
}

/// The rules that apply to `caller` in `ns` (cluster-wide ones included), as a
/// SelfSubjectRulesReview status.
fn rules_review(authz: &Authz, caller: &Caller, ns: &str) -> Value {
    let mut rules: Vec<Rule> = Vec::new();
    let errors = authz
        .with_index(|ix| {
            let (_, errors) = ix.visit_rules(&UserInfo::of(caller), ns, |r| {
                if !rules.contains(r) {
                    rules.push(r.clone());
                }
                false
            });
            errors
        })
        .unwrap_or_default();
    if super::node::node_name(&caller.user, &caller.groups).is_some() {
        for r in super::policy::node_rules() {
            if !rules.contains(&r) {
                rules.push(r);
            }
        }
    }
    let resource_rules: Vec<Value> = rules
        .iter()
        .filter(|r| r.non_resource_urls.is_empty())
        .map(|r| {
            let mut v = json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
            if !r.resource_names.is_empty() {
                v["resourceNames"] = json!(r.resource_names);
            }
            v
        })
        .collect();
    let non_resource_rules: Vec<Value> = rules
        .iter()
        .filter(|r| !r.non_resource_urls.is_empty())
        .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
        .collect();
    let mut status = json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
        "incomplete": !errors.is_empty()});
    if !errors.is_empty() {
        status["evaluationError"] = json!(errors.join(", "));
    }
    status
}

/// The caller a request acts as: `caller` itself, or the identity its `Impersonate-*` headers
/// name when `caller` may impersonate each part of it (upstream's impersonation filter).
pub(crate) fn impersonate(
    authz: &Authz,
    caller: &Caller,
    headers: &HeaderMap,
) -> Result<Option<Caller>, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect()
    };
    let users = values("impersonate-user");
    let groups = values("impersonate-group");
    let uids = values("impersonate-uid");
    let extras: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| {
            let key = k.as_str().strip_prefix("impersonate-extra-")?;
            Some((key.to_string(), v.to_str().ok()?.to_string()))
        })
        .collect();
    if users.is_empty() && groups.is_empty() && uids.is_empty() && extras.is_empty() {
        return Ok(None);
    }
    let Some(user) = users.first().cloned() else {
        return Err(ApiError::bad_request(format!(
            "requested {:?} without impersonating a user",
            groups.first().or(uids.first()).cloned().unwrap_or_default()
        )));
    };
    let check = |resource: &str, sub: &str, ns: &str, name: &str, group: &str| -> Result<(), ApiError> {
        let a = Attributes {
            verb: "impersonate",
            api_group: group,
            resource,
            subresource: sub,
            name,
            namespace: ns,
            resource_request: true,
            path: "",
        };
        authz
            .decide(&UserInfo::of(caller), &a, "")
            .map_err(|Denied(reason)| forbidden(&caller.user, &a, &reason))
    };
    let sa = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'));
    match sa {
        Some((ns, name)) => check("serviceaccounts", "", ns, name, "")?,
        None => check("users", "", "", &user, "")?,
    }
    for g in &groups {
        check("groups", "", "", g, "")?;
    }
    for u in &uids {
        check("uids", "", "", u, "authentication.k8s.io")?;
    }
    for (k, v) in &extras {
        check("userextras", k, "", v, "authentication.k8s.io")?;
    }
    let mut new_groups = groups;
    if new_groups.is_empty()
        && let Some((ns, _)) = sa
    {
        new_groups = vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
        ];
    }
    if user != "system:anonymous" && !new_groups.iter().any(|g| g == super::AUTHENTICATED) {
        new_groups.push(super::AUTHENTICATED.into());
    }
    Ok(Some(Caller {
        user,
        groups: new_groups,
    }))
}

/// The JSON form of a review posted as Kubernetes protobuf (`kubectl auth can-i` sends them so;
/// the generated type table has no authorization.k8s.io messages): the spec fields only.
pub(crate) fn decode_protobuf_review(plural: &str, body: &[u8]) -> Result<Value, ApiError> {
    let bad = || ApiError::bad_request("the request body could not be decoded as protobuf");
    let rest = body.strip_prefix(b"k8s\0".as_slice()).ok_or_else(bad)?;
    let raw = fields(rest)
        .ok_or_else(bad)?
        .into_iter()
        .find(|(tag, _)| *tag == 2)
        .map(|(_, v)| v)
        .ok_or_else(bad)?;
    let spec = fields(raw)
        .ok_or_else(bad)?
        .into_iter()
        .find(|(tag, _)| *tag == 2)
        .map(|(_, v)| v)
        .unwrap_or_default();
    let text = |b: &[u8]| Value::String(String::from_utf8_lossy(b).into_owned());
    let attrs = |b: &[u8], names: &[&str]| -> Option<Value> {
        let mut m = serde_json::Map::new();
        for (tag, v) in fields(b)? {
            if let Some(name) = usize::try_from(tag)
                .ok()
                .and_then(|t| names.get(t.wrapping_sub(1)))
            {
                m.insert((*name).to_string(), text(v));
            }
        }
        Some(Value::Object(m))
    };
    let mut out = json!({});
    let mut groups = Vec::new();
    for (tag, v) in fields(spec).ok_or_else(bad)? {
        match tag {
            // A SelfSubjectRulesReview's spec is only its namespace (a string, field 1).
            1 if plural == "selfsubjectrulesreviews" => out["namespace"] = text(v),
            1 => {
                out["resourceAttributes"] = attrs(
                    v,
                    &[
                        "namespace",
                        "verb",
                        "group",
                        "version",
                        "resource",
                        "subresource",
                        "name",
                    ],
                )
                .ok_or_else(bad)?;
            }
            2 => out["nonResourceAttributes"] = attrs(v, &["path", "verb"]).ok_or_else(bad)?,
            3 => out["user"] = text(v),
            4 => groups.push(text(v)),
            6 => out["uid"] = text(v),
            _ => {}
        }
    }
    if !groups.is_empty() {
        out["groups"] = Value::Array(groups);
    }
    Ok(json!({"spec": out}))
}

/// The length-delimited fields of a message, in order (None: malformed); varint and fixed
/// fields are skipped.
fn fields(mut b: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        match key & 7 {
            0 => {
                varint(&mut b)?;
            }
            1 => b = b.get(8..)?,
            5 => b = b.get(4..)?,
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                out.push((key >> 3, b.get(..len)?));
                b = b.get(len..)?;
            }
            _ => return None,
        }
    }
    Some(out)
}
