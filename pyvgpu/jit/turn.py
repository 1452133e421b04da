"""The device turn: which process may fill a GPU's queue now.

Two contexts that both have deep queues on one GPU are time-sliced by the
hardware, and the slicing costs time nobody gets: two saturating processes
together get less than one alone, and the larger of two shares falls well
below its target (docs/compute.md). So the processes on a GPU take turns:
every GPU (by UUID) has one entry in the machine's turn file (pyvgpu/sched.py,
layout SCHED_ENTRY); its turn word names the process that holds the turn and
until when its lease runs: ``id << 32 | lease`` with the lease in
CLOCK_MONOTONIC >> 10 units (~1 us, wrapping every 73 minutes, compared as
serial numbers). The lease is the holder's queued work (estimated by the cost
model) plus LEASE_NS, renewed as it launches: a holder that stops launching
loses the turn LEASE_NS after its queue runs dry, one that dies too.

The GPU runs every process's kernels one after another, so a process's own
estimate of its queue leaves out the kernels of others queued ahead of its
own. The entry keeps the GPU's whole queue (``qend``: every launch under
turns adds its cost, holder or not), and a launch's queue ends where it
lands in it. Two processes that each kept only their own estimate and
time-sliced each ran at half speed, so each saw its own queue short, and
they went on going beside each other for good.

The estimate adds up costs from when each launch was made, so it is open
loop, and the GPU must not hold work it never counted. Two rules keep it so
(a --sm 50 spin group and an unlimited one, started together, queued
their first kernels at cost 0 and outside the turns; leases then lapsed
while the GPU still held both queues, the turn passed without a drain, and
both time-sliced for good, the share held below its target; docs/compute.md):

* a process that launched on a GPU outside the turns lets that work finish
  before its first launch under them (``join``), and a process's first
  timed launch is waited for, so that it never queues on at cost 0
  (pyvgpu/jit/launch.py);
* a process whose lease lapsed and whose turn another took lets its own
  work finish before it launches again (``lapsed``): the hand-over it
  missed, late. A holder that was only idle has nothing queued, and the
  wait costs an event.

Time slicing only costs while both queues are deep. Two launch-bound programs
(small kernels, the CPU between them) leave the GPU mostly idle, and taking
whole turns would halve both. So a launch may go *beside* the holder when
its queue, the holder's and the GPU's (``qend``) are all shorter than
CORUN_NS: the turn is for deep queues, which it keeps apart. A launch of a
less urgent rank than the holder's goes beside it while the GPU's queue with
its kernel ends within BESIDE_DUE_NS, and never beside a high-priority holder.

Ranks (pyvgpu.layout.RANK_*): a launch within its group's share is *due*; a
launch of a group without a share, or borrowing beyond its share
(``--sm-borrow``), is *best effort*; a high-priority group ranks before a low
one within each. The holder hands the turn over, after draining its work
(pyvgpu/jit/drain.py) so that the GPU never holds both queues:

* at once, to a waiter of a more urgent rank (a best-effort holder also keeps
  its queue under BEST_EFFORT_QUEUE_NS while a group with a share takes
  turns here, so that hand-over is quick);
* before a *reservation* of its rank or a more urgent one would start: a
  group whose budget ran out says when it is free again (``resv``), and the
  holder stops queueing work that would run past that moment;
* to a waiter of its own rank, when its slice (SLICE_NS) is over, or when
  after MIN_TURN_NS its own queue is still short (it launches little: the
  waiter could not go beside it because its own queue is deep);
* when its limiter holds it back (pyvgpu/jit/limiter.py).

A waiter of a less urgent rank waits for the turn to lapse or be handed over.
Waiters sleep on a futex in the entry (``seq``), bumped when a holder frees
the turn, with POLL_NS as the longest sleep.

Processes without a share look at the turns only while a group with a share
takes turns on the machine (``active``, read against the watcher's clock:
no clock read of their own until then), and on a GPU only while one takes
turns there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu import abi
from pyvgpu import layout as L
from pyvgpu.jit import drain as D
from pyvgpu.jit import events
from pyvgpu.jit.context import HELPER
from pyvgpu.jit.fields import CTX, DEV, REGION, SCHED, SCHED_AT, TURN
from pyvgpu.jit.intrinsics import (
    futex_wait,
    futex_wake,
    likely,
    load_u64,
    monotonic_ns,
    sleep_ns,
    stack_buffer,
    unlikely,
)

LEASE_NS = 1_000_000  # a holder's lease outlasts its queued work by this (a dead or idle holder's turn lapses)
RENEW_NS = 100_000  # the holder renews its lease when it would grow by more than this (the word lags this)
MAX_LEASE_NS = 1_000_000_000  # the longest lease, however much work is queued
SLICE_NS = 50_000_000  # the longest a holder keeps the turn while another of its rank waits
MIN_TURN_NS = 2_000_000  # a holder with a short queue keeps the turn this long before a waiter of its rank gets it
CORUN_NS = 500_000  # a launch goes beside the holder while both queues are shorter than this
BESIDE_DUE_NS = 100_000  # a best-effort launch goes beside a due holder while the GPU's queue ends within this
BEST_EFFORT_QUEUE_NS = 2_000_000  # the most a best-effort holder queues while a group with a share takes turns
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


@njit
def give_up(ctx, region, dev, e, rank, t0, now, who):
    """Stop taking turns on dev (the process time-slices there from now on), count the wait, and record a
    turn_timeout event: the debt it reached and ``who`` held the turn (its id in turn words)."""
    debt = wait_debt(ctx, dev, t0) + (now - t0)
    CTX.set_turn_entry(ctx, dev, _NONE)
    count_wait(ctx, region, dev, e, rank, t0, now)
    events.record(CTX.get_region(ctx), L.EV_TURN_TIMEOUT, dev, 0, debt, who)


# --- looking up a device's entry --------------------------------------------------------

@njit
def entry(ctx, dev):
    """The turn entry of CUDA device dev (claimed in the file if new), or 1 when this device takes no turns.

    A launch looks it up once and hands it on: a call with several call sites in one callback is not
    inlined, and its status check would keep numba's exception path (the Python C API) in the callback."""
    a = CTX.get_turn_entry(ctx, dev)
    if likely(a != 0):
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


@njit(inline="always")
def takes_turns(ctx, dev):
    """This process takes turns on dev (looked up at its first launch there under turns)."""
    return CTX.get_turn_entry(ctx, dev) > _NONE


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


# --- accounting --------------------------------------------------------------------------

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


# --- handing over -----------------------------------------------------------------------

@njit
def free_turn(e, me):
    """Mark the turn free (its word keeps this process's id, which leaves the next turn to a waiter) and
    wake the sleepers."""
    TURN.store_freed_ns(e, np.uint64(monotonic_ns()))
    TURN.store_turn(e, np.uint64(me) << np.uint64(32))
    TURN.add_seq(e, 1)
    if TURN.load_sleepers(e) != 0:
        futex_wake(TURN.seq_at(e))


@njit
def give(ctx, region, dev, stream, force):
    """Hand the turn on dev over if this process holds it.

    If another process waits or has reserved the turn soon (or ``force``), first let this process's work
    on dev finish, on every stream (pyvgpu/jit/drain.py), then free the turn: the GPU never runs both. If
    nobody waits, the turn stays this process's until its queued work is estimated to end, with no wait:
    a process alone on the GPU never drains its queue.
    """
    e = CTX.get_turn_entry(ctx, dev)
    if e <= _NONE:
        return
    me = CTX.get_turn_id(ctx)
    w = TURN.load_turn(e)
    if holder(w) != me or (w & LOW32) == 0:
        return
    now = monotonic_ns()
    qend = np.int64(CTX.get_turn_qend(ctx, dev))
    count_held(ctx, region, dev, now, qend)
    if not force and not anyone_waits(e, me, now):
        TURN.cas_turn(e, w, word(me, qend) if qend > now else np.uint64(me) << np.uint64(32))
        return
    # Draining, the holder keeps the turn however long its work really takes (the lease follows an
    # estimate); it frees it right after.
    if TURN.cas_turn(e, w, word(me, now + MAX_LEASE_NS)) != w:
        return
    if D.drain(ctx, dev, stream) > 0:
        TURN.add_drains(e, 1)
        TURN.add_drain_ns(e, np.uint64(monotonic_ns() - now))
    count_held(ctx, region, dev, now, monotonic_ns())  # the work took longer than estimated: count that too
    CTX.set_turn_mine(ctx, dev, 0)
    free_turn(e, me)


@njit
def reserve(ctx, dev, rank, at):
    """This process's budget on dev is free again at ``at`` (ns): whoever holds the turn then hands it
    over in time."""
    e = CTX.get_turn_entry(ctx, dev)
    if e > _NONE:
        TURN.store_resv(e, rank, word(CTX.get_turn_id(ctx), at))


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


@njit(inline="always")
def lease_for(qend, now):
    """A lease that outlasts the queued work: a holder blocked on its own full queue keeps the turn."""
    return min(qend, now + MAX_LEASE_NS) + LEASE_NS


@njit
def must_yield(ctx, e, me, rank, dev, now, cost):
    """The holder hands over before this launch (see the module's rules)."""
    if more_urgent_waits(e, rank, me, now):
        return True
    start = device_queue_end(e, now)  # when this launch's kernel starts: after every process's queued work
    if unlikely(start + np.int64(cost) // 2 > reserved(e, rank, me, now)):
        return True
    if unlikely(waits(e, rank, me, now)):
        held = now - np.int64(CTX.get_turn_since(ctx, dev))
        return held >= SLICE_NS or (held >= MIN_TURN_NS and start <= now + CORUN_NS)
    return False


@njit
def corun(ctx, e, w, rank, dev, now, cost):
    """This launch may go beside the holder: its queue, the holder's and the GPU's are short, and it runs
    into nobody's reservation.

    A best-effort launch goes beside a due holder while the GPU's queue with its kernel ends within
    BESIDE_DUE_NS (a longer kernel only into an empty queue, one at a time): a launch-bound holder leaves
    the GPU idle most of its turn, and a neighbour that only filled it one kernel at a time got a tenth of
    what the GPU had left (an MLP beside a --sm 50 MLP), while the holder's next kernel waits at most
    BESIDE_DUE_NS behind the neighbour's (a launch-bound share beside 200 us kernels allowed CORUN_NS
    fell to half its speed). Never beside a high-priority holder, which keeps its turn's idle moments to
    itself, for its latency."""
    held_rank = TURN.load_rank(e)
    limit = CORUN_NS
    if rank > held_rank:
        if held_rank % 2 == 0:
            return False
        limit = BESIDE_DUE_NS
    held_until = to_ns((w & LOW32) - np.uint64(LEASE_NS >> UNIT_SHIFT), now)
    if held_until > now + limit:
        return False
    qend = np.int64(CTX.get_turn_qend(ctx, dev))
    if qend > now + limit:
        return False
    # The GPU's whole queue, not only the two estimates above: each process's own estimate leaves out the
    # other's kernels ahead of its own, so two processes that time-slice (both queues deep) would each see
    # a short queue of their own and go on going beside each other for good.
    start = device_queue_end(e, now)
    if start > now + limit:
        return False
    if rank > held_rank and start > now and start + np.int64(cost) > now + limit:
        return False  # beside a more urgent holder, a kernel goes into a busy queue only if it is short
    return start + np.int64(cost) <= reserved(e, rank, CTX.get_turn_id(ctx), now)


@njit
def keep(ctx, region, dev, stream, e, w, me, now, cost, rank):
    """The holder launches: its queue grows, its lease follows."""
    qend = queue_on_device(e, now, cost)
    CTX.set_turn_qend(ctx, dev, np.uint64(qend))
    until = lease_for(qend, now)
    if unlikely(ahead(units(until), w & LOW32) > (RENEW_NS >> UNIT_SHIFT)):  # about once in 100 us
        TURN.cas_turn(e, w, word(me, until))
        count_held(ctx, region, dev, now, qend)
    if unlikely(TURN.load_rank(e) != np.uint32(rank)):  # a group that starts or stops borrowing changes rank
        TURN.store_rank(e, rank)
    D.note_stream(ctx, dev, stream)


@njit
def finish_own(ctx, dev, stream):
    """Wait until this process's work on dev is done (every stream it launched on there, and this one);
    returns the ns it took, or 0 if there was nothing to wait for."""
    t = monotonic_ns()
    if D.drain(ctx, dev, stream) == 0:
        return np.int64(0)
    return monotonic_ns() - t


@njit
def join(ctx, dev, e, stream):
    """This process launched on dev outside the turns (before a group with a share came, or while none
    was there, ``turn_out``): that work is in nobody's queue estimate, so it is let finish before the
    process takes part. A GPU that already holds an uncounted queue keeps every estimate short: leases
    then lapse under real work and two spin groups time-slice for good (docs/compute.md)."""
    bit = np.uint64(1) << np.uint64(dev)
    out = CTX.get_turn_out(ctx)
    if out & bit == 0:
        return
    CTX.set_turn_out(ctx, out & ~bit)
    ns = finish_own(ctx, dev, stream)
    if ns > 0:
        TURN.add_joins(e, 1)
        TURN.add_join_ns(e, np.uint64(ns))


@njit
def lapsed(ctx, dev, e, stream):
    """This process held the turn and finds another holder: its lease lapsed before it handed over (it
    launched nothing for a while, or its queue ran longer than estimated), so it had no drain. Its own
    work is let finish before it launches again. A lease that lapsed under real work would otherwise
    leave both queues on the GPU, time-sliced, with every estimate short, and lapse again: a --sm 50
    spin group beside an unlimited one was held below its share that way, with no drain."""
    CTX.set_turn_mine(ctx, dev, 0)
    ns = finish_own(ctx, dev, stream)
    if ns > 0:
        TURN.add_lapses(e, 1)
        TURN.add_lapse_ns(e, np.uint64(ns))


@njit
def take(ctx, region, dev, e, stream, now, cost, rank, share):
    """Before a launch of cost ns on dev (turn entry e, from ``entry``) at rank: hold the turn, or go beside
    its holder, or wait. ``share``: the group has a share on dev (also while it borrows beyond it)."""
    if unlikely(e <= _NONE):
        return
    if unlikely(CTX.get_turn_out(ctx) != 0):
        join(ctx, dev, e, stream)
        now = monotonic_ns()
    me = CTX.get_turn_id(ctx)
    if share:
        mark_active(ctx, e, now)
    t0 = now
    w = TURN.load_turn(e)
    while likely(holder(w) == me and leased(w, now)):  # the holder's next launch: the usual case
        if unlikely(must_yield(ctx, e, me, rank, dev, now, cost)):
            TURN.add_preempts(e, 1)
            give(ctx, region, dev, stream, True)
            now = monotonic_ns()
            break
        if unlikely(rank >= L.RANK_HIGH_BEST_EFFORT
                    and np.int64(CTX.get_turn_qend(ctx, dev)) > now + BEST_EFFORT_QUEUE_NS
                    and np.int64(TURN.load_active(e)) > now):
            # a best-effort holder beside groups with a share: its queue stays short, so that it can hand
            # over quickly when one of them comes back
            if unlikely(stalled(ctx, dev, t0, now)):
                CTX.set_turn_mine(ctx, dev, 0)
                free_turn(e, me)
                give_up(ctx, region, dev, e, rank, t0, now, me)
                return
            sleep_ns(POLL_NS)
            now = monotonic_ns()
            w = TURN.load_turn(e)
            continue
        keep(ctx, region, dev, stream, e, w, me, now, cost, rank)
        count_wait(ctx, region, dev, e, rank, t0, now)
        return
    while True:
        seq = TURN.load_seq(e)
        w = TURN.load_turn(e)
        if holder(w) != me and CTX.get_turn_mine(ctx, dev) != 0:
            lapsed(ctx, dev, e, stream)
            now = monotonic_ns()
            continue
        if not leased(w, now):
            # Free, or its holder's lease ran out. It goes to the most urgent waiter, to a reservation due
            # now, and for a moment to a waiter other than the one who just handed it over.
            yield_to = (more_urgent_waits(e, rank, me, now)
                        or now + np.int64(cost) // 2 > reserved(e, rank, me, now)
                        or (holder(w) == me and now - t0 < HANDOFF_NS and waits(e, rank, me, now)))
            if not yield_to:
                heal_queue(e, now)
                qend = device_queue_end(e, now) + np.int64(cost)
                if TURN.cas_turn(e, w, word(me, lease_for(qend, now))) == w:
                    CTX.set_turn_mine(ctx, dev, 1)
                    TURN.store_rank(e, rank)
                    qend = queue_on_device(e, now, cost)
                    CTX.set_turn_qend(ctx, dev, np.uint64(qend))
                    CTX.set_turn_since(ctx, dev, np.uint64(now))
                    count_held(ctx, region, dev, now, qend)
                    mine = word(me, 0) & ~LOW32
                    for r in range(L.N_RANKS):  # this process no longer waits, nor holds a reservation
                        x = TURN.load_want(e, r)
                        if x & ~LOW32 == mine:
                            TURN.cas_want(e, r, x, 0)
                        x = TURN.load_resv(e, r)
                        if x & ~LOW32 == mine:
                            TURN.cas_resv(e, r, x, 0)
                    if holder(w) != me:
                        TURN.add_handovers(e, 1)
                        freed = np.int64(TURN.load_freed_ns(e))
                        if (w & LOW32) == 0 and 0 < freed <= now:
                            TURN.add_gaps(e, 1)
                            TURN.add_gap_ns(e, np.uint64(now - freed))
                    count_wait(ctx, region, dev, e, rank, t0, now)
                    D.note_stream(ctx, dev, stream)
                    return
                continue
        elif holder(w) == me:  # another thread of this process holds it, or another rank of its gang
            if CTX.get_turn_mine(ctx, dev) == 0:  # a gang's rank: its slice counts from here (pyvgpu/jit/gang.py)
                CTX.set_turn_mine(ctx, dev, 1)
                CTX.set_turn_since(ctx, dev, np.uint64(now))
            CTX.set_turn_qend(ctx, dev, np.uint64(queue_on_device(e, now, cost)))
            D.note_stream(ctx, dev, stream)
            return
        elif corun(ctx, e, w, rank, dev, now, cost):
            TURN.add_coruns(e, 1)
            CTX.set_turn_qend(ctx, dev, np.uint64(queue_on_device(e, now, cost)))
            count_wait(ctx, region, dev, e, rank, t0, now)
            return
        if stalled(ctx, dev, t0, now):  # a holder that does not let go, or forged words: stop taking turns here
            give_up(ctx, region, dev, e, rank, t0, now, holder(w))
            return
        TURN.store_want(e, rank, word(me, now))
        TURN.add_sleepers(e, 1)
        futex_wait(TURN.seq_at(e), seq, POLL_NS)
        TURN.sub_sleepers(e, 1)
        now = monotonic_ns()
