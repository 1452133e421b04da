"""The cost model of the compute share: what GPU time a launch takes.

A launch costs the GPU time its kernel takes, in ns. Every kernel (function and launch shape; a whole CUDA
graph for cuGraphLaunch) has its own estimate in the process's context, learned by timing sampled launches
between two CUDA events: the first launch of each kernel, then one launch in SAMPLE_EVERY (launch.py decides
which). The estimate is a decaying minimum of the timings (``learn``). Timings are harvested later on the
launching thread, never blocking, so a 200-block and a 2-block grid of the same function are told apart, and
a long kernel costs what it takes rather than its grid size.

A start event recorded on an idle stream runs at once, before the kernel has
even reached the GPU: its timing holds the launch's own path, several times a
small kernel's time (docs/compute.md, "The timing gate"), and a launch-bound
group's launches nearly all find their stream idle. So a timed launch is gated
(``gate_close``): the stream first waits for a word in pinned host memory, the
start event, the kernel and the end event are queued behind it, and the word is
written once the launch returned (``gate_open``): the GPU then runs them back to
back, as behind queued work. Where the driver cannot, the timing goes ungated,
and so does a function's first launch in a context: the driver may load its
module then, waiting for the stream, which would wait for the gate (that timing
holds the load: ``module_load``). Any other wait inside the driver in that window
is bounded by the watcher thread, which opens a gate left closed past
GATE_MAX_NS (``gate_watch``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.compute.streams import running_context
from pyvgpu.jit.runtime.context import HELPER
from pyvgpu.jit.runtime.fields import CTX, DEV, REGION
from pyvgpu.jit.runtime.intrinsics import (
    atomic_cas_u32,
    atomic_load_u32,
    atomic_store_u32,
    likely,
    load_f32,
    load_u64,
    monotonic_ns,
    sleep_ns,
    stack_u64,
    store_u32,
)
from pyvgpu.jit.state import events

SAMPLE_FREE, SAMPLE_RECORDING, SAMPLE_IN_FLIGHT = 0, 1, 2
N_HOW = len(L.TIMED_HOW)
PROBES = 16  # cost slots a key may sit away from its home
COST_EVICT_EVERY = 16  # a power of two: of the launches that find their probe run full, one takes a slot
WAIT_MAX_NS = 1_000_000_000  # the longest a launch waits for its own timed kernel (``wait_for``)
GATE_NONE, GATE_UNAVAILABLE = 0, 1  # ctx.gate_host before the gate words exist, and where they cannot
GATE_BYTES = 4096  # one page (the shim's, ctx.gate_page), pinned: a 32-bit word per sample
GATE_MAX_NS = 10_000_000  # a gate closed this long is opened at the watcher's next tick (a launch takes us)
CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP = 0x01, 0x02  # cuda.h: pinned for every context, mapped
WATCHER_LATE_NS = 500_000_000  # no gate while the watcher's last tick is older (it bounds every gate)
# From the TIMING_GATE_FORCED_MAXth forced gate on, each pauses the gate: for 2 s, then twice as long each
# time, at most 10 min. Lazy module loads come in bursts at a program's start; a program whose every
# launch waits inside the driver (CUDA_LAUNCH_BLOCKING=1) stalls once per pause, ever more rarely.
GATE_PAUSE_NS, GATE_PAUSE_MAX_NS = 2_000_000_000, 600_000_000_000
CU_STREAM_WAIT_VALUE_GEQ = 0x0  # cuda.h: (int32_t)(*addr - value) >= 0, so the count may wrap
CU_STREAM_CAPTURE_MODE_RELAXED = 2  # cuda.h: the thread may allocate while another thread captures a graph


@njit(inline="always")
def shape_key(f, gx, gy, gz, bx, by, bz):
    """A kernel: its function and launch shape, hashed into one nonzero word."""
    h = np.uint64(f)
    for v in (gx, gy, gz, bx, by, bz):
        h = (h ^ np.uint64(v)) * np.uint64(0x100000001B3)
    return h | np.uint64(1)


@njit
def cost_slot(ctx, key, evict):
    """Index of key's slot in the cost table (claimed if new), or -1 when its probe run is full.

    ``evict`` (a launch of the kernel): where the run is full, one launch in COST_EVICT_EVERY takes one of
    its slots (chosen by the new key), that kernel's estimate dropped: a server whose launch shapes keep
    changing (sequence lengths, batch sizes) would else fill the table for good, and every later kernel would
    cost the process's mean, untimed. A dropped kernel is timed anew at its next launch; more hot kernels
    than the table holds do not take turns evicting each other at every launch."""
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
    if not evict or (CTX.add_cost_full(ctx, 1) & np.uint64(COST_EVICT_EVERY - 1)) != 0:
        return np.int64(-1)
    i = (h + ((key >> np.uint64(20)) & np.uint64(PROBES - 1))) & np.uint64(L.COST_SLOTS - 1)
    k = CTX.get_cost_key(ctx, i)
    if k == key:
        return np.int64(i)  # another thread put it there meanwhile
    if CTX.cas_cost_key(ctx, i, k, key) == k:
        CTX.set_cost_ns(ctx, i, 0)  # the new kernel's first launch is timed
        return np.int64(i)
    return np.int64(-1)


@njit(inline="always")
def cost_of(ctx, slot):
    """The estimated GPU time (ns) of the kernel in cost slot ``slot``; the process's mean for a new one."""
    c = CTX.get_cost_ns(ctx, slot) if slot >= 0 else np.uint64(0)
    return c if c != 0 else CTX.get_sm_default_cost(ctx)


@njit(inline="always")
def charged_cost(ctx, region, dev, slot):
    """``cost_of`` for a launch charged on the group's device dev, counting there one charged the process's
    mean (``sm_unknown``): a report tells estimates that run long from timings that do."""
    c = CTX.get_cost_ns(ctx, slot) if slot >= 0 else np.uint64(0)
    if likely(c != 0):
        return c
    c = CTX.get_sm_default_cost(ctx)
    DEV.add_sm_unknown(REGION.device(region, dev), 1)
    DEV.add_sm_unknown_ns(REGION.device(region, dev), c)
    return c


@njit(inline="always")
def new_kernel(ctx, slot):
    """True if the kernel in cost slot ``slot`` has no estimate of its own yet (its launch is timed)."""
    return slot >= 0 and CTX.get_cost_ns(ctx, slot) == 0


@njit
def learn(ctx, key, ns):
    """Fold one timed launch into its kernel's estimate: a minimum that decays upward.

    Another context's time slice can only lengthen a timed launch (on a shared GPU it may run in the middle
    of ours), never shorten it. So the estimate is the lowest recent timing: a sample below it replaces it,
    and it grows by 1/64 per sample otherwise, which follows a kernel that really got slower within a few
    dozen samples and forgets one lucky reading."""
    slot = cost_slot(ctx, key, False)  # a timing never evicts: its kernel may be gone from the table
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
def gate_words(ctx, cur):
    """Host address of the gate words for a launch in context cur, or 0 (that launch goes ungated).

    The page is the shim's own mapping (never unmapped, so a write to it is always safe), registered
    with CUDA at the first gated launch by the thread that claims it: pinned, portable and mapped. Only
    the registering context's streams wait on it (a registration ends with its context). Where the driver
    refuses, timings go ungated for the process's life."""
    h = CTX.load_gate_host(ctx)
    out = stack_u64()
    if likely(h > GATE_UNAVAILABLE):
        if CTX.get_gate_ctx(ctx) != cur:
            return np.uint64(0)
        # still registered? A context destroyed (a device reset) ends its registrations, and a new context
        # may come at the same handle: then register anew, from the next gated launch
        if (HELPER.cuMemHostGetDevicePointer_v2(ctx, out, h, 0) == abi.CUDA_SUCCESS
                and load_u64(out) == CTX.get_gate_dptr(ctx)):
            return h
        CTX.cas_gate_host(ctx, h, GATE_NONE)
        return np.uint64(0)
    page = CTX.get_gate_page(ctx)
    if h != GATE_NONE or page == 0 or CTX.cas_gate_host(ctx, GATE_NONE, GATE_UNAVAILABLE) != GATE_NONE:
        return np.uint64(0)  # unavailable, or another thread is registering it (this timing goes ungated)
    # another thread may be capturing a graph in the global mode (PyTorch's default), which a registration
    # would invalidate: this thread registers in the relaxed mode
    mode = stack_u64()
    store_u32(mode, CU_STREAM_CAPTURE_MODE_RELAXED)
    relaxed = HELPER.cuThreadExchangeStreamCaptureMode(ctx, mode) == abi.CUDA_SUCCESS
    rc = HELPER.cuMemHostRegister_v2(ctx, page, GATE_BYTES, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)
    if relaxed:
        HELPER.cuThreadExchangeStreamCaptureMode(ctx, mode)  # back to the thread's own mode
    if rc != abi.CUDA_SUCCESS or HELPER.cuMemHostGetDevicePointer_v2(ctx, out, page, 0) != abi.CUDA_SUCCESS:
        return np.uint64(0)
    for j in range(L.SAMPLES):
        atomic_store_u32(page + np.uint64(4 * j), CTX.get_samp_gate(ctx, j))
    CTX.set_gate_dptr(ctx, load_u64(out))  # one address for every context: UVA (64-bit Linux)
    CTX.set_gate_ctx(ctx, cur)
    CTX.store_gate_host(ctx, page)
    return page


@njit
def gate_close(ctx, i, stream, cur):
    """Make ``stream`` (of context cur) wait, before sample i's start event, until ``gate_open``: TIMED_GATED
    if it does, else why not (layout.TIMED_HOW). Sample i is this thread's until it is in flight; besides it
    only the watcher writes its word (``gate_watch``), and neither ever moves it back, so a stream never
    waits for a word already past its value. Not while the watcher is not ticking: it is what bounds a gate
    its launch left closed."""
    now = monotonic_ns()
    if now < np.int64(CTX.load_gate_off_until(ctx)):
        return L.TIMED_GATE_OFF  # its launches kept waiting inside the driver: each gate would stall them
    if now - np.int64(CTX.load_turn_tick(ctx)) > WATCHER_LATE_NS:
        return L.TIMED_WATCHER_LATE
    h = gate_words(ctx, cur)
    if h == 0:
        return L.TIMED_NO_GATE
    v = CTX.get_samp_gate(ctx, i) + np.uint32(1)
    if HELPER.cuStreamWaitValue32_v2(ctx, stream, CTX.get_gate_dptr(ctx) + np.uint64(4 * i), v,
                                     CU_STREAM_WAIT_VALUE_GEQ) != abi.CUDA_SUCCESS:
        return L.TIMED_WAIT_REFUSED
    CTX.store_samp_gate(ctx, i, v)  # first the value, then the time: gate_watch reads them the other way
    CTX.store_samp_gate_ns(ctx, i, monotonic_ns())
    return L.TIMED_GATED


@njit
def raise_word(addr, v):
    """Set the gate word at addr to v unless it is already at or past v (cyclically, as the stream compares):
    two writers (the launch, the watcher) never move a word back below a value a stream waits for. True if
    this call moved it."""
    cur = atomic_load_u32(addr)
    while np.int32(v - cur) > 0:
        old = np.uint32(atomic_cas_u32(addr, cur, v))
        if old == cur:
            return True
        cur = old
    return False


@njit
def gate_open(ctx, i):
    """Let sample i's stream go on (after its launch returned, or when the sample is dropped)."""
    raise_word(CTX.get_gate_host(ctx) + np.uint64(4 * i), CTX.get_samp_gate(ctx, i))
    CTX.store_samp_gate_ns(ctx, i, 0)


@njit
def gate_watch(ctx, now):
    """On the watcher thread: open every gate closed for longer than GATE_MAX_NS (its launch is waiting
    inside the driver, which may be waiting for the stream; the watcher ticks ten times a second, so a gate
    is open within GATE_MAX_NS + 100 ms). Opened early, a timing only reads long. Each time the count of
    gates so opened reaches a power of two, a ``timing_gate`` event says so; from TIMING_GATE_FORCED_MAX
    on, each pauses the gate (``pause_gate``)."""
    h = CTX.load_gate_host(ctx)
    if h <= GATE_UNAVAILABLE:
        return
    for i in range(L.SAMPLES):
        t = CTX.load_samp_gate_ns(ctx, i)
        if t == 0 or now - np.int64(t) <= GATE_MAX_NS:
            continue
        v = CTX.load_samp_gate(ctx, i)
        if CTX.load_samp_gate_ns(ctx, i) != t:
            continue  # opened meanwhile, maybe closed again: v may be the next gate's
        if raise_word(h + np.uint64(4 * i), v):
            n = CTX.add_gate_forced(ctx, 1) + np.uint64(1)
            if n & (n - np.uint64(1)) == 0:
                events.record(CTX.get_region(ctx), L.EV_TIMING_GATE, -1, 0, n, np.uint64(now - np.int64(t)))
            if n >= L.TIMING_GATE_FORCED_MAX:
                pause_gate(ctx, now)


@njit
def pause_gate(ctx, now):
    """Time launches ungated for a while (the watcher's thread alone writes these): GATE_PAUSE_NS after the
    first pause, twice as long after each next one, at most GATE_PAUSE_MAX_NS. Gates closed before a pause
    and forced open in it (several samples' at one tick) do not lengthen it."""
    if now < np.int64(CTX.load_gate_off_until(ctx)):
        return
    k = min(CTX.get_gate_offs(ctx), np.uint64(20))
    CTX.set_gate_offs(ctx, CTX.get_gate_offs(ctx) + np.uint64(1))
    CTX.store_gate_off_until(ctx, np.uint64(now + min(np.int64(GATE_PAUSE_NS) << np.int64(k), GATE_PAUSE_MAX_NS)))


@njit
def func_slot(ctx, fkey, claim):
    """Slot of a function (its handle ^ its CUcontext) in the set of those launched here; -1 when it is not
    there (``claim``: and there was no room to add it)."""
    h = (fkey * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(54)
    for p in range(PROBES):
        i = (h + np.uint64(p)) & np.uint64(L.FUNC_SLOTS - 1)
        k = CTX.load_func_seen(ctx, i)
        if k == fkey:
            return np.int64(i)
        if k == 0:
            if not claim:
                return np.int64(-1)
            old = CTX.cas_func_seen(ctx, i, 0, fkey)
            if old == 0 or old == fkey:
                return np.int64(i)
    return np.int64(-1)


@njit
def may_gate(ctx, known, fkey):
    """Whether a timed launch may be gated: its kernel has a cost slot and its function was launched in this
    context before (``fkey``: the function ^ the context; a kernel handle may serve several contexts). A
    function's first launch in a context is not: CUDA loads its module then (lazy loading, the default),
    waiting for the stream, which would wait for the gate."""
    return known and func_slot(ctx, fkey, False) >= 0


@njit
def gate(ctx, i, stream, cur, known, fn):
    """Close sample i's gate where it may be: how its timing is taken (layout.TIMED_HOW)."""
    if not known:
        return L.TIMED_NO_COST_SLOT
    if not may_gate(ctx, known, fn ^ cur):
        return L.TIMED_FIRST
    return gate_close(ctx, i, stream, cur)


@njit
def sample_begin(ctx, region, dev, key, stream, known, fn):
    """Record a start event before a launch, behind a closed gate where ``may_gate`` allows (``known``: the
    kernel has a cost slot; ``fn``: its function), counted on the group's device dev by how (``sm_timed``);
    returns the sample index, or -1 (no sample taken). A sample taken must be ended (``sample_end``) right
    after the launch: that opens the gate."""
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
    how = gate(ctx, i, stream, cur, known, fn) if ok else L.TIMED_NO_GATE
    gated = ok and how == L.TIMED_GATED
    ok = ok and HELPER.cuEventRecord(ctx, CTX.get_samp_start(ctx, i), stream) == abi.CUDA_SUCCESS
    if gated and not ok:
        gate_open(ctx, i)
    if not ok:
        CTX.store_samp_state(ctx, i, SAMPLE_FREE)
        return -1
    CTX.set_samp_key(ctx, i, key)
    CTX.set_samp_fn(ctx, i, fn ^ cur)
    CTX.set_samp_dev(ctx, i, np.uint32(dev))
    CTX.set_samp_how(ctx, i, np.uint32(how))
    DEV.add_sm_timed(REGION.device(region, dev), how, 1)
    return i


@njit
def sample_end(ctx, i, stream, rc):
    """After the launch: record the end event, open the gate and leave the sample in flight."""
    ended = rc == abi.CUDA_SUCCESS and HELPER.cuEventRecord(ctx, CTX.get_samp_end(ctx, i), stream) == abi.CUDA_SUCCESS
    if CTX.load_gate_host(ctx) > GATE_UNAVAILABLE:
        gate_open(ctx, i)  # a no-op for an ungated sample: its word already holds its value
    if ended:
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
def module_load(ctx, i):
    """Sample i was a function's first launch in its context, ungated as CUDA may load its module then: the
    load is in the timing. It makes no estimate: the kernel stays new, and its next launch is timed gated
    (``may_gate``); kept, it was charged at every launch until timed again (launch.py ``sampled``). A function
    the known set had no room for is timed ungated for good: its timing is kept."""
    return CTX.get_samp_how(ctx, i) == L.TIMED_FIRST and func_slot(ctx, CTX.get_samp_fn(ctx, i), False) >= 0


@njit
def count_timing(ctx, i, ns):
    """Add sample i's timing to what the group's timings read on its device, by how it was taken."""
    region = CTX.get_region(ctx)
    dev = CTX.get_samp_dev(ctx, i)
    how = CTX.get_samp_how(ctx, i)
    if region != 0 and dev < L.MAX_DEVICES and how < N_HOW:
        d = REGION.device(region, dev)
        DEV.add_sm_timed_ns(d, how, ns)
        DEV.add_sm_harvested(d, how, 1)


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
                if not module_load(ctx, i):
                    learn(ctx, CTX.get_samp_key(ctx, i), np.uint64(ns))
                elif CTX.get_sm_default_cost(ctx) == 0:  # the process's first timing: better than none
                    CTX.set_sm_default_cost(ctx, np.uint64(ns))
                count_timing(ctx, i, np.uint64(ns))
        CTX.add_sm_pending(ctx, np.uint32(0xFFFFFFFF))  # -1
        CTX.store_samp_state(ctx, i, SAMPLE_FREE)
