"""The controller's rule beside other groups and in a gang (pyvgpu/jit/compute/controller.py
``holding_ratio``), called in this process: where NVML's busy time holds what the group did not do (another
group's kernels, a rank waiting for its peers), the charge scale comes down on a clear over-charge and goes
back up only as far as the kernels' own timings."""

from __future__ import annotations

import ctypes

from numba import cfunc, types

from pyvgpu.jit.compute import controller
from pyvgpu.jit.compute.limiter import Q16


@cfunc(types.float64(types.float64, types.float64, types.float64), nopython=True, error_model="numpy")
def _ratio(u, everyone, scale):
    return controller.holding_ratio(u, everyone, scale)


RATIO = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double)(_ratio.address)


def test_a_clear_over_charge_brings_the_scale_down():
    assert RATIO(20.0, 100.0, Q16) == 0.2  # NVML 20% busy, the groups charged 100%
    assert RATIO(20.0, 100.0, Q16 / 4) == 0.2


def test_an_mlp_pair_charged_twice_its_busy_time_comes_down():
    """On an H100 an MLP pair taking turns was charged 79.6% together while NVML's samples saw the GPU 40%
    busy: above 0.4 of the charge, no step, and one group stayed held at its budget (27.6% of its speed, its
    peer 79.9%, time-sliced 105 each)."""
    assert RATIO(40.0, 79.6, Q16) == 0.0  # one period's figure: not a clear over-charge
    assert 40.0 < 79.6 * controller.HOLD_OVERCHARGED  # over a window it is (step's second rule)


def test_a_lowered_scale_goes_back_up_once_the_charge_is_no_longer_over():
    """A launch-bound phase lowered the scale to 1/16; the work is now compute-bound (NVML 90% busy, the
    scaled charges 10%): before, the scale stayed there and the gang ran at many times its share."""
    r = RATIO(90.0, 10.0, Q16 / 16)
    assert r > 1.0
    assert r <= 16.0  # never past the kernels' own timings
    assert RATIO(90.0, 80.0, Q16 / 2) == 90.0 / 80.0


def test_never_above_the_kernels_own_timings():
    """NVML's busy time holds a neighbour's kernels and a rank's wait for its peers: it never raises the
    charge past what the group's kernels took."""
    assert RATIO(90.0, 10.0, Q16) == 0.0
    assert RATIO(90.0, 10.0, 2 * Q16) == 0.0


def test_between_the_two_it_holds_still():
    """NVML between 0.4 and 1 of the charges in one period: neither clearly over-charged nor under, no step
    (no jitter); over a window of four periods, 0.75 (device_charged, the next test)."""
    for u in (41.0, 60.0, 99.0):
        assert RATIO(u, 100.0, Q16 / 2) == 0.0
    assert RATIO(1.0, 1.5, Q16 / 2) == 0.0  # too little charged to judge on
