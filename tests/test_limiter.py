"""The compute budget's arithmetic (pyvgpu/jit/compute/limiter.py), called in this process on a context of our own."""

from __future__ import annotations

import ctypes

import numpy as np
from numba import cfunc, types

from pyvgpu.jit.compute import limiter
from pyvgpu.jit.runtime.fields import CTX


@cfunc(types.uint64(types.uint64, types.int64, types.uint64, types.uint32), nopython=True, error_model="numpy")
def _per_share(ctx, dev, x, limit):
    return limiter.per_share(ctx, dev, x, limit)


PER_SHARE = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint64,
                             ctypes.c_uint32)(_per_share.address)


def _ctx() -> tuple[np.ndarray, int]:
    buf = np.zeros(CTX.SIZE // 8 + 16, dtype=np.uint64)
    return buf, (buf.ctypes.data + 63) & ~63


def test_the_charge_divides_by_the_share_exactly_without_a_division():
    """x // share for every share 1-99: at random, next to multiples of the share (where a reciprocal that is
    one off shows), at the top of the multiply's range and past it (the division)."""
    buf, ctx = _ctx()
    rng = np.random.default_rng(17)
    top = 1 << 31
    for share in range(1, 100):
        xs = [0, 1, share - 1, share, share + 1, top - share, top - 1, top, top + 1, (1 << 40) + 7, (1 << 62) + 3]
        xs += [int(x) for x in rng.integers(0, top, 300)]
        xs += [int(k) * share + j for k in rng.integers(1, top // share, 100) for j in (-1, 0, 1)]
        for x in xs:
            assert PER_SHARE(ctx, 2, x, share) == x // share, (x, share)


def test_a_changed_share_is_charged_at_once():
    """The reciprocal is cached per device with the share it was made for: another share, or another device,
    never uses it."""
    buf, ctx = _ctx()
    x = 1_000_000_007
    assert PER_SHARE(ctx, 0, x, 30) == x // 30
    assert PER_SHARE(ctx, 0, x, 70) == x // 70  # a live change of the share
    assert PER_SHARE(ctx, 1, x, 3) == x // 3
    assert PER_SHARE(ctx, 0, x, 70) == x // 70
    word = ctypes.c_uint64.from_address(ctx + CTX.OFF_sm_recip).value  # device 0's
    assert word >> limiter.RECIP_SHIFT == 70, word


@cfunc(types.int64(types.uint64, types.boolean), nopython=True, error_model="numpy")
def _batch(ctx, gang):
    return limiter.batch_ns(ctx, gang)


BATCH = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_uint64, ctypes.c_bool)(_batch.address)


def test_a_gang_runs_a_longer_batch_ahead_of_its_share():
    """Beside another group a gang hands the turn over once a batch, and each hand-over costs a meeting of
    its ranks (gangstop.py): its batch is GANG_BATCH_NS at least; a longer one asked for is kept, and a group
    on one GPU keeps its own."""
    buf, ctx = _ctx()
    ctypes.c_uint64.from_address(ctx + CTX.OFF_sm_batch_ns).value = 10_000_000  # PYVGPU_SM_BATCH_MS's default
    assert BATCH(ctx, False) == 10_000_000
    assert BATCH(ctx, True) == limiter.GANG_BATCH_NS
    ctypes.c_uint64.from_address(ctx + CTX.OFF_sm_batch_ns).value = 400_000_000
    assert BATCH(ctx, True) == 400_000_000
