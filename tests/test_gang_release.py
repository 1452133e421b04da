"""A gang's common release (pyvgpu/jit/compute/gang.py), called in this process on a region header of our own.

The ranks of a gang (a group launching under a share on several devices) leave a hold at one instant, so
that their collective kernels meet instead of one waiting inside the GPU for the other: a rank that holds
publishes its release, while it is ahead every rank's launch holds until it, and a rank that wakes before a
later release sleeps on to it. On two H100s this took an NCCL all-reduce under --sm 30 / 50 / 90 from 6.6 /
23.7 / 88.7% of its raw throughput to 29.7 / 51.2 / 91.4% (docs/measurements.md).
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import cfunc, types

from pyvgpu.jit.compute import gang
from pyvgpu.jit.runtime.fields import HDR

MS = 1_000_000
BATCH = 10 * MS
NOW = 5_000 * MS


@cfunc(types.int64(types.uint64, types.int64, types.int64, types.int64), nopython=True, error_model="numpy")
def _common_wait(region, wait, now, batch):
    w, holds = gang.common_wait(region, wait, now, batch)
    return w if holds else -(1 << 62)  # "goes now" apart from any wait


@cfunc(types.void(types.uint64, types.int64, types.int64), nopython=True, error_model="numpy")
def _publish(region, until, now):
    gang.publish_release(region, until, now)


@cfunc(types.int64(types.uint64, types.int64), nopython=True, error_model="numpy")
def _follow(region, now):
    return gang.follow_release(region, now)


COMMON_WAIT = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_int64)(_common_wait.address)
_PUBLISH = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int64)(_publish.address)


def PUBLISH(region: int, until: int, now: int = NOW) -> None:  # noqa: N802 - reads like the other entry points
    _PUBLISH(region, until, now)
FOLLOW = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64)(_follow.address)
GOES = -(1 << 62)


def _header() -> tuple[np.ndarray, int]:
    buf = np.zeros(HDR.SIZE // 8 + 16, dtype=np.uint64)
    return buf, (buf.ctypes.data + 63) & ~63


def _release(addr: int) -> int:
    return ctypes.c_uint64.from_address(addr + HDR.OFF_gang_release).value


def test_without_a_release_ahead_the_own_budget_decides():
    buf, region = _header()
    assert COMMON_WAIT(region, -3 * MS, NOW, BATCH) == GOES  # budget left: it goes
    assert COMMON_WAIT(region, 4 * MS, NOW, BATCH) == 4 * MS  # budget spent: it holds that long
    PUBLISH(region, NOW - 1)  # a release already passed
    assert COMMON_WAIT(region, -3 * MS, NOW, BATCH) == GOES
    assert COMMON_WAIT(region, 4 * MS, NOW, BATCH) == 4 * MS


def test_a_rank_with_budget_left_still_holds_until_a_release_ahead():
    """Its peer holds until NOW + 7 ms: going now, its collective would wait 7 ms inside the GPU for the peer's.
    hold() sleeps the batch beyond the wait it is given, so the wait is 7 ms less a batch: until the release."""
    buf, region = _header()
    PUBLISH(region, NOW + 7 * MS)
    assert COMMON_WAIT(region, -3 * MS, NOW, BATCH) == 7 * MS - BATCH
    assert COMMON_WAIT(region, 0, NOW, BATCH) == 7 * MS - BATCH


def test_a_rank_whose_budget_says_later_holds_longer_and_publishes_it():
    buf, region = _header()
    PUBLISH(region, NOW + 7 * MS)
    assert COMMON_WAIT(region, 9 * MS, NOW, BATCH) == 9 * MS  # its own, later
    PUBLISH(region, NOW + 9 * MS + BATCH)  # what hold() then publishes
    assert _release(region) == NOW + 9 * MS + BATCH
    # the first rank wakes at its release and follows the later one instead of leaving alone
    assert FOLLOW(region, NOW + 7 * MS) == NOW + 9 * MS + BATCH


def test_the_release_only_moves_later():
    buf, region = _header()
    PUBLISH(region, NOW + 9 * MS)
    PUBLISH(region, NOW + 2 * MS)  # a rank whose hold ends sooner does not pull the others' release back
    assert _release(region) == NOW + 9 * MS
    assert FOLLOW(region, NOW + 9 * MS) == 0  # reached: nothing later to follow
    assert FOLLOW(region, NOW + 10 * MS) == 0


def test_a_release_no_rank_obeys_is_replaced_by_the_next_one():
    """A value more than the bound ahead (forged, or left in a region file from before a reboot, when the
    clock started again near 0) or negative as a signed count must not keep every later release out."""
    for stale in (NOW + 3600 * 1000 * MS, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        buf, region = _header()
        ctypes.c_uint64.from_address(region + HDR.OFF_gang_release).value = stale
        PUBLISH(region, NOW + 7 * MS)
        assert _release(region) == NOW + 7 * MS, hex(stale)
        assert COMMON_WAIT(region, -3 * MS, NOW, BATCH) == 7 * MS - BATCH


def test_a_release_too_far_ahead_is_not_obeyed():
    """The header is writable by every process of the group: a forged release an hour ahead must not stop the
    others' launches (or make them sleep) for longer than the bound."""
    buf, region = _header()
    PUBLISH(region, NOW + 3600 * 1000 * MS)
    assert COMMON_WAIT(region, -3 * MS, NOW, BATCH) == GOES
    assert COMMON_WAIT(region, 4 * MS, NOW, BATCH) == 4 * MS
    assert FOLLOW(region, NOW) == 0
    ahead = NOW + gang.RELEASE_MAX_NS  # at the bound: still obeyed
    ctypes.c_uint64.from_address(region + HDR.OFF_gang_release).value = ahead
    assert COMMON_WAIT(region, 0, NOW, BATCH) == gang.RELEASE_MAX_NS - BATCH
    assert FOLLOW(region, NOW) == ahead


@cfunc(types.uint32(types.uint32), nopython=True, error_model="numpy")
def _checked(g):
    return gang.checked(g)


CHECKED = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32)(_checked.address)


def test_a_gang_word_out_of_range_is_no_gang():
    """Every member can write ``sm_gang``: a lead device or a count past the region's devices would index
    outside them (the budget's CAS then writes into whatever lies there), so such a word is read as none."""
    from pyvgpu.contract import layout

    for devs in (0b11, 0b1010, (1 << layout.MAX_DEVICES) - 1):
        low = (devs & -devs).bit_length()  # the words gang.word makes: (lowest + 1) | count << 8
        g = low | (bin(devs).count("1") << 8)
        assert CHECKED(g) == g, hex(g)
    for forged in (0xFF | (2 << 8), 0 | (2 << 8), (layout.MAX_DEVICES + 1) | (2 << 8), 1 | (1 << 8),
                   1 | ((layout.MAX_DEVICES + 1) << 8), 0xFFFFFFFF):
        assert CHECKED(forged) == 0, hex(forged)
