"""The device turn: which process may fill a GPU's queue now.

Two contexts that both have deep queues on one GPU are time-sliced by the
hardware, and the slicing costs time nobody gets (docs/compute.md). So the
processes on a GPU take turns: every GPU (by UUID) has one entry in the
machine's turn file (pyvgpu/group/turnfile.py, layout SCHED_ENTRY); its turn word
(pyvgpu/jit/compute/turnword.py) names the process that holds the turn and until when
its lease runs: the holder's queued work (estimated by the cost model) plus
LEASE_NS, renewed as it launches. A holder that stops launching loses the turn
LEASE_NS after its queue runs dry, one that dies too.

The GPU runs every process's kernels one after another, so a process's own
estimate of its queue leaves out the kernels of others queued ahead of its
own. The entry keeps the GPU's whole queue (``qend``: every launch under
turns adds its cost, holder or not), and a launch's queue ends where it
lands in it (with only its own estimate, each of two time-slicing processes
saw its queue short and went beside the other for good).

The estimate adds up costs from when each launch was made, so it is open
loop, and the GPU must not hold work it never counted (else leases lapse
while the GPU holds both queues, the turn passes without a drain, and both
time-slice for good: docs/compute.md). Two rules keep it so:

* a process that launched on a GPU outside the turns lets that work finish
  before its first launch under them (``join``), and a process's first
  timed launch is waited for, so that it never queues on at cost 0
  (pyvgpu/jit/compute/launch.py);
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

Ranks (pyvgpu.contract.layout.RANK_*): a launch within its group's share is *due*; a
launch of a group without a share, or borrowing beyond its share
(``--sm-borrow``), is *best effort*; a high-priority group ranks before a low
one within each. (A high-priority group without a share stays best effort: ranked
before the shares it would starve them, and they would leave the turns once
their wait debt ran out.) The holder hands the turn over, after draining its
work (pyvgpu/jit/compute/drain.py) so that the GPU never holds both queues:

* at once, to a waiter of a more urgent rank (``queue_cap`` keeps that quick: a
  best-effort holder queues at most BEST_EFFORT_QUEUE_NS while a group with a
  share takes turns here, a low-priority one at most HIGH_QUEUE_NS while a
  high-priority group launches within its share here);
* before a *reservation* of its rank or a more urgent one would start: a
  group whose budget ran out says when it is free again (``resv``), and the
  holder stops queueing work that would run past that moment;
* to a waiter of its own rank, when its slice (SLICE_NS) is over, or when
  after MIN_TURN_NS its own queue is still short (it launches little: the
  waiter could not go beside it because its own queue is deep; a gang
  waiting for a gang, longer: ``least_turn``);
* when its limiter holds it back (pyvgpu/jit/compute/limiter.py).

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

from pyvgpu.contract import layout as L
from pyvgpu.jit.compute import drain as D
from pyvgpu.jit.compute import gangstop
from pyvgpu.jit.compute.gpuentry import find_entry
from pyvgpu.jit.compute.turnword import (  # noqa: F401 (launch.py and the tests read them here)
    _NONE,
    BESIDE_DUE_NS,
    BEST_EFFORT_QUEUE_NS,
    CORUN_NS,
    HANDOFF_NS,
    HIGH_QUEUE_NS,
    LEASE_NS,
    LOW32,
    MAX_LEASE_NS,
    MAX_WAIT_NS,
    POLL_NS,
    RENEW_NS,
    SLICE_NS,
    UNIT_SHIFT,
    active_on,
    ahead,
    anyone_waits,
    count_held,
    count_wait,
    device_queue_end,
    draw_id,
    free_turn,
    heal_queue,
    holder,
    lease_for,
    leased,
    least_turn,
    machine_active,
    mark_active,
    mark_high,
    more_urgent_waits,
    queue_cap,
    queue_on_device,
    ran_dry,
    reserved,
    share_waits,
    stalled,
    to_ns,
    units,
    wait_debt,
    waits,
    word,
)
from pyvgpu.jit.runtime.fields import CTX, TURN
from pyvgpu.jit.runtime.intrinsics import (
    futex_wait,
    likely,
    monotonic_ns,
    sleep_ns,
    unlikely,
)
from pyvgpu.jit.state import events


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
    sched = CTX.get_sched(ctx)
    a = find_entry(ctx, sched, dev)
    if sched != 0 and CTX.get_turn_id(ctx) == 0:
        CTX.set_turn_id(ctx, draw_id(sched, False))
    CTX.set_turn_entry(ctx, dev, a)
    if CTX.get_acct(ctx) == sched:  # taking turns, the group's charges add up in its turn entry (gpuentry.py)
        CTX.set_acct_entry(ctx, dev, a)
    return a


@njit(inline="always")
def takes_turns(ctx, dev):
    """This process takes turns on dev (looked up at its first launch there under turns)."""
    return CTX.get_turn_entry(ctx, dev) > _NONE


# --- handing over -----------------------------------------------------------------------

@njit
def give(ctx, region, dev, stream, force, g):
    """Hand the turn on dev over if this process holds it.

    If another process waits or has reserved the turn soon (or ``force``), first let this process's work
    on dev finish, on every stream (pyvgpu/jit/compute/drain.py), then free the turn: the GPU never runs both. If
    nobody waits, the turn stays this process's until its queued work is estimated to end, with no wait:
    a process alone on the GPU never drains its queue. A rank of gang g hands over with its peers
    (pyvgpu/jit/compute/gangstop.py).
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
    if not force and not anyone_waits(e, me, now) and not (g != 0 and gangstop.stopping(region)):
        TURN.cas_turn(e, w, word(me, qend) if qend > now else np.uint64(me) << np.uint64(32))
        return
    if g != 0:
        gangstop.give(ctx, region, dev, stream, e, me, g)
        return
    # Draining, the holder keeps the turn however long its work really takes (the lease follows an
    # estimate), up to the lease's MAX_LEASE_NS, which is also the drain's bound (drain.DRAIN_MAX_NS: a
    # kernel may wait inside the GPU for a peer held elsewhere); it frees it right after, drained or not.
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


@njit
def must_yield(ctx, e, me, rank, dev, now, cost, g):
    """The holder hands over before this launch (see the module's rules)."""
    if more_urgent_waits(e, rank, me, now):
        return True
    start = device_queue_end(e, now)  # when this launch's kernel starts: after every process's queued work
    if unlikely(start + np.int64(cost) // 2 > reserved(e, rank, me, now)):
        return True
    if unlikely(waits(e, rank, me, now)):
        held = now - np.int64(CTX.get_turn_since(ctx, dev))
        return held >= SLICE_NS or (held >= least_turn(e, rank, g) and start <= now + CORUN_NS)
    return False


@njit
def corun(ctx, e, w, rank, dev, now, cost):
    """This launch may go beside the holder: its queue, the holder's and the GPU's are short, and it runs
    into nobody's reservation.

    A best-effort launch goes beside a due holder while the GPU's queue with its kernel ends within
    BESIDE_DUE_NS (a longer kernel only into an empty queue, one at a time): a launch-bound holder leaves
    the GPU idle most of its turn, and a neighbour that only filled it one kernel at a time was starved
    (docs/compute.md), while the holder's next kernel waits at most BESIDE_DUE_NS behind the neighbour's
    (CORUN_NS there slowed a launch-bound share beside longer kernels). Never beside a high-priority
    holder, which keeps its turn's idle moments to itself, for its latency."""
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
    spin group beside an unlimited one was held below its share that way, with no drain. Bounded as every
    drain is (drain.DRAIN_MAX_NS): a gang's collective may wait for a peer that waits for the turn."""
    CTX.set_turn_mine(ctx, dev, 0)
    ns = finish_own(ctx, dev, stream)
    if ns > 0:
        TURN.add_lapses(e, 1)
        TURN.add_lapse_ns(e, np.uint64(ns))


@njit
def take(ctx, region, dev, e, stream, now, cost, rank, share, g):
    """Before a launch of cost ns on dev (turn entry e, from ``entry``) at rank: hold the turn, or go beside
    its holder, or wait. ``share``: the group has a share on dev (also while it borrows beyond it); g: its
    gang word. True if the launch goes to catch up with a peer of its gang (gangstop.settle follows it)."""
    if unlikely(e <= _NONE):
        return False
    if unlikely(CTX.get_turn_out(ctx) != 0):
        join(ctx, dev, e, stream)
        now = monotonic_ns()
    me = CTX.get_turn_id(ctx)
    if share:
        mark_active(ctx, e, now)
    if rank == L.RANK_HIGH_DUE:
        mark_high(e, now)
    t0 = now
    w = TURN.load_turn(e)
    while likely(holder(w) == me and leased(w, now)):  # the holder's next launch: the usual case
        if unlikely(must_yield(ctx, e, me, rank, dev, now, cost, g) or (g != 0 and gangstop.stopping(region))):
            TURN.add_preempts(e, 1)
            give(ctx, region, dev, stream, True, g)
            now = monotonic_ns()
            break
        capped = False
        qown = np.int64(CTX.get_turn_qend(ctx, dev))
        if unlikely(qown > now + HIGH_QUEUE_NS):  # no cap is shorter: a short queue reads no shared mark
            cap = queue_cap(e, rank, now)
            capped = cap != 0 and qown > now + cap
        if unlikely(capped):
            # a best-effort holder beside groups with a share, or a low-priority one beside a high-priority
            # group: its queue stays short, so that it can hand over quickly when one of them comes back
            if unlikely(stalled(ctx, dev, t0, now)):
                CTX.set_turn_mine(ctx, dev, 0)
                free_turn(e, me)
                give_up(ctx, region, dev, e, rank, t0, now, me)
                return False
            # the GPU ran its queue: the estimate ran ahead, not the work. Looked at on every poll: a gang's
            # ranks step together, so a late look at one rank's idle GPU delays every rank's next collective
            if D.idle(ctx, dev, stream):
                ran_dry(ctx, e, dev, now)
                continue
            sleep_ns(POLL_NS)
            now = monotonic_ns()
            w = TURN.load_turn(e)
            continue
        keep(ctx, region, dev, stream, e, w, me, now, cost, rank)
        count_wait(ctx, region, dev, e, rank, t0, now)
        return False
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
                        or (holder(w) == me and now - gangstop.handed(e, t0, now, g) < HANDOFF_NS
                            and waits(e, rank, me, now)))
            if not yield_to:
                heal_queue(e, now)
                qend = device_queue_end(e, now) + np.int64(cost)
                if g != 0:  # first: a late pass of the old turn must not touch the one taken next
                    gangstop.begin(region)  # the gang's next turn: its ranks launch again
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
                    return False
                continue
        elif holder(w) == me:  # another thread of this process holds it, or another rank of its gang
            if g != 0 and gangstop.stopping(region) and not gangstop.stopped(ctx, region):
                give(ctx, region, dev, stream, True, g)  # its gang hands over: it stops with it
                now = monotonic_ns()
                continue
            if g == 0 or not gangstop.stopped(ctx, region):
                # a gang's rank: its slice counts from here (pyvgpu/jit/compute/gang.py)
                if CTX.get_turn_mine(ctx, dev) == 0:
                    CTX.set_turn_mine(ctx, dev, 1)
                    CTX.set_turn_since(ctx, dev, np.uint64(now))
                CTX.set_turn_qend(ctx, dev, np.uint64(queue_on_device(e, now, cost)))
                D.note_stream(ctx, dev, stream)
                return False
            if gangstop.catch_up(ctx, region, dev, stream, e, now):  # stopped, and a peer waits for it
                return True
            # stopped for its gang's hand-over: it waits for the gang's next turn
        elif g == 0 and corun(ctx, e, w, rank, dev, now, cost):
            # (never a gang's rank: its collective beside another holder would wait inside the GPU for a
            # peer that waits for the turn, sharing the GPU with the holder's kernels meanwhile)
            TURN.add_coruns(e, 1)
            CTX.set_turn_qend(ctx, dev, np.uint64(queue_on_device(e, now, cost)))
            count_wait(ctx, region, dev, e, rank, t0, now)
            return False
        if stalled(ctx, dev, t0, now):  # a holder that does not let go, or forged words: stop taking turns here
            give_up(ctx, region, dev, e, rank, t0, now, holder(w))
            return False
        TURN.store_want(e, rank, word(me, now))
        futex_wait(TURN.seq_at(e), seq, POLL_NS)
        now = monotonic_ns()
