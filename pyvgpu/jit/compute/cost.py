"""The cost model of the compute share: what GPU time a launch takes.

A launch costs the GPU time its kernel takes, in ns. Every kernel (function
and launch shape; a whole CUDA graph for cuGraphLaunch) has its own estimate
in the process's context, learned by timing sampled launches between two
CUDA events: the first launch of each kernel, then one launch in
SAMPLE_EVERY (pyvgpu/jit/compute/launch.py decides which). The estimate is a
decaying minimum of the timings (``learn``). Timings are harvested later on
the launching thread, never blocking, so a 200-block and a 2-block grid of
the same function are told apart, and a long kernel costs what it takes
rather than its grid size.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.compute.streams import running_context
from pyvgpu.jit.runtime.context import HELPER
from pyvgpu.jit.runtime.fields import CTX
from pyvgpu.jit.runtime.intrinsics import likely, load_f32, load_u64, monotonic_ns, sleep_ns, stack_u64

SAMPLE_FREE, SAMPLE_RECORDING, SAMPLE_IN_FLIGHT = 0, 1, 2
PROBES = 16  # cost slots a key may sit away from its home
WAIT_MAX_NS = 1_000_000_000  # the longest a launch waits for its own timed kernel (``wait_for``)


@njit(inline="always")
def shape_key(f, gx, gy, gz, bx, by, bz):
    """A kernel: its function and launch shape, hashed into one nonzero word."""
    h = np.uint64(f)
    for v in (gx, gy, gz, bx, by, bz):
        h = (h ^ np.uint64(v)) * np.uint64(0x100000001B3)
    return h | np.uint64(1)


@njit
def cost_slot(ctx, key):
    """Index of key's slot in the cost table (claimed if new), or -1 when its probe run is full."""
    h = (key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(52)
    for p in range(PROBES):
        i = (h + np.uint64(p)) & np.uint64(L.COST_SLOTS - 1)
        k = CTX.get_cost_key(ctx, i)
        if likely(k == key):
            return np.int64(i)
        if k == 0:
            old = CTX.cas_cost_key(ctx, i, 0, key)
            if old == 0 or old == key:
                return np.int64(i)
    return np.int64(-1)


@njit(inline="always")
def cost_of(ctx, slot):
    """The estimated GPU time (ns) of the kernel in cost slot ``slot``; the process's mean for a new one."""
    c = CTX.get_cost_ns(ctx, slot) if slot >= 0 else np.uint64(0)
    return c if c != 0 else CTX.get_sm_default_cost(ctx)


@njit(inline="always")
def new_kernel(ctx, slot):
    """True if the kernel in cost slot ``slot`` has no estimate of its own yet (its launch is timed)."""
    return slot >= 0 and CTX.get_cost_ns(ctx, slot) == 0


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
        est = CTX.get_cost_ns(ctx, slot)
        up = est + est // np.uint64(64) + np.uint64(1)
        CTX.set_cost_ns(ctx, slot, ns if est == 0 or ns < up else up)
    d = np.int64(CTX.get_sm_default_cost(ctx))
    CTX.set_sm_default_cost(ctx, np.uint64(ns if d == 0 else d + (np.int64(ns) - d) // 16))


# --- timing sampled launches with events ------------------------------------------------

@njit
def fresh_events(ctx, i, cur):
    """Give sample i a start and an end event of context cur (events belong to a context); False if the
    driver refuses."""
    for old in (CTX.get_samp_start(ctx, i), CTX.get_samp_end(ctx, i)):
        if old != 0:
            HELPER.cuEventDestroy_v2(ctx, old)
    CTX.set_samp_start(ctx, i, 0)
    CTX.set_samp_end(ctx, i, 0)
    CTX.set_samp_ctx(ctx, i, 0)
    ev = stack_u64()
    if HELPER.cuEventCreate(ctx, ev, 0) != abi.CUDA_SUCCESS:
        return False
    CTX.set_samp_start(ctx, i, load_u64(ev))
    if HELPER.cuEventCreate(ctx, ev, 0) != abi.CUDA_SUCCESS:
        return False
    CTX.set_samp_end(ctx, i, load_u64(ev))
    CTX.set_samp_ctx(ctx, i, cur)
    return True


@njit
def sample_begin(ctx, key, stream):
    """Record a start event before a launch; returns the sample index, or -1 (no sample taken)."""
    i = -1
    for j in range(L.SAMPLES):
        if CTX.cas_samp_state(ctx, j, SAMPLE_FREE, SAMPLE_RECORDING) == SAMPLE_FREE:
            i = j
            break
    if i < 0:
        return -1
    cur = running_context(ctx, stream)
    ok = cur != 0
    if ok and CTX.get_samp_ctx(ctx, i) != cur:
        ok = fresh_events(ctx, i, cur)
    ok = ok and HELPER.cuEventRecord(ctx, CTX.get_samp_start(ctx, i), stream) == abi.CUDA_SUCCESS
    if not ok:
        CTX.store_samp_state(ctx, i, SAMPLE_FREE)
        return -1
    CTX.set_samp_key(ctx, i, key)
    return i


@njit
def sample_end(ctx, i, stream, rc):
    """After the launch: record the end event and leave the sample in flight."""
    if rc == abi.CUDA_SUCCESS and HELPER.cuEventRecord(ctx, CTX.get_samp_end(ctx, i), stream) == abi.CUDA_SUCCESS:
        CTX.add_sm_pending(ctx, 1)
        CTX.store_samp_state(ctx, i, SAMPLE_IN_FLIGHT)
    else:
        CTX.store_samp_state(ctx, i, SAMPLE_FREE)


@njit
def wait_for(ctx, i):
    """Wait until sample i's launch has run, then fold it in (with any other finished timing); WAIT_MAX_NS at
    most. A collective's kernel waits inside the GPU for its peers, and a peer held for its budget or the
    turn comes seconds later: past the bound the sample is given up (its timing would charge that wait to
    every later launch), and the launch goes on without it."""
    if CTX.load_samp_state(ctx, i) != SAMPLE_IN_FLIGHT:
        return
    end = CTX.get_samp_end(ctx, i)
    until = monotonic_ns() + WAIT_MAX_NS
    while HELPER.cuEventQuery(ctx, end) == abi.CUDA_ERROR_NOT_READY:
        if monotonic_ns() > until:
            give_up(ctx, i)
            return
        sleep_ns(20_000)
    harvest(ctx)


@njit
def give_up(ctx, i):
    """Drop sample i, still in flight, unread (unless harvest took it meanwhile)."""
    if CTX.cas_samp_state(ctx, i, SAMPLE_IN_FLIGHT, SAMPLE_RECORDING) == SAMPLE_IN_FLIGHT:
        CTX.add_sm_pending(ctx, np.uint32(0xFFFFFFFF))  # -1
        CTX.store_samp_state(ctx, i, SAMPLE_FREE)


@njit
def harvest(ctx):
    """Fold finished timings into the cost model; never waits for the GPU."""
    ms = stack_u64()
    for i in range(L.SAMPLES):
        if (CTX.load_samp_state(ctx, i) != SAMPLE_IN_FLIGHT
                or CTX.cas_samp_state(ctx, i, SAMPLE_IN_FLIGHT, SAMPLE_RECORDING) != SAMPLE_IN_FLIGHT):
            continue
        end = CTX.get_samp_end(ctx, i)
        q = HELPER.cuEventQuery(ctx, end)
        if q == abi.CUDA_ERROR_NOT_READY:
            CTX.store_samp_state(ctx, i, SAMPLE_IN_FLIGHT)
            continue
        if (q == abi.CUDA_SUCCESS
                and HELPER.cuEventElapsedTime(ctx, ms, CTX.get_samp_start(ctx, i), end) == abi.CUDA_SUCCESS):
            ns = np.float64(load_f32(ms)) * 1e6
            if ns >= 1:
                learn(ctx, CTX.get_samp_key(ctx, i), np.uint64(ns))
        CTX.add_sm_pending(ctx, np.uint32(0xFFFFFFFF))  # -1
        CTX.store_samp_state(ctx, i, SAMPLE_FREE)
