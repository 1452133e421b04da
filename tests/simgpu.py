"""Loads on the fake driver's simulated GPU (tests/fakecuda/fake_sim.h), and what the simulation recorded.

A load is pv_bench's spin kernel under `pyvgpu wrap`: ITERS iterations x 100 ns of simulated GPU time per
kernel (2000: 200 us, so 5000 kernels/s unlimited). With ``gap_us`` it sleeps that long after each launch:
a launch-bound load that leaves the GPU idle between kernels, as a small-kernel training step does.

The simulation file records, per process, the GPU time its kernels took (``busy_ns``) and how many it
queued: tests assert on those, and on orderings, rather than on how fast a busy machine ran them.
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
from pathlib import Path

from helpers import PYVGPU

from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.native.shim import BENCH_BIN

UNLIMITED = 5000.0  # kernels/s of the simulated 200 us spin kernel
ITERS = "2000"

# struct sim (fake_sim.h): magic, switch_ns[16], procs[64] {pid, devmask, busy_until[16], busy_ns[16],
# kernels[16]}, dev[16] ...
SIM_DEVS, SIM_PROCS = 16, 64
_PROC = struct.Struct(f"<iI{SIM_DEVS}Q{SIM_DEVS}Q{SIM_DEVS}Q")
_PROCS_OFF = 8 + 8 * SIM_DEVS


def _head(tmp: Path, name: str) -> bytes:
    """The simulation file's fields before its kernel rings (which hold tens of MiB)."""
    with open(tmp / f"{name}.sim", "rb") as f:
        return f.read(_PROCS_OFF + SIM_PROCS * _PROC.size)


class Load:
    """pv_bench sm under `pyvgpu wrap` (or raw, with wrap_opts=None), with its region sampled ten times a
    second."""

    def __init__(self, env, tmp: Path, name: str, wrap_opts: list[str] | None, seconds: float,
                 mode: str = "kernel", region_path: Path | None = None, iters: str = ITERS, gap_us: int = 0,
                 device: int = 0):
        self.region_path = region_path or tmp / f"{name}.region"
        load = [str(BENCH_BIN), "sm", str(seconds), iters, mode, str(gap_us), str(device)]
        if wrap_opts is None:
            cmd = load
            self.region_path = None
        else:
            cmd = [*PYVGPU, "wrap", "--region", str(self.region_path), *wrap_opts, "--", *load]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(tmp))
        # (CLOCK_MONOTONIC s, util %, scale); finish() makes the times relative to the program's own start,
        # so a slow start on a busy machine does not eat into the time the controller is given
        self.series: list[tuple[float, float, float]] = []
        self.points: list[tuple[int, int]] = []
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()

    def _sample(self):
        while self.proc.poll() is None and self.region_path is not None:
            time.sleep(0.1)
            try:
                r = region.open_region(self.region_path, writable=False)
            except PyvgpuError:
                continue
            os.close(r.fd)
            d = r.device(0)
            if d.sm_steps:
                self.series.append((time.monotonic(), d.sm_util / 100, (d.sm_scale or 65536) / 65536))

    def wait(self) -> str:
        out, err = self.proc.communicate(timeout=180)
        self._t.join(timeout=2)
        assert self.proc.returncode == 0, err
        self.points = [(int(t), int(n)) for _, t, n in (line.split() for line in out.splitlines()
                                                        if line.startswith("P "))]
        return err

    def rate(self, after: float) -> float:
        """Kernels per second from ``after`` seconds into the run to its end."""
        if not self.points:
            self.wait()
        pts = self.points
        t0 = pts[0][0]
        start = next(p for p in pts if p[0] - t0 >= after * 1e9)
        end = pts[-1]
        return (end[1] - start[1]) / ((end[0] - start[0]) / 1e9)

    def rate_between(self, start_ns: int, end_ns: int) -> float:
        """Kernels per second between two CLOCK_MONOTONIC times (ns), from the progress marks inside them."""
        if not self.points:
            self.wait()
        pts = [p for p in self.points if start_ns <= p[0] <= end_ns]
        assert len(pts) >= 2, f"too few progress marks between the two times: {self.points}"
        return (pts[-1][1] - pts[0][1]) / ((pts[-1][0] - pts[0][0]) / 1e9)

    def finish(self, after: float) -> float:
        """Achieved share (%) of the 200 us spin kernel's unlimited throughput, from ``after`` s to the end."""
        self.wait()
        t0 = self.points[0][0]
        self.series = [(t - t0 / 1e9, u, sc) for t, u, sc in self.series]
        return 100 * self.rate(after) / UNLIMITED

    @property
    def pid(self) -> int:
        return self.proc.pid


def sim_env(env, tmp: Path, name: str, **extra: str) -> dict:
    """One simulated GPU per name, so one turn file per name: each fake GPU has the same UUID."""
    return dict(env, FAKECUDA_SIM=str(tmp / f"{name}.sim"), PYVGPU_SCHED=str(tmp / f"{name}.turns"),
                FAKECUDA_CTX_BYTES="64M", **extra)


def sim_switch_ns(tmp: Path, name: str) -> int:
    """Time the simulated GPU added for time slicing two processes' work (struct sim.switch_ns[0])."""
    return struct.unpack_from("<Q", _head(tmp, name), 8)[0]


def sim_busy(tmp: Path, name: str, dev: int = 0) -> dict[int, tuple[int, int]]:
    """pid -> (GPU ns its kernels took on device dev, kernels it queued there), as the simulation counted."""
    data = _head(tmp, name)
    out = {}
    for i in range(SIM_PROCS):
        pid, _mask, *rest = _PROC.unpack_from(data, _PROCS_OFF + i * _PROC.size)
        if pid:
            out[pid] = (rest[SIM_DEVS + dev], rest[2 * SIM_DEVS + dev])
    return out


def gpu_share(tmp: Path, name: str, load: Load) -> float:
    """The share of its run's wall time the simulated GPU spent on load's kernels (%)."""
    busy, _ = sim_busy(tmp, name)[load.pid]
    t0, t1 = load.points[0][0], load.points[-1][0]
    return 100 * busy / (t1 - t0)
