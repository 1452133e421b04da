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

from pyvgpu import layout as L
from pyvgpu.jit import events
from pyvgpu.jit.intrinsics import (
    F_OFD_SETLK,
    F_UNLCK,
    F_WRLCK,
    atomic_add_u64,
    atomic_cas_u64,
    atomic_load_u32,
    atomic_load_u64,
    atomic_max_u64,
    atomic_store_u32,
    atomic_store_u64,
    atomic_sub_u64,
    getpid,
    load_i32,
    load_u32,
    load_u64,
    monotonic_ns,
    ofd_lock,
    realtime_ns,
    store_u64,
)

OFF_REGION = L.CTX.offset("region")
OFF_SLOT = L.CTX.offset("slot")
OFF_SLOT_INDEX = L.CTX.offset("slot_index")
OFF_FD = L.CTX.offset("region_fd")
OFF_NSLOTS = L.CTX.offset("n_slots")

DEV_LIMIT = L.REGION_DEVICE.offset("limit")
DEV_USED = L.REGION_DEVICE.offset("used")
DEV_PEAK = L.REGION_DEVICE.offset("peak")
DEV_OOM = L.REGION_DEVICE.offset("oom_refusals")
DEV_RECLAIMED = L.REGION_DEVICE.offset("reclaimed")
SLOT_STATE = L.REGION_SLOT.offset("state")
SLOT_PID = L.REGION_SLOT.offset("pid")
SLOT_START = L.REGION_SLOT.offset("start_ns")
SLOT_USED = L.REGION_SLOT.offset("used")
SLOT_OOM = L.REGION_SLOT.offset("oom_refusals")
SLOT_SM_LAUNCHES = L.REGION_SLOT.offset("sm_launches")
SLOT_SM_POLICY = L.REGION_SLOT.offset("sm_policy")
OFF_SM_POLICY = L.CTX.offset("sm_policy")
SLOT_SM_COST = L.REGION_SLOT.offset("sm_cost_ns")
SLOT_LAUNCHES = L.REGION_SLOT.offset("launches")
OFF_TICK = L.CTX.offset("sm_tick_ns")
RECLAIM_PERIOD_NS = 500_000_000
N_USED = L.MAX_DEVICES * L.N_KINDS
DEVICES_OFF, DEVICE_SIZE = L.REGION_DEVICES_OFF, L.REGION_DEVICE.size
SLOTS_OFF, SLOT_SIZE = L.REGION_SLOTS_OFF, L.REGION_SLOT.size

_U0 = np.uint64(0)


@njit(inline="always")
def device_addr(region, dev):
    return region + DEVICES_OFF + dev * DEVICE_SIZE


@njit(inline="always")
def slot_addr(region, i):
    return region + SLOTS_OFF + i * SLOT_SIZE


@njit(inline="always")
def region_of(ctx):
    return load_u64(ctx + OFF_REGION)


@njit
def try_charge(ctx, dev, kind, n):
    """Reserve n bytes on dev for this process; False if the group's limit would be passed."""
    region = load_u64(ctx + OFF_REGION)
    if region == 0:
        return True
    d = device_addr(region, dev)
    n = np.uint64(n)
    lim = atomic_load_u64(d + DEV_LIMIT)
    if lim == 0:
        new = atomic_add_u64(d + DEV_USED, n) + n
    else:
        while True:
            cur = atomic_load_u64(d + DEV_USED)
            if cur > lim or n > lim - cur:
                return False
            if atomic_cas_u64(d + DEV_USED, cur, cur + n) == cur:
                new = cur + n
                break
    atomic_max_u64(d + DEV_PEAK, new)
    atomic_add_u64(load_u64(ctx + OFF_SLOT) + SLOT_USED + (dev * L.N_KINDS + kind) * 8, n)
    return True


@njit
def force_charge(ctx, dev, kind, n):
    """Record bytes the driver already handed out (pool growth found afterwards)."""
    region = load_u64(ctx + OFF_REGION)
    if region == 0:
        return
    d = device_addr(region, dev)
    n = np.uint64(n)
    atomic_max_u64(d + DEV_PEAK, atomic_add_u64(d + DEV_USED, n) + n)
    atomic_add_u64(load_u64(ctx + OFF_SLOT) + SLOT_USED + (dev * L.N_KINDS + kind) * 8, n)


@njit
def uncharge(ctx, dev, kind, n):
    region = load_u64(ctx + OFF_REGION)
    if region == 0:
        return
    n = np.uint64(n)
    atomic_sub_u64(load_u64(ctx + OFF_SLOT) + SLOT_USED + (dev * L.N_KINDS + kind) * 8, n)
    atomic_sub_u64(device_addr(region, dev) + DEV_USED, n)


@njit
def count_oom(ctx, dev, n):
    """A refusal for the cap: counted for the device and the process, and logged with its size."""
    region = load_u64(ctx + OFF_REGION)
    if region != 0:
        d = device_addr(region, dev)
        atomic_add_u64(d + DEV_OOM, 1)
        atomic_add_u64(load_u64(ctx + OFF_SLOT) + SLOT_OOM, 1)
        events.record(region, L.EV_OOM, dev, 0, n, atomic_load_u64(d + DEV_USED))


@njit
def _release_slot_counters(region, s):
    """Give a dead slot's bytes back to the devices, logging each device's; the caller holds the slot's lock."""
    total = _U0
    pid = atomic_load_u32(s + SLOT_PID)
    for dev in range(L.MAX_DEVICES):
        freed = _U0
        for k in range(L.N_KINDS):
            a = s + SLOT_USED + (dev * L.N_KINDS + k) * 8
            n = atomic_load_u64(a)
            if n != 0:
                d = device_addr(region, dev)
                atomic_sub_u64(d + DEV_USED, n)
                atomic_add_u64(d + DEV_RECLAIMED, n)
                atomic_store_u64(a, 0)
                freed += n
        if freed != 0:
            events.record(region, L.EV_RECLAIM, dev, pid, freed, 0)
            total += freed
    return total


@njit
def reclaim_dead(ctx):
    """Free the slots of dead processes; returns the bytes given back."""
    region = load_u64(ctx + OFF_REGION)
    if region == 0:
        return _U0
    fd = load_i32(ctx + OFF_FD)
    own = load_i32(ctx + OFF_SLOT_INDEX)
    n_slots = atomic_load_u32(ctx + OFF_NSLOTS)
    total = _U0
    for i in range(n_slots):
        if i == own:
            continue
        s = slot_addr(region, i)
        if atomic_load_u32(s + SLOT_STATE) != L.SLOT_LIVE:
            continue
        off = SLOTS_OFF + i * SLOT_SIZE
        if ofd_lock(fd, F_OFD_SETLK, F_WRLCK, off, 1) != 0:
            continue  # its owner holds the lock: alive
        if atomic_load_u32(s + SLOT_STATE) == L.SLOT_LIVE:
            total += _release_slot_counters(region, s)
            atomic_store_u32(s + SLOT_STATE, L.SLOT_FREE)
        ofd_lock(fd, F_OFD_SETLK, F_UNLCK, off, 1)
    return total


@njit
def reclaim_due(ctx):
    """The watcher's reclaim, at most every RECLAIM_PERIOD_NS (it ticks faster for the compute controller)."""
    now = monotonic_ns()
    if now - np.int64(load_u64(ctx + OFF_TICK)) < RECLAIM_PERIOD_NS:
        return _U0
    store_u64(ctx + OFF_TICK, np.uint64(now))
    return reclaim_dead(ctx)


@njit
def claim_slot(ctx):
    """Take a free slot (or a dead process's) for this process; its index, or -1 if all are in use."""
    region = load_u64(ctx + OFF_REGION)
    fd = load_i32(ctx + OFF_FD)
    n_slots = atomic_load_u32(ctx + OFF_NSLOTS)
    for i in range(n_slots):
        off = SLOTS_OFF + i * SLOT_SIZE
        if ofd_lock(fd, F_OFD_SETLK, F_WRLCK, off, 1) != 0:
            continue
        s = slot_addr(region, i)
        if atomic_load_u32(s + SLOT_STATE) != L.SLOT_FREE:
            _release_slot_counters(region, s)  # we hold its lock: the previous owner is dead
        for j in range(N_USED):
            atomic_store_u64(s + SLOT_USED + j * 8, 0)
        atomic_store_u64(s + SLOT_OOM, 0)
        for j in range(L.MAX_DEVICES):
            atomic_store_u64(s + SLOT_SM_LAUNCHES + j * 8, 0)
            atomic_store_u64(s + SLOT_SM_COST + j * 8, 0)
        atomic_store_u64(s + SLOT_LAUNCHES, 0)
        store_u64(s + SLOT_START, realtime_ns())
        atomic_store_u32(s + SLOT_PID, getpid())
        atomic_store_u32(s + SLOT_SM_POLICY, load_u32(ctx + OFF_SM_POLICY))
        atomic_store_u32(s + SLOT_STATE, L.SLOT_LIVE)
        store_u64(ctx + OFF_SLOT, s)
        atomic_store_u32(ctx + OFF_SLOT_INDEX, i)
        return i
    return -1
