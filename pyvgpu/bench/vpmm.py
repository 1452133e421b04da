"""`pyvgpu bench vpmm`: a fragmenting allocation trace under PyTorch's allocators and VPMM.

The trace is inference with a growing sequence length: each step frees a
request's KV buffer and allocates one a little larger, with transient
activations around it; requests start and end at different times, so freed
buffers are never quite the size the next one needs. The same trace runs
under PyTorch's default caching allocator, under expandable_segments, and
under VPMM (`pyvgpu wrap --allocator vpmm`), each in its own process. Each
run reports peak live bytes, peak reserved bytes (for VPMM every byte the pool
took: its pages and the small requests it passed to cuMemAllocAsync), refused
requests, operations per second, and for VPMM the driver's VMM calls per
operation (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
cuMemAddressReserve/Free) and the pages cuMemSetAccess and cuMemUnmap covered:
each such call costs far more than a pool hit, plus time per page (docs/vpmm.md).
``--direct`` replays the trace on a VirtualMemoryPool in this process, without
PyTorch: it also runs on the test suite's fake driver.
"""

from __future__ import annotations

import json
import random
import sys
import time

from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group.limits import human

DIRECT_HINT = ("`pyvgpu bench vpmm --direct` replays the trace on a VPMM pool without PyTorch or a GPU (also on "
               "a fake driver)")

MiB = 1 << 20
MODES = ("default", "expandable_segments", "vpmm")


def trace(steps: int = 600, requests: int = 4, seed: int = 0) -> list[tuple[str, int, int]]:
    """[("alloc", id, bytes) | ("free", id, 0)]: ``requests`` interleaved generations whose KV buffer grows
    by an odd amount each step (re-allocated, as a naive cache does), plus transient activations."""
    rnd = random.Random(seed)
    ops: list[tuple[str, int, int]] = []
    next_id = 0
    kv: dict[int, tuple[int, int]] = {}  # request slot -> (buffer id, size)
    for step in range(steps):
        r = step % requests
        if r not in kv or rnd.random() < 0.02:  # a new request: a fresh, small cache
            if r in kv:
                ops.append(("free", kv[r][0], 0))
            size = rnd.randrange(16, 48) * MiB + rnd.randrange(4096)
        else:
            ops.append(("free", kv[r][0], 0))
            size = kv[r][1] + rnd.randrange(1, 5) * MiB + 4096 * rnd.randrange(1, 256)
        ops.append(("alloc", next_id, size))
        kv[r] = (next_id, size)
        next_id += 1
        act = [next_id + k for k in range(rnd.randrange(1, 4))]
        for a in act:
            ops.append(("alloc", a, rnd.randrange(1, 24) * MiB + rnd.randrange(4096)))
        next_id += len(act)
        for a in act:
            ops.append(("free", a, 0))
    for buf, _ in kv.values():
        ops.append(("free", buf, 0))
    return ops


def peak_live(ops: list[tuple[str, int, int]]) -> int:
    live = peak = 0
    sizes: dict[int, int] = {}
    for op, i, n in ops:
        if op == "alloc":
            sizes[i] = n
            live += n
            peak = max(peak, live)
        else:
            live -= sizes.pop(i)
    return peak


def replay(ops: list[tuple[str, int, int]], alloc, free) -> dict:
    """Run the trace through alloc(size) -> handle|None and free(handle); refused requests are skipped."""
    held: dict[int, object] = {}
    refused = 0
    t0 = time.perf_counter()
    for op, i, n in ops:
        if op == "alloc":
            h = alloc(n)
            if h is None:
                refused += 1
            else:
                held[i] = h
        elif i in held:
            free(held.pop(i))
    took = time.perf_counter() - t0
    return {"refused": refused, "ops_per_s": len(ops) / took if took > 0 else 0.0}


def pool_costs(before: dict, after: dict, ops: int) -> dict:
    """What a run cost a pool, from two pool.stats(): VMM calls per operation, by function, and pages."""
    calls = {k: after["calls"][k] - before["calls"][k] for k in after["calls"]}
    vmm = after["vmm_calls"] - before["vmm_calls"]
    return {"vmm_calls": vmm, "calls_per_op": vmm / ops if ops else 0.0, "calls": calls,
            "defragmentations": after["defragmentations"] - before["defragmentations"],
            "moved_pages": after["moved_pages"] - before["moved_pages"]}


def run_pool(ops: list[tuple[str, int, int]], pool) -> dict:
    """The trace on a VirtualMemoryPool directly (no PyTorch): what VPMM maps for it."""
    import ctypes

    before = pool.stats()
    unfair = []  # refusals while the device had room for the request and a page more (the goal: none)

    def alloc(n: int):
        try:
            return pool.malloc(n)
        except MemoryError:
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            pool._cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            if free.value >= n + pool.page_size:
                unfair.append((n, free.value))
            return None

    out = replay(ops, alloc, pool.free)
    st = pool.stats()
    out.update(peak_live=peak_live(ops), peak_live_pages=st["peak_live"], peak_reserved=st["peak_taken"],
               peak_mapped=st["peak_mapped"], page_size=st["page_size"], refused_with_room=unfair,
               **pool_costs(before, st, len(ops)))
    return out


def worker(mode: str, steps: int) -> dict:
    """One allocator, in this process (started by run())."""
    import torch

    ops = trace(steps)
    dev = torch.device("cuda:0")

    def alloc(n: int):
        try:
            t = torch.empty(n, dtype=torch.uint8, device=dev)
        except RuntimeError as e:  # torch.OutOfMemoryError; under VPMM a RuntimeError "CUDA out of memory"
            if "out of memory" not in str(e):
                raise
            return None
        if not t.data_ptr():
            raise PyvgpuError(f"bench vpmm: the {mode} allocator returned NULL for {n} bytes")
        return t

    pools: list = []
    if mode == "vpmm":
        from pyvgpu.vpmm import pool as vpmm

        pools = vpmm._TORCH_POOLS
        if not pools:
            raise PyvgpuError("bench vpmm: no VPMM pool is serving PyTorch (was it run under --allocator vpmm?)")
    torch.empty(1, device=dev)  # the context, before timing
    before = pools[0].stats() if pools else None
    out = replay(ops, alloc, lambda t: None)  # dropping the tensor frees it
    torch.cuda.synchronize()
    out["peak_live"] = peak_live(ops)
    if pools:
        st = pools[0].stats()
        out["peak_reserved"] = st["peak_taken"]  # its pages and the small requests' bytes, at their most
        out["peak_mapped"] = st["peak_mapped"]
        out.update(pool_costs(before, st, len(ops)))
        if not out["peak_reserved"]:
            raise PyvgpuError("bench vpmm: the VPMM pool mapped nothing: PyTorch did not allocate through it")
    else:
        out["peak_reserved"] = torch.cuda.max_memory_reserved(dev)
    return out


def run_direct(steps: int = 600, page_size: str | None = None) -> dict:
    """The trace on a VirtualMemoryPool in this process (no PyTorch, no wrap): the allocator alone, with
    VPMM's environment (VPMM_PAGE_SIZE, VPMM_GAP, ...); on a GPU or the test suite's fake driver."""
    from pyvgpu.group.limits import parse_size
    from pyvgpu.vpmm.pool import VirtualMemoryPool

    pool = VirtualMemoryPool(page_size=parse_size(page_size, "--page-size") if page_size else None)
    ops = trace(steps)
    r = run_pool(ops, pool)
    r.pop("refused_with_room")
    return {"bench": "vpmm", "steps": steps, "cap": None, "page_size": page_size or "2M", "ops": len(ops),
            "direct": True, "results": {"vpmm (direct)": r}}


def run(steps: int = 600, cap: str | None = None, page_size: str | None = None) -> dict:
    """Each allocator in its own wrapped process; ``cap`` puts all of them under `--memory`; ``page_size``
    is VPMM's (VPMM_PAGE_SIZE)."""
    import os
    import subprocess

    from pyvgpu.group.limits import parse_size

    if page_size is not None:
        parse_size(page_size, "--page-size")  # a clear error before anything runs
    if cap is not None:
        parse_size(cap, "--cap")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise PyvgpuError(f"bench vpmm runs PyTorch, which is not installed here; {DIRECT_HINT}")
    results = {}
    for mode in MODES:
        env = dict(os.environ)
        env.pop(envspec.PYTORCH_CUDA_ALLOC_CONF.name, None)
        wrap = [sys.executable, "-m", "pyvgpu", "wrap"]
        if cap:
            wrap += ["--memory", cap]
        if mode == "expandable_segments":
            env[envspec.PYTORCH_CUDA_ALLOC_CONF.name] = "expandable_segments:True"
        if mode == "vpmm":
            wrap += ["--allocator", "vpmm"]
            if page_size is not None:
                env[envspec.VPMM_PAGE_SIZE.name] = page_size
        p = subprocess.run([*wrap, "--", sys.executable, "-m", "pyvgpu.bench.vpmm", mode, str(steps)], env=env,
                           capture_output=True, text=True, timeout=1200)
        if p.returncode != 0:
            last = next((line.strip() for line in reversed(p.stderr.splitlines()) if line.strip()), "no output")
            raise PyvgpuError(f"bench vpmm: the {mode} run failed ({last[-300:]}); it needs PyTorch with a GPU: "
                              f"{DIRECT_HINT}")
        results[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    return {"bench": "vpmm", "steps": steps, "cap": cap, "page_size": page_size or "2M", "ops": len(trace(steps)),
            "results": results}


def table(result: dict) -> str:
    lines = [f"  VPMM page {result.get('page_size', '2M')}; {result.get('ops', 0)} operations; VMM calls/op: "
             "cuMemCreate+Map+SetAccess+Unmap+Release+AddressReserve/Free per malloc or free (VPMM only)",
             f"  {'allocator':<20} {'peak live':>12} {'peak reserved':>14} {'over live':>11} {'ratio':>7} "
             f"{'refused':>8} {'ops/s':>10} {'calls/op':>9} {'access':>13} {'unmap':>11}"]
    for mode, r in result["results"].items():
        ratio = r["peak_reserved"] / r["peak_live"] if r["peak_live"] else 0.0
        if "calls" in r:
            c = r["calls"]
            costs = (f"{r['calls_per_op']:>9.3f} {c['cuMemSetAccess']:>5}/{c['cuMemSetAccess_pages']:<6}p "
                     f"{c['cuMemUnmap']:>4}/{c['cuMemUnmap_pages']:<5}p")
        else:
            costs = f"{'-':>9} {'-':>13} {'-':>11}"
        lines.append(f"  {mode:<20} {human(r['peak_live']):>12} {human(r['peak_reserved']):>14} "
                     f"{human(r['peak_reserved'] - r['peak_live']):>11} {ratio:>7.3f} {r['refused']:>8} "
                     f"{r['ops_per_s']:>10.0f} {costs}")
    lines.append("  access, unmap: calls/pages they covered. VPMM's peak reserved counts its pages and the small "
                 "requests' bytes.")
    return "\n".join(lines)

if __name__ == "__main__":
    print(json.dumps(worker(sys.argv[1], int(sys.argv[2]))))
