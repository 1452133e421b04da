"""What the machine's GPUs are, asked of NVML (used to check limits before a program starts)."""

from __future__ import annotations

import ctypes


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def physical_memory() -> list[int] | None:
    """Total bytes of each device in NVML order, or None when NVML is not there."""
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nv.nvmlInit_v2() != 0:
        return None
    try:
        n = ctypes.c_uint(0)
        if nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return None
        out = []
        for i in range(n.value):
            h = ctypes.c_void_p()
            m = _Memory()
            if nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                return None
            if nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) != 0:
                return None
            out.append(m.total)
        return out
    finally:
        nv.nvmlShutdown()
