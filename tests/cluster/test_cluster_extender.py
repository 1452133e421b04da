"""The scheduler extender over HTTP, with request bodies shaped as kube-scheduler sends them.

kube-scheduler marshals k8s.io/kube-scheduler/extender/v1 types, which have no JSON tags: the keys are
the Go field names, nil pointers are null (pkg/scheduler/extender.go: HTTPExtender.Filter, Prioritize,
Bind, send). The API calls go through the official client to the test API server.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request

import pytest
from fake_apiserver import gpu_container, node, pod

from pyvgpu.cluster.api.kube import Kube
from pyvgpu.cluster.api.nodelock import lock_value
from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.model import DeviceInfo
from pyvgpu.cluster.scheduler.extender import Scheduler
from pyvgpu.cluster.scheduler.extender_server import Server
from pyvgpu.cluster.scheduler.informer import Informer

A0, A1 = "GPU-a0", "GPU-a1"
B0 = "GPU-b0"


def registered(name: str, uuids: list[str], mem: int = 8192) -> dict:
    devs = [DeviceInfo(u, i, 10, mem, 100, "NVIDIA Fake", 0, "hami-core", True) for i, u in enumerate(uuids)]
    return node(name, {keys.NODE_REGISTER: codec.encode_register(devs)}, {"nvidia.com/gpu": str(10 * len(uuids))})


class Ext:
    """A scheduler with its cache started and its HTTP server on a free port."""

    def __init__(self, kube: Kube, name: str = "pyvgpu-scheduler", lock_expire_s: float = 300.0):
        self.stop = threading.Event()
        cfg = ClusterConfig()
        self.s = Scheduler(kube, cfg, name, lock_expire_s, informer=Informer(kube, cfg, watch_s=5, retry_s=0.1))
        self.s.start(self.stop)
        self.srv = Server(self.s, 0, host="127.0.0.1")
        self.srv.start()
        self.base = f"http://127.0.0.1:{self.srv.port}"

    def close(self):
        self.stop.set()
        self.srv.stop()

    def post(self, verb: str, body) -> dict:
        req = urllib.request.Request(f"{self.base}/{verb}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
            return json.loads(r.read())

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"{self.base}{path}", timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def synced(self, api):
        """Wait until the cache is ready and reflects every change the API server has made."""
        import time

        assert self.s.informer.ready.wait(20)
        with api.cond:
            want = {kind: max([rv for rv, k, _, _ in api.events if k == kind], default=0) for kind in ("node", "pod")}
        inf = self.s.informer
        end = time.monotonic() + 20
        with inf.lock:
            while any(inf.seen[k] < v for k, v in want.items()):
                assert time.monotonic() < end, f"the cache did not catch up: {inf.seen} < {want}"
                inf.changed.wait(0.1)


@pytest.fixture
def ext(kube, api):
    api.put_node(registered("node-a", [A0, A1]))
    api.put_node(registered("node-b", [B0]))
    e = Ext(kube)
    e.synced(api)
    yield e
    e.close()


def filter_args(p: dict, names=("node-a", "node-b")) -> dict:
    return {"Pod": p, "Nodes": None, "NodeNames": list(names)}


def bind_args(p: dict, node_name: str) -> dict:
    m = p["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node_name}


# --- filter and prioritize ---------------------------------------------------------------------------------

def test_filter_returns_every_feasible_node_ranked_and_why_not_for_the_others(ext, api):
    p = api.put_pod(pod("small", [gpu_container("main", 1, 4096, 30)]))
    r = ext.post("filter", filter_args(p))
    assert r["Error"] == "" and r["Nodes"] is None
    assert sorted(r["NodeNames"]) == ["node-a", "node-b"] and r["FailedNodes"] == {}
    two = api.put_pod(pod("two", [gpu_container("main", 2, 4096, 30)]))
    r = ext.post("filter", filter_args(two))
    assert r["NodeNames"] == ["node-a"]
    assert "node-b" in r["FailedNodes"] and "2 needed" in r["FailedNodes"]["node-b"]


def test_filter_with_whole_nodes_when_not_node_cache_capable(ext, api):
    p = api.put_pod(pod("p", [gpu_container("main", 2, 1024)]))
    nodes = {"metadata": {}, "items": [api.get_node("node-a"), api.get_node("node-b")]}
    r = ext.post("filter", {"Pod": p, "Nodes": nodes, "NodeNames": None})
    assert r["NodeNames"] is None
    assert [n["metadata"]["name"] for n in r["Nodes"]["items"]] == ["node-a"]


def test_filter_of_an_invalid_request_names_the_field_on_every_node(ext, api):
    p = api.put_pod(pod("typo", [gpu_container("main", 1, "abc")]))  # type: ignore[arg-type]
    r = ext.post("filter", filter_args(p))
    assert r["NodeNames"] == []
    assert set(r["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}
    assert 'nvidia.com/gpumem' in r["FailedAndUnresolvableNodes"]["node-a"]


def test_prioritize_ranks_by_the_node_policy(ext, api):
    busy = pod("busy", [gpu_container("main", 1, 4096, 50)], node_name="node-b",
               annotations={keys.POD_NODE: "node-b", keys.POD_ALLOCATED: f"{B0},NVIDIA,4096,50:;"}, phase="Running")
    api.put_pod(busy)
    ext.synced(api)
    p = api.put_pod(pod("p", [gpu_container("main", 1, 1024)]))
    r = ext.post("prioritize", filter_args(p))
    assert r == [{"Host": "node-a", "Score": 0}, {"Host": "node-b", "Score": 10}]  # binpack: the fuller first


def test_prioritize_over_http_is_the_json_of_prioritize(ext, api):
    """/prioritize writes its answer without the general JSON encoder: the same bytes as json.dumps of
    prioritize(), scores as round(10 * (last - i) / last), and names JSON must escape still escaped."""
    from pyvgpu.cluster.scheduler.extender import rank_scores

    for n in (0, 1, 2, 3, 7, 21, 200, 4999):
        last = n - 1
        assert rank_scores(n) == ([10] * n if n <= 1 else [round(10 * (last - i) / last) for i in range(n)])
    p = api.put_pod(pod("p", [gpu_container("main", 1, 1024)]))
    for names in (["node-a", "node-b"], ["node-b"], [], ['odd"name', "node-a", "nodé"]):
        args = filter_args(p, names)
        body = ext.s.prioritize_body(args)
        assert body == json.dumps(ext.s.prioritize(args)).encode()
        assert ext.post("prioritize", args) == json.loads(body)


def test_bad_bodies_are_400_with_the_reason(ext):
    req = urllib.request.Request(f"{ext.base}/filter", data=b"[1]", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "expected a JSON object" in e.value.read().decode()


# --- bind --------------------------------------------------------------------------------------------------

def test_bind_locks_the_node_annotates_binds_and_unlocks(ext, api):
    p = api.put_pod(pod("train", [gpu_container("main", 1, 4096, 30)]))
    assert ext.post("bind", bind_args(p, "node-a")) == {"Error": ""}
    got = api.get_pod("default", "train")
    annos = got["metadata"]["annotations"]
    assert got["spec"]["nodeName"] == "node-a"
    assert annos[keys.POD_NODE] == "node-a"
    # equal GPUs: the last listed first (HAMi's Fit walks the sorted GPUs from the end)
    assert annos[keys.POD_TO_ALLOCATE] == f"{A1},NVIDIA,4096,30:;" == annos[keys.POD_ALLOCATED]
    assert annos[keys.POD_BIND_PHASE] == "allocating"
    assert annos[keys.POD_TIME].isdigit() and annos[keys.POD_BIND_TIME].isdigit()
    lock_patches = [pt for path, pt in api.patches if path.endswith("/nodes/node-a")]
    assert [pt["metadata"]["annotations"][keys.NODE_LOCK] is None for pt in lock_patches] == [False, True]
    assert lock_patches[0]["metadata"]["annotations"][keys.NODE_LOCK].endswith(",default,train")
    assert keys.NODE_LOCK not in api.get_node("node-a")["metadata"]["annotations"]
    # the next pod, right after, sees the first one's GPU as used (spread: the other GPU)
    q = api.put_pod(pod("next", [gpu_container("main", 1, 4096, 30)]))
    assert ext.post("bind", bind_args(q, "node-a")) == {"Error": ""}
    assert api.get_pod("default", "next")["metadata"]["annotations"][keys.POD_TO_ALLOCATE].startswith(A0)


def test_two_schedulers_racing_for_one_nodes_lock(ext, kube, api):
    other = Ext(kube, lock_expire_s=300.0)
    try:
        other.synced(api)
        p1 = api.put_pod(pod("p1", [gpu_container("main", 1, 6000)]))
        p2 = api.put_pod(pod("p2", [gpu_container("main", 1, 6000)]))
        results, started = {}, []

        def race(method, path):  # scheduler 1 read the node unlocked; scheduler 2 binds before its patch lands
            if method == "PATCH" and path.endswith("/nodes/node-a") and not started:
                started.append(path)
                results["p2"] = other.post("bind", bind_args(p2, "node-a"))
            return None

        api.hooks.append(race)
        results["p1"] = ext.post("bind", bind_args(p1, "node-a"))
        api.hooks.clear()
        assert results["p2"] == {"Error": ""}
        # scheduler 1's lock write on its cached copy is refused (the node changed under it); it reads the
        # node again, takes the lock scheduler 2 released, and decides on the pods listed under it: the other
        # GPU (6000 of 8192 MiB each: never the same one)
        assert results["p1"] == {"Error": ""}
        assert keys.NODE_LOCK not in api.get_node("node-a")["metadata"]["annotations"]
        g1 = api.get_pod("default", "p1")["metadata"]["annotations"][keys.POD_TO_ALLOCATE].split(",")[0]
        g2 = api.get_pod("default", "p2")["metadata"]["annotations"][keys.POD_TO_ALLOCATE].split(",")[0]
        assert {g1, g2} == {A0, A1}
    finally:
        other.close()


def test_a_live_lock_refuses_a_bind_and_a_stale_one_is_taken_over(ext, api):
    holder = api.put_pod(pod("holder", [gpu_container()], annotations={keys.POD_BIND_PHASE: "allocating"}))
    n = api.get_node("node-a")
    n["metadata"]["annotations"][keys.NODE_LOCK] = lock_value("default", "holder")
    api.put_node(n)
    p = api.put_pod(pod("p", [gpu_container("main", 1, 1024)]))
    r = ext.post("bind", bind_args(p, "node-a"))
    assert "node node-a is locked by another bind" in r["Error"]
    assert keys.POD_NODE not in api.get_pod("default", "p")["metadata"]["annotations"]

    api.delete_pod("default", holder["metadata"]["name"])  # its holder died: the lock is stale
    assert ext.post("bind", bind_args(p, "node-a")) == {"Error": ""}

    n = api.get_node("node-b")
    api.put_pod(pod("alive", [gpu_container()], annotations={keys.POD_BIND_PHASE: "allocating"}))
    n["metadata"]["annotations"][keys.NODE_LOCK] = "2020-01-01T00:00:00Z,default,alive"  # expired long ago
    api.put_node(n)
    q = api.put_pod(pod("q", [gpu_container("main", 1, 1024)]))
    assert ext.post("bind", bind_args(q, "node-b")) == {"Error": ""}


def test_a_pod_deleted_mid_bind_is_reported_and_the_lock_released(ext, api):
    p = api.put_pod(pod("gone", [gpu_container("main", 1, 1024)]))

    def delete_at_binding(method, path):
        if method == "POST" and path.endswith("/binding"):
            api.delete_pod("default", "gone")
            return 404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "gone" not found'}
        return None

    api.hooks.append(delete_at_binding)
    r = ext.post("bind", bind_args(p, "node-a"))
    assert "deleted while being bound" in r["Error"]
    assert keys.NODE_LOCK not in api.get_node("node-a")["metadata"]["annotations"]
    assert ext.s.metrics.bind_total.labels("pod_gone")._value.get() == 1


def test_a_failed_binding_takes_the_annotations_back(ext, api):
    p = api.put_pod(pod("p", [gpu_container("main", 1, 1024)]))

    def refuse(method, path):
        if method == "POST" and path.endswith("/binding"):
            return 403, {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"}
        return None

    api.hooks.append(refuse)
    r = ext.post("bind", bind_args(p, "node-a"))
    assert "HTTP 403" in r["Error"]
    annos = api.get_pod("default", "p")["metadata"]["annotations"]
    assert keys.POD_NODE not in annos and keys.POD_ALLOCATED not in annos and annos[keys.POD_BIND_PHASE] == "failed"


def test_bind_with_the_api_server_down_fails_clearly(ext, api):
    p = api.put_pod(pod("p", [gpu_container("main", 1, 1024)]))
    api.stop()
    r = ext.post("bind", bind_args(p, "node-a"))
    assert "cannot reach the API server" in r["Error"]
    status, _ = ext.get("/readyz")
    assert status == 200  # the cache keeps what it has


# --- the cache, health, metrics ----------------------------------------------------------------------------

def test_readyz_waits_for_the_cache_and_healthz_does_not(kube, api):
    api.put_node(registered("node-a", [A0]))
    api.stop()
    e = Ext(kube)
    try:
        assert e.get("/healthz") == (200, "ok")
        assert e.get("/readyz")[0] == 503
        api.start()
        assert e.s.informer.ready.wait(20)
        assert e.get("/readyz") == (200, "ok")
    finally:
        e.close()


def test_the_cache_follows_pods_bound_by_others(ext, api):
    p = api.put_pod(pod("p", [gpu_container("main", 1, 8192)]))
    full = pod("full", [gpu_container("main", 1, 8192)], node_name="node-b", phase="Running",
               annotations={keys.POD_NODE: "node-b", keys.POD_ALLOCATED: f"{B0},NVIDIA,8192,0:;"})
    api.put_pod(full)
    ext.synced(api)
    assert ext.post("filter", filter_args(p))["NodeNames"] == ["node-a"]
    api.delete_pod("default", "full")
    ext.synced(api)
    assert sorted(ext.post("filter", filter_args(p))["NodeNames"]) == ["node-a", "node-b"]


def test_metrics_export_filter_latency_and_denials(ext, api):
    p = api.put_pod(pod("huge", [gpu_container("main", 1, 999999)]))
    r = ext.post("filter", filter_args(p))
    assert r["NodeNames"] == []
    status, text = ext.get("/metrics")
    assert status == 200
    assert 'pyvgpu_scheduler_filter_total{result="denied"} 1.0' in text
    assert "pyvgpu_scheduler_filter_seconds_count 1.0" in text
    assert "pyvgpu_scheduler_filter_refused_nodes_total 2.0" in text


# --- the webhook -------------------------------------------------------------------------------------------

def review(ext, p: dict) -> dict:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1",
                                                                               "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
                        "operation": "CREATE", "object": p, "dryRun": False}}
    out = ext.post("webhook", body)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return out["response"]


def test_webhook_sends_gpu_pods_to_the_scheduler_and_adds_the_count(ext):
    p = pod("p", [{"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpumem": "2048"}}},
                  {"name": "b", "image": "x"}], scheduler="default-scheduler")
    r = review(ext, p)
    assert r["allowed"] is True and r["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(r["patch"]))
    assert ops == [{"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "1"},
                   {"op": "replace", "path": "/spec/schedulerName", "value": "pyvgpu-scheduler"}]


def test_webhook_leaves_other_pods_and_refuses_privileged_gpu_containers(ext):
    r = review(ext, pod("cpu", [{"name": "a", "image": "x"}], scheduler=""))
    assert r == {"uid": r["uid"], "allowed": True}
    r = review(ext, pod("mine", [gpu_container()], scheduler="my-scheduler"))
    assert r["allowed"] is True and "patch" not in r
    priv = gpu_container()
    priv["securityContext"] = {"privileged": True}
    r = review(ext, pod("priv", [priv]))
    assert r["allowed"] is False and "privileged" in r["status"]["message"]


def test_answers_are_not_held_back_by_nagles_algorithm(kube):
    """kube-scheduler reuses one connection: with Nagle on, each answer's body waited ~40 ms for the client's
    delayed ACK (measured: 47 ms per /filter, 0.4 ms with TCP_NODELAY; docs/cluster.md)."""
    from pyvgpu.cluster.scheduler.extender_server import _handler

    assert _handler(Scheduler(kube)).disable_nagle_algorithm is True
