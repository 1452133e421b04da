"""Binary layouts shared by C, numba callbacks and Python readers.

A layout is declared once here as a :class:`Struct`. From it come the C
struct in ``shim/generated/pv_layout.h`` (with offset checks), the byte
offsets the callbacks use, and a ctypes class for Python readers. Nobody
writes an offset by hand.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from pyvgpu import hooks

_SCALARS = {
    "u8": (1, "uint8_t", ctypes.c_uint8),
    "u16": (2, "uint16_t", ctypes.c_uint16),
    "u32": (4, "uint32_t", ctypes.c_uint32),
    "i32": (4, "int32_t", ctypes.c_int32),
    "u64": (8, "uint64_t", ctypes.c_uint64),
    "i64": (8, "int64_t", ctypes.c_int64),
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a key of _SCALARS
    count: int = 1  # > 1: an array
    doc: str = ""

    @property
    def size(self) -> int:
        return _SCALARS[self.type][0] * self.count

    @property
    def align(self) -> int:
        return _SCALARS[self.type][0]


class Struct:
    """Fields at natural alignment, total size a multiple of ``align``."""

    def __init__(self, name: str, fields: list[Field], align: int = 8, doc: str = "") -> None:
        self.name = name
        self.fields = tuple(fields)
        self.doc = doc
        self.offsets: dict[str, int] = {}
        off = 0
        for f in self.fields:
            if f.type not in _SCALARS:
                raise ValueError(f"layout {name}: field {f.name} has unknown type {f.type!r}")
            off = (off + f.align - 1) // f.align * f.align
            self.offsets[f.name] = off
            off += f.size
        self.size = (off + align - 1) // align * align

    def offset(self, name: str) -> int:
        return self.offsets[name]

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def c_struct(self) -> str:
        lines = [f"/* {self.doc} */" if self.doc else "", f"typedef struct {self.name} {{"]
        pos = 0
        pad = 0
        for f in self.fields:
            off = self.offsets[f.name]
            if off > pos:
                lines.append(f"    uint8_t _pad{pad}[{off - pos}];")
                pad += 1
            ctype = _SCALARS[f.type][1]
            arr = f"[{f.count}]" if f.count > 1 else ""
            comment = f"  /* {f.doc} */" if f.doc else ""
            lines.append(f"    {ctype} {f.name}{arr};{comment}")
            pos = off + f.size
        if self.size > pos:
            lines.append(f"    uint8_t _pad{pad}[{self.size - pos}];")
        lines.append(f"}} {self.name}_t;")
        for f in self.fields:
            lines.append(
                f"_Static_assert(offsetof({self.name}_t, {f.name}) == {self.offsets[f.name]}, "
                f"\"{self.name}.{f.name}\");"
            )
        lines.append(f"_Static_assert(sizeof({self.name}_t) == {self.size}, \"sizeof {self.name}\");")
        return "\n".join(x for x in lines if x != "" or False)

    def ctypes_class(self) -> type[ctypes.Structure]:
        fields = []
        pos = 0
        for i, f in enumerate(self.fields):
            off = self.offsets[f.name]
            if off > pos:
                fields.append((f"_pad{i}", ctypes.c_uint8 * (off - pos)))
            ct = _SCALARS[f.type][2]
            fields.append((f.name, ct * f.count if f.count > 1 else ct))
            pos = off + f.size
        if self.size > pos:
            fields.append(("_tail", ctypes.c_uint8 * (self.size - pos)))
        return type(self.name, (ctypes.Structure,), {"_fields_": fields})


N_ENTRIES = len(hooks.ENTRIES)

CTX_MAGIC = int.from_bytes(b"PVCTX001", "little")

# The per-process context: what the shim hands every callback as its first
# argument. Per-process values live here, never as compile-time constants,
# so one compiled callback object serves every process.
CTX = Struct(
    "pv_ctx",
    [
        Field("magic", "u64", doc="CTX_MAGIC"),
        Field("n_entries", "u32", doc="hook entries in this shim"),
        Field("flags", "u32"),
        Field("real", "u64", N_ENTRIES, doc="real driver function per entry, 0 if the driver lacks it"),
        Field("calls", "u64", N_ENTRIES, doc="calls per entry, counted by the callbacks"),
    ],
    doc="per-process context passed to every callback (pyvgpu/layout.py)",
)

CTX_OFF_REAL = CTX.offset("real")
CTX_OFF_CALLS = CTX.offset("calls")
