"""The turn file's words, and what a reader may believe of them (pyvgpu/jit/compute/turn.py takes the turns).

A turn word is ``id << 32 | lease end`` with the lease in CLOCK_MONOTONIC >> 10 units (~1 us, wrapping every
73 minutes, compared as serial numbers); ``want`` and ``resv`` words name a waiter or a reservation the same
way. Every member of the turn file can write any of them, so nothing read here is believed beyond what a
fair writer could have written (``trusted_until``, ``heal_queue``), and every wait for the turn counts
towards one bound kept over time (``wait_debt``): docs/security.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import layout as L
from pyvgpu.jit.runtime.fields import CTX, DEV, REGION, SCHED, TURN
from pyvgpu.jit.runtime.intrinsics import futex_wake, likely, monotonic_ns, unlikely

LEASE_NS = 1_000_000  # a holder's lease outlasts its queued work by this (a dead or idle holder's turn lapses)
RENEW_NS = 100_000  # the holder renews its lease when it would grow by more than this (the word lags this)
MAX_LEASE_NS = 1_000_000_000  # the longest lease, however much work is queued
SLICE_NS = 50_000_000  # the longest a holder keeps the turn while another of its rank waits
MIN_TURN_NS = 2_000_000  # a holder with a short queue keeps the turn this long before a waiter of its rank gets it
GANG_MIN_TURN_NS = 20_000_000  # a gang's: its hand-over stops every rank (gangstop.py), each stop ~1 ms on a GPU
CORUN_NS = 500_000  # a launch goes beside the holder while both queues are shorter than this
BESIDE_DUE_NS = 100_000  # a best-effort launch goes beside a due holder while the GPU's queue ends within this
BEST_EFFORT_QUEUE_NS = 2_000_000  # the most a best-effort holder queues while a group with a share takes turns
# the most a low-priority holder queues while a high-priority group launches within its share on its GPU: what
# a request of that group waits for when it finds the turn held (its drain)
HIGH_QUEUE_NS = 1_000_000  # the shortest cap (turn.take reads no mark while its queue is shorter)
WANT_FRESH_NS = 1_000_000  # a waiter looks at least this often (its `want` mark is this fresh)
RESERVE_NS = 2_000_000_000  # a reservation further ahead than this is ignored
POLL_NS = 20_000  # a waiter's longest sleep between looks (plus the timer slack)
HANDOFF_NS = 500_000  # a process that just handed the turn over leaves it this long to a waiter
ACTIVE_NS = 1_000_000_000  # after its last launch, a group with a share keeps the others in turns this long
# The longest a launch waits for the turn. A holder renews its lease only while it launches, and a lease
# reaches at most MAX_LEASE_NS ahead, so a fair wait ends within about a second; a longer one means a holder
# that does not play fair (any member of the turn file can write a turn word). Past it the process stops
# taking turns on that device (it time-slices there) and logs a turn_timeout event (docs/security.md).
MAX_WAIT_NS = 5_000_000_000
# The bound counts a process's waits over time (wait_debt): each ns waited adds one; each ns between its
# waits pays RUN_CREDIT back, and each wait that ends in a launch pays LAUNCH_CREDIT_NS. A process gives
# up once it owes MAX_WAIT_NS: one that waits more than RUN_CREDIT times as long as it runs, and makes
# fewer than 1 s / LAUNCH_CREDIT_NS launches a second, for seconds. Fair contention does not owe: up to
# RUN_CREDIT + 1 saturating processes of one rank take slices in turn, and a best-effort process that
# fills the gaps of a share one kernel at a time launches far more often.
RUN_CREDIT = 8
LAUNCH_CREDIT_NS = 5_000_000
UNIT_SHIFT = 10
LOW32 = np.uint64(0xFFFFFFFF)
GANG_ID = np.uint32(0x80000000)  # the top bit of a turn id drawn for a gang (gang.update), clear in a process's
NO_RESERVATION = np.int64(1 << 62)

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
    return 0 < d <= (MAX_LEASE_NS >> UNIT_SHIFT) + (LEASE_NS >> UNIT_SHIFT) + 1


@njit(inline="always")
def to_ns(t, now):
    """The CLOCK_MONOTONIC ns of unit time t, taken as the one nearest to now."""
    return now + (ahead(t, units(now)) << UNIT_SHIFT)


@njit(inline="always")
def fresh(w, me, now):
    """The want word w names another process that looked within WANT_FRESH_NS."""
    who = holder(w)
    if who == 0 or who == me:
        return False
    d = ahead(units(now), w & LOW32)
    return 0 <= d <= (WANT_FRESH_NS >> UNIT_SHIFT)


@njit
def waits(e, rank, me, now):
    """Another process of this rank waits for the turn."""
    return fresh(TURN.load_want(e, rank), me, now)


@njit
def draw_id(sched, gang):
    """A new turn id from the turn file's counter: never 0 (nobody), GANG_ID set for a gang, clear else."""
    while True:
        i = np.uint32((np.uint64(SCHED.add_next_id(sched, 1)) + np.uint64(1)) & LOW32)
        i = i | GANG_ID if gang else i & ~GANG_ID
        if i != 0:
            return i


@njit
def least_turn(e, rank, g):
    """How long a holder whose queue stays short keeps the turn before the waiter of its rank gets it: a
    gang's hand-over to a gang stops every rank of both (neither can go beside the other), so GANG_MIN_TURN_NS;
    else MIN_TURN_NS (a waiter that is no gang goes beside a short queue, or has a deep queue of its own)."""
    if g != 0 and np.uint32(TURN.load_want(e, rank) >> np.uint64(32)) & GANG_ID != 0:
        return np.int64(GANG_MIN_TURN_NS)
    return np.int64(MIN_TURN_NS)


@njit
def more_urgent_waits(e, rank, me, now):
    for r in range(rank):
        if unlikely(fresh(TURN.load_want(e, r), me, now)):
            return True
    return False


@njit
def reserved(e, rank, me, now):
    """The earliest reservation (ns) by another process of this rank or a more urgent one, from
    WANT_FRESH_NS ago to RESERVE_NS ahead; NO_RESERVATION if none."""
    t = NO_RESERVATION
    for r in range(rank + 1):
        w = TURN.load_resv(e, r)
        who = holder(w)
        if likely(who == 0 or who == me):
            continue
        d = ahead(w & LOW32, units(now))
        if -(WANT_FRESH_NS >> UNIT_SHIFT) <= d <= (RESERVE_NS >> UNIT_SHIFT):
            at = now + (d << UNIT_SHIFT)
            if at < t:
                t = at
    return t


@njit
def anyone_waits(e, me, now):
    """Any other process waits for the turn, or has reserved it soon."""
    if more_urgent_waits(e, L.N_RANKS, me, now):
        return True
    return reserved(e, L.N_RANKS - 1, me, now) < now + SLICE_NS


# --- bounded waits (issue 29; docs/security.md): every value read from the turn file is checked against
# the reader's own clock, and every wait counts towards one bound kept over time ------------------------

@njit(inline="always")
def trusted_until(t, now, longest):
    """A deadline t (ns) read from the turn file holds at now: ahead, but no further than anyone writes
    one (``longest``, with LEASE_NS of slack). A value further ahead was written by a process that does
    not play fair (or before a reboot of the clock) and is not believed."""
    return now < t <= now + longest + LEASE_NS


@njit
def heal_queue(e, now):
    """Before taking a turn nobody holds: the last holder drained its work before it freed the turn (or
    its lease, which outlasts its queue, lapsed), so the GPU's queue under turns holds at most launches
    made beside it. An end more than SLICE_NS ahead was written by a process that does not play fair (a
    taker would inherit it as its own queue and hold back for it): cut back to now."""
    q = TURN.load_qend(e)
    if unlikely(np.int64(q) > now + SLICE_NS):
        TURN.cas_qend(e, q, np.uint64(now))


@njit
def wait_debt(ctx, dev, t0):
    """What this process owes on dev (ns) when a wait starts at t0: each ns it waited for the turn added
    one, each ns since its last wait ended pays RUN_CREDIT back. Kept over time, not per wait, so a
    process that keeps each wait short (a want or reservation refreshed, a holder that lets go now and
    then) still runs it up."""
    v = CTX.get_turn_waited(ctx, dev)
    debt = np.int64(v >> np.uint64(32)) << UNIT_SHIFT
    if debt == 0:
        return np.int64(0)
    ran = ahead(units(t0), v & LOW32) << UNIT_SHIFT
    if ran < -MAX_WAIT_NS:  # its last wait ended over half the clock's wrap (36 min) ago: paid long since
        return np.int64(0)
    if ran > 0:  # (< 0: another thread's wait ended after this one began)
        debt -= RUN_CREDIT * ran
    return debt if debt > 0 else np.int64(0)


@njit
def settle_wait(ctx, dev, t0, now):
    """A wait of this process on dev, [t0, now), ended (in a launch): it adds to the debt what another
    thread's wait did not count already (threads waiting at once count the time once), less the launch's
    credit."""
    v = CTX.get_turn_waited(ctx, dev)
    start = t0
    if v != 0:
        last = to_ns(v & LOW32, now)
        if last > start:
            start = last
    debt = wait_debt(ctx, dev, t0) + (now - start if now > start else 0) - LAUNCH_CREDIT_NS
    if debt < 0:
        debt = np.int64(0)
    u = np.uint64(debt >> UNIT_SHIFT)
    if u > LOW32:
        u = LOW32
    CTX.set_turn_waited(ctx, dev, (u << np.uint64(32)) | units(now))


@njit(inline="always")
def stalled(ctx, dev, t0, now):
    """A wait that began at t0 has run this process's debt past MAX_WAIT_NS."""
    return wait_debt(ctx, dev, t0) + (now - t0) >= MAX_WAIT_NS


# --- who takes part ----------------------------------------------------------------------

@njit
def mark_active(ctx, e, now):
    """A group with a share launches on this GPU: the others take turns with it for ACTIVE_NS."""
    until = np.uint64(now + ACTIVE_NS)
    a = TURN.load_active(e)
    if unlikely(a + np.uint64(ACTIVE_NS // 4) < until or a > until + np.uint64(LEASE_NS)):  # late, or forged ahead
        TURN.store_active(e, until)
        SCHED.store_active(CTX.get_sched(ctx), until)


@njit(inline="always")
def mark_high(e, now):
    """A high-priority group launches within its share on this GPU: low-priority holders keep their queues
    short for ACTIVE_NS (``queue_cap``)."""
    until = np.uint64(now + ACTIVE_NS)
    h = TURN.load_high(e)
    if unlikely(h + np.uint64(ACTIVE_NS // 4) < until or h > until + np.uint64(LEASE_NS)):  # late, or forged ahead
        TURN.store_high(e, until)


@njit(inline="always")
def queue_cap(e, rank, now):
    """The most a holder of rank may queue on entry e's GPU now (ns ahead of now), 0 for no bound: a
    best-effort holder while a group with a share takes turns there, so that it hands over quickly; a
    low-priority one while a high-priority group launches within its share there, so that the high one's
    requests wait for little. The marks are believed only as far ahead as anyone writes them."""
    cap = np.int64(0)
    if rank % 2 == 1 and trusted_until(np.int64(TURN.load_high(e)), now, ACTIVE_NS):
        cap = np.int64(HIGH_QUEUE_NS)
    elif rank >= L.RANK_HIGH_BEST_EFFORT and np.int64(TURN.load_active(e)) > now:
        cap = np.int64(BEST_EFFORT_QUEUE_NS)
    return cap


@njit(inline="always")
def machine_active(ctx):
    """A launch without a share must look at the turns: a group with a share took turns on this machine
    lately. Loads only, no clock: it compares with the watcher's last tick, which only ever errs towards
    looking (a tick not there yet, or late)."""
    sched = CTX.get_sched(ctx)
    if sched == 0:
        return False
    return SCHED.load_active(sched) > CTX.get_turn_tick(ctx)


@njit
def share_waits(ctx, e, now):
    """Another process launching within its share waits for the turn of entry e (a borrower must not take
    idle time then). Without turns nobody can tell: True, so nobody borrows."""
    if e <= _NONE:
        return True
    return more_urgent_waits(e, L.RANK_HIGH_BEST_EFFORT, CTX.get_turn_id(ctx), now)


@njit
def active_on(e, now):
    """A group with a share takes turns on entry e's GPU now: a launch without a share takes part."""
    return e > _NONE and trusted_until(np.int64(TURN.load_active(e)), now, ACTIVE_NS)


# --- the GPU's queue and the time held ------------------------------------------------

@njit
def count_held(ctx, region, dev, start, end):
    """Add [start, end) to the time the group held the turn (sm_turn_ns), less what is counted already.

    A holder's turn lasts while its work runs: from when it takes the turn to when its queue ends (the
    cost model's estimate, or the end of its drain), not only while its thread launches (a group alone
    at 50% queues its share in a moment and sleeps)."""
    held = np.int64(CTX.get_turn_held(ctx, dev))
    s = start if start > held else held
    if end > s:
        DEV.add_sm_turn_ns(REGION.device(region, dev), np.uint64(end - s))
        CTX.set_turn_held(ctx, dev, np.uint64(end))


@njit
def count_wait(ctx, region, dev, e, rank, t0, now):
    if likely(now <= t0):
        return
    settle_wait(ctx, dev, t0, now)
    waited = np.uint64(now - t0)
    TURN.add_wait_ns(e, waited)
    DEV.add_sm_turn_wait_ns(REGION.device(region, dev), waited)
    if rank <= L.RANK_DUE:
        TURN.max_max_wait_ns(e, waited)


@njit(inline="always")
def queue_base(q, now):
    """The GPU's queue end q (ns) as a launch at now sees it: not before now, and at most MAX_LEASE_NS
    ahead, as far as a lease reaches (a word written by a process that does not play fair, or left from
    before a reboot of the clock, heals at the next launch)."""
    if q <= now:
        return now
    return min(q, now + MAX_LEASE_NS)


@njit(inline="always")
def device_queue_end(e, now):
    """When the work queued on entry e's GPU under turns ends, every process's together (its ``qend``)."""
    return queue_base(np.int64(TURN.load_qend(e)), now)


@njit(inline="always")
def queue_on_device(e, now, cost):
    """A launch of cost ns goes into entry e's GPU's queue: its estimate grows (the GPU runs the kernels of
    every process one after another). Returns when the launch's kernel is estimated to end."""
    while True:
        old = TURN.load_qend(e)
        end = queue_base(np.int64(old), now) + np.int64(cost)
        if likely(TURN.cas_qend(e, old, np.uint64(end)) == old):
            return end


@njit
def ran_dry(ctx, e, dev, now):
    """A capped holder's work on the GPU is done (drain.idle) while its estimate says the queue runs on: the
    costs it added ran ahead of the GPU (a group without a share has no controller to scale them, and a
    collective's timing holds its wait for a peer). Its estimate and the GPU's (``qend``) come back to now,
    or the cap would hold it back with the GPU idle: by the estimate's error, not the cap. A gang's ranks add
    to one entry: a rank whose own work is done brings back its peers' part too, so the queue may pass the cap
    by what a peer still has queued (the cap keeps hand-overs quick; it is not a share)."""
    q = TURN.load_qend(e)
    if np.int64(q) > now:
        TURN.cas_qend(e, q, np.uint64(now))  # lost to a launch meanwhile: it added a kernel, the next look heals
    CTX.set_turn_qend(ctx, dev, np.uint64(now))


@njit(inline="always")
def lease_for(qend, now):
    """A lease that outlasts the queued work: a holder blocked on its own full queue keeps the turn."""
    return min(qend, now + MAX_LEASE_NS) + LEASE_NS


@njit
def wake(e, me):
    """The turn was just freed by ``me``: wake the sleepers. Whether anyone sleeps is read from the want
    words, which a waiter writes right before each sleep of at most POLL_NS: a count of sleepers leaked
    whenever a waiter was killed in its sleep."""
    TURN.add_seq(e, 1)
    if more_urgent_waits(e, L.N_RANKS, me, monotonic_ns()):
        futex_wake(TURN.seq_at(e))


@njit
def free_turn(e, me):
    """Mark the turn free (its word keeps this process's id, which leaves the next turn to a waiter) and
    wake the sleepers. The time first: a waiter that takes the turn at once reads this free's time."""
    TURN.store_freed_ns(e, np.uint64(monotonic_ns()))
    TURN.store_turn(e, np.uint64(me) << np.uint64(32))
    wake(e, me)
