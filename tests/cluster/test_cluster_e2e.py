"""End to end on one machine: fake NVML with two GPUs, the node agent, the scheduler, the kubelet's
Allocate, and a "container" that gets exactly its cap and share.

    test API server  <-- official client -->  pyvgpu cluster device-plugin --node-agent  (a subprocess)
                                              pyvgpu scheduler extender (in this process)
    test kubelet     <-- gRPC, unix socket -->  the device plugin

The container is a process started with exactly the environment Allocate returned, in a mount namespace
where Allocate's mounts are made (unshare + mount --bind, as a container runtime would). Where mount
namespaces are not allowed, the mounts are applied by rewriting the container paths in the environment
to their host paths, which shows the same contract. Two variables stand for what a real node's runtime
adds: LD_LIBRARY_PATH (the NVIDIA container toolkit mounts the driver's libraries; here the fake driver)
and FAKECUDA_DEVICES (the hardware).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_apiserver import gpu_container, node, pod
from fake_kubelet import FakeKubelet
from helpers import clean_env

from pyvgpu.cluster.api.kube import Kube
from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2 as pb
from pyvgpu.cluster.scheduler.extender import Scheduler
from pyvgpu.cluster.scheduler.informer import Informer
from pyvgpu.group import region
from pyvgpu.native.shim import BENCH_BIN

MiB = 1 << 20
U0 = "GPU-fa4ec0da-0000-0000-0000-000000000000"
U1 = "GPU-fa4ec0da-0000-0000-0000-000000000001"


def _can_unshare() -> bool:
    if os.environ.get("PYVGPU_TEST_NO_UNSHARE"):
        return False
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


def run_container(answer, argv: list[str], machine_env: dict[str, str], timeout: float = 120):
    """Start argv as a container would: exactly the Allocate answer's env (plus the machine's), its mounts."""
    env = dict(answer.envs)
    env.update(machine_env)
    mounts = [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]
    if _can_unshare():
        lines = ["set -e", "mount -t tmpfs tmpfs /run"]  # a /run of the container's own
        for cpath, hpath, ro in mounts:
            if cpath == hpath and ro:
                continue  # the runtime is mounted at its host path: already there
            kind = "-d" if Path(hpath).is_dir() else "-f"
            make = f"mkdir -p {shlex.quote(cpath)}" if kind == "-d" else \
                f"mkdir -p {shlex.quote(str(Path(cpath).parent))} && touch {shlex.quote(cpath)}"
            lines.append(f"[ -e {shlex.quote(cpath)} ] || {{ {make}; }}")
            lines.append(f"mount --bind {shlex.quote(hpath)} {shlex.quote(cpath)}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(cpath)}")
        lines.append("exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " "
                     + " ".join(shlex.quote(a) for a in argv))
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(lines)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={"PATH": os.environ["PATH"]})
    for cpath, hpath, _ in sorted(mounts, key=lambda m: -len(m[0])):
        env = {k: v.replace(cpath, hpath) for k, v in env.items()}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


class PluginProcess:
    def __init__(self, tmp_path: Path, kubeconfig: Path, fake: Path, cache_dir: Path):
        self.plugin_dir = tmp_path / "device-plugins"
        self.plugin_dir.mkdir()
        self.state = tmp_path / "state"
        self.lost = tmp_path / "lost-gpus"
        self.log = tmp_path / "plugin.log"
        # the runtime a container gets: the package directory with the shim and its callbacks, nothing else
        runtime = [str(Path(json.loads(subprocess.run(
            [sys.executable, "-c",
             "import json; from pyvgpu.native import shim; print(json.dumps(str(shim.shim_path())))"],
            capture_output=True, text=True, cwd=str(tmp_path)).stdout)).resolve().parent)]
        self.env = clean_env(LD_LIBRARY_PATH=str(fake), PYVGPU_CACHE_DIR=str(cache_dir), FAKECUDA_DEVICES="8G,8G",
                             FAKENVML_LOST_FILE=str(self.lost))
        self.env.pop("PYTHONPATH", None)  # the installed pyvgpu, as on a node
        cmd = [sys.executable, "-m", "pyvgpu", "cluster", "device-plugin", "--node-agent", "--node-name", "node-a",
               "--plugin-dir", str(self.plugin_dir), "--kubeconfig", str(kubeconfig), "--state-dir",
               str(self.state), "--split", "4", "--health-interval", "0.2", "--agent-interval", "0.5",
               "--api-retry", "5"]
        for d in runtime:
            cmd += ["--runtime-dir", d]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
                                     cwd=str(tmp_path))

    def close(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text()


@pytest.fixture
def cluster(tmp_path, api, kubeconfig, fake, cache_dir):
    api.put_node(node("node-a", {}, {"nvidia.com/gpu": "8"}))
    kubelet = FakeKubelet(tmp_path / "device-plugins")
    plugin = PluginProcess(tmp_path, kubeconfig, fake, cache_dir)
    kubelet.start()
    stop = threading.Event()
    kube = Kube(str(kubeconfig), timeout=5)
    cfg = ClusterConfig()
    sched = Scheduler(kube, cfg, informer=Informer(kube, cfg, watch_s=5, retry_s=0.1))
    sched.start(stop)
    try:
        yield kubelet, plugin, sched
    finally:
        stop.set()
        kubelet.stop()
        log = plugin.close()
        print(log)
        assert plugin.proc.returncode == 0, log


def test_a_pod_from_scheduler_to_container_gets_exactly_its_cap_and_share(cluster, api, fake, tmp_path):
    kubelet, plugin, sched = cluster
    reg = kubelet.wait_registrations(1, timeout=60)
    assert reg.resource_name == "nvidia.com/gpu"

    # the node agent registers both GPUs (HAMi's JSON), their links and the handshake
    api.wait_for(lambda: keys.NODE_REGISTER in api.nodes["node-a"]["metadata"]["annotations"], 60,
                 "the node agent's registration")
    annos = api.get_node("node-a")["metadata"]["annotations"]
    devs = codec.decode_register(annos[keys.NODE_REGISTER])
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.mode, d.health) for d in devs] == [
        (U0, 0, 4, 8192, 100, "NVIDIA-Fake GPU 0", "hami-core", True),
        (U1, 1, 4, 8192, 100, "NVIDIA-Fake GPU 1", "hami-core", True)]
    assert codec.decode_pair_scores(annos[keys.NODE_PAIR_SCORE]) == {U0: {U1: 10}, U1: {U0: 10}}  # no topology API
    assert annos[keys.NODE_HANDSHAKE].startswith("Reported_")

    # the scheduler: filter, then bind (kube-scheduler's calls)
    p = api.put_pod(pod("train", [gpu_container("main", 1, 4096, 30)]))
    assert sched.informer.ready.wait(20)
    api.wait_for(lambda: True)
    deadline = time.monotonic() + 20
    while sched.filter({"Pod": p, "Nodes": None, "NodeNames": ["node-a"]})["NodeNames"] != ["node-a"]:
        assert time.monotonic() < deadline, "the scheduler never saw node-a's registration"
        time.sleep(0.05)
    m = p["metadata"]
    assert sched.bind({"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "node-a"}) == \
        {"Error": ""}
    chosen = api.get_pod("default", "train")["metadata"]["annotations"][keys.POD_TO_ALLOCATE].split(",")[0]
    assert chosen in (U0, U1)

    # the kubelet: ListAndWatch, then Allocate with devices of its choosing
    ch, stub = kubelet.plugin(reg.endpoint)
    with ch:
        listed = next(stub.ListAndWatch(pb.Empty(), timeout=30))
        assert len(listed.devices) == 8 and {d.health for d in listed.devices} == {"Healthy"}
        resp = stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[listed.devices[5].ID])]), timeout=60)
    (answer,) = resp.container_responses
    env = dict(answer.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == chosen and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert api.get_pod("default", "train")["metadata"]["annotations"][keys.POD_BIND_PHASE] == "success"

    # the container: exactly that env and those mounts
    machine = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(fake), "FAKECUDA_DEVICES": "8G,8G"}
    view = run_container(answer, [str(fake / "host_devices")], machine)
    assert view.returncode == 0, view.stdout + view.stderr
    v = json.loads(view.stdout)
    assert v["cuda_count"] == 1 and v["cuda"][0]["uuid"] == chosen
    assert v["cuda"][0]["total"] == 4096 * MiB  # cuMemGetInfo: the cap, not the GPU's 8 GiB
    # without the trust opt-in the shim refuses the root-owned 0666 region (pyvgpu.native.safefile):
    # Allocate must give it
    no_trust = pb.ContainerAllocateResponse(envs={k: v for k, v in answer.envs.items() if k != "PYVGPU_TRUST_SHARED"},
                                            mounts=answer.mounts)
    refused = run_container(no_trust, [str(fake / "host_devices")], machine)
    assert "refusing it" in refused.stderr and "calls are refused" in refused.stderr, refused.stderr
    edge = run_container(answer, [str(fake / "host_mem_linked"), "boundary", str(4096 * MiB)], machine)
    assert edge.returncode == 0, edge.stdout + edge.stderr
    assert edge.stdout.strip() == "first=0 one_more=2 free=0 after_free=0"  # one byte past the cap: refused
    uid = p["metadata"]["uid"]
    host_region = plugin.state / "containers" / f"{uid}_main" / "vgpu.region"
    r = region.open_region(host_region, writable=False)
    assert r.limits()[0] == 4096 * MiB and r.sm_limits()[0] == 30  # the share, in the region
    os.close(r.fd)
    # ... and its share: pv_bench's 200 us kernels on the simulated GPU (tests/test_compute.py), 5000/s alone
    sim = dict(machine, FAKECUDA_SIM=str(tmp_path / "gpu.sim"))
    load = run_container(answer, [str(BENCH_BIN), "sm", "5", "2000", "kernel"], sim)
    assert load.returncode == 0, load.stdout + load.stderr
    pts = [(int(t), int(n)) for _, t, n in (x.split() for x in load.stdout.splitlines() if x.startswith("P "))]
    start = next(q for q in pts if q[0] - pts[0][0] >= 2.5e9)  # past the controller's first steps
    share = 100 * (pts[-1][1] - start[1]) / ((pts[-1][0] - start[0]) / 1e9) / 5000
    print(f"the container got {share:.1f}% of the simulated GPU (share 30%)")
    # Above the share would be a broken limit. Below it only means the machine starved the process of CPU (a
    # busy CI box): the bound is loose there. Measured on the 2-core box: 30.3% (docs/cluster.md).
    assert 20 <= share <= 33, f"the container got {share:.1f}% of the GPU, its share is 30%"

    # a GPU turns unhealthy: ListAndWatch says so, the agent registers it unhealthy
    other = U1 if chosen == U0 else U0
    ch, stub = kubelet.plugin(reg.endpoint)
    with ch:
        stream = stub.ListAndWatch(pb.Empty(), timeout=60)
        next(stream)
        plugin.lost.write_text(str(int(other[-1])))
        update = next(stream)
        stream.cancel()
    assert [d.health for d in update.devices if d.ID.startswith(other)] == ["Unhealthy"] * 4
    assert {d.health for d in update.devices if d.ID.startswith(chosen)} == {"Healthy"}
    api.wait_for(lambda: any(not d.health for d in codec.decode_register(
        api.nodes["node-a"]["metadata"]["annotations"][keys.NODE_REGISTER])), 30, "the unhealthy GPU registered")

    # the kubelet restarts: the plugin registers again
    kubelet.restart()
    kubelet.wait_registrations(2, timeout=30)

    # the pod is deleted: the agent reclaims its region
    api.delete_pod("default", "train")
    old = time.time() - 3600
    os.utime(host_region.parent, (old, old))
    api.wait_for(lambda: not host_region.parent.exists(), 30, "the region of the deleted pod reclaimed")
