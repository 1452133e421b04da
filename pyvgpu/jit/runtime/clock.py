"""The launch path's clock: CLOCK_MONOTONIC, extrapolated from the CPU's time-stamp counter.

A launch under a share needs the time (its budget, its turn). Reading
CLOCK_MONOTONIC through the vDSO is a large part of what a share adds to a
launch (docs/compute.md, "the launch clock"); ``rdtsc`` costs a fraction of
it. So a process reads the system clock about once per
CLOCK_ANCHOR_NS (an *anchor*: the TSC and CLOCK_MONOTONIC read together) and
in between extrapolates: ``ns = anchor_ns + (tsc - anchor_tsc) * rate``.

* The rate (ns per tick) is measured from the first anchor, over at least
  RATE_WINDOW_NS; until then every launch reads the system clock. An anchor
  whose reading took too long (the thread was preempted between the TSC
  and the clock) is thrown away, so each anchor is exact to a few us and the
  first rate to ~1e-3; it gets better as the measurement ages.
* Every anchor checks the extrapolation: one more than RESET_NS off (the
  clock was set, the VM migrated) measures the rate again from there
  (``clk_resets``). Between anchors the error stays far below the 1 us
  unit of the turn words (pyvgpu/jit/compute/turn.py); across an anchor the clock
  may step back by that error, which every user of ``now`` tolerates (they
  compare with times other processes wrote, read at other moments).
* Threads share the anchor through a sequence word (a seqlock): one thread
  rewrites it at a time, and a reader that sees it change reads the system
  clock instead.

The shim turns it on (``clk_mode``, PYVGPU_CLOCK) only on x86-64, and by
default only where the kernel itself keeps CLOCK_MONOTONIC on the TSC
(clocksource ``tsc``: it found the counter invariant and synchronized
across CPUs). Anywhere else ``now`` is ``monotonic_ns``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.jit.runtime.fields import CTX
from pyvgpu.jit.runtime.intrinsics import likely, monotonic_ns, read_tsc, unlikely

CLOCK_ANCHOR_NS = 1_000_000  # read the system clock about this often (ns)
RATE_WINDOW_NS = 10_000_000  # measure the first rate over at least this long
RESET_NS = 20_000  # an anchor this far from the extrapolation measures the rate again
MAX_READ_TICKS = 4_000  # an anchor whose clock read took longer than this many ticks (~1 us) is not used
Q32 = 4294967296.0


@njit(inline="always")
def now(ctx):
    """CLOCK_MONOTONIC in ns: extrapolated from the TSC between anchors, else read."""
    if unlikely(CTX.get_clk_mode(ctx) == 0):
        return monotonic_ns()
    seq = CTX.load_clk_seq(ctx)
    t = read_tsc()
    d = t - CTX.load_clk_tsc(ctx)
    if likely(d < CTX.load_clk_span(ctx)):  # unsigned: a TSC behind the anchor (another CPU's) goes to the anchor too
        ns = np.int64(CTX.load_clk_ns(ctx) + ((d * CTX.load_clk_mult(ctx)) >> np.uint64(32)))
        if likely(CTX.load_clk_seq(ctx) == seq and seq & np.uint64(1) == 0):
            return ns
    return anchor(ctx, seq)


@njit
def anchor(ctx, seq):
    """Read the system clock; the thread that wins the sequence word also makes it the new anchor."""
    if seq & np.uint64(1) != 0 or CTX.cas_clk_seq(ctx, seq, seq + np.uint64(1)) != seq:
        return monotonic_ns()  # another thread is anchoring
    t1 = read_tsc()
    ns = monotonic_ns()
    t2 = read_tsc()
    if t2 - t1 > np.uint64(MAX_READ_TICKS):  # preempted while reading: this pair is not exact
        CTX.store_clk_seq(ctx, seq + np.uint64(2))
        return ns
    t = t1 + (t2 - t1) // np.uint64(2)
    mult = CTX.get_clk_mult(ctx)
    last = CTX.get_clk_tsc(ctx)
    reset = False
    if mult != 0:
        if t < last:  # the TSC went back (another counter after a migration): measure again
            reset = True
        elif t - last <= CTX.get_clk_span(ctx) * np.uint64(64):  # anchored lately: check the extrapolation
            off = float(CTX.get_clk_ns(ctx)) + float(t - last) * float(mult) / Q32 - float(ns)
            reset = off > RESET_NS or off < -RESET_NS
        if reset:
            CTX.add_clk_resets(ctx, 1)
    base_ns = np.int64(CTX.get_clk_base_ns(ctx))
    if reset or base_ns == 0 or t <= CTX.get_clk_base_tsc(ctx):
        CTX.set_clk_base_tsc(ctx, t)  # (re)start measuring the rate here: the system clock until it is known
        CTX.set_clk_base_ns(ctx, np.uint64(ns))
        CTX.store_clk_mult(ctx, np.uint64(0))
        CTX.store_clk_span(ctx, np.uint64(0))
    elif ns - base_ns >= (RATE_WINDOW_NS if mult == 0 else CLOCK_ANCHOR_NS):
        mult = np.uint64(float(ns - base_ns) / float(t - CTX.get_clk_base_tsc(ctx)) * Q32)
        if mult != 0:
            CTX.store_clk_mult(ctx, mult)
            CTX.store_clk_span(ctx, np.uint64(float(CLOCK_ANCHOR_NS) * Q32 / float(mult)))
    CTX.store_clk_tsc(ctx, t)
    CTX.store_clk_ns(ctx, np.uint64(ns))
    CTX.store_clk_seq(ctx, seq + np.uint64(2))
    return ns
