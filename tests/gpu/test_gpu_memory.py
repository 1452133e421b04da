"""Issue 3 on a real GPU: the cap holds for PyTorch (three allocators), JAX, CuPy, groups and nvidia-smi."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PYVGPU, clean_env, run

HERE = Path(__file__).resolve().parent
GiB = 1 << 30


def last_json(p):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "backend:cudaMallocAsync"])
def test_torch_sees_the_cap_and_gets_oom_past_it(conf):
    env = clean_env(PYTORCH_CUDA_ALLOC_CONF=conf) if conf else clean_env()
    r = last_json(run([*PYVGPU, "wrap", "--memory", "4G", "--", sys.executable, str(HERE / "torch_cap.py")],
                      env=env))
    print(json.dumps(r))
    assert r["total"] == 4 * GiB
    assert r["free"] <= 4 * GiB
    assert r["oom"], r
    assert 2 * GiB <= r["group_used"] <= 4 * GiB


def test_jax_preallocation_stays_inside_the_cap():
    r = last_json(run([*PYVGPU, "wrap", "--memory", "4G", "--", sys.executable, str(HERE / "jax_cap.py")],
                      env=clean_env()))
    print(json.dumps(r))
    assert r["limit"] == 4 * GiB
    assert r["group_peak"] <= 4 * GiB
    assert r["group_used"] >= 2 * GiB  # the preallocation happened, inside the cap
    assert r["bytes_limit"] is None or r["bytes_limit"] <= 4 * GiB


def test_cupy_is_capped():
    r = last_json(run([*PYVGPU, "wrap", "--memory", "4G", "--", sys.executable, str(HERE / "cupy_cap.py")],
                      env=clean_env()))
    print(json.dumps(r))
    assert r["total"] == 4 * GiB and r["oom"]


def test_two_processes_in_one_group_never_exceed_the_cap(tmp_path):
    reg = tmp_path / "g.region"
    env = clean_env()
    procs = [subprocess.Popen([*PYVGPU, "wrap", "--memory", "4G", "--region", str(reg), "--", sys.executable,
                               str(HERE / "torch_greedy.py")], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        held = [json.loads(p.stdout.readline())["held"] for p in procs]
        st = json.loads(run([*PYVGPU, "status", "--region", str(reg), "--json"], env=env).stdout)["groups"][0]
        print(json.dumps({"held": held, "group": st}))
        contexts = sum(pr["devices"].get("0", {}).get("context", 0) for pr in st["processes"])
        assert sum(held) + contexts <= 4 * GiB
        assert st["devices"][0]["peak"] <= 4 * GiB  # data and contexts together never past the cap
        assert st["devices"][0]["used"] >= 4 * GiB - 256 * 1024 * 1024  # they did fill it
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(120)


def test_nvidia_smi_shows_the_cap():
    q = ["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
    raw = run(q, env=clean_env())
    p = run([*PYVGPU, "wrap", "--memory", "4G", "--", *q], env=clean_env())
    print(raw.stdout, p.stdout, p.stderr[-500:])
    assert p.returncode == 0, p.stderr
    total, used, free = (int(x) for x in p.stdout.strip().splitlines()[0].split(","))
    assert total == 4096 and used + free == 4096


def test_context_and_eager_module_memory_are_charged():
    """Eagerly loaded modules are loaded while the context is created, so they are
    measured (and charged) with it: more than the lazily loaded context."""
    code = ("import os, json, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n"
            "from pyvgpu.group import region\n"
            "r = region.open_region(region.path_from_env(os.environ), writable=False)\n"
            "s = [r.slot(i) for i in range(r.header.n_slots) if r.slot(i).pid == os.getpid()][0]\n"
            "print(json.dumps({'context': s.used[1], 'module': s.used[2], 'data': s.used[0]}))")
    got = {}
    for mode in ("LAZY", "EAGER"):
        got[mode] = last_json(run([*PYVGPU, "wrap", "--memory", "16G", "--", sys.executable, "-c", code],
                                  env=clean_env(CUDA_MODULE_LOADING=mode)))
    print(json.dumps(got))
    lazy, eager = (got[m]["context"] + got[m]["module"] for m in ("LAZY", "EAGER"))
    assert lazy > 100 << 20
    assert eager > lazy + (100 << 20)
