"""Whether the CUDA driver loads on this machine, and what to do when it does not.

Light on purpose: `pyvgpu wrap` asks it before every exec (pyvgpu/ops/wrap.py), `pyvgpu doctor` names the
same fix."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pyvgpu.contract import envspec

DRIVER_FIX = "install the NVIDIA driver, or put its directory on LD_LIBRARY_PATH"


def driver_problem(env: Mapping[str, str]) -> str | None:
    """Why the CUDA driver does not load here, or None. Only loaded, never initialised (that is the program's)."""
    import ctypes

    name = env.get(envspec.REAL_LIBCUDA.name) or "libcuda.so.1"
    try:
        ctypes.CDLL(name, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as e:
        return f"{name} does not load: {e}"
    return None
