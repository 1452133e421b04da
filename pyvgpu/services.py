"""Calling the callbacks' services from Python tools (status, limits, top, the exporter).

The services are the same compiled code the shim runs (pyvgpu/jit/callbacks.py),
so a tool that reclaims a dead process's quota or writes an event does it
exactly as a member process would, with the same atomics on the same region.
"""

from __future__ import annotations

import ctypes
import functools

from pyvgpu import layout as L
from pyvgpu.region import Region

_LOG = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64,
                        ctypes.c_uint64)
_RECLAIM = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)


@functools.cache
def _services() -> dict[str, int]:
    from pyvgpu import bootstrap, cache

    return bootstrap.load(cache.ensure())[1]


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
    return _RECLAIM(_services()["svc_reclaim"])(ctypes.addressof(ctx))


def log_event(r: Region, kind: int, device: int, a: int, b: int) -> None:
    """Append an event to the group's ring (pyvgpu/jit/events.py), as this process."""
    ctx = _ctx(r)
    _LOG(_services()["svc_log"])(ctypes.addressof(ctx), kind, device, a, b)
