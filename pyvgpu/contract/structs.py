"""Binary structs declared once, rendered for every reader.

A :class:`Struct` is a list of :class:`Field` at natural alignment (or the
alignment a field asks for), and of :class:`Record` arrays. From it
come the C struct (with offset checks) for the shim, a ctypes class for
Python readers, and, in ``pyvgpu/jit/runtime/fields.py``, typed loads and stores for
the numba callbacks. Nobody writes an offset by hand.

``pyvgpu/contract/layout.py`` declares pyvgpu's own structs (the per-process context,
the region, the turn file); ``pyvgpu/contract/abi.py`` the parts of the driver's
structs that the policies read.
"""

from __future__ import annotations

import ctypes

from pyvgpu.contract.record import record

# type name -> (bytes, C spelling, ctypes type)
SCALARS = {
    "u8": (1, "uint8_t", ctypes.c_uint8),
    "u16": (2, "uint16_t", ctypes.c_uint16),
    "u32": (4, "uint32_t", ctypes.c_uint32),
    "i32": (4, "int32_t", ctypes.c_int32),
    "u64": (8, "uint64_t", ctypes.c_uint64),
    "i64": (8, "int64_t", ctypes.c_int64),
}


@record(frozen=True)
class Field:
    name: str
    type: str  # a key of SCALARS
    count: int = 1  # > 1: an array
    doc: str = ""
    align: int = 0  # its offset is a multiple of this (0: its element size); 64 starts a cache line

    @property
    def elem_size(self) -> int:
        return SCALARS[self.type][0]

    @property
    def size(self) -> int:
        return self.elem_size * self.count


@record(frozen=True)
class Record:
    """``count`` records of ``fields`` side by side: element i of each field lies in record i.

    A Field array keeps each field's elements together (a struct of arrays); a Record keeps each index's
    fields together (an array of structs), so that what one launch reads of one device, or of one kernel,
    shares a cache line. Its fields are declared with count 1 and read as arrays of ``count`` all the
    same (``CTX.get_turn_qend(ctx, dev)``); only the stride differs. ``size`` pads a record (64: a cache
    line each); records of 16, 32 or 64 bytes start at a multiple of their size, so none straddles a line."""

    name: str
    count: int
    fields: tuple[Field, ...]
    size: int = 0  # bytes per record; 0: its fields' size, naturally aligned
    doc: str = ""


def _align(off: int, to: int) -> int:
    return (off + to - 1) // to * to


class Struct:
    """Fields at natural alignment, total size a multiple of ``align``."""

    def __init__(self, name: str, fields: list[Field | Record], align: int = 8, doc: str = "") -> None:
        self.name = name
        self.items = tuple(fields)  # as declared: fields and records
        self.doc = doc
        self.offsets: dict[str, int] = {}
        self.strides: dict[str, int] = {}  # bytes from one element of a field to the next
        self.record_of: dict[str, Record] = {}
        self.record_offsets: dict[str, int] = {}
        self.record_sizes: dict[str, int] = {}
        flat: list[Field] = []

        def place(f: Field, off: int) -> int:
            if f.type not in SCALARS:
                raise ValueError(f"struct {name}: field {f.name} has unknown type {f.type!r}")
            if f.name in self.offsets:
                raise ValueError(f"struct {name}: field {f.name} declared twice")
            return _align(off, max(f.elem_size, f.align))

        off = 0
        for item in self.items:
            if isinstance(item, Field):
                off = place(item, off)
                self.offsets[item.name] = off
                self.strides[item.name] = item.elem_size
                flat.append(item)
                off += item.size
                continue
            inner = 0
            inner_offs = []
            for f in item.fields:
                if f.count != 1:
                    raise ValueError(f"struct {name}: record {item.name}'s field {f.name} must have count 1")
                inner = place(f, inner)
                inner_offs.append(inner)
                inner += f.elem_size
            widest = max(f.elem_size for f in item.fields)
            size = item.size or _align(inner, widest)
            if size < inner or size % widest:
                raise ValueError(f"struct {name}: record {item.name} needs {inner} bytes, size {size} given")
            off = _align(off, max(widest, size if size in (16, 32, 64) else widest))
            self.record_offsets[item.name] = off
            self.record_sizes[item.name] = size
            for f, o in zip(item.fields, inner_offs, strict=True):
                place(f, 0)  # checks the name
                self.offsets[f.name] = off + o
                self.strides[f.name] = size
                self.record_of[f.name] = item
                flat.append(Field(f.name, f.type, item.count, f.doc))
            off += size * item.count
        self.fields = tuple(flat)  # every field, a record's as arrays of its count
        # A field that asks for a cache line asks it of the whole struct: C aligns it so (c_struct).
        self.alignment = max([align, *(f.align for f in self.items if isinstance(f, Field)),
                              *(s for s in self.record_sizes.values() if s in (16, 32, 64))])
        self.size = _align(off, self.alignment)

    def offset(self, name: str) -> int:
        return self.offsets[name]

    def c_struct(self) -> str:
        """The C typedef ``<name>_t``, padded to the same offsets, with a static check of each."""
        lines = [f"/* {self.doc} */"] if self.doc else []
        aligned = f"__attribute__((aligned({self.alignment}))) " if self.alignment > 8 else ""
        lines.append(f"typedef struct {aligned}{self.name} {{")
        pos = 0
        pad = 0

        def member(f: Field, off: int, pos: int, indent: str) -> int:
            nonlocal pad
            if off > pos:
                lines.append(f"{indent}uint8_t _pad{pad}[{off - pos}];")
                pad += 1
            arr = f"[{f.count}]" if f.count > 1 else ""
            comment = f"  /* {f.doc} */" if f.doc else ""
            lines.append(f"{indent}{SCALARS[f.type][1]} {f.name}{arr};{comment}")
            return off + f.size

        for item in self.items:
            if isinstance(item, Field):
                pos = member(item, self.offsets[item.name], pos, "    ")
                continue
            base = self.record_offsets[item.name]
            if base > pos:
                lines.append(f"    uint8_t _pad{pad}[{base - pos}];")
                pad += 1
            lines.append("    struct {" + (f"  /* {item.doc} */" if item.doc else ""))
            inner = 0
            for f in item.fields:
                inner = member(f, self.offsets[f.name] - base, inner, "        ")
            size = self.record_sizes[item.name]
            if size > inner:
                lines.append(f"        uint8_t _pad{pad}[{size - inner}];")
                pad += 1
            lines.append(f"    }} {item.name}[{item.count}];")
            pos = base + size * item.count
        if self.size > pos:
            lines.append(f"    uint8_t _pad{pad}[{self.size - pos}];")
        lines.append(f"}} {self.name}_t;")
        for f in self.fields:
            rec = self.record_of.get(f.name)
            path = f"{rec.name}[0].{f.name}" if rec else f.name
            lines.append(f"_Static_assert(offsetof({self.name}_t, {path}) == {self.offsets[f.name]}, "
                         f"\"{self.name}.{f.name}\");")
        lines.append(f"_Static_assert(sizeof({self.name}_t) == {self.size}, \"sizeof {self.name}\");")
        return "\n".join(lines)

    def ctypes_class(self) -> type[ctypes.Structure]:
        """A ctypes Structure with the same offsets (padding fields are named _pad<i> and _tail); a record is
        an array of a Structure of its own, ``<struct>_<record>``."""
        fields = []
        pos = 0
        for i, item in enumerate(self.items):
            if isinstance(item, Field):
                off, size = self.offsets[item.name], item.size
                ct = SCALARS[item.type][2]
                member = (item.name, ct * item.count if item.count > 1 else ct)
            else:
                off, rsize = self.record_offsets[item.name], self.record_sizes[item.name]
                size = rsize * item.count
                inner = []
                ipos = 0
                for j, f in enumerate(item.fields):
                    o = self.offsets[f.name] - off
                    if o > ipos:
                        inner.append((f"_pad{j}", ctypes.c_uint8 * (o - ipos)))
                    inner.append((f.name, SCALARS[f.type][2]))
                    ipos = o + f.elem_size
                if rsize > ipos:
                    inner.append(("_tail", ctypes.c_uint8 * (rsize - ipos)))
                rec = type(f"{self.name}_{item.name}", (ctypes.Structure,), {"_fields_": inner})
                member = (item.name, rec * item.count)
            if off > pos:
                fields.append((f"_pad{i}", ctypes.c_uint8 * (off - pos)))
            fields.append(member)
            pos = off + size
        if self.size > pos:
            fields.append(("_tail", ctypes.c_uint8 * (self.size - pos)))
        return type(self.name, (ctypes.Structure,), {"_fields_": fields})

    def stride(self, name: str) -> int:
        """Bytes from one element of field ``name`` to the next (a record's size for a record's field)."""
        return self.strides[name]
