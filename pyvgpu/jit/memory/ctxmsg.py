"""The stderr line for a CUDA context that does not fit under the group's memory cap.

A context takes device memory no allocation call shows (hundreds of MiB for
PyTorch; docs/measurements.md, "Context and module memory"). When it does not fit, the context is given back and the
call fails with CUDA_ERROR_OUT_OF_MEMORY (pyvgpu/jit/memory/measured.py), which a
program reports as a bare "out of memory" at its first CUDA call. This line
says why: the cap, what the context needs, and the cap that would fit.

The text is written into a buffer on the stack, character by character, from
constant tuples of bytes: no allocation and no interpreter, as every callback.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from pyvgpu.jit.runtime.intrinsics import STORE, stack_buffer, write_fd

store_u8 = STORE[types.uint8]
MiB = 1 << 20
LINE_BYTES = 384  # the longest line: the texts below (about 220 bytes) and five numbers of 20 digits

# Constant arrays (frozen into the library's data) indexed within their bounds: a tuple indexed at run time
# would carry an IndexError path, which needs the Python runtime.
_T1 = np.frombuffer(b"pyvgpu: a CUDA context on device ", np.uint8)
_T2 = np.frombuffer(b" needs ", np.uint8)
_T3 = np.frombuffer(b" MiB of device memory, but the group's memory cap is ", np.uint8)
_T4 = np.frombuffer(b" MiB (", np.uint8)
_T5 = np.frombuffer(b" MiB in use); give a cap of at least ", np.uint8)
_T6 = np.frombuffer(b" MiB (`pyvgpu wrap --memory`, or `pyvgpu limits set --memory` for a running group)\n", np.uint8)
_TEN = np.uint64(10)


@njit(inline="always")
def _text(buf, pos, text):
    for i in range(text.size):
        store_u8(buf + pos + i, text[i])
    return pos + text.size


@njit(error_model="numpy")  # no ZeroDivisionError path (it would need the Python runtime); the divisor is 10
def _number(buf, pos, value):
    """Decimal digits of value at buf + pos; the position after them."""
    v = np.uint64(value)
    n = 1
    t = v
    while t >= _TEN:
        t = t // _TEN
        n += 1
    for i in range(n):
        store_u8(buf + pos + n - 1 - i, np.uint8(np.uint64(48) + v % _TEN))
        v = v // _TEN
    return pos + n


@njit(error_model="numpy")
def mib_up(n):
    return (np.uint64(n) + np.uint64(MiB - 1)) // np.uint64(MiB)


@njit
def compose(buf, dev, need, limit, used):
    """The line into buf (LINE_BYTES); its length."""
    pos = _text(buf, 0, _T1)
    pos = _number(buf, pos, dev)
    pos = _text(buf, pos, _T2)
    pos = _number(buf, pos, mib_up(need))
    pos = _text(buf, pos, _T3)
    pos = _number(buf, pos, np.uint64(limit) // np.uint64(MiB))
    pos = _text(buf, pos, _T4)
    pos = _number(buf, pos, mib_up(used))
    pos = _text(buf, pos, _T5)
    pos = _number(buf, pos, mib_up(np.uint64(used) + np.uint64(need)))
    pos = _text(buf, pos, _T6)
    return pos


@njit
def report(dev, need, limit, used):
    """Write the line to stderr."""
    buf = stack_buffer(LINE_BYTES)
    n = compose(buf, dev, need, limit, used)
    write_fd(np.int32(2), buf, np.uint64(n))
