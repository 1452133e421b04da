"""`pyvgpu bench startup`: time from exec to the first CUDA call returning, per host kind.

Hosts: this Python, any other interpreters given (``pythons``: each CPython
of a machine, with or without pyvgpu importable), and a C program
(pv_bench startup). Each runs

* raw: no pyvgpu;
* wrapped: under `pyvgpu wrap` (its own start included), with the callbacks
  the package carries or the user's tuned ones;
* container: started as the device plugin starts a container, with the
  shim in LD_PRELOAD and the variables Allocate sets (a cap and a share in
  a region made first), no `pyvgpu wrap` and no Python of pyvgpu's;
* wrapped, empty cache: `pyvgpu wrap` for a user whose cache is empty (the
  package's callbacks serve it; nothing is compiled).

Each figure is the median of ``runs``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyvgpu.bench.common import machine, median, raw_env
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.native import cache, shim
from pyvgpu.native.shim import BENCH_BIN

PY_HOST = ("import ctypes, time\n"
           "lib = ctypes.CDLL('libcuda.so.1')\n"
           "rc = lib.cuInit(0)\n"
           "assert rc == 0, rc\n"
           "print('{\"t_ns\": %d}' % int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e9))\n")
GOAL_S = 0.1  # added start-up per process (DESIGN.md: hundreds of containers start at once)
CAP = 1 << 30


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise PyvgpuError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    t1 = json.loads(p.stdout.strip().splitlines()[-1])["t_ns"]
    return (t1 - t0) / 1e9


def _version(python: str) -> str:
    p = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise PyvgpuError(f"--python {python}: does not run ({p.stderr.strip()[-200:]})")
    return p.stdout.strip()


def container_env(base: dict[str, str], tmp: Path) -> dict[str, str]:
    """The device plugin's way: LD_PRELOAD and HAMi's variables, the region made first (1 GiB, 30%)."""
    path = tmp / "vgpu.region"
    if not path.exists():
        region.create(path, region.GroupSpec("bench", [CAP] + [0] * 15, sm=[30] * 16))
    env = {**base, envspec.LD_PRELOAD.name: str(shim.shim_path()),
           envspec.CUDA_DEVICE_MEMORY_LIMIT.device(0): f"{CAP >> 20}m", envspec.CUDA_DEVICE_SM_LIMIT.name: "30",
           envspec.CUDA_DEVICE_MEMORY_SHARED_CACHE.name: str(path), envspec.SCHED.name: str(tmp / "turns")}
    env.pop(envspec.PYTHONPATH.name, None)
    return env


def run(runs: int = 5, pythons: list[str] | None = None) -> dict:
    if not shim.shim_path().exists():
        raise PyvgpuError(f"the shim {shim.shim_path()} is missing; {shim.missing_fix()}")
    lib = cache.read()
    if lib is None:
        raise PyvgpuError("no compiled callbacks fit this pyvgpu; run `pyvgpu warmup` first, so that the "
                          "figures are not a compile's")
    base = raw_env()
    hosts = {f"python {_version(sys.executable)}": [sys.executable, "-c", PY_HOST]}
    for py in pythons or []:
        hosts[f"python {_version(py)} ({py})"] = [py, "-c", PY_HOST]
    hosts["c"] = [str(BENCH_BIN), "startup"]
    wrap_cmd = [sys.executable, "-m", "pyvgpu", "wrap", "--"]
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="pyvgpu-startup-") as tmp:
        container = container_env(base, Path(tmp))
        for host, cmd in hosts.items():
            samples: dict[str, list[float]] = {"raw": [], "wrapped": [], "container": [], "wrapped_empty_cache": []}
            for _ in range(runs):
                samples["raw"].append(_time(cmd, base))
                samples["wrapped"].append(_time(wrap_cmd + cmd, base))
                samples["container"].append(_time(cmd, container))
                with tempfile.TemporaryDirectory(prefix="pyvgpu-empty-") as empty:
                    empty_env = {**base, envspec.CACHE_DIR.name: empty}
                    samples["wrapped_empty_cache"].append(_time(wrap_cmd + cmd, empty_env))
            med = {k: median(v) for k, v in samples.items()}
            for k in ("wrapped", "container", "wrapped_empty_cache"):
                med[f"{k}_overhead"] = med[k] - med["raw"]
            out[host] = {**med, "samples": samples}
    return {"bench": "startup", "machine": machine(), "runs": runs, "callbacks": lib["library"],
            "callbacks_tuned": lib["tuned"], "goal_overhead_s": GOAL_S, "hosts": out}


def table(result: dict) -> str:
    lines = [f"pyvgpu bench startup on {result['machine']['gpu']} (median of {result['runs']} runs; seconds from "
             "exec to the first cuInit returning)",
             f"  callbacks: {result['callbacks']}",
             f"  {'host':<34} {'raw':>7} {'wrap':>7} {'+wrap':>7} {'contnr':>7} {'+contnr':>7} {'+empty':>7}"]
    for host, s in result["hosts"].items():
        lines.append(f"  {host[:34]:<34} {s['raw']:>7.3f} {s['wrapped']:>7.3f} {s['wrapped_overhead']:>7.3f} "
                     f"{s['container']:>7.3f} {s['container_overhead']:>7.3f} "
                     f"{s['wrapped_empty_cache_overhead']:>7.3f}")
    lines.append(f"  +wrap: `pyvgpu wrap` and the shim; +contnr: the shim alone, as a device plugin starts a "
                 f"container (goal <= {result['goal_overhead_s']} s); +empty: wrap for a user with an empty cache")
    return "\n".join(lines)
