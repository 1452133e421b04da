"""The group's quota in the shared region: reserve, release, slots, reclaim.

Hot path (charge/uncharge) is lock-free: a CAS loop keeps the device's
``used`` counter at or under its ``limit``; the process's own slot
counters are plain atomic adds. No lock, no scan over slots.

Order makes death safe: charge adds to the device counter first and to
the slot second, uncharge subtracts from the slot first. A process killed
between the two steps leaves the device counter too high by that one
request, never too low, so the cap can never be exceeded (docs/accounting.md).

A slot is owned by whoever holds an open-file-description lock on its
first byte in the region file. The kernel drops that lock when the owner
dies (also across PID namespaces). Reclaiming a dead slot means taking
its lock, subtracting its counters from the devices, and freeing it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import layout as L
from pyvgpu.jit.runtime.fields import CTX, DEV, REGION, SLOT
from pyvgpu.jit.runtime.intrinsics import F_OFD_SETLK, F_UNLCK, F_WRLCK, getpid, monotonic_ns, ofd_lock, realtime_ns
from pyvgpu.jit.state import events

RECLAIM_PERIOD_NS = 500_000_000
N_USED = L.MAX_DEVICES * L.N_KINDS

_U0 = np.uint64(0)


@njit(inline="always")
def used_index(dev, kind):
    """Index of (device, kind) in a slot's ``used`` array."""
    return dev * L.N_KINDS + kind


@njit
def try_charge(ctx, dev, kind, n):
    """Reserve n bytes on dev for this process; False if the group's limit would be passed."""
    region = CTX.get_region(ctx)
    if region == 0:
        return True
    d = REGION.device(region, dev)
    n = np.uint64(n)
    lim = DEV.load_limit(d)
    if lim == 0:
        new = DEV.add_used(d, n) + n
    else:
        while True:
            cur = DEV.load_used(d)
            if cur > lim or n > lim - cur:
                return False
            if DEV.cas_used(d, cur, cur + n) == cur:
                new = cur + n
                break
    DEV.max_peak(d, new)
    SLOT.add_used(CTX.get_slot(ctx), used_index(dev, kind), n)
    return True


@njit
def force_charge(ctx, dev, kind, n):
    """Record bytes the driver already handed out (pool growth found afterwards)."""
    region = CTX.get_region(ctx)
    if region == 0:
        return
    d = REGION.device(region, dev)
    n = np.uint64(n)
    DEV.max_peak(d, DEV.add_used(d, n) + n)
    SLOT.add_used(CTX.get_slot(ctx), used_index(dev, kind), n)


@njit
def uncharge(ctx, dev, kind, n):
    region = CTX.get_region(ctx)
    if region == 0:
        return
    n = np.uint64(n)
    SLOT.sub_used(CTX.get_slot(ctx), used_index(dev, kind), n)
    DEV.sub_used(REGION.device(region, dev), n)


@njit
def count_oom(ctx, dev, n):
    """A refusal for the cap: counted for the device and the process, and logged with its size."""
    region = CTX.get_region(ctx)
    if region != 0:
        d = REGION.device(region, dev)
        DEV.add_oom_refusals(d, 1)
        SLOT.add_oom_refusals(CTX.get_slot(ctx), 1)
        events.record(region, L.EV_OOM, dev, 0, n, DEV.load_used(d))


@njit
def charge_or_refuse(ctx, dev, kind, n):
    """Charge n bytes; on refusal reclaim dead processes' quota once and retry; count and log a refusal."""
    if try_charge(ctx, dev, kind, n):
        return True
    if reclaim_dead(ctx) != 0 and try_charge(ctx, dev, kind, n):
        return True
    count_oom(ctx, dev, n)
    return False


@njit
def _release_slot_counters(region, s):
    """Give a dead slot's bytes back to the devices, logging each device's; the caller holds the slot's lock."""
    total = _U0
    pid = SLOT.load_pid(s)
    for dev in range(L.MAX_DEVICES):
        freed = _U0
        for k in range(L.N_KINDS):
            n = SLOT.load_used(s, used_index(dev, k))
            if n != 0:
                d = REGION.device(region, dev)
                DEV.sub_used(d, n)
                DEV.add_reclaimed(d, n)
                SLOT.store_used(s, used_index(dev, k), 0)
                freed += n
        if freed != 0:
            events.record(region, L.EV_RECLAIM, dev, pid, freed, 0)
            total += freed
    return total


@njit
def reclaim_dead(ctx):
    """Free the slots of dead processes; returns the bytes given back."""
    region = CTX.get_region(ctx)
    if region == 0:
        return _U0
    fd = CTX.get_region_fd(ctx)
    own = CTX.get_slot_index(ctx)
    n_slots = CTX.load_n_slots(ctx)
    total = _U0
    for i in range(n_slots):
        if i == own:
            continue
        s = REGION.slot(region, i)
        if SLOT.load_state(s) != L.SLOT_LIVE:
            continue
        off = REGION.SLOTS_OFF + i * REGION.SLOT_SIZE
        if ofd_lock(fd, F_OFD_SETLK, F_WRLCK, off, 1) != 0:
            continue  # its owner holds the lock: alive
        if SLOT.load_state(s) == L.SLOT_LIVE:
            total += _release_slot_counters(region, s)
            SLOT.store_state(s, L.SLOT_FREE)
        ofd_lock(fd, F_OFD_SETLK, F_UNLCK, off, 1)
    return total


@njit
def reclaim_due(ctx):
    """The watcher's reclaim, at most every RECLAIM_PERIOD_NS (it ticks faster for the compute controller)."""
    now = monotonic_ns()
    if now - np.int64(CTX.get_sm_tick_ns(ctx)) < RECLAIM_PERIOD_NS:
        return _U0
    CTX.set_sm_tick_ns(ctx, now)
    return reclaim_dead(ctx)


@njit
def claim_slot(ctx):
    """Take a free slot (or a dead process's) for this process; its index, or -1 if all are in use."""
    region = CTX.get_region(ctx)
    fd = CTX.get_region_fd(ctx)
    n_slots = CTX.load_n_slots(ctx)
    for i in range(n_slots):
        off = REGION.SLOTS_OFF + i * REGION.SLOT_SIZE
        if ofd_lock(fd, F_OFD_SETLK, F_WRLCK, off, 1) != 0:
            continue
        s = REGION.slot(region, i)
        if SLOT.load_state(s) != L.SLOT_FREE:
            _release_slot_counters(region, s)  # we hold its lock: the previous owner is dead
        for j in range(N_USED):
            SLOT.store_used(s, j, 0)
        SLOT.store_oom_refusals(s, 0)
        for j in range(L.MAX_DEVICES):
            SLOT.store_sm_launches(s, j, 0)
            SLOT.store_sm_cost_ns(s, j, 0)
        SLOT.store_launches(s, 0)
        SLOT.set_start_ns(s, realtime_ns())
        SLOT.store_pid(s, getpid())
        SLOT.store_sm_policy(s, CTX.get_sm_policy(ctx))
        SLOT.store_state(s, L.SLOT_LIVE)
        CTX.set_slot(ctx, s)
        CTX.store_slot_index(ctx, i)
        return np.int32(i)
    return np.int32(-1)
