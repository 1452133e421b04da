"""Each intrinsic on its own: exact under contention, across threads and processes."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

import numpy as np
from numba import carray, cfunc, types

from pyvgpu.jit.runtime import intrinsics as I

SIG_ADD = types.uint64(types.uint64, types.uint64)


@cfunc(SIG_ADD, nopython=True, error_model="numpy")
def add_many(addr, n):
    for _ in range(n):
        I.atomic_add_u64(addr, 1)
    return 0


@cfunc(types.uint64(types.uint64, types.uint64, types.uint64), nopython=True, error_model="numpy")
def reserve_many(addr, n, limit):
    """CAS loop: take 1 unit at a time while used + 1 <= limit; return how many were taken."""
    got = 0
    for _ in range(n):
        while True:
            cur = I.atomic_load_u64(addr)
            if cur + 1 > limit:
                return got
            if I.atomic_cas_u64(addr, cur, cur + 1) == cur:
                got += 1
                break
    return got


def _call(fn, restype, argtypes):
    return ctypes.CFUNCTYPE(restype, *argtypes)(fn.address)


def test_atomic_add_exact_across_threads():
    buf = np.zeros(1, dtype=np.uint64)
    f = _call(add_many, ctypes.c_uint64, [ctypes.c_uint64, ctypes.c_uint64])
    ts = [threading.Thread(target=f, args=(buf.ctypes.data, 200_000)) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert int(buf[0]) == 8 * 200_000


def test_cas_reservation_never_overshoots_across_threads():
    buf = np.zeros(1, dtype=np.uint64)
    f = _call(reserve_many, ctypes.c_uint64, [ctypes.c_uint64] * 3)
    got = []
    ts = [threading.Thread(target=lambda: got.append(f(buf.ctypes.data, 100_000, 250_001))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert int(buf[0]) == 250_001
    assert sum(got) == 250_001


def test_atomic_add_exact_across_processes_sharing_an_mmap(tmp_path):
    path = tmp_path / "shared"
    path.write_bytes(b"\0" * 4096)
    with open(path, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 4096)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        f = _call(add_many, ctypes.c_uint64, [ctypes.c_uint64, ctypes.c_uint64])
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                f(addr + 64, 100_000)
                os._exit(0)
            pids.append(pid)
        f(addr + 64, 100_000)
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
        assert int.from_bytes(m[64:72], "little") == 5 * 100_000


@cfunc(types.uint64(types.uint64), nopython=True, error_model="numpy")
def load_store_ops(addr):
    I.store_u64(addr, 5)
    I.atomic_store_u64(addr + 8, 7)
    old = I.atomic_xchg_u64(addr + 16, 9)
    I.atomic_max_u64(addr + 24, 3)
    I.atomic_sub_u64(addr + 32, 2)
    I.store_u32(addr + 40, 11)
    I.atomic_add_u32(addr + 40, 1)
    return I.load_u64(addr) + I.atomic_load_u64(addr + 8) + old


def test_loads_stores_and_rmw():
    buf = np.array([0, 0, 4, 10, 5, 0], dtype=np.uint64)
    r = _call(load_store_ops, ctypes.c_uint64, [ctypes.c_uint64])(buf.ctypes.data)
    assert r == 5 + 7 + 4
    assert list(buf[:5]) == [5, 7, 9, 10, 3]
    assert int(buf[5]) & 0xFFFFFFFF == 12


CB3 = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32)


@cfunc(types.int32(types.uint64, types.voidptr, types.uint64, types.int32), nopython=True, error_model="numpy")
def call_through(fn, a, b, c):
    return I.call_i32(fn, (a, b, c))


def test_call_i32_passes_every_argument():
    seen = []

    def target(a, b, c):
        seen.append((a, b, c))
        return -42

    cb = CB3(target)
    f = _call(call_through, ctypes.c_int32, [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32])
    assert f(ctypes.cast(cb, ctypes.c_void_p).value, 0x1234, 2**40 + 3, -7) == -42
    assert seen == [(0x1234, 2**40 + 3, -7)]


@cfunc(types.int32(types.int32), nopython=True, error_model="numpy")
def close_errno(fd):
    if I.close(fd) == -1:
        return I.get_errno()
    return 0


@cfunc(types.int32(types.int32), nopython=True, error_model="numpy")
def getfd(fd):
    return I.fcntl(fd, 1, 0)  # F_GETFD


def test_libc_calls_and_errno():
    assert _call(close_errno, ctypes.c_int32, [ctypes.c_int32])(-1) == 9  # EBADF
    r, w = os.pipe()
    try:
        os.set_inheritable(r, False)
        assert _call(getfd, ctypes.c_int32, [ctypes.c_int32])(r) == 1  # FD_CLOEXEC
    finally:
        os.close(r)
        os.close(w)


@cfunc(types.int32(), nopython=True, error_model="numpy")
def mypid():
    return I.getpid()


def test_getpid():
    assert _call(mypid, ctypes.c_int32, [])() == os.getpid()


@cfunc(types.int64(types.int32, types.uint64, types.uint64), nopython=True, error_model="numpy")
def write_some(fd, addr, n):
    return I.write_fd(fd, addr, n)


def test_write_fd_writes_the_bytes_given():
    r, w = os.pipe()
    try:
        text = ctypes.create_string_buffer(b"refused: device 3\n")
        assert _call(write_some, ctypes.c_int64, [ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64])(
            w, ctypes.addressof(text), 18) == 18
        assert os.read(r, 100) == b"refused: device 3\n"
        assert _call(write_some, ctypes.c_int64, [ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64])(
            -1, ctypes.addressof(text), 18) == -1
    finally:
        os.close(r)
        os.close(w)


@cfunc(types.int64(types.uint64, types.int64), nopython=True, error_model="numpy")
def sum_view(addr, n):
    a = carray(I.i64_ptr(addr), (n,))
    a[0] = 7  # a view, not a copy
    return a.sum()


def test_i64_ptr_views_memory_as_an_array():
    buf = (ctypes.c_int64 * 4)(1, 2, 3, 4)
    assert _call(sum_view, ctypes.c_int64, [ctypes.c_uint64, ctypes.c_int64])(ctypes.addressof(buf), 4) == 16
    assert buf[0] == 7


@cfunc(types.int64(types.uint64, types.uint32, types.int64), nopython=True, error_model="numpy")
def futex_wait_c(addr, expected, timeout_ns):
    return I.futex_wait(addr, expected, timeout_ns)


@cfunc(types.int64(types.uint64), nopython=True, error_model="numpy")
def futex_wake_c(addr):
    return I.futex_wake(addr)


def test_futex_wait_returns_on_a_changed_word_on_time_out_and_on_wake():
    """The waits the turns sleep in: a word that no longer holds the expected value returns at once
    (EAGAIN); a timeout returns; a wake from another thread ends a long wait long before its timeout."""
    buf = np.zeros(1, dtype=np.uint32)
    addr = buf.ctypes.data
    wait = _call(futex_wait_c, ctypes.c_int64, [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int64])
    wake = _call(futex_wake_c, ctypes.c_int64, [ctypes.c_uint64])
    assert wait(addr, 1, 10_000_000_000) == -1  # the word holds 0, not 1: no sleep at all
    assert wait(addr, 0, 1_000_000) == -1  # ETIMEDOUT after 1 ms
    done = threading.Event()
    t = threading.Thread(target=lambda: (wait(addr, 0, 3600_000_000_000), done.set()), daemon=True)
    t.start()
    # wake until the waiter is gone (it may not be asleep yet at the first wake). Without a working wake it
    # would sleep for an hour; the test gives it 30 s
    for _ in range(3000):
        wake(addr)
        if done.wait(0.01):
            break
    assert done.is_set()


def test_branch_hints_keep_the_condition_and_weight_the_branch():
    """likely/unlikely return their condition unchanged and reach LLVM as branch weights (the usual path laid
    out straight, pyvgpu/jit/compute/launch.py); a non-boolean is refused at compile time."""
    import pytest
    from numba import njit
    from numba.core.errors import TypingError

    @njit
    def pick(a):
        x = 0
        if I.unlikely(a > 3):
            x += 1
        if I.likely(a < 10):
            x += 2
        return x

    assert [pick(v) for v in (0, 5, 20)] == [2, 3, 1]
    ir = pick.inspect_llvm(pick.signatures[0])
    # lowered into LLVM's weights of an expected branch, one each way
    assert '!"expected", i32 1, i32 2000' in ir and '!"expected", i32 2000, i32 1' in ir, ir

    @njit
    def wrong(a):
        return I.likely(a)

    with pytest.raises(TypingError):
        wrong(3)
