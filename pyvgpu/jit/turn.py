"""The device turn: which process may launch on a GPU now.

Two contexts that both have work on one GPU are time-sliced by the hardware,
and the slicing costs time nobody gets: on an H100 two saturating processes
together got 89.7% of what one gets alone (docs/compute.md). The limiter
gives each group its share of the time, but a group whose share is 70% cannot
get it back while a 30% group runs beside it.

So groups with a compute share take turns. Every GPU (by UUID) has one entry
in the machine's turn file (pyvgpu/sched.py, layout SCHED_ENTRY); its turn
word names the process that may launch and until when its lease runs:
``id << 32 | lease`` with the lease in CLOCK_MONOTONIC >> 10 units (~1 us,
wrapping every 73 minutes, compared as serial numbers). A launch that does
not hold the turn waits for it; the holder renews its lease as it launches,
and hands the turn over when its limiter holds it back or its slice is over
while another waits. Before it hands over it waits for its own work to
finish (an event after its last launch), so the GPU runs one context at a
time and the only loss is the hand-over itself. A holder that stops
launching (it computes on the CPU, it died) loses the turn when its lease
runs out.

Only processes with a share in force take part: a program that is not
limited launches as it always did, and still time-slices with the rest.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu import hooks
from pyvgpu import layout as L
from pyvgpu.jit.intrinsics import (
    atomic_add_u32,
    atomic_add_u64,
    atomic_cas_u64,
    atomic_load_u64,
    atomic_store_u64,
    call_i32,
    load_u32,
    load_u64,
    monotonic_ns,
    sleep_ns,
    stack_buffer,
    stack_u64,
    store_u32,
    store_u64,
)
from pyvgpu.jit.memory import helper
from pyvgpu.jit.streams import running_context

CUDA_SUCCESS = 0
CU_EVENT_DISABLE_TIMING = 2

LEASE_NS = 3_000_000  # a holder that has not launched for this long (and has no work queued) loses the turn
MAX_LEASE_NS = 1_000_000_000  # the longest lease, however much work is queued
SLICE_NS = 50_000_000  # the longest a holder keeps the turn while another waits
WANT_FRESH_NS = 1_000_000  # a waiter looks at least this often (its `want` mark is this fresh)
POLL_NS = 20_000  # a waiter's sleep between looks (nanosleep adds the timer slack, ~50 us)
HANDOFF_NS = 500_000  # a process that just handed the turn over leaves it this long to a waiter
UNIT_SHIFT = 10
LOW32 = np.uint64(0xFFFFFFFF)

OFF_SCHED = L.CTX.offset("sched")
OFF_ID = L.CTX.offset("turn_id")
OFF_ENTRY = L.CTX.offset("turn_entry")
OFF_SINCE = L.CTX.offset("turn_since")
OFF_QEND = L.CTX.offset("turn_qend")
OFF_DRAIN_EV = L.CTX.offset("drain_ev")
OFF_DRAIN_CTX = L.CTX.offset("drain_ctx")

S_NEXT_ID = L.SCHED_HEADER.offset("next_id")
ENTRIES_OFF, ENTRY_SIZE, N_ENTRIES = L.SCHED_ENTRIES_OFF, L.SCHED_ENTRY.size, L.SCHED_ENTRIES
E_KEY = L.SCHED_ENTRY.offset("key")
E_TURN = L.SCHED_ENTRY.offset("turn")
E_WANT = L.SCHED_ENTRY.offset("want")
E_HANDOVERS = L.SCHED_ENTRY.offset("handovers")
E_WAIT = L.SCHED_ENTRY.offset("wait_ns")
E_DRAINS = L.SCHED_ENTRY.offset("drains")
E_DRAIN_NS = L.SCHED_ENTRY.offset("drain_ns")

H_DEVICE_UUID = hooks.HELPER_INDEX["cuDeviceGetUuid_v2"]
H_EVENT_CREATE = hooks.HELPER_INDEX["cuEventCreate"]
H_EVENT_RECORD = hooks.HELPER_INDEX["cuEventRecord"]
H_EVENT_SYNCHRONIZE = hooks.HELPER_INDEX["cuEventSynchronize"]
H_EVENT_DESTROY = hooks.HELPER_INDEX["cuEventDestroy_v2"]

_NONE = np.uint64(1)  # turn_entry value: this device takes no turns


# --- turn words -------------------------------------------------------------------------

@njit(inline="always")
def units(ns):
    return (np.uint64(ns) >> np.uint64(UNIT_SHIFT)) & LOW32


@njit(inline="always")
def ahead(a, b):
    """a - b in units, as a signed serial-number difference (the clock wraps every 2^32 units)."""
    d = (a - b) & LOW32
    return np.int64(d) - np.int64(1 << 32) if d >= np.uint64(1 << 31) else np.int64(d)


@njit(inline="always")
def word(pid, ns):
    t = units(ns)
    return (np.uint64(pid) << np.uint64(32)) | (t if t != 0 else np.uint64(1))


@njit(inline="always")
def holder(w):
    return np.uint32(w >> np.uint64(32))


@njit(inline="always")
def leased(w, now):
    """The turn word w is held by a live lease at now: its lease ends ahead, but not further than a lease
    reaches (a lease from before a wrap of the clock is over)."""
    t = w & LOW32
    if t == 0:
        return False
    d = ahead(t, units(now))
    return 0 < d <= (MAX_LEASE_NS >> UNIT_SHIFT) + 1


@njit(inline="always")
def other_waits(e, me, now):
    """Another process looked for the turn within WANT_FRESH_NS."""
    w = atomic_load_u64(e + E_WANT)
    who = holder(w)
    if who == 0 or who == me:
        return False
    d = ahead(units(now), w & LOW32)
    return 0 <= d <= (WANT_FRESH_NS >> UNIT_SHIFT)


# --- looking up a device's entry --------------------------------------------------------

@njit
def entry(ctx, dev):
    """The turn entry of CUDA device dev (claimed in the file if new), or 1 when this device takes no turns."""
    a = load_u64(ctx + OFF_ENTRY + dev * 8)
    if a != 0:
        return a
    a = _NONE
    sched = load_u64(ctx + OFF_SCHED)
    uuid = stack_buffer(16)
    if sched != 0 and call_i32(helper(ctx, H_DEVICE_UUID), (uuid, np.int32(dev))) == CUDA_SUCCESS:
        key = np.uint64(0xCBF29CE484222325)
        for v in (load_u64(uuid), load_u64(uuid + 8)):
            key = (key ^ v) * np.uint64(0x100000001B3)
        key |= np.uint64(1)
        for i in range(N_ENTRIES):
            e = sched + ENTRIES_OFF + i * ENTRY_SIZE
            k = atomic_load_u64(e + E_KEY)
            if k == 0:
                k = atomic_cas_u64(e + E_KEY, 0, key)
                if k == 0:
                    k = key
            if k == key:
                a = np.uint64(e)
                break
        if load_u32(ctx + OFF_ID) == 0:
            pid = np.uint32(0)
            while pid == 0:  # 0 means nobody
                pid = np.uint32((np.uint64(atomic_add_u32(sched + S_NEXT_ID, 1)) + np.uint64(1)) & LOW32)
            store_u32(ctx + OFF_ID, pid)
    store_u64(ctx + OFF_ENTRY + dev * 8, a)
    return a


# --- handing over -----------------------------------------------------------------------

@njit
def drain(ctx, e, stream):
    """Wait until the work this process queued on stream is done (an event after it). Skipped while the
    stream captures a graph: nothing captured runs now."""
    cur = running_context(ctx, stream)
    if cur == 0:
        return
    ev = load_u64(ctx + OFF_DRAIN_EV)
    if ev != 0 and load_u64(ctx + OFF_DRAIN_CTX) != cur:
        call_i32(helper(ctx, H_EVENT_DESTROY), (ev,))
        ev = np.uint64(0)
        store_u64(ctx + OFF_DRAIN_EV, 0)
    if ev == 0:
        out = stack_u64()
        if call_i32(helper(ctx, H_EVENT_CREATE), (out, np.uint32(CU_EVENT_DISABLE_TIMING))) != CUDA_SUCCESS:
            return
        ev = load_u64(out)
        store_u64(ctx + OFF_DRAIN_EV, ev)
        store_u64(ctx + OFF_DRAIN_CTX, cur)
    t0 = monotonic_ns()
    if call_i32(helper(ctx, H_EVENT_RECORD), (ev, stream)) == CUDA_SUCCESS:
        call_i32(helper(ctx, H_EVENT_SYNCHRONIZE), (ev,))
        atomic_add_u64(e + E_DRAINS, 1)
        atomic_add_u64(e + E_DRAIN_NS, np.uint64(monotonic_ns() - t0))


@njit(inline="always")
def takes_turns(ctx, dev):
    """This process takes turns on dev (looked up at its first limited launch there)."""
    return load_u64(ctx + OFF_ENTRY + dev * 8) > _NONE


@njit
def give(ctx, dev, stream):
    """Hand the turn on dev over if this process holds it (its limiter holds it back, or its slice is over).

    If another process waits, first let this process's work finish, then mark the turn free: the GPU
    never runs both. The free word keeps this process's id, so that it leaves the next turn to the
    waiter. If nobody waits, the turn stays this process's until its queued work is estimated to end,
    with no wait: a process alone on the GPU never drains its queue.
    """
    e = load_u64(ctx + OFF_ENTRY + dev * 8)
    if e <= _NONE:
        return
    me = load_u32(ctx + OFF_ID)
    w = atomic_load_u64(e + E_TURN)
    if holder(w) != me or (w & LOW32) == 0:
        return
    now = monotonic_ns()
    free = np.uint64(me) << np.uint64(32)
    if not other_waits(e, me, now):
        qend = np.int64(load_u64(ctx + OFF_QEND + dev * 8))
        atomic_cas_u64(e + E_TURN, w, word(me, qend) if qend > now else free)
        return
    # Draining, the holder keeps the turn however long its work really takes (the lease follows an
    # estimate); it hands over right after.
    if atomic_cas_u64(e + E_TURN, w, word(me, now + MAX_LEASE_NS)) != w:
        return
    drain(ctx, e, stream)
    atomic_store_u64(e + E_TURN, free)


@njit(inline="always")
def queue_end(ctx, dev, now, cost):
    """When the work this process queued on dev ends, counting a launch of cost ns now (kernels run one
    after another)."""
    qend = np.int64(load_u64(ctx + OFF_QEND + dev * 8))
    return (qend if qend > now else now) + np.int64(cost)


@njit(inline="always")
def lease_for(qend, now):
    """A lease that outlasts the queued work: a holder blocked on its own full queue keeps the turn."""
    return min(qend, now + MAX_LEASE_NS) + LEASE_NS


@njit
def take(ctx, dev, stream, now, cost):
    """Before a limited launch of cost ns on dev: hold the turn, waiting for it if another process has it."""
    e = entry(ctx, dev)
    if e <= _NONE:
        return
    me = load_u32(ctx + OFF_ID)
    w = atomic_load_u64(e + E_TURN)
    if holder(w) == me and leased(w, now):
        since = np.int64(load_u64(ctx + OFF_SINCE + dev * 8))
        if now - since < SLICE_NS or not other_waits(e, me, now):
            qend = queue_end(ctx, dev, now, cost)
            store_u64(ctx + OFF_QEND + dev * 8, np.uint64(qend))
            until = lease_for(qend, now)
            if ahead(units(until), w & LOW32) > (LEASE_NS >> (UNIT_SHIFT + 1)):  # renew by half a lease
                atomic_cas_u64(e + E_TURN, w, word(me, until))
            return
        give(ctx, dev, stream)  # the slice is over and another waits
    t0 = now
    while True:
        w = atomic_load_u64(e + E_TURN)
        if not leased(w, now):
            # Free, or its holder's lease ran out. One who just handed it over leaves it to a waiter a moment.
            if holder(w) == me and now - t0 < HANDOFF_NS and other_waits(e, me, now):
                sleep_ns(POLL_NS)
                now = monotonic_ns()
                continue
            qend = queue_end(ctx, dev, now, cost)
            if atomic_cas_u64(e + E_TURN, w, word(me, lease_for(qend, now))) == w:
                store_u64(ctx + OFF_QEND + dev * 8, np.uint64(qend))
                store_u64(ctx + OFF_SINCE + dev * 8, np.uint64(now))
                if holder(w) != me:
                    atomic_add_u64(e + E_HANDOVERS, 1)
                if now > t0:
                    atomic_add_u64(e + E_WAIT, np.uint64(now - t0))
                return
            continue
        if holder(w) == me:  # another thread of this process took it meanwhile
            store_u64(ctx + OFF_QEND + dev * 8, np.uint64(queue_end(ctx, dev, now, cost)))
            return
        atomic_store_u64(e + E_WANT, word(me, now))
        sleep_ns(POLL_NS)
        now = monotonic_ns()
