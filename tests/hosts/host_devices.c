/* The machine as a program sees it, through CUDA and NVML, as one JSON
 * object on stdout: for checking device selection (CUDA_VISIBLE_DEVICES)
 * and that NVML agrees with CUDA. Linked against libcuda and libnvidia-ml;
 * runs on the fake driver and on a real one.
 *
 *   host_devices [ARG...]
 *
 * cuInit and nvmlInit_v2 come first; then the arguments, in order:
 *   alloc:DEV:BYTES  make CUDA device DEV's primary context current and
 *                    cuMemAlloc_v2 BYTES there (never freed); rc into "allocs"
 *   uuid:TEXT        nvmlDeviceGetHandleByUUID(TEXT); into "by_uuid"
 *   sleep:MS         sleep MS milliseconds
 * then the NVML devices are read, then the CUDA devices (which retains
 * every visible device's primary context, after NVML was read), and the
 * object is printed:
 *
 *   {"cuda_init": rc, "cuda_count": n,
 *    "cuda": [{"ordinal", "uuid", "bus", "total", "free", "mem_total"}, ...],   per CUDA ordinal
 *    "allocs": [rc, ...],
 *    "nvml_init": rc, "nvml_count": n, "nvml_count_v1": n,
 *    "nvml": [{"rc", "rc_v1", "index", "uuid", "total", "free", "used",
 *              "v2": {"total", "free", "used", "reserved"},
 *              "procs_v3": [[pid, used], ...], "procs_v2": [...], "procs_v1": [...], "procs_detail": [...],
 *              "util": gpu percent}, ...],                              per NVML index
 *    "bad_index_rc": rc, "by_uuid": {TEXT: {"rc": rc, "index": i or -1}}}
 *
 * A call that fails gives null for its value and adds "<key>_rc": rc (an
 * NVML entry whose handle lookup fails has only "rc" and "rc_v1", a CUDA
 * one whose cuDeviceGet fails only "rc"); the counts stay numbers, 0 when
 * their call fails, with "<key>_rc" added.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_decls.h"

typedef struct {
    unsigned char bytes[16];
} CUuuid;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t; /* also the _v3 entry */
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

CUresult cuInit(unsigned);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
CUresult cuDeviceGetPCIBusId(char *, int, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
int nvmlInit_v2(void);
int nvmlDeviceGetCount_v2(unsigned *);
int nvmlDeviceGetCount(unsigned *);
int nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
int nvmlDeviceGetHandleByIndex(unsigned, nvmlDevice_t *);
int nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
int nvmlDeviceGetIndex(nvmlDevice_t, unsigned *);
int nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
int nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);
int nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
int nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *);
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *);
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;
typedef struct {
    unsigned int version, mode, numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_v1_t;
#define NVML_PROCESS_DETAIL_LIST_V1 ((unsigned)(sizeof(nvmlProcessDetailList_v1_t) | (1 << 24)))
int nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t, nvmlProcessDetailList_v1_t *);

#define MAX_PROCS 64
#define MAX_ARGS 256

/* ---- JSON output ---- */

static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* ", "key": value", or ", "key": null, "key_rc": rc" when the call failed */
static void put_num(FILE *f, const char *key, int rc, unsigned long long v) {
    if (rc)
        fprintf(f, ", \"%s\": null, \"%s_rc\": %d", key, key, rc);
    else
        fprintf(f, ", \"%s\": %llu", key, v);
}

static void put_text(FILE *f, const char *key, int rc, const char *v) {
    if (rc) {
        fprintf(f, ", \"%s\": null, \"%s_rc\": %d", key, key, rc);
    } else {
        fprintf(f, ", \"%s\": ", key);
        put_str(f, v);
    }
}

/* a count: 0 when its call failed, with "key_rc" */
static void put_count(FILE *f, const char *key, int rc, unsigned long long v) {
    fprintf(f, ", \"%s\": %llu", key, rc ? 0 : v);
    if (rc)
        fprintf(f, ", \"%s_rc\": %d", key, rc);
}

/* ---- the arguments ---- */

static int allocs[MAX_ARGS], n_allocs;
static struct {
    const char *text;
    int rc;
    long long index;
} uuids[MAX_ARGS];
static int n_uuids;

static int do_alloc(int ordinal, unsigned long long bytes) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    int rc = cuDeviceGet(&dev, ordinal);
    if (!rc)
        rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!rc)
        rc = cuCtxSetCurrent(ctx);
    if (!rc)
        rc = cuMemAlloc_v2(&p, (size_t)bytes); /* kept until exit */
    return rc;
}

static void do_args(int argc, char **argv) {
    for (int a = 1; a < argc && a <= MAX_ARGS; a++) {
        int dev;
        unsigned long long bytes, ms;
        if (sscanf(argv[a], "alloc:%d:%llu", &dev, &bytes) == 2) {
            allocs[n_allocs++] = do_alloc(dev, bytes);
        } else if (!strncmp(argv[a], "uuid:", 5)) {
            nvmlDevice_t h;
            unsigned index;
            int rc = nvmlDeviceGetHandleByUUID(argv[a] + 5, &h);
            int found = !rc && !nvmlDeviceGetIndex(h, &index);
            uuids[n_uuids].text = argv[a] + 5;
            uuids[n_uuids].rc = rc;
            uuids[n_uuids++].index = found ? (long long)index : -1;
        } else if (sscanf(argv[a], "sleep:%llu", &ms) == 1) {
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else {
            fprintf(stderr, "host_devices: unknown argument %s\n", argv[a]);
            exit(2);
        }
    }
}

/* ---- NVML ---- */

/* ", "key": [[pid, used], ...]" from one of the three process calls (v: 1, 2 or 3) */
static void put_procs(FILE *f, const char *key, nvmlDevice_t h, int v) {
    static nvmlProcessInfo_v1_t p1[MAX_PROCS];
    static nvmlProcessInfo_v2_t p2[MAX_PROCS];
    unsigned n = MAX_PROCS;
    int rc = v == 1   ? nvmlDeviceGetComputeRunningProcesses(h, &n, p1)
             : v == 2 ? nvmlDeviceGetComputeRunningProcesses_v2(h, &n, p2)
                      : nvmlDeviceGetComputeRunningProcesses_v3(h, &n, p2);
    if (rc) {
        fprintf(f, ", \"%s\": null, \"%s_rc\": %d", key, key, rc);
        return;
    }
    fprintf(f, ", \"%s\": [", key);
    for (unsigned i = 0; i < n && i < MAX_PROCS; i++) {
        unsigned pid = v == 1 ? p1[i].pid : p2[i].pid;
        unsigned long long used = v == 1 ? p1[i].usedGpuMemory : p2[i].usedGpuMemory;
        fprintf(f, "%s[%u, %llu]", i ? ", " : "", pid, used);
    }
    fprintf(f, "]");
}

/* nvmlDeviceGetRunningProcessDetailList, compute mode: the list newer nvidia-smi reads */
static void put_details(FILE *f, nvmlDevice_t h) {
    static nvmlProcessDetail_v1_t d[MAX_PROCS];
    nvmlProcessDetailList_v1_t l = {NVML_PROCESS_DETAIL_LIST_V1, 0, MAX_PROCS, d};
    int rc = nvmlDeviceGetRunningProcessDetailList(h, &l);
    if (rc) {
        fprintf(f, ", \"procs_detail\": null, \"procs_detail_rc\": %d", rc);
        return;
    }
    fprintf(f, ", \"procs_detail\": [");
    for (unsigned i = 0; i < l.numProcArrayEntries && i < MAX_PROCS; i++)
        fprintf(f, "%s[%u, %llu]", i ? ", " : "", d[i].pid, d[i].usedGpuMemory);
    fprintf(f, "]");
}

static void put_nvml_device(FILE *f, unsigned i) {
    nvmlDevice_t h, h1;
    int rc = nvmlDeviceGetHandleByIndex_v2(i, &h);
    int rc1 = nvmlDeviceGetHandleByIndex(i, &h1);
    fprintf(f, "{\"rc\": %d, \"rc_v1\": %d", rc, rc1);
    if (rc) {
        fprintf(f, "}");
        return;
    }
    unsigned index = 0;
    rc = nvmlDeviceGetIndex(h, &index);
    put_num(f, "index", rc, index);

    char uuid[96] = "";
    rc = nvmlDeviceGetUUID(h, uuid, sizeof uuid);
    put_text(f, "uuid", rc, uuid);

    nvmlMemory_t m = {0};
    rc = nvmlDeviceGetMemoryInfo(h, &m);
    put_num(f, "total", rc, m.total);
    put_num(f, "free", rc, m.free);
    put_num(f, "used", rc, m.used);

    nvmlMemory_v2_t m2 = {.version = NVML_MEMORY_V2};
    rc = nvmlDeviceGetMemoryInfo_v2(h, &m2);
    if (rc)
        fprintf(f, ", \"v2\": null, \"v2_rc\": %d", rc);
    else
        fprintf(f, ", \"v2\": {\"total\": %llu, \"free\": %llu, \"used\": %llu, \"reserved\": %llu}", m2.total,
                m2.free, m2.used, m2.reserved);

    put_procs(f, "procs_v3", h, 3);
    put_procs(f, "procs_v2", h, 2);
    put_procs(f, "procs_v1", h, 1);
    put_details(f, h);

    nvmlUtilization_t u = {0};
    rc = nvmlDeviceGetUtilizationRates(h, &u);
    put_num(f, "util", rc, u.gpu);
    fprintf(f, "}");
}

/* everything from "nvml_init" on */
static void put_nvml(FILE *f, int nvml_init) {
    unsigned n = 0, n1 = 0;
    int rc = nvmlDeviceGetCount_v2(&n);
    if (rc)
        n = 0;
    fprintf(f, ", \"nvml_init\": %d", nvml_init);
    put_count(f, "nvml_count", rc, n);
    rc = nvmlDeviceGetCount(&n1);
    put_count(f, "nvml_count_v1", rc, n1);
    fprintf(f, ", \"nvml\": [");
    for (unsigned i = 0; i < n; i++) {
        fprintf(f, "%s", i ? ", " : "");
        put_nvml_device(f, i);
    }
    nvmlDevice_t h;
    fprintf(f, "], \"bad_index_rc\": %d, \"by_uuid\": {", nvmlDeviceGetHandleByIndex_v2(n, &h));
    for (int i = 0; i < n_uuids; i++) {
        fprintf(f, "%s", i ? ", " : "");
        put_str(f, uuids[i].text);
        fprintf(f, ": {\"rc\": %d, \"index\": %lld}", uuids[i].rc, uuids[i].index);
    }
    fprintf(f, "}");
}

/* ---- CUDA ---- */

static void put_cuda_device(FILE *f, int ordinal) {
    CUdevice dev;
    int rc = cuDeviceGet(&dev, ordinal);
    if (rc) {
        fprintf(f, "{\"rc\": %d}", rc);
        return;
    }
    CUuuid u;
    char uuid[64] = "";
    rc = cuDeviceGetUuid_v2(&u, dev);
    if (!rc) {
        char *o = uuid + sprintf(uuid, "GPU-");
        for (int k = 0; k < 16; k++)
            o += sprintf(o, (k == 4 || k == 6 || k == 8 || k == 10) ? "-%02x" : "%02x", u.bytes[k]);
    }
    fprintf(f, "{\"ordinal\": %d", ordinal);
    put_text(f, "uuid", rc, uuid);

    char bus[64] = "";
    rc = cuDeviceGetPCIBusId(bus, sizeof bus, dev);
    put_text(f, "bus", rc, bus);

    size_t total = 0;
    rc = cuDeviceTotalMem_v2(&total, dev);
    put_num(f, "total", rc, total);

    CUcontext ctx;
    size_t freeb = 0, mtotal = 0;
    rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!rc)
        rc = cuCtxSetCurrent(ctx);
    if (!rc)
        rc = cuMemGetInfo_v2(&freeb, &mtotal);
    put_num(f, "free", rc, freeb);
    put_num(f, "mem_total", rc, mtotal);
    fprintf(f, "}");
}

int main(int argc, char **argv) {
    int cuda_init = cuInit(0);
    int nvml_init = nvmlInit_v2();
    do_args(argc, argv);

    /* NVML is read before the CUDA section retains every device's context,
     * so its process lists and memory show only what the arguments did. */
    char *nvml = NULL;
    size_t nvml_len = 0;
    FILE *nf = open_memstream(&nvml, &nvml_len);
    put_nvml(nf, nvml_init);
    fclose(nf);

    int n = 0;
    int rc = cuDeviceGetCount(&n);
    if (rc)
        n = 0;
    printf("{\"cuda_init\": %d", cuda_init);
    put_count(stdout, "cuda_count", rc, n);
    printf(", \"cuda\": [");
    for (int i = 0; i < n; i++) {
        printf("%s", i ? ", " : "");
        put_cuda_device(stdout, i);
    }
    printf("], \"allocs\": [");
    for (int i = 0; i < n_allocs; i++)
        printf("%s%d", i ? ", " : "", allocs[i]);
    printf("]%s}\n", nvml);
    free(nvml);
    return 0;
}
