"""VPMM's allocator core: a virtual-memory pool in numba (design: docs/vpmm.md).

malloc, free, record_stream, CUDA graph captures and preallocation over the
tables of pyvgpu/jit/vpmm/tables.py, with the defragmentation of
pyvgpu/jit/vpmm/defrag.py and the housekeeping of pyvgpu/jit/vpmm/trim.py. The
C entry points the shim and ``pyvgpu.vpmm.pool`` call are in pyvgpu/jit/vpmm/entries.py. Driver calls go
through function pointers resolved in the process (pyvgpu/jit/vpmm/driver.py),
so a pool under `pyvgpu wrap` creates its pages through the shim's cuMemCreate
hook and is charged against the group's cap like any allocation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract.abi import CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS
from pyvgpu.jit.runtime.intrinsics import load_u64, stack_u64
from pyvgpu.jit.vpmm import driver as D
from pyvgpu.jit.vpmm.defrag import READY, defragment, reserve_chunk, usability
from pyvgpu.jit.vpmm.tables import (
    ADDR,
    ERR_DRIVER,
    ERR_TABLE_FULL,
    EV_DEFERRED,
    EVENT,
    FREE,
    GRAPH,
    H_CAP_STREAM,
    H_CAPTURE_ACTIVE,
    H_EPOCH,
    H_EVENTS,
    H_FREES,
    H_LIVE,
    H_MALLOCS,
    H_NEV,
    H_NEXT_ID,
    H_NREG,
    H_NSIDE,
    H_OOMS,
    H_PAGE,
    H_PRESSURE,
    H_RETRIES,
    H_SIDE,
    H_SMALL,
    H_UNSETTLED,
    HOLE,
    ID,
    MALLOC,
    MAX_SIDE,
    NO_EVENT,
    REQ,
    SIZE,
    STATE,
    STREAM,
    XEV,
    driver_error,
    event_unref,
    find,
    mark_allocated,
    merge_around,
    pg_put,
    pg_room,
    split,
    stat_alloc,
    stat_pages,
)
from pyvgpu.jit.vpmm.trim import absorb_refusals, pressure, release_free, settle, tight, unmap_stale

OOM = ERR_DRIVER - CUDA_ERROR_OUT_OF_MEMORY


# --- CUDA graph captures -----------------------------------------------------------------------

@njit
def capture_tag(hd, stream, capturing):
    """The capture an operation of stream belongs to (its epoch), 0 for none. An epoch starts at the first
    operation seen on a capturing stream, or at `notify_capture`; a capture's memory is reused only inside it.

    A capture announced by `notify_capture` (PyTorch's CUDAGraph.capture_begin) keeps its epoch until it is
    announced ended, whatever its stream does before the driver's capture starts: PyTorch allocates on the
    capture stream between the two (CUDAGraph.capture_begin registers the CUDA generator's graph-safe RNG
    state, two small tensors). Ending the epoch there made the capture's memory another epoch's, which
    CUDAGraph.reset then did not release (a GPU run left regions behind; docs/vpmm.md)."""
    if capturing:
        if hd[H_CAP_STREAM] != stream:
            hd[H_EPOCH] += 1
            hd[H_CAP_STREAM] = stream
        return hd[H_EPOCH]
    if hd[H_CAP_STREAM] == stream and hd[H_CAPTURE_ACTIVE] == 0:  # it no longer captures: its capture ended
        hd[H_CAP_STREAM] = 0
    return np.int64(0)


@njit
def notify_capture(hd, stream, begin):
    """PyTorch is about to begin (or has ended) a capture on stream (pyvgpu.vpmm.pool's torch hooks call this).
    Before it begins, every event is queried once: regions freed before the capture are then known to be
    done, and usable in it without the queries a capture forbids. Returns the capture's epoch."""
    if begin:
        for ev in range(hd[H_NEV]):
            if hd[H_EVENTS + 3 * ev + 1] > 0:
                D.event_done(hd, ev)
        hd[H_CAPTURE_ACTIVE] += 1
        hd[H_EPOCH] += 1
        hd[H_CAP_STREAM] = stream
        return hd[H_EPOCH]
    if hd[H_CAPTURE_ACTIVE] > 0:
        hd[H_CAPTURE_ACTIVE] -= 1
    if hd[H_CAP_STREAM] == stream:
        hd[H_CAP_STREAM] = 0
    return np.int64(0)


@njit
def release_graph(reg, hd, tag):
    """The graphs of capture tag (0: every capture) are gone: their memory becomes ordinary pool memory.
    Replays may still run, so the context is synchronised first."""
    rc = D.ctx_sync(hd)
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    n = 0
    for i in range(hd[H_NREG]):
        g = reg[i, GRAPH]
        if g != 0 and (tag == 0 or g == tag):
            reg[i, GRAPH] = 0
            if reg[i, STATE] == FREE:
                reg[i, EVENT] = NO_EVENT
            n += 1
    i = 0
    while i < hd[H_NREG]:
        if reg[i, STATE] == FREE:
            i = merge_around(reg, hd, i)
        i += 1
    return np.int64(n)


# --- malloc ------------------------------------------------------------------------------------

@njit
def best_fit(reg, hd, size, stream, same, quiet, tag):
    """Phase 1: the smallest free region that fits and needs no wait: of the caller's stream (same), or of
    another stream whose work is done."""
    best = -1
    for i in range(hd[H_NREG]):
        if reg[i, STATE] != FREE or reg[i, SIZE] < size or (reg[i, STREAM] == stream) != same:
            continue
        if best >= 0 and reg[i, SIZE] >= reg[best, SIZE]:
            continue
        if usability(reg, hd, i, stream, quiet, tag) != READY:
            continue
        best = i
    return best


@njit
def take(reg, hd, i, size, req, stream, tag):
    """Row i (free) gives its first size bytes to a new allocation; returns the address."""
    if not split(reg, hd, i, size):
        return np.int64(ERR_TABLE_FULL)
    event_unref(hd, reg[i, EVENT])
    event_unref(hd, reg[i, XEV])
    mark_allocated(reg, hd, i, stream, req, tag)
    hd[H_LIVE] += size
    stat_alloc(hd, True, size, req, 1)
    return reg[i, ADDR]


@njit
def small_alloc(reg, hd, pg, scr, size, stream):
    """Under a page: cuMemAllocAsync (the pool never splits a page). A refusal is retried once after the
    pool gave its free pages and the small requests' cache back (num_alloc_retries)."""
    n = max(size, 1)
    out = stack_u64()
    rc = D.alloc_async(hd, out, n, stream)
    if rc == CUDA_ERROR_OUT_OF_MEMORY:
        hd[H_RETRIES] += 1
        release_free(reg, hd, pg, scr)
        rc = D.alloc_async(hd, out, n, stream)
    if rc != CUDA_SUCCESS:
        if rc == CUDA_ERROR_OUT_OF_MEMORY:
            hd[H_OOMS] += 1
        absorb_refusals(hd)
        return driver_error(rc)
    hd[H_SMALL] += n
    stat_alloc(hd, False, n, size, 1)
    return np.int64(load_u64(out))


@njit
def malloc(reg, hd, pg, scr, size, stream):
    """Allocate size bytes (rounded up to pages) for stream; the address, or a negative error:
    -1000 - CUresult for a driver error (CUDA_ERROR_OUT_OF_MEMORY at the cap), ERR_TABLE_FULL when the
    pool's tables are full. A failed malloc leaves the pool as it was."""
    c = D.is_capturing(hd, stream)
    if c < 0:
        return c
    tag = capture_tag(hd, stream, c == 1)
    quiet = c == 1 or hd[H_CAPTURE_ACTIVE] > 0
    if not quiet:
        return _malloc(reg, hd, pg, scr, size, stream, quiet, tag)
    # during a capture this thread may map pages only in relaxed mode (the capture itself is unaffected)
    prev = D.capture_mode(hd, D.CAPTURE_MODE_RELAXED)
    if prev < 0:
        return prev
    a = _malloc(reg, hd, pg, scr, size, stream, quiet, tag)
    D.capture_mode(hd, prev)
    return a


@njit
def _malloc(reg, hd, pg, scr, size, stream, quiet, tag):
    hd[H_MALLOCS] += 1
    page = hd[H_PAGE]
    if size < page and not quiet:
        return small_alloc(reg, hd, pg, scr, size, stream)
    req = max(size, 1)
    size = (req + page - 1) // page * page
    if not quiet:
        rc = settle(reg, hd)
        if rc < 0:
            return rc
        if tight(reg, hd, pg):
            unmap_stale(reg, hd, pg)
    i = best_fit(reg, hd, size, stream, True, quiet, tag)
    if i < 0:
        i = best_fit(reg, hd, size, stream, False, quiet, tag)
    if i >= 0:
        a = take(reg, hd, i, size, req, stream, tag)
    else:
        a = defragment(reg, hd, pg, scr, size, req, stream, quiet, tag)
        if a == OOM and not quiet:
            # the pool's own free pages were in the plan already; the small requests' cache may hold more
            hd[H_RETRIES] += 1
            D.trim_small(hd)
            a = defragment(reg, hd, pg, scr, size, req, stream, quiet, tag)
        if a == OOM:
            hd[H_OOMS] += 1
            absorb_refusals(hd)  # our own refusal is no reason to give our pages away
            return a
    if a >= 0 and not quiet and (pressure(hd) or hd[H_PRESSURE] != 0):
        hd[H_PRESSURE] = 0
        release_free(reg, hd, pg, scr)
    return a


# --- free and record_stream ------------------------------------------------------------------------

@njit
def record_stream(reg, hd, ptr, stream, size):
    """Tensor.record_stream: the live allocation at ptr (size bytes asked) is also used on stream; its free
    then waits for that stream's work too. A small request (under a page: cuMemAllocAsync memory the pool
    does not track) is taken on the caller's word. 0, CUDA_ERROR_INVALID_VALUE, or ERR_TABLE_FULL."""
    i = find(reg, hd, ptr)
    if i >= 0 and reg[i, STATE] == MALLOC:
        if stream == reg[i, STREAM]:
            return np.int64(0)
    elif not 0 < size < hd[H_PAGE]:
        return np.int64(CUDA_ERROR_INVALID_VALUE)
    n = hd[H_NSIDE]
    for k in range(n):
        if hd[H_SIDE + 2 * k] == ptr and hd[H_SIDE + 2 * k + 1] == stream:
            return np.int64(0)
    if n >= MAX_SIDE:
        return np.int64(ERR_TABLE_FULL)
    hd[H_SIDE + 2 * n] = ptr
    hd[H_SIDE + 2 * n + 1] = stream
    hd[H_NSIDE] = n + 1
    if i >= 0 and reg[i, STATE] == MALLOC:
        reg[i, XEV] += 1
    return np.int64(0)


@njit
def _drop_side(hd, ptr):
    k = 0
    while k < hd[H_NSIDE]:
        if hd[H_SIDE + 2 * k] == ptr:
            last = hd[H_NSIDE] - 1
            hd[H_SIDE + 2 * k] = hd[H_SIDE + 2 * last]
            hd[H_SIDE + 2 * k + 1] = hd[H_SIDE + 2 * last + 1]
            hd[H_NSIDE] = last
        else:
            k += 1


@njit
def side_event(hd, ptr, nside):
    """One event that completes once the work queued so far on every side stream of ptr is done (the first
    side stream waits for the others on the GPU, then records it). NO_EVENT if none; a negative error with
    nothing changed."""
    if nside == 0:
        return np.int64(NO_EVENT)
    first = np.int64(-1)
    first_stream = np.int64(0)
    for k in range(hd[H_NSIDE]):
        if hd[H_SIDE + 2 * k] != ptr:
            continue
        s = hd[H_SIDE + 2 * k + 1]
        if first < 0:
            first_stream = s
            first = D.event_new(hd, s)
            if first < 0:
                return first
            continue
        ev = D.event_new(hd, s)
        if ev < 0:
            event_unref(hd, first)
            return ev
        rc = D.wait_event(hd, first_stream, ev)
        event_unref(hd, ev)
        if rc != CUDA_SUCCESS:
            event_unref(hd, first)
            return driver_error(rc)
        event_unref(hd, first)
        first = D.event_new(hd, first_stream)  # after the waits: it covers every side stream
        if first < 0:
            return first
    return first


@njit
def free(reg, hd, pg, scr, ptr, stream):
    """Give back an allocation: it becomes free after an event recorded on stream (and on its record_stream
    side streams), merged with free neighbours of the same stream. 0, CUDA_ERROR_INVALID_VALUE for a
    pointer that is not live here, or a negative error with nothing changed."""
    i = find(reg, hd, ptr)
    if i < 0 or reg[i, STATE] != MALLOC:
        return np.int64(CUDA_ERROR_INVALID_VALUE)
    nside = reg[i, XEV]
    g = reg[i, GRAPH]
    quiet = hd[H_CAPTURE_ACTIVE] > 0
    if g != 0:
        # a capture's memory: reused only inside that capture, where stream order protects it
        ev = np.int64(NO_EVENT)
        xev = np.int64(NO_EVENT)
    else:
        c = D.is_capturing(hd, stream)
        if c < 0:
            return c
        quiet = quiet or c == 1
        if c == 1:  # an event recorded now would belong to the graph: recorded once the capture ends
            ev = np.int64(EV_DEFERRED)
        else:
            ev = D.event_new(hd, stream)
            if ev < 0:
                return np.int64(CUDA_ERROR_OUT_OF_MEMORY) if ev == ERR_TABLE_FULL else ev
        xev = side_event(hd, ptr, nside)
        if xev < NO_EVENT:
            event_unref(hd, ev)
            return xev
        if ev == EV_DEFERRED:
            hd[H_UNSETTLED] += 1
    _drop_side(hd, ptr)
    hd[H_FREES] += 1
    hd[H_LIVE] -= reg[i, SIZE]
    stat_alloc(hd, True, reg[i, SIZE], reg[i, REQ], -1)
    reg[i, STATE] = FREE
    reg[i, STREAM] = stream
    reg[i, EVENT] = ev
    reg[i, XEV] = xev
    reg[i, REQ] = 0
    reg[i, ID] = hd[H_NEXT_ID]
    hd[H_NEXT_ID] += 1
    merge_around(reg, hd, i)
    if not quiet and (pressure(hd) or hd[H_PRESSURE] != 0):
        hd[H_PRESSURE] = 0
        release_free(reg, hd, pg, scr)
    return np.int64(CUDA_SUCCESS)


@njit
def small_free(hd, ptr, stream, size):
    """cuMemFreeAsync on stream: the driver's pool reuses the memory in that stream's order, so the work of
    record_stream's side streams is made to come first (GPU-side waits)."""
    for k in range(hd[H_NSIDE]):
        if hd[H_SIDE + 2 * k] != ptr:
            continue
        ev = D.event_new(hd, hd[H_SIDE + 2 * k + 1])
        if ev < 0:
            return ev
        rc = D.wait_event(hd, stream, ev)
        event_unref(hd, ev)
        if rc != CUDA_SUCCESS:
            return driver_error(rc)
    rc = D.free_async(hd, ptr, stream)
    if rc == CUDA_SUCCESS:
        n = max(size, 1)  # small_alloc took a byte for a request of none
        _drop_side(hd, ptr)
        hd[H_FREES] += 1
        hd[H_SMALL] -= n
        stat_alloc(hd, False, n, size, -1)
    return np.int64(rc)


# --- preallocation ------------------------------------------------------------------------------

@njit
def preallocate(reg, hd, pg, scr, n):
    """VPMM_PAGES: n pages mapped at the start of a chunk, free for every stream. All or nothing."""
    if n <= 0:
        return np.int64(CUDA_SUCCESS)
    page = hd[H_PAGE]
    size = n * page
    if not pg_room(pg, hd, n) or n > scr.shape[0]:
        return np.int64(ERR_TABLE_FULL)
    h = 0
    while h < hd[H_NREG] and not (reg[h, STATE] == HOLE and reg[h, SIZE] >= size):
        h += 1
    if h == hd[H_NREG]:
        h = reserve_chunk(reg, hd, size)
        if h < 0:
            return h
    if hd[H_NREG] + 1 > reg.shape[0]:
        return np.int64(ERR_TABLE_FULL)
    a = reg[h, ADDR]
    out = stack_u64()
    for k in range(n):
        rc = D.create(hd, out)
        if rc == CUDA_SUCCESS:
            scr[k] = np.int64(load_u64(out))
            rc = D.map_page(hd, a + k * page, scr[k])
            if rc != CUDA_SUCCESS:
                D.release(hd, scr[k])
        if rc != CUDA_SUCCESS:
            for j in range(k):
                D.unmap(hd, a + j * page, page)
                D.release(hd, scr[j])
            return driver_error(rc)
    rc = D.set_access(hd, a, size)
    if rc != CUDA_SUCCESS:
        D.unmap(hd, a, size)
        for j in range(n):
            D.release(hd, scr[j])
        return driver_error(rc)
    for k in range(n):
        pg_put(pg, hd, a + k * page, scr[k])
    stat_pages(hd, n)
    split(reg, hd, h, size)
    reg[h, STATE] = FREE
    reg[h, STREAM] = 0
    reg[h, EVENT] = NO_EVENT
    reg[h, XEV] = NO_EVENT
    reg[h, ID] = hd[H_NEXT_ID]
    hd[H_NEXT_ID] += 1
    return np.int64(CUDA_SUCCESS)
