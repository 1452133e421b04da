"""MIG instances as devices, on the fake driver only (no MIG hardware was used; pyvgpu never changes MIG geometry).

The fake machine: GPUs of 16 and 8 GiB; GPU 0 is in MIG mode with instances of 4 GiB (1g.4gb, GPU
instance 1) and 8 GiB (2g.8gb, GPU instance 2) (FAKENVML_MIG, tests/fakecuda/fake_devices.h). What the fakes
do is what NVIDIA documents: a MIG instance has a UUID of its own (NVML, cuDeviceGetUuid_v2), CUDA enumerates
a single MIG instance per process, and NVML reports no utilization in MIG mode.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import PYVGPU, run

from pyvgpu.group import region
from pyvgpu.host import devices

GiB = 1 << 30
MiB = 1 << 20
GPU0 = "GPU-fa4ec0da-0000-0000-0000-000000000000"
GPU1 = "GPU-fa4ec0da-0000-0000-0000-000000000001"
MIG0 = "MIG-fa4ec0da-4d49-0000-0000-000000000000"  # 1g.4gb on GPU 0
MIG1 = "MIG-fa4ec0da-4d49-0000-0000-000000000001"  # 2g.8gb on GPU 0
LAYOUT = "0:1g.4gb:4G,0:2g.8gb:8G"


@pytest.fixture
def menv(env, tmp_path):
    return dict(env, FAKECUDA_DEVICES="16G,8G", FAKENVML_MIG=LAYOUT, FAKECUDA_SIM=str(tmp_path / "machine.sim"))


def view(env, fake, *opts: str, args=()) -> dict:
    p = run([*PYVGPU, "wrap", *opts, "--", str(fake / "host_devices"), *args], env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def hexpart(u: str) -> str:
    return u.split("-", 1)[1]  # host_devices prints every CUDA UUID as GPU-...


def test_devices_lists_gpus_and_their_mig_instances(menv):
    p = run([*PYVGPU, "devices", "--json"], env=menv)
    assert p.returncode == 0, p.stderr
    gpus = json.loads(p.stdout)["gpus"]
    assert [(g["uuid"], g["mig_mode"]) for g in gpus] == [(GPU0, True), (GPU1, False)]
    assert [(m["uuid"], m["name"], m["memory"], m["legacy_name"]) for m in gpus[0]["mig"]] == [
        (MIG0, "Fake GPU 0 MIG 1g.4gb", 4 * GiB, f"MIG-{GPU0}/1/0"),
        (MIG1, "Fake GPU 0 MIG 2g.8gb", 8 * GiB, f"MIG-{GPU0}/2/0")]
    assert gpus[1]["mig"] == []
    text = run([*PYVGPU, "devices"], env=menv).stdout
    assert "GPU 0: Fake GPU 0" in text and "MIG mode on" in text and f"MIG Fake GPU 0 MIG 1g.4gb: {MIG0}" in text


def test_devices_without_mig(env):
    p = run([*PYVGPU, "devices", "--json"], env=dict(env, FAKECUDA_DEVICES="16G"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["gpus"][0]["mig_mode"] is False and json.loads(p.stdout)["gpus"][0]["mig"] == []


def test_the_fake_cuda_sees_one_mig_instance_by_its_own_uuid(menv, fake):
    """The test double itself: CUDA_VISIBLE_DEVICES=MIG-... gives that instance (its memory, its UUID through
    cuDeviceGetUuid_v2); a second MIG entry is not enumerated (one MIG instance per process)."""
    for cvd in (MIG1, f"{MIG1},{MIG0}", f"MIG-{GPU0}/2/0", MIG1[:-1] + "1"):
        v = json.loads(run([str(fake / "host_devices")], env=dict(menv, CUDA_VISIBLE_DEVICES=cvd)).stdout)
        assert v["cuda_init"] == 0 and v["cuda_count"] == 1, (cvd, v)
        assert hexpart(v["cuda"][0]["uuid"]) == hexpart(MIG1) and v["cuda"][0]["total"] == 8 * GiB
    v = json.loads(run([str(fake / "host_devices")], env=dict(menv, CUDA_VISIBLE_DEVICES="MIG-ffff")).stdout)
    assert v["cuda_init"] == 100  # CUDA_ERROR_NO_DEVICE


def test_wrap_on_a_mig_instance_caps_its_memory(menv, fake, tmp_path):
    reg = tmp_path / "m.region"
    v = view(menv, fake, "--devices", MIG0, "--memory", "1G", "--region", str(reg), args=[f"alloc:0:{100 * MiB}"])
    assert v["cuda_init"] == 0 and v["cuda_count"] == 1
    assert hexpart(v["cuda"][0]["uuid"]) == hexpart(MIG0)
    assert v["cuda"][0]["total"] == GiB and v["cuda"][0]["free"] == GiB - 100 * MiB
    # NVML: one device (the group's), its GPU's handle, with the group's memory view
    assert v["nvml_count"] == 1 and v["nvml"][0]["total"] == GiB
    r = region.open_region(reg, writable=False)
    try:
        assert r.visible() == [(0, MIG0)]
    finally:
        os.close(r.fd)
    s = json.loads(run([*PYVGPU, "status", "--region", str(reg), "--json"], env=menv).stdout)["groups"][0]
    assert s["gpus"] == [{"index": 0, "nvml_index": 0, "uuid": MIG0, "mig": True}]
    text = run([*PYVGPU, "status", "--region", str(reg)], env=menv).stdout
    assert f"0 = MIG instance {MIG0} of nvidia-smi 0" in text


def test_a_cap_over_the_instance_is_refused_and_without_one_the_instance_is_the_limit(menv, fake):
    p = run([*PYVGPU, "wrap", "--devices", MIG0, "--memory", "6G", "--", "true"], env=menv)
    assert p.returncode == 2 and "6 GiB is more than device 0's 4 GiB" in p.stderr, p.stderr
    v = view(menv, fake, "--devices", MIG1)
    assert v["cuda_count"] == 1 and v["cuda"][0]["total"] == 8 * GiB


def test_the_older_name_and_any_case_choose_the_same_instance(menv, fake):
    for spec in (f"MIG-{GPU0}/2/0", MIG1.upper()):
        v = view(menv, fake, "--devices", spec, "--memory", "2G")
        assert hexpart(v["cuda"][0]["uuid"]) == hexpart(MIG1) and v["cuda"][0]["total"] == 2 * GiB, spec


def test_two_groups_on_two_instances_of_one_gpu_have_their_own_caps(menv, fake, tmp_path):
    a = view(menv, fake, "--devices", MIG0, "--memory", "512M", "--group", "mig-a", args=[f"alloc:0:{400 * MiB}"])
    b = view(menv, fake, "--devices", MIG1, "--memory", "3G", "--group", "mig-b", args=[f"alloc:0:{2 * GiB}"])
    assert a["cuda"][0]["total"] == 512 * MiB and a["cuda"][0]["free"] == 112 * MiB
    assert b["cuda"][0]["total"] == 3 * GiB and b["cuda"][0]["free"] == GiB
    # a group is bound to its instance: the same group on the other instance is refused
    p = run([*PYVGPU, "wrap", "--devices", MIG1, "--group", "mig-a", "--", "true"], env=menv)
    assert p.returncode == 2 and "mig-a" in p.stderr and "asks for" in p.stderr, p.stderr


@pytest.mark.parametrize("spec,message", [
    (f"{MIG0},{MIG1}", "a CUDA process sees a single MIG instance"),
    (f"{MIG0},1", "a CUDA process sees a single MIG instance"),
    ("0", f"GPU 0 ({GPU0}) has its MIG mode on, so its memory and SMs belong to its MIG instances; give one of "
          f"them instead: {MIG0}, {MIG1}"),
    (GPU0, "has its MIG mode on"),
    ("MIG-deadbeef", f"no MIG instance is 'MIG-deadbeef'; this machine's MIG instances: {MIG0} (Fake GPU 0 MIG "
                     "1g.4gb, GPU 0)"),
    (f"MIG-{GPU0}/3/0", f"no MIG instance is 'MIG-{GPU0}/3/0'"),
    ("MIG-fa4e", "is the start of 2 MIG instances' UUIDs"),
    (f"{MIG0},{MIG0}", f"MIG instance {MIG0} is given twice"),
    ("MIG-xyz", "'MIG-xyz' is not a device"),
])
def test_mig_selection_errors_come_before_start(menv, spec, message):
    p = run([*PYVGPU, "wrap", "--devices", spec, "--", "true"], env=menv)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_a_mig_uuid_on_a_machine_without_mig_says_how_instances_are_made(env):
    p = run([*PYVGPU, "wrap", "--devices", MIG0, "--", "true"], env=dict(env, FAKECUDA_DEVICES="16G"))
    assert p.returncode == 2 and "this machine has no MIG instance (no GPU has its MIG mode on)" in p.stderr
    assert "nvidia-smi mig" in p.stderr and "pyvgpu only uses the ones that exist" in p.stderr


def test_a_compute_share_on_a_mig_instance_is_refused(menv):
    p = run([*PYVGPU, "wrap", "--devices", MIG0, "--sm", "30", "--", "true"], env=menv)
    assert p.returncode == 2 and "is a MIG instance: NVML reports no utilization in MIG mode" in p.stderr, p.stderr
    p = run([*PYVGPU, "wrap", "--devices", MIG0, "--sm", "30", "--on-error", "open", "--", "true"], env=menv)
    assert p.returncode == 0 and "running without a compute share" in p.stderr, p.stderr


def test_cuda_visible_devices_of_the_shell_bounds_mig_choices(menv):
    p = run([*PYVGPU, "wrap", "--devices", MIG1, "--", "true"], env=dict(menv, CUDA_VISIBLE_DEVICES=MIG0))
    assert p.returncode == 2 and f"not among CUDA_VISIBLE_DEVICES='{MIG0}'" in p.stderr, p.stderr
    p = run([*PYVGPU, "wrap", "--devices", MIG0, "--", "true"], env=dict(menv, CUDA_VISIBLE_DEVICES=f"MIG-{GPU0}/1/0"))
    assert p.returncode == 0, p.stderr


def test_select_against_a_given_machine_with_mig():
    gpus = [devices.Gpu(0, GPU0, "a", 16 * GiB, mig_mode=True), devices.Gpu(1, GPU1, "b", 8 * GiB)]
    migs = [devices.Gpu(0, MIG0, "a MIG 1g", 4 * GiB, parent=GPU0, gi=1, ci=0)]
    (m,) = devices.select(MIG0, {}, gpus, migs)
    assert m.is_mig and m.total == 4 * GiB and m.legacy_name == f"MIG-{GPU0}/1/0"
    assert devices.uuid_text(m.uuid_bytes, mig=True) == MIG0
    assert [g.uuid for g in devices.select("1", {}, gpus, migs)] == [GPU1]


def test_the_fake_nvml_mig_calls(menv, fake):
    """The NVML calls pyvgpu uses, on the double: mode, count, handles, parent, ids, memory, utilization."""
    code = f"""
import ctypes, json
nv = ctypes.CDLL("libnvidia-ml.so.1"); nv.nvmlInit_v2()
h = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
cur, pend, n = ctypes.c_uint(9), ctypes.c_uint(9), ctypes.c_uint(0)
out = {{"mode": nv.nvmlDeviceGetMigMode(h, ctypes.byref(cur), ctypes.byref(pend)), "cur": cur.value}}
nv.nvmlDeviceGetMaxMigDeviceCount(h, ctypes.byref(n)); out["max"] = n.value
m = ctypes.c_void_p(); out["by_index"] = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 1, ctypes.byref(m))
out["empty"] = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 2, ctypes.byref(ctypes.c_void_p()))
is_mig = ctypes.c_uint(9)
nv.nvmlDeviceIsMigDeviceHandle(m, ctypes.byref(is_mig)); out["is_mig"] = is_mig.value
p = ctypes.c_void_p()
nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, ctypes.byref(p)); out["parent"] = p.value == h.value
u = ctypes.create_string_buffer(96); nv.nvmlDeviceGetUUID(m, u, 96); out["uuid"] = u.value.decode()
b = ctypes.c_void_p()
out["by_uuid"] = nv.nvmlDeviceGetHandleByUUID(b"{MIG1}", ctypes.byref(b)); out["same"] = b.value == m.value
mem = (ctypes.c_ulonglong * 3)(); nv.nvmlDeviceGetMemoryInfo(m, mem); out["total"] = mem[0]
util = (ctypes.c_uint * 2)(); out["util_gpu"] = nv.nvmlDeviceGetUtilizationRates(h, util)
out["util_mig"] = nv.nvmlDeviceGetUtilizationRates(m, util)
h1 = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(h1))
out["util_other"] = nv.nvmlDeviceGetUtilizationRates(h1, util)
out["mode1"] = (nv.nvmlDeviceGetMigMode(h1, ctypes.byref(cur), ctypes.byref(pend)), cur.value)
print(json.dumps(out))
"""
    import sys

    p = run([sys.executable, "-c", code], env=menv)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"mode": 0, "cur": 1, "max": 7, "by_index": 0, "empty": 6, "is_mig": 1,
                                    "parent": True, "uuid": MIG1, "by_uuid": 0, "same": True, "total": 8 * GiB,
                                    "util_gpu": 3, "util_mig": 3, "util_other": 0, "mode1": [0, 0]}
