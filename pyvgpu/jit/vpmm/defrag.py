"""VPMM's defragmentation: build a contiguous span for a request no free region fits (docs/vpmm.md).

A plan first, then the driver calls, then the tables:

1. **Plan** (no side effects). The span grows around the free run (adjacent free
   regions) that leaves the fewest pages to bring, into the holes beside it: pages
   that stay where they are cost nothing, and a moved page costs a cuMemMap and
   its share of a cuMemSetAccess. With no run that fits, the span goes into a
   fresh hole, ``gap`` bytes into it, so that it can later grow in place too.
   The pages it lacks come from the smallest other free regions (taken from
   their ends), and what the pool's free pages cannot cover is created.
2. **Driver calls**, each undone if a later one fails: a new VA chunk if needed,
   GPU-side waits for other streams' work, cuMemCreate for the new pages,
   cuMemMap page by page, one cuMemSetAccess per side the span grows. A failure
   at any of them leaves the pool exactly as it was (tests/test_vpmm_faults.py).
3. **Commit**: table updates that cannot fail (the room was checked in step 1).
   The moved pages' old addresses become zombies, still mapped: they are unmapped
   later, in batches (pyvgpu/jit/vpmm/trim.py), not on the malloc path.

During a CUDA graph capture nothing that needs an event query or a wait is used.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract.abi import CUDA_SUCCESS
from pyvgpu.jit.runtime.intrinsics import load_u64, stack_u64
from pyvgpu.jit.vpmm import driver as D
from pyvgpu.jit.vpmm.tables import (
    ADDR,
    ERR_TABLE_FULL,
    EV_DEFERRED,
    EVENT,
    FREE,
    GRAPH,
    H_DEFRAGS,
    H_GAP,
    H_INPLACE,
    H_LIVE,
    H_MOVED,
    H_NREG,
    H_NROOTS,
    H_PAGE,
    H_UNSETTLED,
    H_VA,
    HOLE,
    ID,
    NO_EVENT,
    REQ,
    ROOT,
    SIZE,
    STATE,
    STREAM,
    XEV,
    ZOMBIE,
    driver_error,
    event_known_done,
    event_unref,
    find,
    insert_after,
    mark_allocated,
    merge_all,
    pg_get,
    pg_put,
    pg_room,
    remove,
    rows_free,
    split,
    stat_alloc,
    stat_pages,
    steps,
    touching,
)
from pyvgpu.jit.vpmm.trim import unmap_stale

# usability of a free region for one request (scr[row])
NOT_USABLE, READY, NEEDS_WAIT = 0, 1, 2
PICKED = 10  # added to a row's usability once it is a source


@njit
def usability(reg, hd, i, stream, quiet, tag):
    """Can row i give pages to a request of stream: READY (no wait), NEEDS_WAIT (after GPU-side waits),
    NOT_USABLE. quiet (a CUDA graph capture is under way): no event is queried, so only regions known to
    be done, and the capture's own regions (tag) of this stream, are used. A capture's regions are never
    used outside it."""
    if reg[i, STATE] != FREE:
        return NOT_USABLE
    g = reg[i, GRAPH]
    if quiet:
        if g != 0:
            return READY if (g == tag and reg[i, STREAM] == stream) else NOT_USABLE
        return READY if event_known_done(hd, reg[i, EVENT]) and event_known_done(hd, reg[i, XEV]) else NOT_USABLE
    if g != 0 or reg[i, EVENT] == EV_DEFERRED:
        return NOT_USABLE
    if not D.event_done(hd, reg[i, XEV]):
        return NEEDS_WAIT
    if reg[i, STREAM] == stream or D.event_done(hd, reg[i, EVENT]):
        return READY
    return NEEDS_WAIT


@njit
def mark(reg, hd, scr, stream, quiet, tag):
    for i in range(hd[H_NREG]):
        scr[i] = usability(reg, hd, i, stream, quiet, tag)


@njit
def hole_before(reg, hd, i):
    """Bytes of the hole right before row i (0 if none)."""
    if i > 0 and reg[i - 1, STATE] == HOLE and touching(reg, i - 1, i):
        return reg[i - 1, SIZE]
    return np.int64(0)


@njit
def hole_after(reg, hd, j):
    if j + 1 < hd[H_NREG] and reg[j + 1, STATE] == HOLE and touching(reg, j, j + 1):
        return reg[j + 1, SIZE]
    return np.int64(0)


@njit
def choose_run(reg, hd, scr, size):
    """The run of adjacent usable free rows (first, last, bytes) that, with the holes beside it, holds
    size and leaves the fewest bytes to bring; ties: fewer waits, then the smaller run. first = -1 if
    none."""
    n = hd[H_NREG]
    best_first, best_last, best_b, best_need, best_waits = -1, -1, np.int64(0), size + 1, np.int64(0)
    i = 0
    while i < n:
        if scr[i] == NOT_USABLE:
            i += 1
            continue
        j = i
        b = reg[i, SIZE]
        waits = np.int64(1 if scr[i] == NEEDS_WAIT else 0)
        while j + 1 < n and scr[j + 1] != NOT_USABLE and touching(reg, j, j + 1):
            j += 1
            b += reg[j, SIZE]
            if scr[j] == NEEDS_WAIT:
                waits += 1
        if b >= size:
            need = np.int64(0)
        elif b + hole_before(reg, hd, i) + hole_after(reg, hd, j) >= size:
            need = size - b
        else:
            need = np.int64(-1)
        if need >= 0 and (need < best_need or (need == best_need and (
                waits < best_waits or (waits == best_waits and b < best_b)))):
            best_first, best_last, best_b, best_need, best_waits = i, j, b, need, waits
        i = j + 1
    return best_first, best_last, best_b


@njit
def choose_hole(reg, hd, size, gap):
    """The smallest hole that holds size with gap bytes on each side, or -1."""
    best = -1
    for i in range(hd[H_NREG]):
        if reg[i, STATE] == HOLE and reg[i, SIZE] >= size + 2 * gap and (best < 0 or reg[i, SIZE] < reg[best, SIZE]):
            best = i
    return best


@njit
def pick_sources(reg, hd, scr, first, last, need, src):
    """Free rows outside [first, last] that give need bytes: READY ones before those that need a wait,
    the smallest first (whole small regions rather than cuts of large ones), the last one cut at its end.
    Writes (row address, bytes taken) pairs to src; returns (pairs, bytes found)."""
    n = hd[H_NREG]
    found = np.int64(0)
    k = 0
    while found < need and 2 * k + 1 < src.shape[0]:
        best = -1
        for i in range(n):
            u = scr[i]
            if (u != READY and u != NEEDS_WAIT) or first <= i <= last:
                continue
            if best < 0 or u < scr[best] or (u == scr[best] and reg[i, SIZE] < reg[best, SIZE]):
                best = i
        if best < 0:
            break
        amount = min(need - found, reg[best, SIZE])
        src[2 * k] = reg[best, ADDR]
        src[2 * k + 1] = amount
        scr[best] += PICKED
        found += amount
        k += 1
    return k, found


@njit
def wait_for(reg, hd, i, stream):
    """GPU-side waits so that stream's work on row i's pages runs after their earlier work."""
    if reg[i, STREAM] != stream and not D.event_done(hd, reg[i, EVENT]):
        rc = D.wait_event(hd, stream, reg[i, EVENT])
        if rc != CUDA_SUCCESS:
            return rc
    if not D.event_done(hd, reg[i, XEV]):
        return D.wait_event(hd, stream, reg[i, XEV])
    return CUDA_SUCCESS


@njit
def _unmap_slots(hd, slots, k):
    """Unmap the first k destination slots (in address order, contiguous runs in one call each)."""
    page = hd[H_PAGE]
    s = 0
    while s < k:
        e = s
        while e + 1 < k and slots[2 * (e + 1)] == slots[2 * e] + page:
            e += 1
        D.unmap(hd, slots[2 * s], slots[2 * e] - slots[2 * s] + page)
        s = e + 1


@njit
def _release_new(hd, slots, first_new, k):
    for s in range(first_new, k):
        D.release(hd, slots[2 * s + 1])


@njit
def defragment(reg, hd, pg, scr, size, req, stream, quiet, tag):
    """Phase 2 of malloc: a span of size bytes for stream, returned as a live allocation (its address), or
    ERR_TABLE_FULL / -1000 - CUresult with the pool exactly as it was."""
    for attempt in range(2):
        r = _try(reg, hd, pg, scr, size, req, stream, quiet, tag)
        if r != ERR_TABLE_FULL or quiet or attempt == 1:
            return r
        # the tables are full: stale zombies give their rows and addresses back, then plan again
        rc = unmap_stale(reg, hd, pg)
        if rc != CUDA_SUCCESS:
            return driver_error(rc)
    return np.int64(ERR_TABLE_FULL)


@njit
def _try(reg, hd, pg, scr, size, req, stream, quiet, tag):
    page = hd[H_PAGE]
    nrow = reg.shape[0]
    src = scr[nrow:3 * nrow]
    slots = scr[3 * nrow:]
    mark(reg, hd, scr, stream, quiet, tag)
    first, last, b = choose_run(reg, hd, scr, size)
    fresh = first < 0
    gap = hd[H_GAP]
    hole = -1
    if fresh:
        b = np.int64(0)
        hole = choose_hole(reg, hd, size, gap)
        span = reg[hole, ADDR] + gap if hole >= 0 else np.int64(-1)
        left = np.int64(0)
        right = size
    else:
        ra = reg[first, ADDR]
        need0 = max(np.int64(0), size - b)
        right = min(need0, hole_after(reg, hd, last))
        left = need0 - right
        span = ra - left
    need = left + right
    nsrc, moved = pick_sources(reg, hd, scr, first, last, need, src)
    new = need - moved
    npages = need // page
    # room for everything the commit will do, checked before any driver call
    if (rows_free(reg, hd) < 8 + nsrc or not pg_room(pg, hd, npages) or 2 * npages > slots.shape[0]
            or (fresh and hole < 0 and rows_free(reg, hd) < 10 + nsrc)):
        return np.int64(ERR_TABLE_FULL)
    # --- driver calls, each undone if a later one fails
    reserved_row_addr = np.int64(-1)
    if fresh and hole < 0:
        out = stack_u64()
        chunk = max(hd[H_VA], size + 2 * gap)
        rc = D.reserve(hd, out, chunk)
        if rc == CUDA_SUCCESS:
            reserved_row_addr = np.int64(load_u64(out))
            hole = _add_chunk(reg, hd, reserved_row_addr, chunk)
            span = reserved_row_addr + gap
        else:  # no more address space: pack the span into a hole that just holds it
            gap = np.int64(0)
            hole = choose_hole(reg, hd, size, gap)
            if hole < 0:
                return driver_error(rc)
            span = reg[hole, ADDR]
    # waits: the run's rows the span covers, and the sources
    if not quiet:
        covered = np.int64(0)
        i = first
        while not fresh and i <= last and covered < size:
            rc = wait_for(reg, hd, i, stream)
            if rc != CUDA_SUCCESS:
                _drop_chunk(reg, hd, reserved_row_addr)
                return driver_error(rc)
            covered += reg[i, SIZE]
            i += 1
        for k in range(nsrc):
            rc = wait_for(reg, hd, find(reg, hd, src[2 * k]), stream)
            if rc != CUDA_SUCCESS:
                _drop_chunk(reg, hd, reserved_row_addr)
                return driver_error(rc)
    # destination slots, in address order: the left extension, then the right one (or the fresh span)
    right_start = span + left + b if not fresh else span
    s = 0
    for k in range(nsrc):
        a = src[2 * k]
        row = find(reg, hd, a)
        end = a + reg[row, SIZE]
        start = end - src[2 * k + 1]
        for q in range(steps(start, end, page)):
            off = start + q * page
            slots[2 * s] = span + s * page if s * page < left else right_start + (s * page - left)
            slots[2 * s + 1] = pg_get(pg, off)
            s += 1
    first_new = s
    for s in range(first_new, npages):
        slots[2 * s] = span + s * page if s * page < left else right_start + (s * page - left)
    out = stack_u64()
    for s in range(first_new, npages):
        rc = D.create(hd, out)
        if rc != CUDA_SUCCESS:
            _release_new(hd, slots, first_new, s)
            _drop_chunk(reg, hd, reserved_row_addr)
            return driver_error(rc)
        slots[2 * s + 1] = np.int64(load_u64(out))
    for s in range(npages):
        rc = D.map_page(hd, slots[2 * s], slots[2 * s + 1])
        if rc != CUDA_SUCCESS:
            _unmap_slots(hd, slots, s)
            _release_new(hd, slots, first_new, npages)
            _drop_chunk(reg, hd, reserved_row_addr)
            return driver_error(rc)
    rc = D.set_access(hd, span, left)
    if rc == CUDA_SUCCESS:
        rc = D.set_access(hd, right_start, right)
    if rc != CUDA_SUCCESS:
        _unmap_slots(hd, slots, npages)
        _release_new(hd, slots, first_new, npages)
        _drop_chunk(reg, hd, reserved_row_addr)
        return driver_error(rc)
    # --- commit: table updates only (room checked above)
    for s in range(npages):
        pg_put(pg, hd, slots[2 * s], slots[2 * s + 1])
    if new > 0:
        stat_pages(hd, new // page)
    for k in range(nsrc):
        row = find(reg, hd, src[2 * k])
        amount = src[2 * k + 1]
        if amount < reg[row, SIZE]:
            split(reg, hd, row, reg[row, SIZE] - amount)
            row += 1
        reg[row, STATE] = ZOMBIE  # keeps its event references until its work is done (vpmm_trim.settle)
        if event_known_done(hd, reg[row, EVENT]) and event_known_done(hd, reg[row, XEV]):
            event_unref(hd, reg[row, EVENT])
            event_unref(hd, reg[row, XEV])
            reg[row, EVENT] = NO_EVENT
            reg[row, XEV] = NO_EVENT
        else:
            hd[H_UNSETTLED] += 1
    if fresh:
        h = find(reg, hd, span - gap)
        if gap > 0:
            split(reg, hd, h, gap)
            h += 1
        split(reg, hd, h, size)
    else:
        if left > 0:  # the hole right before the run gives its last left bytes (all of it: no cut)
            h = find(reg, hd, span + left) - 1
            if reg[h, SIZE] > left:
                split(reg, hd, h, reg[h, SIZE] - left)
        if right > 0:
            split(reg, hd, find(reg, hd, right_start), right)
    i = find(reg, hd, span)
    covered = reg[i, SIZE]
    j = i
    while covered < size:
        j += 1
        covered += reg[j, SIZE]
    if covered > size:  # a run longer than the request: its last row keeps the rest, still free
        split(reg, hd, j, reg[j, SIZE] - (covered - size))
    for k in range(i, j + 1):
        if reg[k, STATE] == FREE:
            event_unref(hd, reg[k, EVENT])
            event_unref(hd, reg[k, XEV])
    for k in range(j, i, -1):
        remove(reg, hd, k)
    reg[i, SIZE] = size
    mark_allocated(reg, hd, i, stream, req, tag)
    merge_all(reg, hd)
    hd[H_LIVE] += size
    hd[H_DEFRAGS] += 1
    hd[H_MOVED] += moved // page
    hd[H_INPLACE] += min(b, size) // page
    stat_alloc(hd, True, size, req, 1)
    return span


@njit
def _add_chunk(reg, hd, addr, size):
    """A reserved VA chunk becomes one hole (the caller checked that a row is free); its row."""
    n = hd[H_NREG]
    i = n - 1
    while i >= 0 and reg[i, ADDR] > addr:
        i -= 1
    insert_after(reg, hd, i)
    i += 1
    reg[i, ADDR] = addr
    reg[i, SIZE] = size
    reg[i, STATE] = HOLE
    reg[i, STREAM] = 0
    reg[i, EVENT] = NO_EVENT
    reg[i, XEV] = NO_EVENT
    reg[i, ID] = 0
    reg[i, REQ] = 0
    reg[i, GRAPH] = 0
    reg[i, ROOT] = hd[H_NROOTS]
    hd[H_NROOTS] += 1
    return i


@njit
def _drop_chunk(reg, hd, addr):
    """Undo _add_chunk (addr -1: nothing was reserved)."""
    if addr < 0:
        return
    i = find(reg, hd, addr)
    D.address_free(hd, addr, reg[i, SIZE])
    remove(reg, hd, i)
    hd[H_NROOTS] -= 1


@njit
def reserve_chunk(reg, hd, size):
    """Reserve a VA chunk of at least size bytes as one hole; its row, or a negative error."""
    if rows_free(reg, hd) < 1:
        return np.int64(ERR_TABLE_FULL)
    out = stack_u64()
    chunk = max(hd[H_VA], size)
    rc = D.reserve(hd, out, chunk)
    if rc != CUDA_SUCCESS:
        return driver_error(rc)
    return _add_chunk(reg, hd, np.int64(load_u64(out)), chunk)

