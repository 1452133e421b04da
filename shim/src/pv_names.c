/* Name lookup: a hooked ABI name or base name to its index in the generated
 * tables (bsearch over the sorted lists pv_hooks.c holds). */
#include <stdlib.h>
#include <string.h>

#include "pv_shim.h"

static int cmp_name(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const pv_name_index_t *)elem)->name);
}

int pv_find_abi(const char *name) {
    const pv_name_index_t *r = bsearch(name, pv_abi_sorted, PV_N_ENTRIES, sizeof *r, cmp_name);
    return r ? r->index : -1;
}

int pv_find_hook(const char *name) {
    const pv_name_index_t *r = bsearch(name, pv_hook_sorted, PV_N_HOOKS, sizeof *r, cmp_name);
    return r ? r->index : -1;
}
