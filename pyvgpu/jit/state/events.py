"""The group's event log: a bounded ring in the region (pyvgpu.contract.layout.REGION_EVENT).

A writer takes the next index with one atomic add, fills the entry and
publishes it by storing ``seq = index + 1`` last. A reader (status, top, the
exporter) keeps an entry only if its ``seq`` is the one it expects, so a
half-written or overwritten entry is skipped, never misread. No lock: an
OOM refusal on the allocation path costs one atomic add and a few stores.
Python tools call this same function, a service of the callback library
(``pyvgpu.group.region.Region.log_event``, pyvgpu/native/services.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.jit.runtime.fields import EVENT, HDR, REGION
from pyvgpu.jit.runtime.intrinsics import getpid, realtime_ns


@njit
def record(region, kind, dev, pid, a, b):
    """Append one event to the region's ring (pid 0: this process)."""
    if region == 0:
        return
    i = HDR.add_ev_next(region, 1)
    e = REGION.event(region, i)
    EVENT.store_seq(e, 0)  # readers skip it until it is whole
    EVENT.set_time_ns(e, np.uint64(realtime_ns()))
    EVENT.set_kind(e, np.uint32(kind))
    EVENT.set_device(e, np.int32(dev))
    EVENT.set_pid(e, np.uint32(getpid() if pid == 0 else pid))
    EVENT.set_a(e, np.uint64(a))
    EVENT.set_b(e, np.uint64(b))
    EVENT.store_seq(e, i + 1)
