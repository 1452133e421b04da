/* VPMM for PyTorch's CUDAPluggableAllocator: the malloc/free pair it loads from
 * this library by name. Each call goes straight to the pool's compiled entry
 * points (services of the callback library, pyvgpu/jit/vpmm/entries.py: no
 * GIL), installed per device by pyvgpu.vpmm.pytorch.enable. Their types,
 * pv_vpmm_malloc_t and pv_vpmm_free_t, are generated from the hook table's
 * declaration of them (pyvgpu/contract/hooks.py SERVICES, shim/generated/pv_table.h). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "pv_shim.h"

#define PV_VPMM_DEVICES 16

static struct {
    pv_vpmm_malloc_t malloc_fn;
    pv_vpmm_free_t free_fn;
    uint64_t state;
} pv_vpmm[PV_VPMM_DEVICES];

PV_EXPORT int pyvgpu_vpmm_install(int device, void *malloc_fn, void *free_fn, uint64_t state) {
    if (device < 0 || device >= PV_VPMM_DEVICES || !malloc_fn || !free_fn || !state)
        return -1;
    pv_vpmm[device].state = state;
    pv_vpmm[device].free_fn = (pv_vpmm_free_t)free_fn;
    __atomic_store_n(&pv_vpmm[device].malloc_fn, (pv_vpmm_malloc_t)malloc_fn, __ATOMIC_RELEASE);
    return 0;
}

/* PyTorch's CUDAPluggableAllocator does not check what malloc returns: a NULL
 * becomes a tensor at address 0 and a crash later. So a refusal is raised as a
 * C++ exception that PyTorch translates for Python: for out of memory a
 * c10::OutOfMemoryError (torch.OutOfMemoryError), for anything else c10's own
 * check failure (a RuntimeError). NULL is only the answer for other callers.
 * The unwinder crosses this C frame through its .eh_frame (built -fexceptions).
 *
 * c10::OutOfMemoryError has no out-of-line constructor of its own (it inherits
 * c10::Error's), so it is built through the C++ ABI from C: the exception object
 * comes from __cxa_allocate_exception, c10::Error's exported constructor fills
 * it (its vtable pointer is then set to OutOfMemoryError's), and __cxa_throw
 * throws it with OutOfMemoryError's typeinfo, which is what PyTorch's
 * `catch (const c10::OutOfMemoryError&)` matches. Every symbol is looked up by
 * its mangled name in what is already loaded (libc10, libc10_cuda, libstdc++): a
 * PyTorch built with another string ABI has other names, and gets the
 * RuntimeError (stderr says once which symbol was missing).
 *
 * Neither class declares a destructor: it is implicit, inline, and PyTorch
 * builds with -fvisibility-inlines-hidden, so libc10 exports no
 * c10::Error::~Error (PyTorch 2.11's libc10.so has none; looking it up by name
 * is what made every refusal a RuntimeError on a GPU: docs/measurements.md,
 * "the merged tree on an H100"). The
 * destructor __cxa_throw needs is read from OutOfMemoryError's vtable instead:
 * in the Itanium C++ ABI a class with a virtual destructor (std::exception's is
 * its first virtual function) has the complete-object destructor in the first
 * slot after the address point. */
typedef void (*pv_check_fail_t)(const char *func, const char *file, uint32_t line, const char *msg);

struct pv_srcloc { /* c10::SourceLocation: passed by value (24 bytes, in memory, as in C++) */
    const char *function;
    const char *file;
    uint32_t line;
};
struct pv_cxx_string { /* libstdc++'s std::string (C++11 ABI): pointer, length, local buffer */
    char *p;
    size_t len;
    union {
        char local[16];
        size_t cap;
    } u;
};
typedef void (*pv_error_ctor_t)(void *self, struct pv_srcloc loc, struct pv_cxx_string *msg);
typedef void *(*pv_alloc_exc_t)(size_t);
typedef void (*pv_throw_t)(void *obj, void *tinfo, void (*dtor)(void *));
typedef void *(*pv_new_t)(size_t);
typedef void (*pv_delete_t)(void *);

#define PV_EXC_BYTES 512 /* more than sizeof(c10::Error) in any PyTorch (~200): the size is only allocated */
#define PV_STRING_ABI "NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"

static void *pv_sym(void *lib, const char *name) { return lib ? dlsym(lib, name) : NULL; }

/* Throw c10::OutOfMemoryError(msg); returns only if this process cannot (no PyTorch, another ABI). */
static void pv_throw_oom(const char *msg) {
    void *c10 = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
    void *cxx = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
    pv_error_ctor_t ctor = (pv_error_ctor_t)pv_sym(c10, "_ZN3c105ErrorC1ENS_14SourceLocationE" PV_STRING_ABI);
    if (!ctor)
        ctor = (pv_error_ctor_t)pv_sym(c10, "_ZN3c105ErrorC2ENS_14SourceLocationE" PV_STRING_ABI);
    void *c10_cuda = dlopen("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD); /* its allocator throws the class too */
    void *tinfo = pv_sym(c10, "_ZTIN3c1016OutOfMemoryErrorE");
    char *vtable = pv_sym(c10, "_ZTVN3c1016OutOfMemoryErrorE");
    if (!tinfo || !vtable) {
        tinfo = pv_sym(c10_cuda, "_ZTIN3c1016OutOfMemoryErrorE");
        vtable = pv_sym(c10_cuda, "_ZTVN3c1016OutOfMemoryErrorE");
    }
    if (c10_cuda)
        dlclose(c10_cuda);
    /* the address point is past offset-to-top and typeinfo; its first slot is ~OutOfMemoryError (complete) */
    void **vptr = vtable ? (void **)(vtable + 2 * sizeof(void *)) : NULL;
    void (*dtor)(void *) = vptr ? (void (*)(void *))vptr[0] : NULL;
    pv_alloc_exc_t alloc_exc = (pv_alloc_exc_t)pv_sym(cxx, "__cxa_allocate_exception");
    pv_throw_t throw_fn = (pv_throw_t)pv_sym(cxx, "__cxa_throw");
    pv_new_t new_fn = (pv_new_t)pv_sym(cxx, "_Znwm");
    pv_delete_t delete_fn = (pv_delete_t)pv_sym(cxx, "_ZdlPv");
    /* the handles only drop the references NOLOAD took: both libraries stay loaded */
    if (c10)
        dlclose(c10);
    if (cxx)
        dlclose(cxx);
    const char *missing = !c10 ? "libc10.so (not loaded)" : !ctor ? "c10::Error::Error(SourceLocation, std::string)"
                          : !tinfo ? "typeinfo for c10::OutOfMemoryError" : !vtable ? "vtable for c10::OutOfMemoryError"
                          : !dtor ? "~OutOfMemoryError in its vtable" : !alloc_exc ? "__cxa_allocate_exception"
                          : !throw_fn ? "__cxa_throw" : !new_fn ? "operator new" : !delete_fn ? "operator delete" : NULL;
    if (missing) {
        static int told;
        if (c10 && !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "pyvgpu: VPMM cannot throw c10::OutOfMemoryError in this process (%s not found): a "
                    "refusal is a RuntimeError, not torch.OutOfMemoryError\n", missing);
        return;
    }
    size_t n = strlen(msg);
    struct pv_cxx_string s;
    s.p = new_fn(n + 1); /* the string's owner frees it with operator delete: allocate it with new */
    memcpy(s.p, msg, n + 1);
    s.len = n;
    s.u.cap = n;
    void *obj = alloc_exc(PV_EXC_BYTES);
    struct pv_srcloc loc = {"pyvgpu_vpmm_malloc", __FILE__, __LINE__};
    ctor(obj, loc, &s);
    if (s.p != s.u.local) /* not moved from: the temporary is still ours to destroy */
        delete_fn(s.p);
    *(void **)obj = vptr; /* OutOfMemoryError's: the object is one from here on */
    throw_fn(obj, tinfo, dtor);
}

static void *pv_vpmm_refuse(ssize_t size, int device, int64_t rc) {
    char msg[320];
    if (rc == -1000 - 2) /* CUDA_ERROR_OUT_OF_MEMORY */
        snprintf(msg, sizeof msg, "CUDA out of memory: pyvgpu VPMM could not map %zd bytes on device %d (the "
                 "vGPU's memory cap or the device is full; pyvgpu.vpmm.pool pools' dump() shows what it holds)", size,
                 device);
    else if (rc == -2)
        snprintf(msg, sizeof msg, "pyvgpu VPMM: the pool's tables for device %d are full (%zd bytes asked)",
                 device, size);
    else if (rc == 0)
        snprintf(msg, sizeof msg, "pyvgpu VPMM has no pool for device %d (pyvgpu.vpmm.pytorch.enable made "
                 "none)", device);
    else
        snprintf(msg, sizeof msg, "pyvgpu VPMM: malloc(%zd) on device %d failed: CUresult %lld", size, device,
                 (long long)(rc <= -1000 ? -rc - 1000 : rc));
    if (rc == -1000 - 2)
        pv_throw_oom(msg); /* throws when PyTorch's c10 is loaded; else on to the check failure */
    /* PyTorch loads libc10 RTLD_LOCAL: look it up by name among what is loaded, never load it */
    void *c10 = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
    pv_check_fail_t fail = c10 ? (pv_check_fail_t)dlsym(c10, "_ZN3c106detail14torchCheckFailEPKcS2_jS2_") : NULL;
    if (c10)
        dlclose(c10); /* only drops the reference NOLOAD took */
    if (fail)
        fail("pyvgpu_vpmm_malloc", __FILE__, __LINE__, msg); /* throws, does not return */
    fprintf(stderr, "%s\n", msg); /* every message names pyvgpu */
    return NULL;
}

PV_EXPORT void *pyvgpu_vpmm_malloc(ssize_t size, int device, void *stream) {
    if (device < 0 || device >= PV_VPMM_DEVICES)
        return pv_vpmm_refuse(size, device, 0);
    pv_vpmm_malloc_t m = __atomic_load_n(&pv_vpmm[device].malloc_fn, __ATOMIC_ACQUIRE);
    if (!m)
        return pv_vpmm_refuse(size, device, 0);
    int64_t p = m(pv_vpmm[device].state, (int64_t)size, (uint64_t)(uintptr_t)stream);
    return p > 0 ? (void *)(uintptr_t)p : pv_vpmm_refuse(size, device, p);
}

PV_EXPORT void pyvgpu_vpmm_free(void *ptr, ssize_t size, int device, void *stream) {
    if (!ptr || device < 0 || device >= PV_VPMM_DEVICES || !pv_vpmm[device].free_fn)
        return;
    int64_t rc = pv_vpmm[device].free_fn(pv_vpmm[device].state, (int64_t)(uintptr_t)ptr,
                                         (uint64_t)(uintptr_t)stream, (int64_t)size);
    if (rc != 0) /* a pointer the pool does not hold: say so, never corrupt the pool */
        fprintf(stderr, "pyvgpu: VPMM free(%p, %zd) on device %d failed (%lld): not a live allocation\n", ptr,
                size, device, (long long)rc);
}
