"""Stream-ordered allocation: the memory pools behind cuMemAllocAsync.

A pool keeps memory reserved after frees and reuses it, so the group is
charged what the pools reserve (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not
what is allocated from them. Growth is charged before the driver call (the
request minus the pool's slack, rounded up to the allocation granularity)
and settled against the real growth after it; shrinking (trims, release
thresholds) is credited at the pool's next allocation, free or trim. A
spinlock per process keeps the before/after readings of one pool consistent.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.runtime.context import HELPER, call_real, current_device
from pyvgpu.jit.runtime.fields import CTX
from pyvgpu.jit.runtime.intrinsics import load_u64, stack_u64, yield_cpu
from pyvgpu.jit.state import ptrtable as T
from pyvgpu.jit.state import quota as Q

POOL_GRANULARITY = 2 << 20  # what a pool grows by at least (the driver's granularity for device memory)
TOMBSTONE = np.uint64(0xFFFFFFFFFFFFFFFF)  # a destroyed pool's entry: later entries stay findable


@njit
def lock(ctx):
    while CTX.cas_lock(ctx, 0, 1) != 0:
        yield_cpu()


@njit
def unlock(ctx):
    CTX.store_lock(ctx, 0)


@njit
def pool_attr(ctx, pool, attr):
    out = stack_u64()
    if HELPER.cuMemPoolGetAttribute(ctx, pool, attr, out) != abi.CUDA_SUCCESS:
        return np.uint64(0)
    return load_u64(out)


@njit
def pool_index(ctx, pool, dev):
    """This pool's entry in ctx (added on first sight); -1 if the table is full. Caller holds the lock."""
    for i in range(L.MAX_POOLS):
        h = CTX.get_pool_handle(ctx, i)
        if h == pool:
            return i
        if h == 0:
            CTX.set_pool_handle(ctx, i, pool)
            CTX.set_pool_reserved(ctx, i, 0)
            CTX.set_pool_dev(ctx, i, dev)
            return i
    return -1


@njit
def find_pool(ctx, pool):
    for i in range(L.MAX_POOLS):
        if CTX.get_pool_handle(ctx, i) == pool:
            return i
    return -1


@njit
def reconcile(ctx, i):
    """Charge or credit the change in pool i's reserved bytes. Caller holds the lock."""
    pool = CTX.get_pool_handle(ctx, i)
    dev = CTX.get_pool_dev(ctx, i)
    cur = pool_attr(ctx, pool, abi.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    prev = CTX.get_pool_reserved(ctx, i)
    CTX.set_pool_reserved(ctx, i, cur)
    if cur > prev:
        Q.force_charge(ctx, dev, L.KIND_DATA, cur - prev)
    elif cur < prev:
        Q.uncharge(ctx, dev, L.KIND_DATA, prev - cur)


@njit
def reconcile_locked(ctx, i):
    if i < 0 or i >= L.MAX_POOLS:
        return
    lock(ctx)
    reconcile(ctx, i)
    unlock(ctx)


@njit
def pool_alloc(ctx, idx, args, notfound, dptr, size, pool, dev):
    lock(ctx)
    i = pool_index(ctx, pool, dev)
    if i < 0:
        unlock(ctx)
        return call_real(ctx, idx, args, notfound)  # more pools than we track: not accounted
    reconcile(ctx, i)
    reserved = CTX.get_pool_reserved(ctx, i)
    used = pool_attr(ctx, pool, abi.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    slack = reserved - used if reserved > used else np.uint64(0)
    need = np.uint64(size) - slack if size > slack else np.uint64(0)
    if need > 0:
        gran = np.uint64(POOL_GRANULARITY)
        need = (need + gran - np.uint64(1)) // gran * gran
        if not Q.charge_or_refuse(ctx, dev, L.KIND_DATA, need):
            unlock(ctx)
            return abi.CUDA_ERROR_OUT_OF_MEMORY
    rc = call_real(ctx, idx, args, notfound)
    cur = pool_attr(ctx, pool, abi.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    growth = cur - reserved if cur > reserved else np.uint64(0)
    CTX.set_pool_reserved(ctx, i, reserved + growth)
    if growth > need:
        Q.force_charge(ctx, dev, L.KIND_DATA, growth - need)  # the pool grew more than foreseen
    elif growth < need:
        Q.uncharge(ctx, dev, L.KIND_DATA, need - growth)
    unlock(ctx)
    if rc == abi.CUDA_SUCCESS:
        T.insert(ctx, load_u64(dptr), T.pack(i, dev, T.T_ASYNC))
    return rc


@njit
def mem_alloc_async(ctx, idx, args, notfound):
    dptr, size, stream = args
    if CTX.get_region(ctx) == 0 or dptr == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    out = stack_u64()
    if dev < 0 or HELPER.cuDeviceGetMemPool(ctx, out, dev) != abi.CUDA_SUCCESS:
        return call_real(ctx, idx, args, notfound)
    return pool_alloc(ctx, idx, args, notfound, dptr, size, load_u64(out), dev)


@njit
def mem_alloc_from_pool_async(ctx, idx, args, notfound):
    dptr, size, pool, stream = args
    if CTX.get_region(ctx) == 0 or dptr == 0 or size == 0 or pool == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    return pool_alloc(ctx, idx, args, notfound, dptr, size, pool, dev)


@njit
def mem_free_async(ctx, idx, args, notfound):
    ptr, stream = args
    if CTX.get_region(ctx) == 0 or ptr == 0:
        return call_real(ctx, idx, args, notfound)
    v = T.take(ctx, ptr)
    rc = call_real(ctx, idx, args, notfound)
    if v == 0:
        return rc
    if rc != abi.CUDA_SUCCESS:
        T.insert(ctx, ptr, v)
    elif T.rec_type(v) == T.T_ASYNC:
        reconcile_locked(ctx, np.int64(T.rec_size(v)))
    else:
        Q.uncharge(ctx, T.rec_dev(v), L.KIND_DATA, T.rec_size(v))
    return rc


@njit
def mem_pool_trim(ctx, idx, args, notfound):
    pool, keep = args
    rc = call_real(ctx, idx, args, notfound)
    if CTX.get_region(ctx) != 0:
        reconcile_locked(ctx, find_pool(ctx, pool))
    return rc


@njit
def mem_pool_destroy(ctx, idx, args, notfound):
    (pool,) = args
    if CTX.get_region(ctx) == 0:
        return call_real(ctx, idx, args, notfound)
    lock(ctx)
    i = find_pool(ctx, pool)
    if i >= 0:
        reconcile(ctx, i)
    rc = call_real(ctx, idx, args, notfound)
    if rc == abi.CUDA_SUCCESS and i >= 0:
        Q.uncharge(ctx, CTX.get_pool_dev(ctx, i), L.KIND_DATA, CTX.get_pool_reserved(ctx, i))
        CTX.set_pool_reserved(ctx, i, 0)
        CTX.set_pool_handle(ctx, i, TOMBSTONE)
    unlock(ctx)
    return rc
