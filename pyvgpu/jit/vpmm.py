"""VPMM's allocator core: a virtual-memory pool in numba (design: docs/vpmm.md, seed 5).

All state lives in three int64 arrays owned by ``pyvgpu.vpmm.VirtualMemoryPool``:

* ``reg`` - the regions, one row each, sorted by address; together they
  partition every reserved VA chunk: MALLOC (live), FREE (mapped, free since
  an event on a stream), HOLE (reserved, unmapped) and ZOMBIE (an old address
  of remapped pages, unmapped once its event completes).
* ``pg`` - an open-addressing table, mapped page address -> CUmemGenericAllocationHandle.
* ``hd`` - counters, configuration, driver function pointers and the event pool.

Driver calls go through function pointers (``call_i32``), resolved in the
process, so a pool under `pyvgpu wrap` creates its pages through the shim's
cuMemCreate hook and is charged against the group's cap like any allocation.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from pyvgpu.abi import (  # noqa: F401  (re-exported: pyvgpu/vpmm.py reads the codes from here)
    CU_EVENT_DISABLE_TIMING,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
)
from pyvgpu.jit.intrinsics import atomic_cas_u64, atomic_store_u64, call_i32, i64_ptr, load_u64, stack_u64, yield_cpu

# region columns and states
ADDR, SIZE, STATE, STREAM, EVENT, ID, ROOT, NCOL = 0, 1, 2, 3, 4, 5, 6, 7
MALLOC, FREE, HOLE, ZOMBIE = 1, 2, 3, 4
NO_EVENT = -1  # a free region nobody waits for (preallocated pages)

# hd: the header
(H_NREG, H_PAGE, H_VA, H_DEV, H_NEXT_ID, H_PAGES, H_NROOTS, H_LIVE, H_SMALL, H_PROP, H_ACCESS,
 H_NEV, H_LOCK, H_DEFRAGS, H_GROWN, H_ERR) = range(16)
# driver functions, from H_FN on
(F_RESERVE, F_CREATE, F_MAP, F_SET_ACCESS, F_UNMAP, F_EV_CREATE, F_EV_RECORD, F_EV_QUERY, F_WAIT,
 F_ALLOC_ASYNC, F_FREE_ASYNC, F_RELEASE) = range(12)
H_FN = 16
H_EVENTS = 32  # then MAX_EVENTS x (handle, refcount)
MAX_EVENTS = 4096
HD_SIZE = H_EVENTS + 2 * MAX_EVENTS

ERR_TABLE_FULL = -2  # more regions or events than the pool has rows for


# --- small helpers ---------------------------------------------------------------------

@njit(inline="always")
def fn(hd, f):
    return np.uint64(hd[H_FN + f])


@njit
def event_done(hd, ev):
    """True if the free event ev (an index into the event pool) has completed."""
    if ev == NO_EVENT:
        return True
    return call_i32(fn(hd, F_EV_QUERY), (np.uint64(hd[H_EVENTS + 2 * ev]),)) == CUDA_SUCCESS


@njit
def event_ref(hd, ev):
    if ev != NO_EVENT:
        hd[H_EVENTS + 2 * ev + 1] += 1


@njit
def event_unref(hd, ev):
    if ev != NO_EVENT:
        hd[H_EVENTS + 2 * ev + 1] -= 1


@njit
def event_new(hd, stream):
    """An event recorded on stream now: a pooled one no region refers to any more, else a new one."""
    n = hd[H_NEV]
    for i in range(n):
        if hd[H_EVENTS + 2 * i + 1] == 0:
            break
    else:
        if n >= MAX_EVENTS:
            return np.int64(ERR_TABLE_FULL)
        out = stack_u64()
        rc = call_i32(fn(hd, F_EV_CREATE), (out, np.uint32(CU_EVENT_DISABLE_TIMING)))
        if rc != CUDA_SUCCESS:
            return np.int64(-1000 - rc)
        hd[H_EVENTS + 2 * n] = np.int64(load_u64(out))
        hd[H_NEV] = n + 1
        i = n
    rc = call_i32(fn(hd, F_EV_RECORD), (np.uint64(hd[H_EVENTS + 2 * i]), np.uint64(stream)))
    if rc != CUDA_SUCCESS:
        return np.int64(-1000 - rc)
    hd[H_EVENTS + 2 * i + 1] = 1
    return np.int64(i)


# --- the region table ---------------------------------------------------------------------

@njit
def find(reg, hd, addr):
    """Row of the region starting at addr, or -1 (binary search: rows are sorted by address)."""
    lo, hi = 0, hd[H_NREG] - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        a = reg[mid, ADDR]
        if a == addr:
            return mid
        if a < addr:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


@njit
def insert_after(reg, hd, i):
    """Make room for a row at i + 1 (rows after it move down); False when the table is full."""
    n = hd[H_NREG]
    if n >= reg.shape[0]:
        return False
    for j in range(n, i + 1, -1):
        reg[j, :] = reg[j - 1, :]
    hd[H_NREG] = n + 1
    return True


@njit
def remove(reg, hd, i):
    n = hd[H_NREG]
    for j in range(i, n - 1):
        reg[j, :] = reg[j + 1, :]
    hd[H_NREG] = n - 1


@njit
def split(reg, hd, i, size):
    """Cut row i after size bytes; the tail (same state, stream, event: one more reference) is row i + 1."""
    if reg[i, SIZE] == size:
        return True
    if not insert_after(reg, hd, i):
        return False
    reg[i + 1, :] = reg[i, :]
    reg[i + 1, ADDR] = reg[i, ADDR] + size
    reg[i + 1, SIZE] = reg[i, SIZE] - size
    reg[i, SIZE] = size
    if reg[i, STATE] == FREE or reg[i, STATE] == ZOMBIE:
        event_ref(hd, reg[i + 1, EVENT])
    return True


@njit
def mergeable(reg, a, b):
    """Rows a and b (adjacent in the table) touch and may be one region."""
    if reg[a, ROOT] != reg[b, ROOT] or reg[a, ADDR] + reg[a, SIZE] != reg[b, ADDR] or reg[a, STATE] != reg[b, STATE]:
        return False
    if reg[a, STATE] == HOLE:
        return True
    return reg[a, STATE] == FREE and reg[a, STREAM] == reg[b, STREAM]


@njit
def merge_around(reg, hd, i):
    """Coalesce row i with its neighbours where allowed; returns i's new row. Two free regions of one
    stream keep the later event (stream order: it completes after the earlier one)."""
    if i + 1 < hd[H_NREG] and mergeable(reg, i, i + 1):
        keep, drop = (i, i + 1) if reg[i, ID] >= reg[i + 1, ID] else (i + 1, i)
        if reg[i, STATE] == FREE:
            event_unref(hd, reg[drop, EVENT])
            reg[i, EVENT] = reg[keep, EVENT]
            reg[i, ID] = reg[keep, ID]
        reg[i, SIZE] += reg[i + 1, SIZE]
        remove(reg, hd, i + 1)
    if i > 0 and mergeable(reg, i - 1, i):
        keep = i if reg[i, ID] >= reg[i - 1, ID] else i - 1
        drop = i - 1 if keep == i else i
        if reg[i, STATE] == FREE:
            event_unref(hd, reg[drop, EVENT])
            reg[i - 1, EVENT] = reg[keep, EVENT]
            reg[i - 1, ID] = reg[keep, ID]
        reg[i - 1, SIZE] += reg[i, SIZE]
        remove(reg, hd, i)
        i -= 1
    return i


# --- pages --------------------------------------------------------------------------------

@njit
def page_slot(pg, va, insert):
    """The row of page va in the open-addressing table, or -1. With insert, a missing va takes the
    first tombstone of its probe run (so moves do not fill the table with them), else the empty slot."""
    mask = pg.shape[0] - 1
    h = (np.uint64(va) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    i = np.int64(h & np.uint64(mask))
    tomb = np.int64(-1)
    for _ in range(pg.shape[0]):
        k = pg[i, 0]
        if k == va:
            return i
        if k == -1 and tomb < 0:
            tomb = i
        if k == 0:
            break
        i = (i + 1) & mask
    else:
        i = np.int64(-1)
    if not insert:
        return np.int64(-1)
    if tomb >= 0:
        i = tomb
    if i >= 0:
        pg[i, 0] = va
    return i


@njit
def page_move(pg, old, new):
    """The page mapped at old is now (also) at new: the table follows its current address."""
    i = page_slot(pg, old, False)
    h = pg[i, 1]
    pg[i, 1] = 0  # a tombstone keeps later keys of the probe run findable
    pg[i, 0] = -1
    j = page_slot(pg, new, True)
    pg[j, 1] = h


@njit
def map_range(hd, va, size, pg):
    """Map pages at va, each its own handle from pg (already moved there). Access is granted by the
    caller, once for everything it mapped: cuMemSetAccess costs ~100 us a call on an H100 (docs/vpmm.md)."""
    page = hd[H_PAGE]
    for off in range(0, size, page):
        h = pg[page_slot(pg, va + off, False), 1]
        rc = call_i32(fn(hd, F_MAP), (np.uint64(va + off), np.uint64(page), np.uint64(0), np.uint64(h),
                                      np.uint64(0)))
        if rc != CUDA_SUCCESS:
            return rc
    return CUDA_SUCCESS


@njit
def set_access(hd, va, size):
    """Let the pool's device read and write [va, va + size) (every page in it freshly mapped)."""
    if size <= 0:
        return CUDA_SUCCESS
    return call_i32(fn(hd, F_SET_ACCESS), (np.uint64(va), np.uint64(size), np.uint64(hd[H_ACCESS]), np.uint64(1)))


@njit
def drop_pages(hd, pg, va, n, mapped):
    """Undo part of new_pages: unmap the first ``mapped`` of n pages at va and release all n, so a
    refused request leaves neither pages nor charges behind."""
    page = hd[H_PAGE]
    for k in range(n):
        if k < mapped:
            call_i32(fn(hd, F_UNMAP), (np.uint64(va + k * page), np.uint64(page)))
        i = page_slot(pg, va + k * page, False)
        call_i32(fn(hd, F_RELEASE), (np.uint64(pg[i, 1]),))
        pg[i, 1] = 0
        pg[i, 0] = -1
        hd[H_PAGES] -= 1
        hd[H_GROWN] -= 1


@njit
def new_pages(hd, pg, va, n):
    """Create n pages (cuMemCreate: charged to the group's cap under pyvgpu wrap) and map them at va
    (the caller grants access). All or nothing: on a refusal (the cap, a full device) what was made is
    released again."""
    page = hd[H_PAGE]
    out = stack_u64()
    for k in range(n):
        rc = call_i32(fn(hd, F_CREATE), (out, np.uint64(page), np.uint64(hd[H_PROP]), np.uint64(0)))
        if rc != CUDA_SUCCESS:
            drop_pages(hd, pg, va, k, k)
            return rc
        h = load_u64(out)
        slot = page_slot(pg, va + k * page, True)
        if slot < 0:
            call_i32(fn(hd, F_RELEASE), (h,))
            drop_pages(hd, pg, va, k, k)
            return CUDA_ERROR_OUT_OF_MEMORY
        pg[slot, 1] = np.int64(h)
        hd[H_PAGES] += 1
        hd[H_GROWN] += 1
        rc = call_i32(fn(hd, F_MAP), (np.uint64(va + k * page), np.uint64(page), np.uint64(0), h, np.uint64(0)))
        if rc != CUDA_SUCCESS:
            drop_pages(hd, pg, va, k + 1, k)
            return rc
    return CUDA_SUCCESS


@njit
def reserve(reg, hd, size):
    """Reserve another VA chunk (at least size bytes) as one hole; its row, or a negative error."""
    va = max(hd[H_VA], size)
    out = stack_u64()
    rc = call_i32(fn(hd, F_RESERVE), (out, np.uint64(va), np.uint64(hd[H_PAGE]), np.uint64(0), np.uint64(0)))
    if rc != CUDA_SUCCESS:
        return np.int64(-1000 - rc)
    addr = np.int64(load_u64(out))
    n = hd[H_NREG]
    i = n - 1
    while i >= 0 and reg[i, ADDR] > addr:
        i -= 1
    if not insert_after(reg, hd, i):
        return np.int64(ERR_TABLE_FULL)
    i += 1
    reg[i, ADDR] = addr
    reg[i, SIZE] = va
    reg[i, STATE] = HOLE
    reg[i, STREAM] = 0
    reg[i, EVENT] = NO_EVENT
    reg[i, ID] = 0
    reg[i, ROOT] = hd[H_NROOTS]
    hd[H_NROOTS] += 1
    return i


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
