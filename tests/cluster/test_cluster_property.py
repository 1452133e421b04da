"""Whatever the existing pods: a decision never over-commits a GPU's memory, cores or slots, and a pod that
fits somewhere (by a brute-force oracle, written apart from the core) is never refused.

The oracle tries every assignment of distinct GPUs to each container, in container order with usage
accumulating, under the rules of issue 15 section 3 stated plainly below. Small clusters keep it exhaustive.
"""

from __future__ import annotations

from itertools import combinations

from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pyvgpu.cluster.core.decide import decide

TYPES = ("NVIDIA A100-SXM4-80GB", "Tesla T4")


@st.composite
def clusters(draw):
    nodes, usage, pods = [], {}, []
    for n in range(draw(st.integers(1, 3))):
        devs = []
        for i in range(draw(st.integers(1, 4))):
            d = gpu(f"GPU-{n}-{i}", i, count=draw(st.integers(1, 4)), mem=draw(st.sampled_from((1000, 2000, 4000))),
                    core=draw(st.sampled_from((100, 100, 100, 200))), numa=draw(st.integers(0, 1)),
                    type=draw(st.sampled_from(TYPES)), mode=draw(st.sampled_from(("hami-core", "mps"))),
                    health=draw(st.integers(0, 9)) > 0)
            devs.append(d)
            usage[d.id] = [0, 0, 0]
        nodes.append(node(f"n{n}", devs))
        # existing pods: any usage at all, over-commitment included
        for k in range(draw(st.integers(0, 4))):
            d = draw(st.sampled_from(devs))
            mem = draw(st.sampled_from((0, 500, 1000, 1500, 3000, 4500)))
            cores = draw(st.sampled_from((0, 10, 50, 100)))
            pods.append(pod(f"old-{n}-{k}", node_name=f"n{n}", allocated=f"{d.id},NVIDIA,{mem},{cores}:;"))
            usage[d.id][0] += 1
            usage[d.id][1] += mem
            usage[d.id][2] += cores
    return nodes, pods, usage


@st.composite
def new_pods(draw):
    containers = []
    asks = []
    for c in range(draw(st.sampled_from((1, 1, 1, 2, 3)))):
        nums = draw(st.sampled_from((0, 1, 1, 1, 2, 3)))
        mem = draw(st.sampled_from((None, 300, 1000, 1000, 1500, 2500)))
        pct = draw(st.sampled_from((None, 25, 50, 100))) if mem is None else None
        cores = draw(st.sampled_from((None, 0, 30, 50, 100)))
        containers.append(ctr(f"c{c}", gpus=nums if nums else None, mem=mem if nums else None,
                              pct=pct if nums else None, cores=cores if nums else None))
        asks.append((nums, mem, pct, cores or 0))
    annos = {}
    if draw(st.booleans()):
        annos["hami.io/node-scheduler-policy"] = draw(st.sampled_from(("binpack", "spread")))
    if draw(st.booleans()):
        annos["hami.io/gpu-scheduler-policy"] = draw(st.sampled_from(
            ("binpack", "spread", "topology-aware", "binpack,topology-aware")))
    if draw(st.integers(0, 3)) == 0:
        annos["nvidia.com/numa-bind"] = "true"
    if draw(st.integers(0, 4)) == 0:
        annos["nvidia.com/use-gputype"] = draw(st.sampled_from(("a100", "T4")))
    if draw(st.integers(0, 4)) == 0:
        annos["nvidia.com/vgpu-mode"] = draw(st.sampled_from(("mps", "hami-core", "hami-core,mps")))
    return pod("new", containers=containers, annotations=annos), asks, annos


@st.composite
def tight(draw):
    """One node whose GPUs differ, and a pod of several containers that just about fit: the cases where the
    first choice of an early container leaves a later one no room."""
    devs, usage, pods = [], {}, []
    for i in range(draw(st.integers(2, 3))):
        d = gpu(f"GPU-{i}", i, count=draw(st.integers(2, 4)), mem=draw(st.sampled_from((2000, 3000, 4000))),
                numa=draw(st.integers(0, 1)))
        devs.append(d)
        usage[d.id] = [0, 0, 0]
        if draw(st.booleans()):
            mem, cores = draw(st.sampled_from((0, 1000))), draw(st.sampled_from((0, 30, 50)))
            pods.append(pod(f"old-{i}", node_name="n0", allocated=f"{d.id},NVIDIA,{mem},{cores}:;"))
            usage[d.id] = [1, mem, cores]
    containers, asks = [], []
    for c in range(draw(st.integers(2, 3))):
        nums, mem, cores = draw(st.integers(1, 2)), draw(st.sampled_from((1000, 2000, 3000, 4000))), \
            draw(st.sampled_from((0, 30, 50, 70, 100)))
        containers.append(ctr(f"c{c}", gpus=nums, mem=mem, cores=cores))
        asks.append((nums, mem, None, cores))
    annos = {"hami.io/gpu-scheduler-policy": draw(st.sampled_from(("binpack", "spread", "topology-aware")))}
    if draw(st.booleans()):
        annos["nvidia.com/numa-bind"] = "true"
    return ([node("n0", devs)], pods, usage), (pod("new", containers=containers, annotations=annos), asks, annos)


def allowed(d, annos) -> bool:
    if not d["health"]:
        return False
    if "nvidia.com/use-gputype" in annos and annos["nvidia.com/use-gputype"].upper() not in d["type"].upper():
        return False
    return "nvidia.com/vgpu-mode" not in annos or d["mode"] in annos["nvidia.com/vgpu-mode"].split(",")


def takes(d, state, ask) -> bool:
    _, mem, pct, cores = ask
    used, umem, ucores = state
    need = mem if mem else d["devmem"] * (pct or 100) // 100
    return (used < d["count"] and d["devmem"] - umem >= need and d["devcore"] - ucores >= cores
            and not (cores == 100 and d["devcore"] == 100 and used > 0)
            and not (cores == 0 and d["devcore"] and ucores >= d["devcore"]))


def oracle_fits(devs, usage, asks, annos) -> bool:
    numa = annos.get("nvidia.com/numa-bind") == "true"
    ok = [d for d in devs if allowed(d, annos)]

    def place(k, state) -> bool:
        if k == len(asks):
            return True
        ask = asks[k]
        if ask[0] == 0:
            return place(k + 1, state)
        for combo in combinations(ok, ask[0]):
            if numa and len({d["numa"] for d in combo}) > 1:
                continue
            if all(takes(d, state[d["id"]], ask) for d in combo):
                nxt = dict(state)
                for d in combo:
                    u, m, c = nxt[d["id"]]
                    nxt[d["id"]] = (u + 1, m + (ask[1] or d["devmem"] * (ask[2] or 100) // 100), c + ask[3])
                if place(k + 1, nxt):
                    return True
        return False

    return place(0, {d["id"]: tuple(usage[d["id"]]) for d in devs})


def registered(n):
    import json
    return json.loads(n["metadata"]["annotations"]["hami.io/node-nvidia-register"])


def check(cluster, new):
    nodes, pods, usage = cluster
    the_pod, asks, annos = new
    d = decide(nodelist(*nodes), podlist(*pods), the_pod)
    if not any(a[0] for a in asks):
        assert d.node is None and all(n.fits for n in d.nodes)
        return
    verdicts = {n.name: n.fits for n in d.nodes}
    oracle = {n["metadata"]["name"]: oracle_fits(registered(n), usage, asks, annos) for n in nodes}
    assert verdicts == oracle  # every node: fits exactly when some placement exists
    assert (d.node is not None) == any(oracle.values())
    if d.node is None:
        return
    devs = {x["id"]: x for x in registered(next(n for n in nodes if n["metadata"]["name"] == d.node))}
    after = {u: list(usage[u]) for u in devs}
    for ask, placed in zip(asks, d.placements, strict=True):
        assert len(placed) == ask[0] and len({p.uuid for p in placed}) == ask[0]
        if annos.get("nvidia.com/numa-bind") == "true" and placed:
            assert len({devs[p.uuid]["numa"] for p in placed}) == 1
        for p in placed:
            assert allowed(devs[p.uuid], annos)
            after[p.uuid][0] += 1
            after[p.uuid][1] += p.usedmem
            after[p.uuid][2] += p.usedcores
    for u, (used, mem, cores) in after.items():
        if (used, mem, cores) != tuple(usage[u]):  # a GPU the pod was given: within every limit
            assert used <= devs[u]["count"] and mem <= devs[u]["devmem"] and cores <= devs[u]["devcore"]


# Edge cases pinned, besides what hypothesis draws: a whole-GPU request beside a container that asks no
# cores; and a pod whose first container must leave the roomier GPU to the second.
_GPU = gpu("GPU-0-0", count=4, mem=4000)
_EXCLUSIVE = (([node("n0", [_GPU])], [pod("old", node_name="n0", allocated="GPU-0-0,NVIDIA,100,0:;")],
               {"GPU-0-0": [1, 100, 0]}),
              (pod("new", containers=[ctr(mem=1000, cores=100)]), [(1, 1000, None, 100)], {}))
_MOVE = (([node("n0", [gpu("GPU-0-0", mem=2000), gpu("GPU-0-1", 1, mem=4000)])], [],
          {"GPU-0-0": [0, 0, 0], "GPU-0-1": [0, 0, 0]}),
         (pod("new", containers=[ctr("a", mem=1000), ctr("b", mem=4000)]), [(1, 1000, None, 0), (1, 4000, None, 0)],
          {}))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), new_pods())
@example(*_EXCLUSIVE)
@example(*_MOVE)
def test_never_over_commits_and_never_refuses_a_pod_that_fits(cluster, new):
    check(cluster, new)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(tight())
def test_containers_that_fit_only_one_way_are_placed(case):
    check(*case)
