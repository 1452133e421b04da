"""`pyvgpu wrap`: prepare the environment of a vGPU and exec the program.

The program replaces this process (os.execvpe), so it keeps the pid, and
its exit code and signals reach the caller unchanged.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence

from pyvgpu import cache, pyinfo
from pyvgpu.errors import PyvgpuError
from pyvgpu.shim import BOOT_DIR, shim_path

ON_ERROR_CHOICES = ("closed", "open")


def _prepend(item: str, current: str | None, sep: str) -> str:
    parts = [p for p in (current or "").split(sep) if p and p != item]
    return sep.join([item, *parts])


def build_env(base: Mapping[str, str], *, stats: str | None = None, on_error: str | None = None) -> dict[str, str]:
    """The wrapped program's environment: ``base`` plus the shim and the bootstrap."""
    shim = shim_path()
    if not shim.exists():
        raise PyvgpuError(f"the shim {shim} is missing; reinstall pyvgpu (pip install builds it with gcc)")
    if on_error is not None and on_error not in ON_ERROR_CHOICES:
        raise PyvgpuError(f"--on-error {on_error!r} is not one of {', '.join(ON_ERROR_CHOICES)}")
    env = dict(base)
    # LD_PRELOAD may be separated by spaces or colons; keep the user's entries after ours.
    user_preload = " ".join(env.get("LD_PRELOAD", "").replace(":", " ").split())
    env["LD_PRELOAD"] = _prepend(str(shim), user_preload, " ")
    env["PYTHONPATH"] = _prepend(str(BOOT_DIR), env.get("PYTHONPATH"), os.pathsep)
    # What the shim needs to embed this interpreter into a non-Python program
    # (a user's own setting wins: it is how to point at another libpython).
    env["PYVGPU_PYTHON"] = sys.executable
    env.setdefault("PYVGPU_LIBPYTHON", pyinfo.libpython())
    env.setdefault("PYVGPU_PYTHON_HOME", pyinfo.python_home())
    env["PYVGPU_SYSPATH"] = os.pathsep.join(pyinfo.import_path())
    env["PYVGPU_CACHE_DIR"] = str(cache.cache_dir())
    if stats:
        env["PYVGPU_STATS"] = stats
    if on_error:
        env["PYVGPU_ON_ERROR"] = on_error
    return env


def exec_wrapped(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Compile the callbacks if needed, then replace this process with ``command``."""
    if not command:
        raise PyvgpuError("no program given: use `pyvgpu wrap [OPTIONS] -- PROGRAM [ARGS...]`")
    if shutil.which(command[0], path=env.get("PATH")) is None and not os.path.exists(command[0]):
        raise PyvgpuError(f"program not found: {command[0]!r} (not a file, and not on PATH)")
    cache.ensure()  # cold compile happens here, once, not in every wrapped process
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], list(command), dict(env))
