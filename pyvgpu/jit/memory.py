"""What happens on every memory call: the policies behind the memory hooks.

Each policy has the shape ``policy(ctx, idx, args, notfound) -> CUresult``
(see pyvgpu/jit/policies.py). Without a region (no group, no limits) they
only forward. With one, every allocation is charged to the group before
the driver is asked, so a request past the cap returns
CUDA_ERROR_OUT_OF_MEMORY without reaching the driver; docs/accounting.md
lists every path and what it counts.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu import hooks
from pyvgpu import layout as L
from pyvgpu.jit import devices as D
from pyvgpu.jit import ptrtable as T
from pyvgpu.jit import quota as Q
from pyvgpu.jit.intrinsics import (
    atomic_add_u64,
    atomic_cas_u32,
    atomic_cas_u64,
    atomic_load_u32,
    atomic_load_u64,
    atomic_store_u32,
    call_i32,
    load_i32,
    load_u32,
    load_u64,
    stack_buffer,
    stack_u64,
    store_u32,
    store_u64,
    yield_cpu,
)
from pyvgpu.jit.policies import call_real

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_SUPPORTED = 801
NVML_SUCCESS = 0
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7
MAX_U32 = np.uint64(0xFFFFFFFF)

OFF_HELPER = L.CTX.offset("helper")
OFF_REAL = L.CTX.offset("real")
OFF_TABLE_FULL = L.CTX.offset("table_full")
OFF_LOCK = L.CTX.offset("lock")
OFF_POOL_HANDLE = L.CTX.offset("pool_handle")
OFF_POOL_RESERVED = L.CTX.offset("pool_reserved")
OFF_POOL_DEV = L.CTX.offset("pool_dev")

H_CTX_GET_DEVICE = hooks.HELPER_INDEX["cuCtxGetDevice"]
H_PCI_BUS_ID = hooks.HELPER_INDEX["cuDeviceGetPCIBusId"]
H_PRIMARY_RELEASE = hooks.HELPER_INDEX["cuDevicePrimaryCtxRelease_v2"]
H_CTX_DESTROY = hooks.HELPER_INDEX["cuCtxDestroy_v2"]
H_MODULE_UNLOAD = hooks.HELPER_INDEX["cuModuleUnload"]
H_LIBRARY_UNLOAD = hooks.HELPER_INDEX["cuLibraryUnload"]
H_NVML_INIT = hooks.HELPER_INDEX["nvmlInit_v2"]
H_NVML_BY_BUS_ID = hooks.HELPER_INDEX["nvmlDeviceGetHandleByPciBusId_v2"]
E_NVML_MEMORY = hooks.BY_ABI["nvmlDeviceGetMemoryInfo"].index
OFF_CTX_CHARGED = L.CTX.offset("ctx_charged")
OFF_NVML_STATE = L.CTX.offset("nvml_state")
H_DEVICE_GET_MEM_POOL = hooks.HELPER_INDEX["cuDeviceGetMemPool"]
H_POOL_GET_ATTRIBUTE = hooks.HELPER_INDEX["cuMemPoolGetAttribute"]
E_MEM_FREE = hooks.BY_ABI["cuMemFree_v2"].index
E_MEM_FREE_ASYNC = hooks.BY_ABI["cuMemFreeAsync"].index
E_MEM_RELEASE = hooks.BY_ABI["cuMemRelease"].index
E_ARRAY_DESTROY = hooks.BY_ABI["cuArrayDestroy"].index
E_MIPMAPPED_DESTROY = hooks.BY_ABI["cuMipmappedArrayDestroy"].index
E_MEM_GET_INFO_V2 = hooks.BY_ABI["cuMemGetInfo_v2"].index
E_DEVICE_TOTAL_MEM_V2 = hooks.BY_ABI["cuDeviceTotalMem_v2"].index


# --- helpers ---------------------------------------------------------------

@njit(inline="always")
def helper(ctx, h):
    return load_u64(ctx + OFF_HELPER + h * 8)


@njit
def current_device(ctx):
    """The device of the calling thread's current context, or -1."""
    fn = helper(ctx, H_CTX_GET_DEVICE)
    out = stack_u64()
    if fn == 0 or call_i32(fn, (out,)) != CUDA_SUCCESS:
        return -1
    d = load_i32(out)
    return d if 0 <= d < L.MAX_DEVICES else -1


@njit
def charge_or_refuse(ctx, dev, kind, n):
    """Charge n bytes; on refusal reclaim dead processes' quota once and retry."""
    if Q.try_charge(ctx, dev, kind, n):
        return True
    if Q.reclaim_dead(ctx) != 0 and Q.try_charge(ctx, dev, kind, n):
        return True
    Q.count_oom(ctx, dev, n)
    return False


@njit
def record_or_undo(ctx, key, dev, size, rtype, free_entry):
    """Record an allocation; if the table is full, free it again and report OOM."""
    if T.insert(ctx, key, T.pack(size, dev, rtype)):
        return CUDA_SUCCESS
    call_real(ctx, free_entry, (key,), 0)
    Q.uncharge(ctx, dev, L.KIND_DATA, size)
    atomic_add_u64(ctx + OFF_TABLE_FULL, 1)
    return CUDA_ERROR_OUT_OF_MEMORY


@njit
def charged_alloc(ctx, idx, args, notfound, out_ptr, size, rtype, free_entry):
    """An allocation on the current context's device (see charged_alloc_on)."""
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)  # no context: the driver reports it
    return charged_alloc_on(ctx, idx, args, notfound, dev, out_ptr, size, rtype, free_entry)


@njit
def charged_alloc_on(ctx, idx, args, notfound, dev, out_ptr, size, rtype, free_entry):
    """The common shape: charge, ask the driver, record the handle it wrote to out_ptr, or roll back."""
    if not charge_or_refuse(ctx, dev, L.KIND_DATA, size):
        return CUDA_ERROR_OUT_OF_MEMORY
    rc = call_real(ctx, idx, args, notfound)
    if rc != CUDA_SUCCESS:
        Q.uncharge(ctx, dev, L.KIND_DATA, size)
        return rc
    return record_or_undo(ctx, load_u64(out_ptr), dev, size, rtype, free_entry)


# --- cuMemAlloc, cuMemAllocManaged, cuMemAllocPitch, cuMemFree -------------

@njit
def mem_alloc(ctx, idx, args, notfound):
    dptr, size = args
    if Q.region_of(ctx) == 0 or dptr == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc(ctx, idx, args, notfound, dptr, size, T.T_PTR, E_MEM_FREE)


@njit
def legacy32(ctx, idx, args, notfound):
    """32-bit ABI variants (cudaVersion < 3020) cannot be accounted: refused inside a group."""
    if Q.region_of(ctx) != 0:
        return CUDA_ERROR_NOT_SUPPORTED
    return call_real(ctx, idx, args, notfound)


@njit
def mem_alloc_managed(ctx, idx, args, notfound):
    dptr, size, flags = args
    if Q.region_of(ctx) == 0 or dptr == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc(ctx, idx, args, notfound, dptr, size, T.T_PTR, E_MEM_FREE)


@njit
def mem_alloc_pitch(ctx, idx, args, notfound):
    """Charges pitch x height, as the driver chose the pitch: an upper estimate first, settled after."""
    dptr, ppitch, width, height, elem = args
    if Q.region_of(ctx) == 0 or dptr == 0 or ppitch == 0 or width == 0 or height == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    est = ((np.uint64(width) + np.uint64(511)) // np.uint64(512)) * np.uint64(512) * np.uint64(height)
    if not charge_or_refuse(ctx, dev, L.KIND_DATA, est):
        return CUDA_ERROR_OUT_OF_MEMORY
    rc = call_real(ctx, idx, args, notfound)
    if rc != CUDA_SUCCESS:
        Q.uncharge(ctx, dev, L.KIND_DATA, est)
        return rc
    ptr = load_u64(dptr)
    actual = load_u64(ppitch) * np.uint64(height)
    if actual > est:
        if not charge_or_refuse(ctx, dev, L.KIND_DATA, actual - est):
            call_real(ctx, E_MEM_FREE, (ptr,), 0)
            Q.uncharge(ctx, dev, L.KIND_DATA, est)
            return CUDA_ERROR_OUT_OF_MEMORY
    elif actual < est:
        Q.uncharge(ctx, dev, L.KIND_DATA, est - actual)
    return record_or_undo(ctx, ptr, dev, actual, T.T_PTR, E_MEM_FREE)


@njit
def mem_free(ctx, idx, args, notfound):
    """Frees reach the driver whether or not pyvgpu recorded the pointer; only recorded ones are credited."""
    (ptr,) = args
    if Q.region_of(ctx) == 0 or ptr == 0:
        return call_real(ctx, idx, args, notfound)
    v = T.take(ctx, ptr)  # taken before the free: the driver may hand the address out again at once
    rc = call_real(ctx, idx, args, notfound)
    if v == 0:
        return rc
    if rc != CUDA_SUCCESS:
        T.insert(ctx, ptr, v)
        return rc
    if T.rec_type(v) == T.T_ASYNC:
        reconcile_locked(ctx, np.int64(T.rec_size(v)))
    else:
        Q.uncharge(ctx, T.rec_dev(v), L.KIND_DATA, T.rec_size(v))
    return rc


# --- the virtual view ----------------------------------------------------------

@njit(inline="always")
def device_limit(ctx, dev):
    region = Q.region_of(ctx)
    if region == 0 or dev < 0 or dev >= L.MAX_DEVICES:
        return np.uint64(0)
    return atomic_load_u64(Q.device_addr(region, dev) + Q.DEV_LIMIT)


@njit
def virtual_view(ctx, dev, phys_free, phys_total):
    """(free, total) the group sees: total = min(limit, physical); free = headroom, clamped by physical free."""
    lim = device_limit(ctx, dev)
    if lim == 0:
        return phys_free, phys_total
    total = lim if lim < phys_total else phys_total
    used = atomic_load_u64(Q.device_addr(Q.region_of(ctx), dev) + Q.DEV_USED)
    head = total - used if used < total else np.uint64(0)
    return (head if head < phys_free else phys_free), total


@njit
def mem_get_info(ctx, idx, args, notfound):
    pfree, ptotal = args
    rc = call_real(ctx, idx, args, notfound)  # the driver's answer to NULL pointers or a missing context
    if rc != CUDA_SUCCESS or Q.region_of(ctx) == 0 or pfree == 0 or ptotal == 0:
        return rc
    dev = current_device(ctx)
    if dev < 0:
        return rc
    if idx == E_MEM_GET_INFO_V2:
        f, t = virtual_view(ctx, dev, load_u64(pfree), load_u64(ptotal))
        store_u64(pfree, f)
        store_u64(ptotal, t)
    else:  # the 32-bit variant
        f, t = virtual_view(ctx, dev, np.uint64(load_u32(pfree)), np.uint64(load_u32(ptotal)))
        store_u32(pfree, f if f < MAX_U32 else MAX_U32)
        store_u32(ptotal, t if t < MAX_U32 else MAX_U32)
    return rc


@njit
def device_total_mem(ctx, idx, args, notfound):
    pbytes, dev = args
    rc = call_real(ctx, idx, args, notfound)
    if rc != CUDA_SUCCESS or pbytes == 0:
        return rc
    lim = device_limit(ctx, dev)
    if lim == 0:
        return rc
    if idx == E_DEVICE_TOTAL_MEM_V2:
        phys = load_u64(pbytes)
        store_u64(pbytes, lim if lim < phys else phys)
    else:
        phys = np.uint64(load_u32(pbytes))
        t = lim if lim < phys else phys
        store_u32(pbytes, t if t < MAX_U32 else MAX_U32)
    return rc


@njit
def nvml_view(ctx, dev, phys_total, phys_free):
    """(total, used, free) for NVML: the group's usage; never underflows."""
    lim = device_limit(ctx, dev)
    total = lim if lim < phys_total else phys_total
    used = atomic_load_u64(Q.device_addr(Q.region_of(ctx), dev) + Q.DEV_USED)
    used = used if used < total else total
    free = total - used
    return total, used, (free if free < phys_free else phys_free)


@njit
def nvml_memory(ctx, idx, args, notfound, off_total, off_free, off_used, off_reserved):
    """Rewrite an NVML memory struct in place with the group's view; offsets name its fields."""
    handle, mem = args
    rc = call_real(ctx, idx, args, notfound)
    if rc != NVML_SUCCESS or mem == 0 or Q.region_of(ctx) == 0:
        return rc
    dev = D.nvml_group_device(ctx, handle)
    if dev < 0 or device_limit(ctx, dev) == 0:
        return rc
    total, used, free = nvml_view(ctx, dev, load_u64(mem + off_total), load_u64(mem + off_free))
    store_u64(mem + off_total, total)
    store_u64(mem + off_free, free)
    store_u64(mem + off_used, used)
    if off_reserved >= 0:
        store_u64(mem + off_reserved, 0)
    return rc


@njit
def nvml_memory_info(ctx, idx, args, notfound):
    """nvmlMemory_t {total, free, used}, each unsigned long long."""
    return nvml_memory(ctx, idx, args, notfound, 0, 8, 16, -1)


@njit
def nvml_memory_info_v2(ctx, idx, args, notfound):
    """nvmlMemory_v2_t {version, total, reserved, free, used}: reserved is driver memory, kept inside used."""
    return nvml_memory(ctx, idx, args, notfound, 8, 24, 32, 16)


# --- VMM: cuMemCreate / cuMemRelease ------------------------------------------

@njit
def mem_create(ctx, idx, args, notfound):
    """Device-located physical memory is charged at creation; host-located is not counted."""
    phandle, size, prop, flags = args
    if Q.region_of(ctx) == 0 or phandle == 0 or prop == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    if load_i32(prop + 8) != CU_MEM_LOCATION_TYPE_DEVICE:
        return call_real(ctx, idx, args, notfound)
    dev = load_i32(prop + 12)
    if dev < 0 or dev >= L.MAX_DEVICES:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc_on(ctx, idx, args, notfound, dev, phandle, size, T.T_VMM, E_MEM_RELEASE)


@njit
def release_recorded(ctx, idx, args, notfound, key):
    """Destroy calls (cuMemRelease, cuArrayDestroy, ...): credit what was recorded for ``key``."""
    if Q.region_of(ctx) == 0 or key == 0:
        return call_real(ctx, idx, args, notfound)
    v = T.take(ctx, key)
    rc = call_real(ctx, idx, args, notfound)
    if v != 0:
        if rc == CUDA_SUCCESS:
            kind = L.KIND_MODULE if T.rec_type(v) == T.T_MODULE else L.KIND_DATA
            Q.uncharge(ctx, T.rec_dev(v), kind, T.rec_size(v))
        else:
            T.insert(ctx, key, v)
    return rc


@njit
def release(ctx, idx, args, notfound):
    """Every destroy call that takes one handle: cuMemRelease, cuArrayDestroy, cuMipmappedArrayDestroy,
    cuModuleUnload, cuLibraryUnload."""
    (handle,) = args
    return release_recorded(ctx, idx, args, notfound, handle)


# --- arrays ------------------------------------------------------------------------

@njit
def format_bytes(fmt):
    """Bytes per channel of a CUarray_format; unknown formats count 16 (an upper bound)."""
    if fmt == 0x01 or fmt == 0x08 or fmt == 0xC0 or fmt == 0xC6:
        return 1
    if fmt == 0x02 or fmt == 0x09 or fmt == 0x10 or fmt == 0xC3 or fmt == 0xC9:
        return 2
    if fmt == 0x03 or fmt == 0x0A or fmt == 0x20:
        return 4
    return 16


@njit
def array_alloc(ctx, idx, args, notfound, phandle, size):
    if Q.region_of(ctx) == 0 or phandle == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc(ctx, idx, args, notfound, phandle, size, T.T_ARRAY, E_ARRAY_DESTROY)


@njit
def array_create(ctx, idx, args, notfound):
    """CUDA_ARRAY_DESCRIPTOR {size_t Width, Height; Format; NumChannels}."""
    phandle, desc = args
    if desc == 0:
        return call_real(ctx, idx, args, notfound)
    w, h = load_u64(desc), load_u64(desc + 8)
    n = w * (h if h > 0 else 1) * format_bytes(load_u32(desc + 16)) * load_u32(desc + 20)
    return array_alloc(ctx, idx, args, notfound, phandle, n)


@njit
def array3d_bytes(desc, level):
    w, h, d = load_u64(desc), load_u64(desc + 8), load_u64(desc + 16)
    level = np.uint64(level)
    w = w >> level
    w = w if w > 0 else 1
    h = (h >> level) if h > 0 else 1
    h = h if h > 0 else 1
    d = (d >> level) if d > 0 else 1
    d = d if d > 0 else 1
    return np.uint64(w * h * d * format_bytes(load_u32(desc + 24)) * load_u32(desc + 28))


@njit
def array3d_create(ctx, idx, args, notfound):
    """CUDA_ARRAY3D_DESCRIPTOR {size_t Width, Height, Depth; Format; NumChannels; Flags}."""
    phandle, desc = args
    if desc == 0:
        return call_real(ctx, idx, args, notfound)
    return array_alloc(ctx, idx, args, notfound, phandle, array3d_bytes(desc, 0))


@njit
def mipmapped_array_create(ctx, idx, args, notfound):
    """Every level of the chain, each dimension halved per level (at least 1)."""
    phandle, desc, levels = args
    if desc == 0 or Q.region_of(ctx) == 0 or phandle == 0:
        return call_real(ctx, idx, args, notfound)
    n = np.uint64(0)
    for lv in range(levels if levels > 0 else 1):
        n += array3d_bytes(desc, lv)
    return charged_alloc(ctx, idx, args, notfound, phandle, n, T.T_ARRAY, E_MIPMAPPED_DESTROY)


# --- stream-ordered allocation: memory pools ---------------------------------------
# A pool keeps memory reserved after frees and reuses it, so the group is
# charged what the pools reserve (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not
# what is allocated from them. Growth is charged before the driver call (the
# request minus the pool's slack, rounded up to the allocation granularity)
# and settled against the real growth after it; shrinking (trims, release
# thresholds) is credited at the pool's next allocation, free or trim. A spinlock
# per process keeps the before/after readings of one pool consistent.

@njit
def lock(ctx):
    while atomic_cas_u32(ctx + OFF_LOCK, 0, 1) != 0:
        yield_cpu()


@njit
def unlock(ctx):
    atomic_store_u32(ctx + OFF_LOCK, 0)


@njit
def pool_attr(ctx, pool, attr):
    fn = helper(ctx, H_POOL_GET_ATTRIBUTE)
    out = stack_u64()
    if fn == 0 or call_i32(fn, (pool, np.int32(attr), out)) != CUDA_SUCCESS:
        return np.uint64(0)
    return load_u64(out)


@njit
def pool_index(ctx, pool, dev):
    """This pool's entry in ctx (added on first sight); -1 if the table is full. Caller holds the lock."""
    for i in range(L.MAX_POOLS):
        h = load_u64(ctx + OFF_POOL_HANDLE + i * 8)
        if h == pool:
            return i
        if h == 0:
            store_u64(ctx + OFF_POOL_HANDLE + i * 8, pool)
            store_u64(ctx + OFF_POOL_RESERVED + i * 8, 0)
            store_u32(ctx + OFF_POOL_DEV + i * 4, dev)
            return i
    return -1


@njit
def reconcile(ctx, i):
    """Charge or credit the change in pool i's reserved bytes. Caller holds the lock."""
    pool = load_u64(ctx + OFF_POOL_HANDLE + i * 8)
    dev = load_i32(ctx + OFF_POOL_DEV + i * 4)
    cur = pool_attr(ctx, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    prev = load_u64(ctx + OFF_POOL_RESERVED + i * 8)
    store_u64(ctx + OFF_POOL_RESERVED + i * 8, cur)
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
    reserved = load_u64(ctx + OFF_POOL_RESERVED + i * 8)
    used = pool_attr(ctx, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    slack = reserved - used if reserved > used else np.uint64(0)
    need = np.uint64(size) - slack if size > slack else np.uint64(0)
    if need > 0:
        gran = np.uint64(2 << 20)
        need = (need + gran - np.uint64(1)) // gran * gran
        if not charge_or_refuse(ctx, dev, L.KIND_DATA, need):
            unlock(ctx)
            return CUDA_ERROR_OUT_OF_MEMORY
    rc = call_real(ctx, idx, args, notfound)
    cur = pool_attr(ctx, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    growth = cur - reserved if cur > reserved else np.uint64(0)
    store_u64(ctx + OFF_POOL_RESERVED + i * 8, reserved + growth)
    if growth > need:
        Q.force_charge(ctx, dev, L.KIND_DATA, growth - need)  # the pool grew more than foreseen
    elif growth < need:
        Q.uncharge(ctx, dev, L.KIND_DATA, need - growth)
    unlock(ctx)
    if rc == CUDA_SUCCESS:
        T.insert(ctx, load_u64(dptr), T.pack(i, dev, T.T_ASYNC))
    return rc


@njit
def mem_alloc_async(ctx, idx, args, notfound):
    dptr, size, stream = args
    if Q.region_of(ctx) == 0 or dptr == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    fn = helper(ctx, H_DEVICE_GET_MEM_POOL)
    out = stack_u64()
    if dev < 0 or fn == 0 or call_i32(fn, (out, np.int32(dev))) != CUDA_SUCCESS:
        return call_real(ctx, idx, args, notfound)
    return pool_alloc(ctx, idx, args, notfound, dptr, size, load_u64(out), dev)


@njit
def mem_alloc_from_pool_async(ctx, idx, args, notfound):
    dptr, size, pool, stream = args
    if Q.region_of(ctx) == 0 or dptr == 0 or size == 0 or pool == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    return pool_alloc(ctx, idx, args, notfound, dptr, size, pool, dev)


@njit
def mem_free_async(ctx, idx, args, notfound):
    ptr, stream = args
    if Q.region_of(ctx) == 0 or ptr == 0:
        return call_real(ctx, idx, args, notfound)
    v = T.take(ctx, ptr)
    rc = call_real(ctx, idx, args, notfound)
    if v == 0:
        return rc
    if rc != CUDA_SUCCESS:
        T.insert(ctx, ptr, v)
    elif T.rec_type(v) == T.T_ASYNC:
        reconcile_locked(ctx, np.int64(T.rec_size(v)))
    else:
        Q.uncharge(ctx, T.rec_dev(v), L.KIND_DATA, T.rec_size(v))
    return rc


@njit
def find_pool(ctx, pool):
    for i in range(L.MAX_POOLS):
        if load_u64(ctx + OFF_POOL_HANDLE + i * 8) == pool:
            return i
    return -1


@njit
def mem_pool_trim(ctx, idx, args, notfound):
    pool, keep = args
    rc = call_real(ctx, idx, args, notfound)
    if Q.region_of(ctx) != 0:
        reconcile_locked(ctx, find_pool(ctx, pool))
    return rc


@njit
def mem_pool_destroy(ctx, idx, args, notfound):
    (pool,) = args
    if Q.region_of(ctx) == 0:
        return call_real(ctx, idx, args, notfound)
    lock(ctx)
    i = find_pool(ctx, pool)
    if i >= 0:
        reconcile(ctx, i)
    rc = call_real(ctx, idx, args, notfound)
    if rc == CUDA_SUCCESS and i >= 0:
        Q.uncharge(ctx, load_i32(ctx + OFF_POOL_DEV + i * 4), L.KIND_DATA,
                   load_u64(ctx + OFF_POOL_RESERVED + i * 8))
        store_u64(ctx + OFF_POOL_RESERVED + i * 8, 0)
        store_u64(ctx + OFF_POOL_HANDLE + i * 8, 0xFFFFFFFFFFFFFFFF)  # a tombstone: keep later entries findable
    unlock(ctx)
    return rc



# --- context memory ---------------------------------------------------------------------
# A context takes device memory no allocation call shows (about 0.5 GiB on an
# H100). It is measured: NVML's device-wide used before and after the
# process's first primary context (or cuCtxCreate) on a device, the device
# found by PCI bus id, so it is right under CUDA_VISIBLE_DEVICES too. The
# bytes are charged as kind "context" like any allocation: a context that
# does not fit in the group's cap is released again and the call fails with
# CUDA_ERROR_OUT_OF_MEMORY. They stay charged until the process ends.
# Without NVML, contexts are not counted. Other processes allocating at the
# same instant disturb the reading (docs/accounting.md).

@njit
def device_used(ctx, dev):
    """NVML's used bytes of CUDA device dev, or -1."""
    st = atomic_load_u32(ctx + OFF_NVML_STATE)
    if st == 0:
        init = helper(ctx, H_NVML_INIT)
        ok = init != 0 and call_i32(init, ()) == NVML_SUCCESS
        atomic_cas_u32(ctx + OFF_NVML_STATE, 0, 1 if ok else 2)
        st = atomic_load_u32(ctx + OFF_NVML_STATE)
    by_bus = helper(ctx, H_NVML_BY_BUS_ID)
    get_bus = helper(ctx, H_PCI_BUS_ID)
    mem_fn = load_u64(ctx + OFF_REAL + E_NVML_MEMORY * 8)
    if st != 1 or by_bus == 0 or get_bus == 0 or mem_fn == 0:
        return np.int64(-1)
    bus = stack_buffer(64)
    if call_i32(get_bus, (bus, np.int32(63), np.int32(dev))) != CUDA_SUCCESS:
        return np.int64(-1)
    handle = stack_u64()
    if call_i32(by_bus, (bus, handle)) != NVML_SUCCESS:
        return np.int64(-1)
    mem = stack_buffer(24)
    if call_i32(mem_fn, (load_u64(handle), mem)) != NVML_SUCCESS:
        return np.int64(-1)
    return np.int64(load_u64(mem + 16))


@njit
def measured_context(ctx, idx, args, notfound, dev, pctx, primary):
    """Create the context through the driver, charging what it took if this is our first on dev."""
    if D.refused(ctx):
        return D.CUDA_ERROR_NO_DEVICE  # CUDA sees devices outside the group (cuInit said why)
    if Q.region_of(ctx) == 0 or dev < 0 or dev >= L.MAX_DEVICES or pctx == 0:
        return call_real(ctx, idx, args, notfound)
    slot = ctx + OFF_CTX_CHARGED + dev * 8
    if atomic_cas_u64(slot, 0, 1) != 0:  # measured already (or being measured by another thread)
        return call_real(ctx, idx, args, notfound)
    before = device_used(ctx, dev)
    rc = call_real(ctx, idx, args, notfound)
    if rc != CUDA_SUCCESS:
        atomic_cas_u64(slot, 1, 0)
        return rc
    after = device_used(ctx, dev)
    if before < 0 or after <= before:
        return rc
    n = np.uint64(after - before)
    if charge_or_refuse(ctx, dev, L.KIND_CONTEXT, n):
        store_u64(slot, n)
        return rc
    # it does not fit: give the context back and refuse, as for any allocation
    if primary:
        call_i32(helper(ctx, H_PRIMARY_RELEASE), (np.int32(dev),))
    else:
        call_i32(helper(ctx, H_CTX_DESTROY), (load_u64(pctx),))
    store_u64(slot, 0)
    return CUDA_ERROR_OUT_OF_MEMORY


@njit
def ctx_retain(ctx, idx, args, notfound):
    pctx, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, True)


@njit
def ctx_create(ctx, idx, args, notfound):
    pctx, flags, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, False)


@njit
def ctx_create_v3(ctx, idx, args, notfound):
    pctx, params, nparams, flags, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, False)


@njit
def ctx_create_v4(ctx, idx, args, notfound):
    pctx, params, flags, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, False)


# --- module memory ----------------------------------------------------------------------
# Loading a module or library can take device memory (code, constants,
# globals) that no allocation call shows. It is measured like a context's:
# NVML's device-wide used before and after the load. A load that does not
# fit is unloaded again and fails with CUDA_ERROR_OUT_OF_MEMORY; unloading
# credits it. Since CUDA 12.2 modules load lazily by default, so most of
# their memory appears at first launch, outside any load call; those bytes
# are not counted (docs/accounting.md).

@njit
def measured_load(ctx, idx, args, notfound, phandle, unload):
    if Q.region_of(ctx) == 0 or phandle == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    before = device_used(ctx, dev)
    rc = call_real(ctx, idx, args, notfound)
    if rc != CUDA_SUCCESS or before < 0:
        return rc
    after = device_used(ctx, dev)
    if after <= before:
        return rc
    n = np.uint64(after - before)
    handle = load_u64(phandle)
    if not charge_or_refuse(ctx, dev, L.KIND_MODULE, n):
        call_i32(helper(ctx, unload), (handle,))
        return CUDA_ERROR_OUT_OF_MEMORY
    if not T.insert(ctx, handle, T.pack(n, dev, T.T_MODULE)):
        Q.uncharge(ctx, dev, L.KIND_MODULE, n)  # untracked: better uncounted than never credited
        atomic_add_u64(ctx + OFF_TABLE_FULL, 1)
    return rc


@njit
def module_load(ctx, idx, args, notfound):
    pmod, image = args
    return measured_load(ctx, idx, args, notfound, pmod, H_MODULE_UNLOAD)


@njit
def module_load_ex(ctx, idx, args, notfound):
    pmod, image, nopt, opts, vals = args
    return measured_load(ctx, idx, args, notfound, pmod, H_MODULE_UNLOAD)


@njit
def library_load(ctx, idx, args, notfound):
    plib, code, jo, jv, nj, lo, lv, nl = args
    return measured_load(ctx, idx, args, notfound, plib, H_LIBRARY_UNLOAD)
