"""The work one dynamic-MIG decision may cost (HAMi v2.10 migProfiles): a GPU is offered once per free instance,
so a pod creator could make the search of a multi-container pod try many sets of instances. Counted in work
done (instances taken, placements examined), never in time."""

from __future__ import annotations

import json

import pytest
from cluster_helpers import ctr, node, nodelist, pod, podlist

from pyvgpu.cluster.core import place
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.fit import mig_room, slice_pick
from pyvgpu.cluster.core.policy import multisets
from pyvgpu.cluster.core.request import pod_request
from pyvgpu.cluster.core.usage import node_infos


def placements(*starts: int, size: int = 1) -> list[dict]:
    return [{"start": s, "size": size} for s in starts]


A100_PROFILES = [  # HAMi v2.10.0 mig_capability_test.go a100MigProfiles
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1, "placements": placements(*range(7))},
    {"name": "2g.10gb", "memoryMB": 10240, "core": 28, "sliceCount": 2, "placements": placements(0, 2, 4, size=2)},
    {"name": "3g.20gb", "memoryMB": 20480, "core": 42, "sliceCount": 3, "placements": placements(0, 4, size=4)},
]


def a100_node(n: int = 8):
    reg = [{"id": f"GPU-{i}", "index": i, "count": 7, "devmem": 40960, "devcore": 100, "type": "NVIDIA-A100-SXM4-40GB",
            "numa": 0, "health": True, "mode": "mig", "migProfiles": A100_PROFILES} for i in range(n)]
    (info,) = node_infos(nodelist(node("n1", json.dumps(reg))), podlist())
    return info


@pytest.fixture
def takes(monkeypatch):
    """Counts the instances plan() takes (each a slice_pick): the work a search does."""
    count = [0]
    real = place._take

    def counted(*a, **kw):
        count[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(place, "_take", counted)
    return count


@pytest.mark.parametrize("sizes", [(32, 32), (29, 28), (20, 20, 17), (12, 12, 12, 12, 9)])
def test_a_pod_asking_more_instances_than_the_node_has_is_refused_without_a_search(takes, sizes):
    # 8 A100s have 56 1g instances: the pod asks 57 or more
    req = pod_request(pod(containers=[ctr(f"c{j}", gpus=s, mem=4000) for j, s in enumerate(sizes)]))
    got = place.plan(a100_node(), req)
    assert not got.fits and "fits alone, but not beside" in got.reason
    assert takes[0] <= sum(sizes)  # the reason's one walk of first choices, not thousands of sets


def test_a_search_over_mig_instances_is_bounded_by_the_work_it_does(takes):
    # 28 1g instances (taken from the top of a GPU) leave at most 8 3g placements free: 2 on each of 4 untouched
    # GPUs; 1 to 3 of them on a GPU leave one, more leave none. The second container asks 9: only a search over
    # the sets of the first container's instances finds that none is left for it
    req = pod_request(pod(containers=[ctr("a", gpus=28, mem=4000), ctr("b", gpus=9, mem=20000)]))
    cfg = ClusterConfig(search_budget=3000)
    got = place.plan(a100_node(), req, cfg)
    assert not got.fits and "MIG placements in all" in got.reason
    assert takes[0] < 3000 * 28  # stopped by its work, before search_budget sets of 28 instances


def test_mig_room_counts_what_repeated_picks_take():
    info = a100_node(1)
    d = info.devices[0]
    for used in [(), ((6, 1),), ((0, 4),), ((2, 2), (6, 1))]:
        for mem in (1, 5120, 6000, 10240, 20000, 30000):
            d.slices_used = used
            n = 0
            while (got := slice_pick(d, mem)) is not None:
                d.slices_used += (got[1],)
                n += 1
            d.slices_used = used
            assert mig_room(d, mem, 99) == n and mig_room(d, mem, 1) == min(n, 1)


def test_topology_ranks_instance_sets_by_links_read_from_the_earlier_gpus_side():
    # a one-sided or uneven pair annotation: a pair is read from the first GPU of the set that has the pair,
    # as `pair` reads it; ranking by per-GPU counts must keep that side
    scores = {"G0": {"G1": 0}, "G1": {"G0": 3, "G2": 5}, "G2": {"G0": 0, "G1": 4}}
    got = list(multisets([("G0", 5), ("G1", 3), ("G2", 1)], 8, topology=True, scores=scores, uuid_of=lambda c: c))
    assert got == [("G0",) * 4 + ("G1",) * 3 + ("G2",), ("G0",) * 5 + ("G1",) * 2 + ("G2",), ("G0",) * 5 + ("G1",) * 3]


def test_further_instances_are_not_checked_against_count_memory_or_cores_as_in_hami():
    # HAMi v2.10.0 Fit checks Used < Count, the free memory and the free cores against the GPU as it was before
    # the container, and only the placements again for each further instance (docs/cluster.md, parity): a GPU
    # registered with 2 slots, 10240 MiB and 30% cores gives one container seven 1g.5gb instances
    reg = [{"id": "GPU-0", "index": 0, "count": 2, "devmem": 10240, "devcore": 30, "type": "NVIDIA-A100-SXM4-40GB",
            "numa": 0, "health": True, "mode": "mig", "migProfiles": A100_PROFILES[:1]}]
    (info,) = node_infos(nodelist(node("n1", json.dumps(reg))), podlist())
    got = place.plan(info, pod_request(pod(containers=[ctr(gpus=7, mem=4000)])))
    assert got.fits and len(got.placements[0]) == 7
    assert sum(p.usedmem for p in got.placements[0]) == 7 * 5120 and sum(p.usedcores for p in got.placements[0]) == 98
