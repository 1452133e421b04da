"""llvmlite intrinsics the callbacks are built from.

Each intrinsic is a typing signature plus a few lines of IRBuilder code.
Addresses are plain integers (uint64): callbacks do their own address
arithmetic on the context and region pointers. Everything here is tested
on its own in tests/test_intrinsics.py, across threads and across
processes sharing an mmap.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_LL = {types.uint64: ir.IntType(64), types.int64: ir.IntType(64), types.uint32: ir.IntType(32),
       types.int32: ir.IntType(32), types.uint16: ir.IntType(16), types.uint8: ir.IntType(8)}


def _ptr(builder, addr, llty):
    return builder.inttoptr(addr, llty.as_pointer())


def _load(ty, atomic: bool):
    llty = _LL[ty]

    def impl(typingctx, addr):
        def codegen(context, builder, sig, args):
            p = _ptr(builder, args[0], llty)
            if atomic:
                return builder.load_atomic(p, "seq_cst", llty.width // 8, typ=llty)
            return builder.load(p, typ=llty)

        return ty(types.uint64), codegen

    return intrinsic(impl)


def _store(ty, atomic: bool):
    llty = _LL[ty]

    def impl(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[1], sig.args[1], ty)
            p = _ptr(builder, args[0], llty)
            if atomic:
                builder.store_atomic(v, p, "seq_cst", llty.width // 8)
            else:
                builder.store(v, p)
            return context.get_dummy_value()

        return types.void(types.uint64, value), codegen

    return intrinsic(impl)


def _rmw(ty, op: str):
    llty = _LL[ty]

    def impl(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[1], sig.args[1], ty)
            return builder.atomic_rmw(op, _ptr(builder, args[0], llty), v, "seq_cst")

        return ty(types.uint64, value), codegen

    return intrinsic(impl)


def _cas(ty):
    llty = _LL[ty]

    def impl(typingctx, addr, expected, new):
        def codegen(context, builder, sig, args):
            exp = context.cast(builder, args[1], sig.args[1], ty)
            new = context.cast(builder, args[2], sig.args[2], ty)
            pair = builder.cmpxchg(_ptr(builder, args[0], llty), exp, new, "seq_cst", "seq_cst")
            return builder.extract_value(pair, 0)

        return ty(types.uint64, expected, new), codegen

    return intrinsic(impl)


# Plain and atomic (sequentially consistent) loads and stores, one of each per integer type:
# LOAD[ty], STORE[ty], ATOMIC_LOAD[ty], ATOMIC_STORE[ty] (pyvgpu/jit/runtime/fields.py builds on these).
LOAD = {ty: _load(ty, atomic=False) for ty in _LL}
STORE = {ty: _store(ty, atomic=False) for ty in _LL}
ATOMIC_LOAD = {ty: _load(ty, atomic=True) for ty in _LL}
ATOMIC_STORE = {ty: _store(ty, atomic=True) for ty in _LL}
load_u64, load_u32, load_i32, load_u8 = (LOAD[t] for t in (types.uint64, types.uint32, types.int32, types.uint8))
store_u64, store_u32, store_i32 = (STORE[t] for t in (types.uint64, types.uint32, types.int32))
atomic_load_u64, atomic_load_u32 = ATOMIC_LOAD[types.uint64], ATOMIC_LOAD[types.uint32]
atomic_store_u64, atomic_store_u32 = ATOMIC_STORE[types.uint64], ATOMIC_STORE[types.uint32]


@intrinsic
def load_f32(typingctx, addr):
    """The float at ``addr`` (out-parameters such as cuEventElapsedTime's milliseconds)."""

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(builder, args[0], ir.FloatType()), typ=ir.FloatType())

    return types.float32(types.uint64), codegen


# Read-modify-write, per integer type of 32 and 64 bits: each returns the value before the operation.
RMW_OPS = ("add", "sub", "xchg", "umax", "max")
ATOMIC_RMW = {(ty, op): _rmw(ty, op) for ty in _LL if _LL[ty].width >= 32 for op in RMW_OPS}
# Compare-and-swap: returns the old value; it succeeded iff old == expected.
ATOMIC_CAS = {ty: _cas(ty) for ty in _LL if _LL[ty].width >= 32}
atomic_add_u64, atomic_sub_u64 = ATOMIC_RMW[types.uint64, "add"], ATOMIC_RMW[types.uint64, "sub"]
atomic_xchg_u64, atomic_max_u64 = ATOMIC_RMW[types.uint64, "xchg"], ATOMIC_RMW[types.uint64, "umax"]
atomic_add_u32 = ATOMIC_RMW[types.uint32, "add"]
atomic_cas_u64, atomic_cas_u32 = ATOMIC_CAS[types.uint64], ATOMIC_CAS[types.uint32]


@intrinsic
def call_i32(typingctx, fnptr, args):
    """Call the C function at address ``fnptr`` with the tuple ``args``; it returns int32.

    The LLVM function type is derived from the tuple's element types, so
    one intrinsic serves every driver signature (all return CUresult or
    nvmlReturn_t).
    """
    if not isinstance(args, types.BaseTuple) or not isinstance(fnptr, types.Integer):
        return None

    def codegen(context, builder, sig, llargs):
        fp, tup = llargs
        vals = [builder.extract_value(tup, i) for i in range(len(sig.args[1]))]
        fnty = ir.FunctionType(ir.IntType(32), [v.type for v in vals])
        return builder.call(builder.inttoptr(fp, fnty.as_pointer()), vals)

    return types.int32(fnptr, args), codegen


@intrinsic
def get_errno(typingctx):
    """errno of the calling thread (via __errno_location; ctypes' copy stays 0)."""

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(32).as_pointer(), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "__errno_location")
        return builder.load(builder.call(fn, []), typ=ir.IntType(32))

    return types.int32(), codegen


def _libc(name: str, restype, fixed: tuple, variadic: bool = False):
    """Codegen calling libc's ``name`` (declared variadic where C declares it so)."""

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(context.get_value_type(restype), [context.get_value_type(t) for t in fixed],
                               var_arg=variadic)
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), list(args))

    return codegen


@intrinsic
def getpid(typingctx):
    return types.int32(), _libc("getpid", types.int32, ())


@intrinsic
def close(typingctx, fd):
    return types.int32(types.int32), _libc("close", types.int32, (types.int32,))


@intrinsic
def i64_ptr(typingctx, addr):
    """An address as an int64 pointer, so ``numba.carray`` can view memory owned elsewhere as an array."""

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())

    return types.CPointer(types.int64)(types.uint64), codegen


@intrinsic
def write_fd(typingctx, fd, addr, n):
    """write(fd, addr, n): how a callback reports to stderr (the text is prepared by Python in the ctx)."""
    return types.int64(types.int32, types.uint64, types.uint64), _libc("write", types.int64,
                                                                       (types.int32, types.uint64, types.uint64))


@intrinsic
def fcntl(typingctx, fd, cmd, arg):
    """fcntl(fd, cmd, arg): variadic in C, so the third argument follows the varargs convention."""
    return types.int32(types.int32, types.int32, types.uint64), _libc("fcntl", types.int32,
                                                                       (types.int32, types.int32), variadic=True)


@intrinsic
def stack_u64(typingctx):
    """Address of a zeroed 8-byte slot in the calling function's frame (an out-parameter)."""

    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, ir.IntType(64))
        builder.store(ir.Constant(ir.IntType(64), 0), slot)
        return builder.ptrtoint(slot, ir.IntType(64))

    return types.uint64(), codegen


@intrinsic
def stack_buffer(typingctx, nbytes):
    """Address of a zeroed buffer of ``nbytes`` (a literal) in the calling function's frame."""
    if not isinstance(nbytes, types.IntegerLiteral):
        return None
    n = nbytes.literal_value

    def codegen(context, builder, sig, args):
        arr = ir.ArrayType(ir.IntType(8), n)
        buf = cgutils.alloca_once(builder, arr)
        builder.store(ir.Constant(arr, None), buf)
        return builder.ptrtoint(buf, ir.IntType(64))

    return types.uint64(nbytes), codegen


# fcntl commands and lock types (Linux, <fcntl.h>)
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
F_RDLCK, F_WRLCK, F_UNLCK = 0, 1, 2


@intrinsic
def ofd_lock(typingctx, fd, cmd, ltype, start, length):
    """fcntl(fd, cmd, &struct flock{ltype, SEEK_SET, start, length}) for open-file-description locks.

    Returns -errno on failure; for F_OFD_GETLK the l_type found (F_UNLCK: no
    conflicting lock); else 0.
    """
    sig = types.int32(types.int32, types.int32, types.int32, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        fd_, cmd_, lt, st, ln = args
        arr = ir.ArrayType(i8, 32)  # struct flock on LP64 Linux
        buf = cgutils.alloca_once(builder, arr)
        builder.store(ir.Constant(arr, None), buf)
        base = builder.ptrtoint(buf, i64)

        def field(off, ty):
            return builder.inttoptr(builder.add(base, ir.Constant(i64, off)), ty.as_pointer())

        builder.store(builder.trunc(lt, i16), field(0, i16))  # l_type
        builder.store(builder.trunc(st, i64), field(8, i64))  # l_start (l_whence 0 = SEEK_SET)
        builder.store(ln, field(16, i64))  # l_len; l_pid stays 0, as OFD locks require
        fnty = ir.FunctionType(i32, [i32, i32], var_arg=True)
        fcntl_fn = cgutils.get_or_insert_function(builder.module, fnty, "fcntl")
        rc = builder.call(fcntl_fn, [fd_, cmd_, builder.bitcast(buf, ir.IntType(8).as_pointer())])
        errno_fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32.as_pointer(), []),
                                                  "__errno_location")
        failed = builder.icmp_signed("<", rc, ir.Constant(i32, 0))
        with builder.if_else(failed) as (then, otherwise):
            with then:
                err = builder.neg(builder.load(builder.call(errno_fn, []), typ=i32))
                bb_fail = builder.block
            with otherwise:
                found = builder.sext(builder.load(field(0, i16), typ=i16), i32)
                ok = builder.select(builder.icmp_signed("==", cmd_, ir.Constant(i32, F_OFD_GETLK)), found,
                                    ir.Constant(i32, 0))
                bb_ok = builder.block
        out = builder.phi(i32)
        out.add_incoming(err, bb_fail)
        out.add_incoming(ok, bb_ok)
        return out

    return sig, codegen


def _clock_codegen(clock_id: int):
    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        ts = cgutils.alloca_once(builder, ir.ArrayType(i64, 2))
        fnty = ir.FunctionType(i32, [i32, ir.IntType(8).as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        builder.call(fn, [ir.Constant(i32, clock_id), builder.bitcast(ts, ir.IntType(8).as_pointer())])
        base = builder.ptrtoint(ts, i64)
        sec = builder.load(builder.inttoptr(base, i64.as_pointer()), typ=i64)
        nsec = builder.load(builder.inttoptr(builder.add(base, ir.Constant(i64, 8)), i64.as_pointer()), typ=i64)
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return codegen


@intrinsic
def realtime_ns(typingctx):
    """CLOCK_REALTIME in nanoseconds (for records people read; not on any per-call path)."""
    return types.int64(), _clock_codegen(0)


@intrinsic
def monotonic_ns(typingctx):
    """CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine (the limiter's)."""
    return types.int64(), _clock_codegen(1)


@intrinsic
def read_tsc(typingctx):
    """The CPU's time-stamp counter (x86-64 ``rdtsc``; not ordered with the loads around it: a clock, not a
    fence). Only pyvgpu/jit/runtime/clock.py reads it, and only where the shim found the TSC usable."""

    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
        return builder.call(fn, [])

    return types.uint64(), codegen


def _expect(value: int):
    def make(typingctx, cond):
        if not isinstance(cond, types.Boolean):
            return None

        def codegen(context, builder, sig, args):
            i1 = ir.IntType(1)
            fn = builder.module.declare_intrinsic("llvm.expect.i1", fnty=ir.FunctionType(i1, [i1, i1]))
            return builder.call(fn, [args[0], ir.Constant(i1, value)])

        return types.boolean(cond), codegen

    return make


# Branch hints: ``if unlikely(c):`` is ``if c:``, and tells LLVM which way the branch usually goes, so that it
# lays the usual path out as one straight run and moves the rest after it: the launch path (launch.py) runs
# between two driver calls, and each code line it jumps to is one more to fetch (docs/compute.md, "What a
# launch under a share costs").
likely = intrinsic(_expect(1))
likely.__doc__ = "``cond``, which is usually True (a branch hint; see ``unlikely``)."
unlikely = intrinsic(_expect(0))
unlikely.__doc__ = "``cond``, which is usually False: LLVM moves the branch's block off the straight path."


@intrinsic
def sleep_ns(typingctx, ns):
    """nanosleep for ``ns`` nanoseconds (int64); an interrupted sleep just returns early."""

    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        n = context.cast(builder, args[0], sig.args[0], types.int64)
        ts = cgutils.alloca_once(builder, ir.ArrayType(i64, 2))
        base = builder.ptrtoint(ts, i64)
        billion = ir.Constant(i64, 1_000_000_000)
        builder.store(builder.sdiv(n, billion), builder.inttoptr(base, i64.as_pointer()))
        builder.store(builder.srem(n, billion), builder.inttoptr(builder.add(base, ir.Constant(i64, 8)),
                                                                 i64.as_pointer()))
        p8 = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [p8, p8]), "nanosleep")
        builder.call(fn, [builder.bitcast(ts, p8), ir.Constant(p8, None)])
        return context.get_dummy_value()

    return types.void(ns), codegen


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(): let the holder of a short spinlock run."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


# futex(2) on a word of a shared mapping (no FUTEX_PRIVATE_FLAG: the waiters are other processes)
FUTEX_WAIT, FUTEX_WAKE = 0, 1
SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221}.get(platform.machine(), 202)


@intrinsic
def futex_wait(typingctx, addr, expected, timeout_ns):
    """Sleep until the u32 at addr is woken (futex_wake), no longer holds ``expected``, or timeout_ns passes.
    Returns syscall's result (0, or -1 with errno EAGAIN/ETIMEDOUT/EINTR: every outcome means look again)."""
    sig = types.int64(types.uint64, types.uint32, types.int64)

    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        a, val, n = args
        ts = cgutils.alloca_once(builder, ir.ArrayType(i64, 2))
        base = builder.ptrtoint(ts, i64)
        billion = ir.Constant(i64, 1_000_000_000)
        builder.store(builder.sdiv(n, billion), builder.inttoptr(base, i64.as_pointer()))
        builder.store(builder.srem(n, billion), builder.inttoptr(builder.add(base, ir.Constant(i64, 8)),
                                                                 i64.as_pointer()))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
        return builder.call(fn, [ir.Constant(i64, SYS_FUTEX), a, ir.Constant(i32, FUTEX_WAIT),
                                 builder.zext(val, i64), base, ir.Constant(i64, 0), ir.Constant(i64, 0)])

    return sig, codegen


@intrinsic
def futex_wake(typingctx, addr):
    """Wake every process sleeping in futex_wait on the u32 at addr."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
        return builder.call(fn, [ir.Constant(i64, SYS_FUTEX), args[0], ir.Constant(i32, FUTEX_WAKE),
                                 ir.Constant(i32, 0x7FFFFFFF), ir.Constant(i64, 0), ir.Constant(i64, 0),
                                 ir.Constant(i64, 0)])

    return sig, codegen
