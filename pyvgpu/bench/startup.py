"""`pyvgpu bench startup`: time from exec to the first CUDA call returning.

Hosts: a Python program (ctypes, cuInit) and a C program (pv_bench
startup). Each runs raw, wrapped with a warm callback cache, and wrapped
with an empty one (cold: includes compiling the callbacks). Wrapped times
include `pyvgpu wrap` itself. Each figure is the median of ``runs``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from pyvgpu import cache
from pyvgpu.bench.common import machine, median, raw_env
from pyvgpu.errors import PyvgpuError
from pyvgpu.shim import BENCH_BIN

PY_HOST = ("import ctypes, time\n"
           "lib = ctypes.CDLL('libcuda.so.1')\n"
           "rc = lib.cuInit(0)\n"
           "assert rc == 0, rc\n"
           "print('{\"t_ns\": %d}' % time.clock_gettime_ns(time.CLOCK_MONOTONIC))\n")
GOALS_S = {"python": 0.7, "c": 1.0}  # warm wrapped minus raw


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise PyvgpuError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    t1 = json.loads(p.stdout.strip().splitlines()[-1])["t_ns"]
    return (t1 - t0) / 1e9


def run(runs: int = 5, cold_runs: int = 2) -> dict:
    cache.ensure()
    base = raw_env()
    hosts = {"python": [sys.executable, "-c", PY_HOST], "c": [str(BENCH_BIN), "startup"]}
    wrap_cmd = [sys.executable, "-m", "pyvgpu", "wrap", "--"]
    out: dict[str, dict[str, float]] = {}
    for host, cmd in hosts.items():
        samples: dict[str, list[float]] = {"raw": [], "wrapped_warm": [], "wrapped_cold": []}
        for i in range(runs):
            samples["raw"].append(_time(cmd, base))
            samples["wrapped_warm"].append(_time(wrap_cmd + cmd, base))
            if i < cold_runs:  # each compiles the callbacks from scratch
                with tempfile.TemporaryDirectory(prefix="pyvgpu-cold-") as cold:
                    samples["wrapped_cold"].append(_time(wrap_cmd + cmd, {**base, "PYVGPU_CACHE_DIR": cold}))
        med = {k: median(v) for k, v in samples.items()}
        med["warm_overhead"] = med["wrapped_warm"] - med["raw"]
        med["cold_overhead"] = med["wrapped_cold"] - med["raw"]
        med["goal_warm_overhead"] = GOALS_S[host]
        out[host] = {**med, "samples": samples}
    return {"bench": "startup", "machine": machine(), "runs": runs, "cold_runs": cold_runs, "hosts": out}


def table(result: dict) -> str:
    lines = [f"pyvgpu bench startup on {result['machine']['gpu']} (median of {result['runs']} runs, "
             f"{result['cold_runs']} cold; seconds from exec to the first cuInit returning)",
             f"  {'host':<8} {'raw':>7} {'warm':>7} {'cold':>7} {'+warm':>7} {'+cold':>7} {'goal':>7}"]
    for host, s in result["hosts"].items():
        lines.append(f"  {host:<8} {s['raw']:>7.3f} {s['wrapped_warm']:>7.3f} {s['wrapped_cold']:>7.3f} "
                     f"{s['warm_overhead']:>7.3f} {s['cold_overhead']:>7.3f} {'<=' + str(s['goal_warm_overhead']):>7}")
    return "\n".join(lines)
