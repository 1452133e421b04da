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

from pyvgpu import abi
from pyvgpu import layout as L
from pyvgpu.jit import events
from pyvgpu.jit.context import HELPER
from pyvgpu.jit.fields import CTX, SCHED, SCHED_AT, TURN
from pyvgpu.jit.intrinsics import load_u64, monotonic_ns, sleep_ns, stack_buffer, stack_u64
from pyvgpu.jit.streams import running_context

LEASE_NS = 3_000_000  # a holder that has not launched for this long (and has no work queued) loses the turn
MAX_LEASE_NS = 1_000_000_000  # the longest lease, however much work is queued
SLICE_NS = 50_000_000  # the longest a holder keeps the turn while another waits
WANT_FRESH_NS = 1_000_000  # a waiter looks at least this often (its `want` mark is this fresh)
POLL_NS = 20_000  # a waiter's sleep between looks (nanosleep adds the timer slack, ~50 us)
HANDOFF_NS = 500_000  # a process that just handed the turn over leaves it this long to a waiter
# The longest a launch waits for the turn. A holder renews its lease only while it launches, and a lease
# reaches at most MAX_LEASE_NS ahead, so a fair wait ends within about a second; a longer one means a holder
# that does not play fair (any member of the turn file can write a turn word). Past it the process stops
# taking turns on that device (it time-slices there) and logs a turn_timeout event (docs/security.md).
MAX_WAIT_NS = 5_000_000_000
UNIT_SHIFT = 10
LOW32 = np.uint64(0xFFFFFFFF)

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
    w = TURN.load_want(e)
    who = holder(w)
    if who == 0 or who == me:
        return False
    d = ahead(units(now), w & LOW32)
    return 0 <= d <= (WANT_FRESH_NS >> UNIT_SHIFT)


# --- looking up a device's entry --------------------------------------------------------

@njit
def entry(ctx, dev):
    """The turn entry of CUDA device dev (claimed in the file if new), or 1 when this device takes no turns."""
    a = CTX.get_turn_entry(ctx, dev)
    if a != 0:
        return a
    a = _NONE
    sched = CTX.get_sched(ctx)
    uuid = stack_buffer(16)  # CUuuid
    if sched != 0 and HELPER.cuDeviceGetUuid_v2(ctx, uuid, dev) == abi.CUDA_SUCCESS:
        key = np.uint64(0xCBF29CE484222325)
        for v in (load_u64(uuid), load_u64(uuid + 8)):
            key = (key ^ v) * np.uint64(0x100000001B3)
        key |= np.uint64(1)
        for i in range(SCHED_AT.N_ENTRIES):
            e = SCHED_AT.entry(sched, i)
            k = TURN.load_key(e)
            if k == 0:
                k = TURN.cas_key(e, 0, key)
                if k == 0:
                    k = key
            if k == key:
                a = np.uint64(e)
                break
        if a == _NONE:  # every entry belongs to another GPU: this one time-slices, said once per process
            events.record(CTX.get_region(ctx), L.EV_TURNS_FULL, dev, 0, 0, 0)
        if CTX.get_turn_id(ctx) == 0:
            pid = np.uint32(0)
            while pid == 0:  # 0 means nobody
                pid = np.uint32((np.uint64(SCHED.add_next_id(sched, 1)) + np.uint64(1)) & LOW32)
            CTX.set_turn_id(ctx, pid)
    CTX.set_turn_entry(ctx, dev, a)
    return a


# --- handing over -----------------------------------------------------------------------

@njit
def drain(ctx, e, stream):
    """Wait until the work this process queued on stream is done (an event after it). Skipped while the
    stream captures a graph: nothing captured runs now."""
    cur = running_context(ctx, stream)
    if cur == 0:
        return
    ev = CTX.get_drain_ev(ctx)
    if ev != 0 and CTX.get_drain_ctx(ctx) != cur:
        HELPER.cuEventDestroy_v2(ctx, ev)
        ev = np.uint64(0)
        CTX.set_drain_ev(ctx, 0)
    if ev == 0:
        out = stack_u64()
        if HELPER.cuEventCreate(ctx, out, abi.CU_EVENT_DISABLE_TIMING) != abi.CUDA_SUCCESS:
            return
        ev = load_u64(out)
        CTX.set_drain_ev(ctx, ev)
        CTX.set_drain_ctx(ctx, cur)
    t0 = monotonic_ns()
    if HELPER.cuEventRecord(ctx, ev, stream) == abi.CUDA_SUCCESS:
        HELPER.cuEventSynchronize(ctx, ev)
        TURN.add_drains(e, 1)
        TURN.add_drain_ns(e, np.uint64(monotonic_ns() - t0))


@njit(inline="always")
def takes_turns(ctx, dev):
    """This process takes turns on dev (looked up at its first limited launch there)."""
    return CTX.get_turn_entry(ctx, dev) > _NONE


@njit
def give(ctx, dev, stream):
    """Hand the turn on dev over if this process holds it (its limiter holds it back, or its slice is over).

    If another process waits, first let this process's work finish, then mark the turn free: the GPU
    never runs both. The free word keeps this process's id, so that it leaves the next turn to the
    waiter. If nobody waits, the turn stays this process's until its queued work is estimated to end,
    with no wait: a process alone on the GPU never drains its queue.
    """
    e = CTX.get_turn_entry(ctx, dev)
    if e <= _NONE:
        return
    me = CTX.get_turn_id(ctx)
    w = TURN.load_turn(e)
    if holder(w) != me or (w & LOW32) == 0:
        return
    now = monotonic_ns()
    free = np.uint64(me) << np.uint64(32)
    if not other_waits(e, me, now):
        qend = np.int64(CTX.get_turn_qend(ctx, dev))
        TURN.cas_turn(e, w, word(me, qend) if qend > now else free)
        return
    # Draining, the holder keeps the turn however long its work really takes (the lease follows an
    # estimate); it hands over right after.
    if TURN.cas_turn(e, w, word(me, now + MAX_LEASE_NS)) != w:
        return
    drain(ctx, e, stream)
    TURN.store_turn(e, free)


@njit(inline="always")
def queue_end(ctx, dev, now, cost):
    """When the work this process queued on dev ends, counting a launch of cost ns now (kernels run one
    after another)."""
    qend = np.int64(CTX.get_turn_qend(ctx, dev))
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
    me = CTX.get_turn_id(ctx)
    w = TURN.load_turn(e)
    if holder(w) == me and leased(w, now):
        since = np.int64(CTX.get_turn_since(ctx, dev))
        if now - since < SLICE_NS or not other_waits(e, me, now):
            qend = queue_end(ctx, dev, now, cost)
            CTX.set_turn_qend(ctx, dev, np.uint64(qend))
            until = lease_for(qend, now)
            if ahead(units(until), w & LOW32) > (LEASE_NS >> (UNIT_SHIFT + 1)):  # renew by half a lease
                TURN.cas_turn(e, w, word(me, until))
            return
        give(ctx, dev, stream)  # the slice is over and another waits
    t0 = now
    while True:
        w = TURN.load_turn(e)
        if not leased(w, now):
            # Free, or its holder's lease ran out. One who just handed it over leaves it to a waiter a moment.
            if holder(w) == me and now - t0 < HANDOFF_NS and other_waits(e, me, now):
                sleep_ns(POLL_NS)
                now = monotonic_ns()
                continue
            qend = queue_end(ctx, dev, now, cost)
            if TURN.cas_turn(e, w, word(me, lease_for(qend, now))) == w:
                CTX.set_turn_qend(ctx, dev, np.uint64(qend))
                CTX.set_turn_since(ctx, dev, np.uint64(now))
                if holder(w) != me:
                    TURN.add_handovers(e, 1)
                if now > t0:
                    TURN.add_wait_ns(e, np.uint64(now - t0))
                return
            continue
        if holder(w) == me:  # another thread of this process took it meanwhile
            CTX.set_turn_qend(ctx, dev, np.uint64(queue_end(ctx, dev, now, cost)))
            return
        if now - t0 >= MAX_WAIT_NS:  # a holder that does not let go: stop taking turns here
            CTX.set_turn_entry(ctx, dev, _NONE)
            TURN.add_wait_ns(e, np.uint64(now - t0))
            events.record(CTX.get_region(ctx), L.EV_TURN_TIMEOUT, dev, 0, now - t0, holder(w))
            return
        TURN.store_want(e, word(me, now))
        sleep_ns(POLL_NS)
        now = monotonic_ns()
