"""Binary structs declared once, rendered for every reader.

A :class:`Struct` is a list of :class:`Field` at natural alignment. From it
come the C struct (with offset checks) for the shim, a ctypes class for
Python readers, and, in ``pyvgpu/jit/fields.py``, typed loads and stores for
the numba callbacks. Nobody writes an offset by hand.

``pyvgpu/layout.py`` declares pyvgpu's own structs (the per-process context,
the region, the turn file); ``pyvgpu/abi.py`` the parts of the driver's
structs that the policies read.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

# type name -> (bytes, C spelling, ctypes type)
SCALARS = {
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
    type: str  # a key of SCALARS
    count: int = 1  # > 1: an array
    doc: str = ""

    @property
    def elem_size(self) -> int:
        return SCALARS[self.type][0]

    @property
    def size(self) -> int:
        return self.elem_size * self.count


class Struct:
    """Fields at natural alignment, total size a multiple of ``align``."""

    def __init__(self, name: str, fields: list[Field], align: int = 8, doc: str = "") -> None:
        self.name = name
        self.fields = tuple(fields)
        self.doc = doc
        self.offsets: dict[str, int] = {}
        off = 0
        for f in self.fields:
            if f.type not in SCALARS:
                raise ValueError(f"struct {name}: field {f.name} has unknown type {f.type!r}")
            if f.name in self.offsets:
                raise ValueError(f"struct {name}: field {f.name} declared twice")
            off = (off + f.elem_size - 1) // f.elem_size * f.elem_size
            self.offsets[f.name] = off
            off += f.size
        self.size = (off + align - 1) // align * align

    def offset(self, name: str) -> int:
        return self.offsets[name]

    def c_struct(self) -> str:
        """The C typedef ``<name>_t``, padded to the same offsets, with a static check of each."""
        lines = [f"/* {self.doc} */"] if self.doc else []
        lines.append(f"typedef struct {self.name} {{")
        pos = 0
        pad = 0
        for f in self.fields:
            off = self.offsets[f.name]
            if off > pos:
                lines.append(f"    uint8_t _pad{pad}[{off - pos}];")
                pad += 1
            arr = f"[{f.count}]" if f.count > 1 else ""
            comment = f"  /* {f.doc} */" if f.doc else ""
            lines.append(f"    {SCALARS[f.type][1]} {f.name}{arr};{comment}")
            pos = off + f.size
        if self.size > pos:
            lines.append(f"    uint8_t _pad{pad}[{self.size - pos}];")
        lines.append(f"}} {self.name}_t;")
        for f in self.fields:
            lines.append(f"_Static_assert(offsetof({self.name}_t, {f.name}) == {self.offsets[f.name]}, "
                         f"\"{self.name}.{f.name}\");")
        lines.append(f"_Static_assert(sizeof({self.name}_t) == {self.size}, \"sizeof {self.name}\");")
        return "\n".join(lines)

    def ctypes_class(self) -> type[ctypes.Structure]:
        """A ctypes Structure with the same offsets (padding fields are named _pad<i> and _tail)."""
        fields = []
        pos = 0
        for i, f in enumerate(self.fields):
            off = self.offsets[f.name]
            if off > pos:
                fields.append((f"_pad{i}", ctypes.c_uint8 * (off - pos)))
            ct = SCALARS[f.type][2]
            fields.append((f.name, ct * f.count if f.count > 1 else ct))
            pos = off + f.size
        if self.size > pos:
            fields.append(("_tail", ctypes.c_uint8 * (self.size - pos)))
        return type(self.name, (ctypes.Structure,), {"_fields_": fields})
