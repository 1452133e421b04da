/* A non-Python host linked against libcuda and libnvidia-ml: the calls bind
 * to the shim's exported hooks directly, and the shim embeds Python. */
#include <stdio.h>
#include "cuda_decls.h"

CUresult cuInit(unsigned);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);

int main(void) {
    int n;
    size_t total, freeb, tot2;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr p[3];
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&n));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceTotalMem_v2(&total, dev));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < 3; i++)
        CHECK(cuMemAlloc_v2(&p[i], 1 << 20));
    for (int i = 0; i < 3; i++)
        CHECK(cuMemFree_v2(p[i]));
    CHECK(cuMemGetInfo_v2(&freeb, &tot2));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "pv_empty"));
    for (int i = 0; i < 5; i++)
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    for (int i = 0; i < 2; i++)
        CHECK(cuLaunchKernel_ptsz(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
    CHECK(cuLaunchKernelEx(&cfg, fn, NULL, NULL));
    CHECK(cuLaunchKernelEx_ptsz(&cfg, fn, NULL, NULL));
    nvmlDevice_t nd;
    nvmlMemory_t m;
    CHECK(nvmlInit_v2());
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &nd));
    CHECK(nvmlDeviceGetMemoryInfo(nd, &m));
    printf("OK devices=%d total=%zu free=%zu nvml_total=%llu\n", n, total, freeb, m.total);
    return 0;
}
