"""Draining: before a process hands a device's turn over, the work it queued on every stream is done.

A CUDA event recorded on a stream completes when the work queued on that
stream before it is done, and only that stream's. A process that launches on
several streams (PyTorch's side streams, NCCL's, a data loader's copies) has
work on each; draining one of them let the rest run into the next holder's
turn. So the process keeps a small table of the streams it launched on under
turns (``ctx.turn_stream``; a lookup per launch, usually one compare), and a
drain records an event on each stream of the device, then waits for them all.

Rules that keep it safe:

* A stream that captures a graph is skipped: nothing queued on it runs now,
  and recording on it would add a node to the graph.
* cuStreamDestroy removes the stream from the table first (``stream_destroy``,
  a hooked call), under the same spinlock a drain holds while it records and
  waits, so a drain never records on a stream that is gone.
* Events belong to a context: a drain only records on the streams of the
  calling thread's current context.
* Launches on a stream that found the table full are counted
  (``turn_streams_lost``); its work is drained only when the launch that
  hands over is on it.
* The per-thread default stream of another thread cannot be named from this
  one (its handle means the caller's own); work there is drained when that
  thread hands over.
* No drain waits longer than DRAIN_MAX_NS (the drain's lease): it looks at
  its events (cuEventQuery) rather than sleeping in cuEventSynchronize. A
  collective's kernel waits inside the GPU for its peers, and a peer held
  for its budget or for the turn may come seconds later; past the bound the
  work runs on beside the next holder, as it does when a lease lapses.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.compute import gang
from pyvgpu.jit.compute.turnword import MAX_LEASE_NS
from pyvgpu.jit.runtime.context import HELPER, call_real
from pyvgpu.jit.runtime.fields import CTX, HDR
from pyvgpu.jit.runtime.intrinsics import likely, load_i32, load_u64, monotonic_ns, sleep_ns, stack_u64, yield_cpu

STUCK_NS = 300_000  # a gang rank's drain this long past its queue's estimated end waits for a peer's kernel
CATCHUP_NS = 5_000_000  # the longest it asks its peers to catch up, per drain (then the turn passes anyway)
REASK_NS = 100_000  # after a peer caught up by a kernel, how long before it asks again if it still waits
DRAIN_MAX_NS = MAX_LEASE_NS  # the longest any drain waits: as long as the drain's lease holds the turn
LONG_NS = 1_000_000  # a wait this long past its queue's estimated end looks at its events 20 times a millisecond
UNLISTED = L.TURN_STREAMS  # the bit of a drain's unlisted stream (``_record_unlisted``), after the table's


@njit
def lock(ctx):
    while CTX.cas_turn_stream_lock(ctx, 0, 1) != 0:
        yield_cpu()


@njit
def unlock(ctx):
    CTX.store_turn_stream_lock(ctx, 0)


@njit(inline="always")
def note_stream(ctx, dev, stream):
    """Remember that this process launches on stream (of device dev) under turns. A launch on a stream it
    knows costs a compare or two; a new stream takes the lock once."""
    key = stream + np.uint64(1)
    for i in range(L.TURN_STREAMS):
        k = CTX.get_turn_stream(ctx, i)
        if likely(k == key and CTX.get_turn_stream_dev(ctx, i) == np.uint64(dev)):
            return
    add_stream(ctx, dev, stream)


@njit
def add_stream(ctx, dev, stream):
    key = stream + np.uint64(1)
    cur = stack_u64()
    if HELPER.cuCtxGetCurrent(ctx, cur) != abi.CUDA_SUCCESS or load_u64(cur) == 0:
        return
    lock(ctx)
    free = -1
    for i in range(L.TURN_STREAMS):
        k = CTX.get_turn_stream(ctx, i)
        if k == key and CTX.get_turn_stream_dev(ctx, i) == np.uint64(dev):
            free = -2  # another thread added it meanwhile
            break
        if k == 0 and free == -1:
            free = i
    if free >= 0:
        CTX.set_turn_stream_dev(ctx, free, np.uint64(dev))
        CTX.set_turn_stream_ctx(ctx, free, load_u64(cur))
        CTX.set_turn_stream_ev(ctx, free, 0)
        CTX.store_turn_stream(ctx, free, key)
    elif free == -1:
        CTX.add_turn_streams_lost(ctx, 1)
    unlock(ctx)


@njit
def _capturing(ctx, stream):
    status = stack_u64()
    return HELPER.cuStreamIsCapturing(ctx, stream, status) != abi.CUDA_SUCCESS or load_i32(status) != 0


@njit
def _record(ctx, i, stream):
    """Record table entry i's event on its stream (created in the current context if new); True if recorded."""
    ev = CTX.get_turn_stream_ev(ctx, i)
    if ev == 0:
        out = stack_u64()
        if HELPER.cuEventCreate(ctx, out, abi.CU_EVENT_DISABLE_TIMING) != abi.CUDA_SUCCESS:
            return False
        ev = load_u64(out)
        CTX.set_turn_stream_ev(ctx, i, ev)
    return HELPER.cuEventRecord(ctx, ev, stream) == abi.CUDA_SUCCESS


@njit
def _record_unlisted(ctx, stream, cur):
    """The launching stream when the table had no room for it: one event of its own (``UNLISTED``); True
    if recorded."""
    ev = CTX.get_drain_ev(ctx)
    if ev != 0 and CTX.get_drain_ctx(ctx) != cur:
        HELPER.cuEventDestroy_v2(ctx, ev)
        ev = np.uint64(0)
        CTX.set_drain_ev(ctx, 0)
    if ev == 0:
        out = stack_u64()
        if HELPER.cuEventCreate(ctx, out, abi.CU_EVENT_DISABLE_TIMING) != abi.CUDA_SUCCESS:
            return False
        ev = load_u64(out)
        CTX.set_drain_ev(ctx, ev)
        CTX.set_drain_ctx(ctx, cur)
    return HELPER.cuEventRecord(ctx, ev, stream) == abi.CUDA_SUCCESS


@njit(inline="always")
def _event(ctx, i):
    """The event of entry i of a drain's bits: the table's, or the unlisted stream's (``UNLISTED``)."""
    return CTX.get_drain_ev(ctx) if i == UNLISTED else CTX.get_turn_stream_ev(ctx, i)


@njit
def _record_all(ctx, dev, key, cur):
    """Under the lock: record an event on each stream of the table on device dev in context cur. Returns
    (the entries recorded, a bit each; their count; whether the table lists stream ``key - 1``)."""
    listed = False
    recorded = np.uint64(0)
    n = 0
    for i in range(L.TURN_STREAMS):
        k = CTX.get_turn_stream(ctx, i)
        if k == 0 or CTX.get_turn_stream_dev(ctx, i) != np.uint64(dev) or CTX.get_turn_stream_ctx(ctx, i) != cur:
            continue
        if k == key:
            listed = True
        s = k - np.uint64(1)
        if _capturing(ctx, s):
            continue
        if _record(ctx, i, s):
            recorded |= np.uint64(1) << np.uint64(i)
            n += 1
    return recorded, n, listed


@njit
def drain(ctx, dev, stream):
    """Wait until the work this process queued on device dev, on every stream it launched on there, is
    done, or DRAIN_MAX_NS at most (then its work runs on beside the next holder, as under a lapsed lease).
    Returns the number of streams waited for."""
    now = monotonic_ns()
    n, _, _ = drain_gang(ctx, dev, stream, np.uint64(0), now, now + DRAIN_MAX_NS, False)
    return n


@njit
def _wait(ctx, recorded, region, due, until, ask):
    """Under the lock (no event is destroyed while it is waited for): look at the events of ``recorded`` (a
    bit each, ``_event``) until all are done or ``until`` passed, asking the gang's ranks to catch up as
    ``drain_gang`` says. Returns (the entries still not done, whether it asked)."""
    asked = False
    mine = np.int64(0)  # the time its request carries, while it asks
    seen = np.uint32(0)
    while recorded != 0:
        for i in range(UNLISTED + 1):
            b = np.uint64(1) << np.uint64(i)
            if recorded & b:
                ev = _event(ctx, i)
                if ev == 0 or HELPER.cuEventQuery(ctx, ev) != abi.CUDA_ERROR_NOT_READY:  # 0: its stream is gone
                    recorded &= ~b
        if recorded == 0:
            break
        now = monotonic_ns()
        if now > until:
            break
        if mine != 0 and HDR.load_gang_caught(region) != seen:  # a peer caught up by a kernel
            gang.withdraw(region, mine)
            mine = np.int64(0)
            due = now + REASK_NS - STUCK_NS
        if ask and now > due + STUCK_NS and (mine == 0 or now - mine >= gang.ASK_RENEW_NS):
            if mine == 0:
                seen = HDR.load_gang_caught(region)
            gang.ask(region, now)
            mine = now
            asked = True
        if due - now > 100_000 or now - due > LONG_NS:
            sleep_ns(50_000)  # the queue is estimated to run on, or the wait is long already: no need to look at once
        else:
            yield_cpu()
    if mine != 0:
        gang.withdraw(region, mine)
    return recorded, asked


@njit
def _record_mine(ctx, dev, stream, cur):
    """Under the lock: record an event on each stream this process launched on on device dev in context cur,
    and on ``stream`` when the table had no room for it. Returns (the entries recorded, a bit each; their
    count)."""
    recorded, n, listed = _record_all(ctx, dev, stream + np.uint64(1), cur)
    if not listed and not _capturing(ctx, stream) and _record_unlisted(ctx, stream, cur):
        recorded |= np.uint64(1) << np.uint64(UNLISTED)
        n += 1
    return recorded, n


@njit
def drain_gang(ctx, dev, stream, region, due, until, ask):
    """``drain`` for a rank of a gang (pyvgpu/jit/compute/gangstop.py): it looks at its events instead of
    sleeping on them, up to ``until``. Once it runs STUCK_NS past ``due`` (when its queue was estimated to
    end) it waits for a peer's kernel and (``ask``) asks the gang's ranks to catch up (``gang.ask``); once a
    rank caught up by a kernel, it withdraws the request and asks again REASK_NS later if it still waits.
    Returns (streams waited for, the entries whose work was still not done at ``until`` (a bit each:
    ``wait_left`` waits for them), whether it asked)."""
    out = stack_u64()
    if HELPER.cuCtxGetCurrent(ctx, out) != abi.CUDA_SUCCESS or load_u64(out) == 0:
        return 0, np.uint64(0), False
    cur = load_u64(out)
    lock(ctx)
    recorded, n = _record_mine(ctx, dev, stream, cur)
    left, asked = _wait(ctx, recorded, region, due, until, ask)
    unlock(ctx)
    return n, left, asked


@njit
def idle(ctx, dev, stream):
    """Whether the work this process queued on device dev is done, on every stream it launched on there:
    looked at once, no wait. False where it cannot tell (no context, nothing recorded, or another thread
    of the process holds the table's lock: it drains, and tells). A holder's queue estimate is open loop
    (turn.py ``take``): this is how a best-effort holder learns that its estimate ran ahead of the GPU."""
    out = stack_u64()
    if HELPER.cuCtxGetCurrent(ctx, out) != abi.CUDA_SUCCESS or load_u64(out) == 0:
        return False
    if CTX.cas_turn_stream_lock(ctx, 0, 1) != 0:
        return False
    recorded, n = _record_mine(ctx, dev, stream, load_u64(out))
    left, _ = _wait(ctx, recorded, np.uint64(0), np.int64(0), np.int64(0), False)  # until 0: one look
    unlock(ctx)
    return n > 0 and left == 0


@njit
def wait_left(ctx, left):
    """Wait for the entries a drain stopped waiting for (``drain_gang``), those whose stream still exists,
    DRAIN_MAX_NS at most: its peer's kernel may come only in the gang's next turn, after the peer's hold
    for its budget (then this rank's kernel runs on beside the next holder, as an unmatched one did)."""
    lock(ctx)
    now = monotonic_ns()
    _wait(ctx, left, np.uint64(0), now, now + DRAIN_MAX_NS, False)
    unlock(ctx)


@njit
def stream_destroy(ctx, idx, args, notfound):
    """cuStreamDestroy: forget the stream (and its drain event) before the driver frees it."""
    (stream,) = args
    key = stream + np.uint64(1)
    if CTX.get_turn_stream(ctx, 0) != 0:
        lock(ctx)
        for i in range(L.TURN_STREAMS):
            if CTX.get_turn_stream(ctx, i) == key:
                ev = CTX.get_turn_stream_ev(ctx, i)
                if ev != 0:
                    HELPER.cuEventDestroy_v2(ctx, ev)
                CTX.set_turn_stream_ev(ctx, i, 0)
                CTX.store_turn_stream(ctx, i, 0)
        unlock(ctx)
    return call_real(ctx, idx, args, notfound)
