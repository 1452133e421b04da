"""What happens on every kernel launch: count it, and under a compute share, charge and pace it.

Every launch path (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
cuGraphLaunch, their per-thread-stream variants, and the multi-device
cooperative launch) ends in :func:`launch`:

1. count the launch in the process's slot (``pyvgpu top``'s launches/s), once:
   a launch charged to the group's accounting on its device is counted there
   (``sm_launches``), any other in the slot's ``launches``;
2. if the group has a share in force on the launch's device: look up the
   kernel's cost (pyvgpu/jit/compute/cost.py), charge it to the group's budget
   (pyvgpu/jit/compute/limiter.py) and wait while the budget is spent; a group that
   may borrow (--sm-borrow) goes on instead, best effort, while nobody with a
   share waits for the GPU;
3. take the device's turn (pyvgpu/jit/compute/turn.py), so the GPU never holds two
   groups' deep queues at once. A launch without a share takes part too
   while a group with a share takes turns on the machine, best effort;
4. time one launch in SAMPLE_EVERY, at most one per SAMPLE_GAP_NS (and every new kernel's first) with
   events behind a gate (cost.py), and a launch held for the budget once the last timing is
   STALE_SAMPLE_NS old; under turns the process's very first timed launch is waited for, so that its
   later launches have a cost;
5. call the driver.

With no limit in force, and no group with a share taking turns on the
machine, a launch costs a few loads and one atomic add before the driver is
called: no clock read, no lock, no syscall. Under a share its clock is the TSC
(pyvgpu/jit/runtime/clock.py), where the kernel's own clock runs on it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.jit.compute import cost, gang, gangstop, gpuentry, limiter, turn
from pyvgpu.jit.devices.nvml import handle as nvml_handle
from pyvgpu.jit.runtime import clock
from pyvgpu.jit.runtime.context import call_real, current_device, launch_device, stream_of
from pyvgpu.jit.runtime.fields import CTX, DEV, HDR, LAUNCH_CONFIG, LAUNCH_PARAMS, REGION, SLOT
from pyvgpu.jit.runtime.intrinsics import monotonic_ns, unlikely

SAMPLE_SHIFT = 8
SAMPLE_EVERY = 1 << SAMPLE_SHIFT  # time one launch in this many (``sampled``), and a new kernel's first
SAMPLE_GAP_NS = 4_000_000  # and at most one each this long: a timing costs ~5 driver calls (docs/compute.md,
#                           "What a launch under a share costs"), too many at hundreds of thousands of launches a second
STALE_SAMPLE_NS = 100_000_000  # a launch held for the budget is timed once the last timing is this old: a first
#                                timing that caught a peer's wait would else be charged for minutes (see launch)
HARVEST_EVERY = 64  # look for finished timings every this many launches (a power of two)
OUTSIDE = np.uint64(0xFFFFFFFFFFFFFFFF)  # turn_out when a launch went outside the turns on an unknown device


@njit(inline="always")
def sampled(n):
    """Whether the launch counted n is one of the SAMPLE_EVERY timed: a hash of n, not n's low bits. A loop
    whose step makes a multiple of SAMPLE_EVERY's divisors in launches met the low bits at the same few places
    of its step for good: the kernels elsewhere were never timed again, and a first timing that read long was
    their estimate for the process's life (the decaying minimum needs the kernel timed again)."""
    return (np.uint64(n) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - SAMPLE_SHIFT) == 0


@njit(inline="always")
def count_launch(ctx):
    """Count a launch that no device's accounting counts (``limiter.charge_slot``) in the process's slot."""
    slot = CTX.get_slot(ctx)
    if slot != 0:
        SLOT.add_launches(slot, 1)


@njit(inline="always")
def gate(ctx):
    """A launch's first step, loads only (no clock, lock or syscall): (region, limited), region 0 when the
    launch goes straight to the driver (counted here). Each policy calls it before it works out the
    kernel's key and stream, which only the rest of the launch needs."""
    region = CTX.get_region(ctx)
    if region == 0:
        return region, False
    limited = limiter.limited(ctx, region)
    if not limited and not turn.machine_active(ctx):
        count_launch(ctx)
        if CTX.get_turn_out(ctx) != OUTSIDE:  # which device is not known here: all of them (turn.join); a
            CTX.set_turn_out(ctx, OUTSIDE)  # store only once, so that launching threads share the line
        return np.uint64(0), limited
    return region, limited


@njit
def launch(ctx, idx, args, notfound, fn, key, stream, region, limited):
    """Every launch path ends here, after ``gate``: limit, take the turn, time a sample, launch. ``fn`` is
    the function (a graph: its exec handle | 1), ``key`` the kernel: the function and its launch shape."""
    now = clock.now(ctx)  # the TSC, anchored to CLOCK_MONOTONIC about once a millisecond (clock.py)
    dev = launch_device(ctx, now)
    if unlikely(dev < 0):
        count_launch(ctx)
        return call_real(ctx, idx, args, notfound)
    limit = limiter.share(region, dev) if limited else np.uint32(0)
    unshared = HDR.get_sm_any(region) == 0  # on sm_gang's line
    # a gang under a share, or a gang without one anywhere (gang.py); a group with shares elsewhere only
    g = gang.checked(HDR.get_sm_gang(region)) if limit != 0 or unshared else np.uint32(0)
    tdev = gang.lead(g, dev)  # whose budget and turn: dev's, or the gang's lead device's
    e = turn.entry(ctx, tdev)  # the device's turn entry (a load, once known): looked up here only
    if limit == 0 and g != 0 and tdev != dev and not turn.active_on(e, now):
        g = np.uint32(0)  # a gang without a share, whose lead device takes no turns: its own device's
        tdev = dev
        e = turn.entry(ctx, dev)
    gang.join(ctx, region, g)
    if limit == 0 and not turn.active_on(e, now):  # no group with a share takes turns here
        slot = CTX.get_slot(ctx)
        if unshared and slot != 0 and SLOT.load_sm_launches(slot, dev) == 0:
            SLOT.add_sm_launches(slot, dev, 1)  # counted on dev, once: where it launched, for its gang (gang.update)
        else:
            count_launch(ctx)
        CTX.set_turn_out(ctx, CTX.get_turn_out(ctx) | (np.uint64(1) << np.uint64(dev)))
        return call_real(ctx, idx, args, notfound)
    if unlikely(limit != 0 and CTX.get_sm_nvml(ctx, dev) == 0):
        nvml_handle(ctx, dev)  # for the controller, which must not call the CUDA driver itself
    key ^= np.uint64(dev) << np.uint64(40)  # a kernel's cost is learned per device
    slot = cost.cost_slot(ctx, key, True)
    c = cost.charged_cost(ctx, region, dev, slot)
    # scaled as the controller corrects it, under a share (without one no controller keeps the scale, and
    # one left from a share removed is stale): what the budget is charged and what the turns' queue adds
    sc = limiter.scaled(region, dev, c) if limit != 0 else c
    stale = False
    if limit != 0 and not (limiter.may_borrow(ctx, region) and limiter.spent(ctx, region, tdev, now, g != 0)
                           and not turn.share_waits(ctx, e, now)):
        rank = limiter.rank(region, True)
        wait, n = limiter.throttle(ctx, region, dev, tdev, gang.size(g), c, sc, limit, now)
        holds = wait > 0
        if unlikely(g != 0):
            wait, holds = gang.common_wait(region, wait, now, limiter.batch_ns(ctx, True))
        if unlikely(holds):
            now = limiter.hold(ctx, region, tdev, wait, stream, True, rank, g)
            # An estimate that charges too much makes launches rare, and rare launches are rarely timed
            # (one in SAMPLE_EVERY): a collective's first timing that caught a wait for a late peer would
            # hold the group at a sliver of its share for minutes. A held launch is timed again once the
            # last timing is STALE_SAMPLE_NS old: only while held, at most ten a second.
            stale = now >= np.int64(CTX.get_samp_next_ns(ctx)) + STALE_SAMPLE_NS
    else:
        # best effort: no share here, or a share spent while the group may borrow idle time and nobody
        # with a share waits. No budget is charged (the group is not in debt when it stops borrowing), but
        # its GPU time counts in the group's accounting.
        rank = limiter.rank(region, False)
        n = limiter.charge_slot(ctx, dev, c)
        if limit != 0:
            DEV.add_sm_borrow_ns(REGION.device(region, dev), c)
    # the count first: sm_pending is on a line of its own, which 63 launches in 64 leave unread
    if unlikely(((n & np.uint64(HARVEST_EVERY - 1)) == 0 or stale) and CTX.load_sm_pending(ctx) != 0):
        cost.harvest(ctx)  # this launch keeps the estimate it was charged; the next ones get the new ones
    # the queue it adds, scaled as its charge is: raw, a launch-bound group's small kernels read as a deep
    # queue, and two of them took whole turns where they could have gone beside each other (turn.py)
    cu = turn.take(ctx, region, tdev, e, stream, now, gang.queue_cost(g, sc), rank, limit != 0, g)
    s = -1
    first = cost.new_kernel(ctx, slot)
    if unlikely(first or stale or (sampled(n) and now >= np.int64(CTX.get_samp_next_ns(ctx)))):
        if limit != 0:  # here, not on every launch: a timed launch comes first, and then one in SAMPLE_EVERY
            gpuentry.account(ctx, dev)  # for the controller too: where every group's charges on dev add up
        s = cost.sample_begin(ctx, region, dev, key, stream, slot >= 0, fn)
        if s >= 0:
            CTX.set_samp_next_ns(ctx, np.uint64(now + SAMPLE_GAP_NS))
    rc = call_real(ctx, idx, args, notfound)
    if unlikely(s >= 0):
        cur = CTX.get_samp_ctx(ctx, s)  # the sample's context, read while the sample is still this thread's
        cost.sample_end(ctx, s, stream, rc)  # first: it opens the stream's gate (cost.py)
        if rc == abi.CUDA_SUCCESS:
            cost.func_slot(ctx, fn ^ cur, True)  # launched: its module is loaded in that context
    if unlikely(cu):
        gangstop.settle(ctx, region, tdev, stream, e)  # a gang's rank caught up with a peer (gangstop.py)
    if unlikely(s >= 0) and CTX.get_sm_default_cost(ctx) == 0 and turn.takes_turns(ctx, tdev):
        # the process's first timing: until it has one, every launch would join the turns' queue
        # estimate at cost 0 (turn.py)
        cost.wait_for(ctx, s)
    return rc


# --- the hooks' policies: one per launch path, both stream flavours (context.stream_of) -------

@njit
def kernel(ctx, idx, args, notfound):
    region, limited = gate(ctx)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    f, gx, gy, gz, bx, by, bz, shm, stream, params, extra = args
    return launch(ctx, idx, args, notfound, f, cost.shape_key(f, gx, gy, gz, bx, by, bz), stream_of(idx, stream),
                  region, limited)


@njit
def cooperative(ctx, idx, args, notfound):
    region, limited = gate(ctx)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    f, gx, gy, gz, bx, by, bz, shm, stream, params = args
    return launch(ctx, idx, args, notfound, f, cost.shape_key(f, gx, gy, gz, bx, by, bz), stream_of(idx, stream),
                  region, limited)


@njit
def kernel_ex(ctx, idx, args, notfound):
    config, f, params, extra = args
    if config == 0:
        return call_real(ctx, idx, args, notfound)
    region, limited = gate(ctx)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    C = LAUNCH_CONFIG
    key = cost.shape_key(f, C.get_gridDimX(config), C.get_gridDimY(config), C.get_gridDimZ(config),
                         C.get_blockDimX(config), C.get_blockDimY(config), C.get_blockDimZ(config))
    return launch(ctx, idx, args, notfound, f, key, stream_of(idx, C.get_hStream(config)), region, limited)


@njit
def graph(ctx, idx, args, notfound):
    region, limited = gate(ctx)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    exec_, stream = args
    return launch(ctx, idx, args, notfound, exec_ | np.uint64(1), exec_ | np.uint64(1), stream_of(idx, stream),
                  region, limited)


@njit
def multi_device(ctx, idx, args, notfound):
    """One kernel on several devices at once: charged to the calling thread's device, by the first entry's
    kernel (the launches run in lockstep); not timed, its streams belong to several contexts."""
    plist, ndev, flags = args
    region = CTX.get_region(ctx)
    if region == 0:
        return call_real(ctx, idx, args, notfound)
    dev = -1
    if limiter.limited(ctx, region) and plist != 0 and ndev != 0:
        dev = current_device(ctx)
    limit = limiter.share(region, dev) if dev >= 0 else np.uint32(0)
    if limit == 0:
        count_launch(ctx)
        return call_real(ctx, idx, args, notfound)
    P = LAUNCH_PARAMS
    key = cost.shape_key(P.get_function(plist), P.get_gridDimX(plist), P.get_gridDimY(plist),
                         P.get_gridDimZ(plist), P.get_blockDimX(plist), P.get_blockDimY(plist),
                         P.get_blockDimZ(plist)) ^ (np.uint64(dev) << np.uint64(40))  # per device, as launch
    c = cost.charged_cost(ctx, region, dev, cost.cost_slot(ctx, key, False))
    wait, _ = limiter.throttle(ctx, region, dev, dev, 1, c, limiter.scaled(region, dev, c), limit,
                               monotonic_ns())  # counts the launch
    if wait > 0:
        limiter.hold(ctx, region, dev, wait, np.uint64(0), False, 0, np.uint32(0))  # no turns
    return call_real(ctx, idx, args, notfound)
