"""NVML's device utilization, sampled while a bench run goes (the time share NVML sees).

NVML keeps a sample every 200 ms or so (driver 580), each the percent of the time before it during which the
device ran a kernel, for the device as a whole: with one group on it, that group's time share; with several,
their sum. They are read with nvmlDeviceGetSamples, as the controller reads them
(pyvgpu/jit/compute/busy.py): one nvmlDeviceGetUtilizationRates reading answers a window short against a
share's bursts (docs/compute.md, "Reading NVML"), and is only the fallback for a driver without samples.
The device is the loads' device 0: the first of CUDA_VISIBLE_DEVICES, where it is set (a run on GPU 1 read
GPU 0's samples before).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Mapping

from pyvgpu.contract import envspec


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Sample(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_ulonglong), ("value", ctypes.c_ulonglong)]


_GPU_UTILIZATION_SAMPLES, _UNSIGNED_INT, _NOT_FOUND = 1, 1, 6  # nvmlSamplingType_t, nvmlValueType_t, nvmlReturn_t


def first_visible(env: Mapping[str, str] = os.environ) -> int:
    """NVML's index of the GPU a load sees as CUDA device 0: the first entry of CUDA_VISIBLE_DEVICES (an index,
    taken as NVML's as `wrap --devices` takes it, or a UUID), 0 where it is unset. A MIG instance: its GPU."""
    first = env.get(envspec.CUDA_VISIBLE_DEVICES.name, "").split(",")[0].strip()
    if not first:
        return 0
    from pyvgpu.host import devices

    return devices.select(first, env)[0].index


class UtilSampler:
    """Samples NVML device ``index``'s utilization (default: ``first_visible()``) every ``period`` s on a
    thread; empty where NVML fails."""

    def __init__(self, index: int | None = None, period: float = 0.1) -> None:
        self.samples: list[tuple[float, float]] = []  # (CLOCK_MONOTONIC s, percent)
        self._stop = threading.Event()
        self._index, self._period = first_visible() if index is None else index, period
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            nv = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return
        if nv.nvmlInit_v2() != 0:
            return
        try:
            h = ctypes.c_void_p()
            if nv.nvmlDeviceGetHandleByIndex_v2(self._index, ctypes.byref(h)) != 0:
                return
            if not self._samples(nv, h):
                u = _Utilization()
                while not self._stop.wait(self._period):
                    if nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)) == 0:
                        self.samples.append((time.monotonic(), float(u.gpu)))
        finally:
            nv.nvmlShutdown()

    def _samples(self, nv: ctypes.CDLL, h: ctypes.c_void_p) -> bool:
        """Read NVML's samples until stopped (each at its own time); False if the driver keeps none."""
        last = int(time.time() * 1e6)
        buf = (_Sample * 64)()
        kind, n = ctypes.c_int(), ctypes.c_uint()
        try:
            get = nv.nvmlDeviceGetSamples
        except AttributeError:
            return False
        while not self._stop.wait(self._period):
            n.value = len(buf)
            rc = get(h, _GPU_UTILIZATION_SAMPLES, ctypes.c_ulonglong(last), ctypes.byref(kind), ctypes.byref(n), buf)
            if rc == _NOT_FOUND:
                continue  # none newer yet
            if rc != 0 or kind.value != _UNSIGNED_INT:
                return bool(self.samples)  # a driver without samples falls back; a later error stops
            offset = time.time() - time.monotonic()
            for i in range(n.value):
                self.samples.append((buf[i].ts / 1e6 - offset, float(min(100, buf[i].value & 0xFFFFFFFF))))
                last = max(last, buf[i].ts)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def mean(self, start: float, end: float) -> float | None:
        """The mean utilization (%) of the samples between two CLOCK_MONOTONIC times, None without any."""
        xs = [u for t, u in self.samples if start <= t <= end]
        return sum(xs) / len(xs) if xs else None
