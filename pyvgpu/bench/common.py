"""Helpers shared by the benchmarks."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess

from pyvgpu.contract import envspec
from pyvgpu.native import shim


def raw_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without pyvgpu, for the raw side of a comparison."""
    env = dict(os.environ if base is None else base)
    path = str(shim.shim_path())
    pre = [p for p in env.get(envspec.LD_PRELOAD.name, "").replace(":", " ").split() if p != path]
    if pre:
        env[envspec.LD_PRELOAD.name] = " ".join(pre)
    else:
        env.pop(envspec.LD_PRELOAD.name, None)
    for k in list(env):
        kept = (envspec.CACHE_DIR.name, envspec.SM_BATCH_MS.name, envspec.SM_TURN.name, envspec.SCHED.name)
        if k.startswith(envspec.NAMESPACE) and k not in kept:
            del env[k]
    return env


def machine() -> dict[str, str]:
    gpu = ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        gpu = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "gpu": gpu or "no nvidia-smi (fake or absent driver)"}


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")
