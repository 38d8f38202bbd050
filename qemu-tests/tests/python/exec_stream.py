"""The official Kubernetes Python client's exec streams against a pod on a node: WebSocket with
the client's default offer (v5.channel.k8s.io, then v4) and with v4 only (what its releases
before v5 support send). Usage: exec_stream.py KUBECONFIG POD. Prints "python-exec: ok"."""

import sys

from kubernetes import client, config
from kubernetes.stream import stream


def main(kubeconfig: str, pod: str) -> None:
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()

    out = stream(v1.connect_get_namespaced_pod_exec, pod, "default",
                 command=["sh", "-c", "echo py-out; echo py-err >&2"],
                 stderr=True, stdin=False, stdout=True, tty=False)
    assert "py-out" in out and "py-err" in out, repr(out)

    for protocol in (None, "v4.channel.k8s.io"):
        headers = {"sec-websocket-protocol": protocol} if protocol else None
        resp = stream(v1.connect_get_namespaced_pod_exec, pod, "default",
                      command=["sh", "-c", "read line; echo got-$line; exit 7"],
                      stderr=True, stdin=True, stdout=True, tty=False,
                      _preload_content=False, _headers=headers)
        resp.write_stdin("hello\n")
        resp.run_forever(timeout=60)
        got = resp.read_stdout()
        assert "got-hello" in got, (protocol, got)
        assert resp.returncode == 7, (protocol, resp.returncode)
        want = protocol or "v5.channel.k8s.io"
        assert resp.subprotocol == want, (protocol, resp.subprotocol)
        resp.close()
    print("python-exec: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
