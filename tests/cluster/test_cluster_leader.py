"""Several scheduler replicas (issue 30, item 12): the extender leads while its own pod's kube-scheduler holds
the election Lease (holderIdentity `<hostname>_<uuid>`, seen to change less than leaseDurationSeconds ago by
the extender's clock), as HAMi's scheduler reads it (pkg/util/leaderelection); only the leader asks the
nodes for their handshake. Against the test API server."""

from __future__ import annotations

import threading

from fake_apiserver import node
from test_cluster_extender import registered

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.scheduler.extender import Scheduler
from pyvgpu.cluster.scheduler.informer import Informer
from pyvgpu.cluster.scheduler.leader import LeaseLeader

NS = "pyvgpu-system"


def test_the_replica_whose_kube_scheduler_holds_the_lease_leads_until_it_lapses(api, kube):
    now = [100.0]
    a = LeaseLeader(kube, NS, "kube-scheduler", identity="sched-1", clock=lambda: now[0])
    b = LeaseLeader(kube, NS, "kube-scheduler", identity="sched-12", clock=lambda: now[0])
    a.observe()
    assert not a.is_leader()  # no Lease yet: nobody leads
    api.put_lease(NS, "kube-scheduler", "sched-12_5d1c9a0e", duration_s=15, renew_time="T1")
    for r in (a, b):
        r.observe()
    assert b.is_leader() and not a.is_leader()  # "sched-1" is a prefix of "sched-12" but not its pod's name
    now[0] += 14
    api.put_lease(NS, "kube-scheduler", "sched-12_5d1c9a0e", duration_s=15, renew_time="T2")  # renewed
    b.observe()
    now[0] += 14
    b.observe()
    assert b.is_leader()
    now[0] += 2  # 16 s since it last changed: the holder stopped renewing
    b.observe()
    assert not b.is_leader()
    api.put_lease(NS, "kube-scheduler", "sched-1_77e0", duration_s=15, renew_time="T3")  # taken over
    for r in (a, b):
        r.observe()
    assert a.is_leader() and not b.is_leader()
    api.stop()  # the API server away: the last Lease seen lapses by itself
    a.observe()
    assert a.is_leader()
    now[0] += 15
    assert not a.is_leader()


def test_only_the_leading_replica_asks_the_nodes_for_their_handshake(api, kube):
    api.put_node(registered("gpu-a", ["GPU-a0"]))
    api.put_node(node("plain"))
    cfg = ClusterConfig()
    stop = threading.Event()
    replicas = {}
    for ident in ("sched-0", "sched-1"):
        leader = LeaseLeader(kube, NS, "kube-scheduler", identity=ident)
        replicas[ident] = Scheduler(kube, cfg, informer=Informer(kube, cfg, watch_s=5, retry_s=0.1), leader=leader)
        replicas[ident].informer.start(stop)
    api.put_lease(NS, "kube-scheduler", "sched-1_abc", duration_s=15)
    try:
        for s in replicas.values():
            assert s.informer.ready.wait(20)
            s.leader.observe()
        before = len(api.patches)
        replicas["sched-0"].handshake_once()
        assert len(api.patches) == before  # not the leader: writes nothing
        replicas["sched-1"].handshake_once()
        asked = [path for path, patch in api.patches[before:]
                 if keys.NODE_HANDSHAKE in patch["metadata"]["annotations"]]
        assert sorted(asked) == ["/api/v1/nodes/gpu-a", "/api/v1/nodes/plain"]
        # one replica alone (no Lease to read) asks as before
        alone = Scheduler(kube, cfg, informer=replicas["sched-0"].informer)
        n = len(api.patches)
        api.put_node(registered("gpu-b", ["GPU-b0"]))
        api.wait_for(lambda: "gpu-b" in alone.informer.nodes, what="the cache seeing gpu-b")
        alone.handshake_once()
        assert [p for p, _ in api.patches[n:]] == ["/api/v1/nodes/gpu-b"]
    finally:
        stop.set()
