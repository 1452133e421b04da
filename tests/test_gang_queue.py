"""What a gang's rank adds to the lead device's turn queue (pyvgpu/jit/compute/gang.py ``queue_cost``)."""

from __future__ import annotations

import ctypes

from numba import cfunc, types

from pyvgpu.jit.compute import gang


@cfunc(types.uint64(types.uint32, types.uint64), nopython=True, error_model="numpy")
def _queue_cost(g, cost):
    return gang.queue_cost(g, cost)


QUEUE_COST = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64)(_queue_cost.address)


def test_a_rank_of_k_adds_a_kth_of_its_kernel():
    """Two ranks' 200 us collectives run side by side on two devices: the lead's queue grows 200 us per
    collective, not 400."""
    two = (0 + 1) | (2 << 8)  # lead device 0, two devices
    four = (2 + 1) | (4 << 8)
    assert QUEUE_COST(two, 200_000) == 100_000
    assert QUEUE_COST(four, 200_000) == 50_000
    assert 2 * QUEUE_COST(two, 200_000) == 200_000


def test_outside_a_gang_the_whole_kernel():
    assert QUEUE_COST(0, 200_000) == 200_000
