"""VPMM's C entry points: what the shim and ``pyvgpu.vpmm.pool`` call (design: docs/vpmm.md).

They are services of the hook table (``pyvgpu.contract.hooks.SERVICES``, ``vpmm_*``):
pyvgpu/native/callbacks.py compiles them into the callback library with every
other callback, the shim's pv_vpmm.c calls them through the typedefs
generated from that declaration, and ``pyvgpu.vpmm.pool`` through ctypes
prototypes made from it (pyvgpu/native/services.py). One source hash, the callback
library's key (pyvgpu/native/cache.py), says when they must be compiled again.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from pyvgpu.contract.abi import CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS
from pyvgpu.jit.runtime.intrinsics import atomic_cas_u64, atomic_store_u64, i64_ptr, yield_cpu
from pyvgpu.jit.vpmm import driver as D
from pyvgpu.jit.vpmm.core import free, malloc, notify_capture, preallocate, record_stream, release_graph, small_free
from pyvgpu.jit.vpmm.tables import H_LOCK, H_PAGE, MALLOC, NCOL, STATE, driver_error, find
from pyvgpu.jit.vpmm.trim import release_free, settle, unmap_stale

# A pool's state is described by a block of eight int64: the addresses and lengths of its region table,
# page table, header and scratch. The entries take that block's address, so one compiled set serves every
# pool; a spinlock in the header serialises callers. Every entry that calls the driver does it with the
# pool's context current on the calling thread (vpmm_driver.ctx_enter), whatever thread that is.

S_REG, S_NREG, S_PG, S_NPG, S_HD, S_NHD, S_SCR, S_NSCR, N_STATE = range(9)


@njit(inline="always")
def views(state):
    """The pool's tables as arrays, and the header's address (for the lock)."""
    s = carray(i64_ptr(state), (N_STATE,))
    reg = carray(i64_ptr(np.uint64(s[S_REG])), (s[S_NREG], NCOL))
    pg = carray(i64_ptr(np.uint64(s[S_PG])), (s[S_NPG], 2))
    hd = carray(i64_ptr(np.uint64(s[S_HD])), (s[S_NHD],))
    scr = carray(i64_ptr(np.uint64(s[S_SCR])), (s[S_NSCR],))
    return reg, pg, hd, scr, np.uint64(s[S_HD])


@njit(inline="always")
def lock(hd_addr):
    while atomic_cas_u64(hd_addr + H_LOCK * 8, 0, 1) != 0:
        yield_cpu()


@njit(inline="always")
def unlock(hd_addr):
    atomic_store_u64(hd_addr + H_LOCK * 8, 0)


@njit
def entry_malloc(state, size, stream):
    reg, pg, hd, scr, hd_addr = views(state)
    lock(hd_addr)
    r = prev = D.ctx_enter(hd)
    if prev >= D.CTX_KEPT:
        r = malloc(reg, hd, pg, scr, size, stream)
        D.ctx_leave(hd, prev)
    unlock(hd_addr)
    return r


@njit
def entry_free(state, ptr, stream, size):
    """size: what the caller asked for (PyTorch passes it). A pointer the pool holds is the pool's (during a
    capture even small requests are pages); otherwise, under a page, it came from cuMemAllocAsync."""
    reg, pg, hd, scr, hd_addr = views(state)
    lock(hd_addr)
    r = prev = D.ctx_enter(hd)
    if prev >= D.CTX_KEPT:
        i = find(reg, hd, ptr)
        if i >= 0 and reg[i, STATE] == MALLOC:
            r = free(reg, hd, pg, scr, ptr, stream)
        elif 0 <= size < hd[H_PAGE]:  # PyTorch frees a zero-byte tensor's block with size 0
            r = small_free(hd, ptr, stream, size)
        else:
            r = np.int64(CUDA_ERROR_INVALID_VALUE)
        D.ctx_leave(hd, prev)
    unlock(hd_addr)
    return r


@njit
def entry_trim(state, release):
    """pool.trim: unmap the zombies whose work is done; with release, also give free pages back. The pages
    released (0 without release), or a negative error."""
    reg, pg, hd, scr, hd_addr = views(state)
    lock(hd_addr)
    r = prev = D.ctx_enter(hd)
    if prev >= D.CTX_KEPT:
        if release:
            r = release_free(reg, hd, pg, scr)
        else:
            r = settle(reg, hd)
            if r == 0:
                rc = unmap_stale(reg, hd, pg)
                r = driver_error(rc) if rc != CUDA_SUCCESS else np.int64(0)
        D.ctx_leave(hd, prev)
    unlock(hd_addr)
    return r


@njit
def entry_preallocate(state, n):
    reg, pg, hd, scr, hd_addr = views(state)
    lock(hd_addr)
    r = prev = D.ctx_enter(hd)
    if prev >= D.CTX_KEPT:
        r = preallocate(reg, hd, pg, scr, n)
        D.ctx_leave(hd, prev)
    unlock(hd_addr)
    return r


@njit
def entry_record_stream(state, ptr, stream, size):
    reg, pg, hd, scr, hd_addr = views(state)
    lock(hd_addr)
    r = record_stream(reg, hd, ptr, stream, size)
    unlock(hd_addr)
    return r


@njit
def entry_capture(state, stream, what):
    """what: 1 a capture begins on stream, 0 it ended, -N release the memory of capture N (-0: every one)."""
    reg, pg, hd, scr, hd_addr = views(state)
    lock(hd_addr)
    r = prev = D.ctx_enter(hd)
    if prev >= D.CTX_KEPT:
        if what >= 0:
            r = notify_capture(hd, stream, what == 1)
        else:
            r = release_graph(reg, hd, -what - 1)
        D.ctx_leave(hd, prev)
    unlock(hd_addr)
    return r
