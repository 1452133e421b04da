"""The hook table: every CUDA driver and NVML symbol pyvgpu intercepts.

This module is the single source of truth. ``scripts/gen_shim.py`` renders
the C shim from it (exported functions, the dlsym name index, the
cuGetProcAddress variant table, callback typedefs) and ``pyvgpu.jit``
builds one numba callback per variant signature from it.

It also declares the services (compiled functions the shim or Python calls
outside any hook: the watcher's work, VPMM's entry points, the event log's
writer) and the helpers (driver functions the policies call without hooking
them), so that their C typedefs, numba signatures and ctypes prototypes come
from one place too, and all of them are compiled into one callback library.

The model (its classes are in pyvgpu/contract/hooks_model.py) follows the driver's own structure, as
measured on driver 580 (docs/facts/procaddr-h100-driver580.tsv):

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
  variant from the table (``pyvgpu.jit.runtime.context.per_thread``), so one policy
  serves both flavours.
"""

from __future__ import annotations

from pyvgpu.contract import hooks_model
from pyvgpu.contract.hooks_model import (
    GPA_DEFAULT,
    GPA_LEGACY_STREAM,
    GPA_PER_THREAD_DEFAULT_STREAM,
    GPA_SUCCESS,
    GPA_SYMBOL_NOT_FOUND,
    GPA_VERSION_NOT_SUFFICIENT,
    HANDLE_TYPES,
    SCALAR_TYPES,
    Entry,
    Helper,
    Hook,
    P,
    Param,
    Service,
    V,
    Variant,
    _entries,
    _helper,
    _hook,
    numba_type_name,
    select_variant,
)

__all__ = ["BY_ABI", "BY_NAME", "ENTRIES", "GPA_DEFAULT", "GPA_LEGACY_STREAM", "GPA_PER_THREAD_DEFAULT_STREAM",
           "GPA_SUCCESS", "GPA_SYMBOL_NOT_FOUND", "GPA_VERSION_NOT_SUFFICIENT", "HANDLE_TYPES", "HELPERS",
           "HELPER_INDEX", "HOOKS", "SCALAR_TYPES", "SERVICES", "SERVICE_INDEX", "Entry", "Helper", "Hook", "P",
           "Param", "Service", "V", "Variant", "_entries", "numba_type_name", "select_variant", "table_hash"]


_LAUNCH = [
    P("CUfunction", "f"),
    P("unsigned int", "gridDimX"), P("unsigned int", "gridDimY"), P("unsigned int", "gridDimZ"),
    P("unsigned int", "blockDimX"), P("unsigned int", "blockDimY"), P("unsigned int", "blockDimZ"),
    P("unsigned int", "sharedMemBytes"), P("CUstream", "hStream"),
    P("void **", "kernelParams"), P("void **", "extra"),
]

HOOKS: tuple[Hook, ...] = (
    # --- CUDA driver: plumbing and launches -----------------------------------
    # --- CUDA driver: which devices (pyvgpu/jit/devices/visible.py) ---------------------------
    _hook("cuInit", "cuda", [P("unsigned int", "Flags")], [V("cuInit", 2000)], callback="devices.visible.cuda_init"),
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
          callback="devices.visible.device_count"),
    # --- CUDA driver: launches, throttled under a compute share (pyvgpu/jit/compute/launch.py) -----
    _hook(
        "cuLaunchKernel", "cuda", _LAUNCH,
        [V("cuLaunchKernel", 4000), V("cuLaunchKernel_ptsz", 7000, per_thread=True)],
        callback="compute.launch.kernel",
    ),
    _hook(
        "cuLaunchKernelEx", "cuda",
        [P("const CUlaunchConfig *", "config"), P("CUfunction", "f"),
         P("void **", "kernelParams"), P("void **", "extra")],
        [V("cuLaunchKernelEx", 11060),
         V("cuLaunchKernelEx_ptsz", 11060, per_thread=True)],
        callback="compute.launch.kernel_ex",
    ),
    _hook(
        "cuLaunchCooperativeKernel", "cuda", _LAUNCH[:-1],
        [V("cuLaunchCooperativeKernel", 9000),
         V("cuLaunchCooperativeKernel_ptsz", 9000, per_thread=True)],
        callback="compute.launch.cooperative",
    ),
    _hook(
        "cuLaunchCooperativeKernelMultiDevice", "cuda",
        [P("CUDA_LAUNCH_PARAMS *", "launchParamsList"), P("unsigned int", "numDevices"),
         P("unsigned int", "flags")],
        [V("cuLaunchCooperativeKernelMultiDevice", 9000)],
        callback="compute.launch.multi_device",
    ),
    _hook(
        "cuGraphLaunch", "cuda", [P("CUgraphExec", "hGraphExec"), P("CUstream", "hStream")],
        [V("cuGraphLaunch", 10000), V("cuGraphLaunch_ptsz", 10000, per_thread=True)],
        callback="compute.launch.graph",
    ),
    # a stream a drain may record on must not be used after it is gone (pyvgpu/jit/compute/drain.py)
    _hook("cuStreamDestroy", "cuda", [P("CUstream", "hStream")],
          [V("cuStreamDestroy", 2000), V("cuStreamDestroy_v2", 4000)], callback="compute.drain.stream_destroy"),
    # --- CUDA driver: memory (pyvgpu/jit/memory/alloc.py, mempools.py, measured.py) -------
    _hook("cuDevicePrimaryCtxRetain", "cuda", [P("CUcontext *", "pctx"), P("CUdevice", "dev")],
          [V("cuDevicePrimaryCtxRetain", 7000)], callback="memory.measured.ctx_retain"),
    _hook(
        "cuCtxCreate", "cuda", [P("CUcontext *", "pctx"), P("unsigned int", "flags"), P("CUdevice", "dev")],
        [V("cuCtxCreate", 2000), V("cuCtxCreate_v2", 3020),
         V("cuCtxCreate_v3", 11040, params=[P("CUcontext *", "pctx"), P("CUexecAffinityParam *", "paramsArray"),
                                            P("int", "numParams"), P("unsigned int", "flags"),
                                            P("CUdevice", "dev")], policy="memory.measured.ctx_create_v3"),
         V("cuCtxCreate_v4", 12050, params=[P("CUcontext *", "pctx"), P("CUctxCreateParams *", "ctxCreateParams"),
                                            P("unsigned int", "flags"), P("CUdevice", "dev")],
           policy="memory.measured.ctx_create_v4")],
        callback="memory.measured.ctx_create",
    ),
    _hook(
        "cuDeviceTotalMem", "cuda", [P("size_t *", "bytes"), P("CUdevice", "dev")],
        [V("cuDeviceTotalMem", 2000, params=[P("unsigned int *", "bytes"), P("CUdevice", "dev")]),
         V("cuDeviceTotalMem_v2", 3020)],
        callback="devices.memview.device_total_mem",
    ),
    _hook(
        "cuMemGetInfo", "cuda", [P("size_t *", "free"), P("size_t *", "total")],
        [V("cuMemGetInfo", 2000, params=[P("unsigned int *", "free"), P("unsigned int *", "total")]),
         V("cuMemGetInfo_v2", 3020)],
        callback="devices.memview.mem_get_info",
    ),
    _hook(
        "cuMemAlloc", "cuda", [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize")],
        [V("cuMemAlloc", 2000, params=[P("CUdeviceptr_v1 *", "dptr"), P("unsigned int", "bytesize")],
           policy="memory.alloc.legacy32"),
         V("cuMemAlloc_v2", 3020)],
        callback="memory.alloc.mem_alloc",
    ),
    _hook(
        "cuMemAllocPitch", "cuda",
        [P("CUdeviceptr *", "dptr"), P("size_t *", "pPitch"), P("size_t", "WidthInBytes"), P("size_t", "Height"),
         P("unsigned int", "ElementSizeBytes")],
        [V("cuMemAllocPitch", 2000, params=[P("CUdeviceptr_v1 *", "dptr"), P("unsigned int *", "pPitch"),
                                              P("unsigned int", "WidthInBytes"), P("unsigned int", "Height"),
                                              P("unsigned int", "ElementSizeBytes")], policy="memory.alloc.legacy32"),
         V("cuMemAllocPitch_v2", 3020)],
        callback="memory.alloc.mem_alloc_pitch",
    ),
    _hook(
        "cuMemAllocManaged", "cuda", [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize"), P("unsigned int", "flags")],
        [V("cuMemAllocManaged", 6000)],
        callback="memory.alloc.mem_alloc_managed",
    ),
    _hook(
        "cuMemFree", "cuda", [P("CUdeviceptr", "dptr")],
        [V("cuMemFree", 2000, params=[P("CUdeviceptr_v1", "dptr")]), V("cuMemFree_v2", 3020)],
        callback="memory.alloc.mem_free",
    ),
    _hook(
        "cuMemAllocAsync", "cuda", [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize"), P("CUstream", "hStream")],
        [V("cuMemAllocAsync", 11020), V("cuMemAllocAsync_ptsz", 11020, per_thread=True)],
        callback="memory.mempools.mem_alloc_async",
    ),
    _hook(
        "cuMemAllocFromPoolAsync", "cuda",
        [P("CUdeviceptr *", "dptr"), P("size_t", "bytesize"), P("CUmemoryPool", "pool"), P("CUstream", "hStream")],
        [V("cuMemAllocFromPoolAsync", 11020), V("cuMemAllocFromPoolAsync_ptsz", 11020, per_thread=True)],
        callback="memory.mempools.mem_alloc_from_pool_async",
    ),
    _hook(
        "cuMemFreeAsync", "cuda", [P("CUdeviceptr", "dptr"), P("CUstream", "hStream")],
        [V("cuMemFreeAsync", 11020), V("cuMemFreeAsync_ptsz", 11020, per_thread=True)],
        callback="memory.mempools.mem_free_async",
    ),
    _hook("cuMemPoolTrimTo", "cuda", [P("CUmemoryPool", "pool"), P("size_t", "minBytesToKeep")],
          [V("cuMemPoolTrimTo", 11020)], callback="memory.mempools.mem_pool_trim"),
    _hook("cuMemPoolDestroy", "cuda", [P("CUmemoryPool", "pool")], [V("cuMemPoolDestroy", 11020)],
          callback="memory.mempools.mem_pool_destroy"),
    _hook(
        "cuMemCreate", "cuda",
        [P("CUmemGenericAllocationHandle *", "handle"), P("size_t", "size"),
         P("const CUmemAllocationProp *", "prop"), P("unsigned long long", "flags")],
        [V("cuMemCreate", 10020)],
        callback="memory.alloc.mem_create",
    ),
    _hook("cuMemRelease", "cuda", [P("CUmemGenericAllocationHandle", "handle")], [V("cuMemRelease", 10020)],
          callback="memory.alloc.release"),
    _hook(
        "cuArrayCreate", "cuda", [P("CUarray *", "pHandle"), P("const CUDA_ARRAY_DESCRIPTOR *", "pAllocateArray")],
        [V("cuArrayCreate", 2000, policy="memory.alloc.legacy32"), V("cuArrayCreate_v2", 3020)],
        callback="memory.alloc.array_create",
    ),
    _hook(
        "cuArray3DCreate", "cuda",
        [P("CUarray *", "pHandle"), P("const CUDA_ARRAY3D_DESCRIPTOR *", "pAllocateArray")],
        [V("cuArray3DCreate", 2000, policy="memory.alloc.legacy32"), V("cuArray3DCreate_v2", 3020)],
        callback="memory.alloc.array3d_create",
    ),
    _hook(
        "cuMipmappedArrayCreate", "cuda",
        [P("CUmipmappedArray *", "pHandle"), P("const CUDA_ARRAY3D_DESCRIPTOR *", "pMipmappedArrayDesc"),
         P("unsigned int", "numMipmapLevels")],
        [V("cuMipmappedArrayCreate", 5000)],
        callback="memory.alloc.mipmapped_array_create",
    ),
    _hook("cuArrayDestroy", "cuda", [P("CUarray", "hArray")], [V("cuArrayDestroy", 2000)],
          callback="memory.alloc.release"),
    _hook("cuMipmappedArrayDestroy", "cuda", [P("CUmipmappedArray", "hMipmappedArray")],
          [V("cuMipmappedArrayDestroy", 5000)], callback="memory.alloc.release"),
    # modules and libraries: memory measured at load (pyvgpu/jit/memory/measured.py)
    _hook("cuModuleLoad", "cuda", [P("CUmodule *", "module"), P("const char *", "fname")],
          [V("cuModuleLoad", 2000)], callback="memory.measured.module_load"),
    _hook("cuModuleLoadData", "cuda", [P("CUmodule *", "module"), P("const void *", "image")],
          [V("cuModuleLoadData", 2000)], callback="memory.measured.module_load"),
    _hook("cuModuleLoadDataEx", "cuda",
          [P("CUmodule *", "module"), P("const void *", "image"), P("unsigned int", "numOptions"),
           P("CUjit_option *", "options"), P("void **", "optionValues")],
          [V("cuModuleLoadDataEx", 2010)], callback="memory.measured.module_load_ex"),
    _hook("cuModuleLoadFatBinary", "cuda", [P("CUmodule *", "module"), P("const void *", "fatCubin")],
          [V("cuModuleLoadFatBinary", 2000)], callback="memory.measured.module_load"),
    _hook("cuModuleUnload", "cuda", [P("CUmodule", "hmod")], [V("cuModuleUnload", 2000)],
          callback="memory.alloc.release"),
    _hook("cuLibraryLoadData", "cuda",
          [P("CUlibrary *", "library"), P("const void *", "code"), P("CUjit_option *", "jitOptions"),
           P("void **", "jitOptionsValues"), P("unsigned int", "numJitOptions"),
           P("CUlibraryOption *", "libraryOptions"), P("void **", "libraryOptionValues"),
           P("unsigned int", "numLibraryOptions")],
          [V("cuLibraryLoadData", 12000)], callback="memory.measured.library_load"),
    _hook("cuLibraryLoadFromFile", "cuda",
          [P("CUlibrary *", "library"), P("const char *", "fileName"), P("CUjit_option *", "jitOptions"),
           P("void **", "jitOptionsValues"), P("unsigned int", "numJitOptions"),
           P("CUlibraryOption *", "libraryOptions"), P("void **", "libraryOptionValues"),
           P("unsigned int", "numLibraryOptions")],
          [V("cuLibraryLoadFromFile", 12000)], callback="memory.measured.library_load"),
    _hook("cuLibraryUnload", "cuda", [P("CUlibrary", "library")], [V("cuLibraryUnload", 12000)],
          callback="memory.alloc.release"),
    # --- NVML: the group's devices, as CUDA sees them (pyvgpu/jit/devices/visible.py) -------
    _hook("nvmlInit", "nvml", [], [V("nvmlInit"), V("nvmlInit_v2")]),
    _hook("nvmlDeviceGetCount", "nvml", [P("unsigned int *", "deviceCount")],
          [V("nvmlDeviceGetCount"), V("nvmlDeviceGetCount_v2")], callback="devices.visible.nvml_count"),
    _hook("nvmlDeviceGetHandleByIndex", "nvml", [P("unsigned int", "index"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleByIndex"),
           V("nvmlDeviceGetHandleByIndex_v2")], callback="devices.visible.nvml_by_index"),
    _hook("nvmlDeviceGetHandleByUUID", "nvml", [P("const char *", "uuid"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleByUUID")], callback="devices.visible.nvml_by_key"),
    _hook("nvmlDeviceGetHandleByPciBusId", "nvml", [P("const char *", "pciBusId"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleByPciBusId"),
           V("nvmlDeviceGetHandleByPciBusId_v2")], callback="devices.visible.nvml_by_key"),
    _hook("nvmlDeviceGetHandleBySerial", "nvml", [P("const char *", "serial"), P("nvmlDevice_t *", "device")],
          [V("nvmlDeviceGetHandleBySerial")], callback="devices.visible.nvml_by_key"),
    _hook("nvmlDeviceGetIndex", "nvml", [P("nvmlDevice_t", "device"), P("unsigned int *", "index")],
          [V("nvmlDeviceGetIndex")], callback="devices.visible.nvml_index"),
    _hook("nvmlDeviceGetComputeRunningProcesses", "nvml",
          [P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"), P("nvmlProcessInfo_t *", "infos")],
          [V("nvmlDeviceGetComputeRunningProcesses", policy="devices.visible.nvml_processes_v1",
             params=[P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"),
                     P("nvmlProcessInfo_v1_t *", "infos")]),
           V("nvmlDeviceGetComputeRunningProcesses_v2"), V("nvmlDeviceGetComputeRunningProcesses_v3")],
          callback="devices.visible.nvml_processes"),
    _hook("nvmlDeviceGetGraphicsRunningProcesses", "nvml",
          [P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"), P("nvmlProcessInfo_t *", "infos")],
          [V("nvmlDeviceGetGraphicsRunningProcesses", policy="devices.visible.nvml_processes_v1",
             params=[P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"),
                     P("nvmlProcessInfo_v1_t *", "infos")]),
           V("nvmlDeviceGetGraphicsRunningProcesses_v2"), V("nvmlDeviceGetGraphicsRunningProcesses_v3")],
          callback="devices.visible.nvml_processes"),
    _hook("nvmlDeviceGetRunningProcessDetailList", "nvml",
          [P("nvmlDevice_t", "device"), P("nvmlProcessDetailList_t *", "plist")],
          [V("nvmlDeviceGetRunningProcessDetailList")], callback="devices.visible.nvml_process_details"),
    _hook("nvmlDeviceGetUtilizationRates", "nvml",
          [P("nvmlDevice_t", "device"), P("nvmlUtilization_t *", "utilization")],
          [V("nvmlDeviceGetUtilizationRates")], callback="devices.visible.nvml_utilization"),
    # --- NVML: memory (pyvgpu/jit/devices/memview.py) -----------------------------------------
    _hook(
        "nvmlDeviceGetMemoryInfo", "nvml",
        [P("nvmlDevice_t", "device"), P("nvmlMemory_t *", "memory")],
        [V("nvmlDeviceGetMemoryInfo")],
        callback="devices.memview.nvml_memory_info",
    ),
    _hook(
        "nvmlDeviceGetMemoryInfo_v2", "nvml",
        [P("nvmlDevice_t", "device"), P("nvmlMemory_v2_t *", "memory")],
        [V("nvmlDeviceGetMemoryInfo_v2")],
        callback="devices.memview.nvml_memory_info_v2",
    ),
)


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
    # compute share: timing launches, measuring the device (pyvgpu/jit/compute/cost.py, controller.py, turn.py)
    _helper("cuCtxGetCurrent", "cuda", [P("CUcontext *", "pctx")]),
    _helper("cuEventCreate", "cuda", [P("CUevent *", "phEvent"), P("unsigned int", "Flags")]),
    _helper("cuEventRecord", "cuda", [P("CUevent", "hEvent"), P("CUstream", "hStream")]),
    _helper("cuEventQuery", "cuda", [P("CUevent", "hEvent")]),
    _helper("cuEventElapsedTime", "cuda", [P("float *", "pMilliseconds"), P("CUevent", "hStart"),
                                           P("CUevent", "hEnd")]),
    _helper("cuEventDestroy_v2", "cuda", [P("CUevent", "hEvent")]),
    _helper("cuStreamIsCapturing", "cuda", [P("CUstream", "hStream"), P("CUstreamCaptureStatus *", "status")]),
    _helper("cuEventSynchronize", "cuda", [P("CUevent", "hEvent")]),
    # a timed launch's gate: its start event and kernel reach the GPU together (cost.py, "gate")
    _helper("cuMemHostRegister_v2", "cuda", [P("void *", "p"), P("size_t", "bytesize"), P("unsigned int", "Flags")]),
    _helper("cuThreadExchangeStreamCaptureMode", "cuda", [P("int *", "mode")]),
    _helper("cuMemHostGetDevicePointer_v2", "cuda", [P("CUdeviceptr *", "pdptr"), P("void *", "p"),
                                                     P("unsigned int", "Flags")]),
    _helper("cuStreamWaitValue32_v2", "cuda", [P("CUstream", "stream"), P("CUdeviceptr", "addr"),
                                               P("uint32_t", "value"), P("unsigned int", "flags")]),
    _helper("nvmlDeviceGetUtilizationRates", "nvml", [P("nvmlDevice_t", "device"),
                                                      P("nvmlUtilization_t *", "utilization")]),
    _helper("nvmlDeviceGetComputeRunningProcesses_v3", "nvml",
            [P("nvmlDevice_t", "device"), P("unsigned int *", "infoCount"), P("nvmlProcessInfo_t *", "infos")]),
    _helper("nvmlDeviceGetSamples", "nvml",
            [P("nvmlDevice_t", "device"), P("nvmlSamplingType_t", "type"), P("unsigned long long", "lastSeenTimeStamp"),
             P("nvmlValueType_t *", "sampleValType"), P("unsigned int *", "sampleCount"),
             P("nvmlSample_t *", "samples")]),
    # devices: the check at cuInit (pyvgpu/jit/devices/visible.py)
    _helper("cuDeviceGetUuid_v2", "cuda", [P("CUuuid *", "uuid"), P("CUdevice", "dev")]),
)
HELPER_INDEX: dict[str, int] = {h.name: i for i, h in enumerate(HELPERS)}


_STATE = P("uint64_t", "state")
SERVICES: tuple[Service, ...] = (
    Service("svc_claim", "int32_t", (P("pv_ctx_t *", "ctx"),),
            "take a slot in the group's region for this process; its index, or -1 when every slot is taken"),
    Service("svc_tick", "int32_t", (P("pv_ctx_t *", "ctx"),),
            "the watcher thread's periodic work: reclaim dead members, step the compute controller; 0"),
    Service("svc_reclaim", "uint64_t", (P("pv_ctx_t *", "ctx"),),
            "free the slots of the group's dead processes; the bytes given back"),
    # the event log's one writer (pyvgpu/jit/state/events.py), for Python tools (pyvgpu.group.region.Region.log_event)
    Service("svc_log_event", "void",
            (P("uint64_t", "region"), P("uint32_t", "kind"), P("int32_t", "device"), P("uint32_t", "pid"),
             P("uint64_t", "a"), P("uint64_t", "b")),
            "append an event to the group's ring at region (pid 0: the calling process)"),
    # VPMM's entry points (pyvgpu/jit/vpmm/entries.py): state is the address of a pool's state block; each
    # answers a value >= 0 or a negative error (pyvgpu/jit/vpmm/tables.py)
    Service("vpmm_malloc", "int64_t", (_STATE, P("int64_t", "size"), P("uint64_t", "stream")),
            "VPMM: allocate size bytes for stream; the address, or a negative error"),
    Service("vpmm_free", "int64_t", (_STATE, P("int64_t", "ptr"), P("uint64_t", "stream"), P("int64_t", "size")),
            "VPMM: give back the allocation at ptr (size: the bytes asked for); 0, or an error"),
    Service("vpmm_trim", "int64_t", (_STATE, P("int64_t", "release")),
            "VPMM: unmap what is done (release: also give free pages back); the pages released, or an error"),
    Service("vpmm_preallocate", "int64_t", (_STATE, P("int64_t", "n")),
            "VPMM: map n pages free for every stream, all or nothing; 0, or an error"),
    Service("vpmm_record_stream", "int64_t",
            (_STATE, P("int64_t", "ptr"), P("uint64_t", "stream"), P("int64_t", "size")),
            "VPMM: the allocation at ptr is used on stream too; 0, or an error"),
    Service("vpmm_capture", "int64_t", (_STATE, P("uint64_t", "stream"), P("int64_t", "what")),
            "VPMM: a capture begins on stream (what 1) or ended (0); what -N-1 releases capture N's memory "
            "(-1: every capture's)"),
)
SERVICE_INDEX: dict[str, int] = {s.name: i for i, s in enumerate(SERVICES)}


ENTRIES: tuple[Entry, ...] = _entries(HOOKS)
for _x in (*HELPERS, *SERVICES):
    _x.signature  # noqa: B018  (unknown C types fail loudly at import)
for _s in SERVICES:
    _s.ret_numba  # noqa: B018
BY_ABI: dict[str, Entry] = {e.abi: e for e in ENTRIES}
BY_NAME: dict[str, Hook] = {h.name: h for h in HOOKS}


def table_hash() -> str:
    """Identifies the table's ABI: shim and callbacks must agree on it."""
    return hooks_model.table_hash(HELPERS, SERVICES, ENTRIES)
