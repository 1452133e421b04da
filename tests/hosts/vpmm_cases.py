"""VPMM scenarios on the fake driver's VMM, one per run; prints JSON (tests/test_vpmm.py).

    python vpmm_cases.py walk PAGES      the seed's walkthrough: +10 +1 -10 +4 +11 (1 GiB pages)
    python vpmm_cases.py streams         reuse across streams, waits, zombies
    python vpmm_cases.py property N      N random alloc/free sequences (hypothesis), invariants after each step
    python vpmm_cases.py trace STEPS     pyvgpu bench vpmm's fragmenting trace on a pool
    python vpmm_cases.py cexports        the shim's malloc/free pair for PyTorch, on a pool
    python vpmm_cases.py cap             2 MiB pages until the cap refuses one (run it under pyvgpu wrap --memory)
"""

import ctypes
import json
import sys
import time

from pyvgpu.vpmm import VirtualMemoryPool

G = 1 << 30
MiB = 1 << 20
cu = ctypes.CDLL("libcuda.so.1")
cu.fakecuda_mapped_pages.restype = ctypes.c_uint64
cu.fakecuda_mapping.restype = ctypes.c_uint64
cu.fakecuda_mapping.argtypes = [ctypes.c_uint64]


def walk(pages: int) -> dict:
    pool = VirtualMemoryPool(page_size=G, va_size=64 * G, pages=pages)
    steps = []
    a = pool.malloc(10 * G)
    steps.append(pool.layout())
    pool.malloc(1 * G)
    steps.append(pool.layout())
    pool.free(a)
    steps.append(pool.layout())
    pool.malloc(4 * G)
    steps.append(pool.layout())
    pool.malloc(11 * G)
    steps.append(pool.layout())
    pool.trim()
    steps.append(pool.layout())
    return {"steps": steps, "stats": pool.stats(), "fake_mapped": cu.fakecuda_mapped_pages() * 2 * MiB}


def busy_stream(ms: int) -> int:
    """A stream with ms of (simulated) work queued on it."""
    s, mod, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), 0) == 0
    assert cu.cuModuleLoadData(ctypes.byref(mod), b"fake module") == 0
    assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin") == 0
    iters = ctypes.c_uint32(ms * 10_000)  # 100 ns per iteration
    params = (ctypes.c_void_p * 1)(ctypes.addressof(iters))
    assert cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, None) == 0
    return s.value


def streams() -> dict:
    out = {}
    warm = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G)  # compile every path before timing matters
    x = warm.malloc(4 * MiB, 1)
    warm.free(x, 1)
    warm.malloc(2 * MiB, 2)
    warm.malloc(4 * MiB, 2)
    warm.trim()
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G)
    a_stream = busy_stream(1500)
    b_stream = a_stream + 0x1000  # another stream id: the pool only compares them
    p = pool.malloc(8 * MiB, a_stream)
    pool.free(p, a_stream)  # its event completes in ~1.5 s
    out["same_stream_reuses_at_once"] = pool.malloc(8 * MiB, a_stream) == p
    pool.free(p, a_stream)
    pages = pool.stats()["pages"]
    q = pool.malloc(8 * MiB, b_stream)  # not done on a: moved (GPU-side wait), not reused in place
    out["other_stream_before_event"] = {"same_address": q == p, "new_pages": pool.stats()["pages"] - pages,
                                       "zombies": pool.stats()["zombies"], "layout": pool.layout()}
    out["double_mapped_while_zombie"] = cu.fakecuda_mapping(p) != 0 and cu.fakecuda_mapping(q) != 0
    out["zombie_kept_while_busy"] = (pool.trim(), pool.stats()["zombies"])[1]
    time.sleep(1.6)
    pool.trim()
    out["zombie_unmapped_after_event"] = {"zombies": pool.stats()["zombies"], "old_mapped": cu.fakecuda_mapping(p),
                                          "layout": pool.layout()}
    pool.free(q, b_stream)
    time.sleep(0.05)
    out["other_stream_after_event_reuses"] = pool.malloc(8 * MiB, a_stream) == q
    out["small_goes_to_malloc_async"] = pool.malloc(1000, a_stream) > 0 and pool.stats()["small_live"] == 1000
    try:
        pool.free(p + 12345)
        out["bad_free"] = "no error"
    except Exception as e:
        out["bad_free"] = str(e)
    return out


def invariants(pool: VirtualMemoryPool, live: dict[int, int], base: int) -> None:
    rows = pool.regions()
    page = pool.page_size
    assert all(s > 0 and s % page == 0 and a % page == 0 for a, s, _, _ in rows)
    for (a, s, _, _), (b, _, _, _) in zip(rows, rows[1:], strict=False):
        assert a + s <= b, "overlap"
    chunks = []  # the reserved chunks, as contiguous runs: regions partition them
    for a, s, _, _ in rows:
        if chunks and chunks[-1][1] == a:
            chunks[-1][1] = a + s
        else:
            chunks.append([a, a + s])
    assert sum(e - b for b, e in chunks) == pool.stats()["reserved_va"]
    assert all((e - b) % pool.va_size == 0 or (e - b) >= pool.va_size for b, e in chunks)
    st = pool.stats()
    assert st["live"] == sum(-(-n // page) * page for n in live.values()), (st, live)
    assert {a for a, _, m, _ in rows if m == "+"} == set(live)
    active = st["live"] + st["reusable"]
    assert active == st["mapped"], (st, "every page is live or free exactly once")
    assert (cu.fakecuda_mapped_pages() - base) * 2 * MiB == active + st["zombies"], "the driver's mappings"
    for a, s, m, _ in rows:
        if m in "+-":
            assert cu.fakecuda_mapping(a) and cu.fakecuda_mapping(a + s - page)
        if m == "*":
            assert not cu.fakecuda_mapping(a)


def prop(n: int) -> dict:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "free"]), st.integers(1, 9 * 2 * MiB),
                             st.sampled_from([0, 0x1000]), st.integers(0, 1000)), max_size=60)
    runs = []

    @settings(max_examples=n, deadline=None, database=None)
    @given(ops)
    def check(seq):
        base = cu.fakecuda_mapped_pages()  # earlier examples' pools stay mapped
        pool = VirtualMemoryPool(page_size=2 * MiB, va_size=32 * MiB, pages=3)
        live: dict[int, int] = {}
        for op, size, stream, pick in seq:
            if op == "alloc" or not live:
                if size < pool.page_size:
                    size = pool.page_size  # small ones bypass the pool
                try:
                    ptr = pool.malloc(size, stream)
                except MemoryError:
                    continue
                assert ptr not in live
                live[ptr] = size
            else:
                ptr = sorted(live)[pick % len(live)]
                pool.free(ptr, stream)
                del live[ptr]
            invariants(pool, live, base)
        runs.append(len(seq))

    check()
    return {"examples": len(runs), "steps": sum(runs)}


def cexports() -> dict:
    """The shim's pyvgpu_vpmm_malloc/free (PyTorch's CUDAPluggableAllocator calls them) on a pool."""
    from pyvgpu import shim, vpmm

    lib = shim.loaded() or shim.open_shim()
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G)
    vpmm.install(lib, pool)
    lib.pyvgpu_vpmm_malloc.restype = ctypes.c_void_p
    lib.pyvgpu_vpmm_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.pyvgpu_vpmm_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    big = lib.pyvgpu_vpmm_malloc(5 * MiB, 0, None)
    small = lib.pyvgpu_vpmm_malloc(512, 0, None)
    out = {"big_in_pool": [a for a, _, m, _ in pool.regions() if m == "+"] == [big], "live": pool.stats()["live"],
           "small_live": pool.stats()["small_live"], "no_pool_device_3": lib.pyvgpu_vpmm_malloc(MiB, 3, None)}
    lib.pyvgpu_vpmm_free(big, 5 * MiB, 0, None)
    lib.pyvgpu_vpmm_free(small, 512, 0, None)
    lib.pyvgpu_vpmm_free(big, 5 * MiB, 0, None)  # twice: reported, the pool untouched
    out["after"] = {k: pool.stats()[k] for k in ("live", "reusable", "small_live")}
    return out


def trace_run(steps: int) -> dict:
    """pyvgpu bench vpmm's fragmenting trace on a pool (no PyTorch here)."""
    from pyvgpu.bench import vpmm as bench

    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=4 * G)
    out = bench.run_pool(bench.trace(steps), pool)
    out["defragmentations"] = pool.stats()["defragmentations"]
    return out


def cap() -> dict:
    """Under `pyvgpu wrap --memory`: pages are charged to the group; past the cap, a clean MemoryError."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G)
    got = []
    try:
        while len(got) < 1000:
            got.append(pool.malloc(2 * MiB))
        err = "none"
    except MemoryError as e:
        err = str(e)
    pool.free(got[0])
    again = pool.malloc(2 * MiB)  # the freed page is reused: no new page, so no charge
    return {"pages": len(got), "error": err, "reused": again == got[0], "mapped": pool.stats()["mapped"]}


def refusal() -> dict:
    """Under `pyvgpu wrap --memory 16M`: a request the cap refuses half way through its new pages leaves
    the pool as it was (no page, charge or moved region left behind); what fits is then served."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G)
    held = [pool.malloc(2 * MiB) for _ in range(5)]
    pool.free(held[1])
    pool.free(held[3])  # 2 free pages apart, 3 pages of room under the cap
    before = pool.stats()
    layout = pool.layout()
    try:
        pool.malloc(16 * MiB)  # 2 free pages move, 6 new ones: the cap refuses the 4th
        err = "none"
    except MemoryError as e:
        err = str(e)
    after, layout_after = pool.stats(), pool.layout()
    fits = pool.malloc(10 * MiB)  # 2 moved + 3 new: exactly the cap
    return {"error": err, "before": [before, layout], "after": [after, layout_after], "fits": fits > 0,
            "final": pool.stats(), "fake_mapped": cu.fakecuda_mapped_pages() * 2 * MiB}


if __name__ == "__main__":
    what = sys.argv[1]
    result = {"walk": lambda: walk(int(sys.argv[2])), "streams": streams, "cap": cap, "refusal": refusal,
              "cexports": cexports,
              "trace": lambda: trace_run(int(sys.argv[2])),
              "property": lambda: prop(int(sys.argv[2]))}[what]()
    print(json.dumps(result))
