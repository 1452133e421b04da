"""The model of the hook table (pyvgpu/contract/hooks.py): what a hooked symbol, a helper and a service are.

Plain frozen dataclasses, in the manner of torchgen's model: :class:`Hook`
(one API function under its base name), :class:`Variant` (one exported ABI
symbol of it), :class:`Param` (a C parameter and the numba type it travels
as), :class:`Entry` (a variant with its global index), :class:`Helper` (a
driver function the policies call without hooking it) and :class:`Service`
(a compiled function the shim or Python calls outside any hook). The table's
data lives in pyvgpu/contract/hooks.py; the generators (scripts/gen_shim.py,
pyvgpu/native/callbacks.py, pyvgpu/native/services.py) read both through ``pyvgpu.contract.hooks``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pyvgpu.contract import abi

# cuGetProcAddress flags and results (pyvgpu/contract/abi.py), under the names the variant rule uses.
GPA_DEFAULT = abi.CU_GET_PROC_ADDRESS_DEFAULT
GPA_LEGACY_STREAM = abi.CU_GET_PROC_ADDRESS_LEGACY_STREAM
GPA_PER_THREAD_DEFAULT_STREAM = abi.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
GPA_SUCCESS = abi.CU_GET_PROC_ADDRESS_SUCCESS
GPA_SYMBOL_NOT_FOUND = abi.CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
GPA_VERSION_NOT_SUFFICIENT = abi.CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT

# C spelling -> numba type name, for scalar parameter and return types.
# Every pointer ("... *") and opaque handle is passed as a uint64 (see numba_type_name).
SCALAR_TYPES: dict[str, str] = {
    "CUresult": "int32",
    "nvmlReturn_t": "int32",
    "nvmlSamplingType_t": "int32",
    "int32_t": "int32",
    "uint32_t": "uint32",
    "int64_t": "int64",
    "uint64_t": "uint64",
    "int": "int32",
    "unsigned int": "uint32",
    "size_t": "uint64",
    "CUdevice": "int32",
    "CUmemPool_attribute": "int32",
    "CUdeviceptr": "uint64",
    "CUdeviceptr_v1": "uint32",
    "cuuint64_t": "uint64",
    "unsigned long long": "uint64",
}
HANDLE_TYPES = frozenset({"CUfunction", "CUstream", "CUcontext", "CUmodule", "CUlibrary", "nvmlDevice_t",
                          "CUmemoryPool", "CUgraphExec", "CUevent",
                          "CUarray", "CUmipmappedArray", "CUmemGenericAllocationHandle"})


def numba_type_name(ctype: str) -> str:
    """The numba type a C parameter type travels as through a callback.

    Pointers and handles travel as uint64 (the same registers as a pointer
    in the C calling convention), so policies can do address arithmetic.
    """
    if ctype.endswith("*") or ctype in HANDLE_TYPES:
        return "uint64"
    try:
        return SCALAR_TYPES[ctype]
    except KeyError:
        raise ValueError(f"hook table: unknown C type {ctype!r}; add it to SCALAR_TYPES or HANDLE_TYPES") from None


@dataclass(frozen=True)
class Param:
    ctype: str
    name: str

    @property
    def numba(self) -> str:
        return numba_type_name(self.ctype)


def P(ctype: str, name: str) -> Param:
    return Param(ctype, name)


@dataclass(frozen=True)
class Variant:
    """One exported ABI symbol of a hook."""

    abi: str
    since: int | None = None  # first cudaVersion that maps to it; None for NVML
    per_thread: bool = False  # the _ptsz/_ptds flavour chosen by GPA_PER_THREAD_DEFAULT_STREAM
    params: tuple[Param, ...] | None = None  # own parameters when they differ from the hook's
    policy: str | None = None  # own policy when its parameters differ from the hook's (legacy ABIs)


@dataclass(frozen=True)
class Hook:
    """One intercepted API function and its ABI variants.

    ``callback`` names the policy that decides the call, as ``module.function``
    in ``pyvgpu.jit``; ``None`` means the shim implements it in C
    (cuGetProcAddress, which is plumbing, not policy).
    """

    name: str
    lib: str  # "cuda" or "nvml"
    params: tuple[Param, ...]
    variants: tuple[Variant, ...]
    callback: str | None = "policies.forward"
    doc: str = ""

    @property
    def ret(self) -> str:
        return "CUresult" if self.lib == "cuda" else "nvmlReturn_t"


@dataclass(frozen=True)
class Entry:
    """A variant with its global index: the unit the shim exports and counts."""

    index: int
    hook: Hook
    variant: Variant
    params: tuple[Param, ...] = field(default=())

    @property
    def abi(self) -> str:
        return self.variant.abi

    @property
    def signature(self) -> tuple[str, ...]:
        """numba type names of the parameters (the callback's shape)."""
        return tuple(p.numba for p in self.params)

    @property
    def policy(self) -> str | None:
        """The policy deciding this entry's calls; None: implemented in C."""
        return self.variant.policy or self.hook.callback


def _hook(name: str, lib: str, params: list[Param], variants: list[Variant], **kw) -> Hook:
    return Hook(name, lib, tuple(params), tuple(variants), **kw)


def V(abi: str, since: int | None = None, per_thread: bool = False, params: list[Param] | None = None,
      policy: str | None = None) -> Variant:
    return Variant(abi, since, per_thread, tuple(params) if params is not None else None, policy)


@dataclass(frozen=True)
class Helper:
    """A driver function the policies call but do not hook.

    Its real address is in ctx.helper; ``pyvgpu.jit.runtime.context.HELPER`` calls it
    with the parameter types declared here (a helper the driver lacks answers
    its library's "not found" code, never a call through NULL).
    """

    name: str
    lib: str
    params: tuple[Param, ...] = ()

    @property
    def signature(self) -> tuple[str, ...]:
        return tuple(p.numba for p in self.params)


def _helper(name: str, lib: str, params: list[Param]) -> Helper:
    return Helper(name, lib, tuple(params))


@dataclass(frozen=True)
class Service:
    """A callback the shim (or a Python tool) calls outside any hooked function.

    The C typedef (``pv_<name>_t`` in shim/generated/pv_table.h), the numba
    signature (pyvgpu/native/callbacks.py) and the ctypes prototype
    (pyvgpu/native/services.py) all come from ``ret`` and ``params``.
    """

    name: str
    ret: str  # a scalar C type, or "void"
    params: tuple[Param, ...]
    doc: str

    @property
    def signature(self) -> tuple[str, ...]:
        return tuple(p.numba for p in self.params)

    @property
    def ret_numba(self) -> str:
        """The numba type name of the result ("void": none)."""
        return "void" if self.ret == "void" else numba_type_name(self.ret)


def _entries(hooks: tuple[Hook, ...]) -> tuple[Entry, ...]:
    out = []
    seen: set[str] = set()
    for h in hooks:
        if h.lib not in ("cuda", "nvml"):
            raise ValueError(f"hook table: {h.name}: lib must be 'cuda' or 'nvml', not {h.lib!r}")
        for v in h.variants:
            if v.abi in seen:
                raise ValueError(f"hook table: ABI symbol {v.abi} listed twice")
            seen.add(v.abi)
            if (h.lib == "cuda") != (v.since is not None):
                raise ValueError(f"hook table: {v.abi}: CUDA variants need 'since', NVML ones must not have it")
            params = v.params if v.params is not None else h.params
            for p in params:
                numba_type_name(p.ctype)  # fail loudly on unknown types
            out.append(Entry(len(out), h, v, params))
    return tuple(out)


def select_variant(hook: Hook, cuda_version: int, flags: int) -> tuple[Variant | None, int]:
    """The variant cuGetProcAddress(hook.name, cuda_version, flags) returns.

    Returns (variant, status). The rule, measured on driver 580: with the
    per-thread flag, a function that has per-thread variants is looked up
    among those only (below their first version: VERSION_NOT_SUFFICIENT);
    otherwise among the legacy ones. The newest variant whose ``since`` is
    <= cuda_version wins. The C twin of this function is
    ``pv_select_variant`` in shim/src/pv_procaddr.c; tests compare both.
    """
    per_thread = bool(flags & GPA_PER_THREAD_DEFAULT_STREAM) and any(v.per_thread for v in hook.variants)
    best: Variant | None = None
    for v in hook.variants:
        if v.per_thread != per_thread or v.since is None or v.since > cuda_version:
            continue
        if best is None or v.since >= best.since:  # type: ignore[operator]
            best = v
    return best, (GPA_SUCCESS if best is not None else GPA_VERSION_NOT_SUFFICIENT)


def table_hash(helpers: tuple[Helper, ...], services: tuple[Service, ...], entries: tuple[Entry, ...]) -> str:
    """Identifies a table's ABI: shim and callbacks must agree on it."""
    h = hashlib.sha256()
    for x in helpers:
        h.update(f"helper:{x.name}:{x.lib}:{','.join(p.ctype for p in x.params)};".encode())
    for s in services:
        h.update(f"service:{s.name}:{s.ret}:{','.join(p.ctype for p in s.params)};".encode())
    for e in entries:
        h.update(f"{e.index}:{e.abi}:{e.hook.ret}:{','.join(p.ctype for p in e.params)}:{e.policy};".encode())
    return h.hexdigest()[:16]
