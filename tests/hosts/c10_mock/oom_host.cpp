/* Loads pyvgpu's shim (argv[1]) next to the mock libc10, installs "pools" whose malloc refuses (device 0:
 * out of memory, device 1: another driver error), calls pyvgpu_vpmm_malloc as PyTorch's
 * CUDAPluggableAllocator does, and prints which C++ exception class arrived and its message. */
#include <cstdint>
#include <cstdio>
#include <dlfcn.h>
#include <sys/types.h>

#include "c10_mock.h"

extern "C" {
typedef void *(*vpmm_malloc_t)(ssize_t, int, void *);
typedef int (*vpmm_install_t)(int, void *, void *, uint64_t);
static int64_t refuse_oom(uint64_t, int64_t, uint64_t) { return -1000 - 2; }
static int64_t refuse_other(uint64_t, int64_t, uint64_t) { return -1000 - 999; }
static int64_t free_nothing(uint64_t, int64_t, uint64_t, int64_t) { return 0; }
}

int main(int argc, char **argv) {
    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!shim) {
        printf("dlopen %s\n", dlerror());
        return 2;
    }
    auto install = (vpmm_install_t)dlsym(shim, "pyvgpu_vpmm_install");
    auto vmalloc = (vpmm_malloc_t)dlsym(shim, "pyvgpu_vpmm_malloc");
    install(0, (void *)refuse_oom, (void *)free_nothing, 1);
    install(1, (void *)refuse_other, (void *)free_nothing, 1);
    for (int dev = 0; dev < 2; dev++) {
        try {
            vmalloc(1 << 30, dev, nullptr);
            printf("returned\n");
        } catch (const c10::OutOfMemoryError &e) {
            printf("OutOfMemoryError: %s\n", e.what());
        } catch (const c10::Error &e) {
            printf("Error: %s\n", e.what());
        } catch (...) {
            printf("other\n");
        }
    }
    c10::OutOfMemoryError *never = nullptr; /* the host needs the class too, as PyTorch's catch does */
    (void)never;
    return 0;
}
