"""Atomic operations on shared memory for Python tools (`limits set`, `status`).

The callbacks update a region with atomic instructions (pyvgpu/jit/intrinsics.py).
A Python tool that updates a shared word by read-modify-write at the same time
as they do (taking the next event index, a counter) must use the same
instructions, or a concurrent writer's update is lost. Plain stores of a whole
aligned word that only tools write (a limit set by `limits set`) are atomic on
x86-64 and aarch64 as they are. Python has no atomics on raw memory, so a handful of tiny
functions are compiled here with llvmlite (already a dependency) the first time
a tool needs them: a few milliseconds, no numba, no compiled callbacks.
"""

from __future__ import annotations

import ctypes
import functools

_OPS = ("fetch_add", "load", "store", "cas")


@functools.cache
def _functions() -> dict[str, ctypes._CFuncPtr]:
    import llvmlite.binding as llvm
    from llvmlite import ir

    try:
        llvm.initialize()  # required by llvmlite < 0.45, an error in later versions
    except Exception:
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    i64 = ir.IntType(64)
    mod = ir.Module("pyvgpu_atomics")
    protos = {}
    for width in (32, 64):
        it = ir.IntType(width)
        for op in _OPS:
            args = {"fetch_add": [i64, it], "load": [i64], "store": [i64, it], "cas": [i64, it, it]}[op]
            ret = ir.VoidType() if op == "store" else it
            fn = ir.Function(mod, ir.FunctionType(ret, args), f"{op}_u{width}")
            b = ir.IRBuilder(fn.append_basic_block())
            p = b.inttoptr(fn.args[0], it.as_pointer())
            if op == "fetch_add":
                b.ret(b.atomic_rmw("add", p, fn.args[1], "seq_cst"))
            elif op == "load":
                b.ret(b.load_atomic(p, "seq_cst", width // 8, typ=it))
            elif op == "store":
                b.store_atomic(fn.args[1], p, "seq_cst", width // 8)
                b.ret_void()
            else:
                b.ret(b.extract_value(b.cmpxchg(p, fn.args[1], fn.args[2], "seq_cst", "seq_cst"), 0))
            ct = ctypes.c_uint32 if width == 32 else ctypes.c_uint64
            cargs = [ctypes.c_uint64] + [ct] * (len(args) - 1)
            protos[f"{op}_u{width}"] = ctypes.CFUNCTYPE(None if op == "store" else ct, *cargs)
    tm = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(mod)), tm)
    engine.finalize_object()
    out = {name: proto(engine.get_function_address(name)) for name, proto in protos.items()}
    out["_engine"] = engine  # keeps the code alive
    return out


def fetch_add_u64(addr: int, value: int) -> int:
    """*addr += value, atomically; the value before."""
    return _functions()["fetch_add_u64"](addr, value & 0xFFFFFFFFFFFFFFFF)


def load_u64(addr: int) -> int:
    return _functions()["load_u64"](addr)


def store_u64(addr: int, value: int) -> None:
    _functions()["store_u64"](addr, value & 0xFFFFFFFFFFFFFFFF)


def cas_u64(addr: int, expected: int, new: int) -> int:
    """Compare-and-swap; the old value (it succeeded iff that equals ``expected``)."""
    return _functions()["cas_u64"](addr, expected, new)


def fetch_add_u32(addr: int, value: int) -> int:
    return _functions()["fetch_add_u32"](addr, value & 0xFFFFFFFF)


def load_u32(addr: int) -> int:
    return _functions()["load_u32"](addr)


def store_u32(addr: int, value: int) -> None:
    _functions()["store_u32"](addr, value & 0xFFFFFFFF)


def cas_u32(addr: int, expected: int, new: int) -> int:
    return _functions()["cas_u32"](addr, expected, new)
