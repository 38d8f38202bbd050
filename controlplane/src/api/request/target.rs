//! The resource a request path names: `/api/v1/...` or `/apis/<group>/<version>/...`, with the
//! namespace, object name and subresource.

use crate::api::registry::{self, Resource};
use crate::api::status::ApiError;

/// A parsed request target.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub res: &'static Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

/// Splits `/api/v1/...` or `/apis/<g>/<v>/...` into a resource target.
pub(crate) fn parse_target(segs: &[&str]) -> Result<Target, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::not_found_path(&segs.join("/"))),
    };
    let lookup = |plural: &str| {
        registry::find(group, version, plural)
            .ok_or_else(|| ApiError::not_found_path(&format!("/{}", segs.join("/"))))
    };
    let t = |res, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
        res,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.map(str::to_string),
    };
    Ok(match rest {
        ["namespaces", ns, sub] if matches!(*sub, "status" | "finalize") => {
            t(lookup("namespaces")?, None, Some(ns), Some(sub))
        }
        ["namespaces", ns, plural] => t(lookup(plural)?, Some(ns), None, None),
        ["namespaces", ns, plural, name] => t(lookup(plural)?, Some(ns), Some(name), None),
        ["namespaces", ns, plural, name, sub] => t(lookup(plural)?, Some(ns), Some(name), Some(sub)),
        [plural] => t(lookup(plural)?, None, None, None),
        [plural, name] => t(lookup(plural)?, None, Some(name), None),
        [plural, name, sub] => t(lookup(plural)?, None, Some(name), Some(sub)),
        _ => return Err(ApiError::not_found_path(&format!("/{}", segs.join("/")))),
    })
}
