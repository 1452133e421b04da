"""Build the numba cfuncs the shim calls, one per (policy, signature, library).

Every callback has the C signature

    int32 cb(uint64 ctx, uint32 idx, <the hooked function's parameters>)

It counts the call in the context's stats block and hands the arguments,
as a tuple, to its policy. The Python source of each callback is generated
from the hook table (its arity varies), then compiled by numba.
"""

from __future__ import annotations

from dataclasses import dataclass

from numba import cfunc, types

from pyvgpu import hooks
from pyvgpu.jit.policies import count_call, registry

NOT_FOUND = {"cuda": 500, "nvml": 13}  # CUDA_ERROR_NOT_FOUND, NVML_ERROR_FUNCTION_NOT_FOUND


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


def signature_of(sig: tuple[str, ...]):
    return types.int32(types.uint64, types.uint32, *(getattr(types, t) for t in sig))


def groups() -> dict[str, list[hooks.Entry]]:
    """Callback name -> the entries it serves."""
    out: dict[str, list[hooks.Entry]] = {}
    for e in hooks.ENTRIES:
        if e.policy is None:
            continue
        name = f"{e.policy}__{e.hook.lib}__{'_'.join(e.signature) or 'void'}"
        out.setdefault(name, []).append(e)
    return out


def build(only: set[str] | None = None) -> list[Callback]:
    """Compile the callbacks (all, or those named in ``only``); imports numba: the cold path only."""
    out = []
    policies = registry()
    for name, entries in groups().items():
        if only is not None and name not in only:
            continue
        e = entries[0]
        policy = policies[e.policy]
        ns = {"count_call": count_call, "policy": policy}
        exec(compile(_source(len(e.signature), NOT_FOUND[e.hook.lib]), f"<pyvgpu callback {name}>", "exec"), ns)
        fn = ns["cb"]
        fn.__name__ = fn.__qualname__ = name
        compiled = cfunc(signature_of(e.signature), nopython=True, error_model="numpy")(fn)
        out.append(Callback(name, entries, compiled))
    return out


# Services: callbacks the shim and the Python side call outside any hooked
# function (slot claim after fork, the watcher's tick, the monitor's reclaim).
SERVICES = hooks.SERVICES


def build_services(only: set[str] | None = None) -> list[Callback]:
    from pyvgpu.jit import compute, events, quota

    def svc_claim(ctx):
        return quota.claim_slot(ctx)

    def svc_tick(ctx):
        # The region, fcntl and NVML only: the watcher never calls the CUDA
        # driver, so it is safe while the driver tears down at exit. Pools are
        # settled at their next call, launch timings on the launching thread.
        if quota.region_of(ctx) != 0:
            quota.reclaim_due(ctx)
            compute.control(ctx)
        return 0

    def svc_reclaim(ctx):
        return quota.reclaim_dead(ctx)

    def svc_log(ctx, kind, device, a, b):
        events.record(quota.region_of(ctx), kind, device, 0, a, b)
        return 0

    sigs = {"svc_claim": types.int32(types.uint64), "svc_tick": types.int32(types.uint64),
            "svc_reclaim": types.uint64(types.uint64),
            "svc_log": types.int32(types.uint64, types.uint32, types.int32, types.uint64, types.uint64)}
    fns = {"svc_claim": svc_claim, "svc_tick": svc_tick, "svc_reclaim": svc_reclaim, "svc_log": svc_log}
    return [Callback(n, [], cfunc(sigs[n], nopython=True, error_model="numpy")(fns[n])) for n in SERVICES
            if only is None or n in only]


def all_names() -> list[str]:
    return list(groups()) + list(SERVICES)
