"""--devices: the program sees the group's devices, in order, through CUDA and NVML alike.

The fake machine has three devices of 16, 8 and 4 GiB (FAKECUDA_DEVICES);
tests/hosts/host_devices prints what CUDA and NVML show a program.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import PYVGPU, run

from pyvgpu.group import region
from pyvgpu.host import devices

GiB = 1 << 30
MiB = 1 << 20
CAPS = "16G,8G,4G"


def uuid(i: int) -> str:
    return f"GPU-fa4ec0da-0000-0000-0000-0000000000{i:02x}"


@pytest.fixture
def env3(env, tmp_path):
    return dict(env, FAKECUDA_DEVICES=CAPS, FAKECUDA_SIM=str(tmp_path / "machine.sim"))


def view(env, fake, *opts: str, args=()) -> dict:
    p = run([*PYVGPU, "wrap", *opts, "--", str(fake / "host_devices"), *args], env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_the_fake_machine_without_devices(env3, fake):
    v = view(env3, fake)
    assert v["cuda_count"] == 3 and v["nvml_count"] == 3
    assert [d["uuid"] for d in v["cuda"]] == [uuid(0), uuid(1), uuid(2)]


def test_cuda_and_nvml_see_the_chosen_devices_in_order_with_their_limits(env3, fake):
    # group device 0 is the machine's 2 (4 GiB), group device 1 the machine's 0 (16 GiB)
    v = view(env3, fake, "--devices", "2,0", "--memory", "1=2G",
             args=[f"alloc:1:{100 * MiB}", f"uuid:{uuid(0)}", f"uuid:{uuid(1)}", f"uuid:{uuid(2)}"])
    assert v["cuda_init"] == 0 and v["cuda_count"] == 2
    assert [d["uuid"] for d in v["cuda"]] == [uuid(2), uuid(0)]
    assert [d["total"] for d in v["cuda"]] == [4 * GiB, 2 * GiB]
    assert [d["mem_total"] for d in v["cuda"]] == [4 * GiB, 2 * GiB]
    assert v["cuda"][1]["free"] == 2 * GiB - 100 * MiB
    assert v["nvml_count"] == 2 and v["nvml_count_v1"] == 2
    assert [d["uuid"] for d in v["nvml"]] == [uuid(2), uuid(0)]
    assert [d["index"] for d in v["nvml"]] == [0, 1]
    assert [d["rc_v1"] for d in v["nvml"]] == [0, 0]
    # the limit is on the right physical device, as NVML tells it too
    assert v["nvml"][1]["total"] == 2 * GiB and v["nvml"][1]["v2"]["total"] == 2 * GiB
    assert v["nvml"][1]["used"] == 100 * MiB and v["nvml"][1]["free"] == 2 * GiB - 100 * MiB
    assert v["nvml"][0]["total"] == 4 * GiB
    assert v["bad_index_rc"] == 2  # NVML_ERROR_INVALID_ARGUMENT: past the group's devices
    assert v["by_uuid"][uuid(0)] == {"rc": 0, "index": 1}
    assert v["by_uuid"][uuid(2)] == {"rc": 0, "index": 0}
    assert v["by_uuid"][uuid(1)]["rc"] == 6  # NVML_ERROR_NOT_FOUND: not the group's
    # the process list: this process, with what the group charged it on that device
    (pid, used), = v["nvml"][1]["procs_v3"]
    assert used == 100 * MiB and v["nvml"][1]["procs_v2"] == v["nvml"][1]["procs_v3"]
    assert v["nvml"][1]["procs_v1"] == [[pid, 100 * MiB]] == v["nvml"][1]["procs_detail"]
    assert v["nvml"][0]["procs_v3"] == []


def test_devices_by_uuid_any_case(env3, fake):
    v = view(env3, fake, "--devices", f"GPU-{uuid(1)[4:].upper()},0")
    assert [d["uuid"] for d in v["cuda"]] == [uuid(1), uuid(0)] == [d["uuid"] for d in v["nvml"]]


def test_other_groups_processes_are_not_shown(env3, fake, tmp_path):
    other = subprocess.Popen([*PYVGPU, "wrap", "--devices", "0", "--memory", "1G", "--region",
                              str(tmp_path / "b.region"), "--", str(fake / "host_mem_linked"), "hold", str(MiB)],
                             env=env3, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert other.stdout.readline().startswith("HELD")
        raw = run([str(fake / "host_devices")], env=env3)  # outside any group: NVML's own list
        nvml = json.loads(raw.stdout)["nvml"][0]
        assert [p[1] for p in nvml["procs_v3"]] == [12345678] == [p[1] for p in nvml["procs_detail"]]  # the fake's
        v = view(env3, fake, "--devices", "0", "--memory", "1G", args=[f"alloc:0:{3 * MiB}"])
        procs = v["nvml"][0]["procs_v3"]
        assert len(procs) == 1 and procs[0][1] == 3 * MiB and procs[0][0] != other.pid
        assert v["nvml"][0]["procs_detail"] == procs
    finally:
        other.stdin.close()
        other.wait(30)


def test_a_member_joining_without_devices_gets_the_groups(env3, fake, tmp_path):
    reg = tmp_path / "g.region"
    first = view(env3, fake, "--devices", "1", "--region", str(reg))
    second = view(env3, fake, "--region", str(reg))
    assert [d["uuid"] for d in first["cuda"]] == [d["uuid"] for d in second["cuda"]] == [uuid(1)]
    p = run([*PYVGPU, "wrap", "--devices", "2", "--region", str(reg), "--", "true"], env=env3)
    assert p.returncode == 2 and "uses devices 1, but --devices 2 asks for 2" in p.stderr


@pytest.mark.parametrize("spec,message", [
    ("5", "there is no device 5; this machine has 3: 0 (Fake GPU 0), 1 (Fake GPU 1), 2 (Fake GPU 2)"),
    ("0,0", "device 0 is given twice"),
    ("", "give device indices or GPU UUIDs"),
    ("0,", "give device indices or GPU UUIDs"),
    ("GPU-deadbeef", "no device has the UUID 'GPU-deadbeef'"),
    ("GPU-fa4e", "is the start of 3 devices' UUIDs"),
    ("first", "'first' is not a device"),
])
def test_device_selection_errors_come_before_start(env3, spec, message):
    p = run([*PYVGPU, "wrap", "--devices", spec, "--", "true"], env=env3)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_limits_count_in_the_chosen_devices(env3):
    p = run([*PYVGPU, "wrap", "--devices", "2", "--memory", "1=1G", "--", "true"], env=env3)
    assert p.returncode == 2 and "there is no device 1 (1 with --devices)" in p.stderr
    p = run([*PYVGPU, "wrap", "--devices", "2", "--memory", "6G", "--", "true"], env=env3)
    assert p.returncode == 2 and "6 GiB is more than device 0's 4 GiB" in p.stderr
    p = run([*PYVGPU, "wrap", "--devices", "2", "--sm", "1=30", "--", "true"], env=env3)
    assert p.returncode == 2 and "there is no device 1 (1 with --devices)" in p.stderr


def test_devices_must_be_among_those_the_shell_allows(env3):
    p = run([*PYVGPU, "wrap", "--devices", "2", "--", "true"], env=dict(env3, CUDA_VISIBLE_DEVICES="0,1"))
    assert p.returncode == 2 and "not among CUDA_VISIBLE_DEVICES='0,1'" in p.stderr
    p = run([*PYVGPU, "wrap", "--devices", "1", "--", "true"], env=dict(env3, CUDA_VISIBLE_DEVICES="0,1"))
    assert p.returncode == 0, p.stderr


def test_devices_without_nvml_is_refused(env3, tmp_path):
    p = run([*PYVGPU, "wrap", "--devices", "0", "--", "true"],
            env=dict(env3, LD_LIBRARY_PATH=str(tmp_path)))  # no libnvidia-ml there
    assert p.returncode == 2 and "NVML (libnvidia-ml.so.1) cannot list this machine's devices" in p.stderr


CHANGE_VISIBLE = """
import ctypes, json, os
os.environ["CUDA_VISIBLE_DEVICES"] = "0"   # the program picks a device of its own
c = ctypes.CDLL("libcuda.so.1")
rc = c.cuInit(0)
n = ctypes.c_int(-1)
c.cuDeviceGetCount(ctypes.byref(n))
ctx = ctypes.c_void_p()
print(json.dumps({"init": rc, "count": n.value, "retain": c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)}))
"""


def test_a_program_that_changes_cuda_visible_devices_is_refused_loudly(env3, tmp_path):
    reg = tmp_path / "g.region"
    p = run([*PYVGPU, "wrap", "--devices", "1", "--region", str(reg), "--", sys.executable, "-c", CHANGE_VISIBLE],
            env=env3)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"init": 100, "count": 0, "retain": 100}  # CUDA_ERROR_NO_DEVICE
    assert "does not see its vGPU's devices (nvidia-smi's 1)" in p.stderr
    assert p.stderr.count("pyvgpu: CUDA in this process") == 1
    s = json.loads(run([*PYVGPU, "status", "--region", str(reg), "--json"], env=env3).stdout)["groups"][0]
    assert [e["kind"] for e in s["events"]] == ["devices_refused"]
    assert s["gpus"] == [{"index": 0, "nvml_index": 1, "uuid": uuid(1), "mig": False}]


def test_select_resolves_against_a_given_machine():
    gpus = [devices.Gpu(0, uuid(0), "a", GiB), devices.Gpu(1, uuid(1), "b", GiB)]
    assert [g.index for g in devices.select("1,0", {}, gpus)] == [1, 0]
    assert devices.uuid_text(devices.uuid_bytes(uuid(1))) == uuid(1)
    with pytest.raises(Exception, match="allows no device"):
        devices.select("0", {"CUDA_VISIBLE_DEVICES": ""}, gpus)


def test_utilization_reports_the_groups_share(env3, fake, tmp_path):
    """Under a share, NVML tells the group its own utilization: here a 30% group next to an unlimited one."""
    from pyvgpu.native.shim import BENCH_BIN

    other = subprocess.Popen([*PYVGPU, "wrap", "--devices", "0", "--region", str(tmp_path / "b.region"), "--",
                              str(BENCH_BIN), "sm", "30", "2000", "kernel"], env=env3, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))  # not the source tree
    mine = subprocess.Popen([*PYVGPU, "wrap", "--devices", "0", "--sm", "30", "--region", str(tmp_path / "a.region"),
                             "--", str(BENCH_BIN), "sm", "30", "2000", "kernel"], env=env3, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:  # until the device is busy and the controller has had a few steps
            time.sleep(1)
            raw = json.loads(run([str(fake / "host_devices")], env=env3).stdout)
            if not (tmp_path / "a.region").exists():
                continue  # its wrap is still starting
            r = region.open_region(tmp_path / "a.region", writable=False)
            os.close(r.fd)
            if raw["nvml"][0]["util"] >= 90 and r.device(0).sm_steps >= 4:
                break
        if raw["nvml"][0]["util"] < 90:  # the device never got busy: show why
            for p in (other, mine):
                p.kill()
            pytest.fail(f"the loads did not make the device busy: {raw['nvml'][0]}; load stderr: "
                        f"{other.communicate()[1][-2000:]!r} / {mine.communicate()[1][-2000:]!r}")
        v = view(env3, fake, "--region", str(tmp_path / "a.region"))
        assert 15 <= v["nvml"][0]["util"] <= 45, v["nvml"][0]  # the group's part of it
    finally:
        for p in (other, mine):
            p.kill()
            p.wait(60)


@pytest.mark.parametrize("visible, index", [(None, 0), ("1,0", 1), (uuid(2), 2)])
def test_the_benchs_nvml_sampler_reads_the_first_visible_device(env3, visible, index):
    """`bench sm` reads NVML's utilization of its loads' device 0: under CUDA_VISIBLE_DEVICES=1 that is GPU 1."""
    env = {k: v for k, v in env3.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    p = run([sys.executable, "-c", "from pyvgpu.bench.gpu_util import first_visible; print(first_visible())"],
            env=env)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) == index
