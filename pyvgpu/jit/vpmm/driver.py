"""VPMM's driver calls, each counted in the pool's header (design: docs/vpmm.md).

The pool calls the driver only through these functions. Each adds one to its
counter (``H_CALLS + F_*``), and the two whose cost grows with the pages they
cover (cuMemSetAccess, cuMemUnmap) also add those pages. `pool.stats()` and
`pyvgpu bench vpmm` report them per operation: on the fake driver the counts are
exact and deterministic, so the CPU suite can assert them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract.abi import CU_EVENT_DISABLE_TIMING, CUDA_SUCCESS
from pyvgpu.jit.runtime.intrinsics import call_i32, load_u64, stack_u64, store_u32
from pyvgpu.jit.vpmm.tables import (
    ERR_TABLE_FULL,
    F_ADDR_FREE,
    F_ALLOC_ASYNC,
    F_CAPTURE_MODE,
    F_CREATE,
    F_CTX_GET,
    F_CTX_SET,
    F_CTX_SYNC,
    F_EV_CREATE,
    F_EV_QUERY,
    F_EV_RECORD,
    F_FREE_ASYNC,
    F_IS_CAPTURING,
    F_MAP,
    F_POOL_TRIM,
    F_RELEASE,
    F_RESERVE,
    F_SET_ACCESS,
    F_UNMAP,
    F_WAIT,
    H_ACCESS,
    H_ACCESS_PAGES,
    H_CALLS,
    H_CTX,
    H_CTX_NONE,
    H_CTX_OTHER,
    H_EVENTS,
    H_MEMPOOL,
    H_NEV,
    H_PAGE,
    H_PROP,
    H_UNMAP_PAGES,
    MAX_EVENTS,
    NO_EVENT,
    driver_error,
    ev_handle,
    fn,
)


@njit(inline="always")
def _count(hd, f):
    hd[H_CALLS + f] += 1


# --- the context: every entry point's driver calls run in the pool's ------------------------------
# The driver API acts on the calling thread's current context, and the pool is called from threads that
# may have none or another: PyTorch's autograd worker (c10::cuda::SetDevice skips cudaSetDevice when
# cudaGetDevice already names the device, so the thread has no context until its first kernel binds one),
# a Python thread, or the thread of another GPU. So each entry point makes the device's primary context
# current for its calls and gives the thread its own back (docs/vpmm.md, issue 32).
CTX_KEPT = -1  # ctx_enter's answer when the pool's context was already current: nothing to give back


@njit
def ctx_enter(hd):
    """Make the pool's context current on this thread. Returns the thread's context to give back to
    ctx_leave (0: it had none), CTX_KEPT when the pool's was current already (or VPMM_CONTEXT=caller left
    H_CTX 0: the calls run in whatever the thread has, as before issue 32), or -1000 - CUresult."""
    if hd[H_CTX] == 0:
        return np.int64(CTX_KEPT)
    _count(hd, F_CTX_GET)
    out = stack_u64()
    rc = call_i32(fn(hd, F_CTX_GET), (out,))
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    cur = np.int64(load_u64(out))
    if cur == hd[H_CTX]:
        return np.int64(CTX_KEPT)
    _count(hd, F_CTX_SET)
    rc = call_i32(fn(hd, F_CTX_SET), (np.uint64(hd[H_CTX]),))
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    if cur == 0:
        hd[H_CTX_NONE] += 1
    else:
        hd[H_CTX_OTHER] += 1
    return cur


@njit
def ctx_leave(hd, prev):
    """Give the thread its context back (prev from ctx_enter). A context the driver will not make current
    again (destroyed meanwhile) leaves the pool's current: a valid one, and the thread's was unusable."""
    if prev == CTX_KEPT or prev < 0:
        return
    _count(hd, F_CTX_SET)
    call_i32(fn(hd, F_CTX_SET), (np.uint64(prev),))


@njit
def create(hd, out):
    """cuMemCreate of one page; the handle goes to the u64 at out."""
    _count(hd, F_CREATE)
    return call_i32(fn(hd, F_CREATE), (out, np.uint64(hd[H_PAGE]), np.uint64(hd[H_PROP]), np.uint64(0)))


@njit
def release(hd, h):
    _count(hd, F_RELEASE)
    return call_i32(fn(hd, F_RELEASE), (np.uint64(h),))


@njit
def map_page(hd, va, h):
    _count(hd, F_MAP)
    return call_i32(fn(hd, F_MAP), (np.uint64(va), np.uint64(hd[H_PAGE]), np.uint64(0), np.uint64(h),
                                    np.uint64(0)))


@njit
def set_access(hd, va, size):
    """Let the pool's device read and write [va, va + size) (every page in it mapped)."""
    if size <= 0:
        return CUDA_SUCCESS
    _count(hd, F_SET_ACCESS)
    hd[H_ACCESS_PAGES] += size // hd[H_PAGE]
    return call_i32(fn(hd, F_SET_ACCESS), (np.uint64(va), np.uint64(size), np.uint64(hd[H_ACCESS]), np.uint64(1)))


@njit
def unmap(hd, va, size):
    if size <= 0:
        return CUDA_SUCCESS
    _count(hd, F_UNMAP)
    hd[H_UNMAP_PAGES] += size // hd[H_PAGE]
    return call_i32(fn(hd, F_UNMAP), (np.uint64(va), np.uint64(size)))


@njit
def reserve(hd, out, size):
    _count(hd, F_RESERVE)
    return call_i32(fn(hd, F_RESERVE), (out, np.uint64(size), np.uint64(hd[H_PAGE]), np.uint64(0), np.uint64(0)))


@njit
def address_free(hd, va, size):
    _count(hd, F_ADDR_FREE)
    return call_i32(fn(hd, F_ADDR_FREE), (np.uint64(va), np.uint64(size)))


@njit
def wait_event(hd, stream, ev):
    """The caller's stream waits, on the GPU, for event ev (the CPU does not)."""
    _count(hd, F_WAIT)
    return call_i32(fn(hd, F_WAIT), (np.uint64(stream), ev_handle(hd, ev), np.uint32(0)))


@njit
def alloc_async(hd, out, size, stream):
    _count(hd, F_ALLOC_ASYNC)
    return call_i32(fn(hd, F_ALLOC_ASYNC), (out, np.uint64(size), np.uint64(stream)))


@njit
def free_async(hd, ptr, stream):
    _count(hd, F_FREE_ASYNC)
    return call_i32(fn(hd, F_FREE_ASYNC), (np.uint64(ptr), np.uint64(stream)))


@njit
def is_capturing(hd, stream):
    """1 if stream is capturing a CUDA graph, 0 if not, -1000 - CUresult on an error."""
    _count(hd, F_IS_CAPTURING)
    out = stack_u64()
    rc = call_i32(fn(hd, F_IS_CAPTURING), (np.uint64(stream), out))
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    return np.int64(1) if (load_u64(out) & np.uint64(0xFFFFFFFF)) != 0 else np.int64(0)


CAPTURE_MODE_RELAXED = 2


@njit
def capture_mode(hd, mode):
    """Set the calling thread's stream-capture interaction mode (cuThreadExchangeStreamCaptureMode); returns
    the previous one, or -1000 - CUresult. In relaxed mode the thread may create and map pages while a
    capture runs (the global mode, PyTorch's default, refuses them as it refuses cudaMalloc)."""
    _count(hd, F_CAPTURE_MODE)
    out = stack_u64()
    store_u32(out, np.uint32(mode))
    rc = call_i32(fn(hd, F_CAPTURE_MODE), (out,))
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    return np.int64(load_u64(out) & np.uint64(0xFFFFFFFF))


@njit
def trim_small(hd):
    """Give the memory cached by the device's stream-ordered pool (the small requests) back to the driver."""
    if hd[H_MEMPOOL] == 0:
        return CUDA_SUCCESS
    _count(hd, F_POOL_TRIM)
    return call_i32(fn(hd, F_POOL_TRIM), (np.uint64(hd[H_MEMPOOL]), np.uint64(0)))


@njit
def ctx_sync(hd):
    _count(hd, F_CTX_SYNC)
    return call_i32(fn(hd, F_CTX_SYNC), ())


# --- the event pool: events are reused once no region refers to them ----------------------------

@njit
def event_done(hd, ev):
    """True if event ev (an index into the event pool) has completed; remembered once it has."""
    if ev == NO_EVENT:
        return True
    if ev < 0:  # EV_DEFERRED: not even recorded yet
        return False
    if hd[H_EVENTS + 3 * ev + 2] != 0:
        return True
    _count(hd, F_EV_QUERY)
    if call_i32(fn(hd, F_EV_QUERY), (ev_handle(hd, ev),)) == CUDA_SUCCESS:
        hd[H_EVENTS + 3 * ev + 2] = 1
        return True
    return False


@njit
def event_new(hd, stream):
    """An event recorded on stream now (one reference): a pooled one no region refers to any more, else a
    new one. Its index, ERR_TABLE_FULL, or -1000 - CUresult."""
    n = hd[H_NEV]
    for i in range(n):
        if hd[H_EVENTS + 3 * i + 1] == 0:
            break
    else:
        if n >= MAX_EVENTS:
            return np.int64(ERR_TABLE_FULL)
        out = stack_u64()
        _count(hd, F_EV_CREATE)
        rc = call_i32(fn(hd, F_EV_CREATE), (out, np.uint32(CU_EVENT_DISABLE_TIMING)))
        if rc != CUDA_SUCCESS:
            return driver_error(rc)
        hd[H_EVENTS + 3 * n] = np.int64(load_u64(out))
        hd[H_NEV] = n + 1
        i = n
    _count(hd, F_EV_RECORD)
    rc = call_i32(fn(hd, F_EV_RECORD), (ev_handle(hd, i), np.uint64(stream)))
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    hd[H_EVENTS + 3 * i + 1] = 1
    hd[H_EVENTS + 3 * i + 2] = 0
    return np.int64(i)
