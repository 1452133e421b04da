"""`pyvgpu wrap --mode mps` on the CPU: a stand-in MPS control daemon (tests/fakempsbin) and the fake
driver. The shares MPS gives on a real GPU are in docs/compute.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import PYVGPU, run

FAKE_MPS = Path(__file__).resolve().parent / "fakempsbin"
SHOW = ("import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith(('CUDA_MPS_', 'CUDA_DEVICE_', 'PYVGPU_REGION'))}))")
MEMINFO = ("import ctypes; c = ctypes.CDLL('libcuda.so.1'); assert c.cuInit(0) == 0; d = ctypes.c_int(); "
           "x = ctypes.c_void_p(); c.cuDeviceGet(ctypes.byref(d), 0); c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); "
           "c.cuCtxSetCurrent(x); f, t = ctypes.c_size_t(), ctypes.c_size_t(); "
           "assert c.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)) == 0; print(t.value)")


@pytest.fixture
def mps_env(env, tmp_path):
    return dict(env, PATH=f"{FAKE_MPS}{os.pathsep}{env['PATH']}", XDG_RUNTIME_DIR=str(tmp_path))


def _show(env, *opts):
    import sys

    p = run([*PYVGPU, "wrap", *opts, "--", sys.executable, "-c", SHOW], env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _log(tmp_path) -> list[str]:
    return (tmp_path / "pyvgpu" / "mps" / "log" / "control.log").read_text().splitlines()


def test_mps_mode_starts_the_daemon_once_and_makes_clients_with_the_limits(mps_env, tmp_path):
    e = _show(mps_env, "--mode", "mps", "--sm", "30", "--memory", "48M", "--group", "g")
    pipe = tmp_path / "pyvgpu" / "mps" / "pipe"
    assert e["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split(",")[0] == "0=48M"
    assert "CUDA_DEVICE_SM_LIMIT" not in e  # MPS's share: pyvgpu's limiter stays off
    assert e["CUDA_DEVICE_MEMORY_LIMIT"] == str(48 << 20)  # pyvgpu still caps memory
    starts = [x for x in _log(tmp_path) if x.startswith("start")]
    assert len(starts) == 1 and "preload= " in starts[0] + " "  # the daemon runs unwrapped
    assert oct(pipe.stat().st_mode & 0o777) == "0o700"
    # a second member joins the group: the same daemon, the same client limits, no --mode needed
    e2 = _show(mps_env, "--group", "g")
    assert e2["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and e2["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert len([x for x in _log(tmp_path) if x.startswith("start")]) == 1
    st = json.loads(run([*PYVGPU, "status", "--group", "g", "--json"], env=mps_env).stdout)["groups"][0]
    assert (st["mode"], st["mps_active_threads"]) == ("mps", 30)
    assert "mode mps, MPS active threads 30%" in run([*PYVGPU, "status", "--group", "g"], env=mps_env).stdout


def test_mps_mode_keeps_the_virtual_memory_view(mps_env):
    import sys

    p = run([*PYVGPU, "wrap", "--mode", "mps", "--memory", "48M", "--", sys.executable, "-c", MEMINFO], env=mps_env)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) == 48 << 20  # the cap is the total, which MPS alone does not show


@pytest.mark.parametrize("opts, message", [
    (["--mode", "mps", "--sm", "0=30,1=50"], "MPS gives a client one active-thread percentage"),
    (["--mode", "mig"], "--mode 'mig' is not one of hami-core, mps"),
])
def test_mps_mode_refuses_what_it_cannot_do(mps_env, opts, message):
    p = run([*PYVGPU, "wrap", *opts, "--", "true"], env=mps_env)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_mps_mode_without_the_daemon_binary_is_a_clear_error(env, tmp_path):
    env = dict(env, PATH="/usr/bin:/bin", XDG_RUNTIME_DIR=str(tmp_path))
    p = run([*PYVGPU, "wrap", "--mode", "mps", "--sm", "30", "--", "true"], env=env)
    assert p.returncode == 2 and "needs nvidia-cuda-mps-control" in p.stderr, p.stderr


def test_a_group_keeps_its_mode(mps_env):
    assert run([*PYVGPU, "wrap", "--group", "h", "--memory", "8M", "--", "true"], env=mps_env).returncode == 0
    p = run([*PYVGPU, "wrap", "--group", "h", "--mode", "mps", "--", "true"], env=mps_env)
    assert p.returncode == 2 and "runs in mode hami-core" in p.stderr, p.stderr


def test_the_exporter_and_top_show_the_mode(mps_env):
    from pyvgpu.ops import exporter, status

    assert run([*PYVGPU, "wrap", "--mode", "mps", "--sm", "40", "--group", "m", "--", "true"],
               env=mps_env).returncode == 0
    p = run([*PYVGPU, "top", "--once", "--group", "m"], env=dict(mps_env, COLUMNS="80"))
    assert p.returncode == 0 and "m (mps)" in p.stdout, p.stdout + p.stderr
    os.environ["XDG_RUNTIME_DIR"], old = mps_env["XDG_RUNTIME_DIR"], os.environ.get("XDG_RUNTIME_DIR")
    try:
        fams = {f.name: f for f in exporter.RegionCollector("m", None)._families(status.collect(group="m"))}
    finally:
        if old is None:
            del os.environ["XDG_RUNTIME_DIR"]
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
    assert [(s.labels, s.value) for s in fams["pyvgpu_group_mode"].samples] == [({"group": "m", "mode": "mps"}, 1)]
    assert [s.value for s in fams["pyvgpu_mps_active_threads_percent"].samples] == [40]


def test_limits_set_refuses_a_share_change_for_an_mps_group(mps_env):
    assert run([*PYVGPU, "wrap", "--mode", "mps", "--sm", "30", "--group", "s", "--", "true"],
               env=mps_env).returncode == 0
    p = run([*PYVGPU, "limits", "set", "--group", "s", "--sm", "50"], env=mps_env)
    assert p.returncode == 2 and "runs in mode mps" in p.stderr, p.stderr
    st = json.loads(run([*PYVGPU, "status", "--group", "s", "--json"], env=mps_env).stdout)["groups"][0]
    assert st["mps_active_threads"] == 30 and all(d["sm"]["limit_percent"] in (0, None) for d in st["devices"])
    assert run([*PYVGPU, "limits", "set", "--group", "s", "--memory", "32M"], env=mps_env).returncode == 0
