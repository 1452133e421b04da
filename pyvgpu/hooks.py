"""The hook table: every CUDA driver and NVML symbol pyvgpu intercepts.

This module is the single source of truth. ``scripts/gen_shim.py`` renders
the C shim from it (exported functions, the dlsym name index, the
cuGetProcAddress variant table, callback typedefs) and ``pyvgpu.jit``
builds one numba callback per variant signature from it.

It also declares the services (callbacks the shim calls outside any hook)
and the helpers (driver functions the policies call without hooking them),
so that their C typedefs and numba signatures come from one place too.

The model follows the driver's own structure, as measured on driver 580
(docs/facts/procaddr-h100-driver580.tsv):

* A :class:`Hook` is one API function under its *base name*, the name that
  cuGetProcAddress takes ("cuMemAlloc"). Versioned names such as
  "cuMemAlloc_v2" are not accepted by cuGetProcAddress.
* A :class:`Variant` is one exported ABI symbol of it ("cuMemAlloc_v2"),
  with the first cudaVersion that maps to it and whether it is the
  per-thread-default-stream flavour (``_ptsz``/``_ptds``). Legacy variants
  with other parameter types (the 32-bit ``cuMemAlloc``) carry their own
  parameter list.
* A hook's ``callback`` names its policy as ``module.function`` inside
  ``pyvgpu.jit``; ``pyvgpu.jit.policies.resolve`` finds it by that name
  (there is no registry to keep in step). A policy learns whether its entry is a per-thread-stream
  variant from the table (``pyvgpu.jit.context.per_thread``), so one policy
  serves both flavours.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pyvgpu import abi

# cuGetProcAddress flags and results (pyvgpu/abi.py), under the names the variant rule uses.
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


_LAUNCH = [
    P("CUfunction", "f"),
    P("unsigned int", "gridDimX"), P("unsigned int", "gridDimY"), P("unsigned int", "gridDimZ"),
    P("unsigned int", "blockDimX"), P("unsigned int", "blockDimY"), P("unsigned int", "blockDimZ"),
    P("unsigned int", "sharedMemBytes"), P("CUstream", "hStream"),
    P("void **", "kernelParams"), P("void **", "extra"),
]

HOOKS: tuple[Hook, ...] = (
    # --- CUDA driver: plumbing and launches -----------------------------------
    # --- CUDA driver: which devices (pyvgpu/jit/devices.py) ---------------------------
    _hook("cuInit", "cuda", [P("unsigned int", "Flags")], [V("cuInit", 2000)], callback="devices.cuda_init"),
    _hook(
        "cuGetProcAddress", "cuda",
        [P("const char *", "symbol"), P("void **", "pfn"), P("int", "cudaVersion"),
         P("cuuint64_t", "flags"), P("int *", "symbolStatus")],
        [V("cuGetProcAddress", 11030, params=[P("const char *", "symbol"), P("void **", "pfn"),
                                               P("int", "cudaVersion"), P("cuuint64_t", "flags")]),
         V("cuGetProcAddress_v2", 12000)],
        callback=None,
        doc="maps the driver's answer to the hook of the same ABI variant (pv_procaddr.c)",
    ),
    _hook("cuDeviceGetCount", "cuda", [P("int *", "count")], [V("cuDeviceGetCount", 2000)],
          callback="devices.device_count"),
    # --- CUDA driver: launches, throttled under a compute share (pyvgpu/jit/launch.py) -----
    _hook(
        "cuLaunchKernel", "cuda", _LAUNCH,
        [V("cuLaunchKernel", 4000), V("cuLaunchKernel_ptsz", 7000, per_thread=True)],
        callback="launch.kernel",
    ),
    _hook(
        "cuLaunchKernelEx", "cuda",
        [P("const CUlaunchConfig *", "config"), P("CUfunction", "f"),
         P("void **", "kernelParams"), P("void **", "extra")],
        [V("cuLaunchKernelEx", 11060),
         V("cuLaunchKernelEx_ptsz", 11060, per_thread=True)],
        callback="launch.kernel_ex",
    ),
    _hook(
        "cuLaunchCooperativeKernel", "cuda", _LAUNCH[:-1],
        [V("cuLaunchCooperativeKernel", 9000),
         V("cuLaunchCooperativeKernel_ptsz", 9000, per_thread=True)],
        callback="launch.cooperative",
    ),
    _hook(
        "cuLaunchCooperativeKernelMultiDevice", "cuda",
        [P("CUDA_LAUNCH_PARAMS *", "launchParamsList"), P("unsigned int", "numDevices"),
         P("unsigned int", "flags")],
        [V("cuLaunchCooperativeKernelMultiDevice", 9000)],
        callback="launch.multi_device",
    ),
    _hook(
        "cuGraphLaunch", "cuda", [P("CUgraphExec", "hGraphExec"), P("CUstream", "hStream")],
        [V("cuGraphLaunch", 10000), V("cuGraphLaunch_ptsz", 10000, per_thread=True)],
        callback="launch.graph",
    ),
    # --- CUDA driver: memory (pyvgpu/jit/memory.py, mempools.py, measured.py) -------
    _hook("cuDevicePrimaryCtxRetain", "cuda", [P("CUcontext *", "pctx"), P("CUdevice", "dev")],
          [V("cuDevicePrimaryCtxRetain", 7000)], callback="measured.ctx_retain"),
    _hook(
        "cuCtxCreate", "cuda", [P("CUcontext *", "pctx"), P("unsigned int", "flags"), P("CUdevice", "dev")],
        [V("cuCtxCreate", 2000), V("cuCtxCreate_v2", 3020),
         V("cuCtxCreate_v3", 11040, params=[P("CUcontext *", "pctx"), P("CUexecAffinityParam *", "paramsArray"),
                                            P("int", "numParams"), P("unsigned int", "flags"),
                                            P("CUdevice", "dev")], policy="measured.ctx_create_v3"),
         V("cuCtxCreate_v4", 12050, params=[P("CUcontext *", "pctx"), P("CUctxCreateParams *", "ctxCreateParams"),
                                            P("unsigned int", "flags"), P("CUdevice", "dev")],
           policy="measured.ctx_create_v4")],
        callback="measured.ctx_create",
    ),
    _hook(
        "cuDeviceTotalMem", "cuda", [P("size_t *", "bytes"), P("CUdevice", "dev")],
        [V("cuDeviceTotalMem", 2000, params=[P("unsigned int *", "bytes"), P("CUdevice", "dev")]),
         V("cuDeviceTotalMem_v2", 3020)],
        callback="memview.device_total_mem",
    ),
    _hook(
        "cuMemGetInfo", "cuda", [P("size_t *", "free"), P("size_t *", "total")],
        [V("cuMemGetInfo", 2000, params=[P("unsigned int *", "free"), P("unsigned int *", "total")]),
         V("cuMemGetInfo_v2", 3020)],
        callback="memview.mem_get_info",
    ),
    _hook(
        "cuMemAlloc", "cuda", [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize")],
        [V("cuMemAlloc", 2000, params=[P("CUdeviceptr_v1 *", "dptr"), P("unsigned int", "bytesize")],
           policy="memory.legacy32"),
         V("cuMemAlloc_v2", 3020)],
        callback="memory.mem_alloc",
    ),
    _hook(
        "cuMemAllocPitch", "cuda",
        [P("CUdeviceptr *", "dptr"), P("size_t *", "pPitch"), P("size_t", "WidthInBytes"), P("size_t", "Height"),
         P("unsigned int", "ElementSizeBytes")],
        [V("cuMemAllocPitch", 2000, params=[P("CUdeviceptr_v1 *", "dptr"), P("unsigned int *", "pPitch"),
                                              P("unsigned int", "WidthInBytes"), P("unsigned int", "Height"),
                                              P("unsigned int", "ElementSizeBytes")], policy="memory.legacy32"),
         V("cuMemAllocPitch_v2", 3020)],
        callback="memory.mem_alloc_pitch",
    ),
    _hook(
        "cuMemAllocManaged", "cuda", [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize"), P("unsigned int", "flags")],
        [V("cuMemAllocManaged", 6000)],
        callback="memory.mem_alloc_managed",
    ),
    _hook(
        "cuMemFree", "cuda", [P("CUdeviceptr", "dptr")],
        [V("cuMemFree", 2000, params=[P("CUdeviceptr_v1", "dptr")]), V("cuMemFree_v2", 3020)],
        callback="memory.mem_free",
    ),
    _hook(
        "cuMemAllocAsync", "cuda", [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize"), P("CUstream", "hStream")],
        [V("cuMemAllocAsync", 11020), V("cuMemAllocAsync_ptsz", 11020, per_thread=True)],
        callback="mempools.mem_alloc_async",
    ),
    _hook(
        "cuMemAllocFromPoolAsync", "cuda",
        [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize"), P("CUmemoryPool", "pool"), P("CUstream", "hStream")],
        [V("cuMemAllocFromPoolAsync", 11020), V("cuMemAllocFromPoolAsync_ptsz", 11020, per_thread=True)],
        callback="mempools.mem_alloc_from_pool_async",
    ),
    _hook(
        "cuMemFreeAsync", "cuda", [P("CUdeviceptr", "dptr"), P("CUstream", "hStream")],
        [V("cuMemFreeAsync", 11020), V("cuMemFreeAsync_ptsz", 11020, per_thread=True)],
        callback="mempools.mem_free_async",
    ),
    _hook("cuMemPoolTrimTo", "cuda", [P("CUmemoryPool", "pool"), P("size_t", "minBytesToKeep")],
          [V("cuMemPoolTrimTo", 11020)], callback="mempools.mem_pool_trim"),
    _hook("cuMemPoolDestroy", "cuda", [P("CUmemoryPool", "pool")], [V("cuMemPoolDestroy", 11020)],
          callback="mempools.mem_pool_destroy"),
    _hook(
        "cuMemCreate", "cuda",
        [P("CUmemGenericAllocationHandle *", "handle"), P("size_t", "size"),
         P("const CUmemAllocationProp *", "prop"), P("unsigned long long", "flags")],
        [V("cuMemCreate", 10020)],
        callback="memory.mem_create",
    ),
    _hook("cuMemRelease", "cuda", [P("CUmemGenericAllocationHandle", "handle")], [V("cuMemRelease", 10020)],
          callback="memory.release"),
    _hook(
        "cuArrayCreate", "cuda", [P("CUarray *", "pHandle"), P("const CUDA_ARRAY_DESCRIPTOR *", "pAllocateArray")],
        [V("cuArrayCreate", 2000, policy="memory.legacy32"), V("cuArrayCreate_v2", 3020)],
        callback="memory.array_create",
    ),
    _hook(
        "cuArray3DCreate", "cuda",
        [P("CUarray *", "pHandle"), P("const CUDA_ARRAY3D_DESCRIPTOR *", "pAllocateArray")],
        [V("cuArray3DCreate", 2000, policy="memory.legacy32"), V("cuArray3DCreate_v2", 3020)],
        callback="memory.array3d_create",
    ),
    _hook(
        "cuMipmappedArrayCreate", "cuda",
        [P("CUmipmappedArray *", "pHandle"), P("const CUDA_ARRAY3D_DESCRIPTOR *", "pMipmappedArrayDesc"),
         P("unsigned int", "numMipmapLevels")],
        [V("cuMipmappedArrayCreate", 5000)],
        callback="memory.mipmapped_array_create",
    ),
    _hook("cuArrayDestroy", "cuda", [P("CUarray", "hArray")], [V("cuArrayDestroy", 2000)],
          callback="memory.release"),
    _hook("cuMipmappedArrayDestroy", "cuda", [P("CUmipmappedArray", "hMipmappedArray")],
          [V("cuMipmappedArrayDestroy", 5000)], callback="memory.release"),
    # modules and libraries: memory measured at load (pyvgpu/jit/measured.py)
    _hook("cuModuleLoad", "cuda", [P("CUmodule *", "module"), P("const char *", "fname")],
          [V("cuModuleLoad", 2000)], callback="measured.module_load"),
    _hook("cuModuleLoadData", "cuda", [P("CUmodule *", "module"), P("const void *", "image")],
          [V("cuModuleLoadData", 2000)], callback="measured.module_load"),
    _hook("cuModuleLoadDataEx", "cuda",
          [P("CUmodule *", "module"), P("const void *", "image"), P("unsigned int", "numOptions"),
           P("CUjit_option *", "options"), P("void **", "optionValues")],
          [V("cuModuleLoadDataEx", 2010)], callback="measured.module_load_ex"),
    _hook("cuModuleLoadFatBinary", "cuda", [P("CUmodule *", "module"), P("const void *", "fatCubin")],
          [V("cuModuleLoadFatBinary", 2000)], callback="measured.module_load"),
    _hook("cuModuleUnload", "cuda", [P("CUmodule", "hmod")], [V("cuModuleUnload", 2000)],
          callback="memory.release"),
    _hook("cuLibraryLoadData", "cuda",
          [P("CUlibrary *", "library"), P("const void *", "code"), P("CUjit_option *", "jitOptions"),
           P("void **", "jitOptionsValues"), P("unsigned int", "numJitOptions"),
           P("CUlibraryOption *", "libraryOptions"), P("void **", "libraryOptionValues"),
           P("unsigned int", "numLibraryOptions")],
          [V("cuLibraryLoadData", 12000)], callback="measured.library_load"),
    _hook("cuLibraryLoadFromFile", "cuda",
          [P("CUlibrary *", "library"), P("const char *", "fileName"), P("CUjit_option *", "jitOptions"),
           P("void **", "jitOptionsValues"), P("unsigned int", "numJitOptions"),
           P("CUlibraryOption *", "libraryOptions"), P("void **", "libraryOptionValues"),
           P("unsigned int", "numLibraryOptions")],
          [V("cuLibraryLoadFromFile", 12000)], callback="measured.library_load"),
    _hook("cuLibraryUnload", "cuda", [P("CUlibrary", "library")], [V("cuLibraryUnload", 12000)],
          callback="memory.release"),
    # --- NVML: the group's devices, as CUDA sees them (pyvgpu/jit/devices.py) -------
    _hook("nvmlInit", "nvml", [], [V("nvmlInit"), V("nvmlInit_v2")]),
    _hook("nvmlDeviceGetCount", "nvml", [P("unsigned int *", "deviceCount")],
          [V("nvmlDeviceGetCount"), V("nvmlDeviceGetCount_v2")], callback="devices.nvml_count"),
    _hook("nvmlDeviceGetHandleByIndex", "nvml", [P("unsigned int", "index"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleByIndex"), V("nvmlDeviceGetHandleByIndex_v2")], callback="devices.nvml_by_index"),
    _hook("nvmlDeviceGetHandleByUUID", "nvml", [P("const char *", "uuid"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleByUUID")], callback="devices.nvml_by_key"),
    _hook("nvmlDeviceGetHandleByPciBusId", "nvml", [P("const char *", "pciBusId"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleByPciBusId"), V("nvmlDeviceGetHandleByPciBusId_v2")], callback="devices.nvml_by_key"),
    _hook("nvmlDeviceGetHandleBySerial", "nvml", [P("const char *", "serial"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleBySerial")], callback="devices.nvml_by_key"),
    _hook("nvmlDeviceGetIndex", "nvml", [P("nvmlDevice_t", "device"), P("unsigned int *", "index")],
          [V("nvmlDeviceGetIndex")], callback="devices.nvml_index"),
    _hook("nvmlDeviceGetComputeRunningProcesses", "nvml",
          [P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"), P("nvmlProcessInfo_t *", "infos")],
          [V("nvmlDeviceGetComputeRunningProcesses", policy="devices.nvml_processes_v1",
             params=[P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"),
                     P("nvmlProcessInfo_v1_t *", "infos")]),
           V("nvmlDeviceGetComputeRunningProcesses_v2"), V("nvmlDeviceGetComputeRunningProcesses_v3")],
          callback="devices.nvml_processes"),
    _hook("nvmlDeviceGetGraphicsRunningProcesses", "nvml",
          [P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"), P("nvmlProcessInfo_t *", "infos")],
          [V("nvmlDeviceGetGraphicsRunningProcesses", policy="devices.nvml_processes_v1",
             params=[P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"),
                     P("nvmlProcessInfo_v1_t *", "infos")]),
           V("nvmlDeviceGetGraphicsRunningProcesses_v2"), V("nvmlDeviceGetGraphicsRunningProcesses_v3")],
          callback="devices.nvml_processes"),
    _hook("nvmlDeviceGetRunningProcessDetailList", "nvml",
          [P("nvmlDevice_t", "device"), P("nvmlProcessDetailList_t *", "plist")],
          [V("nvmlDeviceGetRunningProcessDetailList")], callback="devices.nvml_process_details"),
    _hook("nvmlDeviceGetUtilizationRates", "nvml",
          [P("nvmlDevice_t", "device"), P("nvmlUtilization_t *", "utilization")],
          [V("nvmlDeviceGetUtilizationRates")], callback="devices.nvml_utilization"),
    # --- NVML: memory (pyvgpu/jit/memview.py) -----------------------------------------
    _hook(
        "nvmlDeviceGetMemoryInfo", "nvml",
        [P("nvmlDevice_t", "device"), P("nvmlMemory_t *", "memory")],
        [V("nvmlDeviceGetMemoryInfo")],
        callback="memview.nvml_memory_info",
    ),
    _hook(
        "nvmlDeviceGetMemoryInfo_v2", "nvml",
        [P("nvmlDevice_t", "device"), P("nvmlMemory_v2_t *", "memory")],
        [V("nvmlDeviceGetMemoryInfo_v2")],
        callback="memview.nvml_memory_info_v2",
    ),
)


@dataclass(frozen=True)
class Helper:
    """A driver function the policies call but do not hook.

    Its real address is in ctx.helper; ``pyvgpu.jit.context.HELPER`` calls it
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


HELPERS: tuple[Helper, ...] = (
    _helper("cuCtxGetDevice", "cuda", [P("CUdevice *", "device")]),
    _helper("cuDeviceGetPCIBusId", "cuda", [P("char *", "pciBusId"), P("int", "len"), P("CUdevice", "dev")]),
    _helper("cuDevicePrimaryCtxRelease_v2", "cuda", [P("CUdevice", "dev")]),
    _helper("cuCtxDestroy_v2", "cuda", [P("CUcontext", "ctx")]),
    _helper("cuModuleUnload", "cuda", [P("CUmodule", "hmod")]),
    _helper("cuLibraryUnload", "cuda", [P("CUlibrary", "library")]),
    _helper("nvmlInit_v2", "nvml", []),
    _helper("nvmlDeviceGetHandleByPciBusId_v2", "nvml", [P("const char *", "pciBusId"), P("nvmlDevice_t *", "device")]),
    _helper("cuDeviceGetMemPool", "cuda", [P("CUmemoryPool *", "pool"), P("CUdevice", "dev")]),
    _helper("cuMemPoolGetAttribute", "cuda",
            [P("CUmemoryPool", "pool"), P("CUmemPool_attribute", "attr"), P("void *", "value")]),
    _helper("nvmlDeviceGetIndex", "nvml", [P("nvmlDevice_t", "device"), P("unsigned int *", "index")]),
    # compute share: timing launches, measuring the device (pyvgpu/jit/cost.py, controller.py, turn.py)
    _helper("cuCtxGetCurrent", "cuda", [P("CUcontext *", "pctx")]),
    _helper("cuEventCreate", "cuda", [P("CUevent *", "phEvent"), P("unsigned int", "Flags")]),
    _helper("cuEventRecord", "cuda", [P("CUevent", "hEvent"), P("CUstream", "hStream")]),
    _helper("cuEventQuery", "cuda", [P("CUevent", "hEvent")]),
    _helper("cuEventElapsedTime", "cuda", [P("float *", "pMilliseconds"), P("CUevent", "hStart"),
                                           P("CUevent", "hEnd")]),
    _helper("cuEventDestroy_v2", "cuda", [P("CUevent", "hEvent")]),
    _helper("cuStreamIsCapturing", "cuda", [P("CUstream", "hStream"), P("CUstreamCaptureStatus *", "status")]),
    _helper("cuEventSynchronize", "cuda", [P("CUevent", "hEvent")]),
    _helper("nvmlDeviceGetUtilizationRates", "nvml", [P("nvmlDevice_t", "device"),
                                                      P("nvmlUtilization_t *", "utilization")]),
    _helper("nvmlDeviceGetComputeRunningProcesses_v3", "nvml",
            [P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"), P("nvmlProcessInfo_t *", "infos")]),
    # devices: the check at cuInit (pyvgpu/jit/devices.py)
    _helper("cuDeviceGetUuid_v2", "cuda", [P("CUuuid *", "uuid"), P("CUdevice", "dev")]),
)
HELPER_INDEX: dict[str, int] = {h.name: i for i, h in enumerate(HELPERS)}


@dataclass(frozen=True)
class Service:
    """A callback the shim (or a Python tool) calls outside any hooked function.

    The C typedef (``pv_<name>_t`` in shim/generated/pv_table.h), the numba
    signature (pyvgpu/jit/callbacks.py) and the ctypes prototype
    (pyvgpu/services.py) all come from ``ret`` and ``params``.
    """

    name: str
    ret: str
    params: tuple[Param, ...]
    doc: str

    @property
    def signature(self) -> tuple[str, ...]:
        return tuple(p.numba for p in self.params)


SERVICES: tuple[Service, ...] = (
    Service("svc_claim", "int32_t", (P("pv_ctx_t *", "ctx"),),
            "take a slot in the group's region for this process; its index, or -1 when every slot is taken"),
    Service("svc_tick", "int32_t", (P("pv_ctx_t *", "ctx"),),
            "the watcher thread's periodic work: reclaim dead members, step the compute controller; 0"),
    Service("svc_reclaim", "uint64_t", (P("pv_ctx_t *", "ctx"),),
            "free the slots of the group's dead processes; the bytes given back"),
)
SERVICE_INDEX: dict[str, int] = {s.name: i for i, s in enumerate(SERVICES)}


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


ENTRIES: tuple[Entry, ...] = _entries(HOOKS)
for _x in (*HELPERS, *SERVICES):
    _x.signature  # noqa: B018  (unknown C types fail loudly at import)
for _s in SERVICES:
    numba_type_name(_s.ret)
BY_ABI: dict[str, Entry] = {e.abi: e for e in ENTRIES}
BY_NAME: dict[str, Hook] = {h.name: h for h in HOOKS}


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


def table_hash() -> str:
    """Identifies the table's ABI: shim and callbacks must agree on it."""
    h = hashlib.sha256()
    for x in HELPERS:
        h.update(f"helper:{x.name}:{x.lib}:{','.join(p.ctype for p in x.params)};".encode())
    for s in SERVICES:
        h.update(f"service:{s.name}:{s.ret}:{','.join(p.ctype for p in s.params)};".encode())
    for e in ENTRIES:
        h.update(f"{e.index}:{e.abi}:{e.hook.ret}:{','.join(p.ctype for p in e.params)}:{e.policy};".encode())
    return h.hexdigest()[:16]
