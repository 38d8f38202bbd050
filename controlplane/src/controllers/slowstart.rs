//! Creating an owner's pods as upstream's workload controllers do (`slowStartBatch`): batches of
//! 1, 2, 4, ... pods created at once, so a template that cannot be created fails once rather
//! than once per missing replica; a batch with a failure ends the creation and the rest waits
//! for the next sync. Each pod created is expected (the cache may not have it yet) and gets a
//! `SuccessfulCreate` event, each failure a `FailedCreate` one, with upstream's texts.

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;

use super::expectations::Expectations;
use crate::events::{Involved, Kind, Recorder};

/// A creation that stopped at a failure.
#[derive(Debug, thiserror::Error)]
#[error("Error creating: {message}")]
pub struct CreateFailed {
    /// The pods not created: those that failed and those of the batches not tried.
    pub not_created: usize,
    /// The API's message for the first failure.
    pub message: String,
    #[source]
    pub source: kube::Error,
}

/// What one owner's creation needs.
pub struct Creator<'a> {
    pub api: &'a kube::Api<Pod>,
    /// The owner's UID, under which the created pods are expected.
    pub owner_uid: &'a str,
    pub expectations: &'a Expectations,
    pub recorder: &'a Recorder,
    pub involved: &'a Involved,
}

impl std::fmt::Debug for Creator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creator")
            .field("owner_uid", &self.owner_uid)
            .finish_non_exhaustive()
    }
}

impl Creator<'_> {
    /// Creates `pods` with the slow start.
    pub async fn create(&self, pods: Vec<Pod>) -> Result<(), CreateFailed> {
        let pp = PostParams::default();
        let total = pods.len();
        let mut done = 0usize;
        let mut batch = 1usize;
        let mut pods = pods.into_iter();
        while done < total {
            let now: Vec<Pod> = pods.by_ref().take(batch).collect();
            let size = now.len();
            let results = futures::future::join_all(now.iter().map(|p| self.api.create(&pp, p))).await;
            let mut events = Vec::with_capacity(size);
            let mut first: Option<kube::Error> = None;
            let mut failed = 0usize;
            for r in results {
                match r {
                    Ok(created) => {
                        let name = created.metadata.name.unwrap_or_default();
                        self.expectations.created(self.owner_uid, &name);
                        events.push((Kind::Normal, "SuccessfulCreate", format!("Created pod: {name}")));
                    }
                    Err(e) => {
                        failed += 1;
                        events.push((
                            Kind::Warning,
                            "FailedCreate",
                            format!("Error creating: {}", api_message(&e)),
                        ));
                        first.get_or_insert(e);
                    }
                }
            }
            futures::future::join_all(events.iter().map(|(kind, reason, msg)| {
                self.recorder.record(self.involved, *kind, reason, "Create", msg)
            }))
            .await;
            done += size;
            if let Some(source) = first {
                return Err(CreateFailed {
                    not_created: failed + (total - done),
                    message: api_message(&source),
                    source,
                });
            }
            batch = batch.saturating_mul(2);
        }
        Ok(())
    }
}

/// The message of an API error as the API gave it (the error's text otherwise).
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}
