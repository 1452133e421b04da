/* A fake libnvidia-ml.so.1 for CPU-only tests; a test double only.
 *
 * Devices follow FAKECUDA_DEVICES like the fake libcuda: NVML always sees
 * every physical device and ignores CUDA_VISIBLE_DEVICES, as the real one
 * does; a device's index, UUID, PCI bus id and serial are those of
 * fake_devices.h. Device memory "used" is FAKENVML_USED (a size, default 0)
 * on every device plus what the fake libcuda of this process holds there,
 * so tests can check that the shim's virtual view never underflows.
 * Compute processes come from the simulated GPU's registry (fake_sim.h),
 * each reported with usedGpuMemory = FAKE_PROC_USED, a value a test can
 * tell from anything the shim computes.
 * FAKENVML_LOST_FILE names a file of comma-separated device indices, read
 * at every nvmlInit: those devices have "fallen off the bus" (their handle
 * lookups and memory queries answer NVML_ERROR_GPU_IS_LOST), so a test can
 * make a GPU fail under a running process.
 * MIG (FAKENVML_MIG, fake_devices.h): a GPU with instances is in MIG mode
 * (nvmlDeviceGetMigMode 1/1, nvmlDeviceGetMaxMigDeviceCount 7); its
 * instances are MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex,
 * nvmlDeviceGetHandleByUUID("MIG-...")) with their own UUID, name
 * ("Fake GPU g MIG <profile>"), memory (their size; used: the fake libcuda's
 * use of that instance), processes, GPU and compute instance ids, and their
 * GPU (nvmlDeviceGetDeviceHandleFromMigDeviceHandle). As NVML documents,
 * utilization is not reported in MIG mode (NOT_SUPPORTED, for the GPU and
 * for its instances), and the GPU's own memory info is the aggregate. Not
 * documented, so answered as NOT_SUPPORTED: nvmlDeviceGetIndex of a MIG
 * handle (pyvgpu must not rely on it).
 * Utilization: nvmlDeviceGetUtilizationRates is the busy share of the last
 * 300 ms of the simulated GPU (FAKENVML_UTIL_WINDOW_MS sets a shorter window,
 * as short as the real one's is against a share's bursts);
 * nvmlDeviceGetSamples keeps a sample every 200 ms, as driver 580 does
 * (FAKENVML_NO_SAMPLES=1: a driver without them).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_devices.h"
#include "fake_sim.h"

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct fake_nvml_dev {
    int index; /* the GPU's; for a MIG handle its GPU's */
    int slot;  /* per-device state in the fakes: index, or nphys + k for MIG instance k */
    int mig;   /* 1 + k for MIG instance k, 0 for a GPU */
} *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
};

static int g_init, g_ndev;
static uint64_t g_cap[MAX_DEV], g_used;
static struct fake_nvml_dev g_dev[MAX_DEV];
static struct fake_mig g_mig[MAX_MIG];
static struct fake_nvml_dev g_migdev[MAX_MIG];
static int g_nmig;

__attribute__((constructor)) static void config(void) {
    g_ndev = fake_device_caps(g_cap);
    for (int d = 0; d < g_ndev; d++)
        g_dev[d] = (struct fake_nvml_dev){d, d, 0};
    g_nmig = fake_migs(g_mig, g_ndev);
    for (int k = 0; k < g_nmig; k++)
        g_migdev[k] = (struct fake_nvml_dev){g_mig[k].gpu, g_ndev + k, k + 1};
    const char *u = getenv("FAKENVML_USED");
    g_used = u ? parse_size(u) : 0;
}

/* FAKENVML_UTIL_WINDOW_MS: nvmlDeviceGetUtilizationRates's window (default SIM_WINDOW_NS): the real one's is
 * short against a share's bursts (docs/compute.md), so one reading swings between idle and busy. */
static uint64_t util_window_ns(void) {
    const char *w = getenv("FAKENVML_UTIL_WINDOW_MS");
    return w && *w ? strtoull(w, NULL, 10) * 1000000ULL : 0;
}

static int g_lost[MAX_DEV];

static void read_lost(void) {
    const char *path = getenv("FAKENVML_LOST_FILE");
    char buf[256] = {0};
    memset(g_lost, 0, sizeof g_lost);
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (char *tok = strtok(buf, ", \n"); tok; tok = strtok(NULL, ", \n")) {
        int i = atoi(tok);
        if (i >= 0 && i < MAX_DEV)
            g_lost[i] = 1;
    }
}

/* Reference counted, as NVML documents: each nvmlInit needs its nvmlShutdown (a tool that inits and shuts
 * down in one thread leaves another thread's session open). */
EXPORT nvmlReturn_t nvmlInit_v2(void) {
    __atomic_add_fetch(&g_init, 1, __ATOMIC_ACQ_REL);
    read_lost();
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) {
    int n = __atomic_load_n(&g_init, __ATOMIC_ACQUIRE);
    while (n > 0 && !__atomic_compare_exchange_n(&g_init, &n, n - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
    return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = g_ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= (unsigned)g_ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_lost[i])
        return NVML_ERROR_GPU_IS_LOST;
    *d = &g_dev[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

static int is_gpu(nvmlDevice_t d) { return d >= &g_dev[0] && d < &g_dev[g_ndev]; }
static int is_mig(nvmlDevice_t d) { return d >= &g_migdev[0] && d < &g_migdev[g_nmig]; }
static int valid(nvmlDevice_t d) { return is_gpu(d) || is_mig(d); }
static int mig_mode(int gpu) {
    for (int k = 0; k < g_nmig; k++)
        if (g_mig[k].gpu == gpu)
            return 1;
    return 0;
}

/* Copy text to out[len]; NVML_ERROR_INSUFFICIENT_SIZE when it does not fit with its NUL. */
static nvmlReturn_t put_text(const char *text, char *out, unsigned int len) {
    if (strlen(text) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static void serial_text(int i, char out[16]) { snprintf(out, 16, "FAKE%04d", i); }

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    char u[FAKE_UUID_LEN + 1];
    if (d->mig)
        fake_mig_uuid_text(d->mig - 1, &g_mig[d->mig - 1], u);
    else
        fake_uuid_text(d->index, u);
    return put_text(u, uuid, len);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int len) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!serial || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    char t[16];
    serial_text(d->index, t);
    return put_text(t, serial, len);
}

/* Exact matches only, as NVML's lookups are. */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_ndev; i++) {
        char u[FAKE_UUID_LEN + 1];
        fake_uuid_text(i, u);
        if (!strcmp(u, uuid)) {
            if (g_lost[i])
                return NVML_ERROR_GPU_IS_LOST;
            *d = &g_dev[i];
            return NVML_SUCCESS;
        }
    }
    for (int k = 0; k < g_nmig; k++) {
        char u[FAKE_UUID_LEN + 1];
        fake_mig_uuid_text(k, &g_mig[k], u);
        if (!strcmp(u, uuid)) {
            if (g_lost[g_mig[k].gpu])
                return NVML_ERROR_GPU_IS_LOST;
            *d = &g_migdev[k];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *d) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!serial || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_ndev; i++) {
        char t[16];
        serial_text(i, t);
        if (!strcmp(t, serial)) {
            *d = &g_dev[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Device-wide used: FAKENVML_USED plus what the fake libcuda in this process holds. */
static uint64_t used_of(int d) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD); /* loaded locally, e.g. by ctypes */
    uint64_t (*cu)(int) = h ? (uint64_t(*)(int))dlsym(h, "fakecuda_device_used") : NULL;
    return g_used + (cu ? cu(d) : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    unsigned dom, b;
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!bus || !d || sscanf(bus, "%x:%x", &dom, &b) != 2 || b < 1 || b > (unsigned)g_ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_dev[b - 1];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus, d);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!m || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_lost[d->index])
        return NVML_ERROR_GPU_IS_LOST;
    m->total = d->mig ? g_mig[d->mig - 1].size : g_cap[d->index];
    uint64_t u = used_of(d->slot);
    for (int k = 0; !d->mig && k < g_nmig; k++) /* MIG mode: the GPU's is the aggregate */
        u += g_mig[k].gpu == d->index ? used_of(g_ndev + k) - g_used : 0;
    m->used = u < m->total ? u : m->total;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!m || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->mig ? g_mig[d->mig - 1].size : g_cap[d->index];
    m->reserved = 0;
    uint64_t u = used_of(d->slot);
    for (int k = 0; !d->mig && k < g_nmig; k++)
        u += g_mig[k].gpu == d->index ? used_of(g_ndev + k) - g_used : 0;
    m->used = u < m->total ? u : m->total;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

/* The simulated GPU: the file named by FAKECUDA_SIM, else this process's fake libcuda's. */
static struct sim *sim(void) {
    static struct sim *s;
    if (s)
        return s;
    s = sim_map_file();
    if (!s) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        struct sim *(*get)(void) = h ? (struct sim * (*)(void)) dlsym(h, "fakecuda_sim") : NULL;
        s = get ? get() : NULL;
    }
    return s;
}

/* FAKENVML_NO_UTILIZATION=1: a GPU that cannot report utilization. */
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!u || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *no = getenv("FAKENVML_NO_UTILIZATION");
    if ((no && *no == '1') || d->mig || mig_mode(d->index))
        return NVML_ERROR_NOT_SUPPORTED; /* NVML documents no utilization in MIG mode */
    struct sim *s = sim();
    u->gpu = s ? sim_utilization(s, d->index, util_window_ns()) : 0;
    u->memory = 0;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned long long timeStamp; /* CLOCK_REALTIME, microseconds (as the real one: seen on driver 580) */
    unsigned long long value;     /* nvmlValue_t; utilization samples are NVML_VALUE_TYPE_UNSIGNED_INT */
} nvmlSample_t;
#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define SAMPLE_NS 200000000ULL /* the real driver's spacing of utilization samples (H100, driver 580) */
#define SAMPLE_HISTORY 10      /* samples kept (the simulated ring holds them: SIM_RING) */

/* nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES): a sample every SAMPLE_NS of CLOCK_MONOTONIC, each the
 * busy percent of the SAMPLE_NS before it, those newer than lastSeen (realtime us), oldest first; samples
 * NULL: *count gets how many there are. FAKENVML_NO_SAMPLES=1: NOT_SUPPORTED (drivers without them). */
EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long lastSeen, int *valType,
                                         unsigned int *count, nvmlSample_t *samples) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !count || !valType)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *no = getenv("FAKENVML_NO_SAMPLES"), *nu = getenv("FAKENVML_NO_UTILIZATION");
    if ((no && *no == '1') || (nu && *nu == '1') || type != NVML_GPU_UTILIZATION_SAMPLES || d->mig ||
        mig_mode(d->index))
        return NVML_ERROR_NOT_SUPPORTED;
    struct sim *s = sim();
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t now = sim_now(), rt_ns = (uint64_t)rt.tv_sec * 1000000000ULL + (uint64_t)rt.tv_nsec;
    uint64_t last = now / SAMPLE_NS * SAMPLE_NS; /* the newest sample's time */
    unsigned n = 0, cap = samples ? *count : 0;
    *valType = NVML_VALUE_TYPE_UNSIGNED_INT;
    uint64_t busy[SAMPLE_HISTORY] = {0}; /* busy[j]: the window [first + j samples, first + j + 1 samples) */
    uint64_t first = last >= SAMPLE_HISTORY * SAMPLE_NS ? last - SAMPLE_HISTORY * SAMPLE_NS : 0;
    if (samples && s && last >= SAMPLE_NS)
        sim_busy_windows(s, d->index, first, SAMPLE_NS, SAMPLE_HISTORY, busy);
    for (int k = SAMPLE_HISTORY - 1; k >= 0; k--) {
        if ((uint64_t)k * SAMPLE_NS + SAMPLE_NS > last)
            continue; /* before the clock's start: no sample */
        uint64_t t = last - (uint64_t)k * SAMPLE_NS;
        if ((rt_ns - (now - t)) / 1000 <= lastSeen)
            continue;
        if (samples) {
            if (n == cap)
                break;
            uint64_t b = busy[(t - SAMPLE_NS - first) / SAMPLE_NS];
            samples[n].timeStamp = (rt_ns - (now - t)) / 1000;
            samples[n].value = (b * 100 + SAMPLE_NS / 2) / SAMPLE_NS;
        }
        n++;
    }
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t; /* 16 bytes: nvmlDeviceGetComputeRunningProcesses */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* 24 bytes: _v2 and _v3 */

#define FAKE_PROC_USED 12345678ULL

/* The processes on d into infos (v1: 16-byte entries, else 24-byte ones), as NVML fills them. */
static nvmlReturn_t running_processes(nvmlDevice_t d, unsigned int *count, void *infos, int v1) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!count || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim *s = sim();
    int32_t pids[SIM_PROCS];
    unsigned n = s ? sim_processes(s, d->slot, pids, SIM_PROCS) : 0;
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        if (v1)
            ((nvmlProcessInfo_v1_t *)infos)[i] = (nvmlProcessInfo_v1_t){(unsigned)pids[i], FAKE_PROC_USED};
        else
            ((nvmlProcessInfo_t *)infos)[i] =
                (nvmlProcessInfo_t){(unsigned)pids[i], FAKE_PROC_USED, 0xFFFFFFFFu, 0xFFFFFFFFu};
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    return running_processes(d, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    return running_processes(d, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    return running_processes(d, count, infos, 1);
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t; /* 32 bytes */
typedef struct {
    unsigned int version, mode, numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_t;

/* The detail list (newer nvidia-smi reads it): compute processes (mode 0) as above; others none. */
EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *l) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!l || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim *s = sim();
    int32_t pids[SIM_PROCS];
    unsigned n = s && l->mode == 0 ? sim_processes(s, d->slot, pids, SIM_PROCS) : 0;
    if (!l->procArray || l->numProcArrayEntries < n) {
        l->numProcArrayEntries = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++)
        l->procArray[i] = (nvmlProcessDetail_v1_t){(unsigned)pids[i], FAKE_PROC_USED, 0xFFFFFFFFu, 0xFFFFFFFFu, 0};
    l->numProcArrayEntries = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!name || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig)
        snprintf(name, len, "Fake GPU %d MIG %s", d->index, g_mig[d->mig - 1].profile);
    else
        snprintf(name, len, "Fake GPU %d", d->index);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!index || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *index = d->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r ? "fake NVML error" : "Success"; }

/* ---- MIG ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!current || !pending || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned)mig_mode(d->index);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!count || !is_gpu(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = mig_mode(d->index) ? 7 : 0;
    return NVML_SUCCESS;
}

/* The index-th instance of the GPU (NOT_FOUND for an index without one, as for a slot not in use). */
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!mig || !is_gpu(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_mode(d->index) || index >= 7)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned seen = 0;
    for (int k = 0; k < g_nmig; k++)
        if (g_mig[k].gpu == d->index && seen++ == index) {
            *mig = &g_migdev[k];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!is_mig || !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = d->mig != 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *d) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!d || !is_mig(mig))
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_dev[mig->index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!id || !is_mig(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned)g_mig[d->mig - 1].gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    if (!g_init)
        return NVML_ERROR_UNINITIALIZED;
    if (!id || !is_mig(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned)g_mig[d->mig - 1].ci;
    return NVML_SUCCESS;
}
