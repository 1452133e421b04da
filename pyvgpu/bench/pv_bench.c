/* pv_bench: the native half of `pyvgpu bench` (and a non-Python host for
 * startup timing). It resolves driver functions the way the CUDA runtime
 * does (dlopen + cuGetProcAddress_v2), so run raw it measures the driver
 * and run under `pyvgpu wrap` it measures driver + shim + callbacks.
 *
 *   pv_bench launch SAMPLES BATCH     empty-kernel cuLaunchKernel, host time per call
 *   pv_bench alloc SAMPLES BATCH SIZE cuMemAlloc_v2 + cuMemFree_v2 of SIZE bytes
 *   pv_bench ab launch|alloc ...      under the shim only: alternate batches through
 *                                     the hook and through the driver's own function
 *                                     (pyvgpu_real_function), same process, same GPU
 *                                     state; reports both medians
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

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              void *, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static CUfunction g_fn;
static size_t g_size;

static long long time_launch(launch_fn launch, int batch) {
    long long t0 = now_ns();
    for (int i = 0; i < batch; i++)
        CHECK(launch(g_fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    long long dt = (now_ns() - t0) / batch;
    CHECK(p_cuCtxSynchronize());
    return dt;
}

static long long time_alloc(alloc_fn alloc, free_fn fre, int batch) {
    CUdeviceptr p;
    long long t0 = now_ns();
    for (int i = 0; i < batch; i++) {
        CHECK(alloc(&p, g_size));
        CHECK(fre(p));
    }
    return (now_ns() - t0) / batch;
}

static void prepare(const char *op) {
    if (!strcmp(op, "launch")) {
        CUmodule mod;
        CHECK(p_cuModuleLoadData(&mod, PTX));
        CHECK(p_cuModuleGetFunction(&g_fn, mod, "pv_empty"));
        for (int i = 0; i < 1000; i++) /* warm up */
            CHECK(p_cuLaunchKernel(g_fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(p_cuCtxSynchronize());
    } else {
        for (int i = 0; i < 100; i++)
            time_alloc(p_cuMemAlloc, p_cuMemFree, 1);
    }
}

static long long sample(const char *op, int hooked, int batch, void *real_launch, void *real_alloc,
                        void *real_free) {
    if (!strcmp(op, "launch"))
        return time_launch(hooked ? p_cuLaunchKernel : (launch_fn)real_launch, batch);
    return time_alloc(hooked ? p_cuMemAlloc : (alloc_fn)real_alloc, hooked ? p_cuMemFree : (free_fn)real_free,
                      batch);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pv_bench [ab] launch SAMPLES BATCH | [ab] alloc SAMPLES BATCH SIZE | startup\n");
        return 2;
    }
    if (!strcmp(argv[1], "startup")) {
        void *h = driver();
        CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
        CHECK(init(0));
        printf("{\"op\": \"startup\", \"t_ns\": %lld}\n", now_ns());
        return 0;
    }
    int ab = !strcmp(argv[1], "ab");
    char **a = argv + ab;
    int n = argc - ab;
    const char *op = a[1];
    if (strcmp(op, "launch") && strcmp(op, "alloc")) {
        fprintf(stderr, "pv_bench: unknown mode %s\n", op);
        return 2;
    }
    int samples = n > 2 ? atoi(a[2]) : 200;
    int batch = n > 3 ? atoi(a[3]) : 100;
    g_size = n > 4 ? strtoull(a[4], NULL, 0) : (2u << 20);
    if (samples < 10 || batch < 1) {
        fprintf(stderr, "pv_bench: SAMPLES must be >= 10 and BATCH >= 1\n");
        return 2;
    }
    const char *name = !strcmp(op, "launch") ? "launch" : "alloc_free";
    setup();
    prepare(op);
    long long *hook = calloc(samples, sizeof *hook), *raw = calloc(samples, sizeof *raw);
    if (!ab) {
        for (int s = 0; s < samples; s++)
            hook[s] = sample(op, 1, batch, NULL, NULL, NULL);
        report(name, hook, samples, batch, g_size);
        return 0;
    }
    void *(*real)(const char *) = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "pyvgpu_real_function");
    if (!real) {
        fprintf(stderr, "pv_bench: ab needs the shim: run it under pyvgpu wrap\n");
        return 2;
    }
    void *rl = real("cuLaunchKernel"), *ra = real("cuMemAlloc_v2"), *rf = real("cuMemFree_v2");
    if (!rl || !ra || !rf || rl == (void *)p_cuLaunchKernel || ra == (void *)p_cuMemAlloc) {
        fprintf(stderr, "pv_bench: the shim did not hook this process's driver functions\n");
        return 2;
    }
    long long *diff = calloc(samples, sizeof *diff);
    for (int s = 0; s < samples; s++) { /* alternate which side goes first */
        int first = s & 1;
        long long x = sample(op, first, batch, rl, ra, rf);
        long long y = sample(op, !first, batch, rl, ra, rf);
        hook[s] = first ? x : y;
        raw[s] = first ? y : x;
        diff[s] = hook[s] - raw[s]; /* a pair measured back to back: drift cancels */
    }
    qsort(hook, samples, sizeof *hook, cmp_ll);
    qsort(raw, samples, sizeof *raw, cmp_ll);
    qsort(diff, samples, sizeof *diff, cmp_ll);
    printf("{\"op\": \"%s\", \"raw_median_ns\": %lld, \"hook_median_ns\": %lld, \"paired_diff_median_ns\": %lld, "
           "\"raw_p10_ns\": %lld, \"hook_p10_ns\": %lld, \"samples\": %d, \"batch\": %d, \"size\": %zu}\n",
           name, raw[samples / 2], hook[samples / 2], diff[samples / 2], raw[samples / 10], hook[samples / 10],
           samples, batch, g_size);
    return 0;
}
