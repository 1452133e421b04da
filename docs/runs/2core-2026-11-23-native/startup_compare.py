"""Start-up per host kind, main (5ecb7ee) against branch native, on the fake driver: seconds from exec to the
first cuInit returning, median of N runs, the modes interleaved. The record of what was run for
docs/measurements.md ("Native loading"); its paths are those of the 2-core box that day (main installed into
/tmp/nv-main-venv, the fake driver built into /tmp/nv-fake, main's cache warmed by first_wrap_main.sh)."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N = int(sys.argv[1]) if len(sys.argv) > 1 else 7
FAKE = "/tmp/nv-fake"
MAIN_PY = "/tmp/nv-main-venv/bin/python"
NEW_PY = "/work/venv-cluster/bin/python"
PY_HOST = ("import ctypes, time\nlib = ctypes.CDLL('libcuda.so.1')\nrc = lib.cuInit(0)\nassert rc == 0, rc\n"
           "print('{\"t_ns\": %d}' % int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e9))\n")
base = {k: v for k, v in os.environ.items()
        if not k.startswith(("PYVGPU_", "CUDA_DEVICE_")) and k not in ("LD_PRELOAD", "PYTHONPATH")}
base["LD_LIBRARY_PATH"] = FAKE


def t(cmd, env):
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd="/tmp")
    if p.returncode != 0:
        raise SystemExit(f"{cmd}: {p.returncode} {p.stderr[-1500:]}")
    return (json.loads(p.stdout.strip().splitlines()[-1])["t_ns"] - t0) / 1e9


def site(py):
    code = "import pyvgpu, os; print(os.path.dirname(pyvgpu.__file__))"
    return subprocess.run([py, "-c", code], capture_output=True, text=True, cwd="/tmp").stdout.strip()


def main():
    tmp = Path(tempfile.mkdtemp(prefix="nv-startup-"))
    main_pkg, new_pkg = site(MAIN_PY), site(NEW_PY)
    main_bench, new_bench = f"{main_pkg}/bin/pv_bench", f"{new_pkg}/bin/pv_bench"
    # a region made first, as a device plugin does: 1 GiB and 30% on device 0
    sys.path.insert(0, str(Path(new_pkg).parent))
    from pyvgpu import region

    reg = tmp / "vgpu.region"
    region.create(reg, "bench", [1 << 30] + [0] * 15, sm=[30] * 16)
    cont = dict(base, CUDA_DEVICE_MEMORY_LIMIT_0="1024m", CUDA_DEVICE_SM_LIMIT="30",
                CUDA_DEVICE_MEMORY_SHARED_CACHE=str(reg), PYVGPU_SCHED=str(tmp / "turns"))
    main_cache = "/tmp/nv-main-cold-1"  # warm: the first-wrap measurement filled it
    main_cont = dict(cont, LD_PRELOAD=f"{main_pkg}/libpyvgpu.so", PYVGPU_CACHE_DIR=main_cache,
                     PYVGPU_SYSPATH=f"{Path(main_pkg).parent}:/work/venv-cluster/lib/python3.11/site-packages")
    new_cont = dict(cont, LD_PRELOAD=f"{new_pkg}/libpyvgpu.so", HOME=str(tmp / "home"))
    hosts = {"python 3.11 (its venv has pyvgpu)": ([MAIN_PY, "-c", PY_HOST], [NEW_PY, "-c", PY_HOST]),
             "c (pv_bench)": ([main_bench, "startup"], [new_bench, "startup"])}
    res = {}
    for host, (mcmd, ncmd) in hosts.items():
        s = {k: [] for k in ("raw", "main wrap", "main container", "native wrap", "native container")}
        for _ in range(N):
            s["raw"].append(t(ncmd, base))
            s["main wrap"].append(t([MAIN_PY, "-m", "pyvgpu", "wrap", "--", *mcmd],
                                    dict(base, PYVGPU_CACHE_DIR=main_cache)))
            s["main container"].append(t(mcmd, main_cont))
            s["native wrap"].append(t([NEW_PY, "-m", "pyvgpu", "wrap", "--", *ncmd], base))
            s["native container"].append(t(ncmd, new_cont))
        res[host] = {k: statistics.median(v) for k, v in s.items()}
    print("load", open("/proc/loadavg").read().strip())
    print(json.dumps(res, indent=1))
    for host, r in res.items():
        print(f"{host:36} raw {r['raw']:.3f}  " + "  ".join(f"{k} +{r[k] - r['raw']:.3f}" for k in r if k != "raw"))


if __name__ == "__main__":
    main()
