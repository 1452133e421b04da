"""The device plugin over real gRPC against a test kubelet, its Allocate against a test API server.

The plugin runs in this process (PluginServer, DevicePluginService, Allocator: the production classes)
with GPUs given as data and a health probe the test controls; tests/cluster/test_cluster_e2e.py runs the
`pyvgpu cluster device-plugin` command itself on the fake NVML.
"""

from __future__ import annotations

import os
import stat
import threading
import time

import grpc
import pytest
from fake_apiserver import gpu_container, pod
from fake_kubelet import FakeKubelet

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.node.allocate import AllocateConfig, Allocator
from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2 as pb
from pyvgpu.cluster.node.gpus import GpuInfo
from pyvgpu.cluster.node.nodestate import NodeState
from pyvgpu.cluster.node.plugin import DevicePluginService, Devices, PluginServer
from pyvgpu.cluster.node.runtime import Runtime
from pyvgpu.group import region

U0 = "GPU-fa4ec0da-0000-0000-0000-000000000000"
U1 = "GPU-fa4ec0da-0000-0000-0000-000000000001"
GPUS = [GpuInfo(0, U0, "NVIDIA Fake", 8192, 0), GpuInfo(1, U1, "NVIDIA Fake", 8192, 1)]
RUNTIME = Runtime({"LD_PRELOAD": "/opt/pyvgpu/lib/libpyvgpu.so", "PYVGPU_CACHE_DIR": "/opt/pyvgpu/cache"},
                  ("/opt/pyvgpu",))
MiB = 1 << 20


class Probe:
    """The health the test says: {uuid: reason} for the unhealthy ones."""

    def __init__(self):
        self.bad: dict[str, str] = {}

    def __call__(self, uuids):
        return {u: self.bad.get(u) for u in uuids}


class Node:
    def __init__(self, tmp_path, kube, api_retry_s=2.0, sleep=None):
        self.dir = tmp_path / "device-plugins"
        self.dir.mkdir()
        self.kubelet = FakeKubelet(self.dir).start()
        self.state = NodeState(tmp_path / "state")
        self.state.ensure()
        self.probe = Probe()
        self.devices = Devices(GPUS, self.probe)
        kw = {"sleep": sleep} if sleep else {}
        self.allocator = Allocator(AllocateConfig("node-a", self.state, RUNTIME, api_retry_s), kube,
                                   lambda: self.devices.snapshot()[1], **kw)
        self.service = DevicePluginService(self.devices, 4, self.allocator, threading.Event())
        self.server = PluginServer(self.dir, "nvidia.com/gpu", self.service, poll=0.05)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.run, args=(self.stop,), daemon=True)
        self.thread.start()
        self.kubelet.wait_registrations(1)

    def close(self):
        self.stop.set()
        self.thread.join(10)
        self.kubelet.stop()

    def stub(self):
        return self.kubelet.plugin(self.kubelet.registrations[-1].endpoint)

    def allocate(self, *ids_per_container):
        ch, stub = self.stub()
        with ch:
            return stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in ids_per_container]), timeout=30)


@pytest.fixture
def node(tmp_path, kube):
    n = Node(tmp_path, kube)
    yield n
    n.close()


def binding_pod(name="train", to_allocate=f"{U0},NVIDIA,4096,30:;{U1},NVIDIA,2048,50:;", **kw):
    p = pod(name, [gpu_container("a", 1, 4096, 30), gpu_container("b", 1, 2048, 50)], node_name="node-a",
            annotations={keys.POD_NODE: "node-a", keys.POD_BIND_PHASE: "allocating", keys.POD_BIND_TIME: "100",
                         keys.POD_TO_ALLOCATE: to_allocate, keys.POD_ALLOCATED: to_allocate}, **kw)
    return p


# --- registration and ListAndWatch -------------------------------------------------------------------------

def test_registers_its_resource_with_the_kubelet(node):
    r = node.kubelet.registrations[0]
    assert (r.version, r.resource_name, r.endpoint) == ("v1beta1", "nvidia.com/gpu", "pyvgpu-nvidia.com-gpu.sock")
    assert (node.dir / r.endpoint).exists()


def test_list_and_watch_offers_split_times_gpus_and_reports_a_gpu_turning_unhealthy(node):
    ch, stub = node.stub()
    with ch:
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        first = next(stream)
        assert [d.ID for d in first.devices] == [f"{u}::{k}" for u in (U0, U1) for k in range(4)]
        assert {d.health for d in first.devices} == {"Healthy"}
        assert [d.topology.nodes[0].ID for d in first.devices] == [0] * 4 + [1] * 4
        node.probe.bad[U1] = "NVML: the GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST)"
        assert node.devices.refresh()
        second = next(stream)
        assert [d.health for d in second.devices] == ["Healthy"] * 4 + ["Unhealthy"] * 4
        del node.probe.bad[U1]
        node.devices.refresh()
        assert {d.health for d in next(stream).devices} == {"Healthy"}
        stream.cancel()


def test_registers_again_when_the_kubelet_restarts(node):
    node.kubelet.restart()  # removes every socket in the directory, ours too, and makes kubelet.sock anew
    # under load (2 cores shared) a restart and a registration can take seconds: wait longer, still bounded
    r = node.kubelet.wait_registrations(2, timeout=120)
    assert r.resource_name == "nvidia.com/gpu"
    ch, stub = node.stub()
    with ch:
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=60)).devices) == 8
    # The kubelet saw the registration when its handler ran; the plugin counts it when the reply reaches its
    # thread, which a loaded machine may not have run yet: wait for it (bounded) instead of reading it at once.
    deadline = time.monotonic() + 60
    while node.server.registrations < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.server.registrations == 2


def test_registration_and_list_and_watch_need_no_api_server(node, api):
    api.stop()
    node.kubelet.restart()
    node.kubelet.wait_registrations(2)
    ch, stub = node.stub()
    with ch:
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=30)).devices) == 8


# --- Allocate ----------------------------------------------------------------------------------------------

def test_allocate_pops_containers_in_order_with_hamis_env_and_marks_success(node, api):
    p = api.put_pod(binding_pod())
    uid = p["metadata"]["uid"]
    resp = node.allocate([f"{U0}::2"])
    (c,) = resp.container_responses
    env = dict(c.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == U0 and env["NVIDIA_VISIBLE_DEVICES"] == U0
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"  # HAMi's "%vm"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/run/pyvgpu/region/vgpu.region"
    assert env["PYVGPU_SCHED"] == "/run/pyvgpu/turns"
    assert env["PYVGPU_TRUST_SHARED"] == "1"  # root's shared files, kept apart by the layout (nodestate.py)
    assert env["LD_PRELOAD"] == "/opt/pyvgpu/lib/libpyvgpu.so"
    mounts = {(m.container_path, m.host_path, m.read_only) for m in c.mounts}
    ctr_dir = node.state.container_dir(uid, "a")
    assert mounts == {("/run/pyvgpu/region", str(ctr_dir), False),
                      ("/run/pyvgpu/turns", str(node.state.turn_path), False),
                      ("/opt/pyvgpu", "/opt/pyvgpu", True)}
    r = region.open_region(ctr_dir / "vgpu.region", writable=False)
    assert r.limits()[:2] == [4096 * MiB, 0] and r.sm_limits()[:2] == [30, 30]
    annos = api.get_pod("default", "train")["metadata"]["annotations"]
    assert annos[keys.POD_TO_ALLOCATE] == f";{U1},NVIDIA,2048,50:;"
    assert annos[keys.POD_BIND_PHASE] == "allocating"

    (c2,) = node.allocate([f"{U1}::0"]).container_responses
    assert dict(c2.envs)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m" and dict(c2.envs)["CUDA_VISIBLE_DEVICES"] == U1
    annos = api.get_pod("default", "train")["metadata"]["annotations"]
    assert annos[keys.POD_TO_ALLOCATE] == ";;" and annos[keys.POD_BIND_PHASE] == "success"
    assert annos[keys.POD_ALLOCATED] == f"{U0},NVIDIA,4096,30:;{U1},NVIDIA,2048,50:;"  # kept: usage counts by it


def test_region_owned_by_the_pods_run_as_user_else_shared_in_a_private_directory(node, api):
    p = binding_pod(to_allocate=f"{U0},NVIDIA,1024,0:;;")
    p["spec"]["securityContext"] = {"runAsUser": 1234, "runAsGroup": 5678}
    uid = api.put_pod(p)["metadata"]["uid"]
    node.allocate([f"{U0}::1"])
    f = node.state.container_dir(uid, "a") / "vgpu.region"
    st = f.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        assert region.open_region(f, writable=False).header.owner_uid == 1234
    assert stat.S_IMODE(node.state.containers.stat().st_mode) == 0o700
    assert stat.S_IMODE(f.parent.stat().st_mode) == 0o755

    q = binding_pod("other", to_allocate=f"{U1},NVIDIA,1024,0:;;")
    uid2 = api.put_pod(q)["metadata"]["uid"]
    node.allocate([f"{U1}::1"])
    g = node.state.container_dir(uid2, "a") / "vgpu.region"
    assert stat.S_IMODE(g.stat().st_mode) == 0o666
    assert stat.S_IMODE(node.state.turn_path.stat().st_mode) == 0o666


def _code_and_text(excinfo) -> tuple[grpc.StatusCode, str]:
    return excinfo.value.code(), excinfo.value.details()


def test_allocate_without_a_pod_being_bound_fails_clearly(node, api):
    with pytest.raises(grpc.RpcError) as e:
        node.allocate([f"{U0}::0"])
    code, text = _code_and_text(e)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod on node node-a is being bound" in text and "schedulerName" in text


def test_allocate_on_an_unhealthy_gpu_fails_marks_the_pod_failed_and_leaves_nothing(node, api):
    api.put_pod(binding_pod())
    node.probe.bad[U0] = "NVML: the GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST)"
    node.devices.refresh()
    with pytest.raises(grpc.RpcError) as e:
        node.allocate([f"{U1}::0"])
    code, text = _code_and_text(e)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"GPU {U0} is unhealthy" in text
    annos = api.get_pod("default", "train")["metadata"]["annotations"]
    assert annos[keys.POD_BIND_PHASE] == "failed"
    assert annos[keys.POD_TO_ALLOCATE].startswith(U0)  # nothing popped
    assert node.state.container_dirs() == []


def test_two_containers_in_one_call_fail_together(node, api):
    api.put_pod(binding_pod())
    node.probe.bad[U1] = "lost"
    node.devices.refresh()
    with pytest.raises(grpc.RpcError):
        node.allocate([f"{U0}::0"], [f"{U1}::0"])
    assert node.state.container_dirs() == []  # container a's region was made, then removed with b's failure
    assert api.get_pod("default", "train")["metadata"]["annotations"][keys.POD_TO_ALLOCATE].startswith(U0)


def test_a_pod_deleted_mid_bind_allocates_nothing(node, api):
    api.put_pod(binding_pod())

    def delete_on_patch(method, path):  # the pod goes away between Allocate's read and its write
        if method == "PATCH" and path.endswith("/pods/train") and api.get_pod("default", "train"):
            api.delete_pod("default", "train")
            return 404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "train" not found'}
        return None

    api.hooks.append(delete_on_patch)
    with pytest.raises(grpc.RpcError) as e:
        node.allocate([f"{U0}::0"])
    code, text = _code_and_text(e)
    assert code == grpc.StatusCode.NOT_FOUND and "deleted while it was being bound" in text
    assert node.state.container_dirs() == []


def test_a_conflicting_change_is_read_again(node, api):
    api.put_pod(binding_pod())
    seen = []

    def conflict_once(method, path):
        if method == "PATCH" and not seen:
            seen.append(path)
            return 409, {"kind": "Status", "code": 409, "reason": "Conflict", "message": "modified"}
        return None

    api.hooks.append(conflict_once)
    (c,) = node.allocate([f"{U0}::0"]).container_responses
    assert dict(c.envs)["CUDA_VISIBLE_DEVICES"] == U0 and seen


def test_allocate_with_the_api_server_down_retries_within_its_bound_then_fails(tmp_path, kube, api):
    n = Node(tmp_path, kube, api_retry_s=1.0)
    try:
        api.put_pod(binding_pod())
        api.stop()
        with pytest.raises(grpc.RpcError) as e:
            n.allocate([f"{U0}::0"])
        code, text = _code_and_text(e)
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "cannot reach the API server" in text and "tried for 1 s" in text
        assert n.state.container_dirs() == []
    finally:
        n.close()


def test_allocate_succeeds_when_the_api_server_comes_back_within_the_bound(tmp_path, kube, api):
    def sleep(seconds):  # the first retry finds the API server back
        api.start()

    n = Node(tmp_path, kube, api_retry_s=30.0, sleep=sleep)
    try:
        api.put_pod(binding_pod())
        api.stop()
        (c,) = n.allocate([f"{U0}::0"]).container_responses
        assert dict(c.envs)["CUDA_VISIBLE_DEVICES"] == U0
    finally:
        n.close()


def test_the_oldest_bind_whose_next_container_matches_the_request_is_taken(node, api):
    api.put_pod(binding_pod("young", to_allocate=f"{U0},NVIDIA,1024,0:;;") | {})
    young = api.get_pod("default", "young")
    young["metadata"]["annotations"][keys.POD_BIND_TIME] = "200"
    api.put_pod(young)
    api.put_pod(binding_pod("old", to_allocate=f"{U0},NVIDIA,2048,0:;;"))  # bind-time 100
    api.put_pod(binding_pod("two", to_allocate=f"{U0},NVIDIA,512,0:{U1},NVIDIA,512,0:;;"))  # asks 2 GPUs
    (c,) = node.allocate([f"{U0}::0"]).container_responses
    assert dict(c.envs)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    (c,) = node.allocate([f"{U0}::1", f"{U1}::1"]).container_responses
    assert dict(c.envs)["CUDA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert dict(c.envs)["CUDA_DEVICE_MEMORY_LIMIT_1"] == "512m"


def test_the_node_lock_a_hami_scheduler_left_is_released_after_the_last_container(node, api):
    """A HAMi scheduler leaves hami.io/mutex.lock to the device plugin; another pod's lock is not ours."""
    from fake_apiserver import node as node_obj

    from pyvgpu.cluster.api import nodelock

    api.put_node(node_obj("node-a", {keys.NODE_LOCK: nodelock.lock_value("default", "train")}))
    api.put_pod(binding_pod())
    node.allocate([f"{U0}::2"])
    assert keys.NODE_LOCK in api.get_node("node-a")["metadata"]["annotations"]  # a container is still to come
    node.allocate([f"{U1}::0"])
    assert keys.NODE_LOCK not in api.get_node("node-a")["metadata"]["annotations"]
    api.put_node(node_obj("node-a", {keys.NODE_LOCK: nodelock.lock_value("default", "other")}))
    api.put_pod(binding_pod("train2", to_allocate=f"{U0},NVIDIA,1024,0:;;"))
    node.allocate([f"{U0}::1"])
    assert api.get_pod("default", "train2")["metadata"]["annotations"][keys.POD_BIND_PHASE] == "success"
    assert api.get_node("node-a")["metadata"]["annotations"][keys.NODE_LOCK].endswith(",default,other")
