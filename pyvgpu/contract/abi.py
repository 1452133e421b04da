"""Facts of the CUDA driver's and NVML's ABI that pyvgpu relies on: codes, flags and struct offsets.

Every value is the public ABI of cuda.h and nvml.h (CUDA 13, NVML of driver 580),
written once here. The callbacks import them from this module, and
``scripts/gen_shim.py`` renders the ``#define`` lines of ``shim/generated/pv_abi.h``
from :data:`C_CONSTANTS`. Structs are declared only as far as the policies read
them; an offset is a fact of the ABI, not a choice.
"""

from __future__ import annotations

from pyvgpu.contract.structs import Field, Struct

# --- CUresult (cuda.h) ------------------------------------------------------------------
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801

# --- nvmlReturn_t (nvml.h) -----------------------------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_FUNCTION_NOT_FOUND = 13

# --- cuGetProcAddress (CUdriverProcAddress_flags, CUdriverProcAddressQueryResult) ------------
CU_GET_PROC_ADDRESS_DEFAULT = 0
CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1
CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
CU_GET_PROC_ADDRESS_SUCCESS = 0
CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1
CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2

# --- other enums and handles ------------------------------------------------------------------
CU_EVENT_DISABLE_TIMING = 2
CU_STREAM_PER_THREAD = 2  # the per-thread default stream's handle, valid with every API
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7

# The codes the shim's C needs (shim/generated/pv_abi.h).
C_CONSTANTS = (
    "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_NOT_PERMITTED",
    "NVML_SUCCESS", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND",
    "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM", "CU_GET_PROC_ADDRESS_SUCCESS",
    "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND", "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT",
)

# "Not found" per library: what a hook answers when the driver lacks the function.
NOT_FOUND = {"cuda": CUDA_ERROR_NOT_FOUND, "nvml": NVML_ERROR_FUNCTION_NOT_FOUND}

# --- structs, as far as the policies read them ------------------------------------------------
LAUNCH_CONFIG = Struct("CUlaunchConfig", [
    Field("gridDimX", "u32"), Field("gridDimY", "u32"), Field("gridDimZ", "u32"),
    Field("blockDimX", "u32"), Field("blockDimY", "u32"), Field("blockDimZ", "u32"),
    Field("sharedMemBytes", "u32"), Field("hStream", "u64"), Field("attrs", "u64"), Field("numAttrs", "u32"),
])
LAUNCH_PARAMS = Struct("CUDA_LAUNCH_PARAMS", [
    Field("function", "u64"),
    Field("gridDimX", "u32"), Field("gridDimY", "u32"), Field("gridDimZ", "u32"),
    Field("blockDimX", "u32"), Field("blockDimY", "u32"), Field("blockDimZ", "u32"),
    Field("sharedMemBytes", "u32"), Field("hStream", "u64"), Field("kernelParams", "u64"),
])
MEM_ALLOCATION_PROP = Struct("CUmemAllocationProp", [
    Field("type", "i32"), Field("requestedHandleTypes", "i32"),
    Field("location_type", "i32"), Field("location_id", "i32"),  # CUmemLocation, inline
    Field("win32HandleMetaData", "u64"),
    Field("compressionType", "u8"), Field("gpuDirectRDMACapable", "u8"), Field("usage", "u16"),
])
ARRAY_DESCRIPTOR = Struct("CUDA_ARRAY_DESCRIPTOR", [
    Field("Width", "u64"), Field("Height", "u64"), Field("Format", "u32"), Field("NumChannels", "u32"),
])
ARRAY3D_DESCRIPTOR = Struct("CUDA_ARRAY3D_DESCRIPTOR", [
    Field("Width", "u64"), Field("Height", "u64"), Field("Depth", "u64"), Field("Format", "u32"),
    Field("NumChannels", "u32"), Field("Flags", "u32"),
])
NVML_MEMORY = Struct("nvmlMemory_t", [Field("total", "u64"), Field("free", "u64"), Field("used", "u64")])
NVML_MEMORY_V2 = Struct("nvmlMemory_v2_t", [
    Field("version", "u32"), Field("total", "u64"), Field("reserved", "u64"), Field("free", "u64"),
    Field("used", "u64"),
])
NVML_UTILIZATION = Struct("nvmlUtilization_t", [Field("gpu", "u32"), Field("memory", "u32")], align=4)
# nvmlDeviceGetSamples: timeStamp in CLOCK_REALTIME microseconds (read on driver 580); the value an nvmlValue_t
# union, whose member nvmlValueType_t names
NVML_SAMPLE = Struct("nvmlSample_t", [Field("timeStamp", "u64"), Field("sampleValue", "u64")])
NVML_GPU_UTILIZATION_SAMPLES = 1  # nvmlSamplingType_t
# nvmlValueType_t: the integer kinds (utilization samples come as UNSIGNED_INT); DOUBLE (0) is not read
NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG = 1, 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_INT = 3, 4, 5
# The process list entries: usedGpuMemory sits at offset 8 in every version.
NVML_PROCESS_INFO_V1 = Struct("nvmlProcessInfo_v1_t", [Field("pid", "u32"), Field("usedGpuMemory", "u64")])
NVML_PROCESS_INFO = Struct("nvmlProcessInfo_t", [
    Field("pid", "u32"), Field("usedGpuMemory", "u64"), Field("gpuInstanceId", "u32"),
    Field("computeInstanceId", "u32"),
])
NVML_PROCESS_DETAIL = Struct("nvmlProcessDetail_v1_t", [
    Field("pid", "u32"), Field("usedGpuMemory", "u64"), Field("gpuInstanceId", "u32"),
    Field("computeInstanceId", "u32"), Field("usedGpuCcProtectedMemory", "u64"),
])
NVML_PROCESS_DETAIL_LIST = Struct("nvmlProcessDetailList_t", [
    Field("version", "u32"), Field("mode", "u32"), Field("numProcArrayEntries", "u32"), Field("procArray", "u64"),
])
CU_UUID_BYTES = 16
NVML_BUS_ID_BYTES = 64  # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE is 32; cuDeviceGetPCIBusId writes at most 13

# CUarray_format (cuda.h) -> bytes per channel
ARRAY_FORMAT_BYTES = {
    0x01: 1, 0x08: 1, 0xC0: 1, 0xC6: 1,  # UNSIGNED_INT8, SIGNED_INT8, UNORM_INT8X1.., SNORM_INT8X1..
    0x02: 2, 0x09: 2, 0x10: 2, 0xC3: 2, 0xC9: 2,  # (UN)SIGNED_INT16, HALF, UNORM/SNORM_INT16X1..
    0x03: 4, 0x0A: 4, 0x20: 4,  # UNSIGNED_INT32, SIGNED_INT32, FLOAT
}
ARRAY_FORMAT_UNKNOWN_BYTES = 16  # an upper bound for formats not listed
# the same, as a table of every code below 256 (what the callbacks index)
ARRAY_FORMAT_BYTES_BY_CODE = bytes(ARRAY_FORMAT_BYTES.get(code, ARRAY_FORMAT_UNKNOWN_BYTES) for code in range(256))
