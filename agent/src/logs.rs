//! Container logs as `kubectl logs` shows them: the runtime's CRI log files
//! (`/var/log/pods/<ns>_<pod>_<uid>/<container>/<restarts>.log`, records
//! `<RFC 3339 time> <stream> <F|P> <text>`) rendered back to the container's output, with the
//! kubelet's options (`tailLines`, `timestamps`, `previous`, `sinceSeconds`, `limitBytes`,
//! `follow`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Where the runtime writes pod logs.
pub const PODS_LOG_ROOT: &str = "/var/log/pods";

/// Removes the log directories of pod `uid` under `root` (the kubelet removes a pod's logs
/// with the pod); a missing one is fine.
pub fn remove_pod_logs(root: &Path, uid: &str) -> std::io::Result<()> {
    let suffix = format!("_{uid}");
    let entries = match std::fs::read_dir(root) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(&suffix) {
            match std::fs::remove_dir_all(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The options of one request (the kubelet's query parameters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub tail_lines: Option<usize>,
    pub timestamps: bool,
    pub previous: bool,
    pub since_seconds: Option<u64>,
    pub limit_bytes: Option<usize>,
}

impl LogOptions {
    /// Parses a query string; bad numbers are an error naming the parameter.
    pub fn parse(query: Option<&str>) -> Result<Self, LogError> {
        let mut o = LogOptions::default();
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let flag = matches!(v, "true" | "1" | "");
            let num = |name: &str| {
                v.parse::<u64>()
                    .map_err(|_| LogError::BadParameter(name.to_string()))
            };
            match k {
                "follow" => o.follow = flag,
                "timestamps" => o.timestamps = flag,
                "previous" => o.previous = flag,
                "tailLines" => o.tail_lines = Some(num(k)? as usize),
                "sinceSeconds" => o.since_seconds = Some(num(k)?),
                "limitBytes" => o.limit_bytes = Some(num(k)? as usize),
                _ => {}
            }
        }
        Ok(o)
    }
}

/// Why logs cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    #[error("pod {namespace}/{pod} has no logs on this node")]
    NoPod { namespace: String, pod: String },
    #[error("container {container:?} in pod {pod:?} has no logs")]
    NoContainer { pod: String, container: String },
    #[error("previous terminated container {container:?} in pod {pod:?} not found")]
    NoPrevious { pod: String, container: String },
    #[error("invalid value for {0}")]
    BadParameter(String),
    #[error("invalid path; expected /<containerLogs|exec>/<namespace>/<pod>/<container>")]
    BadPath,
}

impl LogError {
    /// The HTTP status the agent answers with.
    pub fn status(&self) -> u16 {
        match self {
            // As the kubelet: a missing previous instance is a bad request (docs/SEEDS-SPEC.md API-58).
            LogError::BadParameter(_) | LogError::BadPath | LogError::NoPrevious { .. } => 400,
            _ => 404,
        }
    }
}

/// `(namespace, pod, container)` of a `/containerLogs/...` path.
pub fn parse_path(path: &str) -> Result<(&str, &str, &str), LogError> {
    parse_target(path, "/containerLogs/")
}

/// `(namespace, pod, container)` of a `<prefix><namespace>/<pod>/<container>` path.
pub fn parse_target<'a>(path: &'a str, prefix: &str) -> Result<(&'a str, &'a str, &'a str), LogError> {
    let rest = path.strip_prefix(prefix).ok_or(LogError::BadPath)?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [ns, pod, c] if [ns, pod, c].iter().all(|s| valid_name(s)) => Ok((ns, pod, c)),
        _ => Err(LogError::BadPath),
    }
}

/// Names as they appear in log paths: DNS-1123 characters only (nothing that leaves a directory).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s != "."
        && s != ".."
}

/// The log file to read: the newest pod directory of that name, the container's latest
/// (or, with `previous`, the one before) `<restarts>.log`.
pub fn find_log(
    root: &Path,
    ns: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<PathBuf, LogError> {
    let prefix = format!("{ns}_{pod}_");
    let pod_dir = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        })
        .map(|e| e.path())
        .ok_or_else(|| LogError::NoPod {
            namespace: ns.into(),
            pod: pod.into(),
        })?;
    let no_container = || LogError::NoContainer {
        pod: pod.into(),
        container: container.into(),
    };
    let mut runs: Vec<(u64, PathBuf)> = std::fs::read_dir(pod_dir.join(container))
        .map_err(|_| no_container())?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name.strip_suffix(".log")?.parse::<u64>().ok()?;
            Some((n, e.path()))
        })
        .collect();
    runs.sort();
    let pick = if previous {
        runs.len().checked_sub(2)
    } else {
        runs.len().checked_sub(1)
    };
    match pick {
        Some(i) => Ok(runs.swap_remove(i).1),
        None if previous => Err(LogError::NoPrevious {
            pod: pod.into(),
            container: container.into(),
        }),
        None => Err(no_container()),
    }
}

/// One line of a CRI log file: `<time> <stream> <P|F> <text>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub time: &'a str,
    /// `stdout` or `stderr`.
    pub stream: &'a str,
    /// `F` (the text ends a line) or `P` (a part of a longer one).
    pub tag: &'a str,
    pub text: &'a str,
}

impl<'a> Record<'a> {
    pub fn parse(line: &'a str) -> Option<Self> {
        let (time, rest) = line.split_once(' ')?;
        let (stream, rest) = rest.split_once(' ')?;
        let (tag, text) = rest.split_once(' ').unwrap_or((rest, ""));
        Some(Record {
            time,
            stream,
            tag,
            text,
        })
    }
}

/// One CRI record rendered: the text (with its newline when the record is complete), prefixed
/// by the record's time with `timestamps`; None for a malformed line.
pub fn render(line: &str, timestamps: bool) -> Option<(i64, String)> {
    let Record { time, tag, text, .. } = Record::parse(line)?;
    let secs = kcore::time::parse_rfc3339(time)?;
    let mut out = String::with_capacity(text.len() + 40);
    if timestamps {
        out.push_str(time);
        out.push(' ');
    }
    out.push_str(text);
    if tag == "F" {
        out.push('\n');
    }
    Some((secs, out))
}

/// Renders the complete lines of `data` (a log file's content) per `o`: since, tail, limit.
pub fn render_all(data: &str, o: &LogOptions, now: SystemTime) -> String {
    let since = o.since_seconds.map(|s| {
        now.checked_sub(Duration::from_secs(s))
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs() as i64)
    });
    let mut lines: Vec<String> = data
        .lines()
        .filter_map(|l| render(l, o.timestamps))
        .filter(|(t, _)| since.is_none_or(|s| *t >= s))
        .map(|(_, s)| s)
        .collect();
    if let Some(n) = o.tail_lines {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    let mut out = lines.concat();
    if let Some(limit) = o.limit_bytes
        && out.len() > limit
    {
        let mut cut = limit;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-11-29T10:00:00.000000001Z stdout F one\n\
                       2026-11-29T10:00:01.5Z stderr P par\n\
                       2026-11-29T10:00:01.6Z stderr F tial\n\
                       garbage\n\
                       2026-11-29T10:00:02Z stdout F \n\
                       2026-11-29T10:00:03Z stdout F three\n";

    #[test]
    fn renders_records_with_options() {
        let now = SystemTime::UNIX_EPOCH
            + Duration::from_secs(kcore::time::parse_rfc3339("2026-11-29T10:00:04Z").unwrap_or(0) as u64);
        let all = LogOptions::default();
        assert_eq!(render_all(LOG, &all, now), "one\npartial\n\nthree\n");
        let tail = LogOptions {
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(render_all(LOG, &tail, now), "\nthree\n");
        let ts = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..Default::default()
        };
        assert_eq!(render_all(LOG, &ts, now), "2026-11-29T10:00:03Z three\n");
        let since = LogOptions {
            since_seconds: Some(2),
            ..Default::default()
        };
        assert_eq!(render_all(LOG, &since, now), "\nthree\n");
        let limit = LogOptions {
            limit_bytes: Some(5),
            ..Default::default()
        };
        assert_eq!(render_all(LOG, &limit, now), "one\np");
    }

    #[test]
    fn query_and_path_parsing() {
        let o =
            LogOptions::parse(Some("follow=true&tailLines=10&timestamps=true&previous=false")).expect("ok");
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                tail_lines: Some(10),
                timestamps: true,
                ..Default::default()
            }
        );
        assert_eq!(
            LogOptions::parse(Some("tailLines=x")),
            Err(LogError::BadParameter("tailLines".into()))
        );
        assert_eq!(
            parse_path("/containerLogs/default/web-1/nginx"),
            Ok(("default", "web-1", "nginx"))
        );
        for bad in [
            "/containerLogs/default/../x",
            "/containerLogs/a/b",
            "/containerLogs/a/b/c/d",
            "/x/a/b/c",
            "/containerLogs/A/b/c",
        ] {
            assert_eq!(parse_path(bad), Err(LogError::BadPath), "{bad}");
        }
    }

    #[test]
    fn finds_the_latest_or_previous_run() {
        let root = tempfile::tempdir().expect("tempdir");
        let c = root.path().join("default_web_uid1/nginx");
        std::fs::create_dir_all(&c).expect("mkdir");
        for n in [0, 1, 10, 2] {
            std::fs::write(c.join(format!("{n}.log")), "").expect("write");
        }
        let find = |prev| find_log(root.path(), "default", "web", "nginx", prev);
        assert_eq!(find(false), Ok(c.join("10.log")));
        assert_eq!(find(true), Ok(c.join("2.log")));
        assert!(matches!(
            find_log(root.path(), "default", "web", "other", false),
            Err(LogError::NoContainer { .. })
        ));
        assert!(matches!(
            find_log(root.path(), "default", "nope", "nginx", false),
            Err(LogError::NoPod { .. })
        ));
        let one = root.path().join("kube_solo_uid2/c");
        std::fs::create_dir_all(&one).expect("mkdir");
        std::fs::write(one.join("0.log"), "").expect("write");
        assert!(matches!(
            find_log(root.path(), "kube", "solo", "c", true),
            Err(LogError::NoPrevious { .. })
        ));
    }
}
