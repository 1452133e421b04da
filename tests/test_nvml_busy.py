"""The controller's reading of NVML (pyvgpu/jit/compute/busy.py): the mean of NVML's utilization samples over
its period, not one reading of nvmlDeviceGetUtilizationRates, whose window is short against a share's bursts.

On an H100 (driver 580) a gang at 50% read 8 and 98% in turn, and each low reading halved the charge scale: the
gang ran at 70% of the GPU (docs/compute.md, "Reading NVML"). The fake NVML's FAKENVML_UTIL_WINDOW_MS gives
the one reading such a short window; its nvmlDeviceGetSamples keeps a sample every 200 ms, as the real one.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys

import numpy as np
import pytest
from numba import cfunc, types
from simgpu import UNLIMITED, Load, sim_env

from pyvgpu.contract import abi
from pyvgpu.jit.compute import busy


@cfunc(types.float64(types.uint64, types.uint32, types.int32), nopython=True, error_model="numpy")
def _mean(buf, n, kind):
    return busy.samples_mean(buf, n, kind)


MEAN = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int32)(_mean.address)


def samples(values: list[int]) -> ctypes.Array:
    buf = (ctypes.c_uint64 * (2 * len(values)))()
    for i, v in enumerate(values):
        buf[2 * i], buf[2 * i + 1] = 1_700_000_000_000_000 + 200_000 * i, v
    return buf


def test_the_mean_of_the_samples_is_the_busy_time():
    buf = samples([0, 100, 50])
    assert MEAN(ctypes.addressof(buf), 3, abi.NVML_VALUE_TYPE_UNSIGNED_INT) == 50.0
    assert MEAN(ctypes.addressof(buf), 1, abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG) == 0.0


def test_a_sample_is_read_by_its_kind_and_clamped():
    buf = samples([(7 << 32) | 40, 250])  # high bits beyond an unsigned int's 32; a value above 100
    assert MEAN(ctypes.addressof(buf), 2, abi.NVML_VALUE_TYPE_UNSIGNED_INT) == 70.0
    neg = samples([np.uint64(np.int64(-5)).item()])
    assert MEAN(ctypes.addressof(neg), 1, abi.NVML_VALUE_TYPE_SIGNED_LONG_LONG) == 0.0


def test_no_samples_or_a_kind_not_read_is_no_reading():
    buf = samples([50])
    assert MEAN(ctypes.addressof(buf), 0, abi.NVML_VALUE_TYPE_UNSIGNED_INT) == busy.NO_READING
    assert MEAN(ctypes.addressof(buf), 1, 0) == busy.NO_READING  # NVML_VALUE_TYPE_DOUBLE


def gang_readings(env, tmp_path, **extra: str) -> tuple[list[float], list[float]]:
    e = sim_env(env, tmp_path, "g", FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G", **extra)
    region = tmp_path / "g.region"
    a = Load(e, tmp_path, "g-0", ["--sm", "50"], 7, region_path=region, device=0)
    b = Load(e, tmp_path, "g-1", ["--sm", "50"], 7, region_path=region, device=1)
    for x in (a, b):
        x.wait()
    t0 = min(x.points[0][0] for x in (a, b))
    start, end = t0 + 2_500_000_000, min(x.points[-1][0] for x in (a, b))
    shares = [100 * x.rate_between(start, end) / UNLIMITED for x in (a, b)]
    # the controller's readings in the steady part (series times are CLOCK_MONOTONIC s, as the points' ns)
    readings = [u for ts, u, _ in a.series if start / 1e9 <= ts <= end / 1e9]
    return readings, shares


def test_a_gang_reads_its_busy_time_not_one_short_window(env, tmp_path):
    """A gang's bursts are long against a 20 ms window: one reading is 0 or 100 by when it is taken (before,
    a third of the steady readings were near 0 while the gang ran at its 50). The samples' mean over the
    controller's period never reads such a gang idle. (On a busy machine a descheduled rank leaves its peer's
    collective waiting on the GPU, counted busy: readings near 100 are then true, so only idle ones are
    judged.)"""
    readings, shares = gang_readings(env, tmp_path, FAKENVML_UTIL_WINDOW_MS="20")
    assert readings, "the controller took no steps"
    idle = [u for u in readings if u < 10]
    assert len(idle) <= 0.1 * len(readings), readings
    assert min(shares) >= 40, shares


def test_without_samples_the_one_reading_still_steers(env, tmp_path):
    """A driver without nvmlDeviceGetSamples: the controller falls back to nvmlDeviceGetUtilizationRates."""
    load = Load(sim_env(env, tmp_path, "ns", FAKENVML_NO_SAMPLES="1", FAKECUDA_EVENT_SCALE="1.4"), tmp_path, "ns",
                ["--sm", "50"], seconds=7)
    achieved = load.finish(after=4)
    late = [u for ts, u, _ in load.series if ts >= 4]
    assert late, "the controller took no steps: no reading without samples"
    assert abs(achieved - 50) <= 3, achieved
    assert abs(statistics.median(late) - 50) <= 3, late


@pytest.mark.parametrize("no_samples", ["", "1"])
def test_the_bench_reads_the_same_samples(env, tmp_path, no_samples):
    """`pyvgpu bench sm`'s NVML column (pyvgpu/bench/gpu_util.py) reads NVML's samples as the controller does
    (one every 200 ms), and polls nvmlDeviceGetUtilizationRates where the driver keeps none."""
    e = sim_env(env, tmp_path, "u", FAKENVML_NO_SAMPLES=no_samples)
    load = Load(e, tmp_path, "u", None, 4)
    code = ("import time\nfrom pyvgpu.bench.gpu_util import UtilSampler\ntime.sleep(0.5)\ns = UtilSampler(period=0.1)\n"
            "time.sleep(2.5)\ns.stop()\nnow = time.monotonic()\nprint(s.mean(now - 2.0, now), len(s.samples))")
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)
    load.wait()
    assert out.returncode == 0, out.stderr
    mean, n = out.stdout.split()
    assert float(mean) >= 90, out.stdout  # the unlimited spin keeps the simulated GPU busy
    assert (int(n) >= 18) if no_samples else (8 <= int(n) <= 14), out.stdout  # 0.1 s polls, or 0.2 s samples
