"""Scores against hand-computed values, and the usage a node's pods add up to."""

from __future__ import annotations

import pytest
from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist

from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import DeviceUsage
from pyvgpu.cluster.core.score import WEIGHT, device_score, node_score
from pyvgpu.cluster.core.usage import node_infos


def usage(count=10, used=0, mem=81920, usedmem=0, core=100, usedcores=0) -> DeviceUsage:
    d = DeviceUsage("GPU-a", 0, count, mem, core, "A100", 0, "hami-core", True)
    d.used, d.usedmem, d.usedcores = used, usedmem, usedcores
    return d


# --- scores (docs/cluster.md, "Scores, Weight 10") --------------------------------------------------------------

def test_weight_is_ten():
    assert WEIGHT == 10


def test_device_score_by_hand():
    # 10 * ((1 + 2)/10 + (20 + 30)/100 + (8192 + 20480)/81920) = 10 * (0.3 + 0.5 + 0.35) = 11.5
    assert device_score(usage(used=2, usedcores=30, usedmem=20480), 8192, 20) == pytest.approx(11.5)
    # An empty GPU asked for nothing but a slot: 10 * (1/10) = 1
    assert device_score(usage(), 0, 0) == pytest.approx(1.0)
    # A full GPU asked for the same again: 10 * ((1 + 10)/10 + 200/100 + 2) = 51
    assert device_score(usage(used=10, usedcores=100, usedmem=81920), 81920, 100) == pytest.approx(51.0)
    # request counts the slots this container takes from the GPU
    assert device_score(usage(), 0, 0, request=2) == pytest.approx(2.0)


def test_node_score_by_hand():
    d1 = usage(used=2, usedcores=30, usedmem=20480)
    d2 = usage(mem=16384)
    # 10 * (2/20 + 30/200 + 20480/98304) = 10 * (0.1 + 0.15 + 0.208333...) = 4.58333...
    assert node_score([d1, d2]) == pytest.approx(10 * (0.1 + 0.15 + 20480 / 98304))
    assert node_score([usage()]) == 0.0


def test_scores_of_empty_totals_are_zero():
    assert device_score(usage(count=0), 1, 1) == 0.0
    assert device_score(usage(core=0), 1, 1) == 0.0
    assert device_score(usage(mem=0), 1, 1) == 0.0
    assert node_score([]) == 0.0
    assert node_score([usage(mem=0)]) == 0.0


# --- usage ---------------------------------------------------------------------------------------------------

NODE = node("n1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])


def devs(pods, exclude=None, nodes=None):
    (info,) = node_infos(nodelist(nodes or NODE), podlist(*pods), exclude=exclude)
    return {d.id: (d.used, d.usedmem, d.usedcores) for d in info.devices}


def test_bound_pods_count():
    pods = [pod("p1", node_name="n1", allocated="GPU-a,NVIDIA,1000,10:;"),
            pod("p2", node_name="n1", allocated="GPU-a,NVIDIA,2000,20:GPU-b,NVIDIA,2000,20:;")]
    assert devs(pods) == {"GPU-a": (2, 3000, 30), "GPU-b": (1, 2000, 20)}


def test_ended_pods_and_other_nodes_do_not_count():
    pods = [pod("done", node_name="n1", allocated="GPU-a,NVIDIA,1000,10:;", phase="Succeeded"),
            pod("failed", node_name="n1", allocated="GPU-a,NVIDIA,1000,10:;", phase="Failed"),
            pod("elsewhere", node_name="n2", allocated="GPU-a,NVIDIA,1000,10:;"),
            pod("no-gpu", node_name="n1")]
    assert devs(pods) == {"GPU-a": (0, 0, 0), "GPU-b": (0, 0, 0)}


def test_a_pod_not_bound_yet_counts_on_its_vgpu_node():
    p = pod("p", annotations={"hami.io/vgpu-node": "n1"}, allocated="GPU-b,NVIDIA,500,5:;")
    assert devs([p])["GPU-b"] == (1, 500, 5)


def test_allocating_pods_count_by_to_allocate():
    # bind-phase allocating: containers the device plugin has not reached yet are in to-allocate only.
    p = pod("p", node_name="n1", containers=[ctr("a"), ctr("b")],
            annotations={"hami.io/bind-phase": "allocating",
                         "hami.io/vgpu-devices-to-allocate": ";GPU-b,NVIDIA,700,7:;"},
            allocated="GPU-a,NVIDIA,100,1:;;")
    assert devs([p]) == {"GPU-a": (1, 100, 1), "GPU-b": (1, 700, 7)}
    only = pod("q", node_name="n1", annotations={"hami.io/bind-phase": "allocating",
                                                  "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,300,3:;"})
    assert devs([only])["GPU-a"] == (1, 300, 3)
    done = pod("r", node_name="n1", annotations={"hami.io/bind-phase": "success",
                                                  "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,300,3:;"})
    assert devs([done])["GPU-a"] == (0, 0, 0)


def test_the_pod_being_placed_does_not_count_against_itself():
    p = pod("new", node_name="n1", allocated="GPU-a,NVIDIA,100,1:;")
    assert devs([p], exclude=("default", "new"))["GPU-a"] == (0, 0, 0)
    assert devs([p], exclude=("other", "new"))["GPU-a"] == (1, 100, 1)


def test_init_containers_count_at_their_peak():
    # init containers run one at a time, before the app containers: per GPU the larger of the biggest init
    # container and the sum of the app containers (HAMi CollapseInitContainerUsage).
    p = pod("p", node_name="n1", init=[ctr("i1"), ctr("i2")], containers=[ctr("a1"), ctr("a2")],
            allocated="GPU-a,NVIDIA,5000,50:;GPU-a,NVIDIA,7000,10:GPU-b,NVIDIA,100,1:;"
                      "GPU-a,NVIDIA,1000,20:;GPU-a,NVIDIA,2000,20:;")
    assert devs([p]) == {"GPU-a": (2, 7000, 50), "GPU-b": (1, 100, 1)}


def test_gpus_the_node_does_not_list_are_ignored():
    assert devs([pod("p", node_name="n1", allocated="GPU-zz,NVIDIA,1,1:;")])["GPU-a"] == (0, 0, 0)


def test_a_broken_pod_annotation_is_skipped_with_a_warning():
    # HAMi's scheduler skips a pod whose allocation it cannot decode and keeps the node (onAddPod)
    nodes = nodelist(NODE, node("n2", [gpu("GPU-c")]))
    bad = pod("bad", node_name="n1", allocated="GPU-a,NVIDIA,lots,1:;")
    n1, n2 = node_infos(nodes, podlist(bad))
    assert n1.error is None and n2.error is None and n2.warnings == []
    assert len(n1.warnings) == 1 and "pod default/bad was skipped" in n1.warnings[0] and "UsedMem" in n1.warnings[0]
    assert all(d.used == 0 for d in n1.devices)


def test_node_errors():
    nodes = nodelist(node("none", None), node("empty", "[]"), node("broken", "[{"),
                     node("scores", [gpu("GPU-a")], annotations={"hami.io/node-nvidia-score": "{"}))
    errors = {n.name: n.error for n in node_infos(nodes, [])}
    assert "no hami.io/node-nvidia-register annotation" in errors["none"]
    assert "lists no GPU" in errors["empty"]
    assert errors["broken"].startswith("hami.io/node-nvidia-register: not valid JSON")
    assert errors["scores"].startswith("hami.io/node-nvidia-score")


def test_cordon_annotation():
    n = node("n1", [gpu("GPU-a"), gpu("GPU-b", 1)], annotations={"hami.io/device-cordon": " GPU-b ,"})
    (info,) = node_infos([n], [])
    assert [d.cordoned for d in info.devices] == [False, True]


@pytest.mark.parametrize("nodes, pods, field", [
    ({"kind": "Foo"}, [], "NodeList"),
    ([{"metadata": {}}], [], "NodeList items[0].metadata.name"),
    ([NODE, NODE], [], "NodeList"),
    ([NODE], [{"metadata": {"name": "p", "annotations": "x"}}], "PodList items[0].metadata.annotations"),
    ([NODE], ["pod"], "PodList items[0]"),
])
def test_bad_lists(nodes, pods, field):
    with pytest.raises(ClusterInputError) as e:
        node_infos(nodes, pods)
    assert e.value.field == field


def test_a_decision_charged_then_released_leaves_the_node_as_it_was():
    from pyvgpu.cluster.core.decide import decide_on
    from pyvgpu.cluster.core.request import pod_request
    from pyvgpu.cluster.core.usage import add_pod

    nodes = nodelist(node("n1", [gpu("GPU-a"), gpu("GPU-m", 1, count=7, mode="mig")]))
    pods = podlist(pod("old", node_name="n1", allocated="GPU-a,NVIDIA,1000,10:;"))
    (info,) = node_infos(nodes, pods)
    before = [(d.used, d.usedmem, d.usedcores, d.mig_geometry, d.mig_used) for d in info.devices]
    req = pod_request(pod(init=[ctr("setup", mem=500)], containers=[ctr("a", gpus=2, mem=5000, cores=10)]))
    d = decide_on([info], req)
    assert d.node == "n1" and d.init_containers == 1
    score = info.score_cache
    add_pod(info, d.devices, d.init_containers)
    assert info.score_cache is None  # the cached node score is dropped with the usage change
    m = info.devices[1]
    assert (m.used, m.usedmem, m.usedcores, m.mig_geometry, m.mig_used) == (1, 10240, 14, 0, frozenset({0}))
    assert decide_on([info], req).nodes[0].score > score
    add_pod(info, d.devices, d.init_containers, sign=-1)
    assert [(d.used, d.usedmem, d.usedcores, d.mig_geometry, d.mig_used) for d in info.devices] == before


def test_deep_or_long_json_stays_with_its_node_or_pod():
    deep = node("n2", "[" * 5000 + "]" * 5000)
    long_ = node("n3", '[{"id":"GPU-x","count":' + "9" * 5000 + "}]")
    bad = pod("bad", node_name="n1", annotations={"hami.io/vgpu-mig-allocations": "[" * 5000 + "]" * 5000})
    n1, n2, n3 = node_infos(nodelist(NODE, deep, long_), podlist(bad))
    assert n1.error is None and [d.id for d in n1.devices] == ["GPU-a", "GPU-b"]
    assert n2.error.startswith("hami.io/node-nvidia-register") and "nested too deep" in n2.error
    assert n3.error.startswith("hami.io/node-nvidia-register") and "number too long" in n3.error
    assert any("vgpu-mig-allocations" in w and "nested too deep" in w for w in n1.warnings)
