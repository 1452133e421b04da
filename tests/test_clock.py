"""The launch path's clock (pyvgpu/jit/runtime/clock.py): the TSC, anchored to CLOCK_MONOTONIC.

Called in this process on a context of our own, so every check is against
``time.monotonic_ns`` read just before and just after.
"""

from __future__ import annotations

import ctypes
import platform
import threading
import time

import numpy as np
import pytest
from numba import cfunc, types

from pyvgpu.jit.runtime import clock
from pyvgpu.jit.runtime.fields import CTX

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the TSC clock is x86-64's")

TOL_NS = 10_000  # far above the clock's error (anchors exact to ~1 us, the first rate to ~3e-4 over 1 ms)


@cfunc(types.int64(types.uint64), nopython=True, error_model="numpy")
def _now(ctx):
    return clock.now(ctx)


NOW = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_uint64)(_now.address)


def _ctx(mode: int) -> tuple[np.ndarray, int]:
    buf = np.zeros(CTX.SIZE // 8 + 16, dtype=np.uint64)
    addr = (buf.ctypes.data + 63) & ~63
    ctypes.c_uint32.from_address(addr + CTX.OFF_clk_mode).value = mode
    return buf, addr


def _field(addr: int, name: str) -> int:
    return ctypes.c_uint64.from_address(addr + getattr(CTX, f"OFF_{name}")).value


def _check_for(addr: int, seconds: float) -> int:
    """Call the clock against time.monotonic_ns for a while; returns the calls."""
    end = time.monotonic_ns() + int(seconds * 1e9)
    calls = 0
    while True:
        before = time.monotonic_ns()
        got = NOW(addr)
        after = time.monotonic_ns()
        assert before - TOL_NS <= got <= after + TOL_NS, (before, got, after)
        calls += 1
        if after > end:
            return calls


def test_the_tsc_clock_follows_the_system_clock():
    buf, ctx = _ctx(1)
    _check_for(ctx, 0.3)
    assert _field(ctx, "clk_mult") != 0  # the rate was measured: it extrapolates between anchors
    assert _field(ctx, "clk_span") != 0
    assert _field(ctx, "clk_seq") % 2 == 0


def test_an_anchor_that_disagrees_measures_the_rate_again():
    buf, ctx = _ctx(1)
    _check_for(ctx, 0.05)
    assert _field(ctx, "clk_mult") != 0
    # the anchor 30 us off (as after a jump of the counter): the next anchor finds it and starts over
    ctypes.c_uint64.from_address(ctx + CTX.OFF_clk_ns).value = _field(ctx, "clk_ns") + 30_000
    time.sleep(0.002)  # past the anchor's span: the next call anchors
    before = time.monotonic_ns()
    got = NOW(ctx)
    assert before <= got <= time.monotonic_ns()
    assert ctypes.c_uint32.from_address(ctx + CTX.OFF_clk_resets).value == 1
    assert _field(ctx, "clk_mult") == 0  # measuring again: the system clock meanwhile
    _check_for(ctx, 0.05)
    assert _field(ctx, "clk_mult") != 0


def test_the_system_clock_mode_reads_the_system_clock():
    buf, ctx = _ctx(0)
    _check_for(ctx, 0.02)
    assert _field(ctx, "clk_seq") == 0 and _field(ctx, "clk_mult") == 0  # never anchored


def test_threads_share_the_anchor():
    buf, ctx = _ctx(1)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _check_for(ctx, 0.3)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    assert _field(ctx, "clk_seq") % 2 == 0
