//! The open-files limit. A hollow-nodes process holds a listener per node, and the API server a
//! connection to each node's kubelet it scrapes for metrics: 5,000 nodes pass the usual soft
//! limit of 1,024, so both processes raise it to the hard limit.

/// Raises the soft limit to the hard one (as Go programs do at start).
pub fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "open-files limit raised"),
            Err(e) => tracing::warn!(error = %e, soft, hard, "open-files limit not raised"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "open-files limit unknown"),
    }
}
