"""`pyvgpu doctor`: is this machine ready to run vGPUs? Each check says how to fix it."""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass

from pyvgpu.contract import hooks
from pyvgpu.host.driver import DRIVER_FIX  # wrap's message names it too
from pyvgpu.native import cache, shim


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # a failed optional check is a warning


def _shim() -> Check:
    path = shim.shim_path()
    if not path.exists():
        return Check("shim built", False, f"{path} is missing", shim.missing_fix())
    try:
        lib = shim.open_shim(path)
        got = lib.pyvgpu_table_hash().decode()
    except OSError as e:
        return Check("shim built", False, f"{path} does not load: {e}", "reinstall pyvgpu")
    if got != hooks.table_hash():
        return Check("shim built", False, f"{path} has hook table {got}, the package {hooks.table_hash()}",
                     "reinstall pyvgpu so the shim and the package come from one build")
    return Check("shim built", True, f"{path} (hook table {got}, {len(hooks.ENTRIES)} symbols)")


def _driver() -> Check:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return Check("CUDA driver found", False, f"libcuda.so.1 does not load: {e}", DRIVER_FIX)
    v = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(v))
    if rc != 0:
        return Check("CUDA driver found", False, f"cuDriverGetVersion returned {rc}", "check the driver install")
    return Check("CUDA driver found", True, f"libcuda.so.1, CUDA {v.value // 1000}.{v.value % 1000 // 10}")


def _nvml() -> Check:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        return Check("NVML found", False, f"libnvidia-ml.so.1 does not load: {e}",
                     "install the NVIDIA driver's NVML; memory limits work without it, compute limits need it",
                     required=False)
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return Check("NVML found", False, f"nvmlInit_v2 returned {rc}", "check the driver install", required=False)
    return Check("NVML found", True, "libnvidia-ml.so.1 initialises")


def _cache() -> Check:
    from pyvgpu.errors import PyvgpuError

    d = cache.cache_dir()
    try:
        m = cache.read(d)
    except PyvgpuError as e:
        return Check("compiled callbacks", False, str(e), "reinstall pyvgpu (pip install compiles them)")
    if m is not None:
        kind = f"tuned for this CPU ({m['cpu']})" if m["tuned"] else f"for any {m['cpu']} CPU"
        return Check("compiled callbacks", True, f"{m['library']}, {kind}")
    problem = cache.writable_problem(d)
    if problem:
        return Check("compiled callbacks", False, f"none fits this pyvgpu's sources, and {problem}",
                     "reinstall pyvgpu (pip install compiles them), or set PYVGPU_CACHE_DIR to a writable "
                     "directory")
    est = cache.estimate_seconds(cache.cli_workers())
    return Check("compiled callbacks", True, f"none fits this pyvgpu's sources: the first wrap compiles them "
                 f"into {d} (about {est:.0f} s, once); `pyvgpu warmup` does it now")


def _cache_dir() -> Check:
    """Where `pyvgpu warmup` (and a wrap whose sources changed) writes: writable and this user's."""
    d = cache.cache_dir()
    fix = "set PYVGPU_CACHE_DIR to a writable directory of your own"
    problem = cache.dir_problem(d)
    if problem is None:
        probe = d if d.exists() else next((p for p in d.parents if p.exists()), d)
        if not os.access(probe, os.W_OK | os.X_OK):
            problem = f"{probe} is not writable by this user"
    if problem:
        return Check("callback cache", False, f"{d}: {problem}, so `pyvgpu warmup` cannot tune the callbacks "
                     "for this CPU (the packaged ones still work)", fix, required=False)
    return Check("callback cache", True, f"{d}, writable (`pyvgpu warmup` tunes the callbacks for this CPU)")


def _runtime() -> Check:
    from pyvgpu.errors import PyvgpuError
    from pyvgpu.group import region

    try:
        d = region.private_runtime_dir()
    except (PyvgpuError, OSError) as e:
        return Check("runtime directory", False, str(e), region.RUNTIME_FIX)
    return Check("runtime directory", True, f"{d}, yours, mode 0700")


def _turns() -> Check:
    """Which turn file groups with a compute share use, whether it is safe, and whether it has room."""
    from pyvgpu.contract import layout
    from pyvgpu.errors import PyvgpuError
    from pyvgpu.group import turnfile as sched

    try:
        p, note = sched.choose(os.environ)
        used = len(sched.entries(p)) if os.path.exists(p) else 0
    except (PyvgpuError, OSError) as e:
        return Check("turn file", False, str(e), "ask root to run `pyvgpu setup`, or set PYVGPU_SM_TURN=0",
                     required=False)
    if note:
        return Check("turn file", False, note, "ask root to run `pyvgpu setup`", required=False)
    if used >= layout.SCHED_ENTRIES:
        return Check("turn file", False, f"{p}: all {used} entries are in use, so a GPU not yet in it time-slices",
                     f"remove {p} when no pyvgpu program runs" + (" and run `pyvgpu setup` again"
                                                                 if p == sched.SHM_PATH else ""), required=False)
    who = "shared with group pyvgpu" if p == sched.SHM_PATH else "your own (`pyvgpu setup` shares one machine-wide)"
    return Check("turn file", True, f"{p}, {who}, {used}/{layout.SCHED_ENTRIES} entries used")


def run_checks() -> list[Check]:
    return [_shim(), _driver(), _nvml(), _cache(), _cache_dir(), _runtime(), _turns()]


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
