/* VPMM for PyTorch's CUDAPluggableAllocator: the malloc/free pair it loads from
 * this library by name. Each call goes straight to the pool's compiled entry
 * points (pyvgpu/jit/vpmm.py: cfuncs, no GIL), installed per device by
 * pyvgpu.vpmm.enable_for_torch. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "pv_shim.h"

#define PV_VPMM_DEVICES 16

typedef int64_t (*pv_vpmm_malloc_t)(uint64_t state, int64_t size, uint64_t stream);
typedef int64_t (*pv_vpmm_free_t)(uint64_t state, int64_t ptr, uint64_t stream, int64_t size);

static struct {
    pv_vpmm_malloc_t malloc_fn;
    pv_vpmm_free_t free_fn;
    uint64_t state;
} pv_vpmm[PV_VPMM_DEVICES];

PV_EXPORT int pyvgpu_vpmm_install(int device, void *malloc_fn, void *free_fn, uint64_t state) {
    if (device < 0 || device >= PV_VPMM_DEVICES || !malloc_fn || !free_fn || !state)
        return -1;
    pv_vpmm[device].state = state;
    pv_vpmm[device].free_fn = (pv_vpmm_free_t)free_fn;
    __atomic_store_n(&pv_vpmm[device].malloc_fn, (pv_vpmm_malloc_t)malloc_fn, __ATOMIC_RELEASE);
    return 0;
}

/* PyTorch's CUDAPluggableAllocator does not check what malloc returns: a NULL
 * becomes a tensor at address 0 and a crash later. So a refusal is raised as a
 * C++ exception through c10's own check-failure function (a RuntimeError in
 * Python) when c10 is loaded; NULL is only the answer for other callers.
 * The unwinder crosses this C frame through its .eh_frame (built -fexceptions). */
typedef void (*pv_check_fail_t)(const char *func, const char *file, uint32_t line, const char *msg);

static void *pv_vpmm_refuse(ssize_t size, int device, int64_t rc) {
    char msg[256];
    if (rc == -1000 - 2) /* CUDA_ERROR_OUT_OF_MEMORY */
        snprintf(msg, sizeof msg, "CUDA out of memory: pyvgpu VPMM could not map %zd bytes on device %d (the "
                 "vGPU's memory cap or the device is full)", size, device);
    else if (rc == -2)
        snprintf(msg, sizeof msg, "pyvgpu VPMM: the pool's tables for device %d are full (%zd bytes asked)",
                 device, size);
    else if (rc == 0)
        snprintf(msg, sizeof msg, "pyvgpu VPMM has no pool for device %d (pyvgpu.vpmm.enable_for_torch made "
                 "none)", device);
    else
        snprintf(msg, sizeof msg, "pyvgpu VPMM: malloc(%zd) on device %d failed: CUresult %lld", size, device,
                 (long long)(rc <= -1000 ? -rc - 1000 : rc));
    /* PyTorch loads libc10 RTLD_LOCAL: look it up by name among what is loaded, never load it */
    void *c10 = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
    pv_check_fail_t fail = c10 ? (pv_check_fail_t)dlsym(c10, "_ZN3c106detail14torchCheckFailEPKcS2_jS2_") : NULL;
    if (c10)
        dlclose(c10); /* only drops the reference NOLOAD took */
    if (fail)
        fail("pyvgpu_vpmm_malloc", __FILE__, __LINE__, msg); /* throws, does not return */
    fprintf(stderr, "%s\n", msg); /* every message names pyvgpu */
    return NULL;
}

PV_EXPORT void *pyvgpu_vpmm_malloc(ssize_t size, int device, void *stream) {
    if (device < 0 || device >= PV_VPMM_DEVICES)
        return pv_vpmm_refuse(size, device, 0);
    pv_vpmm_malloc_t m = __atomic_load_n(&pv_vpmm[device].malloc_fn, __ATOMIC_ACQUIRE);
    if (!m)
        return pv_vpmm_refuse(size, device, 0);
    int64_t p = m(pv_vpmm[device].state, (int64_t)size, (uint64_t)(uintptr_t)stream);
    return p > 0 ? (void *)(uintptr_t)p : pv_vpmm_refuse(size, device, p);
}

PV_EXPORT void pyvgpu_vpmm_free(void *ptr, ssize_t size, int device, void *stream) {
    if (!ptr || device < 0 || device >= PV_VPMM_DEVICES || !pv_vpmm[device].free_fn)
        return;
    int64_t rc = pv_vpmm[device].free_fn(pv_vpmm[device].state, (int64_t)(uintptr_t)ptr,
                                         (uint64_t)(uintptr_t)stream, (int64_t)size);
    if (rc != 0) /* a pointer the pool does not hold: say so, never corrupt the pool */
        fprintf(stderr, "pyvgpu: VPMM free(%p, %zd) on device %d failed (%lld): not a live allocation\n", ptr,
                size, device, (long long)rc);
}
