"""The compute share's budget: one per (group, device), in the shared region.

A group with ``sm_limit = s`` percent on a device may use s% of that
device's time. The budget is a generic cell rate algorithm on a single word,
``sm_tat``: the time at which the budget is next free. A launch advances it by
cost x scale x 100 / s with one CAS (cost from pyvgpu/jit/compute/cost.py, scale from
the controller, pyvgpu/jit/compute/controller.py), and waits only if it is more than
BURST_NS + the batch ahead of now. Every process of the group draws on the
same word, in arrival order.

Every process of the group can write the word, and a region file can outlive
a reboot's clock, so a budget that cannot be one (negative as a signed time,
or further ahead of now than MAX_AHEAD_NS) is not obeyed: the launch that
finds it starts the budget afresh from now and records a ``budget_reset``
event. Honest budgets stay far below the bound: it is only reached by
charges queued together of that many seconds (a group at --sm 1 whose
threads queue ten minutes of kernels at once), which are then forgiven. So
no launch waits longer than MAX_AHEAD_NS for the budget, whatever another
member wrote; ``hold`` caps the wait there too.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import layout as L
from pyvgpu.jit.compute import gang, gangstop, turn
from pyvgpu.jit.runtime.fields import CTX, DEV, HDR, REGION, SLOT
from pyvgpu.jit.runtime.intrinsics import likely, monotonic_ns, sleep_ns, unlikely
from pyvgpu.jit.state import events

BURST_NS = 2_000_000  # budget a group may run ahead of its share (absorbs sleep overshoot)
# A gang's batch, at least (PYVGPU_SM_BATCH_MS may ask for more). Beside another group a gang hands the turn
# over once a batch, and each hand-over costs it its ranks' drains and their meeting at one collective
# (pyvgpu/jit/compute/gangstop.py): with the default batch that cost took about half of a gang's share,
# and a longer batch spreads it (docs/compute.md, "Collectives").
GANG_BATCH_NS = 100_000_000
MAX_AHEAD_NS = L.BUDGET_MAX_AHEAD_NS  # the furthest ahead of now a budget is obeyed (see the module's docstring)
Q16 = 65536  # sm_scale's unit: 1.0


@njit(inline="always")
def limited(ctx, region):
    """True if this process's launches go through the limiter. Loads only."""
    if HDR.get_sm_any(region) == 0:
        return False
    policy = CTX.get_sm_policy(ctx)
    return not (policy == L.SM_POLICY_DISABLE
                or (policy == L.SM_POLICY_DEFAULT and HDR.get_sm_switch(region) == 0))


@njit(inline="always")
def share(region, dev):
    """The group's share on dev in percent, if it limits (1-99); else 0."""
    limit = DEV.get_sm_limit(REGION.device(region, dev))
    return limit if 0 < limit < 100 else np.uint32(0)


@njit(inline="always")
def batch_ns(ctx, gang):
    """How far past the budget a hold lets the group run (PYVGPU_SM_BATCH_MS), at least GANG_BATCH_NS for
    a gang's rank (``gang``)."""
    b = np.int64(CTX.get_sm_batch_ns(ctx))
    return max(b, np.int64(GANG_BATCH_NS)) if gang else b


@njit(inline="always")
def spent(ctx, region, dev, now, gang):
    """The group's budget on dev is spent: a launch charged now would wait (throttle's test, before the
    charge). ``gang``: the launch is a gang rank's (dev is then the gang's lead device)."""
    tat = np.int64(DEV.load_sm_tat(REGION.device(region, dev)))
    if unlikely(forged(tat, now)):
        return False  # not a budget: the launch goes through throttle, which starts it afresh
    return tat - now > BURST_NS + batch_ns(ctx, gang)


@njit(inline="always")
def forged(tat, now):
    """``sm_tat`` (as int64) cannot be an honest budget: negative, or further ahead than MAX_AHEAD_NS.
    Tested in that order, so that ``tat - now`` never overflows."""
    return tat < 0 or tat - now > MAX_AHEAD_NS


@njit(inline="always")
def may_borrow(ctx, region):
    """The group lends itself idle GPU time beyond its share (--sm-borrow), unless this process's
    GPU_CORE_UTILIZATION_POLICY is force (a hard cap, whatever the group says)."""
    return HDR.get_sm_borrow(region) != 0 and CTX.get_sm_policy(ctx) != L.SM_POLICY_FORCE


@njit(inline="always")
def rank(region, due):
    """The turn rank of a launch of this group (pyvgpu.contract.layout.RANK_*): due (within its share) or best
    effort, high or low priority."""
    low = HDR.get_priority(region) != L.PRIORITY_HIGH
    return (0 if due else 2) + (1 if low else 0)



@njit(inline="always")
def charge_slot(ctx, dev, cost):
    """Count a launch and its estimated GPU time in the process's slot (the group's own accounting; the
    slot's ``launches`` leaves it out, so a launch is counted with one atomic add, not two). Returns the
    count before it (without a slot, the process's own count), which paces the launch's timing samples."""
    slot = CTX.get_slot(ctx)
    if likely(slot != 0):
        SLOT.add_sm_cost_ns(slot, dev, cost)
        return SLOT.add_sm_launches(slot, dev, 1)
    return CTX.add_sm_launches(ctx, 1)


RECIP_SHIFT = 33  # ctx.sm_recip: the share above these bits, its reciprocal below
RECIP_MASK = np.uint64((1 << RECIP_SHIFT) - 1)
RECIP_EXACT = np.uint64(1 << 31)  # below this, x * reciprocal fits 64 bits and is off by at most one


@njit(inline="always")
def scaled(region, dev, cost):
    """A launch's estimated GPU time (ns) as the group's controller corrects it: cost x sm_scale. The scale
    is what the controller learned of how far the process's timings overstate the GPU's busy time (a small
    kernel's timing on an idle stream holds the launch path too); budgets and the turns' queue estimates
    both count GPU time, so both count it scaled."""
    scale = DEV.get_sm_scale(REGION.device(region, dev))
    if unlikely(scale == 0):
        scale = np.uint64(Q16)
    return np.uint64(cost) * scale // np.uint64(Q16)


@njit(inline="always")
def per_share(ctx, dev, x, limit):
    """x // limit (the share, 1-99), exactly, without a division for x < 2^31 (a charge of up to ~20 ms
    at scale 1): a division takes ~10-20 cycles on every launch, a multiply 3. With m = 2^32 // limit + 1,
    x * m >> 32 is x / limit or one more; one multiply tells which."""
    if unlikely(x >= RECIP_EXACT):
        return x // np.uint64(limit)
    lim = np.uint64(limit)
    r = CTX.get_sm_recip(ctx, dev)
    if unlikely(r >> np.uint64(RECIP_SHIFT) != lim):  # the first charge on dev, or the share changed
        r = (lim << np.uint64(RECIP_SHIFT)) | (np.uint64(1 << 32) // lim + np.uint64(1))
        CTX.set_sm_recip(ctx, dev, r)  # one word: a thread reads the share and its reciprocal together
    q = (x * (r & RECIP_MASK)) >> np.uint64(32)
    if q * lim > x:
        q -= np.uint64(1)
    return q


@njit
def throttle(ctx, region, dev, lead, k, cost, scaled_cost, limit, now):
    """Charge cost (ns of GPU time on dev; ``scaled_cost``: it times the controller's scale, ``scaled``) to the
    group's budget, and count the launch (``charge_slot``, at the raw cost).
    The budget is dev's own, or in a gang of k devices the lead device's, charged 1/k of the cost
    (pyvgpu/jit/compute/gang.py). Returns how long the launch must wait for the budget (ns, <= 0: it may go now),
    and the count before it."""
    charge = np.int64(per_share(ctx, dev, scaled_cost * np.uint64(100), limit))
    if unlikely(k > 1):
        charge //= np.int64(k)
    d = REGION.device(region, lead)
    while True:
        old = np.int64(DEV.load_sm_tat(d))
        if unlikely(forged(old, now)):  # written by a member, or from before a reboot: not obeyed
            if np.int64(DEV.cas_sm_tat(d, np.uint64(old), np.uint64(now + charge))) == old:
                events.record(region, L.EV_BUDGET_RESET, lead, 0, np.uint64(old), np.uint64(now))
                base = now
                break
            continue
        base = old if old > now else now
        if likely(np.int64(DEV.cas_sm_tat(d, np.uint64(old), np.uint64(base + charge))) == old):
            break
    n = charge_slot(ctx, dev, cost)
    # from base (now <= base <= now + MAX_AHEAD_NS), not old: a wait that cannot overflow
    return base - BURST_NS - batch_ns(ctx, k > 1) - now, n


@njit
def hold(ctx, region, dev, wait, stream, turns, rank, g):
    """Wait for the budget, and sm_batch_ns longer: then the launches after this one pass at once, that
    much budget together (the tolerance holds a batch, so no budget is lost; the schedule in sm_tat is
    absolute, so the rate does not change). Taking turns, first reserve the turn for that moment and
    hand it over (turn.give may wait for this process's work to finish, which counts towards the wait):
    the others get the GPU for the batch, and the holder of then gives it back in time. Time-slicing,
    the GPU switches contexts once per batch instead of once per kernel. Returns the time after it."""
    start = monotonic_ns()
    wait = min(wait, MAX_AHEAD_NS) + batch_ns(ctx, g != 0)
    if g != 0:  # a gang's ranks leave together (pyvgpu/jit/compute/gang.py)
        gang.publish_release(region, start + wait, start)
    if turns and turn.takes_turns(ctx, dev):
        turn.reserve(ctx, dev, rank, start + wait)
        turn.give(ctx, region, dev, stream, False, g)
    now = monotonic_ns()
    if g != 0 and gangstop.hold_until(region, start + wait):
        # a peer's drain waits for this rank's kernel (pyvgpu/jit/compute/gangstop.py): it launches now
        now = monotonic_ns()
        DEV.add_sm_throttle_ns(REGION.device(region, dev), np.uint64(now - start))
        return now
    now = monotonic_ns()
    if start + wait > now:
        sleep_ns(start + wait - now)
        now = monotonic_ns()
    if g != 0:
        later = gang.follow_release(region, now)
        if later != 0:
            if turns and turn.takes_turns(ctx, dev):
                turn.reserve(ctx, dev, rank, later)  # the turn it asked for moves with it, not left to lapse
            gangstop.hold_until(region, later)  # asked meanwhile: it goes now
            now = monotonic_ns()
    DEV.add_sm_throttle_ns(REGION.device(region, dev), np.uint64(now - start))
    return now
