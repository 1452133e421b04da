"""Whether work recorded on a stream now runs now: shared by launch timing (compute.py) and hand-over
drains (turn.py), which both record CUDA events after launches."""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu import hooks
from pyvgpu.jit.intrinsics import call_i32, load_i32, load_u64, stack_u64
from pyvgpu.jit.memory import helper

CUDA_SUCCESS = 0
H_CTX_GET_CURRENT = hooks.HELPER_INDEX["cuCtxGetCurrent"]
H_STREAM_IS_CAPTURING = hooks.HELPER_INDEX["cuStreamIsCapturing"]


@njit
def running_context(ctx, stream):
    """The calling thread's CUcontext, or 0 if it has none or stream is capturing a graph (captured
    launches run later, with the graph: an event recorded after them would not time or drain them)."""
    cur = stack_u64()
    capturing = stack_u64()
    if call_i32(helper(ctx, H_CTX_GET_CURRENT), (cur,)) != CUDA_SUCCESS or load_u64(cur) == 0:
        return np.uint64(0)
    if call_i32(helper(ctx, H_STREAM_IS_CAPTURING), (stream, capturing)) != CUDA_SUCCESS or load_i32(capturing) != 0:
        return np.uint64(0)
    return load_u64(cur)
