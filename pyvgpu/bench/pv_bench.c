/* pv_bench: the native half of `pyvgpu bench` (and a non-Python host for
 * startup timing). It resolves driver functions the way the CUDA runtime
 * does (dlopen + cuGetProcAddress_v2), so run raw it measures the driver
 * and run under `pyvgpu wrap` it measures driver + shim + callbacks.
 *
 *   pv_bench launch SAMPLES BATCH     empty-kernel cuLaunchKernel, host time per call
 *   pv_bench alloc SAMPLES BATCH SIZE cuMemAlloc_v2 + cuMemFree_v2 of SIZE bytes
 *   pv_bench startup                  CLOCK_MONOTONIC ns when the first cuInit returned
 *
 * Prints one JSON line. Needs no CUDA toolkit: the kernel is PTX text that
 * the driver compiles.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction;

static CUresult (*gpa)(const char *, void **, int, unsigned long long, int *);
static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuCtxSynchronize)(void);
static CUresult (*p_cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*p_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, void *, void **, void **);
static CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);

static const char PTX[] = ".version 7.8\n.target sm_75\n.address_size 64\n"
                          ".visible .entry pv_empty()\n{\n\tret;\n}\n";

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what, CUresult rc) {
    fprintf(stderr, "pv_bench: %s failed with CUresult %d\n", what, rc);
    exit(2);
}

#define CHECK(call)                                                                                              \
    do {                                                                                                         \
        CUresult rc_ = (call);                                                                                   \
        if (rc_)                                                                                                 \
            die(#call, rc_);                                                                                     \
    } while (0)

static void get(const char *name, void *out) {
    int status = -1;
    CUresult rc = gpa(name, (void **)out, 12000, 0, &status);
    if (rc || !*(void **)out) {
        fprintf(stderr, "pv_bench: cuGetProcAddress(%s) failed: rc %d status %d\n", name, rc, status);
        exit(2);
    }
}

static void *driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "pv_bench: cannot load libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    return h;
}

static void setup(void) {
    void *h = driver();
    *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "pv_bench: the driver has no cuGetProcAddress_v2 (CUDA 12+ needed)\n");
        exit(2);
    }
    get("cuInit", &p_cuInit);
    get("cuDeviceGet", &p_cuDeviceGet);
    get("cuDevicePrimaryCtxRetain", &p_cuDevicePrimaryCtxRetain);
    get("cuCtxSetCurrent", &p_cuCtxSetCurrent);
    get("cuCtxSynchronize", &p_cuCtxSynchronize);
    get("cuModuleLoadData", &p_cuModuleLoadData);
    get("cuModuleGetFunction", &p_cuModuleGetFunction);
    get("cuLaunchKernel", &p_cuLaunchKernel);
    get("cuMemAlloc", &p_cuMemAlloc);
    get("cuMemFree", &p_cuMemFree);
    CUdevice dev;
    CUcontext ctx;
    CHECK(p_cuInit(0));
    CHECK(p_cuDeviceGet(&dev, 0));
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(p_cuCtxSetCurrent(ctx));
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void report(const char *op, long long *per_call, int samples, int batch, size_t size) {
    qsort(per_call, samples, sizeof *per_call, cmp_ll);
    printf("{\"op\": \"%s\", \"median_ns\": %lld, \"p10_ns\": %lld, \"p90_ns\": %lld, \"samples\": %d, "
           "\"batch\": %d, \"size\": %zu}\n",
           op, per_call[samples / 2], per_call[samples / 10], per_call[samples * 9 / 10], samples, batch, size);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pv_bench launch SAMPLES BATCH | alloc SAMPLES BATCH SIZE | startup\n");
        return 2;
    }
    if (!strcmp(argv[1], "startup")) {
        void *h = driver();
        CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
        CHECK(init(0));
        printf("{\"op\": \"startup\", \"t_ns\": %lld}\n", now_ns());
        return 0;
    }
    int samples = argc > 2 ? atoi(argv[2]) : 200;
    int batch = argc > 3 ? atoi(argv[3]) : 100;
    if (samples < 10 || batch < 1) {
        fprintf(stderr, "pv_bench: SAMPLES must be >= 10 and BATCH >= 1\n");
        return 2;
    }
    long long *per_call = calloc(samples, sizeof *per_call);
    setup();
    if (!strcmp(argv[1], "launch")) {
        CUmodule mod;
        CUfunction fn;
        CHECK(p_cuModuleLoadData(&mod, PTX));
        CHECK(p_cuModuleGetFunction(&fn, mod, "pv_empty"));
        for (int i = 0; i < 1000; i++) /* warm up */
            CHECK(p_cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(p_cuCtxSynchronize());
        for (int s = 0; s < samples; s++) {
            long long t0 = now_ns();
            for (int i = 0; i < batch; i++)
                CHECK(p_cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
            per_call[s] = (now_ns() - t0) / batch;
            CHECK(p_cuCtxSynchronize());
        }
        report("launch", per_call, samples, batch, 0);
    } else if (!strcmp(argv[1], "alloc")) {
        size_t size = argc > 4 ? strtoull(argv[4], NULL, 0) : (2u << 20);
        CUdeviceptr p;
        for (int i = 0; i < 100; i++) { /* warm up */
            CHECK(p_cuMemAlloc(&p, size));
            CHECK(p_cuMemFree(p));
        }
        for (int s = 0; s < samples; s++) {
            long long t0 = now_ns();
            for (int i = 0; i < batch; i++) {
                CHECK(p_cuMemAlloc(&p, size));
                CHECK(p_cuMemFree(p));
            }
            per_call[s] = (now_ns() - t0) / batch;
        }
        report("alloc_free", per_call, samples, batch, size);
    } else {
        fprintf(stderr, "pv_bench: unknown mode %s\n", argv[1]);
        return 2;
    }
    free(per_call);
    return 0;
}
