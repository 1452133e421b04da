"""The node agent, the node state and its modes, the lock format, the runtime mounts, the CLI's errors."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
from fake_apiserver import gpu_container, node, pod
from helpers import PYVGPU, run

from pyvgpu.cluster.api import nodelock
from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.node.agent import NodeAgent, device_type, handshake_value
from pyvgpu.cluster.node.gpus import GpuInfo, numa_of
from pyvgpu.cluster.node.nodestate import NodeState, Owner, owner_of
from pyvgpu.cluster.node.plugin import Devices
from pyvgpu.cluster.node.runtime import current
from pyvgpu.errors import PyvgpuError

U0, U1 = "GPU-0", "GPU-1"


class Probe:
    def __init__(self):
        self.bad = {}

    def __call__(self, uuids):
        return {u: self.bad.get(u) for u in uuids}


@pytest.fixture
def agent(kube, api, tmp_path):
    api.put_node(node("node-a"))
    probe = Probe()
    devices = Devices([GpuInfo(0, U0, "Tesla T4", 15360, 0), GpuInfo(1, U1, "NVIDIA A100", 81920, 1)], probe)
    state = NodeState(tmp_path / "state")
    state.ensure()
    a = NodeAgent(kube, "node-a", devices, state, split=10, interval=0.1, scores={U0: {U1: 20}, U1: {U0: 20}})
    a.probe = probe
    return a


def test_agent_registers_hamis_annotations_once_and_again_when_asked(agent, api):
    assert agent.register_once() is True
    annos = api.get_node("node-a")["metadata"]["annotations"]
    devs = codec.decode_register(annos[keys.NODE_REGISTER])
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.mode, d.health) for d in devs] == [
        (U0, 0, 10, 15360, 100, "NVIDIA-Tesla T4", 0, "hami-core", True),
        (U1, 1, 10, 81920, 100, "NVIDIA A100", 1, "hami-core", True)]
    assert codec.decode_pair_scores(annos[keys.NODE_PAIR_SCORE]) == {U0: {U1: 20}, U1: {U0: 20}}
    assert annos[keys.NODE_HANDSHAKE].startswith("Reported_")
    assert agent.register_once() is False  # nothing changed: no write
    n = api.get_node("node-a")
    n["metadata"]["annotations"][keys.NODE_HANDSHAKE] = "Requesting_2026-01-01 00:00:00"  # a HAMi scheduler asks
    api.put_node(n)
    assert agent.register_once() is True
    assert api.get_node("node-a")["metadata"]["annotations"][keys.NODE_HANDSHAKE].startswith("Reported_")
    agent.probe.bad[U1] = "lost"
    agent.devices.refresh()
    assert agent.register_once() is True
    devs = codec.decode_register(api.get_node("node-a")["metadata"]["annotations"][keys.NODE_REGISTER])
    assert [d.health for d in devs] == [True, False]


def test_agent_reclaims_regions_of_deleted_and_ended_pods_only(agent, api):
    live = api.put_pod(pod("live", [gpu_container()], node_name="node-a", phase="Running"))
    done = api.put_pod(pod("done", [gpu_container()], node_name="node-a", phase="Succeeded"))
    st = agent.state
    dirs = {name: st.create_region(uid, "main", [1 << 20] + [0] * 15, [0] * 16).parent
            for name, uid in (("live", live["metadata"]["uid"]), ("done", done["metadata"]["uid"]),
                              ("gone", "0b5e1c2a-dead-4bee-8000-000000000001"))}
    old = time.time() - 3600
    for d in dirs.values():
        os.utime(d, (old, old))
    fresh = st.create_region("0b5e1c2a-dead-4bee-8000-000000000002", "main", [0] * 16, [0] * 16).parent
    removed = agent.reclaim_once()
    assert sorted(removed) == sorted([dirs["done"], dirs["gone"]])
    assert dirs["live"].exists() and fresh.exists()  # a directory newer than the pod list may be a new pod's


def test_agent_keeps_going_while_the_api_server_is_down(agent, api, caplog):
    api.stop()
    agent.step()  # logs, does not raise
    assert "cannot reach the API server" in caplog.text
    api.start()
    agent.step()
    assert keys.NODE_REGISTER in api.get_node("node-a")["metadata"]["annotations"]


def test_node_state_modes(tmp_path):
    st = NodeState(tmp_path / "s")
    st.ensure()
    assert stat.S_IMODE(st.root.stat().st_mode) == 0o755
    assert stat.S_IMODE(st.containers.stat().st_mode) == 0o700
    assert stat.S_IMODE(st.turn_path.stat().st_mode) == 0o666
    os.chmod(st.containers, 0o777)
    st.ensure()  # repairs
    assert stat.S_IMODE(st.containers.stat().st_mode) == 0o700
    with pytest.raises(PyvgpuError, match="not a UID"):
        st.container_dir("../etc", "main")
    with pytest.raises(PyvgpuError, match="DNS label"):
        st.container_dir("abc", "Main/x")


def test_owner_comes_from_the_container_then_the_pod():
    p = pod("p", [gpu_container("a"), gpu_container("b")])
    p["spec"]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 3000}
    p["spec"]["containers"][1]["securityContext"] = {"runAsUser": 2000}
    assert owner_of(p, "a") == Owner(1000, 3000)
    assert owner_of(p, "b") == Owner(2000, 3000)
    assert owner_of(pod("q", [gpu_container("a")]), "a") == Owner(None, None)


def test_lock_values_are_hamis():
    v = nodelock.lock_value("ml", "train", now=1767225600)  # 2026-01-01T00:00:00Z
    assert v == "2026-01-01T00:00:00Z,ml,train"
    assert nodelock.parse(v) == (1767225600.0, "ml", "train")
    assert nodelock.parse("2026-01-01T08:00:00+08:00") == (1767225600.0, "", "")
    with pytest.raises(ValueError, match="RFC 3339"):
        nodelock.parse("yesterday,ml,train")
    with pytest.raises(ValueError, match="neither"):
        nodelock.parse("a,b")


def test_handshake_and_type_formats():
    assert handshake_value(1767225600) == "Reported_2026-01-01 00:00:00"
    assert device_type("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert device_type("Tesla T4") == "NVIDIA-Tesla T4"


def test_numa_from_sysfs(tmp_path):
    (tmp_path / "0000:3b:00.0").mkdir()
    (tmp_path / "0000:3b:00.0" / "numa_node").write_text("1\n")
    (tmp_path / "0000:af:00.0").mkdir()
    (tmp_path / "0000:af:00.0" / "numa_node").write_text("-1\n")
    assert numa_of("00000000:3B:00.0", tmp_path) == 1
    assert numa_of("00000000:AF:00.0", tmp_path) == 0
    assert numa_of("", tmp_path) == 0 and numa_of("00000000:01:00.0", tmp_path) == 0


def test_the_runtime_is_the_shim_and_its_callbacks_and_nothing_of_python(tmp_path):
    from pyvgpu.native import cache, cblib
    from pyvgpu.native.shim import shim_path

    with pytest.raises(PyvgpuError, match="under none of the runtime directories"):
        current([str(tmp_path)])
    with pytest.raises(PyvgpuError, match="whole host"):
        current(["/"])
    pkg = str(shim_path().resolve().parent)
    rt = current()
    assert rt.mounts == (pkg,)
    assert rt.env == {"LD_PRELOAD": str(shim_path().resolve())}  # no PYTHONPATH, no interpreter
    assert (Path(pkg) / cblib.FILE_NAME).resolve() == Path(cache.packaged_path())
    rt.check()
    assert current([sys.prefix]).mounts == (os.path.abspath(sys.prefix),)  # a directory above it is fine


def test_cli_errors_name_the_option():
    p = run([*PYVGPU, "cluster", "device-plugin"], env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})
    assert p.returncode == 2 and "--node-name" in p.stderr
    p = run([*PYVGPU, "cluster", "device-plugin", "--node-name", "n", "--split", "0"])
    assert p.returncode == 2 and "--split 0" in p.stderr
    p = run([*PYVGPU, "cluster", "scheduler", "--port", "8080", "--webhook-port", "8443"])
    assert p.returncode == 2 and "--tls-cert-file" in p.stderr
    p = run([*PYVGPU, "cluster", "scheduler", "--port", "8080", "--gpu-policy", "random"])
    assert p.returncode == 2 and "--gpu-policy 'random'" in p.stderr


def test_exporter_reads_the_containers_regions_of_a_node_state_dir(tmp_path, monkeypatch):
    from pyvgpu.ops import exporter

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))  # no groups of this user in the way
    (tmp_path / "xdg").mkdir()
    st = NodeState(tmp_path / "state")
    st.ensure()
    st.create_region("0b5e1c2a-0000-4bee-8000-000000000001", "main", [2 << 30] + [0] * 15, [30] + [0] * 15)
    (st.containers / "stray").mkdir()  # not a container's directory: skipped
    families = {f.name: f for f in exporter.RegionCollector(machine=lambda: None,
                                                           state_dir=str(st.root)).collect()}
    (limit,) = families["pyvgpu_memory_limit_bytes"].samples
    assert limit.labels["group"] == "0b5e1c2a_main" and limit.value == 2 << 30
    (share,) = families["pyvgpu_sm_limit_percent"].samples
    assert share.value == 30
    p = run([*PYVGPU, "exporter", "--state-dir", str(tmp_path / "nowhere")])
    assert p.returncode == 2 and "--state-dir" in p.stderr and "no such directory" in p.stderr
