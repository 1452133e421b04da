/* The few CUDA driver and NVML types the shim needs, so that building it
 * needs no CUDA toolkit. The codes are in ../generated/pv_abi.h,
 * rendered from pyvgpu/contract/abi.py. */
#ifndef PV_TYPES_H
#define PV_TYPES_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef uint64_t cuuint64_t;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef struct CUlaunchConfig_st CUlaunchConfig;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUmemAllocationProp_st CUmemAllocationProp;
typedef struct CUDA_ARRAY_DESCRIPTOR_st CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st CUDA_ARRAY3D_DESCRIPTOR;
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef struct CUDA_LAUNCH_PARAMS_st CUDA_LAUNCH_PARAMS;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUevent_st *CUevent;

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlMemory_st nvmlMemory_t;
typedef struct nvmlMemory_v2_st nvmlMemory_v2_t;
typedef struct nvmlProcessInfo_st nvmlProcessInfo_t;
typedef struct nvmlProcessInfo_v1_st nvmlProcessInfo_v1_t;
typedef struct nvmlUtilization_st nvmlUtilization_t;
typedef int nvmlSamplingType_t;
typedef int nvmlValueType_t;
typedef struct nvmlSample_st nvmlSample_t;
typedef struct nvmlProcessDetailList_st nvmlProcessDetailList_t;

#include "../generated/pv_abi.h"
#endif
