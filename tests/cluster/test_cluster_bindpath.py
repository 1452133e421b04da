"""The bind's API calls (issue 30, item 14): a pod the cache holds, waiting for a node, is bound without
being read again; its annotations are written only on the version the cache saw, and a pod changed since
is bound on a fresh read or refused as before."""

from __future__ import annotations

import copy

from fake_apiserver import gpu_container, pod
from test_cluster_extender import Ext, bind_args, registered

from pyvgpu.cluster.core import keys


def _pod_gets(api, name: str) -> int:
    with api.cond:
        return sum(1 for m, p in api.requests if m == "GET" and p == f"/api/v1/namespaces/default/pods/{name}")


def _ready(kube, api, *pods):
    api.put_node(registered("node-0", ["GPU-a0", "GPU-a1"], mem=8192))
    made = [api.put_pod(p) for p in pods]
    e = Ext(kube)
    e.synced(api)
    return e, made


def test_a_cached_pending_pod_is_bound_without_reading_it_again(kube, api):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        cached = e.s.informer.pod("default", "p")
        # the cache keeps a pending pod's container resources: what the bind's request is read from
        assert cached["spec"]["containers"][0]["resources"] == p["spec"]["containers"][0]["resources"]
        assert e.post("bind", bind_args(p, "node-0")) == {"Error": ""}
        assert _pod_gets(api, "p") == 0
        got = api.get_pod("default", "p")
        assert got["spec"]["nodeName"] == "node-0"
        assert got["metadata"]["annotations"][keys.POD_TO_ALLOCATE].startswith("GPU-a")
        e.synced(api)
        # bound, the cache keeps no resources again (a cluster's bound pods are most of the cache)
        assert e.s.informer.pod("default", "p")["spec"]["containers"] == [{"name": "main"}]
    finally:
        e.close()


def _make_stale(e, api, name: str, change) -> dict:
    """Change pod `name` at the API server while the cache keeps its copy from before (a lagging watch)."""
    inf = e.s.informer
    old = copy.deepcopy(inf.pod("default", name))
    with api.cond:
        obj = api.pods[("default", name)]
        change(obj)
        api._bump("pod", "MODIFIED", obj)
    e.synced(api)
    with inf.lock:
        inf.pods[("default", name)] = old
    return old


def test_a_pod_bound_elsewhere_since_the_cache_saw_it_keeps_its_annotations(kube, api):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        theirs = "GPU-a0,NVIDIA,1000,10:;"

        def bound_by_another(obj):
            obj["spec"]["nodeName"] = "node-0"
            obj["metadata"]["annotations"][keys.POD_ALLOCATED] = theirs

        _make_stale(e, api, "p", bound_by_another)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "already bound to node node-0" in out["Error"]
        annos = api.get_pod("default", "p")["metadata"]["annotations"]
        assert annos[keys.POD_ALLOCATED] == theirs and keys.POD_TO_ALLOCATE not in annos
        assert _pod_gets(api, "p") == 1  # the refused conditional write sent it to a fresh read
    finally:
        e.close()


def test_a_pod_changed_since_the_cache_saw_it_is_bound_on_a_fresh_read(kube, api):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        def labelled(obj):
            obj["metadata"]["annotations"]["team.example/owner"] = "x"

        _make_stale(e, api, "p", labelled)
        assert e.post("bind", bind_args(p, "node-0")) == {"Error": ""}
        got = api.get_pod("default", "p")
        assert got["spec"]["nodeName"] == "node-0" and got["metadata"]["annotations"]["team.example/owner"] == "x"
        assert _pod_gets(api, "p") == 1
        # the node's lock was taken twice (once per try) and released each time
        assert keys.NODE_LOCK not in api.get_node("node-0")["metadata"]["annotations"]
    finally:
        e.close()


def test_a_cached_pod_whose_request_changed_is_decided_on_the_fresh_one(kube, api):
    # the cache's copy asks for a GPU policy that is not a word; the pod was corrected since: the refusal
    # decided on the cache's copy is checked on a fresh read, which binds
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        inf = e.s.informer
        with inf.lock:
            inf.pods[("default", "p")]["metadata"]["annotations"][keys.NODE_POLICY] = "nonsense"
        assert e.post("bind", bind_args(p, "node-0")) == {"Error": ""}
        assert _pod_gets(api, "p") == 1
    finally:
        e.close()


def test_an_api_server_error_on_the_conditional_write_is_the_binds_error(kube, api):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        path = "/api/v1/namespaces/default/pods/p"
        api.hooks.append(lambda method, p_: (500, {"kind": "Status", "code": 500, "message": "etcd is down"})
                         if method == "PATCH" and p_ == path else None)
        out = e.post("bind", bind_args(p, "node-0"))
        assert out["Error"].startswith("pyvgpu: patch pod default/p: HTTP 500") and "etcd is down" in out["Error"]
        api.hooks.clear()
        got = api.get_pod("default", "p")
        assert not got["spec"].get("nodeName") and keys.POD_TO_ALLOCATE not in got["metadata"]["annotations"]
        assert keys.NODE_LOCK not in api.get_node("node-0")["metadata"]["annotations"]
        assert e.s.inflight.promise(("default", "p")) is None  # its promise ended with the failed bind
    finally:
        e.close()


def test_a_cached_pod_without_gpus_is_bound_on_a_fresh_read(kube, api):
    # nothing is written on the cached version, so nothing would catch a change since: the pod is read
    e, (p,) = _ready(kube, api, pod("plain", [{"name": "main", "image": "x"}]))
    try:
        def bound_by_another(obj):
            obj["spec"]["nodeName"] = "node-1"

        _make_stale(e, api, "plain", bound_by_another)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "already bound to node node-1" in out["Error"] and _pod_gets(api, "plain") == 1
        assert api.bindings == []
    finally:
        e.close()
