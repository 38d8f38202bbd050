//! Node-side admission (docs/SEEDS-SPEC.md NODE-12, NODE-13): before a new pod runs, the agent
//! re-checks what the scheduler checked, because pods bound by hand skip the scheduler. A pod
//! that fails is put in the terminal phase `Failed` with the kubelet's reason and message and is
//! never run. Pods the runtime already runs (after an agent restart) are not checked again:
//! restarting the agent never rejects a running pod.
//!
//! Checked: nodeSelector and required node affinity, cpu/memory/ephemeral-storage requests and
//! the pod count against allocatable, host ports, NoExecute taints.

use k8s_openapi::api::core::v1::{Node, Pod, Taint};

/// Why the node refused a pod: `status.reason` and `status.message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

fn predicate(name: &str, why: &str) -> Rejection {
    Rejection {
        reason: name.into(),
        message: format!("Pod was rejected: Predicate {name} failed: {why}"),
    }
}

fn host_ports(pod: &Pod) -> Vec<(String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let hp = p.host_port.filter(|h| *h > 0)?;
            Some((p.protocol.clone().unwrap_or_else(|| "TCP".into()), hp))
        })
        .collect()
}

/// Whether `node` admits `pod` next to the pods it already `admitted` (terminal pods excluded
/// by the caller).
pub fn admit(pod: &Pod, node: &Node, admitted: &[&Pod]) -> Result<(), Rejection> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    if !kcore::labels::node_matches_pod(spec, node) {
        return Err(predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    let taints: &[Taint] = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if let Some(taint) = kcore::taints::first_untolerated(taints, tolerations, &["NoExecute"]) {
        return Err(predicate(
            "TaintToleration",
            &format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or_default()
            ),
        ));
    }
    let mine = host_ports(pod);
    if !mine.is_empty() {
        let taken: Vec<(String, i32)> = admitted.iter().flat_map(|p| host_ports(p)).collect();
        if mine.iter().any(|p| taken.contains(p)) {
            return Err(predicate(
                "NodePorts",
                "node(s) didn't have free ports for the requested pod ports",
            ));
        }
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let capacity = kcore::resources::Resources::from_list(allocatable);
    let max_pods = allocatable
        .and_then(|a| a.get("pods"))
        .and_then(|q| q.0.parse::<u64>().ok());
    let want = kcore::resources::pod_requests(spec);
    let mut used = kcore::resources::Resources::default();
    for p in admitted {
        if let Some(s) = &p.spec {
            used.add(&kcore::resources::pod_requests(s));
        }
    }
    let short = |name: &str, requested: u64, used: u64, cap: u64| Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {cap}"
        ),
    };
    if let Some(max) = max_pods
        && admitted.len() as u64 + 1 > max
    {
        return Err(short("pods", 1, admitted.len() as u64, max));
    }
    if allocatable.is_none() {
        return Ok(());
    }
    for (name, w, u, c) in [
        ("cpu", want.milli_cpu, used.milli_cpu, capacity.milli_cpu),
        ("memory", want.memory, used.memory, capacity.memory),
        (
            "ephemeral-storage",
            want.ephemeral_storage,
            used.ephemeral_storage,
            capacity.ephemeral_storage,
        ),
    ] {
        // A resource the node does not report (0) is not checked, as upstream skips it.
        if w > 0 && c > 0 && u.saturating_add(w) > c {
            return Err(short(name, w, u, c));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"disk": "ssd", "kubernetes.io/hostname": "n1"}},
            "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "3"}},
        }))
        .expect("node")
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "main", "image": "busybox",
            "resources": spec.get("requests").map(|r| json!({"requests": r})).unwrap_or(json!({})),
            "ports": spec.get("hostPort").map(|p| json!([{"containerPort": 80, "hostPort": p}])).unwrap_or(json!([]))}]);
        if let Some(o) = spec.as_object_mut() {
            o.remove("requests");
            o.remove("hostPort");
        }
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    #[test]
    fn rejections_have_the_kubelets_reasons_and_messages() {
        let running = [pod(
            json!({"requests": {"cpu": "1500m", "memory": "512Mi"}, "hostPort": 8080}),
        )];
        let admitted: Vec<&Pod> = running.iter().collect();
        let n = node();
        let table = [
            ("fits", json!({"requests": {"cpu": "500m"}}), None),
            (
                "a NoSchedule taint does not reject (NODE-12)",
                json!({"nodeSelector": {"disk": "ssd"}}),
                None,
            ),
            (
                "nodeSelector",
                json!({"nodeSelector": {"disk": "hdd"}}),
                Some((
                    "NodeAffinity",
                    "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
                )),
            ),
            (
                "required node affinity",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}]}}}}),
                Some((
                    "NodeAffinity",
                    "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
                )),
            ),
            (
                "cpu",
                json!({"requests": {"cpu": "1"}}),
                Some((
                    "OutOfcpu",
                    "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000",
                )),
            ),
            (
                "memory",
                json!({"requests": {"memory": "600Mi"}}),
                Some((
                    "OutOfmemory",
                    "Pod was rejected: Node didn't have enough resource: memory, requested: 629145600, used: 536870912, capacity: 1073741824",
                )),
            ),
            (
                "host port",
                json!({"hostPort": 8080}),
                Some((
                    "NodePorts",
                    "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
                )),
            ),
        ];
        for (what, spec, want) in table {
            let got = admit(&pod(spec), &n, &admitted);
            let want = want.map(|(r, m)| Rejection {
                reason: r.into(),
                message: m.into(),
            });
            assert_eq!(got.err(), want, "{what}");
        }
        let full: Vec<Pod> = (0..3).map(|_| pod(json!({}))).collect();
        let full: Vec<&Pod> = full.iter().collect();
        assert_eq!(
            admit(&pod(json!({})), &n, &full).err().map(|r| r.message),
            Some("Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3".into())
        );
    }

    #[test]
    fn no_execute_taints_need_a_toleration() {
        let mut n = node();
        n.spec.get_or_insert_default().taints = Some(vec![Taint {
            key: "node.kubernetes.io/unreachable".into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        }]);
        let plain = pod(json!({}));
        assert_eq!(
            admit(&plain, &n, &[]).err().map(|r| (r.reason, r.message)),
            Some((
                "TaintToleration".into(),
                "Pod was rejected: Predicate TaintToleration failed: node(s) had untolerated taint {node.kubernetes.io/unreachable: }".into()
            ))
        );
        let tolerant = pod(
            json!({"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]}),
        );
        assert_eq!(admit(&tolerant, &n, &[]), Ok(()));
        let everything = pod(json!({"tolerations": [{"operator": "Exists"}]}));
        assert_eq!(admit(&everything, &n, &[]), Ok(()));
    }
}
