"""--devices on a real GPU machine: nvidia-smi (NVML) and PyTorch (CUDA) see the same devices and totals."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys

import pytest
from helpers import PYVGPU, run

from pyvgpu.host import devices

GiB = 1 << 30

TORCH_VIEW = """
import json, torch
out = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    free, total = torch.cuda.mem_get_info(i)
    u = str(p.uuid)
    out.append({"uuid": u if u.startswith("GPU-") else "GPU-" + u, "total": p.total_memory, "info_total": total})
print(json.dumps(out))
"""


def smi(env, *wrap: str) -> list[dict]:
    cmd = ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]
    p = run([*PYVGPU, "wrap", *wrap, "--", *cmd] if wrap else cmd, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return [{"index": int(r[0]), "uuid": r[1].strip(), "total_mib": int(r[2])}
            for r in csv.reader(io.StringIO(p.stdout)) if r]


def selections() -> list[list[int]]:
    n = len(devices.machine() or [])
    return [[n - 1], [1, 0]] if n >= 2 else [[0]]


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
@pytest.mark.parametrize("chosen", selections(), ids=lambda c: ",".join(map(str, c)))
def test_nvidia_smi_and_torch_agree_under_devices_and_memory(chosen):
    pytest.importorskip("torch")
    gpus = devices.machine()
    env = None
    spec = ",".join(map(str, chosen))
    want = [gpus[i].uuid for i in chosen]
    shown = smi(env, "--devices", spec, "--memory", "4G")
    assert [r["uuid"] for r in shown] == want
    assert [r["index"] for r in shown] == list(range(len(chosen)))
    assert all(r["total_mib"] == 4096 for r in shown)
    p = run([*PYVGPU, "wrap", "--devices", spec, "--memory", "4G", "--", sys.executable, "-c", TORCH_VIEW], env=env)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    assert [d["uuid"] for d in seen] == want
    assert all(d["total"] == 4 * GiB and d["info_total"] == 4 * GiB for d in seen)


def test_nvml_process_lists_hold_the_groups_processes_with_their_charged_memory(tmp_path, hosts):
    """Through NVML's public API (what pynvml-based tools use). nvidia-smi itself reads processes through
    NVML's private export table, which the shim does not translate (docs/monitoring.md)."""
    pytest.importorskip("torch")
    import subprocess

    hold_cmd = ("import torch,sys; x=torch.empty(1<<30, dtype=torch.uint8, device='cuda'); "
                "torch.cuda.synchronize(); print('HELD', flush=True); sys.stdin.read()")
    reg = tmp_path / "g.region"
    mine = subprocess.Popen([*PYVGPU, "wrap", "--devices", "0", "--memory", "8G", "--region", str(reg), "--",
                             sys.executable, "-c", hold_cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=str(tmp_path))
    other = subprocess.Popen([*PYVGPU, "wrap", "--memory", "8G", "--region", str(tmp_path / "other.region"), "--",
                              sys.executable, "-c", hold_cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=str(tmp_path))
    try:
        assert mine.stdout.readline().startswith("HELD") and other.stdout.readline().startswith("HELD")

        def charged() -> int:
            st = json.loads(run([*PYVGPU, "status", "--region", str(reg), "--json"]).stdout)["groups"][0]
            (member,) = [x for x in st["processes"] if x["pid"] == mine.pid]
            return sum(member["devices"]["0"].values())

        before = charged()
        p = run([*PYVGPU, "wrap", "--region", str(reg), "--", str(hosts / "host_devices")])
        assert p.returncode == 0, p.stderr
        after = charged()
        dev = json.loads(p.stdout)["nvml"][0]
        for key in ("procs_v3", "procs_v2", "procs_v1", "procs_detail"):
            assert len(dev[key]) == 1 and dev[key][0][0] == mine.pid, (key, dev[key])  # not the other group's
            assert dev[key][0][1] in (before, after), (key, dev[key], before, after)
        raw = json.loads(run([str(hosts / "host_devices")]).stdout)["nvml"][0]["procs_v3"]
        assert {mine.pid, other.pid} <= {pid for pid, _ in raw}  # outside any group NVML shows both
    finally:
        for h in (mine, other):
            h.stdin.close()
            h.wait(60)
