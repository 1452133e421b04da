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
 *   pv_bench calibrate ITERS          GPU ns of one spin kernel of ITERS iterations (timing events)
 *   pv_bench sm SECONDS ITERS kernel|graph|streams [GAP_US [DEVICE]]
 *                                     the compute-bound load of `pyvgpu bench sm`: spin kernels
 *                                     (or a CUDA graph of GRAPH_KERNELS of them) back to back, the
 *                                     queue kept GPU-busy but bounded; prints "P <ns> <kernels done>"
 *                                     four times a second, then a JSON summary. `streams` launches
 *                                     on two streams of its own, alternating every mark. GAP_US > 0
 *                                     makes training steps of a launch-bound load: it sleeps that long
 *                                     after each launch (the host leaves the GPU idle between kernels)
 *                                     and waits for each mark's kernels before the next (the step's
 *                                     sync), so its speed depends on how soon its kernels run.
 *                                     DEVICE: the CUDA device it loads (default 0), for one
 *                                     process a GPU.
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
typedef void *CUevent, *CUgraph, *CUgraphExec, *CUgraphNode;
static CUresult (*p_cuDeviceGetAttribute)(int *, int, CUdevice);
static CUresult (*p_cuEventCreate)(CUevent *, unsigned);
static CUresult (*p_cuEventRecord)(CUevent, void *);
static CUresult (*p_cuEventSynchronize)(CUevent);
static CUresult (*p_cuEventElapsedTime)(float *, CUevent, CUevent);
static CUresult (*p_cuGraphCreate)(CUgraph *, unsigned);
static CUresult (*p_cuGraphAddKernelNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const void *);
static CUresult (*p_cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*p_cuGraphLaunch)(CUgraphExec, void *);
static CUresult (*p_cuStreamCreate)(void **, unsigned);

static const char PTX[] = ".version 7.8\n.target sm_75\n.address_size 64\n"
                          ".visible .entry pv_empty()\n{\n\tret;\n}\n"
                          /* pv_spin(n, out): n iterations of 4 independent FMA chains per thread; the
                           * store is never taken but keeps the loop alive. Compute-bound, no memory. */
                          ".visible .entry pv_spin(.param .u32 pv_n, .param .u64 pv_out)\n{\n"
                          "\t.reg .pred p;\n\t.reg .b32 i, n;\n\t.reg .f32 a, b, c, d, m, k;\n\t.reg .b64 o;\n"
                          "\tld.param.u32 n, [pv_n];\n\tmov.b32 i, 0;\n"
                          "\tmov.f32 a, 0f3F800000;\n\tmov.f32 b, 0f3F000000;\n\tmov.f32 c, 0f3E800000;\n"
                          "\tmov.f32 d, 0f3E000000;\n\tmov.f32 m, 0f3F7FFFFE;\n\tmov.f32 k, 0f3A83126F;\n"
                          "LOOP:\n\tfma.rn.f32 a, a, m, k;\n\tfma.rn.f32 b, b, m, k;\n\tfma.rn.f32 c, c, m, k;\n"
                          "\tfma.rn.f32 d, d, m, k;\n\tadd.u32 i, i, 1;\n\tsetp.lt.u32 p, i, n;\n\t@p bra LOOP;\n"
                          "\tadd.f32 a, a, b;\n\tadd.f32 c, c, d;\n\tadd.f32 a, a, c;\n"
                          "\tsetp.neu.f32 p, a, 0f7F800000;\n\t@p bra DONE;\n"
                          "\tld.param.u64 o, [pv_out];\n\tst.global.f32 [o], a;\n"
                          "DONE:\n\tret;\n}\n";

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

static void setup(int device) {
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
    get("cuDeviceGetAttribute", &p_cuDeviceGetAttribute);
    get("cuEventCreate", &p_cuEventCreate);
    get("cuEventRecord", &p_cuEventRecord);
    get("cuEventSynchronize", &p_cuEventSynchronize);
    get("cuEventElapsedTime", &p_cuEventElapsedTime);
    get("cuGraphCreate", &p_cuGraphCreate);
    get("cuGraphAddKernelNode", &p_cuGraphAddKernelNode);
    get("cuGraphInstantiateWithFlags", &p_cuGraphInstantiateWithFlags);
    get("cuGraphLaunch", &p_cuGraphLaunch);
    get("cuStreamCreate", &p_cuStreamCreate);
    CUdevice dev;
    CUcontext ctx;
    CHECK(p_cuInit(0));
    CHECK(p_cuDeviceGet(&dev, device));
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

/* ---- the compute-bound load of `pyvgpu bench sm` -------------------------- */

#define GRAPH_KERNELS 10
#define RING 8            /* progress events in flight: bounds the queue */
#define LAUNCHES_PER_MARK 4

static CUfunction g_spin;
static unsigned g_blocks, g_iters;
static void *g_spin_params[2];
static CUdeviceptr g_sink;

static void prepare_spin(unsigned iters) {
    CUmodule mod;
    int sms = 0;
    CHECK(p_cuModuleLoadData(&mod, PTX));
    CHECK(p_cuModuleGetFunction(&g_spin, mod, "pv_spin"));
    CHECK(p_cuDeviceGetAttribute(&sms, 16 /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */, 0));
    g_blocks = (unsigned)(sms > 0 ? sms : 1) * 8; /* 8 x 256 threads: every SM full */
    g_iters = iters;
    CHECK(p_cuMemAlloc(&g_sink, 64));
    g_spin_params[0] = &g_iters;
    g_spin_params[1] = &g_sink;
}

static void launch_spin_on(void *stream) {
    CHECK(p_cuLaunchKernel(g_spin, g_blocks, 1, 1, 256, 1, 1, 0, stream, g_spin_params, NULL));
}

static void launch_spin(void) { launch_spin_on(NULL); }

static void host_gap(unsigned us) {
    if (us) {
        struct timespec ts = {0, (long)us * 1000L};
        nanosleep(&ts, NULL);
    }
}

static int calibrate(unsigned iters) {
    CUevent a, b;
    float ms = 0, best = 1e30f;
    prepare_spin(iters);
    CHECK(p_cuEventCreate(&a, 0));
    CHECK(p_cuEventCreate(&b, 0));
    for (int r = 0; r < 7; r++) {
        CHECK(p_cuEventRecord(a, NULL));
        launch_spin();
        CHECK(p_cuEventRecord(b, NULL));
        CHECK(p_cuEventSynchronize(b));
        CHECK(p_cuEventElapsedTime(&ms, a, b));
        if (r > 0 && ms < best) /* the first includes loading the module */
            best = ms;
    }
    printf("{\"op\": \"calibrate\", \"iters\": %u, \"kernel_ns\": %.0f, \"blocks\": %u}\n", iters,
           best * 1e6, g_blocks);
    return 0;
}

enum { LOAD_KERNEL, LOAD_GRAPH, LOAD_STREAMS };

static int sm_load(double seconds, unsigned iters, int mode, unsigned gap_us) {
    int graph = mode == LOAD_GRAPH;
    void *streams[2] = {NULL, NULL};
    if (mode == LOAD_STREAMS) {
        CHECK(p_cuStreamCreate(&streams[0], 1 /* CU_STREAM_NON_BLOCKING */));
        CHECK(p_cuStreamCreate(&streams[1], 1));
    }
    prepare_spin(iters);
    CUgraphExec exec = NULL;
    if (graph) {
        CUgraph g;
        CUgraphNode prev = NULL, node;
        CHECK(p_cuGraphCreate(&g, 0));
        struct { /* CUDA_KERNEL_NODE_PARAMS_v2 */
            CUfunction func;
            unsigned gx, gy, gz, bx, by, bz, shm;
            void **params, **extra;
            void *kern, *ctx;
        } np = {g_spin, g_blocks, 1, 1, 256, 1, 1, 0, g_spin_params, NULL, NULL, NULL};
        for (int i = 0; i < GRAPH_KERNELS; i++) {
            CHECK(p_cuGraphAddKernelNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &np));
            prev = node;
        }
        CHECK(p_cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    int per_launch = graph ? GRAPH_KERNELS : 1;
    CUevent ring[RING];
    long long marked[RING]; /* kernels launched when ring[i] was recorded */
    for (int i = 0; i < RING; i++) {
        CHECK(p_cuEventCreate(&ring[i], 2 /* CU_EVENT_DISABLE_TIMING */));
        marked[i] = -1;
    }
    long long launched = 0, done = 0, t0 = now_ns(), next_print = t0, end = t0 + (long long)(seconds * 1e9);
    unsigned mark = 0;
    printf("P %lld 0\n", t0);
    while (now_ns() < end) {
        void *stream = streams[mark & 1]; /* NULL unless `streams`: then the marks alternate */
        for (int i = 0; i < LAUNCHES_PER_MARK; i++) {
            if (graph)
                CHECK(p_cuGraphLaunch(exec, NULL));
            else
                launch_spin_on(stream);
            launched += per_launch;
            host_gap(gap_us);
        }
        unsigned r = mark++ % RING;
        if (marked[r] >= 0) { /* wait for the mark RING marks ago: at most RING x 4 launches queued (the
                               * same stream: RING is even) */
            CHECK(p_cuEventSynchronize(ring[r]));
            done = marked[r];
        }
        CHECK(p_cuEventRecord(ring[r], stream));
        marked[r] = launched;
        if (gap_us) { /* a training step ends in a sync (a loss read back): wait for its kernels */
            CHECK(p_cuEventSynchronize(ring[r]));
            done = launched;
        }
        long long now = now_ns();
        if (now >= next_print) {
            printf("P %lld %lld\n", now, done);
            fflush(stdout);
            next_print = now + 250000000LL;
        }
    }
    CHECK(p_cuCtxSynchronize());
    long long t1 = now_ns();
    printf("P %lld %lld\n", t1, launched);
    printf("{\"op\": \"sm\", \"kernels\": %lld, \"seconds\": %.6f, \"iters\": %u, \"blocks\": %u, "
           "\"graph\": %d, \"streams\": %d, \"gap_us\": %u}\n", launched, (t1 - t0) / 1e9, iters, g_blocks, graph,
           mode == LOAD_STREAMS ? 2 : 1, gap_us);
    return 0;
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
    if (!strcmp(argv[1], "calibrate") || !strcmp(argv[1], "sm")) {
        int sm = !strcmp(argv[1], "sm");
        if (argc < (sm ? 5 : 3)) {
            fprintf(stderr, "usage: pv_bench calibrate ITERS | pv_bench sm SECONDS ITERS kernel|graph|streams "
                            "[GAP_US [DEVICE]]\n");
            return 2;
        }
        setup(sm && argc > 6 ? atoi(argv[6]) : 0); /* DEVICE: the CUDA device to load (one process a GPU) */
        if (!sm)
            return calibrate((unsigned)strtoul(argv[2], NULL, 10));
        int mode = !strcmp(argv[4], "graph") ? LOAD_GRAPH : !strcmp(argv[4], "streams") ? LOAD_STREAMS : LOAD_KERNEL;
        return sm_load(strtod(argv[2], NULL), (unsigned)strtoul(argv[3], NULL, 10), mode,
                       argc > 5 ? (unsigned)strtoul(argv[5], NULL, 10) : 0);
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
    setup(0);
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
