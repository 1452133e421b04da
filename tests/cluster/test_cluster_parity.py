"""Decisions HAMi (v2.10) makes deterministically, made the same way (issue 30, items 1, 2, 4, 5, 7, 8).

Each case states HAMi's documented behaviour (file named) and checks pyvgpu's decision against it.
"""

from __future__ import annotations

import pytest
from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist

from pyvgpu.cluster.core import explain, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.decide import decide
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.request import pod_request


def chosen(d) -> list[str]:
    return [p.uuid for c in d.placements for p in c]


# --- item 1: exclusive cores by default (pkg/device/nvidia/device.go defaultExclusiveCoreIfNeeded) ---------

@pytest.mark.parametrize("c, cores", [
    (ctr(gpus=1), 100),                      # a count, no memory, no cores: the GPU alone
    (ctr(gpus=2, pct=100), 100),             # 100% of the memory is the same
    (ctr(gpus=1, pct=50), 0),                # a share of the memory: no default
    (ctr(gpus=1, mem=4096), 0),              # MiB asked: no default
    (ctr(gpus=1, cores=30), 30),             # cores asked: kept
    (ctr(gpus=1, cores=0), 0),               # 0 cores asked explicitly: kept
    (ctr(gpus=1, requests=True), 100),       # read from requests as from limits
    (ctr(gpus=None, pct=100), 100),          # the count the webhook adds (defaultGPUNum) counts too
])
def test_exclusive_core_default(c, cores):
    assert pod_request(pod(containers=[c])).containers[0].coresreq == cores


def test_exclusive_core_default_decides_the_gpu_alone_and_can_be_turned_off():
    nodes = nodelist(node("n1", [gpu("GPU-a")]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,1000,10:;"))
    d = decide(nodes, used, pod(containers=[ctr(gpus=1, pct=50)]))
    assert d.node == "n1"
    # a whole-GPU ask is exclusive: a GPU anything uses cannot take it (HAMi refuses it the same way)
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,0,0:;"))
    d = decide(nodes, used, pod(containers=[ctr(gpus=1, pct=100)]))
    assert d.node is None and "asks the whole GPU (100 cores)" in d.nodes[0].reason
    d = decide(nodelist(node("n1", [gpu("GPU-a")])), [], pod(containers=[ctr(gpus=1)]))
    assert d.annotations[keys.POD_TO_ALLOCATE] == "GPU-a,NVIDIA,81920,100:;"
    off = ClusterConfig(exclusive_core_default=False)
    assert pod_request(pod(containers=[ctr(gpus=1)]), off).containers[0].coresreq == 0


# --- item 5: lenient where HAMi schedules -------------------------------------------------------------------

def test_cores_above_100_are_clamped_with_a_warning():
    d = decide(nodelist(node("n1", [gpu("GPU-a")])), [], pod(containers=[ctr(gpus=1, mem=1000, cores=150)]))
    assert d.node == "n1" and d.placements[0][0].usedcores == 100
    assert any("nvidia.com/gpucores 150 is above 100; read as 100" in w for w in d.warnings)
    assert "warning: pod default/new, container \"main\": nvidia.com/gpucores 150" in explain.to_text(d)
    assert explain.to_json(d)["warnings"] == list(d.warnings)
    with pytest.raises(ClusterInputError, match="nvidia.com/gpucores"):
        pod_request(pod(containers=[ctr(gpus=1, cores=-1)]))  # below 0 stays an error


@pytest.mark.parametrize("value, bound", [("yes", False), ("sure", False), (" true", False), ("1", True),
                                          ("T", True), ("False", False)])
def test_numa_bind_is_read_as_go_parsebool(value, bound):
    r = pod_request(pod(annotations={keys.NUMA_BIND: value}))
    assert r.numa_bind is bound
    assert bool(r.warnings) is (value not in ("1", "T", "False"))


def test_undecodable_allocation_is_skipped_and_the_node_kept():
    nodes = nodelist(node("n1", [gpu("GPU-a")]))
    bad = pod("bad", node_name="n1", allocated="GPU-a,NVIDIA,notanumber,0:;")
    good = pod("good", node_name="n1", allocated="GPU-a,NVIDIA,80000,0:;")
    d = decide(nodes, podlist(bad, good), pod(containers=[ctr(gpus=1, mem=1000, cores=10)]))
    assert d.node == "n1"  # HAMi skips the pod (its GPUs count as free) and keeps the node
    assert any("pod default/bad was skipped" in w for w in d.warnings)
    # the good pod still counts: 1920 MiB are left
    d = decide(nodes, podlist(bad, good), pod(containers=[ctr(gpus=1, mem=2000, cores=10)]))
    assert d.node is None and "1920 MiB free" in d.nodes[0].reason


# --- item 4: NUMA order and ties (pkg/scheduler/policy/gpu_policy.go Less, Fit walks from the end) ----------

FOUR = [gpu("GPU-0", 0, numa=0), gpu("GPU-1", 1, numa=0), gpu("GPU-2", 2, numa=1), gpu("GPU-3", 3, numa=1)]


@pytest.mark.parametrize("policy", [keys.BINPACK, keys.SPREAD])
def test_equal_gpus_fall_to_the_higher_numa_then_the_last_listed(policy):
    d = decide(nodelist(node("n1", FOUR)), [], pod(containers=[ctr(gpus=1, mem=1000, cores=10)],
                                                   annotations={keys.GPU_POLICY: policy}))
    assert chosen(d) == ["GPU-3"]
    same_numa = [gpu(f"GPU-{i}", i, numa=0) for i in range(3)]
    d = decide(nodelist(node("n1", same_numa)), [], pod(containers=[ctr(gpus=2, mem=1000, cores=10)],
                                                        annotations={keys.GPU_POLICY: policy}))
    assert chosen(d) == ["GPU-2", "GPU-1"]


@pytest.mark.parametrize("policy", [keys.BINPACK, keys.SPREAD])
def test_equal_gpus_fall_to_the_higher_numa_before_the_last_listed(policy):
    # HAMi#1806: Less breaks equal scores by NUMA (the lower NUMA sorts first, and Fit walks from the end), so
    # the higher NUMA node wins even where its GPUs are listed first; among them, the last listed
    first_listed_high = [gpu("GPU-0", 0, numa=1), gpu("GPU-1", 1, numa=1), gpu("GPU-2", 2, numa=0),
                         gpu("GPU-3", 3, numa=0)]
    d = decide(nodelist(node("n1", first_listed_high)), [], pod(containers=[ctr(gpus=1, mem=1000, cores=10)],
                                                                annotations={keys.GPU_POLICY: policy}))
    assert chosen(d) == ["GPU-1"]
    d = decide(nodelist(node("n1", first_listed_high)), [], pod(containers=[ctr(gpus=2, mem=1000, cores=10)],
                                                                annotations={keys.GPU_POLICY: policy}))
    assert chosen(d) == ["GPU-1", "GPU-0"]


def test_numa_bind_spread_tries_the_highest_numa_first_binpack_the_lowest():
    spread = pod(containers=[ctr(gpus=2, mem=1000, cores=10)], annotations={keys.NUMA_BIND: "true"})
    d = decide(nodelist(node("n1", FOUR)), [], spread)
    assert sorted(chosen(d)) == ["GPU-2", "GPU-3"]
    binpack = pod(containers=[ctr(gpus=2, mem=1000, cores=10)],
                  annotations={keys.NUMA_BIND: "true", keys.GPU_POLICY: keys.BINPACK})
    d = decide(nodelist(node("n1", FOUR)), [], binpack)
    assert sorted(chosen(d)) == ["GPU-0", "GPU-1"]


def test_numa_bind_orders_numa_before_score():
    # GPU-3 (numa 1) is busy, so spread without numa-bind takes the emptiest GPUs; with numa-bind, spread
    # still goes to NUMA 1 first, where two GPUs fit
    used = podlist(pod("p", node_name="n1", allocated="GPU-3,NVIDIA,40000,40:;"))
    req = pod(containers=[ctr(gpus=2, mem=1000, cores=10)], annotations={keys.NUMA_BIND: "true"})
    assert sorted(chosen(decide(nodelist(node("n1", FOUR)), used, req))) == ["GPU-2", "GPU-3"]
    req = pod(containers=[ctr(gpus=2, mem=1000, cores=10)])
    assert sorted(chosen(decide(nodelist(node("n1", FOUR)), used, req))) == ["GPU-1", "GPU-2"]


# --- item 7: mutex and policy chains (gpu_policy.go gpuSortKeyChain, util.PolicyContains) -----------------

def test_mutex_takes_only_unused_gpus():
    used = podlist(pod("p", node_name="n1", allocated="GPU-3,NVIDIA,1000,10:;"))
    req = pod(containers=[ctr(gpus=1, mem=1000, cores=10)], annotations={keys.GPU_POLICY: "mutex"})
    assert chosen(decide(nodelist(node("n1", FOUR)), used, req)) == ["GPU-2"]
    busy = podlist(*(pod(f"p{i}", node_name="n1", allocated=f"GPU-{i},NVIDIA,1000,10:;") for i in range(4)))
    d = decide(nodelist(node("n1", FOUR)), busy, req)
    assert d.node is None and "mutex takes only unused GPUs" in d.nodes[0].reason
    # in a comma list too
    req = pod(containers=[ctr(gpus=1, mem=1000, cores=10)], annotations={keys.GPU_POLICY: "binpack,mutex"})
    assert chosen(decide(nodelist(node("n1", FOUR)), used, req)) == ["GPU-2"]


def test_policy_chain_sort_keys_in_the_order_written():
    used = podlist(pod("p", node_name="n1", allocated="GPU-0,NVIDIA,1000,10:;"))
    one = [ctr(gpus=1, mem=1000, cores=10)]
    # binpack first: the fullest GPU
    assert chosen(decide(nodelist(node("n1", FOUR)), used,
                         pod(containers=one, annotations={keys.GPU_POLICY: "binpack,numa"}))) == ["GPU-0"]
    # numa first: the lower NUMA node is tried last, so NUMA 1; then spread, then the higher index
    assert chosen(decide(nodelist(node("n1", FOUR)), used,
                         pod(containers=one, annotations={keys.GPU_POLICY: "numa,spread"}))) == ["GPU-3"]
    r = pod_request(pod(annotations={keys.GPU_POLICY: "spread,topology-aware"}))
    assert r.gpu_chain == ("spread",) and r.topology and r.gpu_policy == "spread"
    assert pod_request(pod(annotations={keys.GPU_POLICY: "mutex,topology-aware"})).gpu_chain == ("spread",)
    with pytest.raises(ClusterInputError, match="'best' is not a GPU policy"):
        pod_request(pod(annotations={keys.GPU_POLICY: "binpack,best"}))


# --- item 8: per-pod scoring weights (pkg/util/device_scoring_weights.go) ----------------------------------

def test_scoring_weights_change_which_gpu_binpack_fills():
    # GPU-0 has more slots taken, GPU-1 more memory; memory weighted 10x makes GPU-1 the fullest
    # (default: 10*(0.7+0.1+0.009) against 10*(0.2+0.1+0.256); memory x10: 0.885 against 2.86)
    two = [gpu("GPU-0", 0), gpu("GPU-1", 1)]
    used = podlist(*(pod(f"s{i}", node_name="n1", allocated="GPU-0,NVIDIA,100,0:;") for i in range(6)),
                   pod("m", node_name="n1", allocated="GPU-1,NVIDIA,20000,0:;"))
    base = {keys.GPU_POLICY: keys.BINPACK}
    req = pod(containers=[ctr(gpus=1, mem=1000, cores=10)], annotations=base)
    assert chosen(decide(nodelist(node("n1", two)), used, req)) == ["GPU-0"]
    req = pod(containers=[ctr(gpus=1, mem=1000, cores=10)],
              annotations={**base, keys.SCORING_WEIGHTS: "slot=1,core=1,memory=10"})
    assert chosen(decide(nodelist(node("n1", two)), used, req)) == ["GPU-1"]


@pytest.mark.parametrize("value", ["slot=1,core=1", "slot=1,core=1,core=2", "slot=1,core=x,memory=1",
                                   "slot=-1,core=1,memory=1", "slot=0,core=0,memory=0", "slot=1,core=1,mem=1"])
def test_scoring_weights_refused_as_hami_refuses_them(value):
    with pytest.raises(ClusterInputError, match=keys.SCORING_WEIGHTS):
        pod_request(pod(annotations={keys.SCORING_WEIGHTS: value}))


# --- item 2: init containers (pkg/device/initContainer.go AppContainersOnlyDeviceUsage) --------------------

def _init_pod(statuses):
    p = pod("p", node_name="n1", init=[ctr("init", gpus=1, mem=60000, cores=50)],
            containers=[ctr("app", gpus=1, mem=10000, cores=10)],
            allocated="GPU-a,NVIDIA,60000,50:;GPU-a,NVIDIA,10000,10:;")
    if statuses is not None:
        p["status"]["initContainerStatuses"] = statuses
    return p


def _done(code=0):
    return {"name": "init", "state": {"terminated": {"exitCode": code}}}


@pytest.mark.parametrize("statuses, free", [
    (None, 81920 - 60000),                                # not started: the init peak counts
    ([{"name": "init", "state": {"running": {}}}], 81920 - 60000),
    ([_done(1)], 81920 - 60000),                          # failed: HAMi keeps charging
    ([_done(0)], 81920 - 10000),                          # all exited 0: the app containers only
])
def test_init_containers_stop_counting_once_all_exited_0(statuses, free):
    nodes = nodelist(node("n1", [gpu("GPU-a")]))
    fits = decide(nodes, podlist(_init_pod(statuses)), pod(containers=[ctr(gpus=1, mem=free, cores=10)]))
    assert fits.node == "n1"
    over = decide(nodes, podlist(_init_pod(statuses)), pod(containers=[ctr(gpus=1, mem=free + 1, cores=10)]))
    assert over.node is None


def test_a_gpu_only_init_containers_held_is_free_once_they_are_done():
    nodes = nodelist(node("n1", [gpu("GPU-a"), gpu("GPU-b", 1)]))
    p = pod("p", node_name="n1", init=[ctr("init", gpus=1, mem=81920, cores=100)],
            containers=[ctr("app", gpus=1, mem=1000, cores=10)],
            allocated="GPU-b,NVIDIA,81920,100:;GPU-a,NVIDIA,1000,10:;")
    whole = pod(containers=[ctr(gpus=2, mem=1000, cores=50)])
    assert decide(nodes, podlist(p), whole).node is None
    p["status"]["initContainerStatuses"] = [_done(0)]
    assert decide(nodes, podlist(p), whole).node == "n1"


# --- the filter's brief reasons count the same refusals as the long ones ------------------------------------

def test_refusal_kind_agrees_with_usage_reason():
    import random

    from pyvgpu.cluster.core.fit import refusal_kind, usage_reason
    from pyvgpu.cluster.core.model import ContainerRequest, DeviceUsage

    rng = random.Random(7)
    req = pod_request(pod())
    mutex = pod_request(pod(annotations={keys.GPU_POLICY: "mutex"}))
    for _ in range(3000):
        d = DeviceUsage("GPU-x", 0, rng.choice((1, 2, 10)), 1000, rng.choice((0, 100, 200)), "T", 0, "hami-core",
                        True, used=rng.randint(0, 10), usedmem=rng.choice((0, 500, 999, 1000)),
                        usedcores=rng.choice((0, 50, 100, 200)))
        c = ContainerRequest("m", 1, rng.choice((0, 1, 500, 1000)), 100, rng.choice((0, 1, 50, 100)))
        for r in (req, mutex):
            assert (refusal_kind(d, c, c.memory_on(1000), r, False) is None) == \
                (usage_reason(d, c, c.memory_on(1000), r.mutex) is None)


def test_filter_reasons_are_brief_and_explain_keeps_the_long_ones():
    from pyvgpu.cluster.core.decide import decide_on
    from pyvgpu.cluster.core.usage import node_infos

    nodes = nodelist(node("n1", [gpu("GPU-a", mem=1000), gpu("GPU-b", 1, mem=1000)]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,900,0:;"))
    req = pod_request(pod(containers=[ctr(gpus=2, mem=500, cores=10)]))
    brief = decide_on(node_infos(nodes, used), req, brief=True).nodes[0].reason
    assert brief == '1 of 2 GPU(s) can take container "main", 2 needed; refused for memory (1)'
    long = decide_on(node_infos(nodes, used), req).nodes[0].reason
    assert "GPU 0 GPU-a: memory: 100 MiB free of 1000, needs 500" in long


# --- item 3 (part): a HAMi v2.10 node registering dynamic MIG profiles ---------------------------------------

def test_dynamic_mig_profiles_are_never_replaced_by_pyvgpus_own_table():
    import json

    reg = json.dumps([{"id": "GPU-m", "index": 0, "count": 7, "devmem": 81920, "devcore": 100,
                       "type": "NVIDIA A100-SXM4-80GB", "numa": 0, "mode": "mig", "health": True,
                       "migProfiles": [{"name": "1g.10gb", "memory": 10240, "core": 14}]}])
    nodes = nodelist(node("n1", reg))
    d = decide(nodes, [], pod(containers=[ctr(gpus=1, mem=10000)]))
    assert d.node is None  # the profile as written offers no placement ("memory" is not HAMi's "memoryMB")
    assert "no offered profile of 10000 MiB or more has a free placement (offered: 1g.10gb (0 MiB)" \
        in d.nodes[0].reason  # the rest of item 3: tests/cluster/test_cluster_mig_profiles.py
    # without migProfiles the model's known geometries still apply (pyvgpu's own agent writes migtemplate)
    reg_old = json.dumps([{k: v for k, v in json.loads(reg)[0].items() if k != "migProfiles"}])
    assert decide(nodelist(node("n1", reg_old)), [], pod(containers=[ctr(gpus=1, mem=10000)])).node == "n1"


# --- item 6: namespace quotas (pkg/device/quota.go, nvidia fitQuota) ----------------------------------------

def _quota(ns, mem=None, cores=None, name="gpu"):
    hard = {}
    if mem is not None:
        hard["limits.nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        hard["limits.nvidia.com/gpucores"] = str(cores)
    return {"kind": "ResourceQuotaList", "items": [
        {"kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns}, "spec": {"hard": hard}}]}


def test_namespace_quota_limits_gpu_memory_and_cores():
    nodes = nodelist(node("n1", [gpu("GPU-a"), gpu("GPU-b", 1)]))
    used = podlist(pod("p", node_name="n1", allocated="GPU-a,NVIDIA,6000,30:;", namespace="team"),
                   pod("other", node_name="n1", allocated="GPU-b,NVIDIA,50000,50:;", namespace="elsewhere"))
    ask = pod(containers=[ctr(gpus=1, mem=4000, cores=20)], namespace="team")
    assert decide(nodes, used, ask, quotas=_quota("team", mem=10000)).node == "n1"  # 6000 + 4000
    d = decide(nodes, used, ask, quotas=_quota("team", mem=9999))
    assert d.node is None
    assert "namespace team's ResourceQuota allows 9999 MiB of GPU memory; its pods use 6000 and this pod asks " \
           "4000" in d.nodes[0].reason
    assert decide(nodes, used, ask, quotas=_quota("team", cores=49)).node is None  # 30 + 20 cores
    assert decide(nodes, used, ask, quotas=_quota("team", cores=50)).node == "n1"
    assert decide(nodes, used, ask, quotas=_quota("elsewhere", mem=1)).node == "n1"  # another namespace's
    # two GPUs of 4000 count 8000; a quota of 0 refuses every pod that asks the resource
    two = pod(containers=[ctr(gpus=2, mem=4000, cores=20)], namespace="team")
    assert decide(nodes, used, two, quotas=_quota("team", mem=13999)).node is None
    assert decide(nodes, [], ask, quotas=_quota("team", mem=0)).node is None
    # the smallest of two quotas of one namespace applies
    both = _quota("team", mem=100000)
    both["items"] += _quota("team", mem=9000, name="small")["items"]
    assert decide(nodes, used, ask, quotas=both).node is None


@pytest.mark.parametrize("policy", [keys.BINPACK, keys.SPREAD])
def test_namespace_quota_is_checked_per_candidate_gpu(policy):
    # HAMi's Fit calls fitQuota for each candidate GPU with the memory the share comes to on that GPU, and
    # skips one that would take the namespace over its quota: 50% of the 80 GiB GPU (40960 MiB) is over a
    # 30000 MiB quota, 50% of the 40 GiB one (20480 MiB) is within it
    nodes = nodelist(node("n1", [gpu("GPU-small", 0, mem=40960), gpu("GPU-big", 1, mem=81920)]))
    ask = pod(containers=[ctr(gpus=1, pct=50, cores=10)], namespace="team", annotations={keys.GPU_POLICY: policy})
    d = decide(nodes, [], ask, quotas=_quota("team", mem=30000))
    assert d.node == "n1" and chosen(d) == ["GPU-small"]
    assert d.placements[0][0].usedmem == 20480
    d = decide(nodes, [], ask, quotas=_quota("team", mem=20000))  # neither GPU keeps within it
    assert d.node is None and "allows 20000 MiB of GPU memory" in d.nodes[0].reason
    # an init container's GPU and the app's on one GPU count once (the peak), as HAMi collapses them
    both = pod(containers=[ctr(gpus=1, pct=50, cores=10)], init=[ctr("init", gpus=1, pct=50, cores=10)],
               namespace="team", annotations={keys.GPU_POLICY: policy})
    d = decide(nodes, [], both, quotas=_quota("team", mem=30000))
    assert d.node == "n1" and chosen(d) == ["GPU-small", "GPU-small"]


def test_the_webhook_refuses_a_pod_over_its_namespaces_quota():
    # HAMi v2.10 pkg/scheduler/webhook.go fitResourceQuota: MiB asked times GPUs (a share of memory counts 0)
    # and cores times GPUs, summed over the app containers or the largest init container's if more, plus what
    # the namespace holds, against the quota; the pod is denied at admission
    from pyvgpu.cluster.core.quota import Quotas
    from pyvgpu.cluster.scheduler.webhook import review

    q = Quotas()
    q.set_quota(_quota("team", mem=10000, cores=150)["items"][0], ("team", "gpu"))
    q.set_pod(("team", "held"), (4000, 50))

    def admit(containers, init=None, ns="team"):
        p = pod(containers=containers, init=init, namespace=ns)
        del p["metadata"]["name"]  # a pod being created may have only generateName
        p["metadata"]["generateName"] = "job-"
        body = {"request": {"uid": "u", "namespace": ns, "operation": "CREATE", "object": p}}
        return review(body, ClusterConfig(), "pyvgpu-scheduler", quotas=q)["response"]

    assert admit([ctr(gpus=2, mem=3000, cores=20)])["allowed"] is True  # 4000 + 6000 MiB, 50 + 40 cores
    r = admit([ctr(gpus=2, mem=3001, cores=20)])
    assert r["allowed"] is False and r["status"]["message"].startswith(
        "namespace team's ResourceQuota allows 10000 MiB of GPU memory; its pods use 4000 and this pod asks 6002")
    assert admit([ctr(gpus=1, mem=1000, cores=60), ctr("b", gpus=1, mem=1000, cores=41)])["allowed"] is False
    assert admit([ctr(gpus=1, pct=90, cores=10)])["allowed"] is True  # a share of memory counts 0
    assert admit([ctr(gpus=1)])["allowed"] is True  # 100 cores by default: 150 in all
    assert admit([ctr(gpus=2)])["allowed"] is False  # 200 cores
    # init containers run one at a time: the largest, or the app containers' sum if more
    init = [ctr("i1", gpus=1, mem=5000, cores=10), ctr("i2", gpus=1, mem=5000, cores=10)]
    assert admit([ctr(gpus=1, mem=1000, cores=10)], init=init)["allowed"] is True
    assert admit([ctr(gpus=1, mem=1000, cores=10)], init=[ctr("i", gpus=1, mem=6001, cores=10)])["allowed"] is False
    assert admit([ctr(gpus=1, mem=9000, cores=10)], ns="elsewhere")["allowed"] is True  # no quota there


def test_filter_verdicts_are_remembered_per_usage_and_forgotten_when_it_changes(monkeypatch):
    from pyvgpu.cluster.core import decide as decide_mod
    from pyvgpu.cluster.core.decide import decide_on
    from pyvgpu.cluster.core.usage import add_pod, node_infos

    infos = node_infos(nodelist(node("n1", [gpu("GPU-a", mem=1000)])), [])
    req = pod_request(pod(containers=[ctr(gpus=1, mem=600, cores=10)]))
    first = decide_on(infos, req, brief=True)
    assert first.node == "n1" and list(infos[0].fit_cache.values()) == [True]
    with monkeypatch.context() as m:
        m.setattr(decide_mod, "count_fit", lambda *a: pytest.fail("the remembered verdict was not used"))
        assert decide_on(infos, req, brief=True).nodes == first.nodes  # the same verdict, remembered
    add_pod(infos[0], first.devices)  # the usage changes: the verdicts go with it
    assert infos[0].fit_cache is None
    again = decide_on(infos, req, brief=True)
    assert again.node is None and "refused for memory (1)" in again.nodes[0].reason
