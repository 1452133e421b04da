"""The scheduler's cache keeps a node's usage (and the filter verdicts remembered on it) across pod events
that do not change what a pod charges, and rebuilds it on those that do (issue 30, items 14-15: a bind's
annotations and then its Binding came back through the watch and rebuilt the node each time)."""

from __future__ import annotations

import copy

from fake_apiserver import gpu_container, pod
from test_cluster_extender import registered

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.decide import decide_on
from pyvgpu.cluster.core.model import ContainerDevice
from pyvgpu.cluster.core.request import pod_request
from pyvgpu.cluster.scheduler.informer import Informer

A0 = "GPU-a0"


def _cache() -> tuple[Informer, dict]:
    inf = Informer(kube=None)
    inf.apply("node", "ADDED", registered("node-a", [A0, "GPU-a1"]))
    bound = pod("held", [gpu_container("main", 1, 2048)], annotations={
        keys.POD_NODE: "node-a", keys.POD_BIND_PHASE: keys.BIND_ALLOCATING,
        keys.POD_ALLOCATED: codec.encode_pod_devices(((ContainerDevice(A0, "NVIDIA", 2048, 0),),)),
        keys.POD_TO_ALLOCATE: codec.encode_pod_devices(((ContainerDevice(A0, "NVIDIA", 2048, 0),),))})
    bound["spec"]["schedulerName"] = "pyvgpu-scheduler"
    bound["metadata"]["resourceVersion"] = "10"
    inf.apply("pod", "ADDED", bound)
    return inf, bound


def _filtered(inf: Informer):
    req = pod_request(pod("new", [gpu_container("main", 1, 1024)]))
    infos = inf.node_infos(["node-a"])
    decide_on(infos, req, brief=True)  # remembers its verdict on the node's usage
    return infos[0]


def test_an_event_that_changes_nothing_charged_keeps_the_nodes_usage_and_verdicts():
    inf, bound = _cache()
    first = _filtered(inf)
    assert first.fit_cache and first.devices[0].usedmem == 2048
    same = copy.deepcopy(bound)
    same["spec"]["nodeName"] = "node-a"  # its Binding, seen through the watch: the same node, the same GPUs
    same["metadata"]["resourceVersion"] = "11"
    same["metadata"]["annotations"]["other"] = "x"
    inf.apply("pod", "MODIFIED", same)
    again = inf.node_infos(["node-a"])[0]
    assert again is first and again.fit_cache  # not rebuilt
    assert inf.pods[("default", "held")]["spec"]["nodeName"] == "node-a"  # the pod itself is current


def test_an_event_that_changes_the_charge_rebuilds_the_node():
    inf, bound = _cache()
    first = _filtered(inf)
    done = copy.deepcopy(bound)
    done["status"] = {"phase": "Succeeded"}
    done["metadata"]["resourceVersion"] = "11"
    inf.apply("pod", "MODIFIED", done)
    again = inf.node_infos(["node-a"])[0]
    assert again is not first and again.devices[0].usedmem == 0 and not again.fit_cache


def test_the_pod_being_scheduled_does_not_count_against_itself_on_its_node():
    inf, _ = _cache()
    full = inf.node_infos(["node-a", "node-a"])
    mine = inf.node_infos(["node-a", "node-a"], exclude=("default", "held"))
    assert [i.devices[0].usedmem for i in full] == [2048, 2048]
    assert [i.devices[0].usedmem for i in mine] == [0, 0]
    assert inf.node_infos(["node-a"])[0].devices[0].usedmem == 2048  # the cache keeps its own
    assert inf.node_infos(["nowhere"])[0].error


def test_a_verdict_is_never_found_under_another_shapes_number(monkeypatch):
    """Request shapes are numbered for the verdict caches; past the table's bound the numbering goes on, so
    a node's verdict for an old shape is never read for a new one."""
    from pyvgpu.cluster.core import decide as decide_mod

    monkeypatch.setattr(decide_mod, "MAX_SHAPES", 2)
    inf, _ = _cache()  # GPU-a0 has 2048 MiB in use; GPU-a1 none, of 8192 each
    infos = inf.node_infos(["node-a"])

    def fits(mem: int) -> bool:
        return decide_on(infos, pod_request(pod(f"p{mem}", [gpu_container("main", 1, mem)])), brief=True).node \
            is not None

    assert fits(1024) and fits(2048) and fits(4096)  # three shapes: the table started again
    assert not fits(9000) and fits(1024) and not fits(9000)


def test_remembered_verdicts_are_left_out_of_the_garbage_collectors_passes():
    """Item 15: the verdicts of every node and request shape (hundreds of thousands at 5000 nodes) are plain
    values, so the collector stops tracking each node's memo; as objects, every full collection walked them
    (0.1-0.2 s each, in the middle of filters)."""
    import gc

    from pyvgpu.cluster.core.columns import Columns

    inf, _ = _cache()
    info = _filtered(inf)
    req = pod_request(pod("four", [gpu_container("main", 4, 1024)]))  # refused: a reason is remembered
    assert decide_on([info], req, brief=True).node is None
    other = pod_request(pod("big", [gpu_container("main", 2, 7000)]))
    decide_on([info], other, brief=True, columns=Columns())
    assert len(info.fit_cache) == 3
    gc.collect()
    assert not gc.is_tracked(info.fit_cache)


def test_a_node_the_cache_lacks_is_taken_from_the_request_or_refused():
    inf, _ = _cache()
    sent = registered("node-b", ["GPU-b0"])
    got = inf.node_infos(["node-a", "node-x", "node-b"], extra_nodes={"node-b": sent})
    assert [n.name for n in got] == ["node-a", "node-x", "node-b"]
    assert got[0] is inf.node_infos(["node-a"])[0] and not got[0].error  # the cached usage, as built
    assert got[1].error == "the scheduler's cache does not have this node yet" and not got[1].devices
    assert not got[2].error and [d.id for d in got[2].devices] == ["GPU-b0"]
