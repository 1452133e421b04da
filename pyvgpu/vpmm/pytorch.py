"""PyTorch on VPMM: the allocator, and the parts PyTorch's pluggable-allocator API leaves out (docs/vpmm.md).

``enable()`` makes one pool per visible device and swaps PyTorch's CUDA
allocator for the shim's pyvgpu_vpmm_malloc/free (CUDAPluggableAllocator).
From Python, CUDAPluggableAllocator takes those two functions only; its C++
side answers the statistics, the snapshot and the peak resets with "does not
yet support", has no Python way to set a record_stream function, and ignores
CUDA graph pools (torch/csrc/cuda/CUDAPluggableAllocator.cpp, PyTorch 2.x).
So ``enable()`` also routes, at the Python level:

* ``torch._C._cuda_memoryStats``, ``_cuda_resetPeakMemoryStats``,
  ``_cuda_resetAccumulatedMemoryStats``, ``_cuda_memorySnapshot`` to the pools:
  every ``torch.cuda.memory_*``/``max_memory_*`` function, ``memory_summary``
  and ``memory_snapshot`` read through these;
* ``torch._C._cuda_emptyCache`` (``torch.cuda.empty_cache``) to ``pool.trim()``;
* ``Tensor.record_stream`` to the pool's record_stream;
* ``torch.cuda.CUDAGraph.capture_begin``/``capture_end``/``reset`` to the
  pool's capture bookkeeping (memory a capture allocates is kept for it).

C++ callers of the allocator (torch.compile's pool checks, cuDNN's cacheInfo,
c10d's own recordStream) still meet the pluggable allocator's refusals.
"""

from __future__ import annotations

from typing import Any

from pyvgpu.errors import PyvgpuError
from pyvgpu.vpmm.pool import _TORCH_POOLS, VirtualMemoryPool, install
from pyvgpu.vpmm.stats import nested, snapshot

_ROUTED: dict[str, Any] = {}  # the originals we replaced, by name (pyvgpu.vpmm.pytorch.restore puts them back)


def _pool(device: Any) -> VirtualMemoryPool:
    import torch

    if device is None:
        idx = torch.cuda.current_device()
    elif isinstance(device, int):
        idx = device
    else:
        idx = torch.device(device).index
        idx = torch.cuda.current_device() if idx is None else idx
    for p in _TORCH_POOLS:
        if p.device == idx:
            return p
    raise PyvgpuError(f"VPMM: no pool for CUDA device {idx} (pyvgpu.vpmm.pytorch.enable made pools for "
                      f"{[p.device for p in _TORCH_POOLS]})")


def _memory_stats(device: Any = None) -> dict[str, Any]:
    return nested(_pool(device))


def _reset_peak(device: Any = None) -> None:
    _pool(device).reset_peak_stats()


def _reset_accumulated(device: Any = None) -> None:
    _pool(device).reset_accumulated_stats()


def _memory_snapshot(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
    segments = [seg for p in _TORCH_POOLS for seg in snapshot(p)]
    return {"segments": segments, "device_traces": [[] for _ in _TORCH_POOLS]}


def _route(obj: Any, name: str, new: Any) -> None:
    key = f"{getattr(obj, '__name__', type(obj).__name__)}.{name}"
    if key not in _ROUTED:
        _ROUTED[key] = (obj, name, getattr(obj, name, None))
    setattr(obj, name, new)


def restore() -> None:
    """Put back what enable() replaced (the pools keep serving PyTorch's allocations)."""
    for obj, name, old in _ROUTED.values():
        if old is not None:
            setattr(obj, name, old)
    _ROUTED.clear()


def route_stats(torch: Any) -> None:
    """torch.cuda's statistics, snapshot and empty_cache, answered by the pools."""
    c = torch._C
    _route(c, "_cuda_memoryStats", _memory_stats)
    _route(c, "_cuda_resetPeakMemoryStats", _reset_peak)
    _route(c, "_cuda_resetAccumulatedMemoryStats", _reset_accumulated)
    _route(c, "_cuda_memorySnapshot", _memory_snapshot)
    empty = getattr(c, "_cuda_emptyCache", None)

    def empty_cache() -> None:
        if empty is not None:
            empty()
        for p in _TORCH_POOLS:
            p.trim()

    _route(c, "_cuda_emptyCache", empty_cache)


def route_record_stream(torch: Any) -> None:
    """Tensor.record_stream(s): the pool's free of the tensor's memory then waits for s's work too."""
    original = torch.Tensor.record_stream

    def record_stream(self: Any, stream: Any) -> None:
        original(self, stream)  # the pluggable allocator ignores it; kept for anything else that listens
        if self.is_cuda:
            storage = self.untyped_storage()
            if storage.data_ptr():
                _pool(self.device).record_stream(storage.data_ptr(), stream.cuda_stream, storage.nbytes())

    record_stream.__doc__ = original.__doc__
    _route(torch.Tensor, "record_stream", record_stream)


def route_graphs(torch: Any) -> None:
    """CUDA graph captures: the pool of the capturing device learns when a capture begins and ends, and when
    the graph is reset, so that memory the capture allocated is reused only by that capture, never outside
    it while the graph may replay (what PyTorch's private graph pools do for its own allocator)."""
    graph = torch.cuda.CUDAGraph
    begin, end, reset = graph.capture_begin, graph.capture_end, graph.reset

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        pool = _pool(None)
        stream = torch.cuda.current_stream().cuda_stream
        self._pyvgpu_capture = (pool, stream, pool.capture_begin(stream))
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            pool.capture_end(stream)
            raise

    def capture_end(self: Any) -> Any:
        try:
            return end(self)
        finally:
            cap = getattr(self, "_pyvgpu_capture", None)
            if cap is not None:
                cap[0].capture_end(cap[1])

    def graph_reset(self: Any) -> Any:
        out = reset(self)
        cap = getattr(self, "_pyvgpu_capture", None)
        if cap is not None:
            self._pyvgpu_capture = None
            cap[0].release_graph_memory(cap[2])
        return out

    _route(graph, "capture_begin", capture_begin)
    _route(graph, "capture_end", capture_end)
    _route(graph, "reset", graph_reset)


def enable(**pool_options: int) -> list[VirtualMemoryPool]:
    """Make VPMM PyTorch's CUDA allocator: one pool per visible device. Call it before the first CUDA
    allocation (PyTorch cannot swap its allocator after that); `pyvgpu wrap --allocator vpmm` does it
    right after `import torch`. Returns the pools (their stats() and dump() show what PyTorch holds)."""
    import torch
    from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

    from pyvgpu.native import shim

    # PyTorch dlopens the library by path: it must be the very copy that holds the pools (the preloaded
    # shim when wrapped), or its malloc finds no pool
    lib, path = shim.loaded(), shim.loaded_path()
    if lib is None or path is None:
        lib, path = shim.open_shim(), shim.shim_path()
    pools = [VirtualMemoryPool(device=d, **pool_options) for d in range(torch.cuda.device_count())]
    for pool in pools:
        install(lib, pool)
    try:
        change_current_allocator(CUDAPluggableAllocator(str(path), "pyvgpu_vpmm_malloc",
                                                        "pyvgpu_vpmm_free"))
    except RuntimeError as e:
        raise PyvgpuError(f"VPMM: PyTorch did not take the allocator ({e}); enable it before the first CUDA "
                          "tensor, or use `pyvgpu wrap --allocator vpmm`") from None
    _TORCH_POOLS.extend(pools)
    route_stats(torch)
    route_record_stream(torch)
    route_graphs(torch)
    return pools
