//! The garbage collector's owner graph and its decisions, free of I/O (upstream's
//! `GraphBuilder.processGraphChanges` and `attemptToDeleteItem`).
//!
//! Nodes are objects by uid: observed ones (seen by a monitor) and virtual ones (only named as
//! an owner; their existence is checked with a live GET). Each change to the graph yields the
//! work it causes: attempts to delete (an object whose owner went away, an owner waiting for
//! its dependents) and attempts to orphan (an owner with the `orphan` finalizer).

use std::collections::{HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The finalizers of the two cascading policies (set by the API on delete).
pub const ORPHAN: &str = "orphan";
pub const FOREGROUND: &str = "foregroundDeletion";

/// Where an object is: enough to GET, patch or delete it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
}

/// What a monitor saw of an object (its metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub id: Identity,
    pub owners: Vec<OwnerReference>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    /// The monitor it came from (for resyncs).
    pub monitor: usize,
}

impl Observed {
    fn has(&self, f: &str) -> bool {
        self.finalizers.iter().any(|x| x == f)
    }
    /// Terminating with `foregroundDeletion`: waits for its blocking dependents.
    pub fn deleting_dependents(&self) -> bool {
        self.deleting && self.has(FOREGROUND)
    }
    /// Terminating with `orphan`: its dependents lose their reference to it first.
    pub fn orphaning(&self) -> bool {
        self.deleting && self.has(ORPHAN)
    }
}

/// Work a graph change causes, by uid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    AttemptToDelete(String),
    AttemptToOrphan(String),
}

/// One node of the graph.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: Identity,
    /// None for a virtual node (only known as some object's owner).
    pub observed: Option<Observed>,
    pub dependents: HashSet<String>,
}

impl Node {
    pub fn deleting_dependents(&self) -> bool {
        self.observed.as_ref().is_some_and(Observed::deleting_dependents)
    }
}

/// The owner graph.
#[derive(Debug, Default)]
pub struct Graph {
    /// Boxed: the map's table has a slot for every object of the cluster plus spare ones; with
    /// `Node`s inline the table alone was 11.8 MB with 5,000 nodes and 10,000 pods (heaptrack
    /// on `bench scheduler`).
    pub nodes: HashMap<String, Box<Node>>,
}

/// The identity an owner reference names, seen from `dependent` (a namespaced owner lives in
/// its dependent's namespace; `namespaced` tells whether the owner's kind is namespaced).
pub fn owner_identity(r: &OwnerReference, dependent: &Identity, namespaced: bool) -> Identity {
    Identity {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: if namespaced {
            dependent.namespace.clone()
        } else {
            None
        },
        name: r.name.clone(),
        uid: r.uid.clone(),
    }
}

/// Whether a dependent (namespaced or not) can name an owner of that scope: a namespaced
/// dependent may have namespaced (same namespace) or cluster-scoped owners, a cluster-scoped
/// one only cluster-scoped owners.
pub fn resolvable(dependent_namespaced: bool, owner_namespaced: bool) -> bool {
    dependent_namespaced || !owner_namespaced
}

fn blocks(r: &OwnerReference) -> bool {
    r.block_owner_deletion == Some(true)
}

impl Graph {
    /// An object was added or changed. `namespaced(api_version, kind)` tells the scope of an
    /// owner's kind.
    pub fn upsert(&mut self, obj: Observed, namespaced: impl Fn(&str, &str) -> bool) -> Vec<Work> {
        let uid = obj.id.uid.clone();
        let mut work = Vec::new();
        let old = self.nodes.get(&uid).and_then(|n| n.observed.clone());
        let old_refs: HashMap<&str, &OwnerReference> = old
            .as_ref()
            .map(|o| o.owners.iter().map(|r| (r.uid.as_str(), r)).collect())
            .unwrap_or_default();
        let new_refs: HashMap<&str, &OwnerReference> =
            obj.owners.iter().map(|r| (r.uid.as_str(), r)).collect();
        // Owners no longer referenced, or no longer blocked on: one waiting for its dependents
        // may be done.
        let mut released = Vec::new();
        for (owner, r) in &old_refs {
            match new_refs.get(owner) {
                None => released.push((owner.to_string(), true)),
                Some(n) if blocks(r) && !blocks(n) => released.push((owner.to_string(), false)),
                Some(_) => {}
            }
        }
        let mut added = Vec::new();
        for (owner, r) in &new_refs {
            if !old_refs.contains_key(owner) {
                added.push(owner_identity(r, &obj.id, namespaced(&r.api_version, &r.kind)));
            }
        }
        let (was_deleting_dependents, was_orphaning) = old
            .as_ref()
            .map_or((false, false), |o| (o.deleting_dependents(), o.orphaning()));
        let now_deleting_dependents = obj.deleting_dependents();
        let now_orphaning = obj.orphaning();
        let node = self.nodes.entry(uid.clone()).or_insert_with(|| {
            Box::new(Node {
                id: obj.id.clone(),
                observed: None,
                dependents: HashSet::new(),
            })
        });
        node.id = obj.id.clone();
        node.observed = Some(obj);
        for (owner, unlink) in released {
            if let Some(o) = self.nodes.get_mut(&owner) {
                if unlink {
                    o.dependents.remove(&uid);
                }
                if o.deleting_dependents() {
                    work.push(Work::AttemptToDelete(owner));
                }
            }
        }
        for owner in added {
            let ouid = owner.uid.clone();
            let o = self.nodes.entry(ouid.clone()).or_insert_with(|| {
                // Not seen yet: a virtual node, whose existence a worker checks.
                work.push(Work::AttemptToDelete(ouid.clone()));
                Box::new(Node {
                    id: owner,
                    observed: None,
                    dependents: HashSet::new(),
                })
            });
            o.dependents.insert(uid.clone());
        }
        if now_orphaning && !was_orphaning {
            work.push(Work::AttemptToOrphan(uid.clone()));
        }
        if now_deleting_dependents && !was_deleting_dependents {
            if let Some(n) = self.nodes.get(&uid) {
                let mut deps: Vec<&String> = n.dependents.iter().collect();
                deps.sort();
                work.extend(deps.into_iter().map(|d| Work::AttemptToDelete(d.clone())));
            }
            work.push(Work::AttemptToDelete(uid));
        }
        work
    }

    /// An object is gone (observed, or a virtual node found missing): its dependents may be
    /// garbage now, and an owner waiting for it may be done.
    pub fn remove(&mut self, uid: &str) -> Vec<Work> {
        let Some(node) = self.nodes.remove(uid) else {
            return Vec::new();
        };
        let mut work: Vec<Work> = {
            let mut deps: Vec<&String> = node.dependents.iter().collect();
            deps.sort();
            deps.into_iter()
                .map(|d| Work::AttemptToDelete(d.clone()))
                .collect()
        };
        for r in node.observed.iter().flat_map(|o| o.owners.iter()) {
            if let Some(o) = self.nodes.get_mut(&r.uid) {
                o.dependents.remove(uid);
                if o.deleting_dependents() {
                    work.push(Work::AttemptToDelete(r.uid.clone()));
                }
                if o.observed.is_none() && o.dependents.is_empty() {
                    self.nodes.remove(&r.uid);
                }
            }
        }
        // Dependents that still name it keep a virtual node for it.
        if !node.dependents.is_empty() {
            let Node { id, dependents, .. } = *node;
            self.nodes.insert(
                uid.to_string(),
                Box::new(Node {
                    id,
                    observed: None,
                    dependents,
                }),
            );
        }
        work
    }

    /// A monitor relisted: its observed objects not in `seen` are gone.
    pub fn resync(&mut self, monitor: usize, seen: &HashSet<String>) -> Vec<Work> {
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|(uid, n)| {
                n.observed.as_ref().is_some_and(|o| o.monitor == monitor) && !seen.contains(*uid)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        gone.iter().flat_map(|uid| self.remove(uid)).collect()
    }

    /// The dependents of `uid` that block its deletion (their reference to it has
    /// `blockOwnerDeletion: true`), with whether each is itself waiting for its dependents.
    pub fn blocking_dependents(&self, uid: &str) -> Vec<(String, bool)> {
        let Some(n) = self.nodes.get(uid) else {
            return Vec::new();
        };
        let mut out: Vec<(String, bool)> = n
            .dependents
            .iter()
            .filter_map(|d| {
                let dep = self.nodes.get(d)?;
                let o = dep.observed.as_ref()?;
                o.owners
                    .iter()
                    .any(|r| r.uid == uid && blocks(r))
                    .then(|| (d.clone(), o.deleting_dependents()))
            })
            .collect();
        out.sort();
        out
    }
}

/// What an owner reference points at, as the collector verified it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// Exists with that uid and is not waiting for its dependents.
    Solid,
    /// Missing, or a different object (uid mismatch) now has that name.
    Dangling,
    /// Exists and is being deleted in the foreground.
    WaitingForDependents,
}

/// The item an attempt to delete looks at (its latest state).
#[derive(Debug, Clone, Default)]
pub struct Item {
    pub deleting: bool,
    pub finalizers: Vec<String>,
    /// Uids of its dependents in the graph, with whether each waits for its own dependents.
    pub dependents: Vec<(String, bool)>,
    /// Its blocking dependents (see [`Graph::blocking_dependents`]).
    pub blocking: Vec<(String, bool)>,
}

/// The propagation policy of a delete the collector sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Background,
    Foreground,
    Orphan,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Background => "Background",
            Policy::Foreground => "Foreground",
            Policy::Orphan => "Orphan",
        }
    }
}

/// What to do with an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Nothing,
    /// Its blocking dependents are gone: remove `foregroundDeletion`.
    RemoveForegroundFinalizer,
    /// Still waiting: these blocking dependents must be deleted first.
    DeleteDependents(Vec<String>),
    /// It keeps a solid owner: drop the references to these (dangling or waiting) owners.
    RemoveOwnerReferences(Vec<String>),
    /// No solid owner left: delete it (first setting `blockOwnerDeletion: false` on its
    /// references when `unblock`, to break a cycle of foreground deletions).
    Delete {
        policy: Policy,
        unblock: bool,
    },
}

/// Upstream's `attemptToDeleteItem` over the item's latest state and its classified owner
/// references (`(owner uid, state)`, in reference order).
pub fn attempt_to_delete(item: &Item, owners: &[(String, OwnerState)]) -> Decision {
    let has = |f: &str| item.finalizers.iter().any(|x| x == f);
    if item.deleting {
        if !has(FOREGROUND) {
            // A one-way trip: its dependents are handled when it is gone.
            return Decision::Nothing;
        }
        if item.blocking.is_empty() {
            return Decision::RemoveForegroundFinalizer;
        }
        let pending: Vec<String> = item
            .blocking
            .iter()
            .filter(|(_, waiting)| !waiting)
            .map(|(uid, _)| uid.clone())
            .collect();
        return if pending.is_empty() {
            Decision::Nothing
        } else {
            Decision::DeleteDependents(pending)
        };
    }
    if owners.is_empty() {
        return Decision::Nothing;
    }
    let of = |s: OwnerState| -> Vec<String> {
        owners
            .iter()
            .filter(|(_, st)| *st == s)
            .map(|(u, _)| u.clone())
            .collect()
    };
    let solid = of(OwnerState::Solid);
    let dangling = of(OwnerState::Dangling);
    let waiting = of(OwnerState::WaitingForDependents);
    if !solid.is_empty() {
        if dangling.is_empty() && waiting.is_empty() {
            return Decision::Nothing;
        }
        return Decision::RemoveOwnerReferences(dangling.into_iter().chain(waiting).collect());
    }
    if !waiting.is_empty() && !item.dependents.is_empty() {
        // One of its dependents waiting for its own dependents is (probably) a cycle: unblock
        // this item's references so the owner is not held by it.
        let unblock = item.dependents.iter().any(|(_, w)| *w);
        return Decision::Delete {
            policy: Policy::Foreground,
            unblock,
        };
    }
    let policy = if has(ORPHAN) {
        Policy::Orphan
    } else if has(FOREGROUND) {
        Policy::Foreground
    } else {
        Policy::Background
    };
    Decision::Delete {
        policy,
        unblock: false,
    }
}

/// The owner references left after dropping those to `uids`.
pub fn without_owners(refs: &[OwnerReference], uids: &[String]) -> Vec<OwnerReference> {
    refs.iter().filter(|r| !uids.contains(&r.uid)).cloned().collect()
}

/// The owner references with `blockOwnerDeletion` turned off.
pub fn unblocked(refs: &[OwnerReference]) -> Vec<OwnerReference> {
    refs.iter()
        .cloned()
        .map(|mut r| {
            if r.block_owner_deletion == Some(true) {
                r.block_owner_deletion = Some(false);
            }
            r
        })
        .collect()
}
