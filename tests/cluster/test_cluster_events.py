"""Events on the pod (issue 30, items 5 and 10; HAMi pkg/scheduler/event.go reasons): what was read
leniently, why filtering failed (refusals grouped by reason), why a bind failed."""

from __future__ import annotations

import time

from fake_apiserver import gpu_container, pod
from test_cluster_extender import Ext, bind_args, registered

from pyvgpu.cluster.api import events
from pyvgpu.cluster.core import keys


def _events(api, reason):
    with api.cond:
        return [e for e in api.k8s_events if e["reason"] == reason]


def test_lenient_reads_filter_failures_and_bind_failures_are_events_on_the_pod(kube, api):
    api.put_node(registered("node-a", ["GPU-a0"], mem=8192))
    api.put_node(registered("node-b", ["GPU-b0"], mem=8192))
    e = Ext(kube)
    try:
        e.synced(api)
        names = ["node-a", "node-b"]
        ctr = gpu_container("main", 1, 1000, 150)
        lenient = api.put_pod(pod("lenient", [ctr], annotations={keys.NUMA_BIND: "sure"}))
        r = e.post("filter", {"Pod": lenient, "Nodes": None, "NodeNames": names})
        assert r["NodeNames"]  # scheduled as HAMi schedules it
        api.wait_for(lambda: any(ev["reason"] == events.LENIENT_READ for ev in api.k8s_events),
                     what="the LenientRead event")
        ev = _events(api, events.LENIENT_READ)[0]
        assert ev["involvedObject"]["name"] == "lenient" and ev["type"] == "Warning"
        assert "gpucores 150 is above 100" in ev["message"] and "numa-bind 'sure'" in ev["message"]

        big = api.put_pod(pod("big", [gpu_container("main", 1, 9000, 10)]))
        r = e.post("filter", {"Pod": big, "Nodes": None, "NodeNames": names})
        assert r["NodeNames"] == []
        api.wait_for(lambda: any(ev["reason"] == events.FILTERING_FAILED for ev in api.k8s_events),
                     what="the FilteringFailed event")
        msg = _events(api, events.FILTERING_FAILED)[0]["message"]
        assert msg.startswith("no node of 2 fits: 2 node(s) (node-a, node-b): 0 of 1 GPU(s) can take")

        api.hooks.append(lambda m, path: (500, {"kind": "Status", "code": 500, "message": "boom"})
                         if m == "POST" and path.endswith("/binding") else None)
        assert e.post("bind", bind_args(lenient, "node-a"))["Error"]
        api.wait_for(lambda: any(ev["reason"] == events.BINDING_FAILED for ev in api.k8s_events),
                     what="the BindingFailed event")
        assert _events(api, events.BINDING_FAILED)[0]["involvedObject"]["uid"] == lenient["metadata"]["uid"]
    finally:
        api.hooks.clear()
        e.close()


def test_summary_groups_nodes_by_reason():
    failed = {f"n{i}": "pyvgpu: memory" for i in range(5)} | {"x": "pyvgpu: cores"}
    assert events.summary(failed, 9) == "no node of 9 fits: 5 node(s) (n0, n1, n2, ...): memory; 1 node(s) (x): cores"


def test_the_same_event_is_queued_once_per_repeat_interval_and_the_queue_is_bounded():
    r = events.Recorder(kube=None, component="c", size=2, repeat_s=60)
    p = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    r.record(p, events.FILTERING_FAILED, "m")
    r.record(p, events.FILTERING_FAILED, "m")
    assert r._q.qsize() == 1
    r.record(p, events.FILTERING_FAILED, "m2")
    r.record(p, events.FILTERING_FAILED, "m3")
    assert r._q.qsize() == 2 and r.dropped == 1


def test_usage_metrics_under_hamis_names(kube, api):
    # item 11: allocated memory, cores and slots per node and GPU, from the scheduler's cache
    api.put_node(registered("node-a", ["GPU-a0", "GPU-a1"], mem=8192))
    api.put_pod(pod("p", [gpu_container("main", 1, 1000, 30)], node_name="node-a", phase="Running",
                    annotations={keys.POD_ALLOCATED: "GPU-a1,NVIDIA,1000,30:;"}))
    e = Ext(kube)
    try:
        e.synced(api)
        code, text = e.get("/metrics")
        assert code == 200
        lab = 'device_index="1",device_type="NVIDIA Fake",device_uuid="GPU-a1",node="node-a"'
        for line in (f"hami_gpu_memory_limit_bytes{{{lab}}} 8.589934592e+09",
                     f"hami_gpu_core_allocated_ratio{{{lab}}} 30.0", f"hami_gpu_shared_count{{{lab}}} 1.0",
                     f"hami_gpu_core_limit_ratio{{{lab}}} 100.0",
                     'hami_gpu_memory_allocated_bytes{device_cores="100",' + lab + "} 1.048576e+09"):
            assert line in text, line
        assert 'hami_gpu_shared_count{device_index="0",device_type="NVIDIA Fake",device_uuid="GPU-a0",' \
               'node="node-a"} 0.0' in text
    finally:
        e.close()


def test_namespace_quota_from_a_watched_resourcequota(kube, api):
    # item 6 live: the scheduler follows ResourceQuotas and each namespace's use as pods come and go
    api.put_node(registered("node-a", ["GPU-a0", "GPU-a1"], mem=8192))
    api.put_pod(pod("held", [gpu_container("main", 1, 3000, 10)], namespace="team", node_name="node-a",
                    phase="Running", annotations={keys.POD_ALLOCATED: "GPU-a0,NVIDIA,3000,10:;"}))
    e = Ext(kube)
    try:
        e.synced(api)
        ask = api.put_pod(pod("ask", [gpu_container("main", 1, 3000, 10)], namespace="team"))
        assert e.post("filter", {"Pod": ask, "Nodes": None, "NodeNames": ["node-a"]})["NodeNames"] == ["node-a"]
        api.put_quota({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team"},
                       "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}}})
        deadline = time.monotonic() + 20
        while (r := e.post("filter", {"Pod": ask, "Nodes": None, "NodeNames": ["node-a"]}))["NodeNames"]:
            assert time.monotonic() < deadline, "the quota was not seen"
            time.sleep(0.05)
        assert "ResourceQuota allows 5000 MiB" in r["FailedNodes"]["node-a"]
        # the webhook refuses such a pod at admission (HAMi's fitResourceQuota), from the same cache
        new = pod("new", [gpu_container("main", 1, 3000, 10)], namespace="team")
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u1", "namespace": "team", "operation": "CREATE", "object": new}}
        out = e.post("webhook", body)["response"]
        assert out["allowed"] is False and "ResourceQuota allows 5000 MiB" in out["status"]["message"]
        api.delete_pod("team", "held")  # the namespace's use drops as the pod goes
        e.synced(api)
        assert e.post("filter", {"Pod": ask, "Nodes": None, "NodeNames": ["node-a"]})["NodeNames"] == ["node-a"]
    finally:
        e.close()
