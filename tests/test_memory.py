"""Memory isolation on the fake driver: exact caps, groups, every allocation path, reclaim, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PYVGPU, run

from pyvgpu.contract import layout as L
from pyvgpu.group import region

HOSTS = Path(__file__).resolve().parent / "hosts"
MiB = 1 << 20
LIMIT = 64 * MiB


def used_raw(path) -> int:
    """The group's reserved bytes on device 0, read without reclaiming anything."""
    return region.open_region(Path(path), writable=False).device(0).used


def status(env, path) -> dict:
    p = run([*PYVGPU, "status", "--region", str(path), "--json"], env=env)
    assert p.returncode == 0, p.stderr
    (g,) = json.loads(p.stdout)["groups"]
    return g


# --- the exact boundary, on all three lookup paths -----------------------------------

@pytest.mark.parametrize("host", ["host_mem_linked", "host_mem_procaddr"])
def test_exact_boundary_c_hosts(env, fake, host):
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--", str(fake / host), "boundary", str(LIMIT)], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "first=0 one_more=2 free=0 after_free=0"


def test_exact_boundary_dlsym_python(env):
    code = (
        "import ctypes; c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); d = ctypes.c_int(); x = ctypes.c_void_p()\n"
        "c.cuDeviceGet(ctypes.byref(d), 0); c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); c.cuCtxSetCurrent(x)\n"
        "a, b = ctypes.c_uint64(), ctypes.c_uint64()\n"
        f"print(c.cuMemAlloc_v2(ctypes.byref(a), ctypes.c_size_t({LIMIT})),"
        " c.cuMemAlloc_v2(ctypes.byref(b), ctypes.c_size_t(1)))\n"
    )
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--", sys.executable, "-c", code], env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "2"]


# --- every allocation path --------------------------------------------------------------

def paths(env, which: str) -> dict:
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--", sys.executable, str(HOSTS / "mem_paths.py"), which,
             str(LIMIT)], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_pitch_counts_pitch_times_height(env):
    r = paths(env, "pitch")
    assert r["pitch"] == 1024
    assert r["rcs"] == [0] * 64 + [2]  # 64 x (1024 x 1024) fills 64 MiB exactly
    assert r["used_end"] == LIMIT


def test_managed_counts_as_device_memory(env):
    assert paths(env, "managed")["rcs"] == [0, 0, 2]


def test_pools_charge_reserved_memory_reuse_is_free_trims_are_credited(env):
    r = paths(env, "async")
    assert r["rcs"] == [0] * 16 + [2]
    assert r["used_full"] == LIMIT
    assert r["used_after_free"] == LIMIT  # still reserved by the pool
    assert r["realloc"] == 0 and r["used_after_reuse"] == LIMIT  # reuse inside the pool: not charged twice
    assert r["used_after_trim"] == LIMIT - 4 * MiB


def test_vmm_device_memory_counts_host_memory_does_not(env):
    r = paths(env, "vmm")
    assert r["rcs"] == [0] * 32 + [2]
    assert r["host_rc"] == 0 and r["used_full"] == LIMIT
    assert r["used_after_release"] == LIMIT - 2 * MiB


def test_arrays_count_their_descriptor_size(env):
    r = paths(env, "arrays")
    assert r["rcs"] == [0, 0, 0, 2]
    assert r["used_2d"] == 16 * MiB
    assert r["used_3d"] == 32 * MiB
    assert r["used_mip"] == 32 * MiB + MiB + 256 * 1024 + 64 * 1024
    assert r["used_after_destroy"] == r["used_mip"] - 16 * MiB


def test_virtual_view_cuda(env):
    r = paths(env, "info")
    assert r["info"] == [LIMIT - 16 * MiB, LIMIT]
    assert r["total"] == LIMIT
    assert r["null_free"] == 1 and r["null_total"] == 1 and r["null_devtotal"] == 1  # as the driver answers
    assert r["legacy_alloc"] == 801  # 32-bit ABI inside a group: refused, not unaccounted
    assert r["legacy_info"] == [LIMIT - 16 * MiB, LIMIT]


def test_virtual_view_nvml_never_underflows(env):
    env["FAKENVML_USED"] = "15G"  # the device is nearly full for others
    r = paths(env, "nvml")
    assert r["v1"] == [LIMIT, LIMIT - 16 * MiB, 16 * MiB]
    assert r["v2"] == [LIMIT, 0, LIMIT - 16 * MiB, 16 * MiB]
    assert r["null_rc"] == 2  # NVML_ERROR_INVALID_ARGUMENT from the driver


def test_context_memory_is_measured_and_charged(env, fake, tmp_path):
    env["FAKECUDA_CTX_BYTES"] = "16M"  # the fake's context takes 16 MiB of the device, as a real one takes ~0.5 GiB
    reg = tmp_path / "g.region"
    a = hold(env, fake, 48 * MiB, "--memory", "64M", "--region", str(reg))
    try:
        assert a.rc == 0
        g = status(env, reg)
        assert g["processes"][0]["devices"]["0"] == {"data": 48 * MiB, "context": 16 * MiB, "module": 0}
        assert g["devices"][0]["used"] == LIMIT
    finally:
        a.stdin.close()
        a.wait(30)
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--", str(fake / "host_mem_linked"), "boundary", str(48 * MiB)],
            env=env)
    assert p.stdout.strip() == "first=0 one_more=2 free=0 after_free=0", p.stdout + p.stderr


def test_module_memory_is_measured_charged_and_credited(env):
    env["FAKECUDA_MODULE_BYTES"] = "8M"  # each load takes 8 MiB of the device, as an eagerly loaded module does
    r = paths(env, "modules")
    assert r["rcs"] == [0] * 8 + [2]  # the ninth does not fit: unloaded again, OOM
    assert r["used_full"] == LIMIT
    assert r["used_after_unload"] == LIMIT - 8 * MiB


def test_a_context_that_does_not_fit_is_refused(env, fake):
    env["FAKECUDA_CTX_BYTES"] = "16M"
    p = run([*PYVGPU, "wrap", "--memory", "8M", "--", str(fake / "host_mem_linked"), "boundary", "1"], env=env)
    assert "FAIL p_retain(&g_ctx, d) -> 2" in p.stdout, p.stdout + p.stderr  # CUDA_ERROR_OUT_OF_MEMORY


def test_without_nvml_memory_isolation_still_works(env, fake):
    env["PYVGPU_REAL_LIBNVML"] = "/nonexistent/libnvidia-ml.so.1"
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--", str(fake / "host_mem_linked"), "boundary", str(LIMIT)],
            env=env)
    assert p.stdout.strip() == "first=0 one_more=2 free=0 after_free=0", p.stdout + p.stderr


# --- groups --------------------------------------------------------------------------------

def hold(env, fake, nbytes: int, *wrap_opts: str) -> subprocess.Popen:
    p = subprocess.Popen([*PYVGPU, "wrap", *wrap_opts, "--", str(fake / "host_mem_linked"), "hold", str(nbytes)],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    line = p.stdout.readline()
    assert line.startswith("HELD"), line
    p.rc = int(line.split("rc=")[1])
    return p


def test_two_processes_share_one_group(env, fake, tmp_path):
    reg = tmp_path / "g.region"
    a = hold(env, fake, 40 * MiB, "--memory", "64M", "--region", str(reg))
    try:
        assert a.rc == 0
        b = hold(env, fake, 40 * MiB, "--region", str(reg))  # joins, takes the group's limit
        assert b.rc == 2
        b.stdin.close()
        b.wait(30)
        c = hold(env, fake, 24 * MiB, "--region", str(reg))
        assert c.rc == 0
        g = status(env, reg)
        assert g["devices"][0]["used"] == LIMIT and g["devices"][0]["limit"] == LIMIT
        assert sorted(p["devices"]["0"]["data"] for p in g["processes"]) == [24 * MiB, 40 * MiB]
        c.stdin.close()
        c.wait(30)
    finally:
        a.stdin.close()
        a.wait(30)


def test_joining_with_other_limits_is_an_error(env, fake, tmp_path):
    reg = tmp_path / "g.region"
    a = hold(env, fake, MiB, "--memory", "64M", "--region", str(reg))
    try:
        p = run([*PYVGPU, "wrap", "--memory", "32M", "--region", str(reg), "--", "true"], env=env)
        assert p.returncode == 2
        assert "64 MiB on device 0" in p.stderr and "--memory 32M asks for 32 MiB" in p.stderr
    finally:
        a.stdin.close()
        a.wait(30)


def test_named_group(env, fake, tmp_path):
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    a = hold(env, fake, 60 * MiB, "--memory", "64M", "--group", "team-a")
    try:
        b = hold(env, fake, 8 * MiB, "--group", "team-a")
        assert a.rc == 0 and b.rc == 2
        b.stdin.close()
        b.wait(30)
        assert (tmp_path / "pyvgpu" / "groups" / "team-a.region").exists()
    finally:
        a.stdin.close()
        a.wait(30)


# --- concurrency: never overshoot, counters equal live bytes ---------------------------------

def test_stress_32_processes_x_8_threads(env, fake, tmp_path):
    seconds = float(os.environ.get("PYVGPU_STRESS_SECONDS", "12"))  # longer: PYVGPU_STRESS_SECONDS
    reg = tmp_path / "stress.region"
    limit = 256 * MiB
    procs = []
    try:
        for i in range(32):
            host = "host_mem_linked" if i % 2 else "host_mem_procaddr"
            procs.append(subprocess.Popen(
                [*PYVGPU, "wrap", "--memory", "256M", "--region", str(reg), "--", str(fake / host), "stress",
                 str(seconds), "8", str(i), str(4 * MiB)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/"))
        held = allocs = ooms = 0
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("HELD"), line
            f = line.split()
            held, allocs, ooms = held + int(f[1]), allocs + int(f[3]), ooms + int(f[5])
        g = status(env, reg)
        dev = g["devices"][0]
        assert allocs > 10_000 and ooms > 0  # the limit was hit, many times
        assert dev["used"] == held  # exact: the counter equals the live bytes
        assert sum(p["devices"].get("0", {}).get("data", 0) for p in g["processes"]) == held
        assert dev["peak"] <= limit  # never over the cap, not by one byte
        assert len(g["processes"]) == 32
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(60)
    assert status(env, reg)["devices"][0]["used"] == 0  # all gone: all reclaimed


# --- reclaim ----------------------------------------------------------------------------------

def test_sigkilled_member_is_reclaimed_within_a_second(env, fake, tmp_path):
    reg = tmp_path / "g.region"
    watcher = hold(env, fake, MiB, "--memory", "64M", "--region", str(reg))  # a live member runs the watcher
    victim = hold(env, fake, 40 * MiB, "--region", str(reg))
    try:
        assert used_raw(reg) == 41 * MiB
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        t0 = time.monotonic()
        while used_raw(reg) != MiB and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        took = time.monotonic() - t0
        assert used_raw(reg) == MiB
        assert took < 1.0, took
    finally:
        watcher.stdin.close()
        watcher.wait(30)


def test_reclaim_on_oom_when_no_member_is_alive(env, fake, tmp_path):
    reg = tmp_path / "g.region"
    victim = hold(env, fake, 40 * MiB, "--memory", "64M", "--region", str(reg))
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    assert used_raw(reg) == 40 * MiB  # nobody alive to notice
    p = run([*PYVGPU, "wrap", "--region", str(reg), "--", str(fake / "host_mem_linked"), "boundary", str(LIMIT)],
            env=env)
    assert p.stdout.strip() == "first=0 one_more=2 free=0 after_free=0", p.stdout + p.stderr


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--pid", "--fork", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare(), reason="unshare of user+pid namespaces is not permitted here")
def test_reclaim_across_pid_namespaces(env, fake, tmp_path):
    reg = tmp_path / "g.region"
    watcher = hold(env, fake, MiB, "--memory", "64M", "--region", str(reg))
    try:
        victim = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", *PYVGPU, "wrap",
             "--region", str(reg), "--", str(fake / "host_mem_linked"), "hold", str(40 * MiB)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        line = victim.stdout.readline()
        assert line.strip() == "HELD rc=0", line
        g = status(env, reg)
        assert any(p["pid"] == 1 or p["pid"] != victim.pid for p in g["processes"])  # it sees itself as another pid
        assert used_raw(reg) == 41 * MiB
        os.kill(victim.pid, signal.SIGKILL)  # --kill-child: the namespace's processes die with it
        victim.wait(10)
        t0 = time.monotonic()
        while used_raw(reg) != MiB and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        assert used_raw(reg) == MiB
    finally:
        watcher.stdin.close()
        watcher.wait(30)


def test_hooked_calls_after_the_interpreter_finalized(env, fake):
    """libtorch frees device memory from static destructors, after Python has finalized:
    the callbacks' code and the region mapping must still be there."""
    code = (
        "import ctypes; c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); d = ctypes.c_int(); x = ctypes.c_void_p()\n"
        "c.cuDeviceGet(ctypes.byref(d), 0); c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); c.cuCtxSetCurrent(x)\n"
        "p = ctypes.c_uint64(); assert c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0\n"
        f"ctypes.CDLL('{fake}/libexit_free.so').remember(p)\n"
    )
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--", sys.executable, "-c", code], env=env)
    assert p.returncode == 0, p.stderr
    assert "exit_free rc=0" in p.stderr


# --- fork and exec --------------------------------------------------------------------------

def test_fork_and_exec_children_count_in_the_group(env, tmp_path):
    reg = tmp_path / "g.region"
    code = f"""
import ctypes, os, subprocess, sys
c = ctypes.CDLL("libcuda.so.1"); c.cuInit(0); d = ctypes.c_int(); x = ctypes.c_void_p()
c.cuDeviceGet(ctypes.byref(d), 0); c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); c.cuCtxSetCurrent(x)
p = ctypes.c_uint64()
assert c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t({10 * MiB})) == 0
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    assert c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t({5 * MiB})) == 0
    os.write(ready_w, b"x"); os.read(go_r, 1); os._exit(0)
os.read(ready_r, 1)
out = subprocess.run([sys.executable, "-c", "import ctypes; c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); "
    "d = ctypes.c_int(); x = ctypes.c_void_p(); c.cuDeviceGet(ctypes.byref(d), 0); "
    "c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); c.cuCtxSetCurrent(x); p = ctypes.c_uint64(); "
    "print(c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t({60 * MiB})))"], capture_output=True, text=True)
print("exec", out.stdout.strip())
os.system("pyvgpu status --region {reg} --json > {tmp_path}/status.json")
os.write(go_w, b"x")
os.waitpid(pid, 0)
"""
    p = run([*PYVGPU, "wrap", "--memory", "64M", "--region", str(reg), "--", sys.executable, "-c", code], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "exec 2" in p.stdout  # the exec'd child shares the quota: 10 + 5 + 60 > 64
    g = json.loads((tmp_path / "status.json").read_text())["groups"][0]
    by_pid = sorted(pr["devices"]["0"]["data"] for pr in g["processes"] if pr["devices"])
    assert by_pid == [5 * MiB, 10 * MiB]  # the forked child has its own slot


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["4X", "-1", "", "0", "4GB", "99999999999T", "0=2G,0=3G", "17=1G", "4G,1=2G",
                                   "0=", "G", "４G", "²=1G"])
def test_bad_memory_option(env, value):
    p = run([*PYVGPU, "wrap", "--memory", value, "--", "true"], env=env)
    assert p.returncode == 2, p.stderr
    assert f"--memory {value!r}" in p.stderr


@pytest.mark.parametrize("var,value", [("CUDA_DEVICE_MEMORY_LIMIT", "4X"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "-5"),
                                       ("CUDA_DEVICE_MEMORY_LIMIT_x", "1G")])
def test_bad_memory_env(env, var, value):
    env[var] = value
    p = run([*PYVGPU, "wrap", "--", "true"], env=env)
    assert p.returncode == 2
    assert var in p.stderr


def test_limit_above_physical_memory(env):
    p = run([*PYVGPU, "wrap", "--memory", "0=17G", "--", "true"], env=env)  # the fake's device 0 has 16 GiB
    assert p.returncode == 2 and "more than device 0's 16 GiB" in p.stderr
    p = run([*PYVGPU, "wrap", "--memory", "5=1G", "--", "true"], env=env)
    assert p.returncode == 2 and "no device 5" in p.stderr


def _region_bytes(tmp_path) -> bytearray:
    good = tmp_path / "good.region"
    region.create(good, region.GroupSpec("g", [LIMIT] * L.MAX_DEVICES))
    return bytearray(good.read_bytes())


@pytest.mark.parametrize("damage,message", [
    ("garbage", "not a pyvgpu region (bad magic)"),
    ("version", "layout version 99"),
    ("truncated", "is damaged"),
    ("short", "too short"),
])
def test_corrupt_foreign_or_other_version_region(env, tmp_path, damage, message):
    data = _region_bytes(tmp_path)
    if damage == "garbage":
        data[:8] = b"NOTOURS!"
    elif damage == "version":
        data[8:12] = (99).to_bytes(4, "little")
    elif damage == "truncated":
        data = data[: len(data) - 4096]
    elif damage == "short":
        data = data[:100]
    bad = tmp_path / "bad.region"
    bad.write_bytes(bytes(data))
    before = bad.read_bytes()
    p = run([*PYVGPU, "wrap", "--region", str(bad), "--", "true"], env=env)
    assert p.returncode == 2
    assert message in p.stderr and str(bad) in p.stderr
    assert bad.read_bytes() == before  # nothing was reset or lost


def test_region_of_another_owner_is_refused(env, tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give the file to another user")
    p = tmp_path / "g.region"
    region.create(p, region.GroupSpec("g", [0] * L.MAX_DEVICES))
    os.chown(p, 12345, -1)
    r = run([*PYVGPU, "wrap", "--region", str(p), "--", "true"], env=env)
    assert r.returncode == 2 and "belongs to uid 12345" in r.stderr, r.stderr  # another user's (docs/security.md)
    # trusted by the opt-in, it is still checked: its header names another creator than its owner
    r = run([*PYVGPU, "wrap", "--region", str(p), "--", "true"], env=dict(env, PYVGPU_TRUST_SHARED="1"))
    assert r.returncode == 2 and "has been replaced" in r.stderr, r.stderr


def test_region_file_mode_is_private(env, tmp_path):
    p = tmp_path / "g.region"
    run([*PYVGPU, "wrap", "--memory", "1G", "--region", str(p), "--", "true"], env=env)
    assert p.stat().st_mode & 0o777 == 0o600


# --- status ---------------------------------------------------------------------------------------

def test_status_json_schema(env, fake, tmp_path):
    reg = tmp_path / "g.region"
    a = hold(env, fake, 3 * MiB, "--memory", "0=64M", "--region", str(reg))
    try:
        g = status(env, reg)
        assert set(g) == {"name", "path", "created_ns", "sm_switch", "reclaimed_now", "n_physical", "gpus", "devices",
                          "processes", "events", "mode", "mps_active_threads", "priority", "sm_borrow"}
        assert g["mode"] == "hami-core" and g["mps_active_threads"] is None
        assert g["n_physical"] == 2  # the fake machine's devices, as NVML told `pyvgpu wrap`
        dev = g["devices"][0]
        sm = dev.pop("sm")
        assert dev == {"index": 0, "limit": LIMIT, "used": 3 * MiB, "free": LIMIT - 3 * MiB, "peak": 3 * MiB,
                       "oom_refusals": 0, "reclaimed": 0}
        assert sm["limit_percent"] is None and not sm["enforced"] and sm["controller"] == "not started"
        (pr,) = g["processes"]
        assert pr["alive"] and pr["pid"] > 0 and pr["sm_policy"] == "default" and pr["launches_limited"] == 0
        assert pr["launches"] == 0 and g["events"] == [] and g["gpus"] is None
        assert pr["devices"] == {"0": {"data": 3 * MiB, "context": 0, "module": 0}}
        text = run([*PYVGPU, "status", "--region", str(reg)], env=env).stdout
        assert "64 MiB" in text and "3 MiB" in text
    finally:
        a.stdin.close()
        a.wait(30)
