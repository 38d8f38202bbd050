"""The official Kubernetes Python client against our API server: list, create, patch, watch,
delete. Usage: client_smoke.py KUBECONFIG. Prints "python-client: ok" on success."""

import sys
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def main(kubeconfig: str) -> None:
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()
    apps = client.AppsV1Api()

    names = sorted(ns.metadata.name for ns in v1.list_namespace().items)
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"], names

    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py", labels={"from": "python"}), data={"a": "1"})
    created = v1.create_namespaced_config_map("default", cm)
    assert created.metadata.uid and created.metadata.resource_version, created.metadata

    patched = v1.patch_namespaced_config_map("py", "default", {"data": {"b": "2"}, "metadata": {"labels": {"x": "y"}}})
    assert patched.data == {"a": "1", "b": "2"}, patched.data
    assert patched.metadata.labels == {"from": "python", "x": "y"}, patched.metadata.labels

    try:
        v1.create_namespaced_config_map("default", cm)
        raise AssertionError("duplicate create succeeded")
    except ApiException as e:
        assert e.status == 409, e.status

    # Watch from the list's resourceVersion: a create and a delete made meanwhile arrive in order.
    rv = v1.list_namespaced_config_map("default", label_selector="from=python").metadata.resource_version
    seen = []

    def watcher():
        w = watch.Watch()
        for ev in w.stream(v1.list_namespaced_config_map, "default", label_selector="from=python",
                           resource_version=rv, timeout_seconds=10):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 2:
                w.stop()

    t = threading.Thread(target=watcher)
    t.start()
    time.sleep(1)
    cm2 = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py2", labels={"from": "python"}))
    v1.create_namespaced_config_map("default", cm2)
    v1.delete_namespaced_config_map("py2", "default")
    t.join(15)
    assert seen == [("ADDED", "py2"), ("DELETED", "py2")], seen

    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="pyweb"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "pyweb"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "pyweb"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx:1.27")]),
            ),
        ),
    )
    apps.create_namespaced_deployment("default", dep)
    apps.patch_namespaced_deployment_scale("pyweb", "default", {"spec": {"replicas": 4}})
    assert apps.read_namespaced_deployment("pyweb", "default").spec.replicas == 4

    v1.delete_namespaced_config_map("py", "default")
    try:
        v1.read_namespaced_config_map("py", "default")
        raise AssertionError("read after delete succeeded")
    except ApiException as e:
        assert e.status == 404, e.status
    print("python-client: ok")


if __name__ == "__main__":
    main(sys.argv[1])
