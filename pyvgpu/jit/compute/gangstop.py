"""A gang's hand-over: its ranks stop at the same collective, and the turn passes once all have stopped.

A gang's ranks (pyvgpu/jit/compute/gang.py) launch on their own devices, each as fast as its host thread
goes, and a hand-over stops each rank at its next launch. Stopped one by one, the ranks stop at different
collectives: a rank that had launched all-reduce n+1 while its peer stopped after n leaves a kernel queued
that waits inside its GPU for the peer's n+1, which comes only in the gang's next turn. Meanwhile the next
holder's kernels share that GPU with it, time-sliced, and the next holder's own collectives wait for that
slowed device: two gangs at 50/50 on two GPUs each got 25-29% (docs/compute.md, "Collectives").

So a gang hands over as one:

* the first rank that hands over marks the gang's turn *stopping* (``gang_stop``, for the gang's current
  turn, ``gang_epoch``); every other rank hands over at its next launch (turn.take), whatever its own
  slice or budget says; each drains its own queue under the turn (``gang_draining``), and the turn passes
  when as many ranks as the gang has devices have stopped, or STOP_WAIT_NS after the last drain ended (a
  rank that launches no more, or one process driving several devices);
* a rank's drain that runs past its queue's estimate waits for a peer's kernel (drain.py ``drain_gang``):
  it *asks* its peers to catch up (gang.py ``ask``). A rank that stopped, or holds for the budget, launches
  again while asked, one kernel at a time, each waited for; the peer's kernel the asker waits for is one of
  them. After each such kernel the asker withdraws its request (``gang_caught``), and asks again only if
  it still waits; the rank waits up to SETTLE_NS for that before its next launch: going on at once, it
  would queue the next collective before the asker saw its drain end, and stand ahead in its turn;
* bounded: a drain asks for CATCHUP_NS at most (drain.py), then hands the turn over anyway (``unmatched``)
  and waits for its kernel DRAIN_MAX_NS at most (``wait_left``: the peer may come only after its hold for
  its budget); a request that its asker stopped renewing is not obeyed.

No kernel names and no launch counts are compared: a rank launches until the asker's wait ends.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.jit.compute import drain as D
from pyvgpu.jit.compute import gang
from pyvgpu.jit.compute.turnword import LOW32, MAX_LEASE_NS, count_held, holder, wake, word
from pyvgpu.jit.runtime.fields import CTX, HDR, TURN
from pyvgpu.jit.runtime.intrinsics import futex_wait, monotonic_ns

STOP_WAIT_NS = 300_000  # after the last rank's drain, the turn stays the gang's this long for ranks yet to stop
SETTLE_NS = 100_000  # after a catch-up kernel ends, the longest a rank waits for its asker's drain to end
MAX_DUE_NS = 50_000_000  # a queue estimated to run longer than this is not waited for before asking
MAX_RANKS = 64  # more ranks stopped or draining than this: a count written by a member, not believed
STOP_FLAG = np.uint64(1 << 31)
COUNT = np.uint64((1 << 31) - 1)


@njit(inline="always")
def epoch(region):
    return np.uint64(HDR.load_gang_epoch(region))


@njit(inline="always")
def stopping(region):
    """A rank of the gang hands the gang's current turn over: every rank stops at its next launch."""
    v = HDR.load_gang_stop(region)
    return (v >> np.uint64(32)) == epoch(region) and (v & STOP_FLAG) != 0


@njit(inline="always")
def stopped(ctx, region):
    """This process stopped in the gang's current turn: it launches again in the gang's next one."""
    return CTX.get_gang_stopped(ctx) == epoch(region) + np.uint64(1)


@njit
def begin(region):
    """A rank of the gang took the turn afresh: no stop under way (the counts name the old epoch)."""
    HDR.add_gang_epoch(region, 1)


@njit(inline="always")
def _count(v, ep):
    """The count in a gang_stop or gang_draining word for epoch ep: 0 for another epoch or past MAX_RANKS."""
    n = v & COUNT
    return n if (v >> np.uint64(32)) == ep and n <= MAX_RANKS else np.uint64(0)


@njit
def _start(ctx, region):
    """This rank stops for the gang's current turn (marking it stopping) and counts as draining. Returns
    (the turn's epoch, whether it counts: not when another thread of the process stopped for it already,
    or the gang's next turn began meanwhile: looked at before each write, so that a rank that read the
    epoch and was preempted does not write an old turn's word over the next turn's)."""
    ep = epoch(region)
    old = CTX.get_gang_stopped(ctx)
    if old == ep + np.uint64(1) or CTX.cas_gang_stopped(ctx, old, ep + np.uint64(1)) != old:
        return ep, False
    while True:
        old = HDR.load_gang_stop(region)
        new = (ep << np.uint64(32)) | STOP_FLAG | _count(old, ep)
        if epoch(region) != ep:
            return ep, False
        if old == new or HDR.cas_gang_stop(region, old, new) == old:
            break
    while True:
        old = HDR.load_gang_draining(region)
        if epoch(region) != ep:
            return ep, False
        if HDR.cas_gang_draining(region, old, (ep << np.uint64(32)) | (_count(old, ep) + np.uint64(1))) == old:
            return ep, True


@njit
def _end(region, ep, stopped_too):
    """This rank's drain for the stop of epoch ep ended (``stopped_too``: it counts as stopped): (the ranks
    stopped in that turn, the ranks still draining); (0, 0) once the gang's next turn began."""
    if epoch(region) != ep:
        return np.uint64(0), np.uint64(0)
    while True:
        old = HDR.load_gang_draining(region)
        if (old >> np.uint64(32)) != ep:
            return np.uint64(0), np.uint64(0)
        n = _count(old, ep)
        d = n - np.uint64(1) if n > 0 else np.uint64(0)
        if HDR.cas_gang_draining(region, old, (ep << np.uint64(32)) | d) == old:
            break
    while True:
        old = HDR.load_gang_stop(region)
        if (old >> np.uint64(32)) != ep:
            return np.uint64(0), d
        n = _count(old, ep) + (np.uint64(1) if stopped_too else np.uint64(0))
        if n > MAX_RANKS:
            n = np.uint64(MAX_RANKS)
        if HDR.cas_gang_stop(region, old, (ep << np.uint64(32)) | STOP_FLAG | n) == old:
            return n, d


@njit
def _pass(region, e, me, ep, until):
    """Leave the gang's turn of epoch ep to lapse at ``until`` (0: now, waking the waiters), if the gang
    still holds it and no rank drains for it: the last drainer passes it."""
    while True:
        w = TURN.load_turn(e)
        if holder(w) != me or (w & LOW32) == 0 or epoch(region) != ep:
            return
        if _count(HDR.load_gang_draining(region), ep) != 0:
            return
        if until == 0:
            if TURN.cas_turn(e, w, np.uint64(me) << np.uint64(32)) == w:
                TURN.store_freed_ns(e, np.uint64(monotonic_ns()))
                wake(e, me)
                return
        elif TURN.cas_turn(e, w, word(me, until)) == w:
            TURN.store_freed_ns(e, np.uint64(until))  # when it lapses: the hand-over rule counts from then
            return


@njit
def give(ctx, region, dev, stream, e, me, g):
    """turn.give for a rank of gang g once the gang hands over: stop, drain (asking the peers to catch up
    while the drain waits for one of them), and pass the turn when every rank has stopped."""
    if stopped(ctx, region):
        return  # it stopped in this turn already: its catch-up launches drained their own work
    now = monotonic_ns()
    ep, counts = _start(ctx, region)  # counted as draining first: a peer that ends its drain now leaves it held
    if not counts:
        return
    while True:  # keep the turn through the drain, however long the work really takes
        w = TURN.load_turn(e)
        if holder(w) != me or (w & LOW32) == 0:
            _end(region, ep, False)  # the turn passed meanwhile
            return
        if TURN.cas_turn(e, w, word(me, now + MAX_LEASE_NS)) == w:
            break
    due = min(max(now, np.int64(CTX.get_turn_qend(ctx, dev))), now + MAX_DUE_NS)
    n, left, asked = D.drain_gang(ctx, dev, stream, region, due, due + D.STUCK_NS + D.CATCHUP_NS, True)
    end = monotonic_ns()
    if n > 0:
        TURN.add_drains(e, 1)
        TURN.add_drain_ns(e, np.uint64(end - now))
    if asked:  # (its drain withdrew its request)
        TURN.add_stucks(e, 1)
        TURN.add_stuck_ns(e, np.uint64(end - now))
    count_held(ctx, region, dev, now, end)
    CTX.set_turn_mine(ctx, dev, 0)
    stops, draining = _end(region, ep, True)
    if left != 0:  # no peer came: hand over, and wait a while for the kernel (it runs beside the next holder)
        TURN.add_unmatched(e, 1)
        _pass(region, e, me, ep, 0)
        D.wait_left(ctx, left)
    elif stops >= gang.size(g):
        _pass(region, e, me, ep, 0)
    elif draining == 0:
        _pass(region, e, me, ep, end + STOP_WAIT_NS)
@njit(inline="always")
def handed(e, t0, now, g):
    """When this process (or its gang) handed the turn over, as far as the hand-over rule goes: the wait's
    start, or for a gang's rank the turn's last free (its ranks' drains come between)."""
    if g == 0:
        return t0
    return max(t0, min(np.int64(TURN.load_freed_ns(e)), now))


@njit
def catch_up(ctx, region, dev, stream, e, now):
    """Whether this launch goes now to catch up with a peer whose drain waits for it (the gang holds the
    turn, and the request is fresh); it then skips the turn and its budget's hold, and ``settle`` follows it."""
    if not gang.asked(region, now) or holder(TURN.load_turn(e)) != CTX.get_turn_id(ctx):
        return False
    D.note_stream(ctx, dev, stream)
    return True


@njit
def settle(ctx, region, dev, stream, e):
    """After a catch-up launch: wait for this rank's work (the kernel may be the one its peer waits for),
    then up to SETTLE_NS for the peer's drain to end."""
    # not asking, and not for long: a kernel of its own that waits for a peer means it went past the asker
    # (the asker's kernel came earlier in its queue); that one waits for the gang's next turn, as an
    # unmatched one does
    now = monotonic_ns()
    n, left, _ = D.drain_gang(ctx, dev, stream, region, now, now + D.STUCK_NS, False)
    TURN.add_catchups(e, 1)
    gang.caught_up(region)
    now = monotonic_ns()
    until = now + SETTLE_NS
    while now < until:
        seq = HDR.load_gang_wake(region)
        if not gang.asked(region, now):
            return
        futex_wait(HDR.gang_wake_at(region), seq, until - now)
        now = monotonic_ns()


@njit
def hold_until(region, until):
    """A rank's hold for its budget (limiter.hold): sleep until ``until`` (ns), or until a peer asks the
    gang to catch up (then True)."""
    while True:
        now = monotonic_ns()
        seq = HDR.load_gang_wake(region)
        if gang.asked(region, now):
            return True
        if now >= until:
            return False
        futex_wait(HDR.gang_wake_at(region), seq, until - now)
