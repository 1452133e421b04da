"""What the program sees of the machine: the group's devices, through CUDA and NVML alike.

``pyvgpu wrap --devices 2,0`` writes the group's devices into the region
(header ``visible``: the NVML index of each, and its UUID) and sets
CUDA_VISIBLE_DEVICES to their UUIDs, so CUDA ordinal i is group device i.
NVML ignores CUDA_VISIBLE_DEVICES; these policies make it agree:

* nvmlDeviceGetCount gives the group's count, nvmlDeviceGetHandleByIndex(i)
  the handle of group device i, nvmlDeviceGetIndex the group index back;
  a handle looked up by UUID, PCI bus id or serial for a device outside the
  group is NOT_FOUND.
* Memory info (pyvgpu/jit/devices/memview.py) and utilization are those of the group
  device the handle belongs to; process lists hold the group's processes
  only, each with the bytes the group charged it.
* cuInit checks that CUDA sees exactly the group's devices, in order (by
  UUID). A program that changed CUDA_VISIBLE_DEVICES itself gets its GPU use
  refused with a message on stderr, rather than a device outside its vGPU.

Without --devices (``n_visible`` 0) NVML and CUDA order are taken to agree,
as they do when CUDA_VISIBLE_DEVICES is unset.

A MIG instance (``visible`` has L.VISIBLE_MIG) is CUDA's device by its own UUID
(cuDeviceGetUuid_v2); in NVML the group device is its GPU's handle (NVML counts
GPUs; the memory it reports is the group's view, pyvgpu/jit/devices/memview.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.runtime.context import HELPER, REAL, call_real
from pyvgpu.jit.runtime.fields import (
    CTX,
    DEV,
    HDR,
    NVML_PROCESS_DETAIL_LIST,
    NVML_PROCESS_INFO,
    NVML_UTILIZATION,
    REGION,
    SLOT,
)
from pyvgpu.jit.runtime.intrinsics import (
    load_u8,
    load_u32,
    load_u64,
    stack_buffer,
    stack_u64,
    store_u32,
    store_u64,
    write_fd,
)
from pyvgpu.jit.state import events
from pyvgpu.jit.state.quota import used_index

MAX_PROCESSES = 256  # entries of a process list read from NVML per call
MAX_DETAILS = 192  # entries of a process detail list read per call
USED_AT = NVML_PROCESS_INFO.OFF_usedGpuMemory  # usedGpuMemory: at 8 in every version of a process entry
V1_ENTRY, V2_ENTRY = abi.NVML_PROCESS_INFO_V1.size, abi.NVML_PROCESS_INFO.size  # 16, 24 bytes
DETAIL_ENTRY = abi.NVML_PROCESS_DETAIL.size  # 32 bytes


@njit(inline="always")
def n_visible(region):
    return HDR.get_n_visible(region) if region != 0 else np.uint32(0)


@njit
def group_of_physical(region, phys):
    """Group index of the device NVML numbers phys, -1 if it is not the group's (identity without --devices)."""
    n = n_visible(region)
    if n == 0:
        return np.int64(phys) if phys < L.MAX_DEVICES else np.int64(-1)
    for g in range(n):
        if HDR.get_visible(region, g) & L.VISIBLE_INDEX == phys:
            return np.int64(g)
    return np.int64(-1)


@njit
def nvml_group_device(ctx, handle):
    """Group device index of an NVML handle, or -1 (not ours, or NVML cannot say)."""
    out = stack_u64()
    if HELPER.nvmlDeviceGetIndex(ctx, handle, out) != abi.NVML_SUCCESS:
        return np.int64(-1)
    return group_of_physical(CTX.get_region(ctx), load_u32(out))


# --- CUDA ---------------------------------------------------------------------------------

@njit
def refuse_devices(ctx, region):
    """CUDA sees other devices than the group's: say so once, log it, refuse from now on."""
    if CTX.load_devices_refused(ctx) == 0:
        CTX.store_devices_refused(ctx, 1)
        msg = CTX.devices_msg_at(ctx, 0)
        n = 0
        while n < CTX.N_devices_msg and load_u8(msg + n) != 0:
            n += 1
        write_fd(np.int32(2), msg, np.uint64(n))
        events.record(region, L.EV_DEVICES_REFUSED, -1, 0, 0, 0)
    return abi.CUDA_ERROR_NO_DEVICE


@njit
def same_devices(ctx, region):
    """True if CUDA's devices are the group's, one for one, in order (compared by UUID)."""
    n = n_visible(region)
    count = stack_u64()
    if REAL.cuDeviceGetCount(ctx, count) != abi.CUDA_SUCCESS or load_u32(count) != n:
        return False
    uuid = stack_buffer(16)  # CUuuid
    for i in range(n):
        if HELPER.cuDeviceGetUuid_v2(ctx, uuid, i) != abi.CUDA_SUCCESS:
            return False
        want = HDR.visible_uuid_at(region, i * L.UUID_BYTES)
        if load_u64(uuid) != load_u64(want) or load_u64(uuid + 8) != load_u64(want + 8):
            return False
    return True


@njit
def cuda_init(ctx, idx, args, notfound):
    rc = call_real(ctx, idx, args, notfound)
    region = CTX.get_region(ctx)
    if rc != abi.CUDA_SUCCESS or n_visible(region) == 0:
        return rc
    if CTX.load_devices_refused(ctx) != 0 or not same_devices(ctx, region):
        return refuse_devices(ctx, region)
    return rc


@njit
def device_count(ctx, idx, args, notfound):
    (pcount,) = args
    rc = call_real(ctx, idx, args, notfound)
    if rc == abi.CUDA_SUCCESS and pcount != 0 and CTX.load_devices_refused(ctx) != 0:
        store_u32(pcount, 0)
    return rc


@njit(inline="always")
def refused(ctx):
    """For the context-creating policies: no context while the devices are refused."""
    return CTX.load_devices_refused(ctx) != 0


# --- NVML: which devices --------------------------------------------------------------------

@njit
def nvml_count(ctx, idx, args, notfound):
    (pcount,) = args
    rc = call_real(ctx, idx, args, notfound)
    n = n_visible(CTX.get_region(ctx))
    if rc == abi.NVML_SUCCESS and pcount != 0 and n != 0:
        store_u32(pcount, n)
    return rc


@njit
def nvml_by_index(ctx, idx, args, notfound):
    index, phandle = args
    region = CTX.get_region(ctx)
    n = n_visible(region)
    if n == 0:
        return call_real(ctx, idx, args, notfound)
    if index >= n:
        return abi.NVML_ERROR_INVALID_ARGUMENT
    return call_real(ctx, idx, (HDR.get_visible(region, index) & L.VISIBLE_INDEX, phandle), notfound)


@njit
def nvml_by_key(ctx, idx, args, notfound):
    """Handle by UUID, PCI bus id or serial: NOT_FOUND for a device outside the group."""
    key, phandle = args
    rc = call_real(ctx, idx, args, notfound)
    if rc == abi.NVML_SUCCESS and phandle != 0 and n_visible(CTX.get_region(ctx)) != 0:
        if nvml_group_device(ctx, load_u64(phandle)) < 0:
            store_u64(phandle, 0)
            return abi.NVML_ERROR_NOT_FOUND
    return rc


@njit
def nvml_index(ctx, idx, args, notfound):
    handle, pindex = args
    rc = call_real(ctx, idx, args, notfound)
    region = CTX.get_region(ctx)
    if rc == abi.NVML_SUCCESS and pindex != 0 and n_visible(region) != 0:
        g = group_of_physical(region, load_u32(pindex))
        if g < 0:
            return abi.NVML_ERROR_NOT_FOUND
        store_u32(pindex, np.uint32(g))
    return rc


# --- NVML: what runs there ------------------------------------------------------------------

@njit
def group_bytes_of(region, n_slots, pid, dev):
    """Bytes the group charged process pid on dev, or -1 if pid is not a live member."""
    for i in range(n_slots):
        s = REGION.slot(region, i)
        if SLOT.load_state(s) != L.SLOT_LIVE or SLOT.load_pid(s) != pid:
            continue
        total = np.uint64(0)
        for k in range(L.N_KINDS):
            total += SLOT.load_used(s, used_index(dev, k))
        return np.int64(total)
    return np.int64(-1)


@njit
def keep_group_processes(ctx, region, dev, buf, n, entry):
    """Filter NVML's n entries at buf (``entry`` bytes each) in place to the group's live members, each
    with the bytes the group charged it on dev; returns how many are kept."""
    n_slots = CTX.load_n_slots(ctx)
    kept = 0
    for k in range(n):
        e = buf + k * entry
        used = group_bytes_of(region, n_slots, NVML_PROCESS_INFO.get_pid(e), dev) if dev >= 0 else np.int64(-1)
        if used < 0:
            continue
        out = buf + kept * entry
        if out != e:
            for w in range(0, entry, 8):
                store_u64(out + w, load_u64(e + w))
        store_u64(out + USED_AT, np.uint64(used))
        kept += 1
    return kept


@njit
def processes(ctx, idx, args, notfound, entry):
    """A running-process list with the group's processes only, each with the bytes the group charged it.

    NVML's list is read into a buffer of our own, filtered, then copied out with
    NVML's rules for the caller's capacity. ``entry`` is the struct size of the
    entry's version (nvmlProcessInfo_v1_t or nvmlProcessInfo_t).
    """
    handle, pcount, infos = args
    region = CTX.get_region(ctx)
    if region == 0 or pcount == 0:
        return call_real(ctx, idx, args, notfound)
    buf = stack_buffer(6144)  # MAX_PROCESSES x V2_ENTRY
    count = stack_u64()
    store_u32(count, MAX_PROCESSES)
    rc = call_real(ctx, idx, (handle, count, buf), notfound)
    if rc != abi.NVML_SUCCESS:
        if rc == abi.NVML_ERROR_INSUFFICIENT_SIZE:
            store_u32(pcount, load_u32(count))  # more than we can read: an upper bound, and the error
        return rc
    kept = keep_group_processes(ctx, region, nvml_group_device(ctx, handle), buf, load_u32(count), entry)
    cap = load_u32(pcount)
    store_u32(pcount, np.uint32(kept))
    if kept > 0 and (infos == 0 or cap < kept):
        return abi.NVML_ERROR_INSUFFICIENT_SIZE
    for w in range(0, kept * entry, 8):
        store_u64(infos + w, load_u64(buf + w))
    return abi.NVML_SUCCESS


@njit
def nvml_process_details(ctx, idx, args, notfound):
    """nvmlDeviceGetRunningProcessDetailList (what newer nvidia-smi reads): filtered like the lists above."""
    handle, plist = args
    region = CTX.get_region(ctx)
    if region == 0 or plist == 0:
        return call_real(ctx, idx, args, notfound)
    mine = stack_buffer(24)  # nvmlProcessDetailList_t
    buf = stack_buffer(6144)  # MAX_DETAILS x DETAIL_ENTRY
    L_ = NVML_PROCESS_DETAIL_LIST
    L_.set_version(mine, L_.get_version(plist))  # version and mode, as the caller asked
    L_.set_mode(mine, L_.get_mode(plist))
    L_.set_numProcArrayEntries(mine, MAX_DETAILS)
    L_.set_procArray(mine, buf)
    rc = call_real(ctx, idx, (handle, mine), notfound)
    if rc != abi.NVML_SUCCESS:
        if rc == abi.NVML_ERROR_INSUFFICIENT_SIZE:
            L_.set_numProcArrayEntries(plist, L_.get_numProcArrayEntries(mine))
        return rc
    kept = keep_group_processes(ctx, region, nvml_group_device(ctx, handle), buf,
                                L_.get_numProcArrayEntries(mine), DETAIL_ENTRY)
    cap = L_.get_numProcArrayEntries(plist)
    out = L_.get_procArray(plist)
    L_.set_numProcArrayEntries(plist, np.uint32(kept))
    if kept > 0 and (out == 0 or cap < kept):
        return abi.NVML_ERROR_INSUFFICIENT_SIZE
    for w in range(0, kept * DETAIL_ENTRY, 8):
        store_u64(out + w, load_u64(buf + w))
    return abi.NVML_SUCCESS


@njit
def nvml_processes_v1(ctx, idx, args, notfound):
    return processes(ctx, idx, args, notfound, V1_ENTRY)


@njit
def nvml_processes(ctx, idx, args, notfound):
    return processes(ctx, idx, args, notfound, V2_ENTRY)


@njit
def nvml_utilization(ctx, idx, args, notfound):
    """nvmlUtilization_t {gpu, memory}: under a compute share, gpu is the group's own estimate.

    The controller (pyvgpu/jit/compute/controller.py) keeps it: the device's reading while
    the group is alone there, else the GPU time the group was charged, at most
    the device's reading. Without a share the device's reading stands: nothing
    tells the group's time from others'.
    """
    handle, putil = args
    rc = call_real(ctx, idx, args, notfound)
    region = CTX.get_region(ctx)
    if rc != abi.NVML_SUCCESS or region == 0 or putil == 0:
        return rc
    dev = nvml_group_device(ctx, handle)
    if dev < 0:
        return rc
    d = REGION.device(region, dev)
    limit = DEV.load_sm_limit(d)
    if limit == 0 or limit >= 100 or DEV.load_sm_steps(d) == 0:
        return rc
    est = (DEV.load_sm_group_util(d) + np.uint32(50)) // np.uint32(100)
    if est < NVML_UTILIZATION.get_gpu(putil):
        NVML_UTILIZATION.set_gpu(putil, est)
    return rc
