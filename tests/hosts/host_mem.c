/* Memory test host. Built twice: linked against libcuda (-DLINKED: calls bind
 * to the shim's exported symbols) and resolving everything through
 * cuGetProcAddress_v2 the way the CUDA runtime does.
 *
 *   host_mem boundary BYTES     alloc BYTES, then 1 more byte; free; 1 byte again
 *   host_mem hold BYTES         alloc BYTES, print HELD, wait for stdin EOF
 *   host_mem stress SECONDS THREADS SEED MAXBYTES
 *                               threads allocate and free at random; then print the
 *                               bytes they still hold and wait for stdin EOF
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_decls.h"

static CUresult (*p_init)(unsigned);
static CUresult (*p_devget)(CUdevice *, int);
static CUresult (*p_retain)(CUcontext *, CUdevice);
static CUresult (*p_setcur)(CUcontext);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);

#ifdef LINKED
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
static void resolve(void) {
    p_init = cuInit;
    p_devget = cuDeviceGet;
    p_retain = cuDevicePrimaryCtxRetain;
    p_setcur = cuCtxSetCurrent;
    p_alloc = cuMemAlloc_v2;
    p_free = cuMemFree_v2;
}
#else
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);
static void get(gpa_t gpa, const char *n, void *out) {
    int st;
    if (gpa(n, (void **)out, 12000, 0, &st) || !*(void **)out) {
        printf("FAIL lookup %s\n", n);
        exit(1);
    }
}
static void resolve(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_t gpa = h ? (gpa_t)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        printf("FAIL no cuGetProcAddress_v2\n");
        exit(1);
    }
    get(gpa, "cuInit", &p_init);
    get(gpa, "cuDeviceGet", &p_devget);
    get(gpa, "cuDevicePrimaryCtxRetain", &p_retain);
    get(gpa, "cuCtxSetCurrent", &p_setcur);
    get(gpa, "cuMemAlloc", &p_alloc);
    get(gpa, "cuMemFree", &p_free);
}
#endif

static CUcontext g_ctx;

static int setup(void) {
    CUdevice d;
    resolve();
    CHECK(p_init(0));
    CHECK(p_devget(&d, 0));
    CHECK(p_retain(&g_ctx, d));
    CHECK(p_setcur(g_ctx));
    return 0;
}

static void wait_eof(void) {
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
}

struct worker {
    unsigned seed;
    double seconds;
    size_t maxbytes;
    unsigned long long held, allocs, ooms;
};

#define LIVE 64
static void *stress(void *arg) {
    struct worker *w = arg;
    CUdeviceptr ptr[LIVE] = {0};
    size_t size[LIVE] = {0};
    p_setcur(g_ctx);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned long long n = 0;; n++) {
        if ((n & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 > w->seconds)
                break;
        }
        int i = rand_r(&w->seed) % LIVE;
        if (ptr[i]) {
            if (p_free(ptr[i]) != 0) {
                printf("FAIL free\n");
                exit(1);
            }
            ptr[i] = 0;
        } else {
            size_t s = 1 + (size_t)rand_r(&w->seed) % w->maxbytes;
            CUresult rc = p_alloc(&ptr[i], s);
            if (rc == 0) {
                size[i] = s;
                w->allocs++;
            } else if (rc == 2) {
                ptr[i] = 0;
                w->ooms++;
            } else {
                printf("FAIL alloc %d\n", rc);
                exit(1);
            }
        }
    }
    for (int i = 0; i < LIVE; i++)
        if (ptr[i])
            w->held += size[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    if (setup())
        return 1;
    if (!strcmp(argv[1], "boundary")) {
        size_t n = strtoull(argv[2], NULL, 0);
        CUdeviceptr a, b;
        int r1 = p_alloc(&a, n), r2 = p_alloc(&b, 1);
        int r3 = r1 == 0 ? p_free(a) : -1;
        int r4 = p_alloc(&b, 1);
        printf("first=%d one_more=%d free=%d after_free=%d\n", r1, r2, r3, r4);
        return 0;
    }
    if (!strcmp(argv[1], "hold")) {
        CUdeviceptr a;
        int rc = p_alloc(&a, strtoull(argv[2], NULL, 0));
        printf("HELD rc=%d\n", rc);
        fflush(stdout);
        wait_eof();
        return 0;
    }
    if (!strcmp(argv[1], "stress") && argc == 6) {
        int nt = atoi(argv[3]);
        struct worker w[64];
        pthread_t th[64];
        for (int i = 0; i < nt; i++) {
            w[i] = (struct worker){(unsigned)atoi(argv[4]) * 131 + i, atof(argv[2]), strtoull(argv[5], NULL, 0)};
            pthread_create(&th[i], NULL, stress, &w[i]);
        }
        unsigned long long held = 0, allocs = 0, ooms = 0;
        for (int i = 0; i < nt; i++) {
            pthread_join(th[i], NULL);
            held += w[i].held;
            allocs += w[i].allocs;
            ooms += w[i].ooms;
        }
        printf("HELD %llu allocs %llu ooms %llu\n", held, allocs, ooms);
        fflush(stdout);
        wait_eof();
        return 0;
    }
    return 2;
}
