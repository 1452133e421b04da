"""Whatever a HAMi v2.10 node offers (migProfiles) and its pods reserve (hami.io/vgpu-mig-allocations): a
decision places only profiles and placements the node offered, never on a placement reserved or taken
twice, and a container that fits by an oracle written apart from the core (HAMi's rule stated plainly:
pkg/device/nvidia/device.go selectMigCandidate, mig_topology.go selectMigPlacement) is never refused.
"""

from __future__ import annotations

import json

from cluster_helpers import ctr, node, nodelist, pod, podlist
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.decide import decide

# name, MiB, cores, slices, every placement NVML offers on an A100 40 GB
A100 = (("1g.5gb", 5120, 14, 1, tuple((s, 1) for s in range(7))),
        ("2g.10gb", 10240, 28, 2, ((0, 2), (2, 2), (4, 2))),
        ("3g.20gb", 20480, 42, 3, ((0, 4), (4, 4))),
        ("7g.40gb", 40960, 100, 8, ((0, 8),)))


def overlaps(a, b) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def oracle_room(profiles, taken, mem, n) -> int:
    """How many instances of `mem` MiB one after another: the smallest profile that holds it and has a free
    placement (1g and 3g from the top), again and again."""
    taken = list(taken)
    got = 0
    while got < n:
        pick = None
        for name, pmem, _, _slices, places in sorted(profiles, key=lambda p: (p[1], p[3])):
            if pmem < mem:
                continue
            order = sorted(places, key=lambda pl: -pl[0] if name[:3] in ("1g.", "3g.") else pl[0])
            pick = next((pl for pl in order if not any(overlaps(pl, t) for t in taken)), None)
            if pick is not None:
                break
        if pick is None:
            break
        taken.append(pick)
        got += 1
    return got


@st.composite
def mig_nodes(draw):
    gpus, reserved, pods = [], {}, []
    for i in range(draw(st.integers(1, 3))):
        uuid = f"GPU-{i}"
        profiles = []
        for name, mem, core, slices, places in A100:
            if draw(st.booleans()):
                kept = tuple(p for p in places if draw(st.integers(0, 3)) > 0)
                profiles.append((name, mem, core, slices, kept))
        gpus.append({"id": uuid, "index": i, "count": 7, "devmem": 40960, "devcore": 100, "type": "NVIDIA-A100",
                     "numa": 0, "health": True, "mode": "mig",
                     "migProfiles": [{"name": n, "memoryMB": m, "core": c, "sliceCount": s,
                                      "placements": [{"start": a, "size": b} for a, b in pl]}
                                     for n, m, c, s, pl in profiles]})
        taken: list = []
        for k in range(draw(st.integers(0, 3))):  # existing pods' reservations, of any placement not taken
            free = [(n, m, c, pl) for n, m, c, _, pls in A100 for pl in pls if not any(overlaps(pl, t) for t in taken)]
            if not free:
                break
            n, m, c, pl = draw(st.sampled_from(free))
            taken.append(pl)
            alloc = [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": uuid, "profile": n,
                      "placement": {"start": pl[0], "size": pl[1]}}]
            pods.append(pod(f"old-{i}-{k}", node_name="n1", allocated=f"{uuid},NVIDIA,{m},{c}:;",
                            annotations={keys.POD_MIG_ALLOCATIONS: json.dumps(alloc)}))
        reserved[uuid] = (profiles, taken)
    return node("n1", json.dumps(gpus)), pods, reserved


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mig_nodes(), st.integers(1, 4), st.sampled_from((1000, 5000, 6000, 10240, 15000, 30000)),
       st.sampled_from(("binpack", "spread", "topology-aware")))
def test_only_offered_free_placements_and_never_refused_when_it_fits(cluster, nums, mem, policy):
    n1, pods, reserved = cluster
    d = decide(nodelist(n1), podlist(*pods), pod(containers=[ctr(gpus=nums, mem=mem)],
                                                 annotations={keys.GPU_POLICY: policy}))
    fits = sum(oracle_room(p, t, mem, nums) for p, t in reserved.values()) >= nums
    event(f"fits={fits} nums={nums}")
    assert (d.node is not None) == fits, d.nodes[0].reason
    if d.node is None:
        return
    got = json.loads(d.annotations[keys.POD_MIG_ALLOCATIONS])
    assert len(got) == nums == d.annotations[keys.POD_TO_ALLOCATE].count(",NVIDIA,")
    new: dict[str, list] = {}
    for a in got:
        profiles, taken = reserved[a["gpuUUID"]]
        pl = (a["placement"]["start"], a["placement"]["size"])
        offered = {p[0]: p for p in profiles}
        assert a["profile"] in offered and pl in offered[a["profile"]][4] and offered[a["profile"]][1] >= mem
        assert not any(overlaps(pl, t) for t in taken + new.get(a["gpuUUID"], []))
        new.setdefault(a["gpuUUID"], []).append(pl)
