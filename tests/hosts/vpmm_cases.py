"""VPMM scenarios on the fake driver's VMM, one per run; prints JSON (tests/test_vpmm*.py).

    python vpmm_cases.py walk PAGES      the seed's walkthrough: +10 +1 -10 +4 +11 (1 GiB pages)
    python vpmm_cases.py streams         reuse across streams, waits, zombies
    python vpmm_cases.py property N      N random alloc/free/trim sequences (hypothesis), invariants after each step
    python vpmm_cases.py trace STEPS     pyvgpu bench vpmm's fragmenting trace on a pool
    python vpmm_cases.py cexports        the shim's malloc/free pair for PyTorch, on a pool
    python vpmm_cases.py cap             2 MiB pages until the cap refuses one (run it under pyvgpu wrap --memory)
    python vpmm_cases.py refusal         a refusal half way through a defragmentation (under wrap --memory 16M)
    python vpmm_cases.py faults          every driver step of a defragmentation fails in turn (fault injection)
    python vpmm_cases.py trim            trim gives free pages back; a failed unmap or release changes nothing
    python vpmm_cases.py pressure        (under wrap) a refusal elsewhere in the group, a lowered cap: pages go back
    python vpmm_cases.py record_stream   a freed allocation waits for its side stream
    python vpmm_cases.py capture         a CUDA graph capture (the fake's): no event query, memory kept for it
    python vpmm_cases.py capture_prologue  PyTorch allocates between announcing a capture and starting it
    python vpmm_cases.py stats           torch.cuda.memory_stats' keys and a snapshot
"""

import ctypes
import functools
import json
import os
import subprocess
import sys
import time

from pyvgpu.jit.vpmm import tables as T
from pyvgpu.vpmm.pool import VirtualMemoryPool

G = 1 << 30
MiB = 1 << 20
cu = ctypes.CDLL("libcuda.so.1")
cu.fakecuda_mapped_pages.restype = ctypes.c_uint64
cu.fakecuda_mapping.restype = ctypes.c_uint64
cu.fakecuda_mapping.argtypes = [ctypes.c_uint64]
cu.fakecuda_fail.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int]
cu.fakecuda_capture.argtypes = [ctypes.c_void_p, ctypes.c_int]
cu.fakecuda_capture_violations.restype = ctypes.c_uint64
cu.fakecuda_released_mapped_bytes.restype = ctypes.c_uint64
cu.fakecuda_device_used.restype = ctypes.c_uint64


def device_used() -> int:
    return cu.fakecuda_device_used(0)


def walk(pages: int) -> dict:
    pool = VirtualMemoryPool(page_size=G, va_size=64 * G, pages=pages, gap=0)
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
    pool.trim(release=False)
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


def delta(pool: VirtualMemoryPool, before: dict, *names: str) -> dict:
    now = pool.calls()
    return {n: now[n] - before[n] for n in names}


def streams() -> dict:
    out = {}
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    a_stream = busy_stream(1500)
    b_stream = a_stream + 0x1000  # another stream id: the pool only compares them
    p = pool.malloc(8 * MiB, a_stream)
    pool.free(p, a_stream)  # its event completes in ~1.5 s
    out["same_stream_reuses_at_once"] = pool.malloc(8 * MiB, a_stream) == p
    pool.free(p, a_stream)
    c0 = pool.calls()
    q = pool.malloc(8 * MiB, b_stream)  # not done on a: used in place after a GPU-side wait, nothing moves
    out["other_stream_before_event"] = {"same_address": q == p, "layout": pool.layout(),
                                       **delta(pool, c0, "cuStreamWaitEvent", "cuMemMap", "cuMemCreate")}
    pool.free(q, b_stream)
    # pages that must move across streams: two busy 2-page regions of a, 4 pages asked on b
    x1, y, x2 = (pool.malloc(4 * MiB, a_stream) for _ in range(3))
    pool.free(x1, a_stream)
    pool.free(x2, a_stream)
    out["before_move"] = pool.layout()
    c0 = pool.calls()
    z = pool.malloc(8 * MiB, b_stream)
    out["move"] = {"layout": pool.layout(), "zombies": pool.stats()["zombies"],
                   **delta(pool, c0, "cuStreamWaitEvent", "cuMemMap", "cuMemCreate", "cuMemSetAccess",
                           "cuMemUnmap")}
    out["double_mapped_while_zombie"] = cu.fakecuda_mapping(x1) != 0 and cu.fakecuda_mapping(x1) == \
        cu.fakecuda_mapping(z + 4 * MiB)
    pool.trim(release=False)
    out["zombie_kept_while_busy"] = pool.stats()["zombies"]
    time.sleep(1.6)
    pool.trim(release=False)
    out["zombie_unmapped_after_event"] = {"zombies": pool.stats()["zombies"], "old_mapped": cu.fakecuda_mapping(x1),
                                          "layout": pool.layout()}
    pool.free(z, b_stream)
    pool.free(y, a_stream)
    time.sleep(0.05)
    c0 = pool.calls()
    out["other_stream_after_event_reuses"] = pool.malloc(8 * MiB, a_stream) == z and \
        delta(pool, c0, "cuStreamWaitEvent")["cuStreamWaitEvent"] == 0
    out["small_goes_to_malloc_async"] = pool.malloc(1000, a_stream) > 0 and pool.stats()["small_live"] == 1000
    try:
        pool.free(p + 12345)
        out["bad_free"] = "no error"
    except Exception as e:
        out["bad_free"] = str(e)
    return out


def snapshot_pool(pool: VirtualMemoryPool) -> dict:
    """Everything a failed operation must leave as it was: the regions, the page table, the figures, and
    what the driver has mapped and charged."""
    st = pool.stats()
    n = int(pool.hd[0])
    pages = sorted(map(tuple, pool.pg[pool.pg[:, 1] > 0].tolist()))
    return {"regions": pool.regions(), "reg": pool.reg[:n].tolist(), "pages": pages,
            "stats": {k: st[k] for k in ("mapped", "live", "reusable", "holes", "zombies", "pages", "reserved_va",
                                         "peak_mapped")},
            "fake_mapped": cu.fakecuda_mapped_pages(), "device_used": device_used(),
            "mappings": [cu.fakecuda_mapping(va) for va, _ in pages]}


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
    st = pool.stats()
    assert sum(e - b for b, e in chunks) == st["reserved_va"]
    assert all((e - b) >= pool.va_size for b, e in chunks)
    assert st["live"] == sum(-(-n // page) * page for n in live.values()), (st, live)
    assert {a for a, _, m, _ in rows if m == "+"} == set(live)
    active = st["live"] + st["reusable"]
    assert active == st["mapped"], (st, "every page is live or free exactly once")
    assert (cu.fakecuda_mapped_pages() - base) * 2 * MiB == active + st["zombies"], "the driver's mappings"
    table = dict(map(tuple, pool.pg[pool.pg[:, 1] > 0].tolist()))
    owned = []
    for a, s, m, _ in rows:
        for va in range(a, a + s, page):
            if m in "+-z":
                assert table.get(va) and cu.fakecuda_mapping(va) == table[va], "the page table is the driver's"
                if m in "+-":
                    owned.append(table[va])
            else:
                assert va not in table and not cu.fakecuda_mapping(va), "a hole is not mapped"
    assert len(owned) == len(set(owned)) == st["pages"], "each page is live or free at exactly one address"
    assert len(table) == sum(s // page for _, s, m, _ in rows if m in "+-z")


def prop(n: int) -> dict:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "free", "trim"]), st.integers(1, 9 * 2 * MiB),
                             st.sampled_from([0, 0x1000]), st.integers(0, 1000)), max_size=80)
    runs = []

    @settings(max_examples=n, deadline=None, database=None)
    @given(ops, st.sampled_from([0, 2 * MiB, 4 * MiB, 8 * MiB]))
    def check(seq, gap):
        base = cu.fakecuda_mapped_pages()  # earlier examples' pools stay mapped
        pool = VirtualMemoryPool(page_size=2 * MiB, va_size=32 * MiB, pages=3, gap=gap)
        live: dict[int, int] = {}
        for op, size, stream, pick in seq:
            if op == "trim":
                pool.trim(release=bool(pick % 2))
            elif op == "alloc" or not live:
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
    from pyvgpu.native import shim
    from pyvgpu.vpmm import pool as vpmm

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
    zero = lib.pyvgpu_vpmm_malloc(0, 0, None)  # a zero-byte tensor: PyTorch frees it with size 0
    lib.pyvgpu_vpmm_free(big, 5 * MiB, 0, None)
    lib.pyvgpu_vpmm_free(small, 512, 0, None)
    out["zero"] = bool(zero)
    lib.pyvgpu_vpmm_free(zero, 0, 0, None)
    lib.pyvgpu_vpmm_free(big, 5 * MiB, 0, None)  # twice: reported, the pool untouched
    out["after"] = {k: pool.stats()[k] for k in ("live", "reusable", "small_live")}
    return out


def trace_run(steps: int, gap: int | None = None) -> dict:
    """pyvgpu bench vpmm's fragmenting trace on a pool (no PyTorch here), with the pool's defaults or the
    given VPMM_GAP; the region table is checked every 25 operations (sorted, no empty or overlapping row,
    the live set as the trace holds it)."""
    from pyvgpu.bench import vpmm as bench

    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=4 * G, gap=gap)
    ops = bench.trace(steps)
    live: dict[int, int] = {}
    count = [0]

    class Checked:
        page_size = pool.page_size
        _cu = pool._cu

        @staticmethod
        def malloc(n: int) -> int:
            p = pool.malloc(n)
            if n >= pool.page_size:
                live[p] = n
            tick()
            return p

        @staticmethod
        def free(p: int) -> None:
            pool.free(p)
            live.pop(p, None)
            tick()

        stats = staticmethod(pool.stats)

    def tick() -> None:
        count[0] += 1
        if count[0] % 25:
            return
        rows = pool.regions()
        assert all(s > 0 for _, s, _, _ in rows), "an empty row"
        assert all(a + s <= b for (a, s, _, _), (b, _, _, _) in zip(rows, rows[1:], strict=False)), "order"
        assert {a for a, _, m, _ in rows if m == "+"} == set(live), "the live set"

    out = bench.run_pool(ops, Checked)
    out["stats"] = pool.stats()
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
    return {"pages": len(got), "error": err, "reused": again == got[0], "mapped": pool.stats()["mapped"],
            "ooms": pool.stats()["ooms"], "num_ooms": pool.memory_stats()["num_ooms"]}


def refusal() -> dict:
    """Under `pyvgpu wrap --memory 16M`: a request the cap refuses half way through its new pages leaves
    the pool as it was (no page, charge or moved region left behind); what fits is then served."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    held = [pool.malloc(2 * MiB) for _ in range(5)]
    pool.free(held[1])
    pool.free(held[3])  # 2 free pages apart, 3 pages of room under the cap
    before = snapshot_pool(pool)
    layout = pool.layout()
    try:
        pool.malloc(16 * MiB)  # 2 free pages move, 6 new ones: the cap refuses the 4th
        err = "none"
    except MemoryError as e:
        err = str(e)
    after, layout_after = snapshot_pool(pool), pool.layout()
    fits = pool.malloc(10 * MiB)  # 2 moved + 3 new: exactly the cap
    return {"error": err, "before": [before, layout], "after": [after, layout_after], "fits": fits > 0,
            "final": pool.stats(), "fake_mapped": cu.fakecuda_mapped_pages() * 2 * MiB,
            "retries": pool.stats()["retries"]}


# every driver call a defragmentation makes, in order; the faults case fails each in turn
DEFRAG_STEPS = ("cuStreamWaitEvent", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemAddressReserve@fresh",
                "cuStreamWaitEvent@fresh", "cuMemCreate@fresh", "cuMemMap@fresh", "cuMemSetAccess@fresh")


@functools.cache
def _long_busy() -> int:
    """One stream with two minutes of work, queued once per process: every event recorded meanwhile stays
    pending for the whole case (a second such launch would wait for the first one's queue)."""
    return busy_stream(120_000)


def fault_pool() -> tuple[VirtualMemoryPool, int, int]:
    """A pool laid out [*2][-2 b][*4] [*2][-2 a, busy][*4] (two 16 MiB chunks, 4 MiB gaps). On stream b,
    14 MiB grows b's run on both sides (two cuMemSetAccess) with a's pages (cuStreamWaitEvent, cuMemMap)
    and 3 new ones (cuMemCreate); 20 MiB fits beside neither run: a new chunk, a fresh span."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=16 * MiB, gap=4 * MiB)
    a = _long_busy()
    b = a + 0x1000
    x = pool.malloc(4 * MiB, b)
    y = pool.malloc(4 * MiB, a)
    pool.free(x, b)
    pool.free(y, a)
    assert pool.layout(holes_after_last=True) == "[*2][-2][*4][*2][-2][*4]", pool.layout(holes_after_last=True)
    return pool, a, b


def faults() -> dict:
    """Fail each driver step of a defragmentation (the n-th call of each kind, for every n it makes) and
    check the pool is exactly as it was; then with no fault the same request succeeds."""
    out: dict = {"cases": []}
    for step in DEFRAG_STEPS:
        name = step.split("@")[0]
        nth = 1
        while True:
            pool, a, b = fault_pool()
            size = 20 * MiB if step.endswith("@fresh") else 14 * MiB
            before = snapshot_pool(pool)
            c0 = pool.calls()[name]
            cu.fakecuda_fail(name.encode(), nth, 999)  # not CUDA_ERROR_OUT_OF_MEMORY: that one is retried
            err = None
            try:
                pool.malloc(size, b)
            except (MemoryError, Exception) as e:  # noqa: BLE001 - the type is part of what is checked
                err = f"{type(e).__name__}: {e}"
            made = pool.calls()[name] - c0
            cu.fakecuda_fail(name.encode(), 0, 0)  # disarm whatever did not fire
            fired = err is not None
            if not fired:
                break  # the request made fewer than nth calls of this kind: every one was tried
            after = snapshot_pool(pool)
            ok = pool.malloc(size, b) > 0
            out["cases"].append({"step": step, "nth": nth, "calls": made, "error": err,
                                 "unchanged": after == before, "diff": _diff(before, after),
                                 "then_served": ok})
            nth += 1
    # an out-of-memory answer is retried once (after the small requests' cache is trimmed): served
    pool, a, b = fault_pool()
    cu.fakecuda_fail(b"cuMemCreate", 1, 2)
    ok = pool.malloc(14 * MiB, b) > 0
    ms = pool.memory_stats()
    out["oom_retried"] = {"served": ok, "num_alloc_retries": ms["num_alloc_retries"], "num_ooms": ms["num_ooms"]}
    # a full region table: the request that does not fit is refused before any driver call, the pool
    # unchanged (allocations pack a small table row by row until one is refused)
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=64 * MiB, gap=0, max_regions=16)
    vmm = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemAddressReserve", "cuStreamWaitEvent")
    held = []
    for _ in range(32):
        before, c0 = snapshot_pool(pool), pool.calls()
        try:
            held.append(pool.malloc(2 * MiB))
        except Exception as e:  # noqa: BLE001
            out["table_full"] = {"error": f"{type(e).__name__}: {e}", "unchanged": snapshot_pool(pool) == before,
                                 "driver_calls": sum(pool.calls()[k] - c0[k] for k in vmm), "served": len(held)}
            break
    return out


def _diff(a: dict, b: dict) -> list[str]:
    return [k for k in a if a[k] != b[k]]


def trim_case() -> dict:
    """trim gives free pages back to the driver (the device's memory goes down); a failed unmap or release
    changes nothing; work still queued keeps its pages. (The fake's events complete when all queued work
    is done, so the busy part comes last.)"""
    out = {}
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    used0 = device_used()
    xs = [pool.malloc(4 * MiB) for _ in range(4)]
    for x in xs[:3]:
        pool.free(x)
    out["before"] = {"pages": pool.stats()["pages"], "device_used": device_used() - used0}
    released = pool.trim()
    out["released"] = released
    out["after"] = {"pages": pool.stats()["pages"], "device_used": device_used() - used0, "layout": pool.layout(),
                    "released_mapped": cu.fakecuda_released_mapped_bytes(),
                    "stats_released": pool.stats()["released_pages"],
                    "reserved_bytes": pool.memory_stats()["reserved_bytes.all.current"]}
    out["serves_after"] = pool.malloc(6 * MiB) > 0
    # failures: unmap, then release (the pages not yet released go back where they were)
    pool2 = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    zs = [pool2.malloc(6 * MiB) for _ in range(2)]
    pool2.free(zs[0])
    for name, nth in (("cuMemUnmap", 1), ("cuMemRelease", 1), ("cuMemRelease", 2)):
        before = snapshot_pool(pool2)
        cu.fakecuda_fail(name.encode(), nth, 999)
        try:
            pool2.trim()
            err = "none"
        except Exception as e:  # noqa: BLE001
            err = str(e)
        cu.fakecuda_fail(name.encode(), 0, 0)
        after = snapshot_pool(pool2)
        out[f"{name}_{nth}"] = {"error": err, "pages_before": before["stats"]["pages"],
                                "pages_after": after["stats"]["pages"], "layout": pool2.layout(),
                                "unchanged": after == before,
                                "mapped_ok": all(cu.fakecuda_mapping(va) == h for va, h in after["pages"])}
        p = pool2.malloc(6 * MiB)  # the pool still serves; it may need new pages after a partial release
        pool2.free(p)
    # work still queued: its pages stay
    s = busy_stream(1500)  # the fake keeps a queue per stream: the region is freed on the busy one
    y = pool.malloc(4 * MiB, s)
    pool.free(y, s)
    out["busy_kept"] = {"released": pool.trim(), "reusable": pool.stats()["reusable"]}
    return out


def pressure() -> dict:
    """Run under `pyvgpu wrap --memory 32M --region R`: (1) another process of the group is refused:
    this pool gives its free pages back at its next operation; (2) `pyvgpu limits set` lowers the cap:
    the same."""
    region = os.environ["CASE_REGION"]
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    xs = [pool.malloc(4 * MiB) for _ in range(6)]  # 24 MiB of the 32
    for x in xs[:4]:
        pool.free(x)  # 16 MiB free in the pool, still charged to the group
    out = {"pages_before": pool.stats()["pages"]}
    # another member of the group asks for 16 MiB: refused (only 8 left under the cap)
    child = subprocess.run([sys.executable, "-c", "import ctypes; cu = ctypes.CDLL('libcuda.so.1'); cu.cuInit(0); "
                            "d = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(d), 0); "
                            "cu.cuCtxSetCurrent(d); p = ctypes.c_uint64(); "
                            "print(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(16 << 20)))"],
                           capture_output=True, text=True, timeout=120)
    out["other_rc"] = child.stdout.strip()
    pool.free(pool.malloc(2 * MiB))  # the next operation sees the refusal
    out["pages_after_refusal"] = pool.stats()["pages"]
    out["trims"] = pool.stats()["trims"]
    xs2 = [pool.malloc(4 * MiB) for _ in range(3)]
    pool.free(xs2[0])
    out["pages_before_limit"] = pool.stats()["pages"]
    p = subprocess.run([sys.executable, "-m", "pyvgpu", "limits", "set", "--region", region, "--memory", "24M"],
                       capture_output=True, text=True, timeout=120)
    out["limits_set_rc"] = p.returncode
    pool.free(xs2[1])  # the next operation sees the lower cap
    out["pages_after_limit"] = pool.stats()["pages"]
    out["trims_after_limit"] = pool.stats()["trims"]
    return out


def record_stream_case() -> dict:
    """An allocation of stream a, also used on a busy stream b (record_stream), freed on a: a's next
    request of that size waits for b on the GPU (cuStreamWaitEvent) instead of reusing it blindly."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    b = busy_stream(1500)
    a = b + 0x1000
    x = pool.malloc(4 * MiB, a)
    pool.record_stream(x, b)
    pool.record_stream(x, b)  # twice: one entry
    pool.record_stream(x, a)  # its own stream: nothing
    pool.free(x, a)
    c0 = pool.calls()
    y = pool.malloc(4 * MiB, a)
    out = {"same_address": y == x, "waits": pool.calls()["cuStreamWaitEvent"] - c0["cuStreamWaitEvent"],
           "events_recorded": pool.calls()["cuEventRecord"] - c0["cuEventRecord"]}
    pool.free(y, a)  # no side stream now: plain same-stream reuse, no wait
    c0 = pool.calls()
    out["without"] = {"same_address": pool.malloc(4 * MiB, a) == x,
                      "waits": pool.calls()["cuStreamWaitEvent"] - c0["cuStreamWaitEvent"]}
    # a small request (cuMemAllocAsync memory): its cuMemFreeAsync comes after a GPU-side wait for b
    small = pool.malloc(1000, a)
    pool.record_stream(small, b)
    c0 = pool.calls()
    pool.free(small, a)
    out["small"] = delta(pool, c0, "cuStreamWaitEvent", "cuMemFreeAsync")
    try:
        pool.record_stream(x + 4096, b)
        out["bad"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["bad"] = str(e)
    return out


def capture_case() -> dict:
    """A CUDA graph capture on the fake (global mode: event queries refused). The pool queries nothing,
    serves small requests from pages, keeps the capture's memory for it (reused inside the capture, never
    outside), records the event of an ordinary allocation freed on the capturing stream after the
    capture, and gives the graph's memory back on release_graph_memory."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    s = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), 0) == 0
    cap = s.value
    other = cap + 0x1000
    eager = pool.malloc(4 * MiB, cap)  # allocated before the capture, freed during it
    warm = pool.malloc(4 * MiB, other)
    pool.free(warm, other)  # free before the capture; the begin notification queries its event once
    epoch = pool.capture_begin(cap)
    cu.fakecuda_capture(cap, 1)
    v0 = cu.fakecuda_capture_violations()
    c_cap = pool.calls()
    t1 = pool.malloc(4 * MiB, cap)
    small = pool.malloc(1000, cap)  # a page, not cuMemAllocAsync (a graph would own that memory)
    pool.free(t1, cap)
    t2 = pool.malloc(4 * MiB, cap)  # the capture's own freed memory, reused in stream order
    pool.free(eager, cap)  # an ordinary allocation freed on the capturing stream: its event must wait
    out = {"epoch": epoch, "reuse_inside": t2 == t1, "small_is_page": pool.stats()["small_live"] == 0,
           "violations": cu.fakecuda_capture_violations() - v0,
           "during": delta(pool, c_cap, "cuMemCreate", "cuMemMap", "cuEventQuery", "cuEventRecord",
                           "cuThreadExchangeStreamCaptureMode")}
    cu.fakecuda_capture(cap, 0)
    pool.capture_end(cap)
    c0 = pool.calls()
    pool.free(t2, cap)
    pool.free(small, cap)
    out["graph_frees_record_nothing"] = delta(pool, c0, "cuEventRecord")["cuEventRecord"] == 0
    c0 = pool.calls()
    x = pool.malloc(4 * MiB, cap)  # the first operation after the capture records the deferred event
    out["deferred_recorded"] = delta(pool, c0, "cuEventRecord")["cuEventRecord"] == 1
    out["eager_reused_after"] = x == eager
    y = pool.malloc(4 * MiB, cap)
    out["graph_memory_kept"] = y not in (t1, small)  # after the capture, the graph's memory goes to no one
    pool.free(x, cap)
    pool.free(y, cap)
    pool.trim(release=False)
    out["release"] = pool.release_graph_memory(epoch)
    pages = pool.stats()["pages"]
    pool.malloc(pages * 2 * MiB, cap)  # every page the pool has, the graph's included: no new page needed
    out["reused_after_release"] = pool.stats()["pages"] == pages and pool.stats()["reusable"] == 0
    return out


def capture_prologue_case() -> dict:
    """PyTorch's order of events around a capture (torch.cuda.graph with CUDAGraph, PyTorch 2.11):
    pyvgpu.vpmm.pytorch's capture_begin hook announces the capture, then CUDAGraph.capture_begin allocates the
    RNG generator's two graph-safe state tensors on the capture stream (not capturing yet), then the driver's
    capture starts. The capture's memory must carry the announced epoch, so that CUDAGraph.reset (release of
    that epoch) gives all of it back."""
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    s = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), 0) == 0
    cap = s.value
    epoch = pool.capture_begin(cap)
    seed = pool.malloc(8, cap)  # register_graph: at::empty({1}, kLong) twice, before cudaStreamBeginCapture
    offset = pool.malloc(8, cap)
    cu.fakecuda_capture(cap, 1)
    t = pool.malloc(4 * MiB, cap)  # x @ w's temporary
    y = pool.malloc(4 * MiB, cap)  # the graph's output, still live after the reset
    pool.free(t, cap)
    cu.fakecuda_capture(cap, 0)
    pool.capture_end(cap)

    def tags() -> list[int]:
        rows = pool.reg[: int(pool.hd[T.H_NREG])]
        return sorted({int(g) for g in rows[:, T.GRAPH] if g != 0})

    out = {"epoch": epoch, "tags_before_reset": tags()}
    out["released"] = pool.release_graph_memory(epoch)  # what pyvgpu.vpmm.pytorch's CUDAGraph.reset hook does
    out["tags_after_reset"] = tags()
    pool.free(y, cap)
    pool.free(seed, cap)
    pool.free(offset, cap)
    return out


def stats_case() -> dict:
    pool = VirtualMemoryPool(page_size=2 * MiB, va_size=1 * G, gap=0)
    a = pool.malloc(5 * MiB)
    b = pool.malloc(1000)
    pool.free(pool.malloc(8 * MiB))
    ms = pool.memory_stats()
    snap = pool.memory_snapshot()
    pool.reset_peak_stats()
    after_reset = pool.memory_stats()["allocated_bytes.all.peak"]
    pool.free(a)
    pool.free(b)
    return {"stats": ms, "snapshot": snap, "peak_after_reset": after_reset}


if __name__ == "__main__":
    what = sys.argv[1]
    result = {"walk": lambda: walk(int(sys.argv[2])), "streams": streams, "cap": cap, "refusal": refusal,
              "cexports": cexports,
              "trace": lambda: trace_run(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None),
              "property": lambda: prop(int(sys.argv[2])), "faults": faults, "trim": trim_case,
              "pressure": pressure, "record_stream": record_stream_case, "capture": capture_case,
              "capture_prologue": capture_prologue_case,
              "stats": stats_case}[what]()
    print(json.dumps(result))
