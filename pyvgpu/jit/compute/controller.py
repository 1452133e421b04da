"""The compute share's controller: corrects the cost model with what NVML measures.

Runs on the shim's watcher thread (``control``, from the svc_tick service), with
no GIL and no call into the CUDA driver. Every CONTROL_PERIOD_NS one process of
the group takes the step for each limited device (a lease in the region). It
reads the device's busy time over the period from NVML's samples (busy.py) and, while the group is the only one
on the device, corrects ``sm_scale`` by sqrt(measured / charged): a damped
multiplicative step that converges geometrically without overshoot, and makes
the GPU time the group is charged the time the GPU was busy (under a saturated
budget the charge is the share, so NVML's reading comes to the share). While
others share the device, NVML cannot tell their time from ours; then the scale
only comes down, when every group with a share on the GPU together (each adds
its charge to the GPU's entry in the turn file, taking turns or not) was charged
more than NVML saw the GPU busy. A period in which the group borrowed idle time beyond its share
(--sm-borrow) holds the scale: NVML then reads above the target on purpose.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.compute import busy, gang
from pyvgpu.jit.compute.limiter import Q16
from pyvgpu.jit.devices.nvml import NO_HANDLE
from pyvgpu.jit.runtime.context import HELPER
from pyvgpu.jit.runtime.fields import CTX, DEV, HDR, REGION, SLOT, TURN
from pyvgpu.jit.runtime.intrinsics import load_u32, monotonic_ns, stack_u64
from pyvgpu.jit.state.quota import used_index

CONTROL_PERIOD_NS = 500_000_000
SCALE_MIN, SCALE_MAX = Q16 // 16, Q16 * 16
MIN_CHARGED = 2.0  # percent of a period: below it NVML's whole-percent reading says too little to calibrate on
DEAD_BAND = 1.0  # points: NVML reads whole percents, so a smaller gap is no error to correct (it would jitter)
# NVML's busy time below this part of the charge (every group's together beside others, the group's own when
# alone and not saturated) brings the scale down: timings that hold launch gaps read several times a kernel
# (docs/compute.md), while the groups' periods, which do not line up, can count one group's charge twice
OVERCHARGED = 0.4
# Beside others, over a window of four periods (device_charged), NVML's busy time below this part of every
# group's charge brings the scale down too
HOLD_WINDOW_NS = 2_000_000_000
HOLD_OVERCHARGED = 0.75
SATURATED = 0.9  # the part of its share a group must have been charged for its own reading to count either way


@njit
def group_alone(ctx, region, handle, dev):
    """True if NVML sees no compute process on the device beyond the group's own."""
    count = stack_u64()
    rc = HELPER.nvmlDeviceGetComputeRunningProcesses_v3(ctx, handle, count, 0)
    if rc != abi.NVML_SUCCESS and rc != abi.NVML_ERROR_INSUFFICIENT_SIZE:
        return False
    seen = load_u32(count)
    ours = 0
    live = 0
    for i in range(CTX.get_n_slots(ctx)):
        s = REGION.slot(region, i)
        if SLOT.load_state(s) != L.SLOT_LIVE:
            continue
        live += 1
        if SLOT.load_used(s, used_index(dev, L.KIND_CONTEXT)) != 0:
            ours += 1
    return seen <= (ours if ours > 0 else live)


@njit
def group_cost(ctx, region, dev):
    """GPU time (ns, unscaled) the group's live processes were charged on dev so far."""
    total = np.uint64(0)
    for i in range(CTX.get_n_slots(ctx)):
        s = REGION.slot(region, i)
        if SLOT.load_state(s) == L.SLOT_LIVE:
            total += SLOT.load_sm_cost_ns(s, dev)
    return total


@njit
def step(ctx, region, dev, handle, limit, now_ns, period):
    """One controller step for the group on dev (this process holds the lease)."""
    d = REGION.device(region, dev)
    u = busy.period_busy(ctx, handle, period)  # NVML's samples over the period, not one window (busy.py)
    if u == busy.NO_READING:
        DEV.store_sm_state(d, L.SM_STATE_NO_MEASUREMENT)
        return
    DEV.store_sm_util(d, np.uint32(u * 100.0 + 0.5))
    scale = np.float64(DEV.load_sm_scale(d))
    if scale == 0:
        scale = np.float64(Q16)
    alone = group_alone(ctx, region, handle, dev)
    # The budget the group spent in the period: the GPU time it was charged, scaled as the limiter
    # charged it. Its own utilization (what NVML shows the group, pyvgpu/jit/devices/visible.py) is the
    # device's reading while alone; else what it spent, at most that reading.
    cost = group_cost(ctx, region, dev)
    mark = DEV.xchg_sm_cost_mark(d, cost)
    # A reclaimed slot takes its count along; the first step has no mark, and the count holds what the group
    # was charged before its share (best effort beside others) too.
    charged = np.float64(cost - mark) if mark != 0 and cost >= mark else 0.0
    spent = charged * scale / Q16 / max(np.float64(period), 1.0)  # of the device's time
    borrow = DEV.load_sm_borrow_ns(d)
    borrow_mark = DEV.xchg_sm_borrow_mark(d, borrow)
    borrowed = borrow > borrow_mark  # NVML then shows time beyond the share, on purpose
    mine = np.float64(u) * 100.0
    if not alone:
        mine = min(mine, (spent + np.float64(borrow - borrow_mark if borrowed else 0) / max(np.float64(period), 1.0))
                   * 1e4)
    DEV.store_sm_group_util(d, np.uint32(mine))
    DEV.add_sm_steps(d, 1)
    everyone, over_window, window = device_charged(ctx, d, dev, charged * scale / Q16, now_ns, period)
    if borrowed:
        DEV.store_sm_state(d, L.SM_STATE_BORROWING)
        return
    if not alone or HDR.load_sm_gang(region) != 0:
        # beside others, or a gang: NVML's busy time then holds what the group did not do (another
        # group's kernels; a rank's kernel waiting inside the GPU for its peers, docs/compute.md)
        DEV.store_sm_state(d, L.SM_STATE_HOLDING)
        # Every group with a share here was charged well more than the GPU was busy, all of them and whoever
        # else together: the timings are inflated (another context's kernels between a timed kernel's
        # events), so the charges come down; they go back up only as far as the kernels' own timings, never
        # above (an unshared neighbour's time is in NVML's figure).
        ratio = holding_ratio(np.float64(u), everyone, scale)
        if ratio == 0.0 and window != 0 and window <= np.uint64(busy.LOOKBACK_MAX_NS):
            # (a longer window, after steps were missed, would compare charges with a shorter look at NVML)
            # less clearly over, over a window (device_charged), against NVML's busy time in the same window
            busy_window = busy.period_busy(ctx, handle, window)
            if busy_window != busy.NO_READING and over_window >= MIN_CHARGED and \
                    busy_window < over_window * HOLD_OVERCHARGED:
                ratio = busy_window / over_window
        if ratio != 0.0:
            scale_by(d, scale, ratio)
        return
    DEV.store_sm_state(d, L.SM_STATE_CALIBRATING)
    pct = spent * 100.0
    saturated = pct >= SATURATED * np.float64(limit)
    if pct >= MIN_CHARGED and abs(np.float64(u) - pct) >= DEAD_BAND and (
            u > pct or saturated or u < OVERCHARGED * pct):
        # Alone, what the group was charged should be what the GPU was busy, saturated or not: the cost
        # model times kernels between events, which also counts the host's launch gaps of a launch-bound
        # program (docs/compute.md, decode), and a kernel whose arguments make it
        # longer than its estimate is charged too little. Saturated, this is the old rule (the limiter
        # keeps the charge at the share, so NVML's reading comes to the share); not saturated, the charge
        # comes down only when it is well above NVML's reading, whose window lags a period.
        scale_by(d, scale, np.float64(u) / pct)


@njit
def device_charged(ctx, d, dev, charged_ns, now, period):
    """Add the group's charge of this period (ns, scaled) to its GPU's turn entry, where every group with a
    share adds its own, and return what all of them were charged in about this period, in percent of the
    device's time (0 without a turn entry); and, once a window (HOLD_WINDOW_NS) has passed since the last,
    what they were charged over it, and its length (else 0.0, 0).

    The groups' periods do not line up, so one period of another group's can land twice or not at all in
    one of ours: a period's figure is judged only on a clear over-charge (OVERCHARGED), and a window of four
    periods, off by a quarter of another group's charge, more closely (HOLD_OVERCHARGED): an MLP pair on an
    H100 charged twice its busy time stayed held at one group's budget under the period's rule alone."""
    e = CTX.get_acct_entry(ctx, dev)  # the device's turn entry, or without turns its entry all the same
    if e <= np.uint64(1):
        return 0.0, 0.0, np.uint64(0)
    total = TURN.add_charged_ns(e, np.uint64(charged_ns)) + np.uint64(charged_ns)
    mark = DEV.xchg_sm_dev_mark(d, total)
    one = 0.0
    if mark != 0 and total >= mark:
        one = np.float64(total - mark) * 100.0 / max(np.float64(period), 1.0)
    start = DEV.load_sm_win_ns(d)
    if start != 0 and start <= now and now - start < np.uint64(HOLD_WINDOW_NS):
        return one, 0.0, np.uint64(0)
    win_mark = DEV.xchg_sm_win_mark(d, total)
    DEV.store_sm_win_ns(d, now)
    if start == 0 or start > now or win_mark == 0 or total < win_mark:
        return one, 0.0, np.uint64(0)
    span = now - start
    return one, np.float64(total - win_mark) * 100.0 / max(np.float64(span), 1.0), span


@njit
def holding_ratio(u, everyone, scale):
    """Beside others or in a gang: the step for the scale (measured / charged), 0.0 for none. Charged well
    more than NVML saw busy (everyone: all the GPU's groups with a share, in percent), the charges come
    down; no longer so, a scale that came down earlier (a launch-bound phase, NCCL's start-up) goes back
    towards the kernels' own timings, never above them: otherwise a later compute-bound phase would be
    charged a fraction of its time for good and run at many times its share."""
    if everyone < MIN_CHARGED:
        return 0.0
    if u < everyone * OVERCHARGED:
        return u / everyone
    if scale < Q16 and u >= everyone:
        return min(u / everyone, np.float64(Q16) / scale)
    return 0.0


@njit
def scale_by(d, scale, ratio):
    """One damped step of the scale towards ratio (measured / charged)."""
    ratio = max(0.25, min(2.0, ratio))  # at most halved (a quarter under the root) or doubled in a step
    new = scale * math.sqrt(ratio)
    new = max(np.float64(SCALE_MIN), min(np.float64(SCALE_MAX), new))
    DEV.store_sm_scale(d, np.uint64(new))


@njit
def control(ctx):
    """The watcher's compute work: the group's gang (with a share or without), and a controller step for each
    limited device this process launches on."""
    region = CTX.get_region(ctx)
    if region == 0:
        return
    gang.update(ctx, region)  # a group without a share forms a gang too (gang.py): before the test below
    if HDR.get_sm_any(region) == 0:
        return
    now = np.uint64(monotonic_ns())
    for dev in range(L.MAX_DEVICES):
        d = REGION.device(region, dev)
        limit = DEV.get_sm_limit(d)
        h = CTX.get_sm_nvml(ctx, dev)
        if limit == 0 or limit >= 100 or h <= NO_HANDLE:
            continue
        last = DEV.load_sm_ctl_ns(d)
        if now - last < np.uint64(CONTROL_PERIOD_NS) and last <= now:
            continue
        if DEV.cas_sm_ctl_ns(d, last, now) != last:
            continue  # another process of the group took this step
        if last == 0:
            continue  # the first period: NVML's window still holds the time before the program ran
        step(ctx, region, dev, h, limit, now, now - last)
