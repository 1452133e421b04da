/* A fake libcuda.so.1 for CPU-only tests. It is a test double of the
 * hardware and never ships.
 *
 * Devices: FAKECUDA_DEVICES="16G,8G" (capacities; default two devices) are
 * the physical devices. CUDA_VISIBLE_DEVICES, read by cuInit with the real
 * driver's rules (below), picks and orders them: a CUdevice is an ordinal in that list,
 * and all per-device state (memory, contexts, the simulated clock, the
 * process registry the fake NVML reads) is kept by physical index.
 * Memory: allocations get unique fake addresses and are tracked, so a
 * double free or a foreign pointer fails as on a real driver.
 * Launches: counted; each advances a simulated busy clock.
 * cuGetProcAddress answers from a table recorded on a real driver
 * (docs/facts/procaddr-*.tsv via gen_procaddr_table.py); a name missing
 * there resolves to the fake's function of that exact name.
 * FAKECUDA_STATS=PATH writes the fake's own call counts as JSON at exit,
 * so tests can check that calls really reached the driver.
 *
 * Built with -Bsymbolic so the fake's own references bind to itself, as
 * the real driver's do, even with the shim preloaded.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_devices.h"
#include "fake_sim.h"

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef uint64_t cuuint64_t;
typedef struct fake_ctx *CUcontext;
typedef void *CUmodule, *CUfunction, *CUstream;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};

#define FAKE_DRIVER_VERSION 13000

struct fake_ctx {
    int dev;  /* the CUdevice (ordinal) it was made for */
    int phys; /* its physical device: the index of all per-device state */
    int dead; /* destroyed (cuCtxDestroy, or a primary context released to no reference): kept, never freed */
    int refs; /* a primary context's retains */
};

typedef struct {
    char bytes[16];
} CUuuid;

static int g_init;
static int g_nphys;          /* physical devices (FAKECUDA_DEVICES) */
static int g_ndev;           /* visible devices (CUDA_VISIBLE_DEVICES), set by cuInit */
static int g_phys[MAX_DEV];  /* CUdevice ordinal -> physical index */
static uint64_t g_cap[MAX_DEV];   /* by physical index, as are the next four */
static uint64_t g_used[MAX_DEV];
static uint64_t g_next[MAX_DEV];
static struct fake_ctx g_primary[MAX_DEV]; /* by ordinal */
static struct fake_mig g_mig[MAX_MIG]; /* FAKENVML_MIG: MIG instance k's state is at physical slot g_nphys + k */
static int g_nmig;
static __thread CUcontext t_cur;
static uint64_t g_ns_per_iter = 100; /* FAKECUDA_NS_PER_ITER (the simulated GPU, below) */
static double g_event_scale = 1.0;   /* FAKECUDA_EVENT_SCALE: timing events read this much long */
static uint64_t g_idle_gap_ns;       /* FAKECUDA_IDLE_GAP_NS: an ungated start event on an idle stream runs this
                                        long before its kernel (the launch's own path, as on a GPU) */
static uint64_t g_last_end;          /* when this process's queued work is done */
static uint64_t g_stream_after_destroy; /* uses of a destroyed stream (a bug in the caller) */
static uint64_t g_gate_waits, g_gate_wait_max_ns; /* waits that found a stream gate shut, the longest */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- call counting ------------------------------------------------------- */

#define FAKE_FUNCS(X)                                                                                            \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)                         \
    X(cuDeviceTotalMem) X(cuDeviceTotalMem_v2) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain)                \
    X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDeviceGetPCIBusId)                                               \
    X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxCreate_v2) X(cuCtxDestroy_v2)             \
    X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemAlloc_v2)    \
    X(cuMemFree) X(cuMemFree_v2) X(cuMemGetInfo) X(cuMemGetInfo_v2) X(cuModuleLoadData) X(cuModuleLoad) X(cuModuleGetFunction)    \
    X(cuModuleUnload) X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)        \
    X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuGetProcAddress) X(cuGetProcAddress_v2)     \
    X(cuGetErrorString) X(cuGetErrorName) X(cuMemAllocPitch_v2) X(cuMemAllocPitch) X(cuMemAllocManaged)            \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz)         \
    X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemPoolTrimTo) X(cuMemPoolDestroy) X(cuMemPoolCreate)            \
    X(cuDeviceGetMemPool) X(cuDeviceGetDefaultMemPool) X(cuMemPoolGetAttribute) X(cuMemCreate) X(cuMemRelease)    \
    X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap)         \
    X(cuMemSetAccess) X(cuArrayCreate_v2) X(cuArrayCreate) X(cuArray3DCreate_v2) X(cuMipmappedArrayCreate)         \
    X(cuArrayDestroy) X(cuMipmappedArrayDestroy) X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz)   \
    X(cuLaunchCooperativeKernelMultiDevice) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)                      \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy_v2) X(cuStreamIsCapturing) X(cuGraphCreate)       \
    X(cuGraphAddKernelNode) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphLaunch_ptsz)                 \
    X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuStreamWaitEvent) X(cuThreadExchangeStreamCaptureMode)             \
    X(cuMemHostRegister_v2) X(cuMemHostGetDevicePointer_v2) X(cuStreamWaitValue32_v2)

#define X(name) FK_##name,
enum { FAKE_FUNCS(X) FK_N };
#undef X
#define X(name) #name,
static const char *const fk_names[FK_N] = {FAKE_FUNCS(X)};
#undef X
static uint64_t fk_calls[FK_N];
#define COUNT(name) __atomic_add_fetch(&fk_calls[FK_##name], 1, __ATOMIC_RELAXED)

/* ---- configuration ------------------------------------------------------- */

static void fault_config(void);

__attribute__((constructor)) static void fake_config(void) {
    g_nphys = fake_device_caps(g_cap);
    g_nmig = fake_migs(g_mig, g_nphys);
    for (int k = 0; k < g_nmig; k++)
        g_cap[g_nphys + k] = g_mig[k].size;
    for (int d = 0; d < g_nphys + g_nmig; d++)
        g_next[d] = 0x7f0000000000ULL + ((uint64_t)d << 36);
    const char *n = getenv("FAKECUDA_NS_PER_ITER");
    if (n && *n)
        g_ns_per_iter = strtoull(n, NULL, 10);
    const char *e = getenv("FAKECUDA_EVENT_SCALE");
    if (e && *e)
        g_event_scale = strtod(e, NULL);
    const char *g = getenv("FAKECUDA_IDLE_GAP_NS");
    if (g && *g)
        g_idle_gap_ns = strtoull(g, NULL, 10);
    fault_config();
}

__attribute__((destructor)) static void fake_stats(void) {
    const char *p = getenv("FAKECUDA_STATS");
    if (!p || !*p)
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s.%d", p, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "{");
    int first = 1;
    for (int i = 0; i < FK_N; i++)
        if (fk_calls[i]) {
            fprintf(f, "%s\"%s\": %llu", first ? "" : ", ", fk_names[i], (unsigned long long)fk_calls[i]);
            first = 0;
        }
    if (g_gate_waits) {
        fprintf(f, "%s\"gate_waits\": %llu, \"gate_wait_max_ns\": %llu", first ? "" : ", ",
                (unsigned long long)g_gate_waits, (unsigned long long)g_gate_wait_max_ns);
        first = 0;
    }
    if (g_stream_after_destroy)
        fprintf(f, "%s\"stream_use_after_destroy\": %llu", first ? "" : ", ",
                (unsigned long long)g_stream_after_destroy);
    fprintf(f, "}\n");
    fclose(f);
}

/* ---- allocation tracking: open addressing, keyed by address -------------- */

struct alloc {
    CUdeviceptr ptr;  /* also VMM and array handles: one key space in the fake */
    uint64_t size;    /* bytes taken from the device */
    int dev;          /* physical */
    int pool;         /* -1, or the pool an async allocation came from */
    int maps;         /* VMM handle: pages mapped to it now */
    int released;     /* VMM handle: cuMemRelease'd while mapped; freed at its last unmap, as on a real driver */
};
static struct alloc *g_tab;
static size_t g_tab_cap, g_tab_n;

static size_t slot_of(CUdeviceptr p) { return (size_t)((p >> 8) * 0x9E3779B97F4A7C15ULL) & (g_tab_cap - 1); }

static void tab_put(struct alloc a);
static void tab_grow(void) {
    struct alloc *old = g_tab;
    size_t oldcap = g_tab_cap;
    g_tab_cap = oldcap ? oldcap * 2 : 1024;
    g_tab = calloc(g_tab_cap, sizeof *g_tab);
    g_tab_n = 0;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].ptr)
            tab_put(old[i]);
    free(old);
}

static void tab_put(struct alloc a) {
    if ((g_tab_n + 1) * 2 > g_tab_cap)
        tab_grow();
    size_t i = slot_of(a.ptr);
    while (g_tab[i].ptr)
        i = (i + 1) & (g_tab_cap - 1);
    g_tab[i] = a;
    g_tab_n++;
}

static int tab_take(CUdeviceptr p, struct alloc *out) {
    if (!g_tab_cap)
        return 0;
    size_t i = slot_of(p);
    while (g_tab[i].ptr) {
        if (g_tab[i].ptr == p) {
            *out = g_tab[i];
            g_tab[i].ptr = 0;
            g_tab_n--;
            /* re-insert the rest of the cluster (linear probing delete) */
            for (size_t j = (i + 1) & (g_tab_cap - 1); g_tab[j].ptr; j = (j + 1) & (g_tab_cap - 1)) {
                struct alloc a = g_tab[j];
                g_tab[j].ptr = 0;
                g_tab_n--;
                tab_put(a);
            }
            return 1;
        }
        i = (i + 1) & (g_tab_cap - 1);
    }
    return 0;
}

static struct alloc *tab_find(CUdeviceptr p) {
    if (!g_tab_cap || !p)
        return NULL;
    for (size_t i = slot_of(p); g_tab[i].ptr; i = (i + 1) & (g_tab_cap - 1))
        if (g_tab[i].ptr == p)
            return &g_tab[i];
    return NULL;
}

/* ---- fault injection (tests) ------------------------------------------------ */
/* fakecuda_fail("cuMemMap", n, rc): the n-th call of cuMemMap from now on returns rc, once, doing
 * nothing else (n <= 0 disarms that function). FAKECUDA_FAIL="cuMemMap:3:2,cuMemSetAccess:1:2" arms
 * the same at start. Used by the VPMM tests to fail every step of a defragmentation in turn. */
#define MAX_FAULTS 16
static struct {
    int fk;
    uint64_t at; /* the call count at which it fires */
    int rc;
} g_faults[MAX_FAULTS];
static pthread_mutex_t g_fault_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_nfaults; /* armed entries, read without the lock on the fast path */

static int fk_index(const char *name) {
    for (int i = 0; i < FK_N; i++)
        if (!strcmp(fk_names[i], name))
            return i;
    return -1;
}

EXPORT int fakecuda_fail(const char *name, long nth, int rc) {
    int fk = name ? fk_index(name) : -1;
    if (fk < 0)
        return -1;
    pthread_mutex_lock(&g_fault_mu);
    for (int i = 0; i < MAX_FAULTS; i++)
        if (g_faults[i].fk == fk + 1 && nth <= 0)
            g_faults[i].fk = 0;
    int ok = nth <= 0;
    for (int i = 0; i < MAX_FAULTS && !ok; i++)
        if (!g_faults[i].fk) {
            g_faults[i].fk = fk + 1; /* 0: a free entry */
            g_faults[i].at = __atomic_load_n(&fk_calls[fk], __ATOMIC_RELAXED) + (uint64_t)nth;
            g_faults[i].rc = rc;
            ok = 1;
        }
    int n = 0;
    for (int i = 0; i < MAX_FAULTS; i++)
        n += g_faults[i].fk != 0;
    __atomic_store_n(&g_nfaults, n, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_fault_mu);
    return ok ? 0 : -1;
}

/* After COUNT(name): the armed failure of this call, or 0. */
static int fault_hit(int fk) {
    if (!__atomic_load_n(&g_nfaults, __ATOMIC_ACQUIRE))
        return 0;
    int rc = 0;
    pthread_mutex_lock(&g_fault_mu);
    uint64_t n = __atomic_load_n(&fk_calls[fk], __ATOMIC_RELAXED);
    for (int i = 0; i < MAX_FAULTS; i++)
        if (g_faults[i].fk == fk + 1 && g_faults[i].at == n) {
            rc = g_faults[i].rc;
            g_faults[i].fk = 0;
            g_nfaults--;
            break;
        }
    pthread_mutex_unlock(&g_fault_mu);
    return rc;
}
#define FAULT(name)                                                                                              \
    do {                                                                                                         \
        int fault_rc_ = fault_hit(FK_##name);                                                                    \
        if (fault_rc_)                                                                                           \
            return fault_rc_;                                                                                    \
    } while (0)

static void fault_config(void) {
    const char *spec = getenv("FAKECUDA_FAIL");
    if (!spec || !*spec)
        return;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char name[128];
        long nth;
        int rc;
        if (sscanf(tok, "%127[^:]:%ld:%d", name, &nth, &rc) == 3)
            fakecuda_fail(name, nth, rc);
    }
}

/* ---- CUDA graph capture (tests) ---------------------------------------------- */
/* fakecuda_capture(s, 1) marks stream s as capturing (global mode), 0 ends it. While any stream
 * captures, the calls a real driver refuses then (and that would invalidate the capture: event queries
 * and synchronisation, waits and records of the capturing stream on events from outside) fail with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and are counted: fakecuda_capture_violations(). */
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define MAX_CAPTURING 8
static CUstream g_capturing[MAX_CAPTURING];
static int g_ncapturing;
static uint64_t g_capture_violations;

EXPORT int fakecuda_capture(CUstream s, int on) {
    pthread_mutex_lock(&g_fault_mu);
    int rc = -1;
    for (int i = 0; i < MAX_CAPTURING; i++)
        if (on ? !g_capturing[i] : g_capturing[i] == s) {
            g_capturing[i] = on ? s : NULL;
            g_ncapturing += on ? 1 : -1;
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&g_fault_mu);
    return rc;
}

EXPORT uint64_t fakecuda_capture_violations(void) { return __atomic_load_n(&g_capture_violations, __ATOMIC_ACQUIRE); }

/* The calling thread's capture interaction mode: 0 global (the default), 1 thread-local, 2 relaxed. While
 * a stream captures, a thread not in relaxed mode may not make the potentially unsafe calls (the VMM
 * calls that change mappings and memory: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
 * cuMemAddressReserve), as a real driver in global capture mode refuses cudaMalloc. */
static __thread int t_capture_mode;

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    COUNT(cuThreadExchangeStreamCaptureMode);
    if (!mode || *mode < 0 || *mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    int old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
#define CAPTURE_UNSAFE() CAPTURE_SAFE(__atomic_load_n(&g_ncapturing, __ATOMIC_ACQUIRE) && t_capture_mode != 2)

static int capturing(CUstream s) {
    if (!__atomic_load_n(&g_ncapturing, __ATOMIC_ACQUIRE))
        return 0;
    for (int i = 0; i < MAX_CAPTURING; i++)
        if (s && g_capturing[i] == s)
            return 1;
    return 0;
}

#define CAPTURE_SAFE(cond)                                                                                       \
    do {                                                                                                         \
        if (cond) {                                                                                              \
            __atomic_add_fetch(&g_capture_violations, 1, __ATOMIC_RELAXED);                                      \
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;                                                        \
        }                                                                                                        \
    } while (0)

/* ---- the simulated GPU (fake_sim.h) ---------------------------------------- */

/* A kernel's simulated duration: the spin kernel of pv_bench takes its first
 * parameter (a u32 iteration count) x FAKECUDA_NS_PER_ITER ns (default 100);
 * kernels without parameters take no time and skip the simulation. */

static struct sim *sim(void) {
    static struct sim *s;
    struct sim *x = __atomic_load_n(&s, __ATOMIC_ACQUIRE);
    if (x)
        return x;
    x = sim_map_file();
    if (!x)
        x = calloc(1, sizeof *x);
    struct sim *expect = NULL;
    if (!__atomic_compare_exchange_n(&s, &expect, x, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        x = expect; /* another thread won; a mapping lost is harmless in a test double */
    return x;
}

EXPORT struct sim *fakecuda_sim(void) { return sim(); } /* the fake NVML reads it without FAKECUDA_SIM */

static uint64_t kernel_ns(void **params) {
    if (!params || !params[0])
        return 0;
    return (uint64_t)*(const uint32_t *)params[0] * g_ns_per_iter;
}

struct fake_event {
    uint64_t t;          /* when it completes */
    uint64_t rec;        /* when it was recorded */
    int timing;          /* 0: CU_EVENT_DISABLE_TIMING */
    int recorded;
    int phys;            /* the device of the context it was created in */
    int idle;            /* its stream had no work queued when it was recorded */
    const volatile uint32_t *gate; /* recorded behind a cuStreamWaitValue32 on this word ... */
    uint32_t gate_value; /* ... for this value: it completes only once the word reaches it */
};
/* A stream wait (cuStreamWaitValue32, GEQ) holds back what is queued after it until the word reaches the value:
 * (int32_t)(*word - value) >= 0, as cuda.h defines it. */
static int gate_shut(const volatile uint32_t *word, uint32_t value) {
    return word && (int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) < 0;
}
#define GATE_WAIT_NS 5000000000ULL /* a gate nobody opens: the fake stops the program, loudly */
static void gate_wait(const volatile uint32_t *word, uint32_t value, const char *what) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!gate_shut(word, value))
        return;
    uint64_t ns = 0;
    while (gate_shut(word, value)) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        ns = (uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000ULL + (uint64_t)t.tv_nsec - (uint64_t)t0.tv_nsec;
        if (ns > GATE_WAIT_NS) {
            fprintf(stderr, "fakecuda: %s waits behind a stream gate (cuStreamWaitValue32) nobody opened: "
                            "on a GPU this would hang\n", what);
            abort();
        }
        sched_yield();
    }
    __atomic_add_fetch(&g_gate_waits, 1, __ATOMIC_RELAXED);
    uint64_t old = __atomic_load_n(&g_gate_wait_max_ns, __ATOMIC_RELAXED);
    while (old < ns && !__atomic_compare_exchange_n(&g_gate_wait_max_ns, &old, ns, 0, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED))
        ;
}
static int g_launch_waits = -1; /* FAKECUDA_LAUNCH_WAITS=1: every launch waits for its stream's gate, as a
                                   driver that waits for the stream inside a launch */
static uint64_t g_launch_stalls; /* FAKECUDA_LAUNCH_STALLS=N: launches stop waiting once N found their gate shut
                                    (a program's start, whose lazy module loads come in a burst) */
#define START_EVENT_NS 50000 /* a launch this soon after a timing event is the kernel it times */
static struct fake_event *g_start_event; /* a timing event recorded right before the next kernel */

/* Queue a kernel of d ns on the current device. A timing event recorded just
 * before it (within START_EVENT_NS) completes when the kernel starts, as on a
 * GPU where this process's channel, once scheduled, runs the event and then
 * the kernel: other processes' kernels ahead in the FIFO do not count, as
 * time slices of other contexts do not on a real GPU. */
/* Streams: each created stream has its own end of queued work, so an event
 * recorded on one stream waits for that stream's work only, as on a GPU
 * (work of all streams still runs one kernel at a time on the simulated
 * device). The NULL, legacy and per-thread streams share one, and so does any
 * handle the fake did not make (callers that only compare stream ids pass
 * made-up ones). A destroyed stream is kept (never freed) and marked, so a
 * later use is an error the fake counts (stream_use_after_destroy in
 * FAKECUDA_STATS), not a crash. */
#define STREAM_MAGIC 0x5354524dU
#define MAX_STREAMS 4096
struct fake_stream {
    uint32_t magic, dead;
    uint64_t last_end;
    int phys; /* the device of the context it was created in (the NULL stream: the current context's) */
    const volatile uint32_t *gate; /* its last cuStreamWaitValue32, until seen open */
    uint32_t gate_value;
    int fail_record; /* FAKECUDA_FAIL_RECORD_AFTER_WAIT: its next cuEventRecord fails ... */
    int check_open;  /* ... and its next launch finds the gate open (else it waits, counted in gate_waits) */
};
static struct fake_stream g_default_stream = {STREAM_MAGIC, 0, 0, -1};
static struct fake_stream *g_streams[MAX_STREAMS]; /* every stream made, for the lookup below */
static unsigned g_nstreams;

static struct fake_stream *fake_stream_of(CUstream s) {
    if (!s || s == (CUstream)1 || s == (CUstream)2)
        return &g_default_stream;
    unsigned n = __atomic_load_n(&g_nstreams, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < n && i < MAX_STREAMS; i++)
        if (__atomic_load_n(&g_streams[i], __ATOMIC_ACQUIRE) == (struct fake_stream *)s) {
            struct fake_stream *x = (struct fake_stream *)s;
            if (x->dead) {
                __atomic_add_fetch(&g_stream_after_destroy, 1, __ATOMIC_RELAXED);
                return NULL;
            }
            return x;
        }
    return &g_default_stream; /* not one of ours: as the fake always treated streams */
}

/* The physical device of stream s's context: the current context's for the NULL stream and for
 * handles the fake did not make; -1 with no context current. */
static int stream_phys(CUstream s) {
    struct fake_stream *x = fake_stream_of(s);
    if (x && x != &g_default_stream)
        return x->phys;
    return t_cur ? t_cur->phys : -1;
}

static void run_kernel(uint64_t d, CUstream stream) {
    if (!d)
        return;
    uint64_t st, en, called = sim_now();
    static int ranks = -1; /* FAKECUDA_SIM_COLLECTIVE: every kernel is a collective over that many devices */
    if (ranks < 0) {
        const char *v = getenv("FAKECUDA_SIM_COLLECTIVE");
        ranks = v && *v ? atoi(v) : 1;
    }
    sim_enqueue_ranks(sim(), t_cur->phys, d, ranks, &st, &en); /* may block while the queue is full */
    struct fake_event *e = __atomic_exchange_n(&g_start_event, NULL, __ATOMIC_ACQ_REL);
    if (e && e->t < st && called - e->rec < START_EVENT_NS)
        e->t = e->idle && !e->gate && st > g_idle_gap_ns ? st - g_idle_gap_ns : st;
    uint64_t old = __atomic_load_n(&g_last_end, __ATOMIC_ACQUIRE);
    while (old < en && !__atomic_compare_exchange_n(&g_last_end, &old, en, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
    struct fake_stream *x = fake_stream_of(stream);
    if (x) {
        old = __atomic_load_n(&x->last_end, __ATOMIC_ACQUIRE);
        while (old < en &&
               !__atomic_compare_exchange_n(&x->last_end, &old, en, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            ;
    }
}

/* ---- init, devices, contexts --------------------------------------------- */

#define NEED_INIT()                                                                                              \
    do {                                                                                                         \
        if (!g_init)                                                                                             \
            return CUDA_ERROR_NOT_INITIALIZED;                                                                   \
    } while (0)
/* Contexts are strict, as a real driver is for the calls that act on the current context: a call made
 * with no context current, or with a destroyed one (cuCtxDestroy, a primary context released to no
 * reference), fails with CUDA_ERROR_INVALID_CONTEXT. CTX_ON(phys) is stricter than the driver documents
 * for the calls that name their device (cuMemCreate, cuMemMap, cuMemSetAccess) or act on a stream or
 * event of a context (the NULL stream is the current context's): the current context must be of that
 * device, so that a caller working under another device's context (whose NULL stream, events,
 * cuMemAllocAsync and cuCtxSynchronize are that device's) is caught here. Every such refusal is counted:
 * fakecuda_ctx_refusals(). The VMM calls need a context here too (the driver's documentation lists no
 * CUDA_ERROR_INVALID_CONTEXT for them; tests/gpu/vpmm_ctx_probe.py asks a real one). */
static uint64_t g_ctx_refusals;
static int ctx_refused(void) {
    __atomic_add_fetch(&g_ctx_refusals, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_INVALID_CONTEXT;
}
EXPORT uint64_t fakecuda_ctx_refusals(void) { return __atomic_load_n(&g_ctx_refusals, __ATOMIC_ACQUIRE); }
#define NEED_CTX()                                                                                               \
    do {                                                                                                         \
        NEED_INIT();                                                                                             \
        if (!t_cur || t_cur->dead)                                                                               \
            return ctx_refused();                                                                                \
    } while (0)
#define CTX_ON(want)                                                                                             \
    do {                                                                                                         \
        NEED_CTX();                                                                                              \
        if (t_cur->phys != (want))                                                                               \
            return ctx_refused();                                                                                \
    } while (0)

/* ---- CUDA_VISIBLE_DEVICES -------------------------------------------------- */
/* As measured on driver 580 (H100, 2x H200): entries are split at ',' and
 * trimmed. An index entry is read as strtol does (trailing junk ignored:
 * "1a" is 1); it must be below the device count. A "GPU-" entry (that case)
 * is hex digits, '-' anywhere ignored, digits past 32 ignored, naming the
 * device whose UUID starts with them (here: exactly one device). The list
 * ends at the first invalid entry, or at the first entry of the other kind
 * than the first one ("0,GPU-..." and "GPU-...,1" keep one device). A device
 * named twice by entries of one kind fails cuInit with
 * CUDA_ERROR_INVALID_DEVICE; no device at all ("" or an invalid first entry)
 * fails it with CUDA_ERROR_NO_DEVICE. Either way the driver stays
 * uninitialized: every later call answers CUDA_ERROR_NOT_INITIALIZED.
 * MIG instances (FAKENVML_MIG; not measured: from NVIDIA's documentation):
 * "MIG-<uuid>" (a prefix, as for "GPU-") or the older
 * "MIG-GPU-<gpu uuid>/<gpu instance id>/<compute instance id>" names one.
 * CUDA documents that a process enumerates a single MIG instance: here the
 * first MIG entry is taken and later MIG entries are skipped; an entry of
 * another kind after a MIG entry ends the list, as above. Unset, the
 * variable gives the physical GPUs (the fake does not model what a GPU in
 * MIG mode shows then). */

enum { ENTRY_BAD, ENTRY_INDEX, ENTRY_UUID, ENTRY_MIG };

static int hexval(char c) { return isdigit((unsigned char)c) ? c - '0' : tolower((unsigned char)c) - 'a' + 10; }

/* The physical device a "GPU-" entry (without the "GPU-") names, or -1; mig: a "MIG-" entry's slot instead. */
static int visible_hex(const char *e, int mig) {
    unsigned char nib[32];
    int n = 0;
    for (; *e; e++) {
        if (*e == '-')
            continue;
        if (!isxdigit((unsigned char)*e))
            return -1;
        if (n < 32)
            nib[n++] = (unsigned char)hexval(*e);
    }
    if (!n)
        return -1;
    int found = -1;
    for (int i = 0; i < (mig ? g_nmig : g_nphys); i++) {
        unsigned char b[16];
        int k = 0;
        if (mig)
            fake_mig_uuid_bytes(i, &g_mig[i], b);
        else
            fake_uuid_bytes(i, b);
        while (k < n && nib[k] == ((k % 2 ? b[k / 2] : b[k / 2] >> 4) & 15))
            k++;
        if (k == n) {
            if (found >= 0)
                return -1; /* a prefix of two UUIDs */
            found = i;
        }
    }
    return found < 0 ? -1 : mig ? g_nphys + found : found;
}

/* The slot a "MIG-" entry (without the "MIG-") names, or -1. */
static int visible_mig(const char *e) {
    if (strncmp(e, "GPU-", 4))
        return visible_hex(e, 1);
    char gpu[64];
    unsigned gi, ci;
    const char *slash = strchr(e, '/');
    if (!slash || slash - e >= (long)sizeof gpu || sscanf(slash, "/%u/%u", &gi, &ci) != 2)
        return -1;
    memcpy(gpu, e + 4, slash - e - 4);
    gpu[slash - e - 4] = 0;
    int p = visible_hex(gpu, 0);
    for (int k = 0; p >= 0 && k < g_nmig; k++)
        if (g_mig[k].gpu == p && g_mig[k].gi == (int)gi && g_mig[k].ci == (int)ci)
            return g_nphys + k;
    return -1;
}

/* The physical device an entry names (*kind: ENTRY_INDEX/ENTRY_UUID), or -1. */
static int visible_entry(const char *e, int *kind) {
    *kind = ENTRY_BAD;
    if (!strncmp(e, "GPU-", 4)) {
        *kind = ENTRY_UUID;
        return visible_hex(e + 4, 0);
    }
    if (!strncmp(e, "MIG-", 4)) {
        *kind = ENTRY_MIG;
        return visible_mig(e + 4);
    }
    char *end;
    long v = strtol(e, &end, 10);
    if (end == e)
        return -1;
    *kind = ENTRY_INDEX;
    return v >= 0 && v < g_nphys ? (int)v : -1;
}

/* Fill g_phys/g_ndev from CUDA_VISIBLE_DEVICES (unset: every device); returns cuInit's answer. */
static CUresult parse_visible(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    g_ndev = 0;
    if (!v) {
        for (int d = 0; d < g_nphys; d++)
            g_phys[g_ndev++] = d;
        return g_ndev ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
    }
    char buf[1024];
    int first_kind = ENTRY_BAD, migs = 0;
    snprintf(buf, sizeof buf, "%s", v);
    for (char *e = buf, *next; e && g_ndev < MAX_DEV; e = next) {
        next = strchr(e, ',');
        if (next)
            *next++ = 0;
        while (isspace((unsigned char)*e))
            e++;
        for (char *t = e + strlen(e); t > e && isspace((unsigned char)t[-1]);)
            *--t = 0;
        int kind, p = visible_entry(e, &kind);
        if (p < 0 || (first_kind != ENTRY_BAD && kind != first_kind))
            break;
        first_kind = kind;
        if (kind == ENTRY_MIG && migs++)
            continue; /* one MIG instance per process */
        for (int k = 0; k < g_ndev; k++)
            if (g_phys[k] == p) {
                g_ndev = 0;
                return CUDA_ERROR_INVALID_DEVICE;
            }
        g_phys[g_ndev++] = p;
    }
    return g_ndev ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

/* The physical index (a MIG instance's slot) of a valid CUdevice, else -1. */
static int phys_of(CUdevice d) { return d >= 0 && d < g_ndev ? g_phys[d] : -1; }

/* The GPU a slot is on: itself, or a MIG instance's GPU. */
static int gpu_of(int p) { return p >= g_nphys ? g_mig[p - g_nphys].gpu : p; }

EXPORT CUresult cuInit(unsigned flags) {
    static int parsed;
    static CUresult rc;
    COUNT(cuInit);
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (!parsed) {
        rc = parse_visible();
        for (int d = 0; d < g_ndev; d++)
            g_primary[d] = (struct fake_ctx){d, g_phys[d], 0, 0};
        g_init = rc == CUDA_SUCCESS;
        parsed = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    COUNT(cuDriverGetVersion);
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
    COUNT(cuDeviceGetCount);
    NEED_INIT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = g_ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    COUNT(cuDeviceGet);
    NEED_INIT();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    COUNT(cuDeviceGetName);
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (phys_of(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    int p = phys_of(d);
    if (p >= g_nphys)
        snprintf(name, len, "Fake GPU %d MIG %s", gpu_of(p), g_mig[p - g_nphys].profile);
    else
        snprintf(name, len, "Fake GPU %d", p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    COUNT(cuDeviceTotalMem_v2);
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (phys_of(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_cap[phys_of(d)];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    COUNT(cuDeviceTotalMem);
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    int p = phys_of(d);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_cap[p] > 0xffffffffULL ? 0xffffffffU : (unsigned)g_cap[p];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    COUNT(cuDeviceGetAttribute);
    NEED_INIT();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    int p = phys_of(d);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    /* 16: multiprocessor count; 33/34/50: PCI bus/device/domain id, as cuDeviceGetPCIBusId */
    *v = attr == 16 ? 132 : attr == 33 ? gpu_of(p) + 1 : (attr == 34 || attr == 50) ? 0 : 1;
    return CUDA_SUCCESS;
}

/* FAKECUDA_CTX_BYTES: device memory a context takes (default 0), as a real one does. d: physical. */
static int g_ctx_made[MAX_DEV];
static void take_context_memory(int d) {
    const char *s = getenv("FAKECUDA_CTX_BYTES");
    pthread_mutex_lock(&g_mu);
    if (!g_ctx_made[d]++ && s)
        g_used[d] += parse_size(s);
    pthread_mutex_unlock(&g_mu);
}

/* Device-wide used bytes, read by the fake NVML: d is a physical (NVML) index, or a MIG instance's slot. */
EXPORT uint64_t fakecuda_device_used(int d) { return d >= 0 && d < g_nphys + g_nmig ? g_used[d] : 0; }

EXPORT CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice d) {
    COUNT(cuDeviceGetPCIBusId);
    NEED_INIT();
    if (!bus || len < 13 || phys_of(d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(bus, len, "00000000:%02x:00.0", gpu_of(phys_of(d)) + 1); /* a MIG instance: its GPU's */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d) {
    COUNT(cuDeviceGetUuid_v2);
    NEED_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (phys_of(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    int p = phys_of(d);
    if (p >= g_nphys) /* documented: _v2 returns a MIG instance's own UUID */
        fake_mig_uuid_bytes(p - g_nphys, &g_mig[p - g_nphys], (unsigned char *)uuid->bytes);
    else
        fake_uuid_bytes(p, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

/* As _v2 except on a MIG instance, where this one answers its GPU's UUID (the fake's reading of the
 * documentation: only _v2 is documented to return the MIG UUID). */
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d) {
    COUNT(cuDeviceGetUuid);
    NEED_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (phys_of(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    fake_uuid_bytes(gpu_of(phys_of(d)), (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    COUNT(cuDevicePrimaryCtxRetain);
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    int p = phys_of(d);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    take_context_memory(p);
    sim_register(sim(), p);
    pthread_mutex_lock(&g_mu);
    g_primary[d].refs++;
    g_primary[d].dead = 0; /* (re)created: a real driver may give another handle; the fake keeps one */
    pthread_mutex_unlock(&g_mu);
    *c = &g_primary[d];
    return CUDA_SUCCESS;
}

/* The last release destroys the primary context: threads where it is current then fail with
 * CUDA_ERROR_INVALID_CONTEXT, as on a real driver. */
static CUresult primary_release(CUdevice d) {
    NEED_INIT();
    if (phys_of(d) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = g_primary[d].refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    if (g_primary[d].refs > 0 && --g_primary[d].refs == 0)
        g_primary[d].dead = 1;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    COUNT(cuDevicePrimaryCtxRelease_v2);
    return primary_release(d);
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
    COUNT(cuDevicePrimaryCtxRelease);
    return primary_release(d);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    COUNT(cuCtxCreate_v2);
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    int p = phys_of(d);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    take_context_memory(p);
    sim_register(sim(), p);
    struct fake_ctx *x = calloc(1, sizeof *x);
    x->dev = d;
    x->phys = p;
    *c = t_cur = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    COUNT(cuCtxDestroy_v2);
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_cur == c)
        t_cur = NULL;
    if (c < &g_primary[0] || c >= &g_primary[MAX_DEV]) /* a primary context goes with its last release */
        c->dead = 1; /* kept, not freed: other threads may still have it current (their calls then fail) */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    COUNT(cuCtxSetCurrent);
    NEED_INIT();
    t_cur = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    COUNT(cuCtxGetCurrent);
    NEED_INIT();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    *c = t_cur;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    COUNT(cuCtxGetDevice);
    NEED_CTX();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = t_cur->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    COUNT(cuCtxSynchronize);
    FAULT(cuCtxSynchronize);
    CAPTURE_SAFE(__atomic_load_n(&g_ncapturing, __ATOMIC_ACQUIRE));
    NEED_CTX();
    sim_sleep_until(__atomic_load_n(&g_last_end, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

/* ---- memory -------------------------------------------------------------- */

/* dev: physical */
static CUresult alloc_on(int dev, CUdeviceptr *p, uint64_t size) {
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t rounded = (size + 511) & ~511ULL;
    pthread_mutex_lock(&g_mu);
    if (g_used[dev] + rounded > g_cap[dev]) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUdeviceptr a = g_next[dev];
    g_next[dev] += rounded;
    g_used[dev] += rounded;
    tab_put((struct alloc){a, rounded, dev, -1});
    pthread_mutex_unlock(&g_mu);
    *p = a;
    return CUDA_SUCCESS;
}


EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    COUNT(cuMemAlloc_v2);
    NEED_CTX();
    return alloc_on(t_cur->phys, p, size);
}

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int size) {
    COUNT(cuMemAlloc);
    NEED_CTX();
    return CUDA_ERROR_INVALID_VALUE; /* the 32-bit ABI cannot hold a 64-bit address */
}

static CUresult free_any(CUdeviceptr p);

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    COUNT(cuMemFree_v2);
    NEED_CTX();
    return free_any(p);
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
    COUNT(cuMemFree);
    NEED_CTX();
    return free_any(p);
}

/* FAKECUDA_MEMINFO_ONE_NULL=1 answers as driver 580 does (measured on an H100): one NULL pointer is
 * accepted and the other gets its value; both NULL is still an error. Default: either NULL is an error. */
static int one_null_ok(void) {
    const char *s = getenv("FAKECUDA_MEMINFO_ONE_NULL");
    return s && !strcmp(s, "1");
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    COUNT(cuMemGetInfo_v2);
    NEED_CTX();
    if (one_null_ok() ? !free_b && !total : !free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (total)
        *total = g_cap[t_cur->phys];
    if (free_b)
        *free_b = g_cap[t_cur->phys] - g_used[t_cur->phys];
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total) {
    COUNT(cuMemGetInfo);
    NEED_CTX();
    if (one_null_ok() ? !free_b && !total : !free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t t = g_cap[t_cur->phys], f = t - g_used[t_cur->phys];
    if (total)
        *total = t > 0xffffffffULL ? 0xffffffffU : (unsigned)t;
    if (free_b)
        *free_b = f > 0xffffffffULL ? 0xffffffffU : (unsigned)f;
    return CUDA_SUCCESS;
}

/* ---- modules, launches, streams ------------------------------------------- */

static int g_function_token;


/* Modules: each load gets its own handle; FAKECUDA_MODULE_BYTES of device
 * memory per module (default 0), as an eagerly loaded module takes. */
#define MAX_MODULES 256
static struct fake_module {
    int live, dev; /* dev: physical */
    uint64_t bytes;
} g_modules[MAX_MODULES];

static CUresult module_new(CUmodule *m) {
    const char *s = getenv("FAKECUDA_MODULE_BYTES");
    uint64_t n = s ? parse_size(s) : 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_MODULES; i++)
        if (!g_modules[i].live) {
            if (g_used[t_cur->phys] + n > g_cap[t_cur->phys]) {
                pthread_mutex_unlock(&g_mu);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            g_used[t_cur->phys] += n;
            g_modules[i] = (struct fake_module){1, t_cur->phys, n};
            pthread_mutex_unlock(&g_mu);
            *m = &g_modules[i];
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static int module_valid(void *m) {
    struct fake_module *x = m;
    return x >= g_modules && x < g_modules + MAX_MODULES && x->live;
}

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    COUNT(cuModuleLoadData);
    NEED_CTX();
    if (!m || !image)
        return CUDA_ERROR_INVALID_VALUE;
    return module_new(m);
}

EXPORT CUresult cuModuleLoad(CUmodule *m, const char *fname) {
    COUNT(cuModuleLoad);
    NEED_CTX();
    if (!m || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    return module_new(m);
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    COUNT(cuModuleGetFunction);
    NEED_CTX();
    if (!f || !m || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!module_valid(m))
        return CUDA_ERROR_INVALID_HANDLE;
    *f = &g_function_token;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
    COUNT(cuModuleUnload);
    NEED_CTX();
    if (!module_valid(m))
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_module *x = m;
    pthread_mutex_lock(&g_mu);
    g_used[x->dev] -= x->bytes;
    x->live = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static int g_loaded[MAX_DEV]; /* the process launched a kernel on the device: its module is loaded there (the
                                 fake has one function) */

static CUresult launch(CUfunction f, void **params, CUstream s) {
    if (f != &g_function_token)
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_stream *x = fake_stream_of(s);
    if (!x)
        return CUDA_ERROR_INVALID_HANDLE; /* a destroyed stream */
    /* CUDA loads a module at its kernel's first launch (lazy loading, the default), and waits for the stream
     * then: behind a closed gate, that never ends */
    if (t_cur && !__atomic_exchange_n(&g_loaded[t_cur->phys], 1, __ATOMIC_ACQ_REL))
        gate_wait(x->gate, x->gate_value, "a kernel's first launch (its module loaded lazily)");
    if (g_launch_waits < 0) {
        const char *v = getenv("FAKECUDA_LAUNCH_WAITS");
        const char *n = getenv("FAKECUDA_LAUNCH_STALLS");
        if (n && *n)
            g_launch_stalls = strtoull(n, NULL, 10);
        g_launch_waits = v && *v == '1';
    }
    if (g_launch_waits && g_launch_stalls && __atomic_load_n(&g_gate_waits, __ATOMIC_RELAXED) >= g_launch_stalls)
        g_launch_waits = 0;
    if (g_launch_waits || x->check_open)
        gate_wait(x->gate, x->gate_value, "a launch that waits for its stream");
    x->check_open = 0;
    run_kernel(kernel_ns(params), s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    COUNT(cuLaunchKernel);
    NEED_CTX();
    return launch(f, params, s);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                    void **extra) {
    COUNT(cuLaunchKernel_ptsz);
    NEED_CTX();
    return launch(f, params, s);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    COUNT(cuLaunchCooperativeKernel);
    NEED_CTX();
    return launch(f, params, s);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    COUNT(cuLaunchCooperativeKernel_ptsz);
    NEED_CTX();
    return launch(f, params, s);
}

typedef struct {
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shm;
    CUstream s;
    void **params;
} fake_launch_params; /* CUDA_LAUNCH_PARAMS */

EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(fake_launch_params *list, unsigned n, unsigned flags) {
    COUNT(cuLaunchCooperativeKernelMultiDevice);
    NEED_CTX();
    if (!list || !n)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUresult rc = launch(list[i].f, list[i].params, list[i].s);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}

typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shm;
    CUstream s;
    void *attrs;
    unsigned nattrs;
} fake_launch_config;

EXPORT CUresult cuLaunchKernelEx(const fake_launch_config *c, CUfunction f, void **params, void **extra) {
    COUNT(cuLaunchKernelEx);
    NEED_CTX();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, params, c->s);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const fake_launch_config *c, CUfunction f, void **params, void **extra) {
    COUNT(cuLaunchKernelEx_ptsz);
    NEED_CTX();
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, params, c->s);
}

/* ---- events and graphs on the simulated clock ----------------------------- */

EXPORT CUresult cuEventCreate(struct fake_event **e, unsigned flags) {
    COUNT(cuEventCreate);
    FAULT(cuEventCreate);
    NEED_CTX();
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    (*e)->timing = !(flags & 2);
    (*e)->phys = t_cur->phys;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(struct fake_event *e, CUstream s) {
    COUNT(cuEventRecord);
    FAULT(cuEventRecord);
    CAPTURE_SAFE(capturing(s));
    NEED_CTX();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    CTX_ON(e->phys); /* the event, the stream and the current context: one context */
    CTX_ON(stream_phys(s));
    struct fake_stream *x = fake_stream_of(s);
    if (!x)
        return CUDA_ERROR_INVALID_HANDLE;
    if (x->fail_record) {
        x->fail_record = 0;
        x->check_open = 1;
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t now = sim_now(), last = __atomic_load_n(&x->last_end, __ATOMIC_ACQUIRE);
    e->t = last > now ? last : now;
    e->rec = now;
    e->recorded = 1;
    if (x->gate && !gate_shut(x->gate, x->gate_value))
        x->gate = NULL;
    e->gate = x->gate;
    e->gate_value = x->gate_value;
    e->idle = last <= now;
    if (e->timing)
        __atomic_store_n(&g_start_event, e, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(struct fake_event *e) {
    COUNT(cuEventQuery);
    FAULT(cuEventQuery);
    CAPTURE_SAFE(__atomic_load_n(&g_ncapturing, __ATOMIC_ACQUIRE));
    NEED_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded && gate_shut(e->gate, e->gate_value))
        return CUDA_ERROR_NOT_READY;
    return !e->recorded || sim_now() >= e->t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(struct fake_event *e) {
    COUNT(cuEventSynchronize);
    CAPTURE_SAFE(__atomic_load_n(&g_ncapturing, __ATOMIC_ACQUIRE));
    NEED_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded) {
        gate_wait(e->gate, e->gate_value, "cuEventSynchronize");
        sim_sleep_until(e->t);
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, struct fake_event *a, struct fake_event *b) {
    COUNT(cuEventElapsedTime);
    NEED_INIT();
    if (!ms || !a || !b || !a->timing || !b->timing)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now();
    if (!a->recorded || !b->recorded || now < a->t || now < b->t || gate_shut(a->gate, a->gate_value) ||
        gate_shut(b->gate, b->gate_value))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(b->t - a->t)) * g_event_scale / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(struct fake_event *e) {
    COUNT(cuEventDestroy_v2);
    NEED_INIT();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_event *x = e;
    __atomic_compare_exchange_n(&g_start_event, &x, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    COUNT(cuStreamIsCapturing);
    FAULT(cuStreamIsCapturing);
    NEED_CTX();
    CTX_ON(stream_phys(s));
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = capturing(s); /* NONE, or ACTIVE for a stream fakecuda_capture() marked */
    return CUDA_SUCCESS;
}

/* A graph is the sum of its kernels' durations, replayed as one unit. */
struct fake_graph {
    uint64_t ns;
    unsigned kernels;
};

typedef struct {
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shm;
    void **params;
    void **extra;
} fake_kernel_node_params; /* the leading fields of CUDA_KERNEL_NODE_PARAMS(_v2) */

EXPORT CUresult cuGraphCreate(struct fake_graph **g, unsigned flags) {
    COUNT(cuGraphCreate);
    NEED_CTX();
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    *g = calloc(1, sizeof **g);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode(void **node, struct fake_graph *g, void *deps, size_t ndeps,
                                     const fake_kernel_node_params *p) {
    COUNT(cuGraphAddKernelNode);
    NEED_CTX();
    if (!node || !g || !p || p->f != &g_function_token)
        return CUDA_ERROR_INVALID_VALUE;
    g->ns += kernel_ns(p->params);
    g->kernels++;
    *node = g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(struct fake_graph **exec, struct fake_graph *g,
                                            unsigned long long flags) {
    COUNT(cuGraphInstantiateWithFlags);
    NEED_CTX();
    if (!exec || !g)
        return CUDA_ERROR_INVALID_VALUE;
    *exec = malloc(sizeof **exec);
    **exec = *g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(struct fake_graph *exec, CUstream s) {
    COUNT(cuGraphLaunch);
    NEED_CTX();
    if (!exec)
        return CUDA_ERROR_INVALID_HANDLE;
    run_kernel(exec->ns, s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch_ptsz(struct fake_graph *exec, CUstream s) {
    COUNT(cuGraphLaunch_ptsz);
    NEED_CTX();
    if (!exec)
        return CUDA_ERROR_INVALID_HANDLE;
    run_kernel(exec->ns, s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecDestroy(struct fake_graph *exec) {
    COUNT(cuGraphExecDestroy);
    free(exec);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(struct fake_graph *g) {
    COUNT(cuGraphDestroy);
    free(g);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    COUNT(cuStreamCreate);
    NEED_CTX();
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *x = calloc(1, sizeof *x);
    unsigned i = __atomic_fetch_add(&g_nstreams, 1, __ATOMIC_ACQ_REL);
    if (!x || i >= MAX_STREAMS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->magic = STREAM_MAGIC;
    x->phys = t_cur->phys;
    __atomic_store_n(&g_streams[i], x, __ATOMIC_RELEASE);
    *s = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    COUNT(cuStreamDestroy_v2);
    NEED_CTX();
    struct fake_stream *x = fake_stream_of(s);
    if (!x || x == &g_default_stream)
        return CUDA_ERROR_INVALID_HANDLE;
    x->dead = 1; /* kept: a later use is counted, not a crash */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    COUNT(cuStreamSynchronize);
    NEED_CTX();
    struct fake_stream *x = fake_stream_of(s);
    if (!x)
        return CUDA_ERROR_INVALID_HANDLE;
    gate_wait(x->gate, x->gate_value, "cuStreamSynchronize");
    sim_sleep_until(__atomic_load_n(&x->last_end, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

/* Stream memory operations: only the wait the timing gate uses (GEQ on a 32-bit word). The word must be
 * mapped pinned host memory (cuMemHostAlloc with DEVICEMAP; the fake's device address is the host's). */
EXPORT CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, uint32_t value, unsigned flags) {
    COUNT(cuStreamWaitValue32_v2);
    FAULT(cuStreamWaitValue32_v2);
    CAPTURE_SAFE(capturing(s));
    NEED_CTX();
    if (!addr || (addr & 3) || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *x = fake_stream_of(s);
    if (!x)
        return CUDA_ERROR_INVALID_HANDLE;
    x->gate = (const volatile uint32_t *)(uintptr_t)addr;
    x->gate_value = value;
    static int failed; /* FAKECUDA_FAIL_RECORD_AFTER_WAIT=1: the first event record after a wait fails, once */
    const char *f = getenv("FAKECUDA_FAIL_RECORD_AFTER_WAIT");
    if (f && *f == '1' && !__atomic_exchange_n(&failed, 1, __ATOMIC_ACQ_REL))
        x->fail_record = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags) {
    COUNT(cuMemHostRegister_v2);
    FAULT(cuMemHostRegister_v2);
    CAPTURE_UNSAFE(); /* as cudaHostRegister, refused by a real driver while a thread captures in global mode */
    NEED_CTX();
    if (!p || !bytes || ((uintptr_t)p & 4095))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    COUNT(cuMemHostGetDevicePointer_v2);
    NEED_CTX();
    if (!d || !p || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    COUNT(cuGetErrorString);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = e == 0 ? "no error" : e == 2 ? "out of memory" : "fake error";
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    COUNT(cuGetErrorName);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = e == 0 ? "CUDA_SUCCESS" : e == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

/* ---- pitch, managed ------------------------------------------------------------ */

#define PITCH_ALIGN 512

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned elem) {
    COUNT(cuMemAllocPitch_v2);
    NEED_CTX();
    if (!p || !pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    CUresult rc = alloc_on(t_cur->phys, p, (uint64_t)pt * height);
    if (!rc)
        *pitch = pt;
    return rc;
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned *pitch, unsigned w, unsigned h, unsigned elem) {
    COUNT(cuMemAllocPitch);
    NEED_CTX();
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
    COUNT(cuMemAllocManaged);
    NEED_CTX();
    return alloc_on(t_cur->phys, p, size);
}

/* ---- stream-ordered allocation and pools --------------------------------------- */
/* A pool grows in 2 MiB steps when it has too little slack, keeps freed memory
 * reserved (release threshold: never), and gives it back on trim or destroy. */

#define MAX_POOLS 64
#define POOL_STEP (2u << 20)
struct fake_pool {
    int live, dev; /* dev: physical */
    uint64_t reserved, used;
};
static struct fake_pool g_pools[MAX_POOLS];

static void *pool_handle(int i) { return &g_pools[i]; }
static int pool_index(void *h) {
    struct fake_pool *p = h;
    return (p >= g_pools && p < g_pools + MAX_POOLS && p->live) ? (int)(p - g_pools) : -1;
}

static int default_pool(int dev) {
    /* pools 0..MAX_DEV-1 are the devices' default pools, by physical index */
    struct fake_pool *p = &g_pools[dev];
    if (!p->live) {
        p->live = 1;
        p->dev = dev;
    }
    return dev;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) {
    COUNT(cuDeviceGetDefaultMemPool);
    NEED_INIT();
    if (!pool || phys_of(d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = pool_handle(default_pool(phys_of(d)));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(void **pool, CUdevice d) {
    COUNT(cuDeviceGetMemPool);
    NEED_INIT();
    if (!pool || phys_of(d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = pool_handle(default_pool(phys_of(d)));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(void **pool, const void *props) {
    COUNT(cuMemPoolCreate);
    NEED_INIT();
    if (!pool || !props)
        return CUDA_ERROR_INVALID_VALUE;
    /* CUmemPoolProps: allocType, handleTypes, location {type, id: a CUdevice} */
    int dev = phys_of(((const int *)props)[3]);
    if (dev < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    for (int i = MAX_DEV; i < MAX_POOLS; i++)
        if (!g_pools[i].live) {
            g_pools[i] = (struct fake_pool){1, dev, 0, 0};
            pthread_mutex_unlock(&g_mu);
            *pool = pool_handle(i);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
    COUNT(cuMemPoolGetAttribute);
    int i = pool_index(pool);
    if (i < 0 || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uint64_t v = attr == 5 ? g_pools[i].reserved : attr == 7 ? g_pools[i].used : 0; /* RESERVED/USED_MEM_CURRENT */
    pthread_mutex_unlock(&g_mu);
    *(uint64_t *)value = v;
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(int i, CUdeviceptr *p, size_t size) {
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_pool *pl = &g_pools[i];
    uint64_t rounded = (size + 511) & ~511ULL;
    pthread_mutex_lock(&g_mu);
    uint64_t slack = pl->reserved - pl->used;
    if (slack < rounded) {
        uint64_t grow = (rounded - slack + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
        if (g_used[pl->dev] + grow > g_cap[pl->dev]) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_used[pl->dev] += grow;
        pl->reserved += grow;
    }
    pl->used += rounded;
    CUdeviceptr a = g_next[pl->dev];
    g_next[pl->dev] += rounded;
    tab_put((struct alloc){a, rounded, pl->dev, i});
    pthread_mutex_unlock(&g_mu);
    *p = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
    COUNT(cuMemAllocAsync);
    FAULT(cuMemAllocAsync);
    NEED_CTX();
    CTX_ON(stream_phys(s));
    return pool_alloc(default_pool(t_cur->phys), p, size);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) {
    COUNT(cuMemAllocAsync_ptsz);
    NEED_CTX();
    return pool_alloc(default_pool(t_cur->phys), p, size);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, CUstream s) {
    COUNT(cuMemAllocFromPoolAsync);
    NEED_CTX();
    int i = pool_index(pool);
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : pool_alloc(i, p, size);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, CUstream s) {
    COUNT(cuMemAllocFromPoolAsync_ptsz);
    NEED_CTX();
    int i = pool_index(pool);
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : pool_alloc(i, p, size);
}

/* cuMemFree and cuMemFreeAsync both take pool allocations back to their pool */
static CUresult free_any(CUdeviceptr p) {
    struct alloc a;
    pthread_mutex_lock(&g_mu);
    int ok = tab_take(p, &a);
    if (ok) {
        if (a.pool >= 0)
            g_pools[a.pool].used -= a.size;
        else
            g_used[a.dev] -= a.size;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    COUNT(cuMemFreeAsync);
    NEED_CTX();
    CTX_ON(stream_phys(s));
    return free_any(p);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    COUNT(cuMemFreeAsync_ptsz);
    NEED_CTX();
    return free_any(p);
}

EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
    COUNT(cuMemPoolTrimTo);
    FAULT(cuMemPoolTrimTo);
    NEED_CTX();
    int i = pool_index(pool);
    if (i < 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct fake_pool *pl = &g_pools[i];
    uint64_t target = keep > pl->used ? keep : pl->used;
    target = (target + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
    if (target < pl->reserved) {
        g_used[pl->dev] -= pl->reserved - target;
        pl->reserved = target;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolDestroy(void *pool) {
    COUNT(cuMemPoolDestroy);
    int i = pool_index(pool);
    if (i < MAX_DEV) /* unknown, or a default pool */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    g_used[g_pools[i].dev] -= g_pools[i].reserved;
    g_pools[i].live = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* ---- virtual memory management -------------------------------------------------- */

#define VMM_GRANULARITY (2u << 20)
static uint64_t g_next_handle = 0x5000;

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
    COUNT(cuMemGetAllocationGranularity);
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(unsigned long long *h, size_t size, const void *prop, unsigned long long flags) {
    COUNT(cuMemCreate);
    FAULT(cuMemCreate);
    CAPTURE_UNSAFE();
    NEED_CTX();
    if (!h || !prop || !size || size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    const int *pr = prop; /* CUmemAllocationProp: type, handleTypes, location {type, id} */
    if (pr[2] != 1) {     /* host-located: not device memory */
        pthread_mutex_lock(&g_mu);
        *h = g_next_handle += 16;
        tab_put((struct alloc){*h, 0, 0, -1});
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
    int dev = phys_of(pr[3]); /* location id: a CUdevice */
    if (dev < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    CTX_ON(dev);
    pthread_mutex_lock(&g_mu);
    if (g_used[dev] + size > g_cap[dev]) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_used[dev] += size;
    *h = g_next_handle += 16;
    tab_put((struct alloc){*h, size, dev, -1});
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* As on a real driver, a handle released while mapped keeps its memory until its last page is unmapped. */
EXPORT CUresult cuMemRelease(unsigned long long h) {
    COUNT(cuMemRelease);
    FAULT(cuMemRelease);
    CAPTURE_UNSAFE();
    NEED_CTX();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = tab_find(h);
    int deferred = a && a->pool < 0 && a->maps > 0 && !a->released;
    if (deferred)
        a->released = 1;
    int twice = a && a->released && !deferred;
    pthread_mutex_unlock(&g_mu);
    if (twice)
        return CUDA_ERROR_INVALID_VALUE;
    return deferred ? CUDA_SUCCESS : free_any(h);
}

/* For tests: bytes of VMM memory still held by released handles that are mapped somewhere. */
EXPORT uint64_t fakecuda_released_mapped_bytes(void) {
    uint64_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_tab_cap; i++)
        if (g_tab[i].ptr && g_tab[i].released)
            n += g_tab[i].size;
    pthread_mutex_unlock(&g_mu);
    return n;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f) {
    COUNT(cuMemAddressReserve);
    FAULT(cuMemAddressReserve);
    CAPTURE_UNSAFE();
    NEED_CTX();
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    static uint64_t next_va = 0x600000000000ULL; /* apart from every device's allocation range */
    pthread_mutex_lock(&g_mu);
    *p = next_va;
    next_va += (size + VMM_GRANULARITY - 1) / VMM_GRANULARITY * VMM_GRANULARITY;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    COUNT(cuMemAddressFree);
    FAULT(cuMemAddressFree);
    NEED_CTX();
    return CUDA_SUCCESS;
}

/* Mappings, page by page (VMM_GRANULARITY), so a pool that maps over a live mapping or unmaps
 * what is not mapped fails here as it would on a real driver. */
#define MAP_SLOTS (1u << 18)
static struct { uint64_t va, h; } g_map[MAP_SLOTS]; /* va 0: empty; h 0: a deleted entry */
static uint64_t g_mapped;

static uint64_t *map_find(uint64_t va, int insert) {
    uint64_t i = (va / VMM_GRANULARITY * 0x9E3779B97F4A7C15ULL) >> 46;
    for (unsigned n = 0; n < MAP_SLOTS; n++, i = (i + 1) & (MAP_SLOTS - 1)) {
        if (g_map[i].va == va)
            return &g_map[i].h;
        if (g_map[i].va == 0) {
            if (!insert)
                return NULL;
            g_map[i].va = va;
            return &g_map[i].h;
        }
    }
    return NULL;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, unsigned long long h, unsigned long long f) {
    COUNT(cuMemMap);
    FAULT(cuMemMap);
    CAPTURE_UNSAFE();
    NEED_CTX();
    if (!p || !size || !h || p % VMM_GRANULARITY || size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct alloc *a = tab_find(h);
    if (!a || a->pool >= 0 || a->released) { /* not a live VMM handle */
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (a->size && t_cur->phys != a->dev) { /* device memory of another device than the context's */
        pthread_mutex_unlock(&g_mu);
        return ctx_refused();
    }
    for (uint64_t v = p; v < p + size; v += VMM_GRANULARITY) {
        uint64_t *e = map_find(v, 0);
        if (e && *e) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_INVALID_VALUE; /* already mapped */
        }
    }
    for (uint64_t v = p; v < p + size; v += VMM_GRANULARITY) {
        *map_find(v, 1) = h;
        g_mapped++;
        a->maps++;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    COUNT(cuMemUnmap);
    FAULT(cuMemUnmap);
    CAPTURE_UNSAFE();
    NEED_CTX();
    if (!p || !size || p % VMM_GRANULARITY || size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    for (uint64_t v = p; v < p + size; v += VMM_GRANULARITY) {
        uint64_t *e = map_find(v, 0);
        if (!e || !*e) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_INVALID_VALUE; /* not mapped */
        }
    }
    for (uint64_t v = p; v < p + size; v += VMM_GRANULARITY) {
        uint64_t *e = map_find(v, 0);
        struct alloc *a = tab_find(*e);
        *e = 0;
        g_mapped--;
        if (a && --a->maps == 0 && a->released) { /* its last mapping: the memory goes back now */
            struct alloc gone;
            if (tab_take(a->ptr, &gone))
                g_used[gone.dev] -= gone.size;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* For tests: pages mapped now, and the handle mapped at va (0: none). */
EXPORT uint64_t fakecuda_mapped_pages(void) { return g_mapped; }
EXPORT uint64_t fakecuda_mapping(uint64_t va) {
    uint64_t *e = map_find(va / VMM_GRANULARITY * VMM_GRANULARITY, 0);
    return e ? *e : 0;
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, struct fake_event *e, unsigned flags) {
    COUNT(cuStreamWaitEvent);
    FAULT(cuStreamWaitEvent);
    CAPTURE_SAFE(capturing(s));
    NEED_CTX();
    CTX_ON(stream_phys(s)); /* the event may be another context's, as on a real driver */
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Access can only be set on mapped pages, as on a real driver. */
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count) {
    COUNT(cuMemSetAccess);
    FAULT(cuMemSetAccess);
    CAPTURE_UNSAFE();
    NEED_CTX();
    if (!p || !size || !desc)
        return CUDA_ERROR_INVALID_VALUE;
    const int *ad = desc; /* CUmemAccessDesc: location {type, id}, flags */
    if (ad[0] == 1)       /* a device */
        CTX_ON(phys_of(ad[1]));
    if (p % VMM_GRANULARITY || size % VMM_GRANULARITY)
        return CUDA_SUCCESS; /* not ours to check: a range of other sizes is mapped by another caller */
    pthread_mutex_lock(&g_mu);
    int ok = 1;
    for (uint64_t v = p; v < p + size && ok; v += VMM_GRANULARITY) {
        uint64_t *e = map_find(v, 0);
        ok = e && *e;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- arrays ------------------------------------------------------------------------ */

static uint64_t fmt_bytes(unsigned f) {
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 0;
    }
}

static CUresult array_new(void **h, uint64_t bytes) {
    if (!h || !bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr a;
    CUresult rc = alloc_on(t_cur->phys, &a, bytes);
    if (!rc)
        *h = (void *)(uintptr_t)a;
    return rc;
}

typedef struct {
    size_t w, h;
    unsigned fmt, ch;
} fake_array_desc;
typedef struct {
    size_t w, h, d;
    unsigned fmt, ch, flags;
} fake_array3d_desc;

static uint64_t desc3d_bytes(const fake_array3d_desc *d, unsigned level) {
    uint64_t w = d->w >> level, h = d->h ? d->h >> level : 1, z = d->d ? d->d >> level : 1;
    return (w ? w : 1) * (h ? h : 1) * (z ? z : 1) * fmt_bytes(d->fmt) * d->ch;
}

EXPORT CUresult cuArrayCreate_v2(void **h, const fake_array_desc *d) {
    COUNT(cuArrayCreate_v2);
    NEED_CTX();
    if (!d || !fmt_bytes(d->fmt) || !d->ch)
        return CUDA_ERROR_INVALID_VALUE;
    return array_new(h, (uint64_t)d->w * (d->h ? d->h : 1) * fmt_bytes(d->fmt) * d->ch);
}

EXPORT CUresult cuArrayCreate(void **h, const void *d) {
    COUNT(cuArrayCreate);
    NEED_CTX();
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuArray3DCreate_v2(void **h, const fake_array3d_desc *d) {
    COUNT(cuArray3DCreate_v2);
    NEED_CTX();
    if (!d || !fmt_bytes(d->fmt) || !d->ch)
        return CUDA_ERROR_INVALID_VALUE;
    return array_new(h, desc3d_bytes(d, 0));
}

EXPORT CUresult cuMipmappedArrayCreate(void **h, const fake_array3d_desc *d, unsigned levels) {
    COUNT(cuMipmappedArrayCreate);
    NEED_CTX();
    if (!d || !fmt_bytes(d->fmt) || !d->ch || !levels)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t n = 0;
    for (unsigned l = 0; l < levels; l++)
        n += desc3d_bytes(d, l);
    return array_new(h, n);
}

EXPORT CUresult cuArrayDestroy(void *h) {
    COUNT(cuArrayDestroy);
    return free_any((CUdeviceptr)(uintptr_t)h);
}

EXPORT CUresult cuMipmappedArrayDestroy(void *h) {
    COUNT(cuMipmappedArrayDestroy);
    return free_any((CUdeviceptr)(uintptr_t)h);
}

/* ---- cuGetProcAddress ------------------------------------------------------ */

struct fake_gpa_row {
    const char *name;
    int fclass; /* 0: default/legacy flags, 2: per-thread default stream */
    int since;
    int status; /* CUdriverProcAddressQueryResult */
    const char *abi;
};
#include "procaddr_table.h"

EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, int *);
EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);

#define X(name) {#name, (void *)name},
static const struct {
    const char *name;
    void *fn;
} fk_impls[] = {FAKE_FUNCS(X)};
#undef X

static void *impl_of(const char *name) {
    for (size_t i = 0; i < sizeof fk_impls / sizeof *fk_impls; i++)
        if (!strcmp(fk_impls[i].name, name))
            return fk_impls[i].fn;
    return NULL;
}

/* 0: found (*pfn set); else a CUdriverProcAddressQueryResult */
static int lookup(const char *symbol, void **pfn, int ver, cuuint64_t flags) {
    int fclass = (flags & 2) ? 2 : 0;
    const struct fake_gpa_row *best = NULL;
    int listed = 0;
    for (size_t i = 0; i < sizeof fake_gpa_rows / sizeof *fake_gpa_rows; i++) {
        const struct fake_gpa_row *r = &fake_gpa_rows[i];
        if (strcmp(r->name, symbol) || r->fclass != fclass)
            continue;
        listed = 1;
        if (r->since <= ver && (!best || r->since >= best->since))
            best = r;
    }
    if (listed) {
        if (!best)
            return 2;
        if (best->status)
            return best->status;
        *pfn = impl_of(best->abi);
        return *pfn ? 0 : 1; /* the driver has it, this fake does not */
    }
    /* not recorded: an unversioned function of that exact name */
    *pfn = impl_of(symbol);
    return *pfn ? 0 : 1;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags, int *status) {
    COUNT(cuGetProcAddress_v2);
    if (!symbol || !pfn || ver > FAKE_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int st = lookup(symbol, pfn, ver, flags);
    if (status)
        *status = st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags) {
    COUNT(cuGetProcAddress);
    if (!symbol || !pfn || ver > FAKE_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    return lookup(symbol, pfn, ver, flags) ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
}
