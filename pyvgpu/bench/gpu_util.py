"""NVML's device utilization, sampled while a bench run goes (the time share NVML sees).

NVML reports the percent of its last sample period during which the device ran a kernel, for the device
as a whole: with one group on it, that group's time share; with several, their sum.
"""

from __future__ import annotations

import ctypes
import threading
import time


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class UtilSampler:
    """Samples device ``index``'s utilization every ``period`` s on a thread; empty where NVML fails."""

    def __init__(self, index: int = 0, period: float = 0.1) -> None:
        self.samples: list[tuple[float, float]] = []  # (CLOCK_MONOTONIC s, percent)
        self._stop = threading.Event()
        self._index, self._period = index, period
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
            u = _Utilization()
            while not self._stop.wait(self._period):
                if nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)) == 0:
                    self.samples.append((time.monotonic(), float(u.gpu)))
        finally:
            nv.nvmlShutdown()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def mean(self, start: float, end: float) -> float | None:
        """The mean utilization (%) of the samples between two CLOCK_MONOTONIC times, None without any."""
        xs = [u for t, u in self.samples if start <= t <= end]
        return sum(xs) / len(xs) if xs else None
