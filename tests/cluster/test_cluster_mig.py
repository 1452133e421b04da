"""MIG on a node: the agent registers the instances that exist (mode mig, one geometry), the scheduler places
on them, Allocate gives the container its instance. Fake NVML only (FAKENVML_MIG); no MIG hardware was used."""

from __future__ import annotations

import json
import sys

import grpc
import pytest
from cluster_helpers import ctr, node, nodelist, pod, podlist
from fake_apiserver import gpu_container
from fake_apiserver import node as api_node
from fake_apiserver import pod as api_pod
from helpers import run
from test_cluster_plugin import Node, _code_and_text

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.decide import decide
from pyvgpu.cluster.node.agent import NodeAgent
from pyvgpu.cluster.node.gpus import GpuInfo, MigInfo, mig_layout
from pyvgpu.cluster.node.nodestate import NodeState
from pyvgpu.cluster.node.plugin import Devices

A100 = "NVIDIA A100-SXM4-80GB"
GM, GC = "GPU-fa4ec0da-0000-0000-0000-000000000000", "GPU-fa4ec0da-0000-0000-0000-000000000001"
M0, M1, M2 = "MIG-0", "MIG-1", "MIG-2"
MIG_GPU = GpuInfo(0, GM, A100, 81920, 0, mig_mode=True,
                  migs=(MigInfo(M0, "1g.10gb", 9984, 7, 0), MigInfo(M1, "3g.40gb", 40192, 2, 0),
                        MigInfo(M2, "1g.10gb", 9984, 9, 0)))


def test_layout_groups_instances_by_profile_with_the_tables_cores():
    geometry, uuids = mig_layout(MIG_GPU, ClusterConfig().mig_geometries(A100))
    assert [(t.name, t.core, t.memory, t.count) for t in geometry] == [("1g.10gb", 14, 9984, 2),
                                                                        ("3g.40gb", 42, 40192, 1)]
    assert uuids == [M0, M2, M1]  # HAMi's flattened positions: template by template
    geometry, _ = mig_layout(MIG_GPU)  # no table: compute slices out of 7
    assert [t.core for t in geometry] == [14, 43]


def test_inventory_reads_mig_mode_and_instances_from_nvml(env):
    code = ("import json; from pyvgpu.cluster.node import gpus as G; "
            "print(json.dumps([[g.uuid, g.mig_mode, [[m.uuid, m.profile, m.memory_mib, m.gi, m.ci] for m in g.migs]] "
            "for g in G.inventory()] + [G.mig_positions()]))")
    p = run([sys.executable, "-c", code],
            env=dict(env, FAKECUDA_DEVICES="16G,8G", FAKENVML_MIG="0:1g.4gb:4G,0:2g.8gb:8G"))
    assert p.returncode == 0, p.stderr
    *gpus, positions = json.loads(p.stdout)
    mig0 = "MIG-fa4ec0da-4d49-0000-0000-000000000000"
    mig1 = "MIG-fa4ec0da-4d49-0000-0000-000000000001"
    assert gpus == [[GM, True, [[mig0, "1g.4gb", 4096, 1, 0], [mig1, "2g.8gb", 8192, 2, 0]]], [GC, False, []]]
    assert positions == {GM: [mig0, mig1]}


@pytest.fixture
def agent(kube, api, tmp_path):
    api.put_node(api_node("node-a"))
    empty = GpuInfo(2, "GPU-e", A100, 81920, 0, mig_mode=True)
    devices = Devices([MIG_GPU, GpuInfo(1, GC, "Tesla T4", 15360, 0), empty], lambda us: {u: None for u in us})
    state = NodeState(tmp_path / "state")
    state.ensure()
    return NodeAgent(kube, "node-a", devices, state, split=10, interval=0.1)


def test_agent_registers_mig_gpus_with_the_instances_that_exist(agent, api):
    assert agent.register_once() is True
    text = api.get_node("node-a")["metadata"]["annotations"][keys.NODE_REGISTER]
    devs = codec.decode_register(text)
    assert [(d.id, d.count, d.mode) for d in devs] == [(GM, 3, "mig"), (GC, 10, "hami-core")]  # GPU-e: no instance
    assert [[(t.name, t.core, t.memory, t.count) for t in g] for g in devs[0].mig_geometries] == [
        [("1g.10gb", 14, 9984, 2), ("3g.40gb", 42, 40192, 1)]]
    # the scheduler places on the registered instances only: position 1 of geometry 0 is the second 1g.10gb
    nodes = nodelist(node("n1", text))
    used = [pod("p", node_name="n1", allocated=f"{GM}[0-0],NVIDIA,9984,14:;")]
    d = decide(nodes, podlist(*used), pod(containers=[ctr(mem=5000)], annotations={keys.VGPU_MODE: "mig"}))
    assert d.annotations[keys.POD_TO_ALLOCATE] == f"{GM}[0-1],NVIDIA,9984,14:;"
    d = decide(nodes, podlist(*used), pod(containers=[ctr(mem=20000)], annotations={keys.VGPU_MODE: "mig"}))
    assert d.annotations[keys.POD_TO_ALLOCATE] == f"{GM}[0-2],NVIDIA,40192,42:;"
    d = decide(nodes, podlist(*used), pod(containers=[ctr(mem=50000)], annotations={keys.VGPU_MODE: "mig"}))
    assert d.node is None  # no instance that big exists, and none is made


@pytest.fixture
def mig_node(tmp_path, kube):
    n = Node(tmp_path, kube)
    n.allocator.migs = lambda: {GM: [M0, M2, M1]}
    yield n
    n.close()


def binding(api, entry: str, n: int = 1):
    ctrs = [gpu_container(f"c{i}", 1, 1000, 0) for i in range(n)]
    annos = {keys.POD_NODE: "node-a", keys.POD_BIND_PHASE: "allocating", keys.POD_BIND_TIME: "100",
             keys.POD_TO_ALLOCATE: entry, keys.POD_ALLOCATED: entry}
    return api.put_pod(api_pod("train", ctrs, node_name="node-a", annotations=annos))


def test_allocate_gives_the_container_its_mig_instance(mig_node, api):
    binding(api, f"{GM}[0-1],NVIDIA,9984,14:;")
    (c,) = mig_node.allocate([f"{GM}::0"]).container_responses
    env = dict(c.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == M2 and env["NVIDIA_VISIBLE_DEVICES"] == M2
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "9984m" and env["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert api.get_pod("default", "train")["metadata"]["annotations"][keys.POD_BIND_PHASE] == "success"


@pytest.mark.parametrize("entry,message", [
    (f"{GM}[0-3],NVIDIA,9984,14:;", "names MIG instance 3 of geometry 0, but GPU " + GM + " has 3 instance(s)"),
    (f"{GM}[1-0],NVIDIA,9984,14:;", "names MIG instance 0 of geometry 1"),
    (f"{GC}[0-0],NVIDIA,9984,14:;", f"GPU {GC} is not in MIG mode on node node-a"),
    (f"{GM}[0-0],NVIDIA,9984,14:{GC},NVIDIA,1000,0:;", "a CUDA process sees a single MIG instance"),
])
def test_allocate_refuses_mig_entries_it_cannot_honour(mig_node, api, entry, message):
    binding(api, entry)
    n = entry.count(",NVIDIA,")
    with pytest.raises(grpc.RpcError) as e:
        mig_node.allocate([f"{GM}::{k}" for k in range(n)])
    code, text = _code_and_text(e)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and message in text, text
    assert api.get_pod("default", "train")["metadata"]["annotations"][keys.POD_BIND_PHASE] == "failed"
    assert mig_node.state.container_dirs() == []


def test_allocate_refuses_a_dynamic_mig_reservation_it_cannot_make(mig_node, api):
    # HAMi v2.10's reservations (hami.io/vgpu-mig-allocations) ask for an instance to be made; pyvgpu makes none
    p = binding(api, f"{GM},NVIDIA,5120,14:;")
    p["metadata"]["annotations"][keys.POD_MIG_ALLOCATIONS] = json.dumps(
        [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": GM, "profile": "1g.5gb",
          "placement": {"start": 6, "size": 1}}])
    api.put_pod(p)
    with pytest.raises(grpc.RpcError) as e:
        mig_node.allocate([f"{GM}::0"])
    code, text = _code_and_text(e)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "pyvgpu's device plugin does not make" in text, text
    assert api.get_pod("default", "train")["metadata"]["annotations"][keys.POD_BIND_PHASE] == "failed"
    assert mig_node.state.container_dirs() == []
