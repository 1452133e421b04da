"""What the program sees of the machine: the group's devices, through CUDA and NVML alike.

``pyvgpu wrap --devices 2,0`` writes the group's devices into the region
(header ``visible``: the NVML index of each, and its UUID) and sets
CUDA_VISIBLE_DEVICES to their UUIDs, so CUDA ordinal i is group device i.
NVML ignores CUDA_VISIBLE_DEVICES; these policies make it agree:

* nvmlDeviceGetCount gives the group's count, nvmlDeviceGetHandleByIndex(i)
  the handle of group device i, nvmlDeviceGetIndex the group index back;
  a handle looked up by UUID, PCI bus id or serial for a device outside the
  group is NOT_FOUND.
* Memory info (pyvgpu/jit/memory.py) and utilization are those of the group
  device the handle belongs to; process lists hold the group's processes
  only, each with the bytes the group charged it.
* cuInit checks that CUDA sees exactly the group's devices, in order (by
  UUID). A program that changed CUDA_VISIBLE_DEVICES itself gets its GPU use
  refused with a message on stderr, rather than a device outside its vGPU.

Without --devices (``n_visible`` 0) NVML and CUDA order are taken to agree,
as they do when CUDA_VISIBLE_DEVICES is unset.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu import hooks
from pyvgpu import layout as L
from pyvgpu.jit import events
from pyvgpu.jit import quota as Q
from pyvgpu.jit.intrinsics import (
    atomic_load_u32,
    atomic_load_u64,
    atomic_store_u32,
    call_i32,
    load_u8,
    load_u32,
    load_u64,
    stack_buffer,
    stack_u64,
    store_u32,
    store_u64,
    write_fd,
)
from pyvgpu.jit.policies import call_real

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
MAX_PROCESSES = 256  # entries of a process list read from NVML per call

OFF_HELPER = L.CTX.offset("helper")
OFF_REAL = L.CTX.offset("real")
OFF_REFUSED = L.CTX.offset("devices_refused")
OFF_MSG = L.CTX.offset("devices_msg")
HDR_N_VISIBLE = L.REGION_HEADER.offset("n_visible")
HDR_VISIBLE = L.REGION_HEADER.offset("visible")
HDR_UUID = L.REGION_HEADER.offset("visible_uuid")
DEV_SM_LIMIT = L.REGION_DEVICE.offset("sm_limit")
DEV_STEPS = L.REGION_DEVICE.offset("sm_steps")
DEV_GROUP_UTIL = L.REGION_DEVICE.offset("sm_group_util")
SLOT_STATE = L.REGION_SLOT.offset("state")
SLOT_PID = L.REGION_SLOT.offset("pid")
SLOT_USED = L.REGION_SLOT.offset("used")

H_NVML_GET_INDEX = hooks.HELPER_INDEX["nvmlDeviceGetIndex"]
H_UUID = hooks.HELPER_INDEX["cuDeviceGetUuid_v2"]
E_DEVICE_COUNT = hooks.BY_ABI["cuDeviceGetCount"].index


@njit(inline="always")
def n_visible(region):
    return load_u32(region + HDR_N_VISIBLE) if region != 0 else np.uint32(0)


@njit
def group_of_physical(region, phys):
    """Group index of the device NVML numbers phys, -1 if it is not the group's (identity without --devices)."""
    n = n_visible(region)
    if n == 0:
        return np.int64(phys) if phys < L.MAX_DEVICES else np.int64(-1)
    for g in range(n):
        if load_u32(region + HDR_VISIBLE + g * 4) == phys:
            return np.int64(g)
    return np.int64(-1)


@njit
def nvml_group_device(ctx, handle):
    """Group device index of an NVML handle, or -1 (not ours, or NVML cannot say)."""
    fn = load_u64(ctx + OFF_HELPER + H_NVML_GET_INDEX * 8)
    out = stack_u64()
    if fn == 0 or call_i32(fn, (handle, out)) != NVML_SUCCESS:
        return np.int64(-1)
    return group_of_physical(Q.region_of(ctx), load_u32(out))


# --- CUDA ---------------------------------------------------------------------------------

@njit
def refuse_devices(ctx, region):
    """CUDA sees other devices than the group's: say so once, log it, refuse from now on."""
    if atomic_load_u32(ctx + OFF_REFUSED) == 0:
        atomic_store_u32(ctx + OFF_REFUSED, 1)
        n = 0
        while n < L.MESSAGE_BYTES and load_u8(ctx + OFF_MSG + n) != 0:
            n += 1
        write_fd(np.int32(2), ctx + OFF_MSG, np.uint64(n))
        events.record(region, L.EV_DEVICES_REFUSED, -1, 0, 0, 0)
    return CUDA_ERROR_NO_DEVICE


@njit
def same_devices(ctx, region):
    """True if CUDA's devices are the group's, one for one, in order (compared by UUID)."""
    n = n_visible(region)
    count = stack_u64()
    fn = load_u64(ctx + OFF_REAL + E_DEVICE_COUNT * 8)
    if fn == 0 or call_i32(fn, (count,)) != CUDA_SUCCESS or load_u32(count) != n:
        return False
    uuid = stack_buffer(16)
    get = load_u64(ctx + OFF_HELPER + H_UUID * 8)
    for i in range(n):
        if get == 0 or call_i32(get, (uuid, np.int32(i))) != CUDA_SUCCESS:
            return False
        want = region + HDR_UUID + i * L.UUID_BYTES
        if load_u64(uuid) != load_u64(want) or load_u64(uuid + 8) != load_u64(want + 8):
            return False
    return True


@njit
def cuda_init(ctx, idx, args, notfound):
    rc = call_real(ctx, idx, args, notfound)
    region = Q.region_of(ctx)
    if rc != CUDA_SUCCESS or n_visible(region) == 0:
        return rc
    if atomic_load_u32(ctx + OFF_REFUSED) != 0 or not same_devices(ctx, region):
        return refuse_devices(ctx, region)
    return rc


@njit
def device_count(ctx, idx, args, notfound):
    (pcount,) = args
    rc = call_real(ctx, idx, args, notfound)
    if rc == CUDA_SUCCESS and pcount != 0 and atomic_load_u32(ctx + OFF_REFUSED) != 0:
        store_u32(pcount, 0)
    return rc


@njit(inline="always")
def refused(ctx):
    """For the context-creating policies: no context while the devices are refused."""
    return atomic_load_u32(ctx + OFF_REFUSED) != 0


# --- NVML: which devices --------------------------------------------------------------------

@njit
def nvml_count(ctx, idx, args, notfound):
    (pcount,) = args
    rc = call_real(ctx, idx, args, notfound)
    n = n_visible(Q.region_of(ctx))
    if rc == NVML_SUCCESS and pcount != 0 and n != 0:
        store_u32(pcount, n)
    return rc


@njit
def nvml_by_index(ctx, idx, args, notfound):
    index, phandle = args
    region = Q.region_of(ctx)
    n = n_visible(region)
    if n == 0:
        return call_real(ctx, idx, args, notfound)
    if index >= n:
        return NVML_ERROR_INVALID_ARGUMENT
    return call_real(ctx, idx, (load_u32(region + HDR_VISIBLE + index * 4), phandle), notfound)


@njit
def nvml_by_key(ctx, idx, args, notfound):
    """Handle by UUID, PCI bus id or serial: NOT_FOUND for a device outside the group."""
    key, phandle = args
    rc = call_real(ctx, idx, args, notfound)
    if rc == NVML_SUCCESS and phandle != 0 and n_visible(Q.region_of(ctx)) != 0:
        if nvml_group_device(ctx, load_u64(phandle)) < 0:
            store_u64(phandle, 0)
            return NVML_ERROR_NOT_FOUND
    return rc


@njit
def nvml_index(ctx, idx, args, notfound):
    handle, pindex = args
    rc = call_real(ctx, idx, args, notfound)
    region = Q.region_of(ctx)
    if rc == NVML_SUCCESS and pindex != 0 and n_visible(region) != 0:
        g = group_of_physical(region, load_u32(pindex))
        if g < 0:
            return NVML_ERROR_NOT_FOUND
        store_u32(pindex, np.uint32(g))
    return rc


# --- NVML: what runs there ------------------------------------------------------------------

@njit
def group_bytes_of(region, n_slots, pid, dev):
    """Bytes the group charged process pid on dev, or -1 if pid is not a live member."""
    for i in range(n_slots):
        s = Q.slot_addr(region, i)
        if atomic_load_u32(s + SLOT_STATE) != L.SLOT_LIVE or atomic_load_u32(s + SLOT_PID) != pid:
            continue
        total = np.uint64(0)
        for k in range(L.N_KINDS):
            total += atomic_load_u64(s + SLOT_USED + (dev * L.N_KINDS + k) * 8)
        return np.int64(total)
    return np.int64(-1)


@njit
def keep_group_processes(ctx, region, dev, buf, n, entry):
    """Filter NVML's n entries at buf (``entry`` bytes each) in place to the group's live members, each
    with the bytes the group charged it on dev; returns how many are kept. usedGpuMemory is at offset 8
    in every version of the entry."""
    n_slots = atomic_load_u32(ctx + Q.OFF_NSLOTS)
    kept = 0
    for k in range(n):
        e = buf + k * entry
        used = group_bytes_of(region, n_slots, load_u32(e), dev) if dev >= 0 else np.int64(-1)
        if used < 0:
            continue
        out = buf + kept * entry
        if out != e:
            for w in range(0, entry, 8):
                store_u64(out + w, load_u64(e + w))
        store_u64(out + 8, np.uint64(used))
        kept += 1
    return kept


@njit
def processes(ctx, idx, args, notfound, entry):
    """A running-process list with the group's processes only, each with the bytes the group charged it.

    NVML's list is read into a buffer of our own, filtered, then copied out with
    NVML's rules for the caller's capacity. ``entry`` is the struct size: 16 for
    nvmlProcessInfo_v1_t {pid, usedGpuMemory}, 24 when two instance ids follow.
    """
    handle, pcount, infos = args
    region = Q.region_of(ctx)
    if region == 0 or pcount == 0:
        return call_real(ctx, idx, args, notfound)
    buf = stack_buffer(6144)  # MAX_PROCESSES x 24
    count = stack_u64()
    store_u32(count, MAX_PROCESSES)
    rc = call_real(ctx, idx, (handle, count, buf), notfound)
    if rc != NVML_SUCCESS:
        if rc == NVML_ERROR_INSUFFICIENT_SIZE:
            store_u32(pcount, load_u32(count))  # more than we can read: an upper bound, and the error
        return rc
    kept = keep_group_processes(ctx, region, nvml_group_device(ctx, handle), buf, load_u32(count), entry)
    cap = load_u32(pcount)
    store_u32(pcount, np.uint32(kept))
    if kept > 0 and (infos == 0 or cap < kept):
        return NVML_ERROR_INSUFFICIENT_SIZE
    for w in range(0, kept * entry, 8):
        store_u64(infos + w, load_u64(buf + w))
    return NVML_SUCCESS


# nvmlProcessDetailList_v1_t {version, mode, numProcArrayEntries, procArray at 16};
# its entries, nvmlProcessDetail_v1_t, are 32 bytes (pid, usedGpuMemory at 8, ids, CC memory).
PDL_COUNT, PDL_ARRAY, PDL_SIZE, DETAIL_ENTRY, MAX_DETAILS = 8, 16, 24, 32, 192


@njit
def nvml_process_details(ctx, idx, args, notfound):
    """nvmlDeviceGetRunningProcessDetailList (what newer nvidia-smi reads): filtered like the lists above."""
    handle, plist = args
    region = Q.region_of(ctx)
    if region == 0 or plist == 0:
        return call_real(ctx, idx, args, notfound)
    mine = stack_buffer(24)
    buf = stack_buffer(6144)  # MAX_DETAILS x 32
    store_u64(mine, load_u64(plist))  # version and mode, as the caller asked
    store_u32(mine + PDL_COUNT, MAX_DETAILS)
    store_u64(mine + PDL_ARRAY, buf)
    rc = call_real(ctx, idx, (handle, mine), notfound)
    if rc != NVML_SUCCESS:
        if rc == NVML_ERROR_INSUFFICIENT_SIZE:
            store_u32(plist + PDL_COUNT, load_u32(mine + PDL_COUNT))
        return rc
    kept = keep_group_processes(ctx, region, nvml_group_device(ctx, handle), buf, load_u32(mine + PDL_COUNT),
                                DETAIL_ENTRY)
    cap = load_u32(plist + PDL_COUNT)
    out = load_u64(plist + PDL_ARRAY)
    store_u32(plist + PDL_COUNT, np.uint32(kept))
    if kept > 0 and (out == 0 or cap < kept):
        return NVML_ERROR_INSUFFICIENT_SIZE
    for w in range(0, kept * DETAIL_ENTRY, 8):
        store_u64(out + w, load_u64(buf + w))
    return NVML_SUCCESS


@njit
def nvml_processes_v1(ctx, idx, args, notfound):
    return processes(ctx, idx, args, notfound, 16)


@njit
def nvml_processes(ctx, idx, args, notfound):
    return processes(ctx, idx, args, notfound, 24)


@njit
def nvml_utilization(ctx, idx, args, notfound):
    """nvmlUtilization_t {gpu, memory}: under a compute share, gpu is the group's own estimate.

    The controller (pyvgpu/jit/compute.py) keeps it: the device's reading while
    the group is alone there, else the GPU time the group was charged, at most
    the device's reading. Without a share the device's reading stands: nothing
    tells the group's time from others'.
    """
    handle, putil = args
    rc = call_real(ctx, idx, args, notfound)
    region = Q.region_of(ctx)
    if rc != NVML_SUCCESS or region == 0 or putil == 0:
        return rc
    dev = nvml_group_device(ctx, handle)
    if dev < 0:
        return rc
    d = Q.device_addr(region, dev)
    limit = atomic_load_u32(d + DEV_SM_LIMIT)
    if limit == 0 or limit >= 100 or atomic_load_u64(d + DEV_STEPS) == 0:
        return rc
    est = (atomic_load_u32(d + DEV_GROUP_UTIL) + np.uint32(50)) // np.uint32(100)
    if est < load_u32(putil):
        store_u32(putil, est)
    return rc
