"""Running programs under `pyvgpu wrap` and reading what they report."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PYVGPU = [sys.executable, "-m", "pyvgpu"]


def run(cmd, env=None, timeout=300, **kw) -> subprocess.CompletedProcess:
    # Run outside the source tree, so `python -m pyvgpu` imports the installed package.
    kw.setdefault("cwd", tempfile.gettempdir())
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def wrapped(cmd, env, stats_dir: Path, *wrap_opts: str, timeout=300, **kw):
    """Run ``cmd`` under `pyvgpu wrap`; return (process, [stats of each process that used CUDA])."""
    stats_dir.mkdir(parents=True, exist_ok=True)
    for f in stats_dir.glob("stats-*.json"):
        f.unlink()
    p = run([*PYVGPU, "wrap", "--stats-file", str(stats_dir / "stats-%p.json"), *wrap_opts, "--", *cmd],
            env=env, timeout=timeout, **kw)
    return p, read_stats(stats_dir)


def read_stats(stats_dir: Path) -> list[dict]:
    out = []
    for f in sorted(glob.glob(str(stats_dir / "stats-*.json"))):
        for line in open(f):
            if line.strip():
                out.append(json.loads(line))
    return out


def calls(stats: dict, symbol: str) -> int:
    return stats["symbols"].get(symbol, {}).get("calls", 0)


def lookups(stats: dict, symbol: str, via: str) -> int:
    return stats["symbols"].get(symbol, {}).get(via, 0)


def pyvgpu_import_root() -> str:
    """The directory the pyvgpu under test was imported from; children import the same one."""
    import pyvgpu

    return str(Path(pyvgpu.__file__).resolve().parents[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without pyvgpu's and the fake's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYVGPU_", "CUDA_DEVICE_", "FAKECUDA_", "FAKENVML_"))
           and k not in ("LD_PRELOAD", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = pyvgpu_import_root()
    env.update(extra)
    return env


def fake_gpu_turn_key(index: int = 0) -> int:
    """The turn file's key of the fake's GPU ``index`` (UUID fa 4e c0 da 00 .. 00 index; pyvgpu/jit/compute/turn.py)."""
    import struct

    m64 = (1 << 64) - 1
    uuid = bytes([0xFA, 0x4E, 0xC0, 0xDA] + [0] * 11 + [index])
    key = 0xCBF29CE484222325
    for v in struct.unpack("<QQ", uuid):
        key = ((key ^ v) * 0x100000001B3) & m64
    return key | 1
