"""What every policy needs from its per-process context: driver calls, the call count, the device.

The callbacks get the address of the process's context (``pyvgpu.contract.layout.CTX``)
as their first argument. This module is the one home of what they do with it
beyond their own policy:

* ``call_real(ctx, idx, args, notfound)``: the driver's own function of the
  hooked entry ``idx``, with the call's arguments;
* ``REAL.<abi name>(ctx, ...)``: the driver's function of another hooked entry
  (``REAL.cuMemFree_v2(ctx, ptr)``), typed as the hook table declares it;
* ``HELPER.<name>(ctx, ...)``: a driver function the policies call without
  hooking it (``HELPER.cuEventRecord(ctx, ev, stream)``), typed as the table
  declares it;
* ``current_device(ctx)`` and ``per_thread(idx)``;
* ``launch_device(ctx, now)``: the device a launch runs on, without asking the
  driver while the process made contexts on one device only
  (``note_context`` counts them; the driver's answer is the dearest call of
  a launch under a share).

``REAL`` and ``HELPER`` are generated from the hook table: a function the
driver lacks answers its library's "not found" code instead of a call
through NULL, and every argument is cast to the declared C type, so a call
cannot pass an int64 where the driver reads an int.
"""

from __future__ import annotations

import types as pytypes

import numpy as np
from numba import njit

from pyvgpu.contract import abi, hooks
from pyvgpu.contract import layout as L
from pyvgpu.jit.runtime.fields import CTX
from pyvgpu.jit.runtime.intrinsics import call_i32, likely, load_i32, stack_u64, unlikely


# Whether each hook entry is a per-thread-default-stream variant (_ptsz/_ptds), a bit per entry index in two
# words that compile to immediates: a launch on stream 0 reads no table (a cache line fewer per launch).
def _per_thread_bits() -> tuple[np.uint64, np.uint64]:
    if len(hooks.ENTRIES) > 128:
        raise RuntimeError(f"{len(hooks.ENTRIES)} hook entries: per_thread's two words hold 128 (context.py)")
    words = [0, 0]
    for i, e in enumerate(hooks.ENTRIES):
        if e.variant.per_thread:
            words[i // 64] |= 1 << (i % 64)
    return np.uint64(words[0]), np.uint64(words[1])


PER_THREAD_LO, PER_THREAD_HI = _per_thread_bits()


@njit(inline="always")
def count_call(ctx, idx):
    """Count the call of entry idx for PYVGPU_STATS; without it, nothing (an atomic add per call)."""
    if unlikely(CTX.get_count_calls(ctx) != 0):
        CTX.add_calls(ctx, idx, 1)


@njit
def call_real(ctx, idx, args, notfound):
    """Call the real driver function of entry ``idx`` with the tuple ``args``."""
    fn = CTX.get_real(ctx, idx)
    if fn == 0:
        return notfound
    return call_i32(fn, args)


@njit
def per_thread(idx):
    """True if entry idx is a per-thread-default-stream variant: its stream 0 means the thread's stream."""
    i = np.uint64(idx)
    w = PER_THREAD_LO if i < np.uint64(64) else PER_THREAD_HI
    return (w >> (i & np.uint64(63))) & np.uint64(1) != np.uint64(0)


@njit
def stream_of(idx, stream):
    """The stream a launch or event on entry idx means, as any API accepts it (0 of a per-thread variant is
    the per-thread stream's own handle)."""
    if stream == 0 and per_thread(idx):
        return np.uint64(abi.CU_STREAM_PER_THREAD)
    return np.uint64(stream)


# --- generated: typed calls through the table ------------------------------------------

_CAST = {"uint64": "np.uint64", "int64": "np.int64", "uint32": "np.uint32", "int32": "np.int32"}


def _caller(name: str, signature: tuple[str, ...], slot_expr: str, notfound: int, ns: dict) -> object:
    args = [f"a{i}" for i in range(len(signature))]
    cast = "".join(f"{_CAST[t]}({a}), " for t, a in zip(signature, args, strict=True))
    src = (f"def {name}(ctx{''.join(', ' + a for a in args)}):\n"
           f"    fn = {slot_expr}\n"
           f"    if fn == 0:\n"
           f"        return np.int32({notfound})\n"
           f"    return call_i32(fn, ({cast}))\n")
    exec(compile(src, f"<pyvgpu.jit.runtime.context {name}>", "exec"), ns)
    return njit(ns[name])


def _namespace(title: str, items: list[tuple[str, tuple[str, ...], str, int]]) -> pytypes.ModuleType:
    ns = pytypes.ModuleType(f"{__name__}.{title}")
    glob = {"np": np, "call_i32": call_i32, "CTX": CTX}
    for name, sig, slot, notfound in items:
        setattr(ns, name, _caller(name, sig, slot, notfound, glob))
    return ns


HELPER = _namespace("HELPER", [(h.name, h.signature, f"CTX.get_helper(ctx, {i})", abi.NOT_FOUND[h.lib])
                               for i, h in enumerate(hooks.HELPERS)])
REAL = _namespace("REAL", [(e.abi, e.signature, f"CTX.get_real(ctx, {e.index})", abi.NOT_FOUND[e.hook.lib])
                           for e in hooks.ENTRIES])
# Entry indices by ABI name, for policies that tell variants apart (ENTRY.cuMemGetInfo_v2).
ENTRY = pytypes.ModuleType(f"{__name__}.ENTRY")
for _e in hooks.ENTRIES:
    setattr(ENTRY, _e.abi, _e.index)


@njit
def current_device(ctx):
    """The device of the calling thread's current context, or -1."""
    out = stack_u64()
    if HELPER.cuCtxGetDevice(ctx, out) != abi.CUDA_SUCCESS:
        return -1
    d = load_i32(out)
    return d if 0 <= d < L.MAX_DEVICES else -1


LAUNCH_DEV_ANY = np.uint32(0xFFFFFFFF)  # launch_dev: contexts on several devices, or one the hooks did not see


@njit
def note_context(ctx, dev):
    """A context was made on dev (cuDevicePrimaryCtxRetain, cuCtxCreate*): while every context of the process
    is on one device, its launches run there (``launch_device``)."""
    one = np.uint32(dev + 1) if 0 <= dev < L.MAX_DEVICES else LAUNCH_DEV_ANY
    while True:
        old = CTX.get_launch_dev(ctx)
        new = one if old == 0 else (old if old == one else LAUNCH_DEV_ANY)
        if new == old or CTX.cas_launch_dev(ctx, old, new) == old:
            return


CHECK_SHIFT = np.uint64(8)  # launch_device asks the driver anyway where the launch clock's bits 8-15 are 0


@njit(inline="always")
def launch_device(ctx, now):
    """The device a launch of this thread runs on, or -1. A process that made contexts on one device only
    launches there, and is not asked: the call is the dearest of a launch under a share on a GPU. About one
    launch in 256 asks anyway, picked by the launch clock ``now`` (ns), whose low bits follow no launch
    pattern (a launch count's do: a thread alternating two devices would be checked on one only), and a
    disagreement (a context made by a call the hooks do not cover, a green context say) ends the assumption
    for good. A process with no context seen asks at every launch, unless it sees one device."""
    d = np.int64(CTX.get_launch_dev(ctx))
    if likely(1 <= d <= L.MAX_DEVICES):
        if likely(((np.uint64(now) >> CHECK_SHIFT) & np.uint64(255)) != 0):
            return d - 1
        return checked_device(ctx, d - 1)
    return asked_device(ctx, d)


@njit
def asked_device(ctx, d):
    """``launch_device`` off its usual path (``launch_dev`` d is 0 or ANY): the driver's device. At the first
    launch with no context seen, a process that sees one device takes device 0 from then on."""
    if d == 0:
        out = stack_u64()
        one = REAL.cuDeviceGetCount(ctx, out) == abi.CUDA_SUCCESS and load_i32(out) == 1
        CTX.cas_launch_dev(ctx, np.uint32(0), np.uint32(1) if one else LAUNCH_DEV_ANY)
        if one:
            return np.int64(0)
    return np.int64(current_device(ctx))


@njit
def checked_device(ctx, dev):
    """The driver's device for this launch, which ``launch_device`` took to be dev; if it is another, every
    later launch asks (the launches since the last check were counted on dev)."""
    d = np.int64(current_device(ctx))
    if d != dev:
        CTX.set_launch_dev(ctx, LAUNCH_DEV_ANY)
    return d
