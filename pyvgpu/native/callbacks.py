"""Build the numba cfuncs the shim calls: one per (policy, library, signature), and the services.

Every hook callback has the C signature

    <CUresult|nvmlReturn_t> cb(pv_ctx_t *ctx, uint32 idx, <the hooked function's parameters>)

It counts the call in the context and hands the arguments, as a tuple, to
its policy (named by the hook table, found by pyvgpu/jit/policies.py). The
Python source of each callback is generated from the table (its arity
varies), then compiled by numba. The services' signatures come from the
table too (``pyvgpu.contract.hooks.SERVICES``), the same declaration the shim's C
typedefs are generated from; their bodies are named in ``_SERVICE_FUNCS``:
the watcher's work, the event log's writer (pyvgpu/jit/state/events.py) and VPMM's
entry points (pyvgpu/jit/vpmm/entries.py), compiled into the same library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cfunc, types

from pyvgpu.contract import abi, hooks
from pyvgpu.jit.compute import controller, cost
from pyvgpu.jit.policies import resolve
from pyvgpu.jit.runtime.context import count_call
from pyvgpu.jit.runtime.fields import CTX
from pyvgpu.jit.runtime.intrinsics import monotonic_ns
from pyvgpu.jit.state import events, quota
from pyvgpu.jit.vpmm import entries as vpmm_entries


@dataclass
class Callback:
    name: str  # stable name, also the key of the manifest
    entries: list[hooks.Entry]
    func: object  # the numba CFunc


def _source(nargs: int, notfound: int) -> str:
    names = [f"a{i}" for i in range(nargs)]
    params = "".join(f", {n}" for n in names)
    tup = "(" + "".join(f"{n}, " for n in names) + ")"
    return (
        f"def cb(ctx, idx{params}):\n"
        f"    count_call(ctx, idx)\n"
        f"    return policy(ctx, idx, {tup}, {notfound})\n"
    )


def numba_signature(ret: str, params: tuple[str, ...]):
    """A numba signature from numba type names (hooks.numba_type_name)."""
    return getattr(types, ret)(*(getattr(types, t) for t in params))


def groups() -> dict[str, list[hooks.Entry]]:
    """Callback name -> the entries it serves."""
    out: dict[str, list[hooks.Entry]] = {}
    for e in hooks.ENTRIES:
        if e.policy is None:
            continue
        name = f"{e.policy.replace('.', '_')}__{e.hook.lib}__{'_'.join(e.signature) or 'void'}"
        out.setdefault(name, []).append(e)
    return out


def build(only: set[str] | None = None) -> list[Callback]:
    """Compile the callbacks (all, or those named in ``only``); imports numba: the cold path only."""
    out = []
    for name, entries in groups().items():
        if only is not None and name not in only:
            continue
        e = entries[0]
        ns = {"count_call": count_call, "policy": resolve(e.policy)}
        exec(compile(_source(len(e.signature), abi.NOT_FOUND[e.hook.lib]), f"<pyvgpu callback {name}>", "exec"),
             ns)
        fn = ns["cb"]
        fn.__name__ = fn.__qualname__ = name
        sig = numba_signature(hooks.numba_type_name(e.hook.ret), ("uint64", "uint32", *e.signature))
        out.append(Callback(name, entries, cfunc(sig, nopython=True, error_model="numpy")(fn)))
    return out


# --- services: called outside any hooked function ---------------------------------------

def svc_claim(ctx):
    return quota.claim_slot(ctx)


def svc_tick(ctx):
    # The region, fcntl and NVML only: the watcher never calls the CUDA driver, so it is safe while
    # the driver tears down at exit. Pools are settled at their next call, launch timings on the
    # launching thread.
    if CTX.get_region(ctx) != 0:
        # the clock launches without a share compare the turn file's `active` with (pyvgpu/jit/compute/turn.py);
        # a timed launch is gated only while it is recent (pyvgpu/jit/compute/cost.py)
        now = monotonic_ns()
        CTX.store_turn_tick(ctx, np.uint64(now))
        cost.gate_watch(ctx, np.int64(now))  # first: a gate its launch left closed (the controller reads NVML)
        quota.reclaim_due(ctx)
        controller.control(ctx)
    return 0


def svc_reclaim(ctx):
    return quota.reclaim_dead(ctx)


def svc_log_event(region, kind, device, pid, a, b):
    events.record(region, kind, device, pid, a, b)


_SERVICE_FUNCS = {
    "svc_claim": svc_claim, "svc_tick": svc_tick, "svc_reclaim": svc_reclaim, "svc_log_event": svc_log_event,
    # the entry points' own bodies (they are @njit too: a GPU test calls them from numba code)
    "vpmm_malloc": vpmm_entries.entry_malloc.py_func, "vpmm_free": vpmm_entries.entry_free.py_func,
    "vpmm_trim": vpmm_entries.entry_trim.py_func, "vpmm_preallocate": vpmm_entries.entry_preallocate.py_func,
    "vpmm_record_stream": vpmm_entries.entry_record_stream.py_func,
    "vpmm_capture": vpmm_entries.entry_capture.py_func,
}
# Services compiled together in one process: they share most of their code (VPMM's allocator), which numba
# then compiles once (pyvgpu/native/aot.py keeps a unit in one part).
UNITS = ([n for n in _SERVICE_FUNCS if n.startswith("vpmm_")],)


def build_services(only: set[str] | None = None) -> list[Callback]:
    out = []
    for s in hooks.SERVICES:
        if only is not None and s.name not in only:
            continue
        sig = numba_signature(s.ret_numba, s.signature)
        out.append(Callback(s.name, [], cfunc(sig, nopython=True, error_model="numpy")(_SERVICE_FUNCS[s.name])))
    return out


def all_names() -> list[str]:
    return list(groups()) + [s.name for s in hooks.SERVICES]
