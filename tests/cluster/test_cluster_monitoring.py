"""Monitoring on a Kubernetes node: Allocate records each container's GPUs (the node agent's record), the
exporter labels a container's series with them (UUID, gpu, pod, namespace, container; a MIG instance as
dcgm-exporter labels it), never with what the container wrote in its region, and the series join
dcgm-exporter's on UUID, as the dashboard's last panel does."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest
from fake_apiserver import gpu_container
from fake_apiserver import pod as api_pod
from prometheus_client.parser import text_string_to_metric_families
from test_cluster_mig import GM, M2, MIG_GPU
from test_cluster_plugin import GPUS, U0, U1, Node, binding_pod

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.node import records
from pyvgpu.contract import layout as L
from pyvgpu.ops import exporter

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@pytest.fixture
def node(tmp_path, kube):
    n = Node(tmp_path, kube)
    n.allocator.inventory = lambda: GPUS
    yield n
    n.close()


def _scrape(state_dir: Path, machine=lambda: GPUS, migs=lambda: []) -> dict[str, list]:
    """One scrape through the exporter's HTTP text format: {metric: [samples]}."""
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(exporter.RegionCollector(machine=machine, state_dir=str(state_dir), migs=migs))
    text = generate_latest(reg).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)} | {"_text": text}


def _allocate_both(node, api) -> str:
    p = api.put_pod(binding_pod())
    node.allocate([f"{U0}::0"])
    node.allocate([f"{U1}::1"])
    return p["metadata"]["uid"]


def test_allocate_records_each_containers_gpus_for_the_node_agent_only(node, api):
    uid = _allocate_both(node, api)
    for cname, uuid, index in (("a", U0, 0), ("b", U1, 1)):
        d = node.state.container_dir(uid, cname)
        rec = records.read(d)
        assert (rec["pod"], rec["namespace"], rec["pod_uid"], rec["container"]) == ("train", "default", uid, cname)
        assert rec["gpus"] == [{"uuid": uuid, "index": index}]
        path = records.path_of(d)
        st = path.stat()
        assert path.parent == node.state.containers and stat.S_IMODE(st.st_mode) == 0o600  # beside, not inside
        assert st.st_uid == os.geteuid()
        assert not list(d.glob("*.json"))  # nothing in the directory the container has mounted
    # the record goes with the container's directory
    node.state.remove_container(uid, "a")
    assert not records.path_of(node.state.container_dir(uid, "a")).exists()
    assert node.state.reclaim(set(), listed_at=float("inf"))
    assert list(node.state.containers.iterdir()) == []


def test_a_mig_instance_is_recorded_as_its_parent_gpu_and_instance(tmp_path, kube, api):
    n = Node(tmp_path, kube)
    try:
        n.allocator.migs = lambda: {GM: ["MIG-0", M2, "MIG-1"]}
        n.allocator.inventory = lambda: [MIG_GPU]
        annos = {keys.POD_NODE: "node-a", keys.POD_BIND_PHASE: "allocating", keys.POD_BIND_TIME: "100",
                 keys.POD_TO_ALLOCATE: f"{GM}[0-1],NVIDIA,9984,14:;", keys.POD_ALLOCATED: f"{GM}[0-1],NVIDIA,9984,14:;"}
        p = api.put_pod(api_pod("infer", [gpu_container("m", 1, 9984, 0)], namespace="ml", node_name="node-a",
                                annotations=annos))
        n.allocate([f"{GM}::0"])
        rec = records.read(n.state.container_dir(p["metadata"]["uid"], "m"))
        assert rec["gpus"] == [{"uuid": GM, "index": 0, "mig_uuid": M2, "gpu_instance": 9, "profile": "1g.10gb"}]
        m = _scrape(n.state.root, machine=lambda: None)
        (lim,) = m["pyvgpu_memory_limit_bytes"]
        assert {k: lim.labels[k] for k in ("UUID", "gpu", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace",
                                            "container")} == {"UUID": GM, "gpu": "0", "GPU_I_ID": "9",
                                                              "GPU_I_PROFILE": "1g.10gb", "pod": "infer",
                                                              "namespace": "ml", "container": "m"}
        # dcgm-exporter's series of MIG instances: the parent's UUID and index, GPU_I_ID and GPU_I_PROFILE
        dcgm = [{"gpu": "0", "UUID": GM, "GPU_I_ID": str(gi), "GPU_I_PROFILE": prof}
                for gi, prof in ((7, "1g.10gb"), (9, "1g.10gb"), (2, "3g.40gb"))]
        key = ("UUID", "gpu", "GPU_I_ID", "GPU_I_PROFILE")
        assert [d for d in dcgm if all(d[k] == lim.labels[k] for k in key)] == [dcgm[1]]  # on(UUID, GPU_I_ID)
    finally:
        n.close()


def test_the_exporter_labels_a_containers_series_from_the_record(node, api):
    uid = _allocate_both(node, api)
    m = _scrape(node.state.root)
    lim = {s.labels["container"]: s.labels for s in m["pyvgpu_memory_limit_bytes"]}
    assert set(lim) == {"a", "b"}
    assert {k: lim["a"][k] for k in ("group", "vgpu_device", "gpu", "UUID", "pod", "namespace")} == \
        {"group": f"{uid[:8]}_a", "vgpu_device": "0", "gpu": "0", "UUID": U0, "pod": "train", "namespace": "default"}
    assert (lim["b"]["gpu"], lim["b"]["UUID"]) == ("1", U1)
    assert lim["a"]["GPU_I_ID"] == lim["a"]["GPU_I_PROFILE"] == ""  # a whole GPU
    info = {s.labels["container"]: s.labels for s in m["pyvgpu_device_info"]}
    assert info["a"]["modelName"] == "NVIDIA Fake"


def _tamper(region_path: Path) -> None:
    """What a process in the container can do to its own region: rename the group, claim another GPU."""
    fd = os.open(region_path, os.O_RDWR)
    try:
        os.pwrite(fd, b"evil".ljust(L.GROUP_NAME_BYTES, b"\0"), L.REGION_HEADER.offset("name"))
        os.pwrite(fd, (1).to_bytes(4, "little"), L.REGION_HEADER.offset("n_visible"))
        os.pwrite(fd, (1).to_bytes(4, "little"), L.REGION_HEADER.offset("visible"))
        os.pwrite(fd, bytes.fromhex(U1[4:].replace("-", "")), L.REGION_HEADER.offset("visible_uuid"))
    finally:
        os.close(fd)


def test_what_a_container_writes_in_its_region_does_not_change_its_labels(node, api, capsys):
    uid = _allocate_both(node, api)
    d = node.state.container_dir(uid, "a")
    _tamper(d / "vgpu.region")
    from pyvgpu.ops import status

    (g,) = [g for g in status.collect(state_dir=node.state.root) if g["path"] == str(d / "vgpu.region")]
    assert g["name"] == "evil" and g["gpus"][0]["uuid"] == U1  # the tampering took
    lim = {s.labels["container"]: s.labels for s in _scrape(node.state.root)["pyvgpu_memory_limit_bytes"]}
    assert (lim["a"]["group"], lim["a"]["UUID"], lim["a"]["gpu"]) == (f"{uid[:8]}_a", U0, "0")
    # a record someone else could have written is not trusted: no labels, one log line
    records.path_of(d).chmod(0o666)
    lim = {s.labels["group"]: s.labels for s in _scrape(node.state.root)["pyvgpu_memory_limit_bytes"]}
    assert (lim[f"{uid[:8]}_a"]["UUID"], lim[f"{uid[:8]}_a"]["pod"]) == ("", "")
    assert "not the node agent's" in capsys.readouterr().err


def _render():
    spec = importlib.util.spec_from_file_location("render", ROOT / "deploy/grafana/render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def _snap(text: str) -> dict:
    render = _render()
    snap: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            snap.setdefault(s.name, {})[render.Labels(s.labels.items())] = s.value
    return snap


def test_pyvgpu_series_join_dcgm_exporters_on_uuid(node, api, tmp_path):
    """dcgm-exporter's series for the same node (its label names: gpu, UUID, device, modelName, Hostname, and
    pod/namespace/container from the kubelet's pod-resources API), joined with pyvgpu's on UUID: each pod's
    pyvgpu series finds its GPU's DCGM series, with the same pod; the dashboard's last panel shows both."""
    uid = _allocate_both(node, api)
    ours = _scrape(node.state.root)
    dcgm = "\n".join(
        f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="{u}",device="nvidia{i}",modelName="NVIDIA Fake",Hostname="node-a",'
        f'container="{c}",namespace="default",pod="train"}} {used}'
        for i, u, c, used in ((0, U0, "a", 700), (1, U1, "b", 300))) + \
        '\nDCGM_FI_DEV_FB_USED{gpu="7",UUID="GPU-elsewhere",device="nvidia7",modelName="X",Hostname="node-b"} 5\n'
    dcgm_by_uuid = {s.labels["UUID"]: s.labels for f in text_string_to_metric_families(dcgm) for s in f.samples}
    joined = 0
    for s in ours["pyvgpu_memory_limit_bytes"]:
        theirs = dcgm_by_uuid[s.labels["UUID"]]  # on(UUID)
        assert theirs["gpu"] == s.labels["gpu"]
        assert (theirs["pod"], theirs["namespace"], theirs["container"]) == \
            (s.labels["pod"], s.labels["namespace"], s.labels["container"])
        joined += 1
    assert joined == 2
    # the dashboard's last panel, evaluated on both exporters' series (one Prometheus holds both)
    render = _render()
    snap = _snap(ours["_text"])
    for name, vec in _snap(dcgm).items():
        snap.setdefault(name, {}).update(vec)
    dash = json.loads((ROOT / "deploy/grafana/pyvgpu-dashboard.json").read_text())
    panel = dash["panels"][-1]
    variables = {"node": ".*", "instance": ".*", "group": ".*", "__rate_interval": "1m"}
    got = {}
    for t in panel["targets"]:
        vec = render.evaluate(render.Parser(t["expr"], variables).expr(), 0, [0.0], [snap])
        got[t["refId"] if "refId" in t else t["legendFormat"]] = {dict(k)["UUID"]: v for k, v in vec.items()}
    pyvgpu_side, dcgm_side = got.values()
    assert set(pyvgpu_side) == {U0, U1}
    assert dcgm_side == {U0: 700 * MiB, U1: 300 * MiB}  # the other node's GPU is not this exporter's
    assert all(s.labels["group"].startswith(uid[:8]) for s in ours["pyvgpu_group_memory_used_bytes"])
