"""PyTorch's memory API on VPMM (run under `pyvgpu wrap --allocator vpmm --memory 4G`). Prints JSON.

    python torch_vpmm_api.py stats|oom|graph|record_stream|empty_cache

Each part checks one thing PyTorch's CUDAPluggableAllocator leaves out and pyvgpu.vpmm.pytorch fills in
(tests/gpu/test_gpu_vpmm.py asserts the results).
"""

import json
import sys

import torch

import pyvgpu.vpmm.pool as v
from pyvgpu.jit.vpmm import tables as T

MiB, GiB = 1 << 20, 1 << 30
assert v._TORCH_POOLS, "pyvgpu wrap --allocator vpmm installed no pool"
pool = v._TORCH_POOLS[0]
dev = torch.device("cuda:0")


def stats() -> dict:
    a = torch.empty(5 * MiB, dtype=torch.uint8, device=dev)
    b = torch.empty(1000, dtype=torch.uint8, device=dev)
    c = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    del c
    s = torch.cuda.memory_stats(dev)
    out = {"keys": sorted(s), "allocated": torch.cuda.memory_allocated(dev),
           "max_allocated": torch.cuda.max_memory_allocated(dev), "reserved": torch.cuda.memory_reserved(dev),
           "max_reserved": torch.cuda.max_memory_reserved(dev), "pool": pool.memory_stats(),
           "summary_ok": "CUDA OOMs" in torch.cuda.memory_summary(dev)}
    snap = torch.cuda.memory_snapshot()
    out["snapshot_blocks"] = sum(len(seg["blocks"]) for seg in snap)
    out["snapshot_has_a"] = any(blk["address"] == a.data_ptr() and blk["state"] == "active_allocated"
                                for seg in snap for blk in seg["blocks"])
    torch.cuda.reset_peak_memory_stats(dev)
    out["max_allocated_after_reset"] = torch.cuda.max_memory_allocated(dev)
    out["allocated_now"] = torch.cuda.memory_allocated(dev)
    del a, b
    return out


def oom() -> dict:
    out = {}
    try:
        torch.empty(8 * GiB, dtype=torch.uint8, device=dev)
        out["raised"] = None
    except torch.OutOfMemoryError as e:  # noqa: F841 - the class is what is checked
        out["raised"] = "OutOfMemoryError"
        out["message"] = str(e).splitlines()[0]
    except RuntimeError as e:
        out["raised"] = type(e).__name__
        out["message"] = str(e).splitlines()[0]
    out["num_ooms"] = torch.cuda.memory_stats(dev)["num_ooms"]
    out["after_ok"] = float(torch.ones(1 << 20, device=dev).sum()) == 1 << 20
    return out


def graph() -> dict:
    """Capture y = relu(x @ w + 1) (temporaries inside), replay it on new inputs, with allocations between
    replays that must not land on the graph's memory."""
    x = torch.randn(1024, 1024, device=dev)
    w = torch.randn(1024, 1024, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch's docs ask before a capture
        for _ in range(3):
            torch.relu(x @ w + 1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        t = x @ w  # a temporary the graph reuses at every replay
        y = torch.relu(t + 1)
        del t
    out = {"captured": True}
    ok = []
    others = []
    for i in range(4):
        x.copy_(torch.randn(1024, 1024, device=dev))
        other = torch.full((4 * MiB,), float(i), device=dev)  # allocated between replays
        others.append(other)
        g.replay()
        torch.cuda.synchronize()
        ok.append(bool(torch.allclose(y, torch.relu(x @ w + 1), atol=1e-3)))
        ok.append(bool(torch.equal(other, torch.full_like(other, float(i)))))  # the replay did not write on it
    out["replays_ok"] = all(ok)
    out["others_intact"] = all(bool(torch.equal(o, torch.full_like(o, float(i)))) for i, o in enumerate(others))
    out["graph_regions"] = graph_regions()
    g.reset()
    out["graph_regions_after_reset"] = graph_regions()
    return out


def graph_regions() -> int:
    """Regions of the pool that belong to a capture."""
    rows = pool.reg[: int(pool.hd[T.H_NREG])]
    return int((rows[:, T.GRAPH] != 0).sum())


def record_stream() -> dict:
    """A tensor used by a side stream that is still busy (torch.cuda._sleep), freed on the main stream after
    record_stream: the main stream's next allocation of that size must not overwrite it before the side
    stream has read it.

    Every kernel the busy part launches is launched once before it: the first launch of a kernel loads it
    (CUDA lazy loading, the default since 12.2), and loading may synchronise the context (the CUDA
    programming guide's lazy-loading hazards). In the merged tree's GPU run (docs/measurements.md) the first
    `a * 1` on the side stream most likely did: the side stream was idle again by the time the pool looked, so it
    needed no wait (waits 0) and the test failed. `side_busy` says whether the side stream still ran after the
    reuse; only then do the waits prove anything."""
    side = torch.cuda.Stream()
    n = 16 * MiB // 4
    copy = torch.empty(n, device=dev)  # the side stream's output, allocated before the side stream is held
    a = torch.full((n,), 7.0, device=dev)
    with torch.cuda.stream(side):  # warm-up: load every kernel used below
        torch.cuda._sleep(1000)
        copy.copy_(a)
    copy.fill_(0.0)
    torch.cuda.synchronize()
    waits0 = pool.calls()["cuStreamWaitEvent"]
    with torch.cuda.stream(side):
        torch.cuda._sleep(500_000_000)  # ~0.25 s of GPU time before the read
        copy.copy_(a)  # the side stream reads a
    a.record_stream(side)
    ptr = a.data_ptr()
    del a
    b = torch.full((n,), -1.0, device=dev)  # same size, main stream
    side_busy = not side.query()
    torch.cuda.synchronize()
    return {"reused_address": b.data_ptr() == ptr, "side_read_ok": bool(torch.all(copy == 7.0)),
            "side_busy": side_busy, "waits": pool.calls()["cuStreamWaitEvent"] - waits0}


def empty_cache() -> dict:
    xs = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(4)]
    del xs
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved(dev)
    torch.cuda.empty_cache()
    return {"reserved_before": before, "reserved_after": torch.cuda.memory_reserved(dev),
            "mapped_after": pool.stats()["mapped"]}


if __name__ == "__main__":
    print(json.dumps({"stats": stats, "oom": oom, "graph": graph, "record_stream": record_stream,
                      "empty_cache": empty_cache}[sys.argv[1]]()))
