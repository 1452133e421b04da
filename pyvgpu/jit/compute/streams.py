"""Whether work recorded on a stream runs now: shared by launch timing (cost.py) and hand-over drains
(turn.py), which both record CUDA events after launches."""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.jit.runtime.context import HELPER
from pyvgpu.jit.runtime.intrinsics import load_i32, load_u64, stack_u64


@njit
def running_context(ctx, stream):
    """The calling thread's CUcontext, or 0 if it has none or stream is capturing a graph (captured
    launches run later, with the graph: an event recorded after them would not time or drain them)."""
    cur = stack_u64()
    capturing = stack_u64()
    if HELPER.cuCtxGetCurrent(ctx, cur) != abi.CUDA_SUCCESS or load_u64(cur) == 0:
        return np.uint64(0)
    if HELPER.cuStreamIsCapturing(ctx, stream, capturing) != abi.CUDA_SUCCESS or load_i32(capturing) != 0:
        return np.uint64(0)
    return load_u64(cur)
