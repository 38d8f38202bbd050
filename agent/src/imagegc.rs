//! Image garbage collection (docs/SEEDS-SPEC.md NODE-46's "for disk pressure the kubelet first
//! garbage-collects unused images"; the kubelet's `ImageGCManager`). Every [`PERIOD`] the file
//! system holding the images is measured; at `imageGCHighThresholdPercent` used or more, unused
//! images are removed, least recently used first and none younger than `imageMinimumGCAge`,
//! until usage is back at `imageGCLowThresholdPercent`. An image is in use while any container
//! the runtime has (running or not) was made from it. Falling short records the kubelet's
//! `FreeDiskSpaceFailed` event on the Node.
//!
//! Sizes are what the runtime reports: the compressed bytes of an image's layers, so freeing is
//! counted conservatively (extracted layers take more). The decisions are pure ([`Tracker`],
//! [`bytes_to_free`]); [`run`] measures and removes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use runtime_api::Image;
use serde::{Deserialize, Serialize};

/// How often the image file system is checked. Upstream checks every 5 minutes; this node
/// checks every minute (a small root file system fills faster, and a check costs one statvfs
/// and one list).
pub const PERIOD: Duration = Duration::from_secs(60);

/// The kubelet's image GC settings (`imageGCHighThresholdPercent`,
/// `imageGCLowThresholdPercent`, `imageMinimumGCAge`; its defaults: 85 %, 80 %, 2 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Policy {
    pub high_threshold_percent: u8,
    pub low_threshold_percent: u8,
    pub minimum_age_seconds: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_age_seconds: 120,
        }
    }
}

/// Why a policy is refused (upstream's validation texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("imageGCHighThresholdPercent ({0}) must be between 0 and 100")]
    High(u8),
    #[error("imageGCLowThresholdPercent ({0}) must be between 0 and 100")]
    Low(u8),
    #[error("imageGCLowThresholdPercent ({low}) must be less than imageGCHighThresholdPercent ({high})")]
    Order { low: u8, high: u8 },
}

impl Policy {
    pub fn validate(&self) -> Result<(), PolicyError> {
        let (high, low) = (self.high_threshold_percent, self.low_threshold_percent);
        if high > 100 {
            return Err(PolicyError::High(high));
        }
        if low > 100 {
            return Err(PolicyError::Low(low));
        }
        if low >= high {
            return Err(PolicyError::Order { low, high });
        }
        Ok(())
    }
}

/// How many bytes to free from a file system of `capacity` bytes with `available` free: none
/// below the high threshold (and never at 100 %, which turns GC off), else enough to get back
/// to the low one.
pub fn bytes_to_free(policy: &Policy, available: u64, capacity: u64) -> Option<u64> {
    if capacity == 0 || policy.high_threshold_percent >= 100 {
        return None;
    }
    let used_percent = 100 - (u128::from(available) * 100 / u128::from(capacity)).min(100) as u64;
    if used_percent < u64::from(policy.high_threshold_percent) {
        return None;
    }
    let target_free = u128::from(capacity) * u128::from(100 - policy.low_threshold_percent) / 100;
    let free = u64::try_from(target_free)
        .unwrap_or(u64::MAX)
        .saturating_sub(available);
    (free > 0).then_some(free)
}

/// When an image (by id) was first seen and last seen in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    first_detected: SystemTime,
    last_used: SystemTime,
}

/// What the collector knows of the node's images across checks.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    records: BTreeMap<String, Record>,
}

/// The images to remove and the bytes that frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// References to remove (every reference of each chosen image).
    pub remove: Vec<String>,
    pub freed: u64,
}

impl Tracker {
    /// Takes in the image list at `now`: new images are first detected now, images used by a
    /// container (by reference) were last used now, removed images are forgotten.
    pub fn observe(&mut self, images: &[Image], used_refs: &BTreeSet<String>, now: SystemTime) {
        let ids: BTreeSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| ids.contains(id.as_str()));
        for img in images {
            // Never used yet: least recently used of all (upstream's zero time).
            let r = self.records.entry(img.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: SystemTime::UNIX_EPOCH,
            });
            if used_refs.contains(&img.reference) {
                r.last_used = now;
            }
        }
    }

    /// The unused images to remove, least recently used first, none detected less than
    /// `min_age` ago, until `bytes` are freed (upstream's `freeSpace`).
    pub fn plan(
        &self,
        images: &[Image],
        used_refs: &BTreeSet<String>,
        bytes: u64,
        min_age: Duration,
        now: SystemTime,
    ) -> Plan {
        let used_ids: BTreeSet<&str> = images
            .iter()
            .filter(|i| used_refs.contains(&i.reference))
            .map(|i| i.id.as_str())
            .collect();
        // One entry per image id: its references and size.
        let mut by_id: BTreeMap<&str, (Vec<&str>, u64)> = BTreeMap::new();
        for img in images.iter().filter(|i| !used_ids.contains(i.id.as_str())) {
            let e = by_id.entry(img.id.as_str()).or_default();
            e.0.push(img.reference.as_str());
            e.1 = e.1.max(img.size);
        }
        let mut candidates: Vec<(&str, Record, Vec<&str>, u64)> = by_id
            .into_iter()
            .filter_map(|(id, (refs, size))| Some((id, *self.records.get(id)?, refs, size)))
            .filter(|(_, r, _, _)| now.duration_since(r.first_detected).unwrap_or_default() >= min_age)
            .collect();
        candidates.sort_by_key(|(id, r, _, _)| (r.last_used, r.first_detected, *id));
        let mut plan = Plan {
            remove: Vec::new(),
            freed: 0,
        };
        for (_, _, refs, size) in candidates {
            if plan.freed >= bytes {
                break;
            }
            plan.remove.extend(refs.into_iter().map(str::to_string));
            plan.freed += size;
        }
        plan
    }
}

/// The message of a collection that fell short (the kubelet's `FreeDiskSpaceFailed` text).
pub fn shortfall(wanted: u64, found: u64) -> String {
    format!(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {found} bytes eligible to free."
    )
}

/// Checks the image file system every [`PERIOD`] and removes images per `policy`, forever; a
/// request on `reclaim` (the eviction manager's, under image file system pressure) removes
/// every unused image old enough at once and is answered with the bytes freed.
pub async fn run(
    events: crate::pods::events::Recorder,
    policy: Policy,
    mut reclaim: tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<u64>>,
) {
    let mut tracker = Tracker::default();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let answer = tokio::select! {
            _ = tick.tick() => None,
            Some(answer) = reclaim.recv() => Some(answer),
        };
        let all = answer.is_some();
        let checked = tokio::task::spawn_blocking(move || {
            let r = collect(&mut tracker, &policy, all);
            (tracker, r)
        })
        .await;
        let result = match checked {
            Ok((t, r)) => {
                tracker = t;
                r
            }
            Err(e) => {
                tracing::warn!(error = %e, "image garbage collection panicked");
                return;
            }
        };
        if let Some(answer) = answer {
            let freed = match &result {
                Ok(Some((_, plan))) => plan.freed,
                _ => 0,
            };
            let _ = answer.send(freed);
            if let Ok(Some((_, plan))) = &result {
                tracing::info!(freed = plan.freed, images = ?plan.remove, "unused images removed for the eviction manager");
            }
            continue;
        }
        match result {
            Ok(Some((wanted, plan))) if plan.freed < wanted => {
                let msg = shortfall(wanted, plan.freed);
                tracing::warn!(message = %msg, "image garbage collection fell short");
                events.node_now("FreeDiskSpaceFailed", msg).await;
            }
            Ok(Some((wanted, plan))) => {
                tracing::info!(wanted, freed = plan.freed, images = ?plan.remove, "images garbage collected");
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "image garbage collection failed"),
        }
    }
}

/// One check (blocking): measures, and removes what the plan says (with `all`, every unused
/// image old enough, whatever the thresholds: upstream's `DeleteUnusedImages`). Returns the
/// bytes wanted and the plan carried out, None when usage is below the high threshold.
fn collect(
    tracker: &mut Tracker,
    policy: &Policy,
    all: bool,
) -> Result<Option<(u64, Plan)>, runtime_api::ClientError> {
    let mut rt = runtime_api::Client::connect(std::path::Path::new(runtime_api::SOCKET))?;
    let images = rt.list_images()?;
    let used: BTreeSet<String> = rt.list_containers()?.into_iter().map(|c| c.image).collect();
    let now = SystemTime::now();
    tracker.observe(&images, &used, now);
    let Ok(st) = nix::sys::statvfs::statvfs(runtime_api::IMAGE_ROOT) else {
        return Ok(None);
    };
    let block = st.fragment_size();
    let (available, capacity) = (
        st.blocks_available().saturating_mul(block),
        st.blocks().saturating_mul(block),
    );
    let wanted = if all {
        Some(u64::MAX)
    } else {
        bytes_to_free(policy, available, capacity)
    };
    let Some(wanted) = wanted else {
        return Ok(None);
    };
    let min_age = Duration::from_secs(policy.minimum_age_seconds);
    let plan = tracker.plan(&images, &used, wanted, min_age, now);
    for reference in &plan.remove {
        // An image taken into use since the list is refused by the runtime (Conflict).
        if let Err(e) = rt.remove_image(reference) {
            tracing::warn!(image = %reference, error = %e, "removing the image failed");
        }
    }
    Ok(Some((wanted, plan)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(reference: &str, id: &str, size: u64) -> Image {
        Image {
            reference: reference.into(),
            id: id.into(),
            digest: format!("sha256:{id}"),
            size,
        }
    }

    #[test]
    fn frees_from_the_high_threshold_down_to_the_low_one() {
        let p = Policy::default();
        assert_eq!(bytes_to_free(&p, 16, 100), None, "84 % used");
        assert_eq!(bytes_to_free(&p, 15, 100), Some(5), "85 % used: back to 80 %");
        assert_eq!(bytes_to_free(&p, 0, 1000), Some(200));
        assert_eq!(bytes_to_free(&p, 0, 0), None);
        let off = Policy {
            high_threshold_percent: 100,
            ..p
        };
        assert_eq!(bytes_to_free(&off, 0, 100), None, "100 % turns GC off");
        let eager = Policy {
            high_threshold_percent: 1,
            low_threshold_percent: 0,
            minimum_age_seconds: 0,
        };
        assert_eq!(bytes_to_free(&eager, 990, 1000), Some(10));
        assert_eq!(bytes_to_free(&eager, 1000, 1000), None, "empty");
    }

    #[test]
    fn policies_validate_as_upstreams() {
        assert_eq!(Policy::default().validate(), Ok(()));
        let p = |high, low| Policy {
            high_threshold_percent: high,
            low_threshold_percent: low,
            minimum_age_seconds: 0,
        };
        assert_eq!(p(101, 0).validate(), Err(PolicyError::High(101)));
        assert_eq!(p(100, 101).validate(), Err(PolicyError::Low(101)));
        assert_eq!(
            p(80, 80).validate(),
            Err(PolicyError::Order { low: 80, high: 80 })
        );
        assert_eq!(p(100, 0).validate(), Ok(()));
    }

    #[test]
    fn least_recently_used_unused_old_enough_images_go_first() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let a = image("reg/a:1", "a", 100);
        let a2 = image("reg/a:latest", "a", 100);
        let b = image("reg/b:1", "b", 50);
        let c = image("reg/c:1", "c", 70);
        let d = image("reg/d:1", "d", 10);
        let used = |refs: &[&str]| refs.iter().map(|r| r.to_string()).collect::<BTreeSet<_>>();
        let mut t = Tracker::default();
        // a, b and c are seen at 0; b is used until 100, a until 50, c never; d appears at 250.
        t.observe(
            &[a.clone(), a2.clone(), b.clone(), c.clone()],
            &used(&["reg/a:1", "reg/b:1"]),
            at(0),
        );
        t.observe(
            &[a.clone(), a2.clone(), b.clone(), c.clone()],
            &used(&["reg/a:latest", "reg/b:1"]),
            at(50),
        );
        t.observe(
            &[a.clone(), a2.clone(), b.clone(), c.clone()],
            &used(&["reg/b:1"]),
            at(100),
        );
        let all = [a.clone(), a2.clone(), b.clone(), c.clone(), d.clone()];
        t.observe(&all, &used(&[]), at(250));
        let min_age = Duration::from_secs(120);
        // c (never used) first, then a (both references, counted once), then b; d is too young.
        let p = t.plan(&all, &used(&[]), 1, min_age, at(300));
        assert_eq!(
            p,
            Plan {
                remove: vec!["reg/c:1".into()],
                freed: 70
            }
        );
        let p = t.plan(&all, &used(&[]), 150, min_age, at(300));
        assert_eq!(
            p,
            Plan {
                remove: vec!["reg/c:1".into(), "reg/a:1".into(), "reg/a:latest".into()],
                freed: 170
            }
        );
        let p = t.plan(&all, &used(&[]), 10_000, min_age, at(300));
        assert_eq!(p.freed, 220, "d is younger than the minimum age");
        assert_eq!(
            shortfall(10_000, p.freed),
            "Failed to garbage collect required amount of images. Attempted to free 10000 bytes, but only found 220 bytes eligible to free."
        );
        // An image in use by any reference is kept whole.
        let p = t.plan(&all, &used(&["reg/a:latest"]), 10_000, min_age, at(300));
        assert_eq!(p.remove, vec!["reg/c:1".to_string(), "reg/b:1".to_string()]);
        // Removed images are forgotten.
        t.observe(std::slice::from_ref(&d), &used(&[]), at(400));
        assert_eq!(t.records.len(), 1);
    }
}
