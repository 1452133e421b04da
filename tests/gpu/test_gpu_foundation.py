"""Issue 2 on a real GPU: PyTorch and a C program through the callbacks, and
the cuGetProcAddress variant mapping checked against the live driver."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import calls, clean_env, lookups, run, wrapped

from pyvgpu.contract import hooks

HERE = Path(__file__).resolve().parent
VERSIONS = (2000, 3000, 3020, 4000, 5000, 6000, 6050, 7000, 9020, 10000, 10020, 11000, 11030, 11060, 12000,
            12050, 13000)


def test_torch_same_loss_and_calls_through_procaddr(tmp_path):
    env = clean_env()
    raw = run([sys.executable, str(HERE / "train_tiny.py")], env=env)
    assert raw.returncode == 0, raw.stderr
    p, stats = wrapped([sys.executable, str(HERE / "train_tiny.py")], env, tmp_path)
    assert p.returncode == 0, p.stderr
    raw_losses = json.loads(raw.stdout.strip().splitlines()[-1])["losses"]
    losses = json.loads(p.stdout.strip().splitlines()[-1])["losses"]
    assert losses == raw_losses
    (s,) = [s for s in stats if s["symbols"]]
    print(json.dumps(s, indent=1))
    assert s["bootstrap"] == "native"  # the packaged callbacks, loaded by the shim with no interpreter
    assert s["procaddr_mismatches"] == 0
    launches = calls(s, "cuLaunchKernel") + calls(s, "cuLaunchKernel_ptsz") + calls(s, "cuLaunchKernelEx") \
        + calls(s, "cuLaunchKernelEx_ptsz")
    assert launches > 0
    assert calls(s, "cuMemAlloc_v2") > 0
    assert lookups(s, "cuMemAlloc_v2", "procaddr") > 0
    assert any(lookups(s, n, "procaddr") for n in ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx",
                                                   "cuLaunchKernelEx_ptsz"))


def test_c_host_linked_goes_through_the_native_callbacks(hosts, tmp_path):
    p, stats = wrapped([str(hosts / "host_linked")], clean_env(), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("OK"), p.stdout
    (s,) = stats
    assert s["bootstrap"] == "native"
    assert calls(s, "cuMemAlloc_v2") == 3 and calls(s, "cuMemFree_v2") == 3
    assert calls(s, "cuLaunchKernel") == 5 and calls(s, "cuLaunchKernel_ptsz") == 2
    assert calls(s, "cuLaunchKernelEx") == 1 and calls(s, "cuLaunchKernelEx_ptsz") == 1
    assert calls(s, "nvmlInit_v2") == 1 and calls(s, "nvmlDeviceGetMemoryInfo") == 1


def test_procaddr_variants_match_the_live_driver(hosts, tmp_path):
    queries = "".join(f"{h.name} {v} {f}\n" for h in hooks.HOOKS if h.lib == "cuda"
                      for v in VERSIONS for f in (0, 1, 2))
    env = clean_env()
    raw = run([str(hosts / "host_procaddr"), "query"], env=env, input=queries)
    p, stats = wrapped([str(hosts / "host_procaddr"), "query"], env, tmp_path, input=queries)
    assert raw.returncode == 0 and p.returncode == 0, raw.stderr + p.stderr
    raw_lines, lines = raw.stdout.splitlines(), p.stdout.splitlines()
    assert len(raw_lines) == len(lines) == queries.count("\n")
    hooked = 0
    for r, w in zip(raw_lines, lines, strict=True):
        name, ver, fl, rc, st, lib, sym = r.split()
        wname, wver, wfl, wrc, wst, wlib, wsym = w.split()
        assert (rc, st, sym) == (wrc, wst, wsym), (r, w)
        if sym != "-":
            assert lib.startswith("libcuda"), r
            assert wlib == "libpyvgpu.so", w  # the hook of exactly the driver's variant
            hooked += 1
    assert hooked > 50
    assert all(s["procaddr_mismatches"] == 0 for s in stats)
