"""Calling the callback library's services from Python: the tools (status, top, the exporter, `limits set`)
and VPMM's pools.

The services are the same compiled code the shim runs (pyvgpu/native/callbacks.py),
so a tool that reclaims a dead process's quota or logs an event does it exactly
as a member process would, with the same atomics on the same region, and a pool
calls the entry points PyTorch's allocator calls through the shim. Their ctypes
prototypes come from the hook table (``pyvgpu.contract.hooks.SERVICES``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Protocol

from pyvgpu.contract import hooks
from pyvgpu.contract import layout as L

_CTYPES = {"int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64,
           "void": None}
_U64 = 0xFFFFFFFFFFFFFFFF


def prototype(service: hooks.Service) -> type:
    """The ctypes function type of a service, as the table declares it."""
    return ctypes.CFUNCTYPE(_CTYPES[service.ret_numba], *(_CTYPES[t] for t in service.signature))


@functools.cache
def _library():
    """The callback library (kept loaded: the services' code lives in it)."""
    from pathlib import Path

    from pyvgpu.native import cache, cblib

    return cblib.load(Path(cache.ensure()["library"]))


def address(name: str) -> int:
    """Where the service ``name`` of the hook table is, in the callback library (it stays loaded)."""
    return _library().services[name]


@functools.cache
def functions() -> dict[str, ctypes._CFuncPtr]:
    """Every service as a ctypes function, by its name in the hook table."""
    return {s.name: prototype(s)(address(s.name)) for s in hooks.SERVICES}


class MappedRegion(Protocol):
    """A group region mapped into this process (pyvgpu.group.region.Region)."""

    @property
    def address(self) -> int: ...

    @property
    def fd(self) -> int: ...

    @property
    def header(self) -> ctypes.Structure: ...


def _ctx(r: MappedRegion) -> ctypes.Structure:
    """A context for a process that is not a member: the region mapped, no slot of its own."""
    ctx = L.CTX.ctypes_class()()
    ctx.magic = L.CTX_MAGIC
    ctx.region = r.address
    ctx.region_fd = r.fd
    ctx.slot_index = -1
    ctx.n_slots = r.header.n_slots
    return ctx


def reclaim(r: MappedRegion) -> int:
    """Free the slots of the group's dead processes; the bytes given back."""
    ctx = _ctx(r)
    return functions()["svc_reclaim"](ctypes.addressof(ctx))


def log_event(region: int, kind: int, device: int, a: int, b: int, pid: int = 0) -> None:
    """Append an event to the ring of the group region mapped at ``region`` (pid 0: this process), by the
    callbacks' own writer (pyvgpu/jit/state/events.py)."""
    functions()["svc_log_event"](region, kind, device, pid, a & _U64, b & _U64)
