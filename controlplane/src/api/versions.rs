//! Older versions served next to a resource's preferred one, converted at the edge:
//! `autoscaling/v1` HorizontalPodAutoscalers (what `kubectl autoscale` posts) over the stored
//! `autoscaling/v2` objects.
//!
//! A request to an older version is rewritten into a request to the preferred version (its body
//! converted; a patch applied to the older form of the current object and sent as an update with
//! that object's resourceVersion), handled as usual (authorization sees the same group and
//! resource), and its answer converted back: objects, lists, tables' embedded objects and watch
//! events. Server-side apply to an older version is refused with 415: the managed fields are kept
//! in the preferred version's field paths.
//!
//! The v1 form is upstream's (`pkg/apis/autoscaling/v1/conversion.go`): the first CPU
//! `Utilization` Resource metric is `targetCPUUtilizationPercentage` (and its current value
//! `currentCPUUtilizationPercentage`); the other metrics, the current metrics, the conditions
//! and the behavior ride in the `autoscaling.alpha.kubernetes.io/*` annotations so that a v1
//! round trip loses nothing. Departure: the metrics annotations hold the v2 `MetricSpec` and
//! `MetricStatus` shapes (upstream writes its v1 `MetricSpec` shapes there); a v1 client reading
//! them as v1 shapes would not recognise them.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};

use crate::api::output::{Body, Format, full, object_response};
use crate::api::request::body::{collect_body, parse_object_body};
use crate::api::schema::Type;
use crate::api::status::ApiError;
use crate::api::verbs::patch::{json_patch, merge_patch, strategic_merge};

const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";

/// An older version of a resource and its conversions.
pub(crate) struct Older {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    /// The preferred (stored) version.
    pub preferred: &'static str,
    /// Older form → preferred form.
    pub up: fn(Value) -> Result<Value, ApiError>,
    /// Preferred form → older form.
    pub down: fn(Value) -> Value,
}

/// Every older version served.
pub(crate) static OLDER: &[Older] = &[Older {
    group: "autoscaling",
    version: "v1",
    plural: "horizontalpodautoscalers",
    kind: "HorizontalPodAutoscaler",
    preferred: "v2",
    up: hpa_v1_to_v2,
    down: hpa_v2_to_v1,
}];

/// The older version a path addresses (`/apis/<group>/<older>/.../<plural>...`), if any.
pub(crate) fn older_of(segs: &[&str]) -> Option<&'static Older> {
    let ["apis", group, version, rest @ ..] = segs else {
        return None;
    };
    let rest = match rest {
        ["watch", rest @ ..] => rest,
        rest => rest,
    };
    let plural = match rest {
        ["namespaces", _, plural, ..] => *plural,
        [plural, ..] => *plural,
        [] => return None,
    };
    OLDER
        .iter()
        .find(|o| o.group == *group && o.version == *version && o.plural == plural)
}

impl Older {
    fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    fn preferred_api_version(&self) -> String {
        format!("{}/{}", self.group, self.preferred)
    }

    /// The same path in the preferred version.
    pub(crate) fn preferred_path(&self, path: &str) -> String {
        let from = format!("/apis/{}/{}/", self.group, self.version);
        let to = format!("/apis/{}/{}/", self.group, self.preferred);
        path.replacen(&from, &to, 1)
    }

    /// A body object of the older version in the preferred version (kind and apiVersion
    /// checked).
    pub(crate) fn body_up(&self, obj: Value) -> Result<Value, ApiError> {
        let av = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        if (!av.is_empty() && av != self.api_version()) || (!kind.is_empty() && kind != self.kind) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                self.api_version()
            )));
        }
        let mut out = (self.up)(obj)?;
        out["apiVersion"] = json!(self.preferred_api_version());
        out["kind"] = json!(self.kind);
        Ok(out)
    }

    /// Converts what an answer holds down to the older version: an object of the kind, a list of
    /// them, a table's embedded objects or a watch event; anything else (a `Status`) unchanged.
    pub(crate) fn answer_down(&self, mut v: Value) -> Value {
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let list_kind = format!("{}List", self.kind);
        if kind == self.kind {
            v = (self.down)(v);
            v["apiVersion"] = json!(self.api_version());
        } else if kind == list_kind {
            v["apiVersion"] = json!(self.api_version());
            if let Some(items) = v["items"].as_array_mut() {
                for item in items.iter_mut() {
                    *item = (self.down)(std::mem::take(item));
                    if item.get("apiVersion").is_some() {
                        item["apiVersion"] = json!(self.api_version());
                    }
                }
            }
        } else if kind == "Table" {
            if let Some(rows) = v["rows"].as_array_mut() {
                for row in rows {
                    if row["object"]["kind"] == self.kind {
                        row["object"] = self.answer_down(row["object"].take());
                    }
                }
            }
        } else if v.get("type").is_some() && v.get("object").is_some() && kind.is_empty() {
            v["object"] = self.answer_down(v["object"].take());
        }
        v
    }
}

/// A request to an older version, rewritten for the preferred one.
pub(crate) enum Rewritten {
    /// Send this request; convert its answer down.
    Request(Box<Request<Bytes>>),
    /// A patch: read the object, patch its older form, and update.
    Patch(Box<PatchPlan>),
}

/// How a patch to an older version is carried out.
pub(crate) struct PatchPlan {
    /// Reads the object in the preferred version.
    pub get: Request<Bytes>,
    /// Where the update goes (with the request's query).
    pub put_path: String,
    pub content_type: String,
    pub patch: Bytes,
    /// The original request's parts, for the update.
    pub parts: http::request::Parts,
}

/// Rewrites `req` (addressing `older`) for the preferred version.
pub(crate) fn rewrite(older: &Older, req: Request<Bytes>) -> Result<Rewritten, ApiError> {
    let (mut parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let new_uri: http::Uri = older
        .preferred_path(&path_and_query)
        .parse()
        .map_err(|_| ApiError::bad_request("invalid request path"))?;
    parts.uri = new_uri;
    // Answers come back as JSON to be converted (client-go accepts JSON whatever it asked).
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !accept.contains("as=Table") {
        parts
            .headers
            .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    }
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let converts_body = matches!(parts.method, Method::POST | Method::PUT) && !body.is_empty();
    if parts.method == Method::PATCH {
        if ct.starts_with("application/apply-patch") {
            return Err(ApiError {
                code: 415,
                reason: "UnsupportedMediaType",
                message: format!(
                    "server-side apply is served for {} in {}/{} only",
                    older.plural, older.group, older.preferred
                ),
                details: None,
            });
        }
        let mut get = Request::builder()
            .method(Method::GET)
            .uri(parts.uri.path())
            .body(Bytes::new())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        *get.headers_mut() = parts.headers.clone();
        get.headers_mut().remove(header::CONTENT_TYPE);
        get.headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let put_path = path_and_query_of(&parts.uri);
        return Ok(Rewritten::Patch(Box::new(PatchPlan {
            get,
            put_path,
            content_type: ct,
            patch: body,
            parts,
        })));
    }
    let body = if converts_body {
        let obj = older.body_up(parse_object_body(&ct, &body)?)?;
        parts
            .headers
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Bytes::from(serde_json::to_vec(&obj).map_err(|e| ApiError::internal(e.to_string()))?)
    } else {
        body
    };
    Ok(Rewritten::Request(Box::new(Request::from_parts(parts, body))))
}

fn path_and_query_of(uri: &http::Uri) -> String {
    uri.path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default()
}

/// The update that applies `patch` (of media type `ct`) to `current` (the preferred form, as
/// read) through the older form; the update carries `current`'s resourceVersion, so a write in
/// between answers 409 as a conflicting patch would.
pub(crate) fn patched_update(
    older: &Older,
    current: Value,
    ct: &str,
    patch: &[u8],
    mut parts: http::request::Parts,
    put_path: &str,
) -> Result<Request<Bytes>, ApiError> {
    let rv = current["metadata"]["resourceVersion"].clone();
    let mut doc = older.answer_down(current);
    let patch: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("the patch is not JSON: {e}")))?;
    let media = ct.split(';').next().unwrap_or_default().trim();
    let applied = match media {
        "application/json-patch+json" => json_patch(&mut doc, &patch),
        "application/merge-patch+json" => {
            merge_patch(&mut doc, &patch);
            Ok(())
        }
        "application/strategic-merge-patch+json" => {
            strategic_merge(&mut doc, &patch, Type::of_kind(&older.api_version(), older.kind))
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    applied.map_err(ApiError::from)?;
    let mut obj = older.body_up(doc)?;
    obj["metadata"]["resourceVersion"] = rv;
    parts.method = Method::PUT;
    parts.uri = put_path
        .parse()
        .map_err(|_| ApiError::bad_request("invalid request path"))?;
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body = serde_json::to_vec(&obj).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Request::from_parts(parts, Bytes::from(body)))
}

/// Converts an answer of the preferred version down to `older`, in `format` (objects and lists;
/// a watch stream's events stay JSON, which client-go reads whatever it asked for).
pub(crate) async fn response_down(
    older: &'static Older,
    resp: Response<Body>,
    format: Format,
    watching: bool,
) -> Response<Body> {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if !is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    if watching && parts.status.is_success() {
        return Response::from_parts(parts, watch_down(older, body));
    }
    let bytes = match collect_body(body).await {
        Ok(b) => b,
        Err(e) => return crate::api::error_response_as(&e, format),
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, full(bytes));
    };
    let mut resp = object_response(parts.status.as_u16(), &older.answer_down(v), format);
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            resp.headers_mut().append(k.clone(), v.clone());
        }
    }
    resp
}

/// A watch stream's JSON lines converted one by one (a line split across chunks is joined).
fn watch_down(older: &'static Older, body: Body) -> Body {
    let mut pending: Vec<u8> = Vec::new();
    body.map_frame(move |frame| {
        frame.map_data(|chunk| {
            pending.extend_from_slice(&chunk);
            let mut out = Vec::new();
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                match serde_json::from_slice::<Value>(&line)
                    .ok()
                    .and_then(|ev| serde_json::to_vec(&older.answer_down(ev)).ok())
                {
                    Some(mut converted) => {
                        converted.push(b'\n');
                        out.extend_from_slice(&converted);
                    }
                    None => out.extend_from_slice(&line),
                }
            }
            Bytes::from(out)
        })
    })
    .boxed()
}

fn annotations(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    obj.get_mut("metadata")?.get_mut("annotations")?.as_object_mut()
}

/// A converted object keeps the `apiVersion` and `kind` fields the original had (list items
/// have none).
fn with_type_of(original: &Value, mut out: Value) -> Value {
    for key in ["apiVersion", "kind"] {
        if let Some(v) = original.get(key) {
            out[key] = v.clone();
        }
    }
    out
}

/// Takes annotation `key` holding a JSON document.
fn take_json(obj: &mut Value, key: &str) -> Result<Option<Value>, ApiError> {
    let Some(raw) = annotations(obj).and_then(|a| a.remove(key)) else {
        return Ok(None);
    };
    let text = raw.as_str().unwrap_or_default();
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| ApiError::bad_request(format!("annotation {key}: {e}")))
}

fn put_json(obj: &mut Value, key: &str, v: &Value) {
    if !obj["metadata"]["annotations"].is_object() {
        obj["metadata"]["annotations"] = json!({});
    }
    if let Some(a) = annotations(obj) {
        a.insert(key.into(), Value::String(v.to_string()));
    }
}

fn is_cpu_utilization(m: &Value) -> bool {
    m["type"] == "Resource"
        && m["resource"]["name"] == "cpu"
        && m["resource"]["target"]["type"] == "Utilization"
}

/// `autoscaling/v1` → `autoscaling/v2`.
pub(crate) fn hpa_v1_to_v2(mut v1: Value) -> Result<Value, ApiError> {
    let mut metrics = Vec::new();
    if let Some(pct) = v1["spec"].get("targetCPUUtilizationPercentage").cloned()
        && !pct.is_null()
    {
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": pct}}}));
    }
    if let Some(Value::Array(others)) = take_json(&mut v1, METRICS)? {
        metrics.extend(others);
    }
    let behavior = take_json(&mut v1, BEHAVIOR)?;
    let conditions = take_json(&mut v1, CONDITIONS)?;
    let current_others = take_json(&mut v1, CURRENT_METRICS)?;
    if annotations(&mut v1).is_some_and(|a| a.is_empty())
        && let Some(m) = v1["metadata"].as_object_mut()
    {
        m.remove("annotations");
    }
    let mut spec = v1["spec"].take();
    if let Some(s) = spec.as_object_mut() {
        s.remove("targetCPUUtilizationPercentage");
        if !metrics.is_empty() {
            s.insert("metrics".into(), Value::Array(metrics));
        }
        if let Some(b) = behavior {
            s.insert("behavior".into(), b);
        }
    }
    let metadata = v1["metadata"].take();
    let mut out = with_type_of(&v1, json!({"metadata": metadata, "spec": spec}));
    if let Some(status) = v1.get_mut("status").map(Value::take).filter(Value::is_object) {
        let mut status = status;
        let mut current = Vec::new();
        if let Some(s) = status.as_object_mut() {
            if let Some(pct) = s.remove("currentCPUUtilizationPercentage")
                && !pct.is_null()
            {
                current.push(json!({"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": pct}}}));
            }
            if let Some(Value::Array(others)) = current_others {
                current.extend(others);
            }
            if !current.is_empty() {
                s.insert("currentMetrics".into(), Value::Array(current));
            }
            if let Some(c) = conditions {
                s.insert("conditions".into(), c);
            }
        }
        out["status"] = status;
    }
    Ok(out)
}

/// `autoscaling/v2` → `autoscaling/v1`.
pub(crate) fn hpa_v2_to_v1(mut v2: Value) -> Value {
    let mut spec = v2["spec"].take();
    let mut others = Vec::new();
    let mut cpu = None;
    if let Some(Value::Array(metrics)) = spec.as_object_mut().and_then(|s| s.remove("metrics")) {
        for m in metrics {
            if cpu.is_none() && is_cpu_utilization(&m) {
                cpu = Some(m["resource"]["target"]["averageUtilization"].clone());
            } else {
                others.push(m);
            }
        }
    }
    let behavior = spec.as_object_mut().and_then(|s| s.remove("behavior"));
    if let (Some(s), Some(pct)) = (spec.as_object_mut(), cpu.filter(|p| !p.is_null())) {
        s.insert("targetCPUUtilizationPercentage".into(), pct);
    }
    let metadata = v2["metadata"].take();
    let mut out = with_type_of(&v2, json!({"metadata": metadata, "spec": spec}));
    if !others.is_empty() {
        put_json(&mut out, METRICS, &Value::Array(others));
    }
    if let Some(b) = behavior.filter(|b| !b.is_null()) {
        put_json(&mut out, BEHAVIOR, &b);
    }
    if let Some(mut status) = v2.get_mut("status").map(Value::take).filter(Value::is_object) {
        let mut current_others = Vec::new();
        if let Some(s) = status.as_object_mut() {
            if let Some(Value::Array(current)) = s.remove("currentMetrics") {
                let mut cpu = None;
                for m in current {
                    if cpu.is_none() && m["type"] == "Resource" && m["resource"]["name"] == "cpu" {
                        cpu = m["resource"]["current"].get("averageUtilization").cloned();
                        if cpu.is_some() {
                            continue;
                        }
                    }
                    current_others.push(m);
                }
                if let Some(pct) = cpu {
                    s.insert("currentCPUUtilizationPercentage".into(), pct);
                }
            }
            if let Some(c) = s.remove("conditions").filter(|c| !c.is_null()) {
                put_json(&mut out, CONDITIONS, &c);
            }
        }
        if !current_others.is_empty() {
            put_json(&mut out, CURRENT_METRICS, &Value::Array(current_others));
        }
        out["status"] = status;
    }
    out
}

#[cfg(test)]
mod tests;
