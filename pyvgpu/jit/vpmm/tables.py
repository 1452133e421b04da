"""VPMM's tables: the region table, the page table and the header (design: docs/vpmm.md).

All state lives in int64 arrays owned by ``pyvgpu.vpmm.pool.VirtualMemoryPool``:

* ``reg`` - the regions, one row each, sorted by address; together they
  partition every reserved VA chunk: MALLOC (live), FREE (mapped, free since
  an event on a stream), HOLE (reserved, unmapped) and ZOMBIE (an old address
  of pages that moved; it stays mapped until a trim, see docs/vpmm.md).
* ``pg`` - an open-addressing table, mapped page address -> CUmemGenericAllocationHandle,
  for every mapped address: a page that moved is found at its new address and,
  while its old address is a zombie, at that one too.
* ``hd`` - counters, configuration, driver function pointers, the statistics
  (torch.cuda.memory_stats' shape), the record_stream table and the event pool.
* ``scr`` - scratch: the handles of one defragmentation while it is not committed.

This module holds their layout and the operations on them; the driver calls are
in pyvgpu/jit/vpmm/driver.py, the allocator in pyvgpu/jit/vpmm/core.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# region columns. REQ: bytes asked (MALLOC). XEV: FREE/ZOMBIE: the event of record_stream's side streams
# (or NO_EVENT); MALLOC: how many record_stream entries the allocation has. GRAPH: the CUDA graph capture
# (epoch) the region belongs to, 0 for none.
ADDR, SIZE, STATE, STREAM, EVENT, ID, ROOT, REQ, XEV, GRAPH, NCOL = range(11)
MALLOC, FREE, HOLE, ZOMBIE = 1, 2, 3, 4
NO_EVENT = -1  # nobody waits for it (preallocated or new pages, a stale zombie)
EV_DEFERRED = -2  # freed on a capturing stream: its event is recorded once the capture has ended

# hd: the header
(H_NREG, H_PAGE, H_VA, H_DEV, H_NEXT_ID, H_PAGES, H_NROOTS, H_LIVE, H_SMALL, H_PROP, H_ACCESS, H_NEV,
 H_LOCK, H_DEFRAGS, H_GAP, H_NPG, H_EPOCH, H_CAP_STREAM, H_OOMS, H_RETRIES, H_RELEASED, H_TRIMS,
 H_WATCH_REFUSALS, H_WATCH_LIMIT, H_SEEN_REFUSALS, H_SEEN_LIMIT, H_MEMPOOL, H_NSIDE, H_LAZY_LIMIT,
 H_CAPTURE_ACTIVE, H_UNSETTLED, H_PRESSURE, H_INPLACE, H_MOVED, H_MALLOCS, H_FREES, H_CTX, H_CTX_NONE,
 H_CTX_OTHER) = range(39)
# H_CTX: the device's primary context, made current around every entry point's driver calls (vpmm_driver.ctx_enter);
# H_CTX_NONE / H_CTX_OTHER: entries that found no context current on their thread / another one (switches).
# driver functions, from H_FN on
(F_RESERVE, F_CREATE, F_MAP, F_SET_ACCESS, F_UNMAP, F_EV_CREATE, F_EV_RECORD, F_EV_QUERY, F_WAIT,
 F_ALLOC_ASYNC, F_FREE_ASYNC, F_RELEASE, F_ADDR_FREE, F_IS_CAPTURING, F_POOL_TRIM, F_CTX_SYNC, F_CAPTURE_MODE,
 F_CTX_GET, F_CTX_SET, N_FN) = range(20)
FN_NAMES = ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuEventCreate",
            "cuEventRecord", "cuEventQuery", "cuStreamWaitEvent", "cuMemAllocAsync", "cuMemFreeAsync",
            "cuMemRelease", "cuMemAddressFree", "cuStreamIsCapturing", "cuMemPoolTrimTo", "cuCtxSynchronize",
            "cuThreadExchangeStreamCaptureMode", "cuCtxGetCurrent", "cuCtxSetCurrent")
H_FN = 48
H_CALLS = H_FN + 32  # calls made, per driver function (same order)
H_ACCESS_PAGES = H_CALLS + 32  # pages covered by cuMemSetAccess calls
H_UNMAP_PAGES = H_ACCESS_PAGES + 1  # pages covered by cuMemUnmap calls
# statistics in torch.cuda.memory_stats' shape: each is (current, peak, allocated, freed)
(ST_ALLOC_ALL, ST_ALLOC_LARGE, ST_ALLOC_SMALL, ST_BYTES_ALL, ST_BYTES_LARGE, ST_BYTES_SMALL, ST_REQ_ALL,
 ST_REQ_LARGE, ST_REQ_SMALL, ST_RES_ALL, ST_RES_LARGE, ST_RES_SMALL, ST_SEG_ALL, ST_SEG_LARGE, ST_SEG_SMALL,
 N_STATS) = range(16)
H_STATS = H_UNMAP_PAGES + 16
CUR, PEAK, ALLOCATED, FREED = range(4)
# record_stream: (allocation address, side stream) pairs
H_SIDE = H_STATS + 4 * N_STATS
MAX_SIDE = 256
H_EVENTS = H_SIDE + 2 * MAX_SIDE  # then MAX_EVENTS x (handle, refcount, completed)
MAX_EVENTS = 4096
HD_SIZE = H_EVENTS + 3 * MAX_EVENTS

ERR_TABLE_FULL = -2  # more regions, pages, events or record_stream entries than the pool has rows for
ERR_DRIVER = -1000  # -1000 - CUresult: a driver call failed


@njit(inline="always")
def fn(hd, f):
    return np.uint64(hd[H_FN + f])


@njit(inline="always")
def driver_error(rc):
    return np.int64(ERR_DRIVER - rc)


# --- statistics ------------------------------------------------------------------------------

@njit(inline="always")
def stat_add(hd, s, delta):
    """Move statistic s by delta: its current value, its peak, and what was allocated or freed in total."""
    b = H_STATS + 4 * s
    hd[b + CUR] += delta
    if delta > 0:
        hd[b + ALLOCATED] += delta
        if hd[b + CUR] > hd[b + PEAK]:
            hd[b + PEAK] = hd[b + CUR]
    else:
        hd[b + FREED] -= delta


@njit
def stat_pages(hd, n):
    """n pages were created (n > 0) or released (n < 0): reserved bytes and segments of the large pool."""
    hd[H_PAGES] += n
    stat_add(hd, ST_RES_LARGE, n * hd[H_PAGE])
    stat_add(hd, ST_RES_ALL, n * hd[H_PAGE])
    stat_add(hd, ST_SEG_LARGE, n)
    stat_add(hd, ST_SEG_ALL, n)


@njit
def stat_alloc(hd, large, size, req, sign):
    """An allocation of size bytes (req asked) was made (sign 1) or freed (sign -1)."""
    stat_add(hd, ST_ALLOC_ALL, sign)
    stat_add(hd, ST_BYTES_ALL, sign * size)
    stat_add(hd, ST_REQ_ALL, sign * req)
    if large:
        stat_add(hd, ST_ALLOC_LARGE, sign)
        stat_add(hd, ST_BYTES_LARGE, sign * size)
        stat_add(hd, ST_REQ_LARGE, sign * req)
    else:
        stat_add(hd, ST_ALLOC_SMALL, sign)
        stat_add(hd, ST_BYTES_SMALL, sign * size)
        stat_add(hd, ST_REQ_SMALL, sign * req)
        stat_add(hd, ST_RES_SMALL, sign * size)
        stat_add(hd, ST_RES_ALL, sign * size)
        stat_add(hd, ST_SEG_SMALL, sign)
        stat_add(hd, ST_SEG_ALL, sign)


# --- events ----------------------------------------------------------------------------------

@njit(inline="always")
def ev_handle(hd, ev):
    return np.uint64(hd[H_EVENTS + 3 * ev])


@njit
def event_ref(hd, ev):
    if ev >= 0:
        hd[H_EVENTS + 3 * ev + 1] += 1


@njit
def event_unref(hd, ev):
    if ev >= 0:
        hd[H_EVENTS + 3 * ev + 1] -= 1


@njit
def event_known_done(hd, ev):
    """Completed, as far as the pool already knows (no driver call: usable during a graph capture)."""
    return ev == NO_EVENT or (ev >= 0 and hd[H_EVENTS + 3 * ev + 2] != 0)


# --- the region table --------------------------------------------------------------------------

@njit
def mark_allocated(reg, hd, i, stream, req, tag):
    """Row i becomes a live allocation of stream: asked for req bytes, captured under graph tag (0: none),
    no event of its own yet, the next id."""
    reg[i, STATE] = MALLOC
    reg[i, STREAM] = stream
    reg[i, EVENT] = NO_EVENT
    reg[i, XEV] = 0
    reg[i, REQ] = req
    reg[i, GRAPH] = tag
    reg[i, ID] = hd[H_NEXT_ID]
    hd[H_NEXT_ID] += 1


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
def find_containing(reg, hd, addr):
    """Row of the region that holds addr, or -1."""
    lo, hi = 0, hd[H_NREG] - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        a = reg[mid, ADDR]
        if a <= addr < a + reg[mid, SIZE]:
            return mid
        if a < addr:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


@njit
def rows_free(reg, hd):
    return reg.shape[0] - hd[H_NREG]


@njit(inline="always")
def steps(start, end, page):
    """How many of range(start, end, page) there are (page > 0): loops count them instead, as numba's range
    with a step it cannot see is not zero keeps a path that raises, which the callback library cannot have."""
    return max((end - start + page - 1) // page, 0)


@njit(inline="always")
def copy_row(reg, dst, src):
    """reg[dst] = reg[src], column by column: a row slice assigned from another made numba copy it through a
    temporary array first (its overlap check), which needs the numba runtime the callback library lacks."""
    for c in range(reg.shape[1]):
        reg[dst, c] = reg[src, c]


@njit
def insert_after(reg, hd, i):
    """Make room for a row at i + 1 (rows after it move down); False when the table is full."""
    n = hd[H_NREG]
    if n >= reg.shape[0]:
        return False
    for j in range(n, i + 1, -1):
        copy_row(reg, j, j - 1)
    hd[H_NREG] = n + 1
    return True


@njit
def remove(reg, hd, i):
    n = hd[H_NREG]
    for j in range(i, n - 1):
        copy_row(reg, j, j + 1)
    hd[H_NREG] = n - 1


@njit
def split(reg, hd, i, size):
    """Cut row i after size bytes (0 < size); the tail (same state, stream, events: one more reference each)
    is row i + 1. Nothing to cut when size is the whole row. False when the table is full."""
    if reg[i, SIZE] == size:
        return True
    if size <= 0:  # a row of no bytes would break the table's order (two rows at one address)
        return False
    if not insert_after(reg, hd, i):
        return False
    copy_row(reg, i + 1, i)
    reg[i + 1, ADDR] = reg[i, ADDR] + size
    reg[i + 1, SIZE] = reg[i, SIZE] - size
    reg[i, SIZE] = size
    if reg[i, STATE] == FREE or reg[i, STATE] == ZOMBIE:
        event_ref(hd, reg[i + 1, EVENT])
        event_ref(hd, reg[i + 1, XEV])
    return True


@njit
def touching(reg, a, b):
    return reg[a, ROOT] == reg[b, ROOT] and reg[a, ADDR] + reg[a, SIZE] == reg[b, ADDR]


@njit
def mergeable(reg, a, b):
    """Rows a and b (adjacent in the table) touch and may be one region: holes; free regions of one stream
    and one capture with no record_stream event; zombies nobody waits for any more."""
    if not touching(reg, a, b) or reg[a, STATE] != reg[b, STATE]:
        return False
    s = reg[a, STATE]
    if s == HOLE:
        return True
    if s == ZOMBIE:
        return (reg[a, EVENT] == NO_EVENT and reg[b, EVENT] == NO_EVENT and reg[a, XEV] == NO_EVENT
                and reg[b, XEV] == NO_EVENT)
    return (s == FREE and reg[a, STREAM] == reg[b, STREAM] and reg[a, GRAPH] == reg[b, GRAPH]
            and reg[a, XEV] == NO_EVENT and reg[b, XEV] == NO_EVENT and reg[a, EVENT] != EV_DEFERRED
            and reg[b, EVENT] != EV_DEFERRED)


@njit
def _merge_pair(reg, hd, a):
    """Merge row a + 1 into row a (mergeable): two free regions of one stream keep the later event (stream
    order: it completes after the earlier one)."""
    b = a + 1
    if reg[a, STATE] == FREE:
        keep, drop = (a, b) if reg[a, ID] >= reg[b, ID] else (b, a)
        event_unref(hd, reg[drop, EVENT])
        reg[a, EVENT] = reg[keep, EVENT]
        reg[a, ID] = reg[keep, ID]
    reg[a, SIZE] += reg[b, SIZE]
    remove(reg, hd, b)


@njit
def merge_around(reg, hd, i):
    """Coalesce row i with its neighbours where allowed; returns i's new row."""
    if i + 1 < hd[H_NREG] and mergeable(reg, i, i + 1):
        _merge_pair(reg, hd, i)
    if i > 0 and mergeable(reg, i - 1, i):
        _merge_pair(reg, hd, i - 1)
        i -= 1
    return i


@njit
def merge_all(reg, hd):
    """Coalesce every mergeable pair (after a defragmentation or a trim changed many rows)."""
    i = 0
    while i + 1 < hd[H_NREG]:
        if mergeable(reg, i, i + 1):
            _merge_pair(reg, hd, i)
        else:
            i += 1


# --- pages -----------------------------------------------------------------------------------

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
def pg_get(pg, va):
    """The handle mapped at page va (0: none)."""
    i = page_slot(pg, va, False)
    return pg[i, 1] if i >= 0 else np.int64(0)


@njit
def pg_put(pg, hd, va, h):
    i = page_slot(pg, va, True)
    if pg[i, 1] == 0:
        hd[H_NPG] += 1
    pg[i, 1] = h


@njit
def pg_del(pg, hd, va):
    i = page_slot(pg, va, False)
    if i >= 0:
        pg[i, 0] = -1  # a tombstone keeps later keys of the probe run findable
        pg[i, 1] = 0
        hd[H_NPG] -= 1


@njit
def pg_room(pg, hd, n):
    """True if n more addresses fit while the table stays at most half full (probe runs stay short)."""
    return hd[H_NPG] + n <= pg.shape[0] // 2
