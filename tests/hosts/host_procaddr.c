/* A non-Python host that finds the driver the way the CUDA runtime does:
 * dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then every function
 * through cuGetProcAddress_v2 with a cudaVersion and flags.
 *
 *   host_procaddr run            allocate and launch; print OK
 *   host_procaddr query          for each stdin line "NAME VER FLAGS" print
 *                                "NAME VER FLAGS rc status lib sym": the answer of
 *                                cuGetProcAddress_v2 and where the function lives
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_decls.h"

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);
static gpa_t gpa;

static void *get(const char *name, int ver, unsigned long long flags) {
    void *p = NULL;
    int st = -1;
    CUresult rc = gpa(name, &p, ver, flags, &st);
    if (rc || !p) {
        printf("FAIL cuGetProcAddress_v2(%s, %d, %llu) -> rc %d status %d\n", name, ver, flags, rc, st);
        exit(1);
    }
    return p;
}

static const char *lib_of(void *p) {
    Dl_info di;
    if (!p || !dladdr(p, &di) || !di.dli_fname)
        return "-";
    const char *s = strrchr(di.dli_fname, '/');
    return s ? s + 1 : di.dli_fname;
}

int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("FAIL dlopen: %s\n", dlerror());
        return 1;
    }
    gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        printf("FAIL dlsym cuGetProcAddress_v2\n");
        return 1;
    }
    if (argc == 2 && !strcmp(argv[1], "query")) {
        char name[256];
        int ver;
        unsigned long long flags;
        while (scanf("%255s %d %llu", name, &ver, &flags) == 3) {
            void *p = NULL;
            int st = -1;
            CUresult rc = gpa(name, &p, ver, flags, &st);
            Dl_info di;
            const char *sym = (p && dladdr(p, &di) && di.dli_sname && di.dli_saddr == p) ? di.dli_sname : "-";
            printf("%s %d %llu %d %d %s %s\n", name, ver, flags, rc, st, lib_of(p), sym);
        }
        return 0;
    }
    CUresult (*cuInit)(unsigned) = get("cuInit", 12000, 0);
    CUresult (*cuDeviceGet)(CUdevice *, int) = get("cuDeviceGet", 12000, 0);
    CUresult (*retain)(CUcontext *, CUdevice) = get("cuDevicePrimaryCtxRetain", 12000, 0);
    CUresult (*setcur)(CUcontext) = get("cuCtxSetCurrent", 12000, 0);
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc", 12000, 0);
    CUresult (*freep)(CUdeviceptr) = get("cuMemFree", 12000, 0);
    CUresult (*getinfo)(size_t *, size_t *) = get("cuMemGetInfo", 12000, 0);
    CUresult (*load)(CUmodule *, const void *) = get("cuModuleLoadData", 12000, 0);
    CUresult (*getfn)(CUfunction *, CUmodule, const char *) = get("cuModuleGetFunction", 12000, 0);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **) = get("cuLaunchKernel", 12000, 0);
    CUresult (*launch_pt)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          CUstream, void **, void **) = get("cuLaunchKernel", 12000, 2);
    CUresult (*launchex)(const CUlaunchConfig *, CUfunction, void **, void **) = get("cuLaunchKernelEx", 12000, 0);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr p;
    size_t fr, tot;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(setcur(ctx));
    for (int i = 0; i < 4; i++) {
        CHECK(alloc(&p, 2 << 20));
        CHECK(freep(p));
    }
    CHECK(getinfo(&fr, &tot));
    CHECK(load(&mod, PTX));
    CHECK(getfn(&fn, mod, "pv_empty"));
    for (int i = 0; i < 6; i++)
        CHECK(launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    for (int i = 0; i < 3; i++)
        CHECK(launch_pt(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
    CHECK(launchex(&cfg, fn, NULL, NULL));
    printf("OK alloc=%s launch=%s launch_pt=%s setcur=%s\n", lib_of((void *)alloc), lib_of((void *)launch),
           lib_of((void *)launch_pt), lib_of((void *)setcur));
    return 0;
}
