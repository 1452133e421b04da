"""VPMM on a real GPU: the seed walkthrough with data checks, pool-hit latency. Prints JSON.

    python tests/gpu/vpmm_real.py walk PAGES|latency|profile
"""

import ctypes
import json
import statistics
import sys
import time

import numpy as np
from numba import njit

from pyvgpu.jit.runtime.intrinsics import monotonic_ns
from pyvgpu.jit.vpmm import entries as V
from pyvgpu.jit.vpmm import tables as T
from pyvgpu.vpmm.pool import VirtualMemoryPool

G, MiB = 1 << 30, 1 << 20
cu = ctypes.CDLL("libcuda.so.1")


def fill(ptr: int, size: int, value: int) -> None:
    assert cu.cuMemsetD32_v2(ctypes.c_uint64(ptr), ctypes.c_uint(value), ctypes.c_size_t(size // 4)) == 0
    assert cu.cuCtxSynchronize() == 0


def check(ptr: int, size: int, value: int, page: int) -> bool:
    """Read back the first and last 64 KiB of every page of [ptr, ptr + size)."""
    buf = (ctypes.c_uint32 * (16384))()
    for off in range(0, size, page):
        for at in (off, off + page - 65536):
            assert cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr + at), ctypes.c_size_t(65536)) == 0
            if any(x != value for x in buf):
                return False
    return True


def walk(pages: int) -> dict:
    pool = VirtualMemoryPool(page_size=G, va_size=64 * G, pages=pages, gap=0)
    steps = []
    a = pool.malloc(10 * G)
    steps.append(pool.layout())
    b = pool.malloc(1 * G)
    steps.append(pool.layout())
    fill(b, G, 0xB0B0B0B0)
    pool.free(a)
    steps.append(pool.layout())
    c = pool.malloc(4 * G)
    fill(c, 4 * G, 0xC4C4C4C4)
    steps.append(pool.layout())
    d = pool.malloc(11 * G)  # cases B-D defragment here: free pages move under the live ones
    steps.append(pool.layout())
    fill(d, 11 * G, 0xD1D1D1D1)
    ok = check(b, G, 0xB0B0B0B0, G) and check(c, 4 * G, 0xC4C4C4C4, G) and check(d, 11 * G, 0xD1D1D1D1, G)
    assert cu.cuCtxSynchronize() == 0
    pool.trim(release=False)
    steps.append(pool.layout())
    st = pool.stats()
    for p in (b, c, d):
        pool.free(p)
    return {"steps": steps, "data_intact": ok, "pages": st["pages"], "defragmentations": st["defragmentations"]}


@njit
def _timed_pairs(state, size, out):
    """malloc+free through the same code the cfuncs run (lock, event record, capture check included), each
    pair timed."""
    for i in range(out.shape[0]):
        t = monotonic_ns()
        p = V.entry_malloc(state, size, np.uint64(0))
        V.entry_free(state, p, np.uint64(0), size)
        out[i] = monotonic_ns() - t


def latency() -> dict:
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=64 * G, pages=64)
    out = {}
    state = np.uint64(ctypes.addressof(pool.state))
    for size in (2 * MiB, 32 * MiB):
        ns = np.zeros(100000, dtype=np.int64)
        _timed_pairs(state, size, ns[:10])  # compile
        _timed_pairs(state, size, ns)
        out[f"malloc_free_{size >> 20}MiB_native_ns"] = {"median": float(np.median(ns)),
                                                         "p99": float(np.percentile(ns, 99))}
    for size in (2 * MiB, 32 * MiB):
        ns = []
        for _ in range(20000):
            t = time.perf_counter_ns()
            p = pool.malloc(size)
            pool.free(p)
            ns.append(time.perf_counter_ns() - t)
        out[f"malloc_free_{size >> 20}MiB_python_ns"] = statistics.median(ns)
    from pyvgpu.native import shim
    from pyvgpu.vpmm import pool as vpmm

    lib = shim.open_shim()
    vpmm.install(lib, pool)
    lib.pyvgpu_vpmm_malloc.restype = ctypes.c_void_p
    lib.pyvgpu_vpmm_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.pyvgpu_vpmm_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    ns = []
    for _ in range(20000):
        t = time.perf_counter_ns()
        p = lib.pyvgpu_vpmm_malloc(8 * MiB, 0, None)
        lib.pyvgpu_vpmm_free(p, 8 * MiB, 0, None)
        ns.append(time.perf_counter_ns() - t)
    out["c_export_malloc_free_8MiB_ns_incl_ctypes"] = statistics.median(ns)
    t = time.perf_counter_ns()
    for _ in range(20000):
        pass
    out["python_loop_ns"] = (time.perf_counter_ns() - t) / 20000
    return out


def _med(xs: list[int]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def profile() -> dict:
    """Where the time of a defragmentation goes: the VMM calls one by one, then the bench trace replayed
    on pools of 2 and 20 MiB pages with each malloc timed, split by whether it defragmented."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=64 * G)
    prop, access = ctypes.byref(pool._prop), ctypes.byref(pool._access)
    out: dict = {}
    hs, ns = [], []
    for _ in range(128):
        h = ctypes.c_uint64()
        t = time.perf_counter_ns()
        assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 * MiB), prop, ctypes.c_uint64(0)) == 0
        ns.append(time.perf_counter_ns() - t)
        hs.append(h.value)
    out["create_2MiB_ns"] = _med(ns)
    va = ctypes.c_uint64()
    assert cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(256 * MiB), ctypes.c_size_t(0),
                                  ctypes.c_uint64(0), ctypes.c_uint64(0)) == 0
    ns = []
    for k, h in enumerate(hs):
        t = time.perf_counter_ns()
        assert cu.cuMemMap(ctypes.c_uint64(va.value + k * 2 * MiB), ctypes.c_size_t(2 * MiB), ctypes.c_size_t(0),
                           ctypes.c_uint64(h), ctypes.c_uint64(0)) == 0
        ns.append(time.perf_counter_ns() - t)
    out["map_2MiB_ns"] = _med(ns)
    for n in (1, 16, 127):
        t = time.perf_counter_ns()
        assert cu.cuMemSetAccess(ctypes.c_uint64(va.value), ctypes.c_size_t(n * 2 * MiB), access,
                                 ctypes.c_size_t(1)) == 0
        out[f"set_access_{n}_pages_ns"] = time.perf_counter_ns() - t
    t = time.perf_counter_ns()
    assert cu.cuMemUnmap(ctypes.c_uint64(va.value), ctypes.c_size_t(2 * MiB)) == 0
    out["unmap_1_page_ns"] = time.perf_counter_ns() - t
    t = time.perf_counter_ns()
    assert cu.cuMemUnmap(ctypes.c_uint64(va.value + 2 * MiB), ctypes.c_size_t(127 * 2 * MiB)) == 0
    out["unmap_127_pages_ns"] = time.perf_counter_ns() - t
    for h in hs:
        cu.cuMemRelease(ctypes.c_uint64(h))
    from pyvgpu.bench import vpmm as bench

    ops = bench.trace(600)
    for page in (2 * MiB, 16 * MiB):
        p = VirtualMemoryPool(page_size=page, va_size=64 * G)
        held, hit, defrag, frees = {}, [], [], []
        t0 = time.perf_counter()
        for op, i, n in ops:
            if op == "alloc":
                d = int(p.hd[T.H_DEFRAGS])
                t = time.perf_counter_ns()
                held[i] = p.malloc(n)
                dt = time.perf_counter_ns() - t
                (defrag if p.hd[T.H_DEFRAGS] != d else hit).append(dt)
            elif i in held:
                t = time.perf_counter_ns()
                p.free(held.pop(i))
                frees.append(time.perf_counter_ns() - t)
        took = time.perf_counter() - t0
        st = p.stats()
        out[f"trace_{page >> 20}MiB_pages"] = {
            "ops_per_s": len(ops) / took, "mallocs": len(hit) + len(defrag), "defrags": len(defrag),
            "defrag_ms_total": sum(defrag) / 1e6, "defrag_median_us": _med(defrag) / 1e3,
            "hit_median_us": _med(hit) / 1e3, "free_median_us": _med(frees) / 1e3, "mapped": st["mapped"],
            "peak_live": bench.peak_live(ops)}
    return out


if __name__ == "__main__":
    if sys.argv[1] == "walk":
        print(json.dumps({sys.argv[2]: walk(int(sys.argv[2]))}))
    elif sys.argv[1] == "profile":
        print(json.dumps(profile()))
    else:
        print(json.dumps(latency()))
