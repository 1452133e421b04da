"""A VPMM pool's statistics in PyTorch's shapes: torch.cuda.memory_stats and memory_snapshot.

The key names are PyTorch's (torch/cuda/memory.py documents them; facts, not
code). How VPMM fills them:

* ``large_pool``: requests of a page or more, served by the pool's pages;
  ``small_pool``: requests under a page, served by cuMemAllocAsync (during a
  CUDA graph capture they take a page from the pool and count as large).
* ``allocated``/``active``: live allocations, in whole pages for the large pool;
  ``requested_bytes``: what was asked. VPMM has no state between them, so
  ``active`` equals ``allocated``.
* ``reserved_bytes``: mapped pages (large) plus the small requests' bytes
  (small); ``reserved_bytes.all.peak`` is every byte the pool took at its most.
* ``segment``: pages created (large), small allocations (small).
* ``inactive_split``: 0. VPMM never splits a page, and every free page can be
  given back (``pool.trim``), so nothing is "inactive, non-releasable".
* ``num_alloc_retries``: refusals retried after giving cached memory back;
  ``num_ooms``: requests refused; ``num_device_alloc``/``num_device_free``:
  cuMemMap + cuMemAllocAsync / cuMemUnmap + cuMemFreeAsync calls;
  ``num_sync_all_streams``, ``num_oom_rejections``, the oversize counters: 0 (VPMM
  has no such mechanism); ``max_split_size``: -1 (no limit), as PyTorch reports it.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from pyvgpu.jit.vpmm import tables as T


class VirtualMemoryPool(Protocol):
    """What these functions read of a pyvgpu.vpmm.pool.VirtualMemoryPool (named structurally: that module
    imports this one)."""

    hd: np.ndarray
    reg: np.ndarray
    device: int

    def calls(self) -> dict[str, int]: ...

POOLS = ("all", "large_pool", "small_pool")
METRICS = ("current", "peak", "allocated", "freed")
# PyTorch's name -> the pool's statistic for (all, large_pool, small_pool)
_CORE = {
    "allocation": (T.ST_ALLOC_ALL, T.ST_ALLOC_LARGE, T.ST_ALLOC_SMALL),
    "allocated_bytes": (T.ST_BYTES_ALL, T.ST_BYTES_LARGE, T.ST_BYTES_SMALL),
    "active": (T.ST_ALLOC_ALL, T.ST_ALLOC_LARGE, T.ST_ALLOC_SMALL),
    "active_bytes": (T.ST_BYTES_ALL, T.ST_BYTES_LARGE, T.ST_BYTES_SMALL),
    "requested_bytes": (T.ST_REQ_ALL, T.ST_REQ_LARGE, T.ST_REQ_SMALL),
    "reserved_bytes": (T.ST_RES_ALL, T.ST_RES_LARGE, T.ST_RES_SMALL),
    "segment": (T.ST_SEG_ALL, T.ST_SEG_LARGE, T.ST_SEG_SMALL),
}
_ZERO_CORE = ("inactive_split", "inactive_split_bytes")


def nested(pool: VirtualMemoryPool) -> dict[str, Any]:
    """torch.cuda.memory_stats_as_nested_dict's shape (what torch._C._cuda_memoryStats returns)."""
    hd = pool.hd

    def stat(s: int) -> dict[str, int]:
        b = T.H_STATS + 4 * s
        return dict(zip(METRICS, (int(hd[b + k]) for k in range(4)), strict=True))

    zero = dict.fromkeys(METRICS, 0)
    out: dict[str, Any] = {name: {p: stat(s) for p, s in zip(POOLS, ids, strict=True)} for name, ids in _CORE.items()}
    for name in _ZERO_CORE:
        out[name] = {p: dict(zero) for p in POOLS}
    calls = pool.calls()
    out.update({
        "num_alloc_retries": int(hd[T.H_RETRIES]), "num_ooms": int(hd[T.H_OOMS]), "num_sync_all_streams": 0,
        "num_device_alloc": calls["cuMemMap"] + calls["cuMemAllocAsync"],
        "num_device_free": calls["cuMemUnmap"] + calls["cuMemFreeAsync"], "num_oom_rejections": 0,
        "max_split_size": -1, "oversize_allocations": dict(zero), "oversize_segments": dict(zero),
    })
    return out


def flatten(stats: dict[str, Any], prefix: str = "") -> dict[str, int]:
    """torch.cuda.memory_stats' flat form: nested keys joined with '.', sorted."""
    flat: list[tuple[str, int]] = []

    def walk(p: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{p}.{k}" if p else str(k), v)
        else:
            flat.append((p, obj))

    walk(prefix, stats)
    return dict(sorted(flat))


def memory_stats(pool: VirtualMemoryPool) -> dict[str, int]:
    return flatten(nested(pool))


def snapshot(pool: VirtualMemoryPool) -> list[dict[str, Any]]:
    """torch.cuda.memory_snapshot()'s shape: one segment per run of mapped regions (live and free; zombies
    and holes hold no memory of their own), its blocks the regions."""
    n = int(pool.hd[T.H_NREG])
    rows = pool.reg[:n]
    segments: list[dict[str, Any]] = []
    seg: dict[str, Any] | None = None
    for r in rows:
        state = int(r[T.STATE])
        if state not in (T.MALLOC, T.FREE):
            seg = None
            continue
        addr, size = int(r[T.ADDR]), int(r[T.SIZE])
        if seg is None or seg["address"] + seg["total_size"] != addr:
            seg = {"device": pool.device, "address": addr, "total_size": 0, "allocated_size": 0, "active_size": 0,
                   "requested_size": 0, "stream": int(r[T.STREAM]), "segment_type": "large",
                   "segment_pool_id": (0, int(r[T.GRAPH])), "is_expandable": True, "frames": [], "blocks": []}
            segments.append(seg)
        live = state == T.MALLOC
        req = int(r[T.REQ]) if live else 0
        seg["total_size"] += size
        if live:
            seg["allocated_size"] += size
            seg["active_size"] += size
            seg["requested_size"] += req
        seg["blocks"].append({"address": addr, "size": size, "requested_size": req,
                              "state": "active_allocated" if live else "inactive", "frames": []})
    return segments
