"""Fit rules, filters, policies, topology, modes and ties, through decide()."""

from __future__ import annotations

import pytest
from cluster_helpers import A100, ctr, gpu, node, nodelist, pod, podlist

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.decide import decide


def alloc(d) -> list[list[str]]:
    return [[p.uuid for p in c] for c in d.placements]


def verdict(d, name):
    return next(n for n in d.nodes if n.name == name)


def one_node(devices, pods=(), **kw):
    return nodelist(node("n1", devices)), podlist(*pods), kw


# --- fit ------------------------------------------------------------------------------------------------------

def test_memory_and_cores_must_fit():
    nodes = nodelist(node("n1", [gpu("GPU-a", mem=16384)]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,10000,60:;"))
    assert decide(nodes, used, pod(containers=[ctr(mem=6000, cores=40)])).node == "n1"
    d = decide(nodes, used, pod(containers=[ctr(mem=7000, cores=40)]))
    assert d.node is None and "memory: 6384 MiB free of 16384, needs 7000" in verdict(d, "n1").reason
    d = decide(nodes, used, pod(containers=[ctr(mem=1000, cores=41)]))
    assert "cores: 40% free, needs 41%" in verdict(d, "n1").reason


def test_memory_percentage_and_default_whole_memory():
    nodes = nodelist(node("n1", [gpu("GPU-a", mem=16384)]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,8192,0:;"))
    d = decide(nodes, used, pod(containers=[ctr(pct=50)]))
    assert d.node == "n1" and d.placements[0][0].usedmem == 8192
    d = decide(nodes, used, pod(containers=[ctr(pct=51)]))
    assert d.node is None
    d = decide(nodes, used, pod(containers=[ctr()]))  # no memory asked: all of it
    assert d.node is None and "needs 16384" in verdict(d, "n1").reason
    assert decide(nodes, [], pod(containers=[ctr()])).placements[0][0].usedmem == 16384


def test_slots():
    nodes = nodelist(node("n1", [gpu("GPU-a", count=2)]))
    two = podlist(*(pod(f"p{i}", node_name="n1", allocated="GPU-a,NVIDIA,1,0:;") for i in range(2)))
    d = decide(nodes, two, pod(containers=[ctr(mem=1)]))
    assert d.node is None and "no free slot (2/2 used)" in verdict(d, "n1").reason


def test_hundred_cores_is_exclusive_both_ways():
    nodes = nodelist(node("n1", [gpu("GPU-a")]))
    small = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,1000,0:;"))
    d = decide(nodes, small, pod(containers=[ctr(mem=1000, cores=100)]))
    assert d.node is None and "asks the whole GPU (100 cores), but 1 container(s) use it" in verdict(d, "n1").reason
    whole = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,1000,100:;"))
    d = decide(nodes, whole, pod(containers=[ctr(mem=1000, cores=0)]))
    assert d.node is None and "all 100% cores in use" in verdict(d, "n1").reason
    assert decide(nodes, [], pod(containers=[ctr(mem=1000, cores=100)])).node == "n1"


def test_unhealthy_and_cordoned_gpus_are_skipped():
    nodes = nodelist(node("n1", [gpu("GPU-a", health=False), gpu("GPU-b", 1)],
                          annotations={keys.NODE_DEVICE_CORDON: "GPU-b"}))
    d = decide(nodes, [], pod(containers=[ctr(mem=1)]))
    r = verdict(d, "n1").reason
    assert d.node is None and "GPU 0 GPU-a: unhealthy" in r and "GPU 1 GPU-b: cordoned" in r


def test_type_filters_are_case_insensitive_substrings():
    nodes = nodelist(node("n1", [gpu("GPU-a", type="NVIDIA A100-SXM4-80GB")]),
                     node("n2", [gpu("GPU-t", type="Tesla T4", mem=15360)]))
    assert decide(nodes, [], pod(containers=[ctr(mem=1)],
                                 annotations={"nvidia.com/use-gputype": "t4"})).node == "n2"
    d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={"nvidia.com/nouse-gputype": "T4,V100"}))
    assert d.node == "n1" and "excluded by nvidia.com/nouse-gputype" in verdict(d, "n2").reason
    d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={"nvidia.com/use-gputype": "H100"}))
    assert d.node is None and "is not in nvidia.com/use-gputype 'H100'" in verdict(d, "n1").reason


def test_uuid_filters():
    nodes = nodelist(node("n1", [gpu("GPU-a"), gpu("GPU-b", 1)]))
    d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={"nvidia.com/use-gpuuuid": "GPU-b"}))
    assert alloc(d) == [["GPU-b"]]
    d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={"nvidia.com/nouse-gpuuuid": "GPU-a"}))
    assert alloc(d) == [["GPU-b"]]
    d = decide(nodes, [], pod(containers=[ctr(gpus=2, mem=1)], annotations={"nvidia.com/nouse-gpuuuid": "GPU-a"}))
    assert d.node is None and "excluded by nvidia.com/nouse-gpuuuid" in verdict(d, "n1").reason


def test_numa_bind_keeps_a_container_on_one_numa_node():
    devs = [gpu("GPU-0", 0, numa=0), gpu("GPU-1", 1, numa=1), gpu("GPU-2", 2, numa=0), gpu("GPU-3", 3, numa=1)]
    nodes = nodelist(node("n1", devs))
    used = podlist(pod("p", node_name="n1", allocated="GPU-2,NVIDIA,80000,0:;"))  # numa 0 has one GPU left
    bind = {"nvidia.com/numa-bind": "true"}
    d = decide(nodes, used, pod(containers=[ctr(gpus=2, mem=10000)], annotations=bind))
    assert sorted(alloc(d)[0]) == ["GPU-1", "GPU-3"]
    d = decide(nodes, used, pod(containers=[ctr(gpus=3, mem=10000)]))
    assert d.node == "n1"  # without numa-bind any three
    d = decide(nodes, used, pod(containers=[ctr(gpus=3, mem=10000)], annotations=bind))
    assert d.node is None and "needs them on one NUMA node (numa 0: 1, numa 1: 2)" in verdict(d, "n1").reason


def test_usage_accumulates_between_containers():
    nodes = nodelist(node("n1", [gpu("GPU-a")]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,1000,50:;"))
    two = [ctr("a", mem=1000, cores=30), ctr("b", mem=1000, cores=30)]
    d = decide(nodes, used, pod(containers=two))
    assert d.node is None
    r = verdict(d, "n1").reason
    assert 'container "b" fits alone, but not beside container "a"' in r and "cores: 20% free, needs 30%" in r
    assert decide(nodes, [], pod(containers=two)).node == "n1"
    d = decide(nodes, [], pod(containers=[ctr("a", mem=50000), ctr("b", mem=40000)]))
    assert d.node is None


def test_a_later_container_moves_an_earlier_one_when_it_must():
    # spread puts "small" on the emptier GPU-b first; "big" only fits GPU-b, so the search moves "small".
    nodes = nodelist(node("n1", [gpu("GPU-a", mem=20480), gpu("GPU-b", 1, mem=40960)]))
    d = decide(nodes, [], pod(containers=[ctr("small", mem=10240), ctr("big", mem=40960)]))
    assert alloc(d) == [["GPU-a"], ["GPU-b"]]


def test_a_container_without_gpus_keeps_its_place():
    nodes = nodelist(node("n1", [gpu("GPU-a")]))
    d = decide(nodes, [], pod(containers=[ctr("side", gpus=None), ctr("main", mem=100)]))
    assert d.annotations[keys.POD_TO_ALLOCATE] == ";GPU-a,NVIDIA,100,0:;"


def test_init_containers_fit_alone():
    nodes = nodelist(node("n1", [gpu("GPU-a", mem=1000)]))
    d = decide(nodes, [], pod(init=[ctr("setup", mem=1000)], containers=[ctr("app", mem=1000)]))
    assert d.annotations[keys.POD_ALLOCATED] == "GPU-a,NVIDIA,1000,0:;GPU-a,NVIDIA,1000,0:;"


def test_a_pod_asking_no_gpu():
    d = decide(nodelist(node("n1", [gpu("GPU-a")])), [], pod(containers=[{"name": "web"}]))
    assert d.node is None and d.annotations == {} and all(n.fits for n in d.nodes)


# --- policies -------------------------------------------------------------------------------------------------

def cluster_for_policies():
    # n1 is fuller than n2; on each node GPU-x0 is fuller than GPU-x1.
    nodes = nodelist(node("n1", [gpu("GPU-10"), gpu("GPU-11", 1)]), node("n2", [gpu("GPU-20"), gpu("GPU-21", 1)]))
    pods = podlist(pod("a", node_name="n1", allocated="GPU-10,NVIDIA,40000,40:;"),
                   pod("b", node_name="n1", allocated="GPU-11,NVIDIA,10000,10:;"),
                   pod("c", node_name="n2", allocated="GPU-20,NVIDIA,20000,20:;"))
    return nodes, pods


def test_default_policies_binpack_nodes_spread_gpus():
    nodes, pods = cluster_for_policies()
    d = decide(nodes, pods, pod(containers=[ctr(mem=1000)]))
    assert d.node == "n1" and alloc(d) == [["GPU-11"]]
    assert [n.name for n in d.nodes] == ["n1", "n2"] and d.nodes[0].score > d.nodes[1].score


def test_pod_annotations_override_both_policies():
    nodes, pods = cluster_for_policies()
    d = decide(nodes, pods, pod(containers=[ctr(mem=1000)], annotations={
        "hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "binpack"}))
    assert d.node == "n2" and alloc(d) == [["GPU-20"]]
    assert [n.name for n in d.nodes] == ["n2", "n1"]


def test_config_sets_the_defaults():
    nodes, pods = cluster_for_policies()
    d = decide(nodes, pods, pod(containers=[ctr(mem=1000)]), ClusterConfig(node_policy="spread", gpu_policy="binpack"))
    assert d.node == "n2" and alloc(d) == [["GPU-20"]]


def test_every_feasible_node_is_kept_ranked():
    nodes = nodelist(*(node(f"n{i}", [gpu(f"GPU-{i}")]) for i in range(4)))
    pods = podlist(pod("p1", node_name="n1", allocated="GPU-1,NVIDIA,30000,0:;"),
                   pod("p3", node_name="n3", allocated="GPU-3,NVIDIA,80000,0:;"))
    d = decide(nodes, pods, pod(containers=[ctr(mem=10000)]))
    assert d.feasible == ["n1", "n0", "n2"] and not verdict(d, "n3").fits


def test_ties_break_by_name_and_index():
    nodes = nodelist(node("b", [gpu("GPU-b1", 1), gpu("GPU-b0", 0)]), node("a", [gpu("GPU-a1", 1), gpu("GPU-a0", 0)]))
    for policy in ("binpack", "spread"):
        d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={
            "hami.io/node-scheduler-policy": policy, "hami.io/gpu-scheduler-policy": policy}))
        assert d.node == "a" and alloc(d) == [["GPU-a0"]]


def topology_node(pods=()):
    # 0-1 and 2-3 are NVLink pairs (600); 0-2 is the next best (40); everything else crosses CPUs (10).
    ids = [f"GPU-{i}" for i in range(4)]
    link = {(0, 1): 600, (2, 3): 600, (0, 2): 40}
    scores = {a: {b: link.get((min(i, j), max(i, j)), 10) for j, b in enumerate(ids) if j != i}
              for i, a in enumerate(ids)}
    return nodelist(node("n1", [gpu(u, i) for i, u in enumerate(ids)], scores)), podlist(*pods)


TOPO = {"hami.io/gpu-scheduler-policy": "topology-aware"}


def test_topology_one_gpu_takes_the_worst_connected():
    nodes, pods = topology_node()
    # link sums to the others: GPU-0 650, GPU-1 620, GPU-2 650, GPU-3 620: GPU-1 and GPU-3 tie; HAMi walks
    # equal GPUs from the last listed, so GPU-3 comes first
    assert alloc(decide(nodes, pods, pod(containers=[ctr(mem=1)], annotations=TOPO))) == [["GPU-3"]]
    # without topology spread takes the least used; equal GPUs: the last listed (HAMi's Fit walks backwards)
    assert alloc(decide(nodes, pods, pod(containers=[ctr(mem=1)]))) == [["GPU-3"]]


def test_topology_many_gpus_take_the_best_connected_set():
    nodes, pods = topology_node([pod("p", node_name="n1", allocated="GPU-1,NVIDIA,81920,0:;")])
    d = decide(nodes, pods, pod(containers=[ctr(gpus=2, mem=1000)], annotations=TOPO))
    assert sorted(alloc(d)[0]) == ["GPU-2", "GPU-3"]
    d = decide(nodes, pods, pod(containers=[ctr(gpus=3, mem=1000)], annotations=TOPO))
    assert sorted(alloc(d)[0]) == ["GPU-0", "GPU-2", "GPU-3"]


def test_topology_ties_follow_the_gpu_policy():
    nodes, _ = topology_node()
    pods = podlist(pod("p", node_name="n1", allocated="GPU-2,NVIDIA,1000,0:GPU-3,NVIDIA,1000,0:;"))
    # the pairs 0-1 and 2-3 tie at 600; spread prefers the emptier 0-1, binpack the fuller 2-3
    assert sorted(alloc(decide(nodes, pods, pod(containers=[ctr(gpus=2, mem=1)], annotations=TOPO)))[0]) == \
        ["GPU-0", "GPU-1"]
    binpack = {"hami.io/gpu-scheduler-policy": "binpack,topology-aware"}
    assert sorted(alloc(decide(nodes, pods, pod(containers=[ctr(gpus=2, mem=1)], annotations=binpack)))[0]) == \
        ["GPU-2", "GPU-3"]


# --- modes ----------------------------------------------------------------------------------------------------

def test_mode_annotation_must_match():
    nodes = nodelist(node("core", [gpu("GPU-c")]), node("mps", [gpu("GPU-m", mode="mps")]))
    d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={"nvidia.com/vgpu-mode": "mps"}))
    assert d.node == "mps" and d.placements[0][0].mode == "mps"
    assert "mode hami-core is not in nvidia.com/vgpu-mode 'mps'" in verdict(d, "core").reason
    d = decide(nodes, [], pod(containers=[ctr(mem=1)], annotations={"nvidia.com/vgpu-mode": "hami-core"}))
    assert d.node == "core" and d.placements[0][0].mode == "hami-core"


def test_mps_fits_like_hami_core_and_is_marked():
    nodes = nodelist(node("n1", [gpu("GPU-m", mode="mps", mem=16384)]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-m,NVIDIA,8000,50:;"))
    d = decide(nodes, used, pod(containers=[ctr(mem=8000, cores=50)]))
    assert d.node == "n1" and d.placements[0][0].mode == "mps"
    assert decide(nodes, used, pod(containers=[ctr(mem=8385)])).node is None


MIG = "NVIDIA A100-SXM4-80GB"


def test_mig_picks_a_geometry_and_an_instance():
    nodes = nodelist(node("n1", [gpu("GPU-m", count=7, type=MIG, mode="mig")]))
    d = decide(nodes, [], pod(containers=[ctr(mem=5000)], annotations={"nvidia.com/vgpu-mode": "mig"}))
    p = d.placements[0][0]
    # a fresh GPU takes the first geometry with a big enough template: 7 x 1g.10gb, charged as the template
    assert (p.mig_template, p.mig_geometry, p.mig_instance, p.usedmem, p.usedcores) == ("1g.10gb", 0, 0, 10240, 14)
    assert d.annotations[keys.POD_TO_ALLOCATE] == "GPU-m[0-0],NVIDIA,10240,14:;"
    d = decide(nodes, [], pod(containers=[ctr(mem=15000)]))
    assert d.placements[0][0].mig_template == "2g.20gb" and d.placements[0][0].mig_geometry == 1


def test_mig_keeps_the_geometry_in_use():
    nodes = nodelist(node("n1", [gpu("GPU-m", count=7, type=MIG, mode="mig")]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-m[2-0],NVIDIA,40960,42:;"))  # 2 x 3g.40gb, one used
    d = decide(nodes, used, pod(containers=[ctr(mem=5000)]))
    assert (d.placements[0][0].mig_template, d.placements[0][0].mig_instance) == ("3g.40gb", 1)
    full = podlist(pod("p", node_name="n1", allocated="GPU-m[2-0],NVIDIA,40960,42:GPU-m[2-1],NVIDIA,40960,42:;"))
    d = decide(nodes, full, pod(containers=[ctr(mem=5000)]))
    assert d.node is None


def test_mig_geometry_too_small_and_unknown_models():
    nodes = nodelist(node("n1", [gpu("GPU-m", count=7, type=MIG, mode="mig")]),
                     node("n2", [gpu("GPU-x", count=7, type="NVIDIA RTX 4090", mode="mig")]))
    d = decide(nodes, [], pod(containers=[ctr(mem=90000)]))
    assert d.node is None
    assert "no MIG geometry is known for 'NVIDIA RTX 4090'" in verdict(d, "n2").reason


def test_mig_usage_contradictions_block_the_gpu():
    nodes = nodelist(node("n1", [gpu("GPU-m", count=7, type=MIG, mode="mig"), gpu("GPU-c", 1)]))
    pods = podlist(pod("a", node_name="n1", allocated="GPU-m[0-0],NVIDIA,10240,14:;"),
                   pod("b", node_name="n1", allocated="GPU-m[2-0],NVIDIA,40960,42:;"),
                   pod("c", node_name="n1", allocated="GPU-c[0-0],NVIDIA,1,1:;"))
    d = decide(nodes, pods, pod(containers=[ctr(mem=1)]))
    r = verdict(d, "n1").reason
    assert d.node is None and "pods use MIG geometries 0 and 2" in r and "holds a MIG instance on this hami-core" in r


def test_registered_templates_win_over_the_table():
    text = ('[{"id": "GPU-m", "count": 7, "devmem": 40960, "devcore": 100, "type": "' + A100 + '", "mode": "mig", '
            '"health": true, "migtemplate": [[{"name": "4g.20gb", "core": 57, "memory": 20480, "count": 2}]]}]')
    d = decide(nodelist(node("n1", text)), [], pod(containers=[ctr(mem=100)]))
    assert d.placements[0][0].mig_template == "4g.20gb"


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_decisions_are_repeatable(policy):
    nodes, pods = cluster_for_policies()
    p = pod(containers=[ctr(gpus=2, mem=1000)], annotations={"hami.io/node-scheduler-policy": policy})
    assert decide(nodes, pods, p) == decide(nodes, pods, p)
