//! What the scheduler's caches keep of each object: the fields its filters, scores and reports
//! read. managedFields, container commands, env, probes, volumes, most of the status and pod
//! templates are dropped as objects arrive, so 10,000 cached pods do not cost their whole objects
//! (upstream's scheduler strips managedFields the same way).

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Service};

/// Any object: managedFields and the last-applied annotation.
pub fn meta<K: kube::Resource>(o: &mut K) {
    let m = o.meta_mut();
    m.managed_fields = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

pub fn pod(p: &mut Pod) {
    meta(p);
    if let Some(spec) = p.spec.as_mut() {
        unread_pod_spec(spec);
    }
    if let Some(st) = p.status.as_mut() {
        st.container_statuses = None;
        st.init_container_statuses = None;
        st.ephemeral_container_statuses = None;
        if let Some(c) = st.conditions.as_mut() {
            c.retain(|c| c.type_ == "PodScheduled");
        }
    }
}

/// The parts of a pod's spec that the scheduler does not read: volumes, ephemeral containers,
/// and the containers' commands, env, mounts, probes, hooks and security contexts (the
/// controllers' pod cache drops the containers altogether).
fn unread_pod_spec(spec: &mut PodSpec) {
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        c.command = None;
        c.args = None;
        c.env = None;
        c.env_from = None;
        c.volume_mounts = None;
        c.volume_devices = None;
        c.liveness_probe = None;
        c.readiness_probe = None;
        c.startup_probe = None;
        c.lifecycle = None;
        c.security_context = None;
        c.working_dir = None;
    }
    spec.ephemeral_containers = None;
    spec.volumes = None;
}

pub fn node(n: &mut Node) {
    meta(n);
    if let Some(st) = n.status.as_mut() {
        st.node_info = None;
        st.volumes_attached = None;
        st.volumes_in_use = None;
        st.config = None;
    }
}

pub fn service(s: &mut Service) {
    meta(s);
    s.status = None;
}

pub fn replica_set(r: &mut ReplicaSet) {
    meta(r);
    if let Some(spec) = r.spec.as_mut() {
        spec.template = None;
    }
    r.status = None;
}

pub fn stateful_set(r: &mut StatefulSet) {
    meta(r);
    if let Some(spec) = r.spec.as_mut() {
        spec.template = Default::default();
        spec.volume_claim_templates = None;
    }
    r.status = None;
}
