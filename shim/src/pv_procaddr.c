/* cuGetProcAddress and cuGetProcAddress_v2: the CUDA runtime (also the one
 * linked into PyTorch) fetches every driver function through them.
 *
 * The real driver answers first, so error codes, symbolStatus and
 * not-found results are exactly the driver's. A pointer for a hooked name
 * is then replaced by the hook of the same ABI variant. The variant comes
 * from the hook table's rule (pv_select_variant, twin of
 * pyvgpu.contract.hooks.select_variant) and is cross-checked against the driver's
 * pointer, which on driver 580 is always one of the exported variants
 * (docs/facts/procaddr-h100-driver580.tsv). On disagreement the driver wins
 * and a warning names both.
 */
#include "pv_shim.h"

int pv_select_variant(int hook, int cuda_version, cuuint64_t flags) {
    const pv_hook_info_t *h = &pv_hook_infos[hook];
    int want_pt = 0;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        for (int k = 0; k < h->count; k++)
            want_pt |= pv_entry_infos[h->first + k].per_thread;
    int best = -1;
    for (int k = 0; k < h->count; k++) {
        int e = h->first + k;
        const pv_entry_info_t *v = &pv_entry_infos[e];
        if (v->per_thread != want_pt || v->since > cuda_version)
            continue;
        if (best < 0 || v->since >= pv_entry_infos[best].since)
            best = e;
    }
    return best;
}

static int identify(int hook, void *fn) {
    const pv_hook_info_t *h = &pv_hook_infos[hook];
    for (int k = 0; k < h->count; k++)
        if ((void *)(uintptr_t)pv_ctx.entry[h->first + k].real == fn)
            return h->first + k;
    return -1;
}

static void *map_result(const char *symbol, void *fn, int cuda_version, cuuint64_t flags) {
    int h = pv_find_hook(symbol);
    if (h < 0)
        return fn;
    int t = pv_select_variant(h, cuda_version, flags);
    int d = identify(h, fn);
    if (d != t)
        pv_note_procaddr_mismatch(symbol, t, d);
    if (d < 0)
        return fn;
    pv_count_lookup(d, PV_VIA_PROCADDR);
    return pv_hook_fns[d];
}

typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, int *);

CUresult pv_impl_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    pv_resolve_real();
    pv_count_call(PV_E_cuGetProcAddress);
    gpa_v1_t real = (gpa_v1_t)pv_real(PV_E_cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = map_result(symbol, *pfn, cudaVersion, flags);
    return rc;
}

CUresult pv_impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                     int *symbolStatus) {
    pv_resolve_real();
    pv_count_call(PV_E_cuGetProcAddress_v2);
    gpa_v2_t real = (gpa_v2_t)pv_real(PV_E_cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = map_result(symbol, *pfn, cudaVersion, flags);
    return rc;
}
