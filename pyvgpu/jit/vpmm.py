"""VPMM's allocator core: a virtual-memory pool in numba (design: docs/vpmm.md, seed 5).

malloc, free, defragmentation and preallocation over the tables of
pyvgpu/jit/vpmm_tables.py, and the C entry points (cfuncs) the shim and
``pyvgpu.vpmm`` call. Driver calls go through function pointers (``call_i32``),
resolved in the process, so a pool under `pyvgpu wrap` creates its pages
through the shim's cuMemCreate hook and is charged against the group's cap
like any allocation.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from pyvgpu.abi import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
)
from pyvgpu.jit.intrinsics import atomic_cas_u64, atomic_store_u64, call_i32, i64_ptr, load_u64, stack_u64, yield_cpu
from pyvgpu.jit.vpmm_tables import (
    ADDR,
    ERR_TABLE_FULL,
    EVENT,
    F_ALLOC_ASYNC,
    F_FREE_ASYNC,
    F_UNMAP,
    F_WAIT,
    FREE,
    H_DEFRAGS,
    H_EVENTS,
    H_LIVE,
    H_LOCK,
    H_NEXT_ID,
    H_NREG,
    H_PAGE,
    H_SMALL,
    HOLE,
    ID,
    MALLOC,
    NCOL,
    NO_EVENT,
    ROOT,
    SIZE,
    STATE,
    STREAM,
    ZOMBIE,
    event_done,
    event_new,
    event_unref,
    find,
    fn,
    map_range,
    merge_around,
    new_pages,
    page_move,
    reserve,
    set_access,
    split,
)

# --- malloc -------------------------------------------------------------------------------

@njit
def cleanup_zombies(reg, hd):
    """Phase 0: unmap old addresses whose event completed; they become holes. Adjacent ones go in one
    cuMemUnmap (each call costs ~70 us on an H100, on top of its pages)."""
    i = 0
    changed = False
    while i < hd[H_NREG]:
        if reg[i, STATE] == ZOMBIE and event_done(hd, reg[i, EVENT]):
            j = i
            while (j + 1 < hd[H_NREG] and reg[j + 1, STATE] == ZOMBIE and reg[j + 1, ROOT] == reg[i, ROOT]
                   and reg[j + 1, ADDR] == reg[j, ADDR] + reg[j, SIZE] and event_done(hd, reg[j + 1, EVENT])):
                j += 1
            rc = call_i32(fn(hd, F_UNMAP), (np.uint64(reg[i, ADDR]), np.uint64(reg[j, ADDR] + reg[j, SIZE]
                                                                                 - reg[i, ADDR])))
            if rc != CUDA_SUCCESS:
                return rc
            for k in range(i, j + 1):
                event_unref(hd, reg[k, EVENT])
                reg[k, STATE] = HOLE
                reg[k, EVENT] = NO_EVENT
                reg[k, STREAM] = 0
            changed = True
            i = j
        i += 1
    if changed:
        merge_holes(reg, hd)
    return CUDA_SUCCESS


@njit
def best_fit(reg, hd, size, stream, same):
    """Phase 1: the smallest free region that fits: of the caller's stream (same), or of another stream
    whose event has completed (no waiting either way)."""
    best = -1
    for i in range(hd[H_NREG]):
        if reg[i, STATE] != FREE or reg[i, SIZE] < size or (reg[i, STREAM] == stream) != same:
            continue
        if best >= 0 and reg[i, SIZE] >= reg[best, SIZE]:
            continue
        if not same and not event_done(hd, reg[i, EVENT]):
            continue
        best = i
    return best


@njit
def take(reg, hd, i, size):
    """Row i (free) gives its first size bytes to a new allocation; returns the address."""
    if not split(reg, hd, i, size):
        return np.int64(ERR_TABLE_FULL)
    event_unref(hd, reg[i, EVENT])
    reg[i, STATE] = MALLOC
    reg[i, EVENT] = NO_EVENT
    hd[H_LIVE] += size
    return reg[i, ADDR]


@njit
def harvest_next(reg, hd, stream, skip_addr):
    """The next free region to move in a defragmentation: the caller's stream first, then others;
    oldest (lowest id) first within each; never the region at skip_addr (it stays in place)."""
    best = -1
    for pass_same in (True, False):
        for i in range(hd[H_NREG]):
            if reg[i, STATE] != FREE or reg[i, ADDR] == skip_addr or (reg[i, STREAM] == stream) != pass_same:
                continue
            if best < 0 or reg[i, ID] < reg[best, ID]:
                best = i
        if best >= 0:
            return best
    return best


@njit
def defragment(reg, hd, pg, size, stream):
    """Phase 2: build a free span of size bytes in a hole, from moved free pages and new ones.

    The hole is the smallest unmapped interval that, together with a free region of the
    caller's stream right before it (used in place), holds size bytes; with none, a new VA
    chunk. The shortfall (size - free bytes) is created as new pages. Free regions are then
    moved into the hole - caller's stream first, then other streams, oldest first - each
    as much as remains of size - shortfall: their pages are mapped at the new address,
    and the old address becomes a zombie, unmapped once its event completes. Regions of
    other streams whose event has not completed make the caller's stream wait for it
    on the GPU (cuStreamWaitEvent); the CPU never waits.
    Returns the address of the span (its row is FREE, of the caller's stream), or < 0.
    """
    page = hd[H_PAGE]
    hole = -1
    in_place = 0
    for i in range(hd[H_NREG]):
        if reg[i, STATE] != HOLE:
            continue
        before = 0
        if (i > 0 and reg[i - 1, STATE] == FREE and reg[i - 1, STREAM] == stream and reg[i - 1, ROOT] == reg[i, ROOT]
                and reg[i - 1, ADDR] + reg[i - 1, SIZE] == reg[i, ADDR]):
            before = reg[i - 1, SIZE]
        if reg[i, SIZE] + before < size:
            continue
        if hole < 0 or reg[i, SIZE] < reg[hole, SIZE]:
            hole, in_place = i, before
    if hole < 0:
        hole = reserve(reg, hd, size)
        if hole < 0:
            return hole
        in_place = 0
    start = reg[hole, ADDR] - in_place
    skip = start if in_place > 0 else np.int64(-1)
    free_total = 0
    for i in range(hd[H_NREG]):
        if reg[i, STATE] == FREE:
            free_total += reg[i, SIZE]
    shortfall = max(0, size - free_total)
    dst = reg[hole, ADDR]
    # The shortfall first, as new pages where they end up (after the moved ones: every free byte but
    # the in-place part moves when there is a shortfall): if the cap refuses them nothing has moved yet.
    rc = new_pages(hd, pg, dst + size - in_place - shortfall, shortfall // page)
    if rc != CUDA_SUCCESS:
        return np.int64(-1000 - rc)
    # move free regions into the hole, right after the in-place part
    room = reg[hole, SIZE] - shortfall  # the hole holds the moved pages and then the new ones
    taken = 0
    while in_place + shortfall + taken < size:
        r = harvest_next(reg, hd, stream, skip)
        if r < 0:
            break
        amount = min(size - shortfall - taken, reg[r, SIZE], room - taken)
        if not split(reg, hd, r, amount):
            return np.int64(ERR_TABLE_FULL)
        ev = reg[r, EVENT]
        if reg[r, STREAM] != stream and not event_done(hd, ev):
            rc = call_i32(fn(hd, F_WAIT), (np.uint64(stream), np.uint64(hd[H_EVENTS + 2 * ev]), np.uint32(0)))
            if rc != CUDA_SUCCESS:
                return np.int64(-1000 - rc)
        src = reg[r, ADDR]
        for off in range(0, amount, page):
            page_move(pg, src + off, dst + taken + off)
        rc = map_range(hd, dst + taken, amount, pg)
        if rc != CUDA_SUCCESS:
            return np.int64(-1000 - rc)
        if ev == NO_EVENT:  # nobody can be using it: unmap at once
            rc = call_i32(fn(hd, F_UNMAP), (np.uint64(src), np.uint64(amount)))
            if rc != CUDA_SUCCESS:
                return np.int64(-1000 - rc)
            reg[r, STATE] = HOLE
        else:
            reg[r, STATE] = ZOMBIE  # keeps its event reference until it is unmapped
        taken += amount
    hd[H_DEFRAGS] += 1
    grow = taken + shortfall
    rc = set_access(hd, dst, grow)  # moved and new pages at once
    if rc != CUDA_SUCCESS:
        return np.int64(-1000 - rc)
    # the hole's first grow bytes become a free region of the caller's stream, merged with the in-place one
    hole = find(reg, hd, dst)
    if not split(reg, hd, hole, grow):
        return np.int64(ERR_TABLE_FULL)
    # Its event is recorded on the caller's stream after the waits above, so another stream reuses
    # what the caller leaves of it only once the moved pages' old work is done.
    ev = event_new(hd, stream)
    if ev < 0:
        return np.int64(ERR_TABLE_FULL if ev == ERR_TABLE_FULL else ev)
    reg[hole, STATE] = FREE
    reg[hole, STREAM] = stream
    reg[hole, EVENT] = ev
    reg[hole, ID] = hd[H_NEXT_ID]
    hd[H_NEXT_ID] += 1
    merge_around(reg, hd, hole)  # with the in-place region (same stream, the newer event wins)
    merge_holes(reg, hd)
    return start


@njit
def merge_holes(reg, hd):
    """Coalesce adjacent holes (a defragmentation leaves them apart while it works)."""
    i = 0
    while i < hd[H_NREG]:
        if reg[i, STATE] == HOLE:
            i = merge_around(reg, hd, i)
        i += 1


@njit
def malloc(reg, hd, pg, size, stream):
    """Allocate size bytes (rounded up to pages) for stream; the address, or a negative error.

    Under a page: cuMemAllocAsync (the pool never splits a page). -1000 - CUresult for a
    driver error (CUDA_ERROR_OUT_OF_MEMORY at the cap), ERR_TABLE_FULL when the pool's
    tables are full.
    """
    page = hd[H_PAGE]
    if size < page:
        out = stack_u64()
        rc = call_i32(fn(hd, F_ALLOC_ASYNC), (out, np.uint64(max(size, 1)), np.uint64(stream)))
        if rc != CUDA_SUCCESS:
            return np.int64(-1000 - rc)
        hd[H_SMALL] += max(size, 1)
        return np.int64(load_u64(out))
    size = (size + page - 1) // page * page
    rc = cleanup_zombies(reg, hd)
    if rc != CUDA_SUCCESS:
        return np.int64(-1000 - rc)
    i = best_fit(reg, hd, size, stream, True)
    if i < 0:
        i = best_fit(reg, hd, size, stream, False)
    if i < 0:
        a = defragment(reg, hd, pg, size, stream)
        if a < 0:
            return a
        i = find(reg, hd, a)
    return take(reg, hd, i, size)


@njit
def free(reg, hd, ptr, stream):
    """Give back an allocation: it becomes free after an event recorded on stream, merged with free
    neighbours of the same stream. 0, or CUDA_ERROR_INVALID_VALUE for a pointer that is not live here."""
    i = find(reg, hd, ptr)
    if i < 0 or reg[i, STATE] != MALLOC:
        return CUDA_ERROR_INVALID_VALUE
    ev = event_new(hd, stream)
    if ev < 0:
        return np.int64(CUDA_ERROR_OUT_OF_MEMORY if ev == ERR_TABLE_FULL else -ev - 1000)
    hd[H_LIVE] -= reg[i, SIZE]
    reg[i, STATE] = FREE
    reg[i, STREAM] = stream
    reg[i, EVENT] = ev
    reg[i, ID] = hd[H_NEXT_ID]
    hd[H_NEXT_ID] += 1
    merge_around(reg, hd, i)
    return CUDA_SUCCESS


@njit
def preallocate(reg, hd, pg, n):
    """VPMM_PAGES: n pages mapped at the start of the first chunk, free for every stream."""
    if n <= 0:
        return CUDA_SUCCESS
    size = n * hd[H_PAGE]
    h = 0
    while h < hd[H_NREG] and not (reg[h, STATE] == HOLE and reg[h, SIZE] >= size):
        h += 1
    if h == hd[H_NREG]:
        h = reserve(reg, hd, size)
        if h < 0:
            return h
    rc = new_pages(hd, pg, reg[h, ADDR], n)
    if rc == CUDA_SUCCESS:
        rc = set_access(hd, reg[h, ADDR], n * hd[H_PAGE])
    if rc != CUDA_SUCCESS:
        return np.int64(-1000 - rc)
    if not split(reg, hd, h, size):
        return np.int64(ERR_TABLE_FULL)
    reg[h, STATE] = FREE
    reg[h, STREAM] = 0
    reg[h, EVENT] = NO_EVENT
    reg[h, ID] = hd[H_NEXT_ID]
    hd[H_NEXT_ID] += 1
    return CUDA_SUCCESS


# --- the C entry points (cfuncs: no GIL) ------------------------------------------------------
# A pool's state is described by a block of six int64: the addresses and row counts of its
# region table, page table and header. ``entry_malloc``/``entry_free`` take that block's address,
# so one compiled pair serves every pool; a spinlock in the header serialises callers.

S_REG, S_NREG, S_PG, S_NPG, S_HD, S_NHD = range(6)


@njit(inline="always")
def views(state):
    """The pool's tables as arrays, and the header's address (for the lock)."""
    s = carray(i64_ptr(state), (6,))
    reg = carray(i64_ptr(np.uint64(s[S_REG])), (s[S_NREG], NCOL))
    pg = carray(i64_ptr(np.uint64(s[S_PG])), (s[S_NPG], 2))
    hd = carray(i64_ptr(np.uint64(s[S_HD])), (s[S_NHD],))
    return reg, pg, hd, np.uint64(s[S_HD])


@njit(inline="always")
def lock(hd_addr):
    while atomic_cas_u64(hd_addr + H_LOCK * 8, 0, 1) != 0:
        yield_cpu()


@njit(inline="always")
def unlock(hd_addr):
    atomic_store_u64(hd_addr + H_LOCK * 8, 0)


@njit
def entry_malloc(state, size, stream):
    reg, pg, hd, hd_addr = views(state)
    lock(hd_addr)
    r = malloc(reg, hd, pg, size, stream)
    unlock(hd_addr)
    return r


@njit
def entry_free(state, ptr, stream, size):
    """size: what the caller asked for (PyTorch passes it); under a page it came from cuMemAllocAsync."""
    reg, pg, hd, hd_addr = views(state)
    if 0 < size < hd[H_PAGE]:
        rc = call_i32(fn(hd, F_FREE_ASYNC), (np.uint64(ptr), np.uint64(stream)))
        if rc == CUDA_SUCCESS:
            lock(hd_addr)
            hd[H_SMALL] -= size
            unlock(hd_addr)
        return np.int64(rc)
    lock(hd_addr)
    r = free(reg, hd, ptr, stream)
    unlock(hd_addr)
    return np.int64(r)


@njit
def entry_trim(state):
    """Phase 0 alone (pool.trim): 0, or the cuMemUnmap error."""
    reg, pg, hd, hd_addr = views(state)
    lock(hd_addr)
    r = cleanup_zombies(reg, hd)
    unlock(hd_addr)
    return np.int64(r)


@njit
def entry_preallocate(state, n):
    reg, pg, hd, hd_addr = views(state)
    lock(hd_addr)
    r = preallocate(reg, hd, pg, n)
    unlock(hd_addr)
    return np.int64(r)


def _c_trim(state):
    return entry_trim(state)


def _c_preallocate(state, n):
    return entry_preallocate(state, n)


def _c_malloc(state, size, stream):
    return entry_malloc(state, size, stream)


def _c_free(state, ptr, stream, size):
    return entry_free(state, ptr, stream, size)


def compile_entries():
    """The cfuncs behind the pool: int64 malloc(uint64 state, int64 size, uint64 stream), int64
    free(uint64 state, int64 ptr, uint64 stream, int64 size), int64 trim(uint64 state) and int64
    preallocate(uint64 state, int64 pages). Compiling them takes 10-25 s, so numba caches them on disk
    (`pyvgpu warmup --vpmm` does it ahead); with nowhere to write the cache they are compiled each
    time, and stderr says so. Python calls nothing else of this module: that would compile too."""
    import sys

    from numba import cfunc, types

    i64, u64 = types.int64, types.uint64
    sigs = ((i64(u64, i64, u64), _c_malloc), (i64(u64, i64, u64, i64), _c_free), (i64(u64), _c_trim),
            (i64(u64, i64), _c_preallocate))
    try:
        return tuple(cfunc(sig, nopython=True, error_model="numpy", cache=True)(f) for sig, f in sigs)
    except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
        print(f"pyvgpu: VPMM compiles its allocator without a cache ({e}); set NUMBA_CACHE_DIR to a writable "
              "directory to keep it", file=sys.stderr)
        return tuple(cfunc(sig, nopython=True, error_model="numpy")(f) for sig, f in sigs)
