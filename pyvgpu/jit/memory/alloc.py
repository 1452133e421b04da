"""What happens on every allocation call: the policies behind the memory hooks.

Each policy has the shape ``policy(ctx, idx, args, notfound) -> CUresult``
(see pyvgpu/jit/policies.py). Without a region (no group, no limits) they
only forward. With one, every allocation is charged to the group before
the driver is asked, so a request past the cap returns
CUDA_ERROR_OUT_OF_MEMORY without reaching the driver; docs/accounting.md
lists every path and what it counts. Stream-ordered pools are in
pyvgpu/jit/memory/mempools.py, memory measured with NVML (contexts, modules) in
pyvgpu/jit/memory/measured.py, the virtual view in pyvgpu/jit/devices/memview.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.memory import mempools
from pyvgpu.jit.runtime.context import ENTRY, call_real, current_device
from pyvgpu.jit.runtime.fields import ARRAY3D_DESC, ARRAY_DESC, CTX, MEM_PROP
from pyvgpu.jit.runtime.intrinsics import load_u64
from pyvgpu.jit.state import ptrtable as T
from pyvgpu.jit.state import quota as Q

# bytes per channel by CUarray_format code (a constant array: indexing it cannot raise)
FORMAT_BYTES = np.frombuffer(abi.ARRAY_FORMAT_BYTES_BY_CODE, dtype=np.uint8)


@njit
def record_or_undo(ctx, key, dev, size, rtype, free_entry):
    """Record an allocation; if the table is full, free it again and report OOM."""
    if T.insert(ctx, key, T.pack(size, dev, rtype)):
        return abi.CUDA_SUCCESS
    call_real(ctx, free_entry, (key,), 0)
    Q.uncharge(ctx, dev, L.KIND_DATA, size)
    CTX.add_table_full(ctx, 1)
    return abi.CUDA_ERROR_OUT_OF_MEMORY


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
    if not Q.charge_or_refuse(ctx, dev, L.KIND_DATA, size):
        return abi.CUDA_ERROR_OUT_OF_MEMORY
    rc = call_real(ctx, idx, args, notfound)
    if rc != abi.CUDA_SUCCESS:
        Q.uncharge(ctx, dev, L.KIND_DATA, size)
        return rc
    return record_or_undo(ctx, load_u64(out_ptr), dev, size, rtype, free_entry)


@njit
def credit(ctx, v):
    """Give back what the record v charged (a pool's allocation settles its pool instead)."""
    if T.rec_type(v) == T.T_ASYNC:
        mempools.reconcile_locked(ctx, np.int64(T.rec_size(v)))
    else:
        kind = L.KIND_MODULE if T.rec_type(v) == T.T_MODULE else L.KIND_DATA
        Q.uncharge(ctx, T.rec_dev(v), kind, T.rec_size(v))


# --- cuMemAlloc, cuMemAllocManaged, cuMemAllocPitch, cuMemFree -------------

@njit
def mem_alloc(ctx, idx, args, notfound):
    dptr, size = args
    if CTX.get_region(ctx) == 0 or dptr == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc(ctx, idx, args, notfound, dptr, size, T.T_PTR, ENTRY.cuMemFree_v2)


@njit
def legacy32(ctx, idx, args, notfound):
    """32-bit ABI variants (cudaVersion < 3020) cannot be accounted: refused inside a group."""
    if CTX.get_region(ctx) != 0:
        return abi.CUDA_ERROR_NOT_SUPPORTED
    return call_real(ctx, idx, args, notfound)


@njit
def mem_alloc_managed(ctx, idx, args, notfound):
    dptr, size, flags = args
    if CTX.get_region(ctx) == 0 or dptr == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc(ctx, idx, args, notfound, dptr, size, T.T_PTR, ENTRY.cuMemFree_v2)


@njit
def mem_alloc_pitch(ctx, idx, args, notfound):
    """Charges pitch x height, as the driver chose the pitch: an upper estimate first, settled after."""
    dptr, ppitch, width, height, elem = args
    if CTX.get_region(ctx) == 0 or dptr == 0 or ppitch == 0 or width == 0 or height == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    est = ((np.uint64(width) + np.uint64(511)) // np.uint64(512)) * np.uint64(512) * np.uint64(height)
    if not Q.charge_or_refuse(ctx, dev, L.KIND_DATA, est):
        return abi.CUDA_ERROR_OUT_OF_MEMORY
    rc = call_real(ctx, idx, args, notfound)
    if rc != abi.CUDA_SUCCESS:
        Q.uncharge(ctx, dev, L.KIND_DATA, est)
        return rc
    ptr = load_u64(dptr)
    actual = load_u64(ppitch) * np.uint64(height)
    if actual > est:
        if not Q.charge_or_refuse(ctx, dev, L.KIND_DATA, actual - est):
            call_real(ctx, ENTRY.cuMemFree_v2, (ptr,), 0)
            Q.uncharge(ctx, dev, L.KIND_DATA, est)
            return abi.CUDA_ERROR_OUT_OF_MEMORY
    elif actual < est:
        Q.uncharge(ctx, dev, L.KIND_DATA, est - actual)
    return record_or_undo(ctx, ptr, dev, actual, T.T_PTR, ENTRY.cuMemFree_v2)


@njit
def mem_free(ctx, idx, args, notfound):
    """Frees reach the driver whether or not pyvgpu recorded the pointer; only recorded ones are credited."""
    (ptr,) = args
    return release_recorded(ctx, idx, args, notfound, ptr)


# --- VMM: cuMemCreate / cuMemRelease ------------------------------------------

@njit
def mem_create(ctx, idx, args, notfound):
    """Device-located physical memory is charged at creation; host-located is not counted."""
    phandle, size, prop, flags = args
    if CTX.get_region(ctx) == 0 or phandle == 0 or prop == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    if MEM_PROP.get_location_type(prop) != abi.CU_MEM_LOCATION_TYPE_DEVICE:
        return call_real(ctx, idx, args, notfound)
    dev = MEM_PROP.get_location_id(prop)
    if dev < 0 or dev >= L.MAX_DEVICES:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc_on(ctx, idx, args, notfound, dev, phandle, size, T.T_VMM, ENTRY.cuMemRelease)


@njit
def release_recorded(ctx, idx, args, notfound, key):
    """Free and destroy calls: credit what was recorded for ``key``. The record is taken before the call
    (the driver may hand the address out again at once) and put back if the call fails."""
    if CTX.get_region(ctx) == 0 or key == 0:
        return call_real(ctx, idx, args, notfound)
    v = T.take(ctx, key)
    rc = call_real(ctx, idx, args, notfound)
    if v != 0:
        if rc == abi.CUDA_SUCCESS:
            credit(ctx, v)
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
    """Bytes per channel of a CUarray_format (pyvgpu.contract.abi.ARRAY_FORMAT_BYTES); unknown formats count 16."""
    if fmt < 256:
        return np.uint64(FORMAT_BYTES[fmt])
    return np.uint64(abi.ARRAY_FORMAT_UNKNOWN_BYTES)


@njit
def array_alloc(ctx, idx, args, notfound, phandle, size, destroy):
    if CTX.get_region(ctx) == 0 or phandle == 0 or size == 0:
        return call_real(ctx, idx, args, notfound)
    return charged_alloc(ctx, idx, args, notfound, phandle, size, T.T_ARRAY, destroy)


@njit
def array_create(ctx, idx, args, notfound):
    phandle, desc = args
    if desc == 0:
        return call_real(ctx, idx, args, notfound)
    w, h = ARRAY_DESC.get_Width(desc), ARRAY_DESC.get_Height(desc)
    n = w * (h if h > 0 else 1) * format_bytes(ARRAY_DESC.get_Format(desc)) * ARRAY_DESC.get_NumChannels(desc)
    return array_alloc(ctx, idx, args, notfound, phandle, n, ENTRY.cuArrayDestroy)


@njit
def array3d_bytes(desc, level):
    level = np.uint64(level)
    w = ARRAY3D_DESC.get_Width(desc) >> level
    w = w if w > 0 else 1
    h = ARRAY3D_DESC.get_Height(desc)
    h = (h >> level) if h > 0 else 1
    h = h if h > 0 else 1
    d = ARRAY3D_DESC.get_Depth(desc)
    d = (d >> level) if d > 0 else 1
    d = d if d > 0 else 1
    return np.uint64(w * h * d * format_bytes(ARRAY3D_DESC.get_Format(desc)) * ARRAY3D_DESC.get_NumChannels(desc))


@njit
def array3d_create(ctx, idx, args, notfound):
    phandle, desc = args
    if desc == 0:
        return call_real(ctx, idx, args, notfound)
    return array_alloc(ctx, idx, args, notfound, phandle, array3d_bytes(desc, 0), ENTRY.cuArrayDestroy)


@njit
def mipmapped_array_create(ctx, idx, args, notfound):
    """Every level of the chain, each dimension halved per level (at least 1)."""
    phandle, desc, levels = args
    if desc == 0 or CTX.get_region(ctx) == 0 or phandle == 0:
        return call_real(ctx, idx, args, notfound)
    n = np.uint64(0)
    for lv in range(levels if levels > 0 else 1):
        n += array3d_bytes(desc, lv)
    return charged_alloc(ctx, idx, args, notfound, phandle, n, T.T_ARRAY, ENTRY.cuMipmappedArrayDestroy)
