"""VPMM: a defragmenting GPU memory pool on the CUDA virtual-memory API (docs/vpmm.md).

    pool = VirtualMemoryPool(device=0)
    p = pool.malloc(64 << 20, stream)
    pool.free(p, stream)
    pool.stats(); pool.memory_stats(); print(pool.dump())

Configuration (arguments win over the environment): VPMM_PAGE_SIZE (bytes, at
least the device's VMM granularity, default 2 MiB), VPMM_VA_SIZE (bytes of
address space per reserved chunk, default 8 TiB), VPMM_PAGES (pages mapped at
start, default 0), VPMM_GAP (address space left free on each side of a span
placed in a fresh hole, so that it can grow in place; default 1 GiB, 0 packs
spans as docs/vpmm.md's pictures do), VPMM_CONTEXT (pool: every driver call runs in
the device's primary context, on any thread; caller, a diagnostic: in whatever
context the calling thread has, as before issue 32). The allocator core is ``pyvgpu.jit.vpmm.core``;
PyTorch's side is ``pyvgpu.vpmm.pytorch`` (``enable()`` makes VPMM PyTorch's allocator); it imports this
module, never the other way round.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from pyvgpu.contract import abi, envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group.limits import human, parse_size
from pyvgpu.jit.vpmm import entries as V
from pyvgpu.jit.vpmm import tables as T

DEFAULT_PAGE = 2 << 20
DEFAULT_VA = 8 << 40
DEFAULT_GAP = 1 << 30
MAX_REGIONS = 1 << 14
PAGE_SLOTS = 1 << 18  # mapped page addresses the pool can track (half of them in use at most: 256 GiB at 2 MiB)
STATE_MARK = {T.MALLOC: "+", T.FREE: "-", T.HOLE: "*", T.ZOMBIE: "z"}
VMM_FUNCS = (T.F_RESERVE, T.F_CREATE, T.F_MAP, T.F_SET_ACCESS, T.F_UNMAP, T.F_RELEASE, T.F_ADDR_FREE)


class _Entries(NamedTuple):
    malloc: Callable[[int, int, int], int]
    free: Callable[[int, int, int, int], int]
    trim: Callable[[int, int], int]
    preallocate: Callable[[int, int], int]
    record_stream: Callable[[int, int, int, int], int]
    capture: Callable[[int, int, int], int]
    addresses: tuple[int, ...]  # of the same functions, in the same order


@functools.cache
def _entries() -> _Entries:
    """The C entry points as ctypes functions: services of the callback library (pyvgpu.contract.hooks.SERVICES),
    compiled with every other callback."""
    from pyvgpu.native import services

    names = ("vpmm_malloc", "vpmm_free", "vpmm_trim", "vpmm_preallocate", "vpmm_record_stream", "vpmm_capture")
    fns = services.functions()
    return _Entries(*(fns[n] for n in names), tuple(services.address(n) for n in names))


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_uint), ("requestedHandleTypes", ctypes.c_uint), ("loc_type", ctypes.c_uint),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", ctypes.c_uint), ("loc_id", ctypes.c_int), ("flags", ctypes.c_uint)]


def _config(value: int | None, env: Mapping[str, str], name: str, default: int, allow_zero: bool = False) -> int:
    if value is not None:
        if value < 0 or (value == 0 and not allow_zero):
            raise PyvgpuError(f"{name}={value}: give a positive number")
        return value
    text = env.get(name, "").strip()
    if not text:
        return default
    if allow_zero and text == "0":
        return 0
    return parse_size(text, name)


def _watch(env: Mapping[str, str], device: int) -> tuple[int, int]:
    """Addresses of the group's refusal counter and memory cap for device, in a read-only mapping of the
    region that is never unmapped (0, 0 outside pyvgpu wrap). The pool reads them at each operation and
    gives free pages back after a refusal or a lowered cap."""
    from pyvgpu.contract import layout as L
    from pyvgpu.group import region

    path = region.path_from_env(env)
    if path is None or not 0 <= device < L.MAX_DEVICES:
        return 0, 0
    addr = region.watch(path)  # checked (magic, version, size, owner) and mapped by the group core
    dev = addr + L.REGION_DEVICES_OFF + device * L.REGION_DEVICE.size
    return dev + L.REGION_DEVICE.offset("oom_refusals"), dev + L.REGION_DEVICE.offset("limit")


class VirtualMemoryPool:
    """A pool of device pages mapped into reserved address space; see the module docstring."""

    def __init__(self, device: int = 0, page_size: int | None = None, va_size: int | None = None,
                 pages: int | None = None, gap: int | None = None, max_regions: int | None = None,
                 env: Mapping[str, str] = os.environ) -> None:
        self.device = device
        self.page_size = _config(page_size, env, envspec.VPMM_PAGE_SIZE.name, DEFAULT_PAGE)
        self.va_size = _config(va_size, env, envspec.VPMM_VA_SIZE.name, DEFAULT_VA)
        self.gap = _config(gap, env, envspec.VPMM_GAP.name, DEFAULT_GAP, allow_zero=True)
        n_pages = _config(pages, env, envspec.VPMM_PAGES.name, 0, allow_zero=True)
        self.context = env.get(envspec.VPMM_CONTEXT.name, "").strip() or "pool"
        if self.context not in ("pool", "caller"):
            raise PyvgpuError(f"VPMM_CONTEXT={self.context}: give 'pool' (the default: every driver call in the "
                              "device's primary context) or 'caller' (a diagnostic: the calling thread's, as "
                              "before issue 32)")
        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise PyvgpuError(f"VPMM needs the CUDA driver (libcuda.so.1): {e}") from None
        self._cu = cu
        self._ctx = ctypes.c_void_p(self._primary(cu, device))
        self._prop = _Prop(type=1, loc_type=1, loc_id=device)  # pinned device memory
        self._access = _Access(loc_type=1, loc_id=device, flags=3)  # read and write
        gran = ctypes.c_size_t()
        with self._current():
            rc = cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self._prop), 0)
        if rc != 0:
            raise PyvgpuError(f"VPMM: device {device} has no VMM support (cuMemGetAllocationGranularity -> {rc})")
        if self.page_size % gran.value:
            raise PyvgpuError(f"VPMM_PAGE_SIZE={self.page_size}: give a multiple of device {device}'s VMM "
                              f"granularity, {human(gran.value)}")
        if self.va_size % self.page_size:
            raise PyvgpuError(f"VPMM_VA_SIZE={self.va_size}: give a multiple of the page size {self.page_size}")
        self.gap = -(-self.gap // self.page_size) * self.page_size
        rows = MAX_REGIONS if max_regions is None else max_regions
        if not 4 <= rows <= MAX_REGIONS:
            raise PyvgpuError(f"VPMM max_regions={rows}: give 4 to {MAX_REGIONS}")
        self.max_regions = rows
        self.reg = np.zeros((rows, T.NCOL), dtype=np.int64)
        self.pg = np.zeros((PAGE_SLOTS, 2), dtype=np.int64)
        self.hd = np.zeros(T.HD_SIZE, dtype=np.int64)
        self.scr = np.zeros(3 * rows + 2 * PAGE_SLOTS, dtype=np.int64)
        hd = self.hd
        hd[T.H_PAGE], hd[T.H_VA], hd[T.H_DEV], hd[T.H_GAP] = self.page_size, self.va_size, device, self.gap
        hd[T.H_PROP], hd[T.H_ACCESS] = ctypes.addressof(self._prop), ctypes.addressof(self._access)
        hd[T.H_NEXT_ID] = 1
        # every entry point's driver calls run with it current (issue 32); VPMM_CONTEXT=caller (a diagnostic)
        # leaves them in whatever context the calling thread has, as before
        hd[T.H_CTX] = 0 if self.context == "caller" else self._ctx.value
        for f, name in enumerate(T.FN_NAMES):
            hd[T.H_FN + f] = ctypes.cast(getattr(cu, name), ctypes.c_void_p).value
        mempool = ctypes.c_void_p()
        with self._current():
            if cu.cuDeviceGetDefaultMemPool(ctypes.byref(mempool), device) == 0 and mempool.value:
                hd[T.H_MEMPOOL] = mempool.value  # where the small requests' memory is cached
        refusals, limit = _watch(env, device)
        if refusals:
            hd[T.H_WATCH_REFUSALS], hd[T.H_WATCH_LIMIT] = refusals, limit
            hd[T.H_SEEN_REFUSALS] = ctypes.c_int64.from_address(refusals).value
            hd[T.H_SEEN_LIMIT] = ctypes.c_int64.from_address(limit).value
        self._small: dict[int, int] = {}
        # the block the C entry points take (pyvgpu.jit.vpmm.core.S_*): this pool's tables, by address
        self.state = (ctypes.c_int64 * V.N_STATE)(self.reg.ctypes.data, rows, self.pg.ctypes.data, PAGE_SLOTS,
                                                  self.hd.ctypes.data, T.HD_SIZE, self.scr.ctypes.data,
                                                  self.scr.size)
        self._addr = ctypes.addressof(self.state)  # what the entry points take
        self._e = _entries()
        self._check(self._e.preallocate(self._addr, n_pages), f"VPMM_PAGES={n_pages}")


    @staticmethod
    def _primary(cu: ctypes.CDLL, device: int) -> int:
        """Device's primary context, retained for the pool's life (the process's: PyTorch's tensors live in
        it). Every driver call of the pool runs with it current, on any thread (issue 32: taking whatever
        context the creating thread had made a pool of the second GPU use the first one's). A thread with no
        context at all gets it current, as the CUDA runtime's first call on a thread would do."""
        if cu.cuInit(0) != 0:
            raise PyvgpuError("VPMM: cuInit failed; is there a GPU (pyvgpu doctor)?")
        ctx = ctypes.c_void_p()
        rc = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
        if rc != 0 or not ctx.value:
            raise PyvgpuError(f"VPMM: no context on device {device} (cuDevicePrimaryCtxRetain -> {rc})")
        cur = ctypes.c_void_p()
        if cu.cuCtxGetCurrent(ctypes.byref(cur)) == 0 and not cur.value and cu.cuCtxSetCurrent(ctx) != 0:
            raise PyvgpuError(f"VPMM: cannot make device {device}'s primary context current")
        return ctx.value

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """The pool's context current on this thread for the Python side's own driver calls; the thread's
        own is given back after (the entry points do the same in numba: pyvgpu.jit.vpmm.driver.ctx_enter)."""
        cur = ctypes.c_void_p()
        if self._cu.cuCtxGetCurrent(ctypes.byref(cur)) != 0 or cur.value == self._ctx.value:
            yield
            return
        if self._cu.cuCtxSetCurrent(self._ctx) != 0:
            raise PyvgpuError(f"VPMM: cannot make device {self.device}'s primary context current")
        try:
            yield
        finally:
            self._cu.cuCtxSetCurrent(cur)

    def _check(self, rc: int, what: str, after: str = "the pool is unchanged") -> int:
        if rc >= 0:
            return rc
        if rc == T.ERR_TABLE_FULL:
            raise PyvgpuError(f"VPMM {what}: the pool's tables are full ({self.max_regions} regions, {T.MAX_EVENTS} "
                              f"events, {PAGE_SLOTS // 2} page addresses, {T.MAX_SIDE} record_stream pairs); "
                              "pool.trim() gives rows back, a larger VPMM_PAGE_SIZE needs fewer")
        cu_rc = -rc + T.ERR_DRIVER
        if cu_rc == abi.CUDA_ERROR_OUT_OF_MEMORY:
            raise MemoryError(f"VPMM {what}: out of device memory (or over the vGPU's cap); {self._brief()}")
        raise PyvgpuError(f"VPMM {what}: the driver returned CUresult {cu_rc}; {after}")

    def malloc(self, size: int, stream: int = 0) -> int:
        """Device memory for ``size`` bytes, usable on ``stream``; raises MemoryError when none can be had."""
        if size < 0:
            raise PyvgpuError(f"VPMM malloc({size}): a size cannot be negative")
        ptr = self._check(self._e.malloc(self._addr, size, stream), f"malloc({size})")
        if size < self.page_size and not self._owns(ptr):
            self._small[ptr] = max(size, 1)
        return ptr

    def _owns(self, ptr: int) -> bool:
        """A live allocation of the pool's pages starts at ptr (during a capture, small requests are pages)."""
        rows = self.reg[: int(self.hd[T.H_NREG])]
        return bool(np.any((rows[:, T.ADDR] == ptr) & (rows[:, T.STATE] == T.MALLOC)))

    def free(self, ptr: int, stream: int = 0) -> None:
        """Give ``ptr`` back after the work queued on ``stream`` so far; a pointer that is not live is an error."""
        rc = self._e.free(self._addr, ptr, stream, self._small.get(ptr, 0))
        if rc == 0:
            self._small.pop(ptr, None)
            return
        if ptr in self._small:
            raise PyvgpuError(f"VPMM free({ptr:#x}): cuMemFreeAsync returned {rc}")
        if rc == abi.CUDA_ERROR_INVALID_VALUE:
            raise PyvgpuError(f"VPMM free({ptr:#x}): not a live allocation of this pool (freed twice, or "
                              "never allocated here)")
        self._check(rc if rc < 0 else T.ERR_DRIVER - rc, f"free({ptr:#x})")

    def record_stream(self, ptr: int, stream: int, size: int | None = None) -> None:
        """``ptr`` (a live allocation; ``size`` bytes if it is a small one this object did not make) is also
        used on ``stream``: its free waits for that stream's work too (what Tensor.record_stream asks of
        PyTorch's allocator)."""
        rc = self._e.record_stream(self._addr, ptr, stream, self._small.get(ptr, size or 0))
        if rc == abi.CUDA_ERROR_INVALID_VALUE:
            raise PyvgpuError(f"VPMM record_stream({ptr:#x}): not a live allocation of this pool")
        self._check(rc, f"record_stream({ptr:#x})")

    def trim(self, release: bool = True) -> int:
        """Unmap the old addresses of moved pages whose work is done and, with ``release``, give every free
        page nobody can still be using back to the driver (and the vGPU's cap). Returns the pages released."""
        return self._check(self._e.trim(self._addr, int(release)), "trim", "the pages released before it stay "
                           "released, the rest of the pool is as it was")

    def capture_begin(self, stream: int) -> int:
        """A CUDA graph capture is about to begin on ``stream`` (pyvgpu.vpmm.pytorch calls this for PyTorch);
        returns its epoch: the memory the capture allocates is tagged with it."""
        return self._check(self._e.capture(self._addr, stream, 1), "capture_begin")

    def capture_end(self, stream: int) -> None:
        self._check(self._e.capture(self._addr, stream, 0), "capture_end")

    def release_graph_memory(self, epoch: int = 0) -> int:
        """The graphs of capture ``epoch`` (0: all) are gone: their memory becomes ordinary pool memory. Synchronises
        the context first (replays may still run). Returns the regions released."""
        if epoch < 0:
            raise PyvgpuError(f"VPMM release_graph_memory({epoch}): give a capture epoch (>= 0)")
        return self._check(self._e.capture(self._addr, 0, -epoch - 1), "release_graph_memory")

    def regions(self) -> list[tuple[int, int, str, int]]:
        """(address, size, state, stream) of every region, in address order; state is + - * or z."""
        n = int(self.hd[T.H_NREG])
        return [(int(r[T.ADDR]), int(r[T.SIZE]), STATE_MARK[int(r[T.STATE])], int(r[T.STREAM]))
                for r in self.reg[:n]]

    def layout(self, holes_after_last: bool = False, holes: bool = True) -> str:
        """The regions in docs/vpmm.md's notation, in pages: '[+4][-6][1]...'; the unmapped tail of a chunk
        is left out unless asked for, as its pictures do (``holes=False`` leaves out every hole).
        Live regions are '+'."""
        rows = self.regions()
        while rows and rows[-1][2] == "*" and not holes_after_last:
            rows.pop()
        return "".join(f"[{m}{s // self.page_size}]" for _, s, m, _ in rows if holes or m != "*")

    def _stat(self, s: int, which: int = T.CUR) -> int:
        return int(self.hd[T.H_STATS + 4 * s + which])

    def calls(self) -> dict[str, int]:
        """Driver calls the pool made, by function (and the pages cuMemSetAccess and cuMemUnmap covered)."""
        out = {name: int(self.hd[T.H_CALLS + f]) for f, name in enumerate(T.FN_NAMES)}
        out["cuMemSetAccess_pages"] = int(self.hd[T.H_ACCESS_PAGES])
        out["cuMemUnmap_pages"] = int(self.hd[T.H_UNMAP_PAGES])
        return out

    def stats(self) -> dict[str, Any]:
        """The observability figures of docs/vpmm.md in bytes, the peaks, and what the pool asked of the driver."""
        rows = self.regions()

        def total(mark: str) -> int:
            return sum(s for _, s, m, _ in rows if m == mark)

        hd = self.hd
        ops = int(hd[T.H_MALLOCS] + hd[T.H_FREES])
        vmm = sum(int(hd[T.H_CALLS + f]) for f in VMM_FUNCS)
        return {"mapped": int(hd[T.H_PAGES]) * self.page_size, "reserved_va": sum(s for _, s, _, _ in rows),
                "live": total("+"), "reusable": total("-"), "holes": total("*"), "zombies": total("z"),
                "pages": int(hd[T.H_PAGES]), "small_live": int(hd[T.H_SMALL]),
                "defragmentations": int(hd[T.H_DEFRAGS]), "page_size": self.page_size,
                "peak_mapped": self._stat(T.ST_RES_LARGE, T.PEAK),
                "peak_taken": self._stat(T.ST_RES_ALL, T.PEAK),  # mapped pages + small requests: all it took
                "peak_live": self._stat(T.ST_BYTES_LARGE, T.PEAK), "mallocs": int(hd[T.H_MALLOCS]),
                "frees": int(hd[T.H_FREES]), "moved_pages": int(hd[T.H_MOVED]),
                "in_place_pages": int(hd[T.H_INPLACE]), "released_pages": int(hd[T.H_RELEASED]),
                "trims": int(hd[T.H_TRIMS]), "ooms": int(hd[T.H_OOMS]), "retries": int(hd[T.H_RETRIES]),
                # calls that came from a thread without the pool's context current (they switched to it)
                "context_switches": int(hd[T.H_CTX_NONE] + hd[T.H_CTX_OTHER]),
                "entered_without_context": int(hd[T.H_CTX_NONE]),
                "entered_with_another_context": int(hd[T.H_CTX_OTHER]),
                "vmm_calls": vmm, "vmm_calls_per_op": vmm / ops if ops else 0.0, "calls": self.calls()}

    def memory_stats(self) -> dict[str, int]:
        """The pool's statistics under torch.cuda.memory_stats' key names (pyvgpu/vpmm/stats.py)."""
        from pyvgpu.vpmm.stats import memory_stats

        return memory_stats(self)

    def memory_snapshot(self) -> list[dict[str, Any]]:
        """The pool's memory as torch.cuda.memory_snapshot() shapes it: one segment per mapped run."""
        from pyvgpu.vpmm.stats import snapshot

        return snapshot(self)

    def reset_peak_stats(self) -> None:
        """As torch.cuda.reset_peak_memory_stats: every peak becomes the current value."""
        for s in range(T.N_STATS):
            self.hd[T.H_STATS + 4 * s + T.PEAK] = self.hd[T.H_STATS + 4 * s + T.CUR]

    def reset_accumulated_stats(self) -> None:
        """As torch.cuda.reset_accumulated_memory_stats: the allocated and freed totals, OOMs and retries."""
        for s in range(T.N_STATS):
            self.hd[T.H_STATS + 4 * s + T.ALLOCATED] = 0
            self.hd[T.H_STATS + 4 * s + T.FREED] = 0
        self.hd[T.H_OOMS] = self.hd[T.H_RETRIES] = 0

    def _brief(self) -> str:
        s = self.stats()
        return f"mapped {human(s['mapped'])}, live {human(s['live'])}, reusable {human(s['reusable'])}"

    def dump(self) -> str:
        """The figures, then every region in address order."""
        s = self.stats()
        sizes = ("mapped", "reserved_va", "live", "reusable", "holes", "zombies", "small_live", "peak_mapped",
                 "peak_taken")
        lines = [f"VPMM device {self.device}: page {human(self.page_size)}, " + ", ".join(
            f"{k} {human(s[k])}" for k in sizes) + f", pages {s['pages']}, defragmentations "
            f"{s['defragmentations']}, VMM calls {s['vmm_calls']}"]
        names = {"+": "live", "-": "free", "*": "unmapped", "z": "zombie"}
        for a, size, m, stream in self.regions():
            extra = f" stream {stream:#x}" if m in "-" else ""
            lines.append(f"  {a:#016x} {human(size):>12} {names[m]}{extra}")
        return "\n".join(lines)


_TORCH_POOLS: list[VirtualMemoryPool] = []  # alive as long as the process: PyTorch holds their memory


def install(lib: ctypes.CDLL, pool: VirtualMemoryPool) -> None:
    """Serve ``pool.device`` through the shim's pyvgpu_vpmm_malloc/free (what PyTorch calls)."""
    m_addr, f_addr = _entries().addresses[:2]
    lib.pyvgpu_vpmm_install.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    if lib.pyvgpu_vpmm_install(pool.device, m_addr, f_addr, ctypes.addressof(pool.state)) != 0:
        raise PyvgpuError(f"VPMM: the shim refused a pool for device {pool.device}")
