//! The scheduler's cache of the cluster: every node with the pods bound (or assumed) to it and
//! their summed requests, used host ports and images; kept current from the pod and node watches
//! and from the scheduler's own decisions (a pod is *assumed* on its node as soon as it is chosen,
//! before the binding is written, so the next pod already sees it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Taint};
use kcore::labels::{Labels, NodeView, labels_of};
use kcore::resources::Resources;

use super::pod::{HostPort, PodInfo};

/// One node as the filters and scores see it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub labels: Labels,
    /// `(type, status)` of each condition, to tell a condition change from a heartbeat.
    conditions: Vec<(String, String)>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: Resources,
    pub allowed_pods: usize,
    /// Sum of the effective requests of the pods on the node.
    pub requested: Resources,
    /// The same with the 100m / 200 MiB defaults for missing requests (scores).
    pub nonzero_requested: Resources,
    pub pods: Vec<Arc<PodInfo>>,
    pub used_ports: Vec<HostPort>,
    /// Image name → size in bytes (from `status.images`).
    pub images: HashMap<String, i64>,
}

impl NodeInfo {
    fn new(node: Arc<Node>) -> Self {
        let mut info = Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: Labels::new(),
            conditions: Vec::new(),
            taints: Vec::new(),
            unschedulable: false,
            allocatable: Resources::default(),
            allowed_pods: 0,
            requested: Resources::default(),
            nonzero_requested: Resources::default(),
            pods: Vec::new(),
            used_ports: Vec::new(),
            images: HashMap::new(),
        };
        info.set_node(node);
        info
    }

    fn set_node(&mut self, node: Arc<Node>) {
        let spec = node.spec.as_ref();
        let status = node.status.as_ref();
        let alloc = status.and_then(|s| s.allocatable.as_ref());
        self.labels = labels_of(&node.metadata.labels).clone();
        self.taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
        self.unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        self.allocatable = Resources::from_list(alloc);
        self.allowed_pods = alloc
            .and_then(|a| a.get("pods"))
            .and_then(|q| kcore::quantity::bytes(&q.0))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        self.images = status
            .and_then(|s| s.images.as_ref())
            .into_iter()
            .flatten()
            .flat_map(|img| {
                let size = img.size_bytes.unwrap_or(0);
                img.names.iter().flatten().map(move |n| (n.clone(), size))
            })
            .collect();
        self.conditions = condition_states(&node);
    }

    /// The node as node affinity matches it. The object itself is not kept: in `bench
    /// scheduler` the 5,000 nodes' objects cost ~20 MB of the control plane's RSS.
    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            name: Some(&self.name),
            labels: &self.labels,
        }
    }

    fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.nonzero_requested.add(&pod.nonzero);
        self.used_ports.extend(pod.host_ports.iter().cloned());
        self.pods.push(pod);
    }

    fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| p.uid == uid)?;
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests);
        self.nonzero_requested.sub(&pod.nonzero);
        for hp in &pod.host_ports {
            if let Some(j) = self.used_ports.iter().position(|u| u == hp) {
                self.used_ports.swap_remove(j);
            }
        }
        Some(pod)
    }

    /// A copy of this node without the pods in `without` (preemption's what-if).
    pub fn without_pods(&self, without: &[&str]) -> NodeInfo {
        let mut copy = self.clone();
        for uid in without {
            copy.remove_pod(uid);
        }
        copy
    }

    /// A copy of this node with `pod` added (preemption's reprieve step).
    pub fn with_pod(&self, pod: Arc<PodInfo>) -> NodeInfo {
        let mut copy = self.clone();
        copy.add_pod(pod);
        copy
    }
}

/// What changed in a node update, for re-queueing pods that failed because of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeChange {
    pub added: bool,
    pub allocatable: bool,
    pub labels: bool,
    pub taints: bool,
    pub unschedulable: bool,
    /// Conditions changed, heartbeat times ignored.
    pub conditions: bool,
}

impl NodeChange {
    /// Whether anything a filter reads changed.
    pub fn any(&self) -> bool {
        self.added || self.allocatable || self.labels || self.taints || self.unschedulable || self.conditions
    }
}

fn condition_states(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect()
}

/// A pod's place in the cache.
#[derive(Debug, Clone)]
struct PodEntry {
    info: Arc<PodInfo>,
    node: String,
    /// Chosen by this scheduler, binding not yet seen through the watch.
    assumed: bool,
}

/// Nodes and the pods bound to them.
#[derive(Debug, Default)]
pub struct Cache {
    nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    /// Pods on nodes not (yet) known: kept until their node appears.
    orphans: HashMap<String, Vec<Arc<PodInfo>>>,
    pods: HashMap<String, PodEntry>,
    /// How many nodes have each image (image locality's spread).
    image_nodes: HashMap<String, usize>,
    /// Namespace labels (for `namespaceSelector` in affinity terms).
    namespaces: HashMap<String, Labels>,
    /// Placed pods with inter-pod (anti-)affinity terms: the affinity plugin visits only these
    /// when the incoming pod has none of its own.
    with_affinity: HashSet<String>,
}

impl Cache {
    /// Every node, in a stable order (the round-robin start of each cycle indexes it).
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|i| &self.nodes[*i])
    }

    /// How many nodes report `image`.
    pub fn image_node_count(&self, image: &str) -> usize {
        self.image_nodes.get(image).copied().unwrap_or(0)
    }

    /// The labels of namespace `ns`.
    pub fn namespace_labels(&self, ns: &str) -> Option<Labels> {
        self.namespaces.get(ns).cloned()
    }

    pub fn set_namespace(&mut self, name: String, labels: Labels) {
        self.namespaces.insert(name, labels);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// Adds `delta` to the node count of each of `images` (in `image_nodes`, a field of the
    /// cache, passed alone so that a node's own map can be read meanwhile).
    fn count_images(image_nodes: &mut HashMap<String, usize>, images: &HashMap<String, i64>, delta: isize) {
        for name in images.keys() {
            let e = image_nodes.entry(name.clone()).or_default();
            *e = e.saturating_add_signed(delta);
        }
        image_nodes.retain(|_, n| *n > 0);
    }

    /// Adds or updates a node; says what changed.
    pub fn upsert_node(&mut self, node: Arc<Node>) -> NodeChange {
        let name = node.metadata.name.clone().unwrap_or_default();
        match self.index.get(&name) {
            Some(&i) => {
                // What `set_node` replaces, taken out (rather than the whole NodeInfo copied with
                // its pods) to compare with what it sets.
                let info = &mut self.nodes[i];
                let labels = std::mem::take(&mut info.labels);
                let conditions = std::mem::take(&mut info.conditions);
                let taints = std::mem::take(&mut info.taints);
                let allocatable = std::mem::take(&mut info.allocatable);
                let images = std::mem::take(&mut info.images);
                let (unschedulable, allowed_pods) = (info.unschedulable, info.allowed_pods);
                info.set_node(node);
                let new = &self.nodes[i];
                Self::count_images(&mut self.image_nodes, &images, -1);
                Self::count_images(&mut self.image_nodes, &new.images, 1);
                NodeChange {
                    added: false,
                    allocatable: allocatable != new.allocatable || allowed_pods != new.allowed_pods,
                    labels: labels != new.labels,
                    taints: taints != new.taints,
                    unschedulable: unschedulable != new.unschedulable,
                    conditions: conditions != new.conditions,
                }
            }
            None => {
                let mut info = NodeInfo::new(node);
                for pod in self.orphans.remove(&name).unwrap_or_default() {
                    info.add_pod(pod);
                }
                Self::count_images(&mut self.image_nodes, &info.images, 1);
                self.index.insert(name, self.nodes.len());
                self.nodes.push(info);
                NodeChange {
                    added: true,
                    ..NodeChange::default()
                }
            }
        }
    }

    /// Removes a node (its pods stay known as orphans until they are deleted or it returns).
    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.index.remove(name) else { return };
        let info = self.nodes.swap_remove(i);
        if let Some(moved) = self.nodes.get(i) {
            self.index.insert(moved.name.clone(), i);
        }
        Self::count_images(&mut self.image_nodes, &info.images, -1);
        if !info.pods.is_empty() {
            self.orphans.insert(info.name, info.pods);
        }
    }

    /// Placed pods with affinity terms, with their nodes (nodes that are known only).
    pub fn placed_with_affinity(&self) -> impl Iterator<Item = (&Arc<PodInfo>, &NodeInfo)> {
        self.with_affinity.iter().filter_map(|uid| {
            let e = self.pods.get(uid)?;
            Some((&e.info, self.node(&e.node)?))
        })
    }

    /// Whether `uid` is in the cache (bound or assumed).
    pub fn has_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// Whether `uid` is assumed and not yet confirmed by the watch.
    pub fn is_assumed(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|p| p.assumed)
    }

    fn place(&mut self, info: Arc<PodInfo>, node: &str) {
        if info.has_affinity() {
            self.with_affinity.insert(info.uid.clone());
        }
        match self.index.get(node) {
            Some(&i) => self.nodes[i].add_pod(info),
            None => self.orphans.entry(node.to_string()).or_default().push(info),
        }
    }

    fn unplace(&mut self, uid: &str, node: &str) {
        self.with_affinity.remove(uid);
        match self.index.get(node) {
            Some(&i) => {
                self.nodes[i].remove_pod(uid);
            }
            None => {
                if let Some(list) = self.orphans.get_mut(node) {
                    list.retain(|p| p.uid != uid);
                    if list.is_empty() {
                        self.orphans.remove(node);
                    }
                }
            }
        }
    }

    /// Records a pod bound to `info.node_name` (from the watch). Finished pods hold nothing and
    /// are removed.
    pub fn set_bound_pod(&mut self, info: Arc<PodInfo>) {
        let Some(node) = info.node_name.clone() else {
            return;
        };
        self.remove_pod(&info.uid);
        if info.finished {
            return;
        }
        self.place(info.clone(), &node);
        self.pods.insert(
            info.uid.clone(),
            PodEntry {
                info,
                node,
                assumed: false,
            },
        );
    }

    /// Assumes `info` on `node` before its binding is written.
    pub fn assume(&mut self, info: Arc<PodInfo>, node: &str) {
        self.remove_pod(&info.uid);
        self.place(info.clone(), node);
        self.pods.insert(
            info.uid.clone(),
            PodEntry {
                info,
                node: node.to_string(),
                assumed: true,
            },
        );
    }

    /// Forgets a pod (deleted, finished, or an assumption whose binding failed).
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let entry = self.pods.remove(uid)?;
        self.unplace(uid, &entry.node);
        Some(entry.info)
    }

    /// The pod `uid` and its node.
    pub fn pod(&self, uid: &str) -> Option<(&Arc<PodInfo>, &str)> {
        self.pods.get(uid).map(|e| (&e.info, e.node.as_str()))
    }

    /// Every bound or assumed pod.
    pub fn pods(&self) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.pods.values().map(|e| &e.info)
    }

    /// Number of bound or assumed pods.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}

/// Pods nominated to nodes by preemption: their requests count on that node for pods of lower
/// or equal priority, so the room preemption made is not taken by others.
#[derive(Debug, Default)]
pub struct Nominations {
    by_node: BTreeMap<String, Vec<Arc<PodInfo>>>,
    node_of: HashMap<String, String>,
}

impl Nominations {
    pub fn set(&mut self, info: Arc<PodInfo>, node: &str) {
        self.remove(&info.uid);
        self.node_of.insert(info.uid.clone(), node.to_string());
        self.by_node.entry(node.to_string()).or_default().push(info);
    }

    pub fn remove(&mut self, uid: &str) {
        if let Some(node) = self.node_of.remove(uid)
            && let Some(list) = self.by_node.get_mut(&node)
        {
            list.retain(|p| p.uid != uid);
            if list.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    /// Pods nominated to `node` that outrank or equal `priority`, other than `uid`.
    pub fn on_node<'a>(
        &'a self,
        node: &str,
        priority: i32,
        uid: &'a str,
    ) -> impl Iterator<Item = &'a Arc<PodInfo>> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter(move |p| p.priority >= priority && p.uid != uid)
    }

    pub fn node_of(&self, uid: &str) -> Option<&str> {
        self.node_of.get(uid).map(String::as_str)
    }
}
