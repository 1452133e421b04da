"""Which launches are timed (pyvgpu/jit/compute/launch.py ``sampled``), called in this process: one in
SAMPLE_EVERY, at places that do not follow the program's period. A training or decode step makes the same
launches in the same order every step; with the count's low bits, a step of 256 launches (or any multiple of
a power of two) was timed at the same few kernels for good, and the others never again."""

from __future__ import annotations

import ctypes

from numba import cfunc, types

from pyvgpu.jit.compute import launch

SAMPLED = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_uint64)(
    cfunc(types.boolean(types.uint64), nopython=True)(lambda n: launch.sampled(n)).address)
N = 1 << 18


def test_one_launch_in_sample_every_is_timed():
    hits = sum(SAMPLED(n) for n in range(1, N))
    assert 0.8 * N / launch.SAMPLE_EVERY < hits < 1.25 * N / launch.SAMPLE_EVERY, hits


def test_a_periodic_program_is_timed_at_every_place_of_its_step():
    """Steps of 2 to 300 launches: every place in the step is timed within 2^18 launches (about 1000
    timings). The low bits timed one place of a step of 256, and one in 4 of a step of 300."""
    for step in (2, 6, 64, 256, 300):
        places = {n % step for n in range(1, N) if SAMPLED(n)}
        assert len(places) == step, (step, len(places))
        old = {n % step for n in range(1, N) if n % launch.SAMPLE_EVERY == 0}
        assert step <= 6 or len(old) <= step // 4  # what the old rule reached
