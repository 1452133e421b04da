"""Per-node device configuration from HAMi's device-plugin ConfigMap (issue 30, item 13; HAMi v2.10
readFromConfigFile and NodeDefaultConfig): the entries named after the node set its split count, scale its
GPUs' registered memory and cores (not a MIG GPU's), and take GPUs out by UUID or index; later entries win;
keys in any case; a file that cannot be read refuses to start, naming the field."""

from __future__ import annotations

import json

import pytest
from cluster_helpers import ctr, pod, podlist
from fake_apiserver import node as api_node
from test_cluster_mig import MIG_GPU

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.decide import decide
from pyvgpu.cluster.node import daemon, gpus
from pyvgpu.cluster.node.agent import NodeAgent
from pyvgpu.cluster.node.nodeconfig import NodeConfig, load, parse
from pyvgpu.cluster.node.nodestate import NodeState
from pyvgpu.cluster.node.plugin import DevicePluginService, Devices
from pyvgpu.errors import PyvgpuError

U0, U1, U2 = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-0b", "GPU-0c"
T4 = gpus.GpuInfo(0, U0, "Tesla T4", 15360, 0)
A100 = gpus.GpuInfo(1, U1, "NVIDIA A100", 81920, 1)
SPARE = gpus.GpuInfo(2, U2, "NVIDIA A100", 81920, 1)


def _doc(*entries) -> str:
    return json.dumps({"nodeconfig": list(entries)})


def test_the_nodes_entries_apply_in_order_and_others_are_ignored():
    text = _doc({"name": "other", "devicesplitcount": 3},
                {"name": "gpu-1", "devicememoryscaling": 1.8, "devicesplitcount": 4, "migstrategy": "none"},
                {"Name": "gpu-1", "DeviceSplitCount": 7, "deviceCoreScaling": 2,
                 "filterdevices": {"uuid": [U2], "index": []}},
                {"name": "gpu-1", "filterdevices": {"uuid": [], "index": []}})  # an empty filter changes nothing
    cfg = parse(text, "gpu-1")
    assert cfg == NodeConfig(split=7, memory_scaling=1.8, core_scaling=2.0, filter_uuids=frozenset({U2}))
    assert cfg.filtered(U2, 5) and not cfg.filtered(U0, 0)
    assert parse(text, "GPU-1") == NodeConfig()  # the node's name matches exactly
    assert parse(_doc({"name": "n", "filterdevices": {"index": [0, 2]}}), "n").filtered("GPU-x", 2)
    assert parse("{}", "n") == NodeConfig()


@pytest.mark.parametrize("entry, words", [
    ({"devicesplitcount": 0}, "devicesplitcount is 0"),
    ({"devicesplitcount": 2.5}, "whole number"),
    ({"devicememoryscaling": -1}, "devicememoryscaling is -1"),
    ({"devicecorescaling": "2"}, "positive number"),
    ({"filterdevices": {"index": ["0"]}}, "filterdevices.index"),
    ({"filterdevices": ["GPU-x"]}, "filterdevices must be"),
])
def test_a_bad_value_is_refused_naming_the_field_and_the_file(entry, words):
    with pytest.raises(PyvgpuError, match="config.json, nodeconfig\\[0\\] \\(node n\\)") as e:
        parse(_doc({"name": "n", **entry}), "n", "config.json")
    assert words in str(e.value)
    with pytest.raises(PyvgpuError, match="not JSON"):
        parse("{", "n")


def test_no_file_sets_nothing_and_a_file_is_read(tmp_path):
    assert load(tmp_path / "absent.json", "n") == NodeConfig()
    f = tmp_path / "config.json"
    f.write_text(_doc({"name": "n", "devicesplitcount": 5}))
    assert load(f, "n").split == 5


def test_the_agent_registers_scaled_memory_and_cores_except_on_mig(kube, api, tmp_path):
    api.put_node(api_node("node-a"))
    devices = Devices([T4, A100, MIG_GPU], lambda us: {u: None for u in us})
    cfg = parse(_doc({"name": "node-a", "devicememoryscaling": 1.5, "devicecorescaling": 2}), "node-a")
    a = NodeAgent(kube, "node-a", devices, NodeState(tmp_path / "s"), split=4, interval=0.1,
                  memory_scaling=cfg.memory_scaling, core_scaling=cfg.core_scaling)
    devs = codec.decode_register(a.registration()[keys.NODE_REGISTER])
    assert [(d.id, d.count, d.devmem, d.devcore, d.mode) for d in devs] == [
        (U0, 4, 23040, 200, "hami-core"), (U1, 4, 122880, 200, "hami-core"),
        (MIG_GPU.uuid, 3, 81920, 100, "mig")]
    odd = gpus.GpuInfo(0, U0, "Tesla T4", 15001, 0)
    half = NodeAgent(kube, "node-a", Devices([odd], lambda us: {u: None for u in us}), NodeState(tmp_path / "t"),
                     memory_scaling=0.5, core_scaling=0.5)
    assert [(d.devmem, d.devcore) for d in codec.decode_register(half.registration()[keys.NODE_REGISTER])] == \
        [(7500, 50)]  # int(15001 * 0.5): truncated, as Go converts
    # the scheduler places by the registration: 100 GiB on a GPU of 80 GiB scaled by 1.5
    node_obj = {"metadata": {"name": "node-a", "annotations": a.registration()}}
    d = decide([node_obj], podlist(), pod(containers=[ctr(gpus=1, mem=102400)]))
    assert d.node == "node-a" and d.devices[0][0].uuid == U1


def test_the_device_plugin_offers_the_split_and_leaves_out_filtered_gpus(tmp_path, monkeypatch):
    f = tmp_path / "config.json"
    f.write_text(_doc({"name": "node-a", "devicesplitcount": 3, "filterdevices": {"uuid": [U2], "index": [0]}}))
    opts, cfg = daemon.with_node_config(daemon.NodeOptions(node="node-a", split=10, node_config=f))
    assert opts.split == 3
    monkeypatch.setattr(gpus, "inventory", lambda: [T4, A100, SPARE])
    devices = daemon._devices(opts, cfg)
    assert [g.uuid for g in devices.gpus] == [U1]
    ids = [d.ID for d in DevicePluginService(devices, opts.split, None, None).list_response({}).devices]
    assert ids == [f"{U1}::0", f"{U1}::1", f"{U1}::2"]
    assert [g.uuid for g in daemon._inventory(devices, cfg)()] == [U1]  # Allocate never hands them out
    f.write_text(_doc({"name": "node-a", "devicesplitcount": -1}))
    with pytest.raises(PyvgpuError, match="devicesplitcount"):
        daemon.with_node_config(daemon.NodeOptions(node="node-a", node_config=f))
