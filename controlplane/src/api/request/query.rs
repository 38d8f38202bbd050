//! Query parameters, percent-decoded, with the accessors the verbs use.

/// Query parameters, decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        let mut out = Vec::new();
        for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.push((kcore::url::percent_decode(k), kcore::url::percent_decode(v)));
        }
        Self(out)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }

    /// The field manager a client named with `fieldManager` (None for the server's own writes).
    pub fn field_manager(&self) -> Option<&str> {
        self.get("fieldManager").filter(|m| !m.is_empty())
    }

    /// Without a `fieldManager` parameter, a client's writes are managed under the product token
    /// of its User-Agent (`kubectl/v1.32.5 (linux/amd64) ...` → `kubectl`), as upstream.
    pub(crate) fn default_field_manager(&mut self, user_agent: Option<&str>) {
        if self.field_manager().is_none() {
            let token = user_agent
                .and_then(|ua| ua.split('/').next())
                .map(str::trim)
                .unwrap_or_default();
            let manager = if token.is_empty() { "unknown" } else { token };
            self.0
                .push(("fieldManager".into(), manager.chars().take(128).collect()));
        }
    }
}
