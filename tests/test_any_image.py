"""Any container image runs under its limits (issue 16, item 2).

Each "container" is a process started the way the kubelet starts one after the
device plugin's Allocate: exactly the environment Allocate returns, made by its
own code (the shim in LD_PRELOAD, HAMi's CUDA_DEVICE_MEMORY_LIMIT_0 in MiB with
an "m", CUDA_DEVICE_SM_LIMIT, the region in CUDA_DEVICE_MEMORY_SHARED_CACHE, the
turn file in PYVGPU_SCHED, the GPU by UUID in CUDA_VISIBLE_DEVICES,
PYVGPU_TRUST_SHARED) plus what any container has (PATH, HOME) and the driver,
which here is the fake one, found through LD_LIBRARY_PATH where the NVIDIA
runtime would mount the real one. Its region and the node's turn file exist
before it starts, made by the node state's code as Allocate makes them. pyvgpu
is not importable in it (each program checks), and nothing of pyvgpu's Python
runs in it.

The hosts: every CPython this machine has (pyenv's versions; the issue asks for
3.10-3.13, the older ones come along), this Python in a venv of its own, and C
programs. Each must see its cap as the device's memory, get an allocation up to
the cap and be refused one byte more, and have its launches held back by the
share (the region's throttle counter).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run

from pyvgpu.group import region
from pyvgpu.native import shim
from pyvgpu.native.shim import BENCH_BIN

MiB = 1 << 20
CAP_MIB = 128
UUID = "GPU-fa4ec0da-0000-0000-0000-000000000001"  # the fake's physical device 1 (tests/fakecuda/fake_devices.h)

# Python 2.7 to 3.13: ctypes only.
PROGRAM = r"""
from __future__ import print_function
import ctypes, sys
try:
    import pyvgpu
    print("PYVGPU-IMPORTABLE")
except ImportError:
    pass
c = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        print("FAIL", what, rc)
        sys.exit(1)
ok(c.cuInit(0), "cuInit")
d = ctypes.c_int(); ctx = ctypes.c_void_p()
ok(c.cuDeviceGet(ctypes.byref(d), 0), "cuDeviceGet")
ok(c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d), "retain")
ok(c.cuCtxSetCurrent(ctx), "setcurrent")
free = ctypes.c_size_t(); total = ctypes.c_size_t()
ok(c.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "meminfo")
print("total", total.value)
p = ctypes.c_uint64(); q = ctypes.c_uint64()
print("cap", c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(CAP)))
print("over", c.cuMemAlloc_v2(ctypes.byref(q), ctypes.c_size_t(1)))
mod = ctypes.c_void_p(); fn = ctypes.c_void_p()
ok(c.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(b"pv_spin")), "module")
ok(c.cuModuleGetFunction(ctypes.byref(fn), mod, ctypes.c_char_p(b"pv_spin")), "function")
iters = ctypes.c_uint32(2000); sink = ctypes.c_uint64(p.value)
params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.pointer(iters), ctypes.c_void_p),
                               ctypes.cast(ctypes.pointer(sink), ctypes.c_void_p))
for i in range(1000):
    ok(c.cuLaunchKernel(fn, 8, 1, 1, 256, 1, 1, 0, None, params, None), "launch")
ok(c.cuCtxSynchronize(), "sync")
print("launched", sys.version.split()[0])
""".replace("CAP", str(CAP_MIB * MiB))


def _imports_pyvgpu(python: str) -> bool:
    code = "import sys\ntry:\n    import pyvgpu\nexcept ImportError:\n    sys.exit(3)\n"
    return subprocess.run([python, "-c", code], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                          cwd="/").returncode != 3


def pythons() -> list[str]:
    """Every CPython of this machine (pyenv), and this one (in a venv of its own, see python_without_pyvgpu)."""
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python")))
    return [p for p in found if os.access(p, os.X_OK)] + ["this"]


@pytest.fixture
def python_without_pyvgpu(request, tmp_path_factory) -> str:
    """The interpreter to run; one where pyvgpu is installed gets a venv of its own, without it."""
    python = sys.executable if request.param == "this" else request.param
    if request.param != "this" and not _imports_pyvgpu(python):
        return python
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    return str(venv / "bin" / "python")


def container(fake: Path, tmp: Path) -> tuple[dict[str, str], Path]:
    """What Allocate gives a container with one GPU, 128 MiB and 30%: its environment, made by the device
    plugin's own code (pyvgpu/cluster/node/allocate.py container_env, runtime.current), and its region and the
    node's turn file, made by the node state's (nodestate.py). No mount namespace here: the container sees
    the host's paths, so the region and turn mounts are the host's directories."""
    from pyvgpu.cluster.core.model import ContainerDevice
    from pyvgpu.cluster.node import allocate, nodestate, runtime

    state = nodestate.NodeState(tmp / "state")
    state.ensure()
    path = state.create_region("pod-uid-1", "ctr", [CAP_MIB * MiB] + [0] * 15, [30] * 16)
    cfg = allocate.AllocateConfig(node="node-a", state=state, runtime=runtime.current(),
                                  region_mount=str(path.parent), turns_mount=str(state.turn_path))
    env = allocate.container_env(cfg, (ContainerDevice(UUID, "NVIDIA", CAP_MIB, 30),))
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(path)
    (tmp / "home").mkdir()
    # what every container has, and the driver (the NVIDIA runtime mounts the real one)
    env.update(PATH="/usr/bin:/bin", HOME=str(tmp / "home"), LD_LIBRARY_PATH=str(fake))
    return env, path


def held_back_ns(path: Path) -> int:
    r = region.open_region(path, writable=False)
    os.close(r.fd)
    return r.device(0).sm_throttle_ns


@pytest.mark.parametrize("python_without_pyvgpu", pythons(), indirect=True,
                         ids=lambda p: "this-python-in-a-venv" if p == "this" else Path(p).parents[1].name)
def test_a_python_container_runs_under_its_limits(fake, tmp_path, python_without_pyvgpu):
    env, path = container(fake, tmp_path)
    p = run([python_without_pyvgpu, "-c", PROGRAM], env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PYVGPU-IMPORTABLE" not in p.stdout
    assert f"total {CAP_MIB * MiB}\n" in p.stdout  # the cap is the device's memory
    assert "cap 0\n" in p.stdout and "over 2\n" in p.stdout  # up to the cap; one byte more: out of memory
    assert "launched" in p.stdout
    assert held_back_ns(path) > 0  # the 30% share held launches back
    assert "pyvgpu:" not in p.stderr, p.stderr


def test_the_container_environment_is_allocates_and_names_no_python(fake, tmp_path):
    env, path = container(fake, tmp_path)
    assert set(env) == {"LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0",
                        "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE", "PYVGPU_SCHED",
                        "PYVGPU_TRUST_SHARED", "PATH", "HOME", "LD_LIBRARY_PATH"}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{CAP_MIB}m" and env["CUDA_VISIBLE_DEVICES"] == UUID
    assert env["LD_PRELOAD"] == str(shim.shim_path().resolve())


def test_a_c_container_runs_under_its_limits(fake, tmp_path):
    env, path = container(fake, tmp_path)
    p = run([str(fake / "host_mem_linked"), "boundary", str(CAP_MIB * MiB)], env=env)
    assert "first=0 one_more=2 free=0 after_free=0" in p.stdout, p.stdout + p.stderr
    p = run([str(BENCH_BIN), "sm", "0.5", "2000", "kernel"], env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert held_back_ns(path) > 0
    assert "pyvgpu:" not in p.stderr, p.stderr
