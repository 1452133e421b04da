/* VPMM for PyTorch's CUDAPluggableAllocator: the malloc/free pair it loads from
 * this library by name. Each call goes straight to the pool's compiled entry
 * points (pyvgpu/jit/vpmm.py: cfuncs, no GIL), installed per device by
 * pyvgpu.vpmm.enable_for_torch. */
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

/* NULL when the pool cannot give the memory: PyTorch raises its OutOfMemoryError. */
PV_EXPORT void *pyvgpu_vpmm_malloc(ssize_t size, int device, void *stream) {
    if (device < 0 || device >= PV_VPMM_DEVICES)
        return NULL;
    pv_vpmm_malloc_t m = __atomic_load_n(&pv_vpmm[device].malloc_fn, __ATOMIC_ACQUIRE);
    if (!m) {
        fprintf(stderr, "pyvgpu: VPMM has no pool for device %d (pyvgpu.vpmm.enable_for_torch made none)\n", device);
        return NULL;
    }
    int64_t p = m(pv_vpmm[device].state, (int64_t)size, (uint64_t)(uintptr_t)stream);
    return p > 0 ? (void *)(uintptr_t)p : NULL;
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
