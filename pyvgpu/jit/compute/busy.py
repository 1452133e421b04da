"""NVML's busy time over the controller's period: the mean of the utilization samples NVML took in it.

``nvmlDeviceGetUtilizationRates`` answers one sample window, and on an H100 (driver 580) its reading did not
follow the load: a gang at 50% read 8 and 98% in turn, and a load busy half of every 200 ms read 84, then
12 down to 0 (docs/compute.md, "Reading NVML"). The controller took each reading as the period's busy
time, so every low one cut the scale in half and the group ran at 70% of the GPU under a 50% share.
``nvmlDeviceGetSamples`` keeps NVML's samples (one every 200 ms there, each the busy part of the 200 ms
before it, time-stamped in CLOCK_REALTIME microseconds): their mean over the period is the busy time the
charges are compared with. A driver without samples keeps the one reading.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.jit.runtime.context import HELPER
from pyvgpu.jit.runtime.fields import NVML_SAMPLE, NVML_UTILIZATION
from pyvgpu.jit.runtime.intrinsics import load_u32, realtime_ns, stack_buffer, stack_u64, store_u32

MAX_SAMPLES = 32  # the buffer (16-byte samples on the watcher's stack); a period holds 2 or 3 of them, and
# the controller's window (controller.HOLD_WINDOW_NS, at most LOOKBACK_MAX_NS) up to 20 at 200 ms
LOOKBACK_MAX_NS = 4_000_000_000  # a late step reads the last 4 s, not the oldest samples of a longer gap
NO_READING = -1.0


@njit
def sample_value(raw, kind):
    """A sample's value (an nvmlValue_t read as 64 bits) as a float, NO_READING for a kind not read here."""
    if kind == abi.NVML_VALUE_TYPE_UNSIGNED_INT:
        return np.float64(raw & np.uint64(0xFFFFFFFF))
    if kind == abi.NVML_VALUE_TYPE_SIGNED_INT:
        return np.float64(np.int32(raw & np.uint64(0xFFFFFFFF)))
    if kind == abi.NVML_VALUE_TYPE_UNSIGNED_LONG or kind == abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return np.float64(raw)
    if kind == abi.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return np.float64(np.int64(raw))
    return NO_READING


@njit
def samples_mean(buf, n, kind):
    """The mean of n utilization samples at buf, each clamped to 0..100; NO_READING for none or a kind not
    read here."""
    if n == 0:
        return NO_READING
    total = 0.0
    for i in range(n):
        v = sample_value(NVML_SAMPLE.get_sampleValue(buf + np.uint64(i) * np.uint64(NVML_SAMPLE.SIZE)), kind)
        if v == NO_READING:
            return NO_READING
        total += min(100.0, max(0.0, v))
    return total / n


@njit
def period_busy(ctx, handle, period):
    """Percent of the last ``period`` ns the device was busy by NVML: its samples' mean, else (a driver
    without samples, or none taken in the period) its one reading; NO_READING if NVML answers neither."""
    now_us = np.uint64(realtime_ns()) // np.uint64(1000)
    back_us = np.uint64(min(np.uint64(period), np.uint64(LOOKBACK_MAX_NS))) // np.uint64(1000)
    kind = stack_u64()
    count = stack_u64()
    store_u32(count, MAX_SAMPLES)
    buf = stack_buffer(512)  # MAX_SAMPLES nvmlSample_t
    rc = HELPER.nvmlDeviceGetSamples(ctx, handle, np.int32(abi.NVML_GPU_UTILIZATION_SAMPLES),
                                     now_us - back_us, kind, count, buf)
    if rc == abi.NVML_SUCCESS:
        n = min(load_u32(count), np.uint32(MAX_SAMPLES))
        mean = samples_mean(buf, n, np.int32(load_u32(kind)))
        if mean != NO_READING:
            return mean
    util = stack_buffer(8)  # nvmlUtilization_t
    if HELPER.nvmlDeviceGetUtilizationRates(ctx, handle, util) != abi.NVML_SUCCESS:
        return NO_READING
    return np.float64(NVML_UTILIZATION.get_gpu(util))
