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


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def utilization_problem(devices: list[int]) -> str | None:
    """Why NVML cannot measure the utilization of these devices (the compute controller's input), or None.

    Devices past the machine's count are ignored here when the list names every
    slot (a limit for all devices); a named device the machine lacks is a problem.
    """
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "NVML (libnvidia-ml.so.1) cannot be loaded"
    rc = nv.nvmlInit_v2()
    if rc != 0:
        return f"NVML does not initialise (nvmlReturn_t {rc})"
    try:
        n = ctypes.c_uint(0)
        if nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return "NVML cannot count the devices"
        every = len(devices) >= 16
        for d in devices:
            if d >= n.value:
                if every:
                    continue
                return f"there is no device {d} (this machine has {n.value})"
            h = ctypes.c_void_p()
            u = _Utilization()
            if nv.nvmlDeviceGetHandleByIndex_v2(d, ctypes.byref(h)) != 0:
                return f"NVML cannot open device {d}"
            rc = nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u))
            if rc != 0:
                return f"NVML does not report device {d}'s utilization (nvmlReturn_t {rc})"
        return None
    finally:
        nv.nvmlShutdown()
