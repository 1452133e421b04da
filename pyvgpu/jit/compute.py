"""What happens on every kernel launch: the compute-share limiter.

A group with ``sm_limit = s`` percent on a device may use s% of that
device's time. Three parts:

* **Cost model.** A launch costs the GPU time its kernel takes, in ns. Every
  kernel (function and launch shape; a whole CUDA graph for cuGraphLaunch)
  has its own estimate, learned by timing sampled launches between two CUDA
  events: the first launch of each kernel, then one launch in SAMPLE_EVERY;
  the estimate is a decaying minimum of the timings (``learn``).
  Timings are harvested later on the launching thread (never blocking), so
  a 200-block and a 2-block grid of the same function are told apart, and a
  long kernel costs what it takes rather than its grid size.
* **Limiter.** One budget per (group, device) in the shared region: a
  generic cell rate algorithm on a single word, ``sm_tat``, the time at which
  the budget is next free. A launch advances it by cost x scale x 100 / s with
  one CAS, and sleeps only if it is more than BURST_NS ahead of now. Every
  process of the group draws on the same word, in arrival order.
* **Controller** (``control``, on the watcher thread, no GIL): every
  CONTROL_PERIOD_NS one process of the group takes the step. It reads the
  device's utilization from NVML and, while the group is the only one on the
  device, corrects ``sm_scale`` by sqrt(measured / target), a damped
  multiplicative step that converges geometrically without overshoot;
  while others share the device, NVML cannot tell their time from ours, so
  the scale holds. It lowers the scale only while the limiter actually held
  launches back (a program that asks for less is not a reason to give more).

With no limit in force a launch costs a few loads and one atomic add (the
process's launch count, for ``pyvgpu top``) before the driver is called: no
clock read, no lock, no syscall.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pyvgpu import hooks
from pyvgpu import layout as L
from pyvgpu.jit import quota as Q
from pyvgpu.jit import turn
from pyvgpu.jit.intrinsics import (
    atomic_add_u32,
    atomic_add_u64,
    atomic_cas_u32,
    atomic_cas_u64,
    atomic_load_u32,
    atomic_load_u64,
    atomic_store_u32,
    atomic_store_u64,
    call_i32,
    load_f32,
    load_i32,
    load_u32,
    load_u64,
    monotonic_ns,
    sleep_ns,
    stack_buffer,
    stack_u64,
    store_u32,
    store_u64,
)
from pyvgpu.jit.memory import current_device, device_used, helper
from pyvgpu.jit.policies import call_real
from pyvgpu.jit.streams import running_context

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
CU_STREAM_PER_THREAD = 2  # the per-thread default stream's handle, valid with every API
POLICY_DEFAULT, POLICY_FORCE, POLICY_DISABLE = 0, 1, 2

BURST_NS = 2_000_000  # budget a group may run ahead of its share (absorbs sleep overshoot)
SAMPLE_EVERY = 256  # time one launch in this many (a power of two); a new kernel's first launch always
HARVEST_EVERY = 64  # look for finished timings every this many launches (a power of two)
CONTROL_PERIOD_NS = 500_000_000
Q16 = 65536
SCALE_MIN, SCALE_MAX = Q16 // 16, Q16 * 16
STATE_IDLE, STATE_CALIBRATING, STATE_HOLDING, STATE_NO_MEASUREMENT = 0, 1, 2, 3

OFF_REGION = L.CTX.offset("region")
OFF_SLOT = L.CTX.offset("slot")
OFF_POLICY = L.CTX.offset("sm_policy")
OFF_BATCH = L.CTX.offset("sm_batch_ns")
OFF_NVML = L.CTX.offset("sm_nvml")
OFF_LAUNCHES = L.CTX.offset("sm_launches")
OFF_NDEV = L.CTX.offset("sm_ndev")
OFF_REAL = L.CTX_OFF_REAL
E_DEVICE_COUNT = hooks.BY_ABI["cuDeviceGetCount"].index
OFF_DEFAULT_COST = L.CTX.offset("sm_default_cost")
OFF_PENDING = L.CTX.offset("sm_pending")
OFF_COST_KEY = L.CTX.offset("cost_key")
OFF_COST_NS = L.CTX.offset("cost_ns")
OFF_S_STATE = L.CTX.offset("samp_state")
OFF_S_KEY = L.CTX.offset("samp_key")
OFF_S_CTX = L.CTX.offset("samp_ctx")
OFF_S_START = L.CTX.offset("samp_start")
OFF_S_END = L.CTX.offset("samp_end")

HDR_SWITCH = L.REGION_HEADER.offset("sm_switch")
HDR_ANY = L.REGION_HEADER.offset("sm_any")
DEV_LIMIT = L.REGION_DEVICE.offset("sm_limit")
DEV_UTIL = L.REGION_DEVICE.offset("sm_util")
DEV_TAT = L.REGION_DEVICE.offset("sm_tat")
DEV_SCALE = L.REGION_DEVICE.offset("sm_scale")
DEV_CTL = L.REGION_DEVICE.offset("sm_ctl_ns")
DEV_THROTTLE = L.REGION_DEVICE.offset("sm_throttle_ns")
DEV_CTL_THROTTLE = L.REGION_DEVICE.offset("sm_ctl_throttle")
DEV_STEPS = L.REGION_DEVICE.offset("sm_steps")
DEV_STATE = L.REGION_DEVICE.offset("sm_state")
SLOT_LAUNCHES = L.REGION_SLOT.offset("sm_launches")
SLOT_ALL_LAUNCHES = L.REGION_SLOT.offset("launches")
DEV_GROUP_UTIL = L.REGION_DEVICE.offset("sm_group_util")
DEV_COST_MARK = L.REGION_DEVICE.offset("sm_cost_mark")
SLOT_COST = L.REGION_SLOT.offset("sm_cost_ns")
SLOT_USED = L.REGION_SLOT.offset("used")
SLOT_STATE = L.REGION_SLOT.offset("state")

H_EVENT_CREATE = hooks.HELPER_INDEX["cuEventCreate"]
H_EVENT_RECORD = hooks.HELPER_INDEX["cuEventRecord"]
H_EVENT_QUERY = hooks.HELPER_INDEX["cuEventQuery"]
H_EVENT_ELAPSED = hooks.HELPER_INDEX["cuEventElapsedTime"]
H_EVENT_DESTROY = hooks.HELPER_INDEX["cuEventDestroy_v2"]
H_PCI_BUS_ID = hooks.HELPER_INDEX["cuDeviceGetPCIBusId"]
H_NVML_BY_BUS_ID = hooks.HELPER_INDEX["nvmlDeviceGetHandleByPciBusId_v2"]
H_NVML_UTILIZATION = hooks.HELPER_INDEX["nvmlDeviceGetUtilizationRates"]
H_NVML_PROCESSES = hooks.HELPER_INDEX["nvmlDeviceGetComputeRunningProcesses_v3"]

_NO_HANDLE = np.uint64(1)  # sm_nvml value: NVML cannot see this device


# --- the fast path ----------------------------------------------------------------------

@njit(inline="always")
def limited(ctx, region):
    """True if this process's launches go through the limiter. Loads only."""
    if load_u32(region + HDR_ANY) == 0:
        return False
    policy = load_u32(ctx + OFF_POLICY)
    return not (policy == POLICY_DISABLE or (policy == POLICY_DEFAULT and load_u32(region + HDR_SWITCH) == 0))


@njit(inline="always")
def count_launch(ctx):
    """Count the launch in the process's slot (pyvgpu top's launches/s): (the count before it, True), or
    (0, False) without a slot."""
    slot = load_u64(ctx + OFF_SLOT)
    if slot != 0:
        return atomic_add_u64(slot + SLOT_ALL_LAUNCHES, 1), True
    return np.uint64(0), False


@njit
def launch_device(ctx):
    """The device a launch runs on. A process that sees one CUDA device launches on device 0, so it
    skips cuCtxGetDevice, the dearest call of the limited path; the count is asked once."""
    n = load_u32(ctx + OFF_NDEV)
    if n == 0:
        out = stack_u64()
        fn = load_u64(ctx + OFF_REAL + E_DEVICE_COUNT * 8)
        if fn != 0 and call_i32(fn, (out,)) == CUDA_SUCCESS:
            n = np.uint32(load_i32(out) + 1)
            store_u32(ctx + OFF_NDEV, n)
    if n == 2:
        return np.int64(0)
    return np.int64(current_device(ctx))


@njit(inline="always")
def shape_key(f, gx, gy, gz, bx, by, bz):
    """A kernel: its function and launch shape, hashed into one nonzero word."""
    h = np.uint64(f)
    for v in (gx, gy, gz, bx, by, bz):
        h = (h ^ np.uint64(v)) * np.uint64(0x100000001B3)
    return h | np.uint64(1)


# --- the cost model ---------------------------------------------------------------------

@njit
def cost_slot(ctx, key):
    """Index of key's slot in the cost table (claimed if new), or -1 when its probe run is full."""
    h = (key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(52)
    for p in range(16):
        i = (h + np.uint64(p)) & np.uint64(L.COST_SLOTS - 1)
        addr = ctx + OFF_COST_KEY + i * 8
        k = load_u64(addr)
        if k == key:
            return np.int64(i)
        if k == 0:
            old = atomic_cas_u64(addr, 0, key)
            if old == 0 or old == key:
                return np.int64(i)
    return np.int64(-1)


@njit(inline="always")
def cost_of(ctx, slot):
    c = load_u64(ctx + OFF_COST_NS + slot * 8) if slot >= 0 else np.uint64(0)
    return c if c != 0 else load_u64(ctx + OFF_DEFAULT_COST)


@njit
def learn(ctx, key, ns):
    """Fold one timed launch into its kernel's estimate: a minimum that decays upward.

    Another context's time slice can only lengthen a timed launch (on a shared
    GPU it may run in the middle of ours), never shorten it. So the estimate
    is the lowest recent timing: a sample below it replaces it, and it grows
    by 1/64 per sample otherwise, which follows a kernel that really got
    slower within a few dozen samples and forgets one lucky reading.
    """
    slot = cost_slot(ctx, key)
    if slot >= 0:
        addr = ctx + OFF_COST_NS + slot * 8
        est = load_u64(addr)
        up = est + est // np.uint64(64) + np.uint64(1)
        store_u64(addr, ns if est == 0 or ns < up else up)
    d = np.int64(load_u64(ctx + OFF_DEFAULT_COST))
    store_u64(ctx + OFF_DEFAULT_COST, np.uint64(ns if d == 0 else d + (np.int64(ns) - d) // 16))


# --- timing sampled launches with events ------------------------------------------------

@njit(inline="always")
def sample_addr(off, i):
    return off + i * 8


@njit
def sample_begin(ctx, key, stream):
    """Record a start event before a launch; returns the sample index, or -1 (no sample taken)."""
    i = -1
    for j in range(L.SAMPLES):
        if atomic_cas_u32(ctx + OFF_S_STATE + j * 4, 0, 1) == 0:
            i = j
            break
    if i < 0:
        return -1
    cur = running_context(ctx, stream)
    ok = cur != 0
    if ok and load_u64(ctx + sample_addr(OFF_S_CTX, i)) != cur:
        destroy = helper(ctx, H_EVENT_DESTROY)
        for off in (OFF_S_START, OFF_S_END):
            old = load_u64(ctx + sample_addr(off, i))
            if old != 0:
                call_i32(destroy, (old,))
                store_u64(ctx + sample_addr(off, i), 0)
        store_u64(ctx + sample_addr(OFF_S_CTX, i), 0)
        create = helper(ctx, H_EVENT_CREATE)
        ev = stack_u64()
        ok = call_i32(create, (ev, np.uint32(0))) == CUDA_SUCCESS
        if ok:
            store_u64(ctx + sample_addr(OFF_S_START, i), load_u64(ev))
            ok = call_i32(create, (ev, np.uint32(0))) == CUDA_SUCCESS
        if ok:
            store_u64(ctx + sample_addr(OFF_S_END, i), load_u64(ev))
            store_u64(ctx + sample_addr(OFF_S_CTX, i), cur)
    ok = ok and call_i32(helper(ctx, H_EVENT_RECORD),
                         (load_u64(ctx + sample_addr(OFF_S_START, i)), stream)) == CUDA_SUCCESS
    if not ok:
        atomic_store_u32(ctx + OFF_S_STATE + i * 4, 0)
        return -1
    store_u64(ctx + sample_addr(OFF_S_KEY, i), key)
    return i


@njit
def sample_end(ctx, i, stream, rc):
    """After the launch: record the end event and leave the sample in flight."""
    if rc == CUDA_SUCCESS and call_i32(helper(ctx, H_EVENT_RECORD),
                                       (load_u64(ctx + sample_addr(OFF_S_END, i)), stream)) == CUDA_SUCCESS:
        atomic_add_u32(ctx + OFF_PENDING, 1)
        atomic_store_u32(ctx + OFF_S_STATE + i * 4, 2)
    else:
        atomic_store_u32(ctx + OFF_S_STATE + i * 4, 0)


@njit
def harvest(ctx):
    """Fold finished timings into the cost model; never waits for the GPU."""
    query = helper(ctx, H_EVENT_QUERY)
    elapsed = helper(ctx, H_EVENT_ELAPSED)
    ms = stack_u64()
    for i in range(L.SAMPLES):
        st = ctx + OFF_S_STATE + i * 4
        if atomic_load_u32(st) != 2 or atomic_cas_u32(st, 2, 1) != 2:
            continue
        end = load_u64(ctx + sample_addr(OFF_S_END, i))
        q = call_i32(query, (end,))
        if q == CUDA_ERROR_NOT_READY:
            atomic_store_u32(st, 2)
            continue
        if q == CUDA_SUCCESS and call_i32(elapsed, (ms, load_u64(ctx + sample_addr(OFF_S_START, i)),
                                                   end)) == CUDA_SUCCESS:
            ns = np.float64(load_f32(ms)) * 1e6
            if ns >= 1:
                learn(ctx, load_u64(ctx + sample_addr(OFF_S_KEY, i)), np.uint64(ns))
        atomic_add_u32(ctx + OFF_PENDING, np.uint32(0xFFFFFFFF))  # -1
        atomic_store_u32(st, 0)


# --- the limiter ------------------------------------------------------------------------

@njit
def nvml_handle(ctx, dev):
    """NVML's handle for CUDA device dev (by PCI bus id, so right under CUDA_VISIBLE_DEVICES), cached."""
    addr = ctx + OFF_NVML + dev * 8
    h = load_u64(addr)
    if h != 0:
        return h
    h = _NO_HANDLE
    if device_used(ctx, dev) >= 0:  # initialises NVML once per process
        bus = stack_buffer(64)
        out = stack_u64()
        if (call_i32(helper(ctx, H_PCI_BUS_ID), (bus, np.int32(63), np.int32(dev))) == CUDA_SUCCESS
                and call_i32(helper(ctx, H_NVML_BY_BUS_ID), (bus, out)) == NVML_SUCCESS and load_u64(out) > 1):
            h = load_u64(out)
    store_u64(addr, h)
    return h


@njit
def throttle(ctx, region, dev, cost, limit, now):
    """Charge cost (ns of GPU time) to the group's budget on dev. Returns how long the launch must wait for
    the budget (ns, <= 0: it may go now)."""
    d = Q.device_addr(region, dev)
    scale = load_u64(d + DEV_SCALE)
    if scale == 0:
        scale = np.uint64(Q16)
    charge = np.int64(cost * scale // np.uint64(Q16) * np.uint64(100) // np.uint64(limit))
    while True:
        old = np.int64(atomic_load_u64(d + DEV_TAT))
        base = old if old > now else now
        if np.int64(atomic_cas_u64(d + DEV_TAT, np.uint64(old), np.uint64(base + charge))) == old:
            break
    slot = load_u64(ctx + OFF_SLOT)
    if slot != 0:
        atomic_add_u64(slot + SLOT_LAUNCHES + dev * 8, 1)
        atomic_add_u64(slot + SLOT_COST + dev * 8, cost)
    return old - BURST_NS - np.int64(load_u64(ctx + OFF_BATCH)) - now


@njit
def hold(ctx, region, dev, wait, stream, turns):
    """Wait for the budget: hand the device's turn over first if ``turns`` (turn.give may wait for this
    process's work to finish, which counts towards the wait). Returns the time after it."""
    start = monotonic_ns()
    if turns and turn.takes_turns(ctx, dev):
        turn.give(ctx, dev, stream)
    else:
        # Time-slicing the GPU: sleeping sm_batch_ns past the point where this launch may go lets the
        # launches after it pass at once, that much budget together, so the GPU switches contexts once
        # per batch instead of once per kernel (the tolerance holds a batch, so no budget is lost; the
        # schedule in sm_tat is absolute, so the rate does not change). Taking turns, the turn batches.
        wait += np.int64(load_u64(ctx + OFF_BATCH))
    now = monotonic_ns()
    if start + wait > now:
        sleep_ns(start + wait - now)
        now = monotonic_ns()
    atomic_add_u64(Q.device_addr(region, dev) + DEV_THROTTLE, np.uint64(now - start))
    return now


@njit
def launch(ctx, idx, args, notfound, key, stream):
    """Every launch path ends here: count, limit, time a sample, launch."""
    region = load_u64(ctx + OFF_REGION)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    n, counted = count_launch(ctx)
    if not limited(ctx, region):
        return call_real(ctx, idx, args, notfound)
    if not counted:  # sampling needs a count: the process's own, only on this (limited) path
        n = atomic_add_u64(ctx + OFF_LAUNCHES, 1)
    dev = launch_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    limit = load_u32(Q.device_addr(region, dev) + DEV_LIMIT)
    if limit == 0 or limit >= 100:
        return call_real(ctx, idx, args, notfound)
    if load_u64(ctx + OFF_NVML + dev * 8) == 0:
        nvml_handle(ctx, dev)  # for the controller, which must not call the CUDA driver itself
    if atomic_load_u32(ctx + OFF_PENDING) != 0 and (n & np.uint64(HARVEST_EVERY - 1)) == 0:
        harvest(ctx)
    slot = cost_slot(ctx, key)
    cost = cost_of(ctx, slot)
    now = monotonic_ns()
    wait = throttle(ctx, region, dev, cost, limit, now)
    if wait > 0:
        now = hold(ctx, region, dev, wait, stream, True)
    turn.take(ctx, dev, stream, now, cost)
    s = -1
    if (n & np.uint64(SAMPLE_EVERY - 1)) == 0 or (slot >= 0 and load_u64(ctx + OFF_COST_NS + slot * 8) == 0):
        s = sample_begin(ctx, key, stream)
    rc = call_real(ctx, idx, args, notfound)
    if s >= 0:
        sample_end(ctx, s, stream, rc)
    return rc


@njit(inline="always")
def event_stream(stream, per_thread):
    """The stream a per-thread-default-stream variant means by 0, as any API accepts it."""
    return np.uint64(CU_STREAM_PER_THREAD) if per_thread and stream == 0 else stream


# --- the hooks' policies ----------------------------------------------------------------

@njit
def launch_kernel(ctx, idx, args, notfound):
    f, gx, gy, gz, bx, by, bz, shm, stream, params, extra = args
    return launch(ctx, idx, args, notfound, shape_key(f, gx, gy, gz, bx, by, bz), event_stream(stream, False))


@njit
def launch_kernel_ptsz(ctx, idx, args, notfound):
    f, gx, gy, gz, bx, by, bz, shm, stream, params, extra = args
    return launch(ctx, idx, args, notfound, shape_key(f, gx, gy, gz, bx, by, bz), event_stream(stream, True))


@njit
def launch_cooperative(ctx, idx, args, notfound):
    f, gx, gy, gz, bx, by, bz, shm, stream, params = args
    return launch(ctx, idx, args, notfound, shape_key(f, gx, gy, gz, bx, by, bz), event_stream(stream, False))


@njit
def launch_cooperative_ptsz(ctx, idx, args, notfound):
    f, gx, gy, gz, bx, by, bz, shm, stream, params = args
    return launch(ctx, idx, args, notfound, shape_key(f, gx, gy, gz, bx, by, bz), event_stream(stream, True))


# CUlaunchConfig (cuda.h): gridDimX..blockDimZ, sharedMemBytes (7 x u32), then hStream at 32.
CFG_STREAM = 32


@njit
def config_key(config, f):
    return shape_key(f, load_u32(config), load_u32(config + 4), load_u32(config + 8), load_u32(config + 12),
                     load_u32(config + 16), load_u32(config + 20))


@njit
def launch_kernel_ex(ctx, idx, args, notfound):
    config, f, params, extra = args
    if config == 0:
        return call_real(ctx, idx, args, notfound)
    return launch(ctx, idx, args, notfound, config_key(config, f), event_stream(load_u64(config + CFG_STREAM), False))


@njit
def launch_kernel_ex_ptsz(ctx, idx, args, notfound):
    config, f, params, extra = args
    if config == 0:
        return call_real(ctx, idx, args, notfound)
    return launch(ctx, idx, args, notfound, config_key(config, f), event_stream(load_u64(config + CFG_STREAM), True))


# CUDA_LAUNCH_PARAMS (cuda.h): function, gridDimX..blockDimZ, sharedMemBytes, hStream at 40, kernelParams.
LP_SIZE, LP_STREAM = 56, 40


@njit
def launch_multi_device(ctx, idx, args, notfound):
    """One kernel on several devices at once: charged to the calling thread's device, by the first entry's
    kernel (the launches run in lockstep); not timed, its streams belong to several contexts."""
    plist, ndev, flags = args
    region = load_u64(ctx + OFF_REGION)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    count_launch(ctx)
    if not limited(ctx, region) or plist == 0 or ndev == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    limit = load_u32(Q.device_addr(region, dev) + DEV_LIMIT)
    if 0 < limit < 100:
        key = shape_key(load_u64(plist), load_u32(plist + 8), load_u32(plist + 12), load_u32(plist + 16),
                        load_u32(plist + 20), load_u32(plist + 24), load_u32(plist + 28))
        wait = throttle(ctx, region, dev, cost_of(ctx, cost_slot(ctx, key)), limit, monotonic_ns())
        if wait > 0:
            hold(ctx, region, dev, wait, np.uint64(0), False)  # streams of several devices: no turns
    return call_real(ctx, idx, args, notfound)


@njit
def graph_launch(ctx, idx, args, notfound):
    exec_, stream = args
    return launch(ctx, idx, args, notfound, exec_ | np.uint64(1), event_stream(stream, False))


@njit
def graph_launch_ptsz(ctx, idx, args, notfound):
    exec_, stream = args
    return launch(ctx, idx, args, notfound, exec_ | np.uint64(1), event_stream(stream, True))


# --- the controller (watcher thread) ----------------------------------------------------

@njit
def group_alone(ctx, region, handle, dev):
    """True if NVML sees no compute process on the device beyond the group's own."""
    count = stack_u64()
    rc = call_i32(helper(ctx, H_NVML_PROCESSES), (handle, count, np.uint64(0)))
    if rc != NVML_SUCCESS and rc != NVML_ERROR_INSUFFICIENT_SIZE:
        return False
    seen = load_u32(count)
    ours = 0
    live = 0
    n = load_u32(ctx + Q.OFF_NSLOTS)
    for i in range(n):
        s = Q.slot_addr(region, i)
        if atomic_load_u32(s + SLOT_STATE) != L.SLOT_LIVE:
            continue
        live += 1
        if atomic_load_u64(s + SLOT_USED + (dev * L.N_KINDS + L.KIND_CONTEXT) * 8) != 0:
            ours += 1
    return seen <= (ours if ours > 0 else live)


@njit
def group_cost(ctx, region, dev):
    """GPU time (ns, unscaled) the group's live processes were charged on dev so far."""
    total = np.uint64(0)
    for i in range(load_u32(ctx + Q.OFF_NSLOTS)):
        s = Q.slot_addr(region, i)
        if atomic_load_u32(s + SLOT_STATE) == L.SLOT_LIVE:
            total += atomic_load_u64(s + SLOT_COST + dev * 8)
    return total


@njit
def step(ctx, region, dev, handle, limit, period):
    """One controller step for the group on dev (this process holds the lease)."""
    d = Q.device_addr(region, dev)
    util = stack_buffer(8)
    if call_i32(helper(ctx, H_NVML_UTILIZATION), (handle, util)) != NVML_SUCCESS:
        atomic_store_u32(d + DEV_STATE, STATE_NO_MEASUREMENT)
        return
    u = load_u32(util)
    atomic_store_u32(d + DEV_UTIL, u * 100)
    thr = atomic_load_u64(d + DEV_THROTTLE)
    throttled = thr != atomic_xchg_ctl(d, thr)
    scale = np.float64(atomic_load_u64(d + DEV_SCALE))
    if scale == 0:
        scale = np.float64(Q16)
    alone = group_alone(ctx, region, handle, dev)
    # The group's own utilization (what NVML shows the group, pyvgpu/jit/devices.py): the
    # device's reading while alone; else the GPU time it was charged, at most that reading.
    cost = group_cost(ctx, region, dev)
    mark = atomic_load_u64(d + DEV_COST_MARK)
    atomic_store_u64(d + DEV_COST_MARK, cost)
    mine = np.float64(u) * 100.0
    if not alone:
        spent = np.float64(cost - mark) if cost >= mark else 0.0  # a reclaimed slot takes its count along
        mine = min(mine, spent * scale / Q16 / max(np.float64(period), 1.0) * 1e4)
    atomic_store_u32(d + DEV_GROUP_UTIL, np.uint32(mine))
    atomic_add_u64(d + DEV_STEPS, 1)
    if not alone:
        atomic_store_u32(d + DEV_STATE, STATE_HOLDING)
        return
    atomic_store_u32(d + DEV_STATE, STATE_CALIBRATING)
    if u == limit or (u < limit and not throttled):
        return
    ratio = max(0.5, min(2.0, max(np.float64(u), 0.5) / np.float64(limit)))
    new = scale * math.sqrt(ratio)
    new = max(np.float64(SCALE_MIN), min(np.float64(SCALE_MAX), new))
    atomic_store_u64(d + DEV_SCALE, np.uint64(new))


@njit(inline="always")
def atomic_xchg_ctl(d, thr):
    old = atomic_load_u64(d + DEV_CTL_THROTTLE)
    atomic_store_u64(d + DEV_CTL_THROTTLE, thr)
    return old


@njit
def control(ctx):
    """The watcher's compute work: a controller step for each limited device this process launches on."""
    region = load_u64(ctx + OFF_REGION)
    if region == 0 or load_u32(region + HDR_ANY) == 0:
        return
    now = np.uint64(monotonic_ns())
    for dev in range(L.MAX_DEVICES):
        d = Q.device_addr(region, dev)
        limit = load_u32(d + DEV_LIMIT)
        h = load_u64(ctx + OFF_NVML + dev * 8)
        if limit == 0 or limit >= 100 or h <= _NO_HANDLE:
            continue
        last = atomic_load_u64(d + DEV_CTL)
        if now - last < np.uint64(CONTROL_PERIOD_NS) and last <= now:
            continue
        if atomic_cas_u64(d + DEV_CTL, last, now) != last:
            continue  # another process of the group took this step
        if last == 0:
            continue  # the first period: NVML's window still holds the time before the program ran
        step(ctx, region, dev, h, limit, now - last)
