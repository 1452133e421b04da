"""The group's event log: a bounded ring in the region (pyvgpu.layout.REGION_EVENT).

A writer takes the next index with one atomic add, fills the entry and
publishes it by storing ``seq = index + 1`` last. A reader (status, top, the
exporter) keeps an entry only if its ``seq`` is the one it expects, so a
half-written or overwritten entry is skipped, never misread. No lock: an
OOM refusal on the allocation path costs one atomic add and a few stores.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu import layout as L
from pyvgpu.jit.intrinsics import atomic_add_u64, atomic_store_u64, getpid, realtime_ns, store_u32, store_u64

EV_NEXT = L.REGION_HEADER.offset("ev_next")
EV_SEQ = L.REGION_EVENT.offset("seq")
EV_TIME = L.REGION_EVENT.offset("time_ns")
EV_KIND = L.REGION_EVENT.offset("kind")
EV_DEVICE = L.REGION_EVENT.offset("device")
EV_PID = L.REGION_EVENT.offset("pid")
EV_A = L.REGION_EVENT.offset("a")
EV_B = L.REGION_EVENT.offset("b")
EVENTS_OFF, EVENT_SIZE, N_EVENTS = L.REGION_EVENTS_OFF, L.REGION_EVENT.size, L.N_EVENTS


@njit
def record(region, kind, dev, pid, a, b):
    """Append one event to the region's ring (pid 0: this process)."""
    if region == 0:
        return
    i = atomic_add_u64(region + EV_NEXT, 1)
    e = region + EVENTS_OFF + (i % N_EVENTS) * EVENT_SIZE
    atomic_store_u64(e + EV_SEQ, 0)  # readers skip it until it is whole
    store_u64(e + EV_TIME, np.uint64(realtime_ns()))
    store_u32(e + EV_KIND, np.uint32(kind))
    store_u32(e + EV_DEVICE, np.uint32(np.int32(dev)))
    store_u32(e + EV_PID, np.uint32(getpid() if pid == 0 else pid))
    store_u64(e + EV_A, np.uint64(a))
    store_u64(e + EV_B, np.uint64(b))
    atomic_store_u64(e + EV_SEQ, i + 1)
