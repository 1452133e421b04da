"""VPMM: a defragmenting GPU memory pool on the CUDA virtual-memory API (docs/vpmm.md).

    pool = VirtualMemoryPool(device=0)
    p = pool.malloc(64 << 20, stream)
    pool.free(p, stream)
    pool.stats(); print(pool.dump())

Configuration (arguments win over the environment): VPMM_PAGE_SIZE (bytes, at
least the device's VMM granularity, default 2 MiB), VPMM_VA_SIZE (bytes of
address space per reserved chunk, default 8 TiB), VPMM_PAGES (pages mapped at
start, default 0). The allocator core is ``pyvgpu.jit.vpmm``.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from pyvgpu import abi
from pyvgpu.errors import PyvgpuError
from pyvgpu.jit import vpmm as V
from pyvgpu.jit import vpmm_tables as T
from pyvgpu.limits import human, parse_size

DEFAULT_PAGE = 2 << 20
DEFAULT_VA = 8 << 40
MAX_REGIONS = 1 << 14
PAGE_SLOTS = 1 << 17  # pages the pool can map (256 GiB at 2 MiB)
_FUNCS = {T.F_RESERVE: "cuMemAddressReserve", T.F_CREATE: "cuMemCreate", T.F_MAP: "cuMemMap",
          T.F_SET_ACCESS: "cuMemSetAccess", T.F_UNMAP: "cuMemUnmap", T.F_EV_CREATE: "cuEventCreate",
          T.F_EV_RECORD: "cuEventRecord", T.F_EV_QUERY: "cuEventQuery", T.F_WAIT: "cuStreamWaitEvent",
          T.F_ALLOC_ASYNC: "cuMemAllocAsync", T.F_FREE_ASYNC: "cuMemFreeAsync", T.F_RELEASE: "cuMemRelease"}
STATE_MARK = {T.MALLOC: "+", T.FREE: "-", T.HOLE: "*", T.ZOMBIE: "z"}


class _Entries(NamedTuple):
    malloc: Callable[[int, int, int], int]
    free: Callable[[int, int, int, int], int]
    trim: Callable[[int], int]
    preallocate: Callable[[int, int], int]
    cfuncs: tuple  # numba's objects, in the same order: they own the code (and know its .address)


@functools.cache
def _entries() -> _Entries:
    """The compiled C entry points as ctypes functions (compiled, or loaded from numba's cache, once per
    process)."""
    c = V.compile_entries()
    i64, u64 = ctypes.c_int64, ctypes.c_uint64
    types = ((i64, u64, i64, u64), (i64, u64, i64, u64, i64), (i64, u64), (i64, u64, i64))
    fns = [ctypes.CFUNCTYPE(*t)(f.address) for t, f in zip(types, c, strict=True)]
    return _Entries(*fns, c)


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


class VirtualMemoryPool:
    """A pool of device pages mapped into reserved address space; see the module docstring."""

    def __init__(self, device: int = 0, page_size: int | None = None, va_size: int | None = None,
                 pages: int | None = None, env: Mapping[str, str] = os.environ) -> None:
        self.device = device
        self.page_size = _config(page_size, env, "VPMM_PAGE_SIZE", DEFAULT_PAGE)
        self.va_size = _config(va_size, env, "VPMM_VA_SIZE", DEFAULT_VA)
        n_pages = _config(pages, env, "VPMM_PAGES", 0, allow_zero=True)
        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise PyvgpuError(f"VPMM needs the CUDA driver (libcuda.so.1): {e}") from None
        self._cu = cu
        self._context(cu, device)
        self._prop = _Prop(type=1, loc_type=1, loc_id=device)  # pinned device memory
        self._access = _Access(loc_type=1, loc_id=device, flags=3)  # read and write
        gran = ctypes.c_size_t()
        rc = cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self._prop), 0)
        if rc != 0:
            raise PyvgpuError(f"VPMM: device {device} has no VMM support (cuMemGetAllocationGranularity -> {rc})")
        if self.page_size % gran.value:
            raise PyvgpuError(f"VPMM_PAGE_SIZE={self.page_size}: give a multiple of device {device}'s VMM "
                              f"granularity, {human(gran.value)}")
        if self.va_size % self.page_size:
            raise PyvgpuError(f"VPMM_VA_SIZE={self.va_size}: give a multiple of the page size {self.page_size}")
        self.reg = np.zeros((MAX_REGIONS, T.NCOL), dtype=np.int64)
        self.pg = np.zeros((PAGE_SLOTS, 2), dtype=np.int64)
        self.hd = np.zeros(T.HD_SIZE, dtype=np.int64)
        hd = self.hd
        hd[T.H_PAGE], hd[T.H_VA], hd[T.H_DEV] = self.page_size, self.va_size, device
        hd[T.H_PROP], hd[T.H_ACCESS] = ctypes.addressof(self._prop), ctypes.addressof(self._access)
        hd[T.H_NEXT_ID] = 1
        for f, name in _FUNCS.items():
            hd[T.H_FN + f] = ctypes.cast(getattr(cu, name), ctypes.c_void_p).value
        self._small: dict[int, int] = {}
        # the block the C entry points take (pyvgpu.jit.vpmm.S_*): this pool's tables, by address
        self.state = (ctypes.c_int64 * 6)(self.reg.ctypes.data, MAX_REGIONS, self.pg.ctypes.data, PAGE_SLOTS,
                                          self.hd.ctypes.data, T.HD_SIZE)
        e = _entries()
        self._c_malloc, self._c_free, self._c_trim = e.malloc, e.free, e.trim
        self._check(e.preallocate(ctypes.addressof(self.state), n_pages), f"VPMM_PAGES={n_pages}")

    @staticmethod
    def _context(cu: ctypes.CDLL, device: int) -> None:
        """Make device's primary context current in this thread if none is (the driver API needs one)."""
        cur = ctypes.c_void_p()
        if cu.cuInit(0) != 0:
            raise PyvgpuError("VPMM: cuInit failed; is there a GPU (pyvgpu doctor)?")
        if cu.cuCtxGetCurrent(ctypes.byref(cur)) == 0 and cur.value:
            return
        ctx = ctypes.c_void_p()
        rc = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)
        if rc != 0 or cu.cuCtxSetCurrent(ctx) != 0:
            raise PyvgpuError(f"VPMM: no context on device {device} (cuDevicePrimaryCtxRetain -> {rc})")

    def _check(self, rc: int, what: str) -> int:
        if rc >= 0:
            return rc
        if rc == T.ERR_TABLE_FULL:
            raise PyvgpuError(f"VPMM {what}: the pool's tables are full ({MAX_REGIONS} regions, {T.MAX_EVENTS} "
                              f"events, {PAGE_SLOTS} pages)")
        cu_rc = -rc - 1000
        if cu_rc == abi.CUDA_ERROR_OUT_OF_MEMORY:
            raise MemoryError(f"VPMM {what}: out of device memory (or over the vGPU's cap); {self._brief()}")
        raise PyvgpuError(f"VPMM {what}: the driver returned CUresult {cu_rc}")

    def malloc(self, size: int, stream: int = 0) -> int:
        """Device memory for ``size`` bytes, usable on ``stream``; raises MemoryError when none can be had."""
        if size < 0:
            raise PyvgpuError(f"VPMM malloc({size}): a size cannot be negative")
        ptr = self._check(self._c_malloc(ctypes.addressof(self.state), size, stream), f"malloc({size})")
        if size < self.page_size:
            self._small[ptr] = max(size, 1)
        return ptr

    def free(self, ptr: int, stream: int = 0) -> None:
        """Give ``ptr`` back after the work queued on ``stream`` so far; a pointer that is not live is an error."""
        rc = self._c_free(ctypes.addressof(self.state), ptr, stream, self._small.get(ptr, 0))
        if rc == 0:
            self._small.pop(ptr, None)
            return
        if ptr in self._small:
            raise PyvgpuError(f"VPMM free({ptr:#x}): cuMemFreeAsync returned {rc}")
        if rc == abi.CUDA_ERROR_INVALID_VALUE:
            raise PyvgpuError(f"VPMM free({ptr:#x}): not a live allocation of this pool (freed twice, or "
                              "never allocated here)")
        raise PyvgpuError(f"VPMM free({ptr:#x}): the driver returned CUresult {rc}")

    def trim(self) -> None:
        """Unmap old addresses whose work is done (what each malloc does first)."""
        rc = self._c_trim(ctypes.addressof(self.state))
        if rc != 0:
            raise PyvgpuError(f"VPMM trim: cuMemUnmap returned {rc}")

    def regions(self) -> list[tuple[int, int, str, int]]:
        """(address, size, state, stream) of every region, in address order; state is + - * or z."""
        n = int(self.hd[T.H_NREG])
        return [(int(r[T.ADDR]), int(r[T.SIZE]), STATE_MARK[int(r[T.STATE])], int(r[T.STREAM]))
                for r in self.reg[:n]]

    def layout(self, holes_after_last: bool = False) -> str:
        """The regions in the seed's notation, in pages: '[+4][-6][1]...'; the unmapped tail of a chunk
        is left out unless asked for, as the seed's pictures do. Live regions are '+'."""
        rows = self.regions()
        while rows and rows[-1][2] == "*" and not holes_after_last:
            rows.pop()
        return "".join(f"[{m}{s // self.page_size}]" for _, s, m, _ in rows)

    def stats(self) -> dict[str, int]:
        """The seed's observability figures, in bytes (pages: physical pages created)."""
        rows = self.regions()

        def total(mark: str) -> int:
            return sum(s for _, s, m, _ in rows if m == mark)

        hd = self.hd
        return {"mapped": int(hd[T.H_PAGES]) * self.page_size, "reserved_va": sum(s for _, s, _, _ in rows),
                "live": total("+"), "reusable": total("-"), "holes": total("*"), "zombies": total("z"),
                "pages": int(hd[T.H_PAGES]), "small_live": int(hd[T.H_SMALL]), "defragmentations": int(hd[T.H_DEFRAGS]),
                "page_size": self.page_size}

    def _brief(self) -> str:
        s = self.stats()
        return f"mapped {human(s['mapped'])}, live {human(s['live'])}, reusable {human(s['reusable'])}"

    def dump(self) -> str:
        """The figures, then every region in address order."""
        s = self.stats()
        lines = [f"VPMM device {self.device}: page {human(self.page_size)}, " + ", ".join(
            f"{k} {human(v) if k not in ('pages', 'defragmentations', 'page_size') else v}" for k, v in s.items()
            if k != "page_size")]
        names = {"+": "live", "-": "free", "*": "unmapped", "z": "zombie"}
        for a, size, m, stream in self.regions():
            extra = f" stream {stream:#x}" if m in "-" else ""
            lines.append(f"  {a:#016x} {human(size):>12} {names[m]}{extra}")
        return "\n".join(lines)


_TORCH_POOLS: list[VirtualMemoryPool] = []  # alive as long as the process: PyTorch holds their memory


def install(lib: ctypes.CDLL, pool: VirtualMemoryPool) -> None:
    """Serve ``pool.device`` through the shim's pyvgpu_vpmm_malloc/free (what PyTorch calls)."""
    m_addr, f_addr = (f.address for f in _entries().cfuncs[:2])
    lib.pyvgpu_vpmm_install.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    if lib.pyvgpu_vpmm_install(pool.device, m_addr, f_addr, ctypes.addressof(pool.state)) != 0:
        raise PyvgpuError(f"VPMM: the shim refused a pool for device {pool.device}")


def enable_for_torch(**pool_options: int) -> list[VirtualMemoryPool]:
    """Make VPMM PyTorch's CUDA allocator: one pool per visible device. Call it before the first CUDA
    allocation (PyTorch cannot swap its allocator after that); `pyvgpu wrap --allocator vpmm` does it
    right after `import torch`. Returns the pools (their stats() and dump() show what PyTorch holds)."""
    import torch
    from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

    from pyvgpu import shim

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
    return pools
