"""Node liveness through the handshake (issue 30, item 9; HAMi pkg/device/devices.go CheckHealth)."""

from __future__ import annotations

import calendar
import threading
import time

import pytest
from fake_apiserver import gpu_container, node, pod
from test_cluster_extender import registered

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.model import NodeInfo
from pyvgpu.cluster.scheduler.extender import Scheduler
from pyvgpu.cluster.scheduler.informer import Informer
from pyvgpu.cluster.scheduler.liveness import Liveness, dead, needs_asking, requesting

NOW = calendar.timegm((2026, 1, 1, 12, 0, 0, 0, 0, 0))


def _node(handshake: str | None, gpus: str | None = None) -> dict:
    annos = {keys.NODE_HANDSHAKE: handshake} if handshake is not None else {}
    return node("n1", annos, {"nvidia.com/gpu": gpus} if gpus is not None else {})


@pytest.mark.parametrize("handshake, gpus, is_dead", [
    ("Reported_2026-01-01 11:00:00", None, False),       # the agent answered: alive
    (None, None, False),                                 # never asked yet: alive (and asked now)
    ("Requesting_2026-01-01 11:59:30", None, False),     # asked 30 s ago: within the 60 s grace
    ("Requesting_2026-01-01 11:58:59", "0", True),       # asked 61 s ago, no allocatable GPU: gone
    ("Requesting_2026-01-01 11:58:59", None, True),
    ("Requesting_2026-01-01 11:58:59", "8", False),      # still allocatable: the kubelet sees the plugin
    ("Requesting", None, False),                         # no time: cannot judge, alive (as HAMi)
    ("Requesting_yesterday", None, False),
])
def test_dead_as_hami_judges(handshake, gpus, is_dead):
    why = dead(_node(handshake, gpus), NOW)
    assert (why is not None) is is_dead
    if why:
        assert "has not answered the handshake" in why and "61 s" in why
    assert needs_asking(_node(handshake, gpus)) is (handshake is None or "Requesting" not in handshake)


def test_check_asks_the_unasked_and_dead_nodes_fit_nothing():
    asked = []
    live = Liveness(clock=lambda: NOW)
    nodes = [node("ok", {keys.NODE_HANDSHAKE: "Reported_2026-01-01 11:00:00"}),
             node("gone", {keys.NODE_HANDSHAKE: "Requesting_2026-01-01 11:00:00"})]
    verdicts = live.check(nodes, lambda n, v: asked.append((n, v)))
    assert set(verdicts) == {"gone"} and asked == [("ok", "Requesting_2026-01-01 12:00:00")]
    assert requesting(NOW) == "Requesting_2026-01-01 12:00:00"
    infos = live.apply([NodeInfo("ok"), NodeInfo("gone")])
    assert infos[0].error is None and "has not answered the handshake" in infos[1].error


def test_the_scheduler_asks_and_refuses_a_node_whose_agent_is_gone(kube, api):
    old = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() - 600))
    alive = registered("alive", ["GPU-l0"])
    gone = registered("gone", ["GPU-g0"])
    gone["metadata"]["annotations"][keys.NODE_HANDSHAKE] = f"Requesting_{old}"
    gone["status"]["allocatable"] = {}
    api.put_node(alive)
    api.put_node(gone)
    stop = threading.Event()
    cfg = ClusterConfig()
    s = Scheduler(kube, cfg, informer=Informer(kube, cfg, watch_s=5, retry_s=0.1), handshake_s=0.2)
    s.start(stop)
    try:
        assert s.informer.ready.wait(20)
        api.wait_for(lambda: "Requesting_" in api.nodes["alive"]["metadata"]["annotations"].get(
            keys.NODE_HANDSHAKE, ""), what="the scheduler asking the live node")
        deadline = time.monotonic() + 20
        while s.liveness.apply([NodeInfo("gone")])[0].error is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        p = api.put_pod(pod("p", [gpu_container("main", 1, 1000, 10)]))
        r = s.filter({"Pod": p, "Nodes": None, "NodeNames": ["alive", "gone"]})
        assert r["NodeNames"] == ["alive"] and "has not answered the handshake" in r["FailedNodes"]["gone"]
        # the agent answers (registers again): the node takes pods again at the next check
        api.put_node({**gone, "metadata": {**gone["metadata"], "annotations": {
            **gone["metadata"]["annotations"], keys.NODE_HANDSHAKE: "Reported_2026-01-01 12:00:00"}}})
        deadline = time.monotonic() + 20
        while sorted(s.filter({"Pod": p, "Nodes": None, "NodeNames": ["alive", "gone"]})["NodeNames"]) != \
                ["alive", "gone"]:
            assert time.monotonic() < deadline, "the node did not come back"
            time.sleep(0.05)
    finally:
        stop.set()


@pytest.mark.parametrize("replicas, elect", [(1, False), (3, True)])
def test_scheduler_replicas_elect_a_leader(replicas, elect):
    # item 12: several scheduler pods; their kube-schedulers elect one (a Lease named kube-scheduler in the
    # release namespace, which the system:kube-scheduler role bound to them may get and update)
    import yaml
    from test_cluster_chart import NS, one, render

    docs = render({"scheduler": {"replicas": replicas}})
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config"))
    conf = yaml.safe_load(cm["data"]["config.yaml"])
    assert conf["leaderElection"] == {"leaderElect": elect, "resourceNamespace": NS, "resourceName": "kube-scheduler"}
    assert one(docs, "Deployment", "scheduler")["spec"]["replicas"] == replicas
