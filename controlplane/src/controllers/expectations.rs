//! Expectations: the pods a controller created or deleted that its cache has not shown yet, so a
//! slow cache never makes it create (or delete) twice. Kept by name for creations and by uid for
//! deletions, checked against the cache at each reconcile, forgotten after 5 minutes (upstream's
//! `ExpectationsTimeout`) in case a notification never comes.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unfulfilled expectation is kept.
pub const TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
struct Pending {
    creates: HashMap<String, Instant>,
    deletes: HashMap<String, Instant>,
}

/// What is still in flight for one owner.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outstanding {
    /// Created, not yet in the cache.
    pub creates: usize,
    /// Deleted, still active in the cache (their uids).
    pub deletes: HashSet<String>,
}

/// Expectations of one controller, keyed by owner uid.
#[derive(Debug, Default)]
pub struct Expectations {
    owners: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    /// `owner` created `name`.
    pub fn created(&self, owner: &str, name: &str) {
        let mut o = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        o.entry(owner.into())
            .or_default()
            .creates
            .insert(name.into(), Instant::now());
    }

    /// `owner` deleted the pod `uid`.
    pub fn deleted(&self, owner: &str, uid: &str) {
        let mut o = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        o.entry(owner.into())
            .or_default()
            .deletes
            .insert(uid.into(), Instant::now());
    }

    /// The delete of `uid` by `owner` failed: nothing to wait for (upstream lowers the
    /// expectation the same way), else the pod would count as going for five minutes.
    pub fn delete_failed(&self, owner: &str, uid: &str) {
        let mut o = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = o.get_mut(owner) {
            p.deletes.remove(uid);
        }
    }

    /// What is outstanding for `owner`, given the names the cache has (in any state) and the
    /// uids of the pods the cache still holds as active. Fulfilled and expired expectations are
    /// dropped.
    pub fn outstanding(
        &self,
        owner: &str,
        cached_names: &HashSet<&str>,
        active_uids: &HashSet<&str>,
    ) -> Outstanding {
        let mut o = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        let Some(p) = o.get_mut(owner) else {
            return Outstanding::default();
        };
        let now = Instant::now();
        p.creates
            .retain(|name, at| !cached_names.contains(name.as_str()) && now.duration_since(*at) < TIMEOUT);
        p.deletes
            .retain(|uid, at| active_uids.contains(uid.as_str()) && now.duration_since(*at) < TIMEOUT);
        let out = Outstanding {
            creates: p.creates.len(),
            deletes: p.deletes.keys().cloned().collect(),
        };
        if p.creates.is_empty() && p.deletes.is_empty() {
            o.remove(owner);
        }
        out
    }

    /// The owner is gone.
    pub fn forget(&self, owner: &str) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creations_count_until_the_cache_shows_them() {
        let e = Expectations::default();
        e.created("rs", "web-a");
        e.created("rs", "web-b");
        let none = HashSet::new();
        assert_eq!(e.outstanding("rs", &none, &none).creates, 2);
        let seen: HashSet<&str> = ["web-a"].into();
        assert_eq!(e.outstanding("rs", &seen, &none).creates, 1);
        let both: HashSet<&str> = ["web-a", "web-b"].into();
        assert_eq!(e.outstanding("rs", &both, &none), Outstanding::default());
    }

    #[test]
    fn deletions_count_while_the_pod_is_still_active() {
        let e = Expectations::default();
        e.deleted("rs", "u1");
        let active: HashSet<&str> = ["u1", "u2"].into();
        let out = e.outstanding("rs", &HashSet::new(), &active);
        assert!(out.deletes.contains("u1"));
        let gone: HashSet<&str> = ["u2"].into();
        assert!(e.outstanding("rs", &HashSet::new(), &gone).deletes.is_empty());
        // A failed delete is not waited for.
        e.deleted("rs", "u2");
        e.delete_failed("rs", "u2");
        assert!(e.outstanding("rs", &HashSet::new(), &active).deletes.is_empty());
    }
}
