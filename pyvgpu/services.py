"""Calling the callbacks' services from Python tools (status, top, the exporter).

The services are the same compiled code the shim runs (pyvgpu/jit/callbacks.py),
so a tool that reclaims a dead process's quota does it exactly as a member
process would, with the same atomics on the same region. Their ctypes
prototypes come from the hook table (``pyvgpu.hooks.SERVICES``).
"""

from __future__ import annotations

import ctypes
import functools

from pyvgpu import hooks
from pyvgpu import layout as L
from pyvgpu.region import Region

_CTYPES = {"int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64}


def prototype(service: hooks.Service) -> type:
    """The ctypes function type of a service, as the table declares it."""
    return ctypes.CFUNCTYPE(_CTYPES[hooks.numba_type_name(service.ret)], *(_CTYPES[t] for t in service.signature))


@functools.cache
def _library():
    """The callback library (kept loaded: the services' code lives in it)."""
    from pathlib import Path

    from pyvgpu import cache, cblib

    return cblib.load(Path(cache.ensure()["library"]))


def _services() -> dict[str, ctypes._CFuncPtr]:
    addrs = _library().services
    return {s.name: prototype(s)(addrs[s.name]) for s in hooks.SERVICES}


def _ctx(r: Region) -> ctypes.Structure:
    """A context for a process that is not a member: the region mapped, no slot of its own."""
    ctx = L.CTX.ctypes_class()()
    ctx.magic = L.CTX_MAGIC
    ctx.region = r.address
    ctx.region_fd = r.fd
    ctx.slot_index = -1
    ctx.n_slots = r.header.n_slots
    return ctx


def reclaim(r: Region) -> int:
    """Free the slots of the group's dead processes; the bytes given back."""
    ctx = _ctx(r)
    return _services()["svc_reclaim"](ctypes.addressof(ctx))
