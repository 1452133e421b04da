"""Typed accessors for every struct field, generated from the layouts.

For each struct of ``pyvgpu/contract/layout.py`` and ``pyvgpu/contract/abi.py`` there is one
namespace here (``CTX``, ``HDR``, ``DEV``, ...). For a field ``x`` of
type ``t`` it holds small ``@njit`` functions, each taking the struct's
base address (and, for an array field, an element index ``i``):

========================  =====================================================
``x_at(b[, i])``          the field's address
``get_x`` / ``set_x``     plain load / store of a ``t``
``load_x`` / ``store_x``  sequentially consistent atomic load / store
``add_x`` ``sub_x``       atomic fetch-add / fetch-sub (32- and 64-bit fields);
``xchg_x`` ``max_x``      each returns the value before
``cas_x(b[, i], o, n)``   compare-and-swap; returns the old value
========================  =====================================================

The offsets are compile-time constants, so ``HDR.load_sm_any(region)``
compiles to the same single load as hand-written address arithmetic; the
functions are inlined when aot.py optimises the linked callbacks.

Namespaces are module objects, which numba resolves like any module: a
callback writes ``DEV.cas_sm_tat(d, old, new)`` and nobody writes an offset.
Element and struct sizes are there too: ``SLOT.SIZE``, ``CTX.OFF_calls``.
"""

from __future__ import annotations

import types as pytypes

from numba import njit, types

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.contract.structs import Field, Struct
from pyvgpu.jit.runtime import intrinsics as I

_NUMBA = {"u8": types.uint8, "u16": types.uint16, "u32": types.uint32, "i32": types.int32,
          "u64": types.uint64, "i64": types.int64}


def _scalar(off: int, ty, f: Field, size: int) -> dict:
    """Accessors of a field that is one value."""
    load, store = I.LOAD[ty], I.STORE[ty]
    aload, astore = I.ATOMIC_LOAD[ty], I.ATOMIC_STORE[ty]
    out = {
        f"{f.name}_at": njit(lambda b: b + off),
        f"get_{f.name}": njit(lambda b: load(b + off)),
        f"set_{f.name}": njit(lambda b, v: store(b + off, v)),
        f"load_{f.name}": njit(lambda b: aload(b + off)),
        f"store_{f.name}": njit(lambda b, v: astore(b + off, v)),
    }
    if size >= 4:
        add, sub = I.ATOMIC_RMW[ty, "add"], I.ATOMIC_RMW[ty, "sub"]
        xchg = I.ATOMIC_RMW[ty, "xchg"]
        mx = I.ATOMIC_RMW[ty, "umax" if ty.signed is False else "max"]
        cas = I.ATOMIC_CAS[ty]
        out.update({
            f"add_{f.name}": njit(lambda b, v: add(b + off, v)),
            f"sub_{f.name}": njit(lambda b, v: sub(b + off, v)),
            f"xchg_{f.name}": njit(lambda b, v: xchg(b + off, v)),
            f"max_{f.name}": njit(lambda b, v: mx(b + off, v)),
            f"cas_{f.name}": njit(lambda b, old, new: cas(b + off, old, new)),
        })
    return out


def _array(off: int, ty, f: Field, size: int) -> dict:
    """Accessors of an array field: the element index follows the base address. ``size``: the stride,
    the element's size, or its record's (structs.Record)."""
    load, store = I.LOAD[ty], I.STORE[ty]
    aload, astore = I.ATOMIC_LOAD[ty], I.ATOMIC_STORE[ty]
    out = {
        f"{f.name}_at": njit(lambda b, i: b + off + i * size),
        f"get_{f.name}": njit(lambda b, i: load(b + off + i * size)),
        f"set_{f.name}": njit(lambda b, i, v: store(b + off + i * size, v)),
        f"load_{f.name}": njit(lambda b, i: aload(b + off + i * size)),
        f"store_{f.name}": njit(lambda b, i, v: astore(b + off + i * size, v)),
    }
    if f.elem_size >= 4:
        add, sub = I.ATOMIC_RMW[ty, "add"], I.ATOMIC_RMW[ty, "sub"]
        xchg = I.ATOMIC_RMW[ty, "xchg"]
        mx = I.ATOMIC_RMW[ty, "umax" if ty.signed is False else "max"]
        cas = I.ATOMIC_CAS[ty]
        out.update({
            f"add_{f.name}": njit(lambda b, i, v: add(b + off + i * size, v)),
            f"sub_{f.name}": njit(lambda b, i, v: sub(b + off + i * size, v)),
            f"xchg_{f.name}": njit(lambda b, i, v: xchg(b + off + i * size, v)),
            f"max_{f.name}": njit(lambda b, i, v: mx(b + off + i * size, v)),
            f"cas_{f.name}": njit(lambda b, i, old, new: cas(b + off + i * size, old, new)),
        })
    return out


def accessors(struct: Struct, name: str) -> pytypes.ModuleType:
    """The namespace of ``struct``'s accessors (see the module docstring)."""
    ns = pytypes.ModuleType(f"{__name__}.{name}", f"accessors of {struct.name} ({struct.doc or 'pyvgpu.contract.abi'})")
    ns.SIZE = struct.size
    for f in struct.fields:
        off = struct.offset(f.name)
        ty = _NUMBA[f.type]
        make = _array if f.count > 1 else _scalar
        for fn_name, fn in make(off, ty, f, struct.stride(f.name)).items():
            setattr(ns, fn_name, fn)
        setattr(ns, f"OFF_{f.name}", off)
        if f.count > 1:
            setattr(ns, f"N_{f.name}", f.count)
    return ns


# pyvgpu's own layouts
CTX = accessors(L.CTX, "CTX")  # the per-process context every callback gets
HDR = accessors(L.REGION_HEADER, "HDR")  # a group region's header
DEV = accessors(L.REGION_DEVICE, "DEV")  # its per-device records (REGION.device)
SLOT = accessors(L.REGION_SLOT, "SLOT")  # its per-process slots (REGION.slot)
EVENT = accessors(L.REGION_EVENT, "EVENT")  # its event ring (REGION.event)
SCHED = accessors(L.SCHED_HEADER, "SCHED")  # the turn file's header
TURN = accessors(L.SCHED_ENTRY, "TURN")  # its per-GPU turn entries (SCHED_AT.entry)
# the driver's structs, as far as the policies read them
LAUNCH_CONFIG = accessors(abi.LAUNCH_CONFIG, "LAUNCH_CONFIG")
LAUNCH_PARAMS = accessors(abi.LAUNCH_PARAMS, "LAUNCH_PARAMS")
MEM_PROP = accessors(abi.MEM_ALLOCATION_PROP, "MEM_PROP")
ARRAY_DESC = accessors(abi.ARRAY_DESCRIPTOR, "ARRAY_DESC")
ARRAY3D_DESC = accessors(abi.ARRAY3D_DESCRIPTOR, "ARRAY3D_DESC")
NVML_MEMORY = accessors(abi.NVML_MEMORY, "NVML_MEMORY")
NVML_MEMORY_V2 = accessors(abi.NVML_MEMORY_V2, "NVML_MEMORY_V2")
NVML_UTILIZATION = accessors(abi.NVML_UTILIZATION, "NVML_UTILIZATION")
NVML_SAMPLE = accessors(abi.NVML_SAMPLE, "NVML_SAMPLE")
NVML_PROCESS_INFO = accessors(abi.NVML_PROCESS_INFO, "NVML_PROCESS_INFO")
NVML_PROCESS_DETAIL_LIST = accessors(abi.NVML_PROCESS_DETAIL_LIST, "NVML_PROCESS_DETAIL_LIST")


# Where the records of a region and of the turn file are: base address -> record address.
def _records() -> pytypes.ModuleType:
    ns = pytypes.ModuleType(f"{__name__}.REGION", "addresses of a group region's records")
    dev_off, dev_size = L.REGION_DEVICES_OFF, L.REGION_DEVICE.size
    slot_off, slot_size = L.REGION_SLOTS_OFF, L.REGION_SLOT.size
    ev_off, ev_size, n_ev = L.REGION_EVENTS_OFF, L.REGION_EVENT.size, L.N_EVENTS
    ns.device = njit(lambda region, dev: region + dev_off + dev * dev_size)
    ns.slot = njit(lambda region, i: region + slot_off + i * slot_size)
    ns.event = njit(lambda region, i: region + ev_off + (i % n_ev) * ev_size)
    ns.SLOTS_OFF, ns.SLOT_SIZE = slot_off, slot_size
    return ns


def _sched_records() -> pytypes.ModuleType:
    ns = pytypes.ModuleType(f"{__name__}.SCHED_AT", "addresses of the turn file's entries")
    off, size = L.SCHED_ENTRIES_OFF, L.SCHED_ENTRY.size
    ns.entry = njit(lambda sched, i: sched + off + i * size)
    ns.N_ENTRIES = L.SCHED_ENTRIES
    return ns


REGION = _records()
SCHED_AT = _sched_records()
