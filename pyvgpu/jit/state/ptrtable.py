"""The per-process allocation records: a lock-free open-addressing table.

Keys are what the driver handed out (device pointers, VMM handles, array
handles); values pack the charged size, the device and the record type.
The table lives in memory the shim maps (ctx.table, 16 bytes an entry).

Why it is correct without locks: a key is inserted once by the thread that
got it from the driver and taken once by the thread that frees it, after
the allocation returned. Inserts claim the first empty or deleted entry
from the key's home by CAS. Entries are never reset to empty, so a later
lookup probing from the home passes every entry the insert passed; it
stops at an empty entry or after the longest displacement any insert used.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.jit.runtime.fields import CTX
from pyvgpu.jit.runtime.intrinsics import atomic_cas_u64, atomic_load_u64, atomic_store_u64

EMPTY, DELETED = np.uint64(0), np.uint64(1)  # stored keys are key + 2: no real key collides with these
_U0, _U1, _U2, _U4, _U16 = np.uint64(0), np.uint64(1), np.uint64(2), np.uint64(4), np.uint64(16)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MINUS_ONE = np.uint64(0xFFFFFFFFFFFFFFFF)

# record types (the top byte of a value)
T_PTR, T_ASYNC, T_VMM, T_ARRAY, T_MODULE = 1, 2, 3, 4, 5
SIZE_MASK = np.uint64((1 << 48) - 1)
_B48, _B56, _B24, _FF = np.uint64(48), np.uint64(56), np.uint64(24), np.uint64(0xFF)


@njit(inline="always")
def pack(size, dev, rtype):
    return (np.uint64(size) & SIZE_MASK) | ((np.uint64(dev) & _FF) << _B48) | (np.uint64(rtype) << _B56)


@njit(inline="always")
def rec_size(v):
    return np.uint64(v) & SIZE_MASK


@njit(inline="always")
def rec_dev(v):
    return np.int32((np.uint64(v) >> _B48) & _FF)


@njit(inline="always")
def rec_type(v):
    return np.int32(np.uint64(v) >> _B56)


@njit(inline="always")
def _home(stored, mask):
    return (((stored >> _U4) * _GOLDEN) >> _B24) & mask


@njit
def insert(ctx, key, value):
    """Record key -> value; False if the table is full."""
    table = CTX.get_table(ctx)
    mask = CTX.get_table_mask(ctx)
    stored = np.uint64(key) + _U2
    i = _home(stored, mask)
    d = _U0
    while d <= mask:
        e = table + i * _U16
        k = atomic_load_u64(e)
        if k == EMPTY or k == DELETED:
            if atomic_cas_u64(e, k, stored) == k:
                atomic_store_u64(e + 8, value)
                CTX.max_table_maxdisp(ctx, d)
                CTX.add_table_live(ctx, _U1)
                return True
            continue  # lost the race for this entry: look at it again
        i = (i + _U1) & mask
        d += _U1
    return False


@njit
def take(ctx, key):
    """Remove the record of ``key`` and return its value; 0 if there is none."""
    table = CTX.get_table(ctx)
    mask = CTX.get_table_mask(ctx)
    maxd = CTX.load_table_maxdisp(ctx)
    stored = np.uint64(key) + _U2
    i = _home(stored, mask)
    d = _U0
    while d <= maxd:
        e = table + i * _U16
        k = atomic_load_u64(e)
        if k == EMPTY:
            return _U0
        if k == stored:
            v = atomic_load_u64(e + 8)
            if atomic_cas_u64(e, stored, DELETED) == stored:
                CTX.add_table_live(ctx, _MINUS_ONE)
                return v
            return _U0
        i = (i + _U1) & mask
        d += _U1
    return _U0
