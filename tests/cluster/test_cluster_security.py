"""The cluster attacks of issue 29, each as a test: what a pod creator or anyone on the pod network could do
to the scheduler's ports, to bind and to its undo (docs/security.md, the cluster table)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.error
import urllib.request

import pytest
from fake_apiserver import gpu_container, pod
from test_cluster_extender import A0, Ext, bind_args, registered

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.model import ContainerDevice
from pyvgpu.cluster.scheduler.extender import Scheduler
from pyvgpu.cluster.scheduler.extender_server import Server
from pyvgpu.cluster.scheduler.informer import Informer


@pytest.fixture
def ext(kube, api):
    api.put_node(registered("node-a", [A0]))
    e = Ext(kube)
    e.synced(api)
    yield e
    e.close()


def _post(url: str, body, headers: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    ctx = ssl._create_unverified_context()
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx if url.startswith("https") else None) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _scheduler(kube) -> Scheduler:
    cfg = ClusterConfig()
    return Scheduler(kube, cfg, informer=Informer(kube, cfg, watch_s=5, retry_s=0.1))


# --- the ports -------------------------------------------------------------------------------------------


def test_the_extender_listens_on_localhost_unless_told_otherwise(kube):
    srv = Server(_scheduler(kube), 0)
    try:
        assert srv.httpd.server_address[0] == "127.0.0.1"
    finally:
        srv.httpd.server_close()


def test_an_exposed_extender_needs_a_token(kube, api, tmp_path):
    with pytest.raises(ValueError, match="token"):
        Server(_scheduler(kube), 0, host="0.0.0.0")
    tok = tmp_path / "token"
    tok.write_text("s3cret-token-0123456789\n")
    srv = Server(_scheduler(kube), 0, host="0.0.0.0", token_file=str(tok))
    srv.start()
    try:
        p = api.put_pod(pod("victim", [gpu_container()], namespace="other"))
        url = f"http://127.0.0.1:{srv.port}/bind"
        code, text = _post(url, bind_args(p, "node-a"))
        assert code == 403 and "token" in text
        code, _ = _post(url, bind_args(p, "node-a"), {"Authorization": "Bearer wrong-token-0123456789"})
        assert code == 403 and api.bindings == []
        code, _ = _post(url, bind_args(p, "node-a"), {"Authorization": "Bearer s3cret-token-0123456789"})
        assert code == 200
    finally:
        srv.stop()


def test_the_webhook_port_serves_the_webhook_but_not_the_extender_verbs(kube, api, tls_cert):
    srv = Server(_scheduler(kube), 0, tls_port=0, cert=str(tls_cert[0]), key=str(tls_cert[1]))
    srv.start()
    try:
        p = api.put_pod(pod("victim", [gpu_container()], namespace="other"))
        base = f"https://127.0.0.1:{srv.tls_port}"
        code, text = _post(f"{base}/bind", bind_args(p, "node-a"))
        assert code == 403 and api.bindings == []
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u1", "operation": "CREATE", "object": pod("x", [gpu_container()])}}
        code, text = _post(f"{base}/webhook", review)
        assert code == 200 and json.loads(text)["response"]["allowed"] is True
    finally:
        srv.stop()


def test_one_idle_connection_does_not_block_the_webhook(kube, tls_cert):
    """Before: the TLS handshake ran in the accept loop, and one silent TCP connection held every other."""
    srv = Server(_scheduler(kube), 0, tls_port=0, cert=str(tls_cert[0]), key=str(tls_cert[1]))
    srv.start()
    idle = socket.create_connection(("127.0.0.1", srv.tls_port))
    try:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u1", "operation": "CREATE", "object": pod("x", [gpu_container()])}}
        code, _ = _post(f"https://127.0.0.1:{srv.tls_port}/webhook", review, timeout=5)
        assert code == 200
    finally:
        idle.close()
        srv.stop()


# --- bind ------------------------------------------------------------------------------------------------


def test_bind_needs_the_pods_uid(ext, api):
    p = api.put_pod(pod("p", [gpu_container("main", 1, 1024)]))
    args = bind_args(p, "node-a")
    del args["PodUID"]
    r = ext.post("bind", args)
    assert "UID" in r["Error"] and api.bindings == []


def test_bind_refuses_a_pod_meant_for_another_scheduler(ext, api):
    p = api.put_pod(pod("other", [gpu_container("main", 1, 1024)], namespace="team-b", scheduler="default-scheduler"))
    r = ext.post("bind", bind_args(p, "node-a"))
    assert "default-scheduler" in r["Error"] and api.bindings == []
    assert keys.POD_NODE not in api.get_pod("team-b", "other")["metadata"]["annotations"]


def _running_on_a0(api, mem: int = 8192) -> dict:
    alloc = codec.encode_pod_devices(((ContainerDevice(A0, keys.DEVICE_TYPE, mem, 0),),))
    annos = {keys.POD_NODE: "node-a", keys.POD_ALLOCATED: alloc, keys.POD_TO_ALLOCATE: alloc,
             keys.POD_BIND_PHASE: keys.BIND_SUCCESS}
    return api.put_pod(pod("running", [gpu_container("main", 1, mem)], annotations=annos, node_name="node-a",
                           phase="Running"))


def test_bind_of_a_bound_pod_leaves_it_and_its_gpus_alone(ext, api):
    """Before: the Binding answered 409, the undo deleted the running pod's allocation, and its full 8 GiB
    GPU took a new 8 GiB pod."""
    running = _running_on_a0(api)
    before = dict(running["metadata"]["annotations"])
    r = ext.post("bind", bind_args(running, "node-a"))
    assert "already bound" in r["Error"]
    assert api.get_pod("default", "running")["metadata"]["annotations"] == before
    ext.synced(api)
    p = api.put_pod(pod("new", [gpu_container("main", 1, 8192)]))
    r = ext.post("bind", bind_args(p, "node-a"))
    assert "no longer fits" in r["Error"]


def test_a_slow_binding_that_landed_is_not_undone(ext, api):
    """The Binding landed but its answer did not come back (the client's timeout): the pod is bound, so
    its annotations stay (before: stripped, bind-phase failed, its GPUs counted free)."""
    p = api.put_pod(pod("slow", [gpu_container("main", 1, 1024)]))

    def lands_then_times_out(method, path):
        if method == "POST" and path.endswith("/binding"):
            with api.cond:
                obj = api.pods[("default", "slow")]
                obj["spec"]["nodeName"] = "node-a"
                api._bump("pod", "MODIFIED", obj)
            return 504, {"kind": "Status", "code": 504, "reason": "Timeout", "message": "the request timed out"}
        return None

    api.hooks.append(lands_then_times_out)
    r = ext.post("bind", bind_args(p, "node-a"))
    api.hooks.clear()
    assert r == {"Error": ""}  # the pod is bound: the bind answers success
    assert ext.s.metrics.bind_total.labels("bound")._value.get() == 1
    annos = api.get_pod("default", "slow")["metadata"]["annotations"]
    assert annos.get(keys.POD_NODE) == "node-a" and annos.get(keys.POD_BIND_PHASE) == keys.BIND_ALLOCATING
    assert annos.get(keys.POD_TO_ALLOCATE, "").startswith(A0)


def test_a_slow_binding_that_landed_and_was_allocated_is_a_success(ext, api):
    """As above, and the kubelet's Allocate ran before the undo read the pod: it rewrote POD_TO_ALLOCATE
    and bind-phase (before: not 'ours' any more, so the bind answered Error and sent a BindingFailed event
    for a pod bound to the node it chose)."""
    p = api.put_pod(pod("slow", [gpu_container("main", 1, 1024)]))

    def lands_is_allocated_then_times_out(method, path):
        if method == "POST" and path.endswith("/binding"):
            with api.cond:
                obj = api.pods[("default", "slow")]
                obj["spec"]["nodeName"] = "node-a"
                api._bump("pod", "MODIFIED", obj)
                obj["metadata"]["annotations"].update({keys.POD_TO_ALLOCATE: codec.encode_pod_devices(((),)),
                                                       keys.POD_BIND_PHASE: keys.BIND_SUCCESS})
                api._bump("pod", "MODIFIED", obj)
            return 504, {"kind": "Status", "code": 504, "reason": "Timeout", "message": "the request timed out"}
        return None

    api.hooks.append(lands_is_allocated_then_times_out)
    r = ext.post("bind", bind_args(p, "node-a"))
    api.hooks.clear()
    assert r == {"Error": ""}
    assert ext.s.metrics.bind_total.labels("bound")._value.get() == 1
    got = api.get_pod("default", "slow")
    annos = got["metadata"]["annotations"]
    assert got["spec"]["nodeName"] == "node-a" and annos[keys.POD_BIND_PHASE] == keys.BIND_SUCCESS
    assert annos[keys.POD_NODE] == "node-a" and annos[keys.POD_ALLOCATED].startswith(A0)


def test_many_concurrent_clients_are_not_reset(ext):
    """The listen backlog was 5: with 200 clients at once, some connections were reset."""
    errors: list[str] = []

    def one():
        try:
            with urllib.request.urlopen(f"{ext.base}/healthz", timeout=30) as r:
                r.read()
        except OSError as e:
            errors.append(repr(e))

    assert ext.srv.httpd.request_queue_size >= 128
    threads = [threading.Thread(target=one) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_charts_service_publishes_only_the_tls_port():
    """Before: the Service published the extender's plain HTTP port cluster-wide."""
    from test_cluster_chart import by_kind, container, one, render

    docs = render()
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["labels"].get("app.kubernetes.io/component")
               == "scheduler")
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["webhook"]
    ext = container(one(docs, "Deployment", "scheduler"), "extender")
    assert "--address" not in " ".join(ext["args"])  # the default: 127.0.0.1
    for probe in ("livenessProbe", "readinessProbe"):
        assert ext[probe]["httpGet"]["port"] == "webhook" and ext[probe]["httpGet"]["scheme"] == "HTTPS"
