"""VPMM's housekeeping: zombies, deferred events, and giving memory back (design: docs/vpmm.md).

* A zombie (the old address of pages that moved) stays mapped after its work is
  done: unmapping costs a driver call plus time per page (docs/vpmm.md), so it is not
  done on the malloc path. Zombies are unmapped in batches (one call per
  contiguous run) by ``unmap_stale``: when the tables run tight, on `trim`, and
  before pages are released.
* ``release_free`` gives free pages back to the driver (and the cap): on `trim`,
  and at the next operation after the group was refused memory or its cap was
  lowered (``pressure``).

Nothing here runs during a CUDA graph capture: event queries are illegal then.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract.abi import CUDA_SUCCESS
from pyvgpu.jit.runtime.intrinsics import atomic_load_u64
from pyvgpu.jit.vpmm import driver as D
from pyvgpu.jit.vpmm.tables import (
    ADDR,
    EV_DEFERRED,
    EVENT,
    FREE,
    GRAPH,
    H_NPG,
    H_NREG,
    H_PAGE,
    H_RELEASED,
    H_SEEN_LIMIT,
    H_SEEN_REFUSALS,
    H_TRIMS,
    H_UNSETTLED,
    H_WATCH_LIMIT,
    H_WATCH_REFUSALS,
    HOLE,
    NO_EVENT,
    ROOT,
    SIZE,
    STATE,
    STREAM,
    XEV,
    ZOMBIE,
    copy_row,
    event_unref,
    insert_after,
    merge_all,
    pg_del,
    pg_get,
    rows_free,
    stat_pages,
    steps,
)


@njit
def settle(reg, hd):
    """Zombies whose work is done drop their events (stale: unmappable any time, mergeable); free regions
    whose event waited for a capture to end get it once their stream no longer captures. Returns 0, or
    -1000 - CUresult when recording a deferred event failed (nothing changed for that region)."""
    if hd[H_UNSETTLED] == 0:
        return np.int64(0)
    changed = False
    for i in range(hd[H_NREG]):
        s = reg[i, STATE]
        if s == ZOMBIE and (reg[i, EVENT] != NO_EVENT or reg[i, XEV] != NO_EVENT):
            if D.event_done(hd, reg[i, EVENT]) and D.event_done(hd, reg[i, XEV]):
                event_unref(hd, reg[i, EVENT])
                event_unref(hd, reg[i, XEV])
                reg[i, EVENT] = NO_EVENT
                reg[i, XEV] = NO_EVENT
                hd[H_UNSETTLED] -= 1
                changed = True
        elif s == FREE and reg[i, EVENT] == EV_DEFERRED:
            c = D.is_capturing(hd, reg[i, STREAM])
            if c < 0:
                return c
            if c == 0:
                ev = D.event_new(hd, reg[i, STREAM])
                if ev < 0:
                    return ev
                reg[i, EVENT] = ev
                hd[H_UNSETTLED] -= 1
                changed = True
    if changed:
        merge_all(reg, hd)
    return np.int64(0)


@njit
def stale(reg, i):
    return reg[i, STATE] == ZOMBIE and reg[i, EVENT] == NO_EVENT and reg[i, XEV] == NO_EVENT


@njit
def unmap_stale(reg, hd, pg):
    """Unmap every stale zombie, one cuMemUnmap per contiguous run; they become holes. 0, or the CUresult
    of a failed unmap (that run stays a zombie, mapped; the pool is consistent)."""
    page = hd[H_PAGE]
    i = 0
    rc = CUDA_SUCCESS
    while i < hd[H_NREG]:
        if not stale(reg, i):
            i += 1
            continue
        j = i  # stale zombies merge, but a run may still span rows (different roots never touch)
        while (j + 1 < hd[H_NREG] and stale(reg, j + 1) and reg[j + 1, ADDR] == reg[j, ADDR] + reg[j, SIZE]
               and reg[j + 1, ROOT] == reg[i, ROOT]):
            j += 1
        a, n = reg[i, ADDR], reg[j, ADDR] + reg[j, SIZE] - reg[i, ADDR]
        rc = D.unmap(hd, a, n)
        if rc != CUDA_SUCCESS:
            break
        for q in range(steps(0, n, page)):
            pg_del(pg, hd, a + q * page)
        for k in range(i, j + 1):
            reg[k, STATE] = HOLE
            reg[k, STREAM] = 0
        i = j + 1
    merge_all(reg, hd)
    return rc


@njit
def tight(reg, hd, pg):
    """The tables are filling up (rows or page addresses): time to unmap stale zombies."""
    return hd[H_NREG] > reg.shape[0] * 3 // 4 or hd[H_NPG] > pg.shape[0] * 3 // 8


@njit
def _busy_handle(hd, pg, scr, nbusy, h):
    for k in range(nbusy):
        if scr[k] == h:
            return True
    return False


@njit
def release_free(reg, hd, pg, scr):
    """Give every free page nobody can still be using back to the driver: stale zombies are unmapped
    first (a page is freed only when its last mapping goes); a free region whose pages an unfinished
    zombie still maps, whose work is not done, or that belongs to a CUDA graph stays. Returns the pages
    released, or -1000 - CUresult (what was released so far stays released; the rest is unchanged)."""
    rc = settle(reg, hd)
    if rc < 0:
        return rc
    rc = unmap_stale(reg, hd, pg)
    if rc != CUDA_SUCCESS:
        return D.driver_error(rc)
    page = hd[H_PAGE]
    # handles an unfinished zombie still maps: its old address may still be in use on the GPU
    nbusy = 0
    for i in range(hd[H_NREG]):
        if reg[i, STATE] == ZOMBIE:
            for q in range(steps(0, reg[i, SIZE], page)):
                off = q * page
                if nbusy < scr.shape[0]:
                    scr[nbusy] = pg_get(pg, reg[i, ADDR] + off)
                    nbusy += 1
    released = 0
    i = 0
    while i < hd[H_NREG]:
        if (reg[i, STATE] != FREE or reg[i, GRAPH] != 0 or not D.event_done(hd, reg[i, EVENT])
                or not D.event_done(hd, reg[i, XEV])):
            i += 1
            continue
        if rows_free(reg, hd) < 1:  # a failed release may need a row for the released head
            break
        a, n = reg[i, ADDR], reg[i, SIZE]
        busy = nbusy >= scr.shape[0]
        for q in range(steps(0, n, page)):
            off = q * page
            if busy or _busy_handle(hd, pg, scr, nbusy, pg_get(pg, a + off)):
                busy = True
                break
        if busy:
            i += 1
            continue
        rc = D.unmap(hd, a, n)
        if rc != CUDA_SUCCESS:
            merge_all(reg, hd)
            return D.driver_error(rc)
        for q in range(steps(0, n, page)):
            off = q * page
            rc = D.release(hd, pg_get(pg, a + off))
            if rc != CUDA_SUCCESS:
                _restore_tail(reg, hd, pg, i, a, off, n)
                merge_all(reg, hd)
                return D.driver_error(rc)
            pg_del(pg, hd, a + off)
            stat_pages(hd, -1)
            hd[H_RELEASED] += 1
            released += 1
        event_unref(hd, reg[i, EVENT])
        event_unref(hd, reg[i, XEV])
        reg[i, STATE] = HOLE
        reg[i, EVENT] = NO_EVENT
        reg[i, XEV] = NO_EVENT
        reg[i, STREAM] = 0
        i += 1
    merge_all(reg, hd)
    D.trim_small(hd)
    hd[H_TRIMS] += 1
    return np.int64(released)


@njit
def _restore_tail(reg, hd, pg, i, a, off, n):
    """cuMemRelease failed at page a + off of row i, which was unmapped whole: map the pages not yet
    released back (the row keeps them, free as before) and make the released head a hole. If mapping
    them back fails too, they are unmapped and held: the row becomes a hole and they are lost to the pool
    (counted in the driver's calls; the cap still charges them until the process ends)."""
    page = hd[H_PAGE]
    ok = True
    for q in range(steps(off, n, page)):
        back = off + q * page
        if D.map_page(hd, a + back, pg_get(pg, a + back)) != CUDA_SUCCESS:
            ok = False
            break
    if ok:
        ok = D.set_access(hd, a + off, n - off) == CUDA_SUCCESS
    if not ok:
        event_unref(hd, reg[i, EVENT])
        event_unref(hd, reg[i, XEV])
        reg[i, STATE] = HOLE
        reg[i, EVENT] = NO_EVENT
        reg[i, XEV] = NO_EVENT
        return
    if off == 0:
        return
    if insert_after(reg, hd, i - 1):  # (the caller made sure a row is free) row i moves to i + 1
        copy_row(reg, i, i + 1)
        reg[i, SIZE] = off
        reg[i, STATE] = HOLE
        reg[i, STREAM] = 0
        reg[i, EVENT] = NO_EVENT
        reg[i, XEV] = NO_EVENT
        reg[i, GRAPH] = 0
        reg[i + 1, ADDR] = a + off
        reg[i + 1, SIZE] = n - off


@njit
def pressure(hd):
    """True once after the group was refused memory (its device's oom_refusals moved) or its cap was
    lowered (`pyvgpu limits set`); the addresses are the region's, 0 outside pyvgpu wrap."""
    hit = False
    if hd[H_WATCH_REFUSALS] != 0:
        r = np.int64(atomic_load_u64(np.uint64(hd[H_WATCH_REFUSALS])))
        if r != hd[H_SEEN_REFUSALS]:
            hd[H_SEEN_REFUSALS] = r
            hit = True
    if hd[H_WATCH_LIMIT] != 0:
        lim = np.int64(atomic_load_u64(np.uint64(hd[H_WATCH_LIMIT])))
        if lim != hd[H_SEEN_LIMIT]:
            if lim != 0 and (hd[H_SEEN_LIMIT] == 0 or lim < hd[H_SEEN_LIMIT]):
                hit = True
            hd[H_SEEN_LIMIT] = lim
    return hit


@njit
def absorb_refusals(hd):
    """The pool was refused itself: the refusals counted so far are its own (or of the same moment), not a
    reason to give its free pages away at its next operation."""
    if hd[H_WATCH_REFUSALS] != 0:
        hd[H_SEEN_REFUSALS] = np.int64(atomic_load_u64(np.uint64(hd[H_WATCH_REFUSALS])))
