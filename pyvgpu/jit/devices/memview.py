"""The virtual view: inside a group with a memory cap, the cap is the device's memory.

cuMemGetInfo, cuDeviceTotalMem and NVML's memory info show the cap as the
device's total (at most the physical total) and the group's headroom as
free (at most the physical free). Every pointer the caller passes is
rewritten on its own: the driver answers ``cuMemGetInfo(NULL, &total)``
with the physical total (measured on driver 580), so a view that only
rewrote complete pairs would leak it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.devices.visible import nvml_group_device
from pyvgpu.jit.runtime.context import ENTRY, REAL, call_real, current_device
from pyvgpu.jit.runtime.fields import CTX, DEV, NVML_MEMORY, NVML_MEMORY_V2, REGION
from pyvgpu.jit.runtime.intrinsics import load_u32, load_u64, stack_u64, store_u32, store_u64

MAX_U32 = np.uint64(0xFFFFFFFF)


@njit(inline="always")
def device_limit(ctx, dev):
    region = CTX.get_region(ctx)
    if region == 0 or dev < 0 or dev >= L.MAX_DEVICES:
        return np.uint64(0)
    return DEV.load_limit(REGION.device(region, dev))


@njit
def virtual_view(ctx, dev, phys_free, phys_total):
    """(free, total) the group sees: total = min(limit, physical); free = headroom, clamped by physical free."""
    lim = device_limit(ctx, dev)
    if lim == 0:
        return phys_free, phys_total
    total = lim if lim < phys_total else phys_total
    used = DEV.load_used(REGION.device(CTX.get_region(ctx), dev))
    head = total - used if used < total else np.uint64(0)
    return (head if head < phys_free else phys_free), total


@njit(inline="always")
def clamp32(v):
    return v if v < MAX_U32 else MAX_U32


@njit
def mem_get_info(ctx, idx, args, notfound):
    """cuMemGetInfo[_v2]: each non-NULL pointer gets the group's view (the driver validates the call)."""
    pfree, ptotal = args
    rc = call_real(ctx, idx, args, notfound)  # the driver's answer to NULL pointers or a missing context
    if rc != abi.CUDA_SUCCESS or CTX.get_region(ctx) == 0 or (pfree == 0 and ptotal == 0):
        return rc
    dev = current_device(ctx)
    if dev < 0 or device_limit(ctx, dev) == 0:
        return rc
    # the physical pair, whichever pointers the caller gave: ask again with both when one is NULL
    wide = idx == ENTRY.cuMemGetInfo_v2
    f, t = stack_u64(), stack_u64()
    if pfree != 0 and ptotal != 0:
        f0 = load_u64(pfree) if wide else np.uint64(load_u32(pfree))
        t0 = load_u64(ptotal) if wide else np.uint64(load_u32(ptotal))
    elif REAL.cuMemGetInfo_v2(ctx, f, t) == abi.CUDA_SUCCESS:
        f0, t0 = load_u64(f), load_u64(t)
    else:
        f0, t0 = np.uint64(0), np.uint64(0)  # cannot tell: show nothing rather than the device
    vf, vt = virtual_view(ctx, dev, f0, t0)
    if pfree != 0:
        if wide:
            store_u64(pfree, vf)
        else:
            store_u32(pfree, clamp32(vf))
    if ptotal != 0:
        if wide:
            store_u64(ptotal, vt)
        else:
            store_u32(ptotal, clamp32(vt))
    return rc


@njit
def device_total_mem(ctx, idx, args, notfound):
    pbytes, dev = args
    rc = call_real(ctx, idx, args, notfound)
    if rc != abi.CUDA_SUCCESS or pbytes == 0:
        return rc
    lim = device_limit(ctx, dev)
    if lim == 0:
        return rc
    if idx == ENTRY.cuDeviceTotalMem_v2:
        phys = load_u64(pbytes)
        store_u64(pbytes, lim if lim < phys else phys)
    else:
        phys = np.uint64(load_u32(pbytes))
        store_u32(pbytes, clamp32(lim if lim < phys else phys))
    return rc


@njit
def nvml_view(ctx, dev, phys_total, phys_free):
    """(total, used, free) for NVML: the group's usage; never underflows."""
    lim = device_limit(ctx, dev)
    total = lim if lim < phys_total else phys_total
    used = DEV.load_used(REGION.device(CTX.get_region(ctx), dev))
    used = used if used < total else total
    free = total - used
    return total, used, (free if free < phys_free else phys_free)


@njit
def nvml_target(ctx, idx, args, notfound):
    """Call NVML; the group device index of the handle when its answer is to be rewritten, else -1."""
    handle, mem = args
    rc = call_real(ctx, idx, args, notfound)
    if rc != abi.NVML_SUCCESS or mem == 0 or CTX.get_region(ctx) == 0:
        return rc, np.int64(-1)
    dev = nvml_group_device(ctx, handle)
    if dev < 0 or device_limit(ctx, dev) == 0:
        return rc, np.int64(-1)
    return rc, dev


@njit
def nvml_memory_info(ctx, idx, args, notfound):
    """nvmlMemory_t {total, free, used}."""
    rc, dev = nvml_target(ctx, idx, args, notfound)
    if dev >= 0:
        m = args[1]
        total, used, free = nvml_view(ctx, dev, NVML_MEMORY.get_total(m), NVML_MEMORY.get_free(m))
        NVML_MEMORY.set_total(m, total)
        NVML_MEMORY.set_free(m, free)
        NVML_MEMORY.set_used(m, used)
    return rc


@njit
def nvml_memory_info_v2(ctx, idx, args, notfound):
    """nvmlMemory_v2_t {version, total, reserved, free, used}: reserved is driver memory, kept inside used."""
    rc, dev = nvml_target(ctx, idx, args, notfound)
    if dev >= 0:
        m = args[1]
        total, used, free = nvml_view(ctx, dev, NVML_MEMORY_V2.get_total(m), NVML_MEMORY_V2.get_free(m))
        NVML_MEMORY_V2.set_total(m, total)
        NVML_MEMORY_V2.set_free(m, free)
        NVML_MEMORY_V2.set_used(m, used)
        NVML_MEMORY_V2.set_reserved(m, 0)
    return rc
