"""A gang's hand-over (pyvgpu/jit/compute/gangstop.py), its bookkeeping called in this process on a region
header, a process context and a turn entry of our own.

Handing the turn over, every rank of a gang stops, the turn passes once as many ranks as the gang has
devices have stopped (or a moment after the last drain), and a rank whose drain waits for a peer's kernel
asks its peers to launch until it ends. The drain itself needs a GPU (tests/gpu, and `pyvgpu bench sm
--workload allreduce --pair 50,50`).
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
from numba import cfunc, types

from pyvgpu.jit.compute import gang, gangstop, turnword
from pyvgpu.jit.runtime.fields import CTX, HDR, TURN

MS = 1_000_000
GID = 77


@cfunc(types.void(types.uint64), nopython=True, error_model="numpy")
def _begin(region):
    gangstop.begin(region)


@cfunc(types.uint64(types.uint64, types.uint64), nopython=True, error_model="numpy")
def _state(ctx, region):
    return np.uint64(gangstop.stopping(region)) | np.uint64(gangstop.stopped(ctx, region)) << np.uint64(1)


@cfunc(types.uint64(types.uint64, types.uint64), nopython=True, error_model="numpy")
def _start(ctx, region):
    ep, counts = gangstop._start(ctx, region)
    return ep if counts else ep | np.uint64(1 << 63)


@cfunc(types.uint64(types.uint64, types.uint64, types.boolean), nopython=True, error_model="numpy")
def _end(region, ep, stopped_too):
    stops, draining = gangstop._end(region, ep, stopped_too)
    return stops << np.uint64(32) | draining


@cfunc(types.void(types.uint64, types.uint64, types.uint32, types.uint64, types.int64), nopython=True,
       error_model="numpy")
def _pass(region, e, me, ep, until):
    gangstop._pass(region, e, me, ep, until)


@cfunc(types.boolean(types.uint64, types.int64), nopython=True, error_model="numpy")
def _asked(region, now):
    return gang.asked(region, now)


@cfunc(types.void(types.uint64, types.int64), nopython=True, error_model="numpy")
def _ask(region, now):
    gang.ask(region, now)


@cfunc(types.void(types.uint64, types.int64), nopython=True, error_model="numpy")
def _withdraw(region, mine):
    gang.withdraw(region, mine)


@cfunc(types.boolean(types.uint64, types.int64), nopython=True, error_model="numpy")
def _hold_until(region, until):
    return gangstop.hold_until(region, until)


U64 = ctypes.c_uint64
BEGIN = ctypes.CFUNCTYPE(None, U64)(_begin.address)
STATE = ctypes.CFUNCTYPE(U64, U64, U64)(_state.address)
START = ctypes.CFUNCTYPE(U64, U64, U64)(_start.address)
_END = ctypes.CFUNCTYPE(U64, U64, U64, ctypes.c_bool)(_end.address)
PASS = ctypes.CFUNCTYPE(None, U64, U64, ctypes.c_uint32, U64, ctypes.c_int64)(_pass.address)
ASKED = ctypes.CFUNCTYPE(ctypes.c_bool, U64, ctypes.c_int64)(_asked.address)
ASK = ctypes.CFUNCTYPE(None, U64, ctypes.c_int64)(_ask.address)
WITHDRAW = ctypes.CFUNCTYPE(None, U64, ctypes.c_int64)(_withdraw.address)
HOLD_UNTIL = ctypes.CFUNCTYPE(ctypes.c_bool, U64, ctypes.c_int64)(_hold_until.address)


def _buffer(size: int) -> tuple[np.ndarray, int]:
    buf = np.zeros(size // 8 + 16, dtype=np.uint64)
    return buf, (buf.ctypes.data + 63) & ~63


def _ranks(n: int):
    """A region header and n process contexts (the ranks)."""
    keep = [_buffer(HDR.SIZE)]
    keep += [_buffer(CTX.SIZE) for _ in range(n)]
    return keep, keep[0][1], [k[1] for k in keep[1:]]


def END(region: int, ep: int, stopped: bool = True) -> tuple[int, int]:  # noqa: N802 - an entry point
    v = _END(region, ep, stopped)
    return v >> 32, v & 0xFFFFFFFF


def _draining(region: int) -> int:
    return ctypes.c_uint64.from_address(region + HDR.OFF_gang_draining).value


def test_a_stop_stops_every_rank_of_the_turn_and_the_next_turn_none():
    keep, region, (a, b) = _ranks(2)
    assert STATE(a, region) == 0  # no stop under way, nobody stopped
    ep = START(a, region)  # rank a hands over: the gang's turn is stopping, a has stopped, b not yet
    assert STATE(a, region) == 0b11
    assert STATE(b, region) == 0b01
    assert START(b, region) == ep
    assert STATE(b, region) == 0b11
    assert END(region, ep) == (1, 1)  # a's drain ended: one rank stopped, one still draining
    assert END(region, ep) == (2, 0)  # b's: both stopped (the gang's two devices): the turn passes
    BEGIN(region)  # a rank takes the gang's next turn
    assert STATE(a, region) == 0 and STATE(b, region) == 0  # both launch again


def test_a_drain_that_ends_after_the_next_turn_began_counts_nowhere():
    """A drain of the old turn's stop leaves the next turn's counts alone: b, draining for the next stop,
    keeps the turn held (a count that a stale drain took down let the turn lapse under b's drain)."""
    keep, region, (a, b) = _ranks(2)
    old = START(a, region)
    BEGIN(region)  # the turn lapsed and was taken afresh while a drained
    assert STATE(b, region) == 0
    assert END(region, old) == (0, 0)
    new = START(b, region)
    assert new != old
    assert _draining(region) == (new << 32 | 1)  # b drains, counted for the new turn only
    START(a, region)
    assert END(region, new) == (1, 1)  # a's: b still drains


def test_a_rank_whose_turn_passed_before_its_drain_is_not_counted_as_draining():
    keep, region, (a,) = _ranks(1)
    ep = START(a, region)
    assert END(region, ep, False) == (0, 0)  # it had nothing to drain for: no stop counted


def test_forged_counts_are_not_believed():
    """Every member writes the header: a count of ranks draining past MAX_RANKS would keep the turn held
    for the drain lease, a second each hand-over, and a stop count at its top would carry into the epoch."""
    keep, region, (a,) = _ranks(1)
    ctypes.c_uint64.from_address(region + HDR.OFF_gang_draining).value = 1 << 31
    ctypes.c_uint64.from_address(region + HDR.OFF_gang_stop).value = 0xFFFFFFFF
    ep = START(a, region)
    assert END(region, ep) == (1, 0)
    ctypes.c_uint64.from_address(region + HDR.OFF_gang_stop).value = (ep << 32) | (1 << 31) | 0x7FFFFFFF
    assert END(region, ep)[0] == 1  # a stop count past MAX_RANKS reads as none, plus this rank


def test_the_epochs_wrap_without_a_rank_staying_stopped():
    keep, region, (a,) = _ranks(1)
    ctypes.c_uint32.from_address(region + HDR.OFF_gang_epoch).value = 0xFFFFFFFF
    START(a, region)
    assert STATE(a, region) == 0b11
    BEGIN(region)  # the epoch wraps to 0
    assert STATE(a, region) == 0


def _entry():
    keep = _buffer(TURN.SIZE)
    return keep, keep[1]


def _turn(e: int) -> int:
    return ctypes.c_uint64.from_address(e + TURN.OFF_turn).value


def test_the_turn_passes_now_or_lapses_soon_and_only_while_the_gang_holds_it():
    keep, e = _entry()
    keepr, region, (a, b) = _ranks(2)
    now = time.monotonic_ns()
    lease = (now + 1000 * MS) >> 10 & 0xFFFFFFFF
    ctypes.c_uint64.from_address(e + TURN.OFF_turn).value = GID << 32 | lease
    ep = START(a, region)
    soon = now + 300_000
    PASS(region, e, GID, ep, soon)  # a still drains: the last drainer passes the turn
    assert _turn(e) == GID << 32 | lease
    END(region, ep)
    PASS(region, e, GID, ep, soon)  # ranks yet to stop: the turn lapses soon
    assert _turn(e) == GID << 32 | (soon >> 10 & 0xFFFFFFFF)
    seq = ctypes.c_uint32.from_address(e + TURN.OFF_seq).value
    PASS(region, e, GID, ep, 0)  # every rank stopped: free now, waiters woken
    assert _turn(e) == GID << 32
    assert ctypes.c_uint32.from_address(e + TURN.OFF_seq).value == seq + 1
    other = 5 << 32 | lease
    ctypes.c_uint64.from_address(e + TURN.OFF_turn).value = other  # another group took it meanwhile
    PASS(region, e, GID, ep, 0)
    PASS(region, e, GID, ep, soon)
    assert _turn(e) == other  # left alone
    ctypes.c_uint64.from_address(e + TURN.OFF_turn).value = GID << 32 | lease
    BEGIN(region)  # the gang's next turn: a late pass of the old one leaves it alone
    PASS(region, e, GID, ep, soon)
    assert _turn(e) == GID << 32 | lease


def test_a_request_to_catch_up_is_obeyed_while_fresh_only():
    keep, region, _ = _ranks(0)
    now = 10_000 * MS
    assert not ASKED(region, now)
    ASK(region, now)
    assert ASKED(region, now) and ASKED(region, now + gang.ASK_FRESH_NS)
    assert not ASKED(region, now + gang.ASK_FRESH_NS + 1)  # its asker stopped renewing it
    assert not ASKED(region, now - 1)  # from the future: written by a member, not obeyed
    WITHDRAW(region, now + 5)  # not its request: another asker's stays
    assert ASKED(region, now)
    WITHDRAW(region, now)
    assert not ASKED(region, now)


def test_a_held_rank_wakes_when_a_peer_asks():
    """A rank holding for its budget (limiter.hold) leaves its hold when a peer's drain asks for it, and
    sleeps to the end of it otherwise."""
    keep, region, _ = _ranks(0)
    start = time.monotonic_ns()
    assert not HOLD_UNTIL(region, start + 2 * MS)  # nobody asks: it holds to the end
    assert time.monotonic_ns() >= start + 2 * MS

    def asker():
        time.sleep(0.05)
        ASK(region, time.monotonic_ns())

    t = threading.Thread(target=asker)
    t.start()
    # a 60 s hold: without the wake-up the test would end on its timeout, not on a figure
    assert HOLD_UNTIL(region, time.monotonic_ns() + 60_000 * MS)
    t.join()


@cfunc(types.void(types.uint64, types.uint32), nopython=True, error_model="numpy")
def _free(e, me):
    turnword.free_turn(e, me)


def test_freeing_the_turn_keeps_the_id_and_wakes():
    keep, e = _entry()
    ctypes.c_uint64.from_address(e + TURN.OFF_turn).value = GID << 32 | 12345
    turnword_free = ctypes.CFUNCTYPE(None, U64, ctypes.c_uint32)(_free.address)
    turnword_free(e, GID)
    assert _turn(e) == GID << 32
    assert ctypes.c_uint32.from_address(e + TURN.OFF_seq).value == 1




def test_a_second_thread_of_a_stopped_process_does_not_count_again():
    """Two threads of one rank both hand over: the process counts once, or the turn would pass before a real
    peer has stopped, its queue undrained."""
    keep, region, (a,) = _ranks(1)
    ep = START(a, region)
    assert START(a, region) == ep | (1 << 63)  # the second: not counted
    assert _draining(region) == (ep << 32 | 1)
    assert END(region, ep) == (1, 0)
