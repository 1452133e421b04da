/* The real driver functions: every hooked entry's and every helper's
 * address in the driver, resolved once (pv_ctx.entry[].real, pv_ctx.helper). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "pv_shim.h"

static pthread_once_t pv_real_once = PTHREAD_ONCE_INIT;

static void *open_lib(const char *env, const char *dflt) {
    const char *name = getenv(env);
    if (!name || !*name)
        name = dflt;
    void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    return h ? h : dlopen(name, RTLD_LAZY);
}

static void resolve_real_once(void) {
    void *libs[2] = {open_lib(PV_ENV_REAL_LIBCUDA, "libcuda.so.1"),
                     open_lib(PV_ENV_REAL_LIBNVML, "libnvidia-ml.so.1")};
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        void *h = libs[pv_entry_infos[i].lib];
        pv_ctx.entry[i].real = h ? (uint64_t)(uintptr_t)pv_real_dlsym(h, pv_entry_infos[i].name) : 0;
    }
    for (int i = 0; i < PV_N_HELPERS; i++) {
        void *h = libs[pv_helper_infos[i].lib];
        pv_ctx.helper[i] = h ? (uint64_t)(uintptr_t)pv_real_dlsym(h, pv_helper_infos[i].name) : 0;
    }
}

void pv_resolve_real(void) { pthread_once(&pv_real_once, resolve_real_once); }

/* The driver's own function behind a hooked ABI name (benchmarks compare it
 * with the hook in one process). NULL for names that are not hooked. */
PV_EXPORT void *pyvgpu_real_function(const char *abi) {
    int e = abi ? pv_find_abi(abi) : -1;
    if (e < 0)
        return NULL;
    pv_resolve_real();
    return pv_real(e);
}
