/* The dlsym override: a lookup of a hooked ABI name returns our hook.
 *
 * Everything else is a tail call into the real dlsym, so glibc sees the
 * original caller's return address. That keeps RTLD_NEXT, and RTLD_DEFAULT
 * lookups from objects with a local scope, meaning what they mean for the
 * caller rather than for this library. RTLD_NEXT lookups of hooked names
 * are not intercepted for the same reason.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "pv_shim.h"

typedef void *(*dlsym_fn_t)(void *, const char *);
static dlsym_fn_t pv_dlsym_fn;

static dlsym_fn_t real_dlsym(void) {
    dlsym_fn_t f = __atomic_load_n(&pv_dlsym_fn, __ATOMIC_RELAXED);
    if (PV_LIKELY(f != NULL))
        return f;
    /* dlvsym, never dlsym: asking dlsym for dlsym would recurse into us. */
    f = (dlsym_fn_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = (dlsym_fn_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!f) {
        fprintf(stderr, "pyvgpu: cannot find glibc's dlsym (GLIBC_2.34 or GLIBC_2.2.5); this C library is "
                        "not supported\n");
        abort();
    }
    __atomic_store_n(&pv_dlsym_fn, f, __ATOMIC_RELAXED);
    return f;
}

void *pv_real_dlsym(void *handle, const char *name) { return real_dlsym()(handle, name); }

static __attribute__((noinline)) void *hooked(void *handle, const char *symbol, int entry) {
    /* Our library exports every hooked name, so an RTLD_DEFAULT lookup would
     * find the hook anyway; for a library handle, answer only if it has it. */
    if (handle != RTLD_DEFAULT && !real_dlsym()(handle, symbol))
        return NULL;
    pv_count_lookup(entry, PV_VIA_DLSYM);
    return pv_hook_fns[entry];
}

PV_EXPORT void *dlsym(void *handle, const char *symbol) {
    /* glibc declares symbol nonnull; hide that so the NULL check stays. */
    __asm__("" : "+r"(symbol));
    if (handle != RTLD_NEXT && symbol && (symbol[0] == 'c' || symbol[0] == 'n')) {
        int e = pv_find_abi(symbol);
        if (e >= 0)
            return hooked(handle, symbol, e);
    }
    return real_dlsym()(handle, symbol); /* must stay a tail call (see top) */
}
