"""Gangs: a group whose processes launch under a share on several devices at once.

A collective kernel (an NCCL all-reduce, a tensor-parallel layer's reduction) runs on every device of the
group at once, and each rank's kernel waits inside the GPU until its peers' kernels arrive. Throttled one
device at a time, the ranks of one group are held back at different moments: each rank's kernels then spend
the other's hold waiting, the waiting is GPU time charged to the share, and the group gets a fraction of
its share (docs/compute.md, "Collectives"). Taking turns one device at a time is worse: two such groups on
the same two GPUs can each hold the turn on one GPU while its kernel waits for a peer on the other.

So a group that launches under a share on several devices is a *gang*: its ranks draw on one budget (the
lowest device's ``sm_tat``, each launch charged 1/k of its cost for k devices: the group still gets its
share of each device's time) and take the turn together, on the lowest device's turn entry, under one turn
id that every process of the group uses there. Held back together and let go together, the ranks' kernels
meet instead of waiting for each other, and two gangs on the same GPUs hand the whole set over at once.

The watcher of every process (10 Hz, ``update``) works out which devices the group's live processes
launched on under a share (``sm_devs``) and publishes the gang in one word (``sm_gang``) that a launch
reads beside ``sm_any``. A group without a share that launches on several devices is a gang too (best
effort): where a group with a share takes turns on its lowest device, its ranks take them there together,
so that a rank on another device does not run its collective beside a gang's turn, waiting inside the GPU
for a peer that waits for the turn. Limits: a rank without a share whose gang's lowest device takes no
turns takes them on its own device; a gang forms within a watcher tick of its ranks' first launches, so
their first ~100 ms are throttled one device at a time.

Held together, the ranks must also leave together. One budget is drawn on in arrival order, so the rank
whose matching launch comes second sees the budget one charge further ahead and would hold that much
longer, while the first rank's kernel waits for it inside the GPU, timed and charged as work: the charge
grows, the holds grow, and the gang ends far below its share (docs/compute.md, "Collectives"). So a rank
that holds publishes its release in ``gang_release`` (the latest any rank asked for); while it is ahead,
every rank's launch holds until it, whatever its own budget says (``common_wait``), and a rank that wakes
before a later published release sleeps on to it (``follow_release``): the ranks leave at one instant.
No launch counts are compared: ranks of one gang need not launch the same kernels.

Handing the turn over, the ranks must stop at the same collective too (pyvgpu/jit/compute/gangstop.py): a
rank whose drain waits for a peer's kernel *asks* (``ask``, ``gang_stuck_ns``), and its peers launch while
``asked``, until it withdraws (``withdraw``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import layout as L
from pyvgpu.jit.compute.turnword import draw_id
from pyvgpu.jit.runtime.fields import CTX, DEV, HDR, REGION, SLOT
from pyvgpu.jit.runtime.intrinsics import futex_wake, unlikely

RELEASE_MAX_NS = 1_000_000_000  # the furthest ahead a release is followed (a forged one is not obeyed)
ASK_FRESH_NS = 1_000_000  # a request to catch up older than this is not obeyed (its asker died or gave up)
ASK_RENEW_NS = 250_000  # an asker renews its request this often while it waits


@njit(inline="always")
def word(devs):
    """``sm_gang`` for a set of devices (a bit each): 0 for fewer than two, else (lowest + 1) | count << 8."""
    n = 0
    low = -1
    for d in range(L.MAX_DEVICES):
        if devs & (np.uint64(1) << np.uint64(d)):
            n += 1
            if low < 0:
                low = d
    return np.uint32(0) if n < 2 else np.uint32((low + 1) | (n << 8))


@njit(inline="always")
def checked(g):
    """The gang word as read from the region, or 0 where it cannot be one: every member can write the header,
    and a lead device or a count out of range would index past the region's devices."""
    low = g & np.uint32(0xFF)
    n = g >> np.uint32(8)
    ok = np.uint32(1) <= low <= np.uint32(L.MAX_DEVICES) and np.uint32(2) <= n <= np.uint32(L.MAX_DEVICES)
    return g if ok else np.uint32(0)


@njit(inline="always")
def lead(g, dev):
    """The device whose budget and turn a launch on dev uses: the gang's lowest device (gang word g), or dev."""
    return np.int64((g & np.uint32(0xFF)) - 1) if g != 0 else dev


@njit(inline="always")
def queue_cost(g, cost):
    """What a rank's launch adds to the turn entry's queue: the entry of a gang's lead device stands for the
    gang's k devices, which run the ranks' kernels side by side, so each of the k ranks adds 1/k of its
    kernel's time (together one kernel's time per collective, as on each device). Counted whole, the
    entry's queue ran k times ahead of the devices': a gang's holder yielded for reservations it would not
    have met, and a neighbour saw a queue too deep to go beside."""
    return np.uint64(cost) // size(g) if g != 0 else np.uint64(cost)


@njit(inline="always")
def size(g):
    """How many devices share the budget (1 outside a gang)."""
    return np.uint64(g >> np.uint32(8)) if g != 0 else np.uint64(1)


@njit
def update(ctx, region):
    """The watcher's step: the devices the group's live processes launched on under a share (a group without
    a share: those it launched on while turns were taken on the machine), and the gang word and shared turn
    id they make. Every process does it; they all write the same answer."""
    devs = np.uint64(0)
    unshared = HDR.get_sm_any(region) == 0  # a group without a share anywhere: every device it launched on
    for i in range(CTX.get_n_slots(ctx)):
        s = REGION.slot(region, i)
        if SLOT.load_state(s) != L.SLOT_LIVE:
            continue
        for d in range(L.MAX_DEVICES):
            if SLOT.load_sm_launches(s, d) != 0 and (unshared or DEV.get_sm_limit(REGION.device(region, d)) != 0):
                devs |= np.uint64(1) << np.uint64(d)
    if HDR.load_sm_devs(region) != devs:
        HDR.store_sm_devs(region, devs)
    g = word(devs)
    if g != 0 and HDR.load_turn_gid(region) == 0:
        sched = CTX.get_sched(ctx)
        if sched != 0:
            HDR.cas_turn_gid(region, 0, draw_id(sched, True))
    if HDR.load_sm_gang(region) != g:
        HDR.store_sm_gang(region, g)


@njit
def common_wait(region, wait, now, batch):
    """How long a gang member's launch waits (ns), and whether it holds: while a common release is ahead
    (``publish_release``: a rank holds until then) it holds until it, or longer if its own budget says so,
    whatever its own budget says: a rank that went now would start a collective its peers queue only at
    the release, and its kernel would wait for them inside the GPU. Otherwise its own budget decides.
    ``hold`` sleeps ``batch`` beyond the wait it is given."""
    r = np.int64(HDR.load_gang_release(region))
    if r <= now or r > now + RELEASE_MAX_NS:
        return wait, wait > 0  # none ahead, or not a release any rank asked for: its own budget
    r -= now + np.int64(batch)
    return (r if r > wait or wait <= 0 else wait), True  # wait <= 0: its own budget would let it go now


@njit
def publish_release(region, until, now):
    """A rank holds until ``until``: make it the gang's common release if it is later than the one there. A
    release no rank obeys (more than RELEASE_MAX_NS past ``now``, or negative: a forged value, or one left in
    a region file from before a reboot) is replaced, or it would keep every later release out for good."""
    while True:
        old = HDR.load_gang_release(region)
        o = np.int64(old)
        if o >= until and o <= now + RELEASE_MAX_NS:
            return
        if HDR.cas_gang_release(region, old, np.uint64(until)) == old:
            return


@njit
def follow_release(region, now):
    """After its own hold: the gang's common release, if another rank published a later one meanwhile (it
    held at the same collective with a later budget), or 0. Bounded: a release further ahead than
    RELEASE_MAX_NS is not followed."""
    r = np.int64(HDR.load_gang_release(region))
    return r if now < r <= now + RELEASE_MAX_NS else np.int64(0)


@njit(inline="always")
def join(ctx, region, g):
    """A launch of a gang member: its turns are taken under the group's shared id from now on."""
    if unlikely(g != 0):
        gid = HDR.load_turn_gid(region)
        if gid != 0 and CTX.get_turn_id(ctx) != gid:
            CTX.set_turn_id(ctx, gid)


@njit(inline="always")
def asked(region, now):
    """A rank of the gang waits in its drain for a peer's kernel (``ask``, renewed within ASK_FRESH_NS):
    its peers launch now, whatever holds them. A request from the future or older than ASK_FRESH_NS is not
    obeyed: every member can write it, and its asker renews it while it waits."""
    t = np.int64(HDR.load_gang_stuck_ns(region))
    return t != 0 and 0 <= now - t <= ASK_FRESH_NS


@njit
def ask(region, now):
    """This rank's drain waits for a peer's kernel: ask the gang's ranks to launch (renewed while it waits,
    every ASK_RENEW_NS), and wake those that hold."""
    first = not asked(region, now)
    HDR.store_gang_stuck_ns(region, np.uint64(now))
    if first:
        HDR.add_gang_wake(region, 1)
        futex_wake(HDR.gang_wake_at(region))


@njit
def withdraw(region, mine):
    """An asker takes back its request (``mine``: the time it last wrote there), not another rank's."""
    if HDR.cas_gang_stuck_ns(region, np.uint64(mine), 0) == np.uint64(mine):
        HDR.add_gang_wake(region, 1)
        futex_wake(HDR.gang_wake_at(region))


@njit
def caught_up(region):
    """A rank's catch-up launch ended: its asker withdraws the request, and asks again only if its drain
    still waits (drain.py ``drain_gang``): asked for as long as its whole queue drained, the peers would
    launch past the kernel it waited for."""
    HDR.add_gang_caught(region, 1)
