"""HAMi v2.10 dynamic MIG (issue 30, item 3): a node registers the MIG profiles a GPU can be split by
(`migProfiles`: name, memoryMB, core, sliceCount, placements), a pod's slice is recorded in
hami.io/vgpu-mig-allocations, and one container may take several instances of one MIG GPU.

The cases are the facts of HAMi v2.10.0's own tests, named per case: pkg/device/nvidia/mig_capability_test.go,
pkg/device/nvidia/mig_topology_test.go, pkg/device/nvidia/device_test.go, pkg/scheduler/mig_allocation_test.go.
"""

from __future__ import annotations

import json

import pytest
from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist

from pyvgpu.cluster.core import codec, explain, keys
from pyvgpu.cluster.core.decide import decide
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.scheduler.webhook import ALLOCATION_KEYS

MIG_MODE = {keys.VGPU_MODE: "mig"}


def placements(*starts: int, size: int = 1) -> list[dict]:
    return [{"start": s, "size": size} for s in starts]


# The A100 (40 GB) profiles of mig_capability_test.go a100MigProfiles
A100_PROFILES = [
    {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1, "placements": placements(*range(7))},
    {"name": "2g.10gb", "memoryMB": 10240, "core": 28, "sliceCount": 2, "placements": placements(0, 2, 4, size=2)},
    {"name": "3g.20gb", "memoryMB": 20480, "core": 42, "sliceCount": 3, "placements": placements(0, 4, size=4)},
]


def register(*gpus: dict) -> str:
    return json.dumps(list(gpus))


def mig_gpu(uuid: str = "GPU-a", profiles: list | None = None, index: int = 0, count: int = 7) -> dict:
    return {"id": uuid, "index": index, "count": count, "devmem": 40960, "devcore": 100,
            "type": "NVIDIA-A100-SXM4-40GB", "numa": 0, "health": True, "mode": "mig",
            "migProfiles": A100_PROFILES if profiles is None else profiles}


def allocations(*slices: tuple) -> str:
    """hami.io/vgpu-mig-allocations of (gpu, profile, start, size[, container, device]) tuples."""
    out = []
    for k, s in enumerate(slices):
        uuid, profile, start, size = s[:4]
        c, d = s[4:6] if len(s) > 4 else (0, k)
        out.append({"containerIndex": c, "deviceIndex": d, "gpuUUID": uuid, "profile": profile,
                    "placement": {"start": start, "size": size}})
    return json.dumps(out)


def holder(name: str, entries: str, slices: str | None) -> dict:
    annos = {} if slices is None else {keys.POD_MIG_ALLOCATIONS: slices}
    return pod(name, node_name="n1", allocated=entries, annotations=annos)


def mig_allocs(d) -> list[dict]:
    return json.loads(d.annotations[keys.POD_MIG_ALLOCATIONS])


# --- the registration ------------------------------------------------------------------------------------

def test_registered_profiles_are_decoded_as_hami_writes_them():
    # device_test.go TestGetNodeDevices_MigProfilesFromNode: one 1g.5gb profile with one placement at 6
    text = ('[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","numa":0,'
            '"health":true,"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,'
            '"instanceCount":7,"multiprocessorCount":14,"placements":[{"start":6,"size":1}]}]}]')
    (d,) = codec.decode_register(text)
    (p,) = d.mig_profiles
    assert (p.name, p.memory, p.core, p.slices, p.placements) == ("1g.5gb", 5120, 14, 1, ((6, 1),))
    # and written back the same way (pyvgpu's own tests build registrations with it)
    assert json.loads(codec.encode_register([d]))[0]["migProfiles"] == [
        {"name": "1g.5gb", "memoryMB": 5120, "core": 14, "sliceCount": 1, "placements": [{"start": 6, "size": 1}]}]


@pytest.mark.parametrize("profiles, field", [
    ("x", "migprofiles"),
    ([{"memoryMB": 5120, "placements": []}], "migprofiles[0].name"),
    ([{"name": "1g.5gb", "memoryMB": -1}], "migprofiles[0].memorymb"),
    ([{"name": "1g.5gb", "memoryMB": 5120, "placements": [{"start": 0, "size": 0}]}],
     "migprofiles[0].placements[0].size"),
    ([{"name": "1g.5gb", "memoryMB": 5120, "placements": [{"start": 1e9, "size": 1}]}],
     "migprofiles[0].placements[0].start"),
    ([{"name": "1g.5gb", "memoryMB": 5120}, {"name": "1g.5gb", "memoryMB": 5120}], "migprofiles[1].name"),
    ([{"name": "1g.5gb", "memoryMB": 5120, "placements": placements(*range(65))}], "migprofiles[0].placements"),
    ([{"name": f"p{i}", "memoryMB": 1} for i in range(33)], "migprofiles"),
])
def test_a_malformed_registration_fails_loudly_in_explain_and_filter(profiles, field):
    nodes = nodelist(node("n1", register(mig_gpu(profiles=profiles))), node("n2", [gpu("GPU-c")]))
    d = decide(nodes, [], pod(containers=[ctr(mem=5000)]))
    n1 = next(n for n in d.nodes if n.name == "n1")
    assert not n1.fits and f"{keys.NODE_REGISTER}[0].{field}" in n1.reason, n1.reason
    assert d.node == "n2"  # the other node is not affected
    assert f"{keys.NODE_REGISTER}[0].{field}" in explain.to_text(d)


def test_profiles_are_never_replaced_by_pyvgpus_own_table():
    # registered: only 1g.5gb at placement 6. pyvgpu's own A100 table would offer 7 instances and 2g/3g sizes.
    reg = register(mig_gpu(profiles=[A100_PROFILES[0] | {"placements": placements(6)}]))
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(mem=5000)]))
    assert d.node == "n1" and mig_allocs(d)[0]["placement"] == {"start": 6, "size": 1}
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(mem=10000)]))
    assert d.node is None and "MIG" in d.nodes[0].reason  # no 2g offered: never a slice the node did not offer
    used = podlist(holder("p", "GPU-a,NVIDIA,5120,14:;", allocations(("GPU-a", "1g.5gb", 6, 1))))
    assert decide(nodelist(node("n1", reg)), used, pod(containers=[ctr(mem=5000)])).node is None


# --- placing (mig_capability_test.go, mig_topology_test.go) ----------------------------------------------

def test_the_reported_profile_and_placement_are_used():
    # mig_capability_test.go TestAddResourceUsageUsesReportedProfileAndPlacement: 10000 MiB -> 2g.10gb at 0
    d = decide(nodelist(node("n1", register(mig_gpu()))), [], pod(containers=[ctr(mem=10000)]))
    assert d.annotations[keys.POD_TO_ALLOCATE] == "GPU-a,NVIDIA,10240,28:;"  # the physical UUID, not rewritten
    assert mig_allocs(d) == [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-a", "profile": "2g.10gb",
                              "placement": {"start": 0, "size": 2}}]
    (p,), = d.placements
    assert (p.mig_template, p.usedmem, p.usedcores) == ("2g.10gb", 10240, 28)
    assert "GPU 0 GPU-a (mig 2g.10gb at slice 0, 2 slice(s)) 10240 MiB 28%" in explain.to_text(d)
    assert explain.to_json(d)["containers"][0]["devices"][0]["mig_placement"] == {"start": 0, "size": 2}


def test_placements_in_use_are_counted():
    # mig_capability_test.go TestCustomFilterUsesReportedPlacementCapacity: three 2g in use
    used = podlist(holder("p", "GPU-a,NVIDIA,10240,28:GPU-a,NVIDIA,10240,28:GPU-a,NVIDIA,10240,28:;",
                          allocations(("GPU-a", "2g.10gb", 0, 2), ("GPU-a", "2g.10gb", 2, 2),
                                      ("GPU-a", "2g.10gb", 4, 2))))
    nodes = nodelist(node("n1", register(mig_gpu())))
    d = decide(nodes, used, pod(containers=[ctr(mem=10000)]))
    assert d.node is None and "MIG" in d.nodes[0].reason, d.nodes[0].reason  # a fourth 2g does not fit
    d = decide(nodes, used, pod(containers=[ctr(mem=5000)]))
    assert mig_allocs(d)[0]["placement"] == {"start": 6, "size": 1}  # the 1g placement that is left


def test_a_percentage_of_the_memory_picks_the_profile():
    # mig_capability_test.go TestFitUsesEffectivePercentageMemoryForMigPlacement: 25% of 40960 with only 1g left
    used = podlist(holder("p", "GPU-a,NVIDIA,10240,28:GPU-a,NVIDIA,10240,28:GPU-a,NVIDIA,10240,28:;",
                          allocations(("GPU-a", "2g.10gb", 0, 2), ("GPU-a", "2g.10gb", 2, 2),
                                      ("GPU-a", "2g.10gb", 4, 2))))
    assert decide(nodelist(node("n1", register(mig_gpu()))), used, pod(containers=[ctr(pct=25)])).node is None


def test_balanced_packing_of_placements():
    # mig_topology_test.go TestSelectMigPlacementUsesBalancedPacking: 3g -> 4, 2g -> 0, 1g -> 3, 1g -> 2
    nodes = nodelist(node("n1", register(mig_gpu())))
    pods: list[dict] = []
    for i, (mem, profile, start) in enumerate([(20000, "3g.20gb", 4), (10000, "2g.10gb", 0), (5000, "1g.5gb", 3),
                                               (5000, "1g.5gb", 2)]):
        d = decide(nodes, podlist(*pods), pod(containers=[ctr(mem=mem)]))
        (got,) = mig_allocs(d)
        assert (got["profile"], got["placement"]["start"]) == (profile, start), i
        pods.append(holder(f"p{i}", d.annotations[keys.POD_ALLOCATED], d.annotations[keys.POD_MIG_ALLOCATIONS]))


def test_queued_instances_on_another_gpu_leave_this_ones_placements():
    # mig_capability_test.go TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs: GPU-a has one 1g left;
    # a container of two GPUs, binpack (the used GPU first), takes it and one of GPU-b, never two of GPU-a
    used = podlist(holder("p", "GPU-a,NVIDIA,10240,28:GPU-a,NVIDIA,10240,28:GPU-a,NVIDIA,10240,28:;",
                          allocations(("GPU-a", "2g.10gb", 0, 2), ("GPU-a", "2g.10gb", 2, 2),
                                      ("GPU-a", "2g.10gb", 4, 2))))
    reg = register(mig_gpu("GPU-a"), mig_gpu("GPU-b", index=1))
    binpack = {keys.GPU_POLICY: "binpack"}
    d = decide(nodelist(node("n1", reg)), used, pod(containers=[ctr(gpus=2, mem=5000)], annotations=binpack))
    assert [(a["gpuUUID"], a["placement"]["start"]) for a in mig_allocs(d)] == [("GPU-a", 6), ("GPU-b", 6)]
    # spread (the least used first) takes both of GPU-b, which has room for them
    d = decide(nodelist(node("n1", reg)), used, pod(containers=[ctr(gpus=2, mem=5000)]))
    assert [(a["gpuUUID"], a["placement"]["start"]) for a in mig_allocs(d)] == [("GPU-b", 6), ("GPU-b", 5)]


# --- two instances of one MIG GPU in one container (pkg/scheduler/mig_allocation_test.go) ----------------

def test_one_container_may_take_two_instances_of_one_mig_gpu():
    # TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU: 2 GPUs of 4000 MiB, one GPU with 7 1g placements
    reg = register(mig_gpu(profiles=[A100_PROFILES[0]]))
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(gpus=2, mem=4000)], annotations=MIG_MODE))
    assert d.node == "n1", d.nodes[0].reason
    assert d.annotations[keys.POD_TO_ALLOCATE] == "GPU-a,NVIDIA,5120,14:GPU-a,NVIDIA,5120,14:;"
    got = mig_allocs(d)
    assert [(a["containerIndex"], a["deviceIndex"], a["gpuUUID"]) for a in got] == [(0, 0, "GPU-a"), (0, 1, "GPU-a")]
    assert got[0]["placement"] != got[1]["placement"]
    # without the mode annotation too: HAMi's Fit walks a MIG GPU again whatever the pod's annotations
    assert decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(gpus=2, mem=4000)])).node == "n1"


def test_a_gpu_registered_with_templates_gives_a_container_one_instance():
    # different on purpose: a GPU registered with templates (pyvgpu's own agent, HAMi before v2.10) is served
    # by pyvgpu's device plugin, which gives a CUDA process one MIG instance: the pod waits with the reason
    # rather than fail at Allocate
    nodes = nodelist(node("n1", [gpu("GPU-m", count=7, type="NVIDIA A100-SXM4-80GB", mode="mig")]))
    d = decide(nodes, [], pod(containers=[ctr(gpus=2, mem=5000)], annotations=MIG_MODE))
    assert d.node is None and "1 of the node's 1 GPU(s) can take it, 2 needed" in d.nodes[0].reason


def test_too_few_placements_on_one_gpu_refuse_with_the_mig_reason():
    # TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU: one placement, two asked
    reg = register(mig_gpu(profiles=[A100_PROFILES[0] | {"placements": placements(6)}]))
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(gpus=2, mem=4000)], annotations=MIG_MODE))
    assert d.node is None
    assert "1 of the node's 1 GPU(s) can take it, 2 needed" in d.nodes[0].reason, d.nodes[0].reason


def test_a_gpu_not_in_mig_mode_is_still_taken_once():
    # TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU
    d = decide(nodelist(node("n1", [gpu("GPU-a")])), [], pod(containers=[ctr(gpus=2, mem=4000)]))
    assert d.node is None and "2 needed" in d.nodes[0].reason


def test_a_mig_gpu_then_the_next_gpu():
    # HAMi's Fit takes instances of a MIG GPU until it has no room, then goes on to the next GPU
    reg = register(mig_gpu("GPU-a", profiles=[A100_PROFILES[0] | {"placements": placements(5, 6)}]),
                   mig_gpu("GPU-b", index=1, profiles=[A100_PROFILES[0] | {"placements": placements(5, 6)}]))
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(gpus=3, mem=4000)]))
    assert sorted(a["gpuUUID"] for a in mig_allocs(d)) == ["GPU-a", "GPU-a", "GPU-b"] or \
        sorted(a["gpuUUID"] for a in mig_allocs(d)) == ["GPU-a", "GPU-b", "GPU-b"]
    assert d.annotations[keys.POD_TO_ALLOCATE].count("GPU-") == 3


# --- usage from hami.io/vgpu-mig-allocations (pkg/scheduler/mig_allocation_test.go) ----------------------

ONE_1G_AT_6 = [A100_PROFILES[0] | {"placements": placements(6)}]


def test_an_allocation_is_restored_by_profile_and_placement():
    # TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement (with the runtime identity filled in)
    slices = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,'
              '"size":1},"migUUID":"MIG-a","gpuInstanceID":7,"computeInstanceID":0}]')
    used = podlist(holder("p", "GPU-a,NVIDIA,5120,14:;", slices))
    nodes = nodelist(node("n1", register(mig_gpu(profiles=ONE_1G_AT_6))))
    d = decide(nodes, used, pod(containers=[ctr(mem=4000)]))
    assert d.node is None and "MIG" in d.nodes[0].reason, d.nodes[0].reason
    assert decide(nodes, [], pod(containers=[ctr(mem=4000)])).node == "n1"


def test_a_pod_on_a_mig_gpu_without_its_allocation_fails_closed():
    # TestGetNodesUsageFailsClosedWithoutMigAllocation: the GPU takes nothing new, and says why
    reg = register(mig_gpu(profiles=[A100_PROFILES[0]]))
    d = decide(nodelist(node("n1", reg)), podlist(holder("p", "GPU-a,NVIDIA,5120,14:;", None)),
               pod(containers=[ctr(mem=4000)]))
    assert d.node is None and f"without a {keys.POD_MIG_ALLOCATIONS} reservation" in d.nodes[0].reason
    # an annotation that cannot be read counts as none (HAMi ignores it), and the reason says what is wrong
    d = decide(nodelist(node("n1", reg)), podlist(holder("p", "GPU-a,NVIDIA,5120,14:;", "[{")),
               pod(containers=[ctr(mem=4000)]))
    assert d.node is None and "not valid JSON" in d.nodes[0].reason, d.nodes[0].reason
    assert any("its MIG reservations were ignored" in w and "not valid JSON" in w for w in d.warnings)
    assert "warning: pod default/p: its MIG reservations were ignored" in explain.to_text(d)


def test_unconsumed_reservations_are_restored():
    # TestGetNodesUsageRestoresUnconsumedMigReservations: two reservations, one entry: both placements taken,
    # the GPU stays usable
    prof = [A100_PROFILES[0] | {"placements": placements(4, 5, 6)}]
    used = podlist(holder("p", "GPU-a,NVIDIA,5120,14:;", allocations(("GPU-a", "1g.5gb", 6, 1),
                                                                       ("GPU-a", "1g.5gb", 5, 1))))
    d = decide(nodelist(node("n1", register(mig_gpu(profiles=prof)))), used, pod(containers=[ctr(mem=4000)]))
    assert mig_allocs(d)[0]["placement"] == {"start": 4, "size": 1}


def test_reservations_on_a_gpu_not_in_mig_mode_or_unknown_fail_closed():
    reg = register(mig_gpu(profiles=[A100_PROFILES[0]]), {"id": "GPU-c", "index": 1, "count": 10, "devmem": 40960,
                                                          "devcore": 100, "type": "NVIDIA-A100", "health": True})
    nodes = nodelist(node("n1", reg))
    # a reservation naming the hami-core GPU: that GPU takes nothing new (HAMi marks it unhealthy)
    used = podlist(holder("p", "GPU-c,NVIDIA,5120,0:;", allocations(("GPU-c", "1g.5gb", 6, 1))))
    d = decide(nodes, used, pod(containers=[ctr(mem=4000)], annotations={keys.USE_UUID: "GPU-c"}))
    assert d.node is None and "MIG reservation" in d.nodes[0].reason, d.nodes[0].reason
    # a reservation naming a GPU the node does not list: every MIG GPU of the node takes nothing new
    used = podlist(holder("p", "", allocations(("GPU-gone", "1g.5gb", 6, 1))))
    d = decide(nodes, used, pod(containers=[ctr(mem=4000)], annotations=MIG_MODE))
    assert d.node is None and "GPU-gone" in d.nodes[0].reason, d.nodes[0].reason


@pytest.mark.parametrize("text, message", [
    ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"","profile":"1g.5gb","placement":{"start":6,"size":1}}]',
     "incomplete"),
    ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":0}}]',
     "incomplete"),
    ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1},'
     '"migUUID":"MIG-a"}]', "partial runtime identity"),
    (allocations(("GPU-a", "1g.5gb", 6, 1, 0, 0), ("GPU-a", "1g.5gb", 5, 1, 0, 0)), "container 0 device 0 twice"),
    ("[" + ",".join(['{"containerIndex":0}'] * 300) + "]", "more than"),
    ("x" * 70000, "longer than"),
])
def test_the_allocation_annotation_is_read_strictly_and_bounded(text, message):
    # mig_allocations.go DecodeMigAllocations: incomplete entries, partial runtime identity, duplicates
    with pytest.raises(ClusterInputError) as e:
        codec.decode_mig_allocations(text)
    assert message in str(e.value) and keys.POD_MIG_ALLOCATIONS in str(e.value)


def test_the_reservation_is_an_allocation_annotation_only_the_scheduler_writes():
    assert keys.POD_MIG_ALLOCATIONS in ALLOCATION_KEYS


def test_a_dynamic_mig_decision_charged_then_released_leaves_the_gpu_as_it_was():
    # what the scheduler's in-flight reservations do (pyvgpu/cluster/scheduler/inflight.py): the instances a
    # decision reserves count until released
    from pyvgpu.cluster.core.decide import decide_on
    from pyvgpu.cluster.core.request import pod_request
    from pyvgpu.cluster.core.usage import add_pod, node_infos

    (info,) = node_infos(nodelist(node("n1", register(mig_gpu()))), [])
    req = pod_request(pod(containers=[ctr(gpus=2, mem=10000)]))
    d = decide_on([info], req)
    add_pod(info, d.devices)
    (g,) = info.devices
    assert (g.used, g.usedmem, g.usedcores, sorted(g.slices_used)) == (2, 20480, 56, [(0, 2), (2, 2)])
    assert decide_on([info], req).node is None  # one 2g placement is left, two asked
    one = pod_request(pod(containers=[ctr(gpus=1, mem=10000)]))
    assert decide_on([info], one).placements[0][0].mig_slice == (4, 2)
    add_pod(info, d.devices, sign=-1)
    assert (g.used, g.usedmem, g.usedcores, g.slices_used) == (0, 0, 0, ())


# --- through the extender (filter, bind) against the test API server ------------------------------------

@pytest.fixture
def ext_mig(kube, api):
    from fake_apiserver import node as api_node
    from test_cluster_extender import Ext

    api.put_node(api_node("node-m", {keys.NODE_REGISTER: register(mig_gpu(profiles=[A100_PROFILES[0]]))},
                          {"nvidia.com/gpu": "7"}))
    bad = mig_gpu("GPU-x", profiles=[{"name": "1g.5gb", "memoryMB": 5120, "placements": [{"start": 0, "size": 0}]}])
    api.put_node(api_node("node-x", {keys.NODE_REGISTER: register(bad)}, {"nvidia.com/gpu": "7"}))
    e = Ext(kube)
    e.synced(api)
    yield e
    e.close()


def test_the_extender_places_reserves_and_counts_mig_instances(ext_mig, api):
    from fake_apiserver import gpu_container
    from fake_apiserver import pod as api_pod
    from test_cluster_extender import bind_args, filter_args

    names = ("node-m", "node-x")
    p = api.put_pod(api_pod("two", [gpu_container("main", 2, 4000, 0)]))
    r = ext_mig.post("filter", filter_args(p, names))
    assert r["NodeNames"] == ["node-m"]
    # the malformed registration: refused loudly, with the field and why
    assert f"{keys.NODE_REGISTER}[0].migprofiles[0].placements[0].size" in r["FailedNodes"]["node-x"]
    assert ext_mig.post("bind", bind_args(p, "node-m")) == {"Error": ""}
    annos = api.get_pod("default", "two")["metadata"]["annotations"]
    assert annos[keys.POD_TO_ALLOCATE] == "GPU-a,NVIDIA,5120,14:GPU-a,NVIDIA,5120,14:;"
    got = json.loads(annos[keys.POD_MIG_ALLOCATIONS])
    assert [(a["gpuUUID"], a["profile"], a["placement"]) for a in got] == [
        ("GPU-a", "1g.5gb", {"start": 6, "size": 1}), ("GPU-a", "1g.5gb", {"start": 5, "size": 1})]
    ext_mig.synced(api)
    # 5 of the 7 placements are left: 6 instances do not fit, 5 do, beside the first pod's
    six = api.put_pod(api_pod("six", [gpu_container("main", 6, 4000, 0)]))
    assert ext_mig.post("filter", filter_args(six, names))["NodeNames"] == []
    five = api.put_pod(api_pod("five", [gpu_container("main", 5, 4000, 0)]))
    assert ext_mig.post("filter", filter_args(five, names))["NodeNames"] == ["node-m"]
    assert ext_mig.post("bind", bind_args(five, "node-m")) == {"Error": ""}
    starts = [a["placement"]["start"] for a in
              json.loads(api.get_pod("default", "five")["metadata"]["annotations"][keys.POD_MIG_ALLOCATIONS])]
    assert starts == [4, 3, 2, 1, 0]


def test_further_instances_are_checked_against_the_gpu_as_it_was_before_the_container():
    # HAMi's Fit checks a MIG GPU's slots against its use before the container each time it walks it again,
    # and the placements against the instances already taken (CustomFilterRule's toAllocate): a registration
    # of 1 slot still gives a container two instances, and the next pod none
    reg = register(mig_gpu(count=1, profiles=[A100_PROFILES[0]]))
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr(gpus=2, mem=4000)]))
    assert len(mig_allocs(d)) == 2
    used = podlist(holder("p", d.annotations[keys.POD_ALLOCATED], d.annotations[keys.POD_MIG_ALLOCATIONS]))
    d = decide(nodelist(node("n1", reg)), used, pod(containers=[ctr(gpus=1, mem=4000)]))
    assert d.node is None and "no free slot (2/1 used)" in d.nodes[0].reason, d.nodes[0].reason


@pytest.mark.parametrize("decode, where", [
    (codec.decode_register, keys.NODE_REGISTER),
    (codec.decode_pair_scores, keys.NODE_PAIR_SCORE),
    (codec.decode_pod_devices, keys.POD_ALLOCATED),
])
def test_every_decoded_annotation_is_bounded(decode, where):
    # longer than Kubernetes keeps for all of an object's annotations: refused before it is parsed
    with pytest.raises(ClusterInputError) as e:
        decode("[" + " " * codec.MAX_ANNOTATION + "]")
    assert str(e.value).startswith(where) and "longer than" in str(e.value)


def test_the_sets_of_instances_are_offered_once_each():
    # 8 GPUs of 7 instances, 7 asked: 3432 sets (multisets), not the 231 million orderings of copies, so a pod
    # whose later container cannot fit is refused after each set is tried once
    from math import comb

    from pyvgpu.cluster.core.policy import multisets

    got = list(multisets([(g, 7) for g in "ABCDEFGH"], 7))
    assert len(got) == len(set(got)) == comb(8 + 7 - 1, 7)
    assert got[0] == ("A",) * 7 and got[1] == ("A",) * 6 + ("B",)  # as many of the first as it gives
    assert list(multisets([("A", 2), ("B", 2), ("C", 1)], 3)) == [
        ("A", "A", "B"), ("A", "A", "C"), ("A", "B", "B"), ("A", "B", "C"), ("B", "B", "C")]
    reg = register(*[mig_gpu(f"GPU-{i}", index=i, profiles=[A100_PROFILES[0]]) for i in range(8)])
    d = decide(nodelist(node("n1", reg)), [], pod(containers=[ctr("a", gpus=7, mem=4000),
                                                              ctr("b", gpus=1, mem=50000)]))
    assert d.node is None and 'container "b"' in d.nodes[0].reason
