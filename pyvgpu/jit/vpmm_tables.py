"""VPMM's tables: the region table, the page table, the header and its event pool (design: docs/vpmm.md).

All state lives in three int64 arrays owned by ``pyvgpu.vpmm.VirtualMemoryPool``:

* ``reg`` - the regions, one row each, sorted by address; together they
  partition every reserved VA chunk: MALLOC (live), FREE (mapped, free since
  an event on a stream), HOLE (reserved, unmapped) and ZOMBIE (an old address
  of remapped pages, unmapped once its event completes).
* ``pg`` - an open-addressing table, mapped page address -> CUmemGenericAllocationHandle.
* ``hd`` - counters, configuration, driver function pointers and the event pool.

This module holds their layout and the operations on them; the allocator that
decides with them is pyvgpu/jit/vpmm.py.
"""


from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.abi import (
    CU_EVENT_DISABLE_TIMING,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
)
from pyvgpu.jit.intrinsics import call_i32, load_u64, stack_u64

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


