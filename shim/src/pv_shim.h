/* Internal interface between the generated hooks (shim/generated) and the
 * hand-written plumbing (shim/src). */
#ifndef PV_SHIM_H
#define PV_SHIM_H
#include "pv_types.h"
#include "../generated/pv_layout.h"
#include "../generated/pv_table.h"
#include "../generated/pv_env_names.h"

#define PV_EXPORT __attribute__((visibility("default")))
#define PV_LIKELY(x) __builtin_expect(!!(x), 1)
#define PV_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum { PV_LIB_CUDA = 0, PV_LIB_NVML = 1 };
enum { PV_VIA_DLSYM = 0, PV_VIA_PROCADDR = 1, PV_N_VIA = 2 };

typedef struct {
    const char *name;  /* exported ABI symbol */
    uint8_t lib;       /* PV_LIB_* */
    uint8_t per_thread;
    uint8_t has_callback; /* 0: implemented in C (pv_impl_<abi>) */
    uint16_t hook;     /* index into pv_hook_infos */
    int32_t since;     /* first cudaVersion mapping to it; 0 for NVML */
} pv_entry_info_t;

typedef struct {
    const char *name;  /* base name, as cuGetProcAddress takes it */
    uint16_t first;    /* first entry index */
    uint16_t count;    /* number of variants */
} pv_hook_info_t;

typedef struct { const char *name; uint16_t index; } pv_name_index_t;

typedef struct {
    const char *name; /* a driver function the policies call without hooking it */
    uint8_t lib;
} pv_helper_info_t;

/* generated (pv_hooks.c) */
extern const pv_entry_info_t pv_entry_infos[PV_N_ENTRIES];
extern const pv_hook_info_t pv_hook_infos[PV_N_HOOKS];
extern const pv_name_index_t pv_abi_sorted[PV_N_ENTRIES];
extern const pv_name_index_t pv_hook_sorted[PV_N_HOOKS];
extern void *const pv_hook_fns[PV_N_ENTRIES];
extern const pv_helper_info_t pv_helper_infos[PV_N_HELPERS];
extern const char *const pv_service_names[PV_N_SERVICES];

/* The files of shim/src, from the bottom layer up: each may use the files
 * above it in this list, never one below (tests/test_codegen.py checks it). */

/* pv_names.c: name lookup in the generated tables */
int pv_find_abi(const char *name);      /* entry index or -1 */
int pv_find_hook(const char *name);     /* hook index or -1 */

/* pv_state.c: the per-process state */
extern pv_ctx_t pv_ctx;
extern void *pv_callbacks[PV_N_ENTRIES];
enum { PV_BOOT_READY = 0, PV_BOOT_PASSTHROUGH = 1, PV_BOOT_REFUSE = 2 };
extern int pv_boot_state; /* PV_BOOT_*, -1 before the boot */

static inline void *pv_callback(int entry) {
    return __atomic_load_n(&pv_callbacks[entry], __ATOMIC_ACQUIRE);
}
static inline void *pv_real(int entry) {
    return (void *)(uintptr_t)pv_ctx.entry[entry].real;
}

extern const char *pv_boot_mode; /* "none", or "native" once the callbacks are installed */
extern char pv_callbacks_path[1024]; /* the callback library loaded */

/* pv_guard.c: a SIGBUS in a registered mapping (a shared file someone truncated) never kills the process */
enum { PV_GUARD_REGION = 0, PV_GUARD_TURNS = 1 };
int pyvgpu_guard(uint64_t addr, uint64_t size, int kind); /* register a mapping; 0 or -1 */

/* pv_verify.c: the callback library's owner, mode and hash checks, for the loader (pv_load.c) */
int pv_verified_fd(const char *path, int nofollow, char *why, size_t n); /* a read-only fd, or -1 with why */

/* pv_stats.c: call and lookup counts, printed at exit */
void pv_count_lookup(int entry, int via);
void pv_count_call(int entry);
void pv_note_procaddr_mismatch(const char *symbol, int table_entry, int driver_entry);
void pv_stats_reset(void);              /* in a forked child */

/* pv_dlsym.c: the dlsym override, and glibc's own dlsym */
void *pv_real_dlsym(void *handle, const char *name);

/* pv_real.c: the driver's functions */
void pv_resolve_real(void);             /* fill pv_ctx.entry[].real and pv_ctx.helper (idempotent) */

/* pv_env.c: the environment contract, read as pyvgpu/limits.py reads it */
typedef struct {
    uint64_t memory[PV_MAX_DEVICES]; /* bytes per device, 0 = none */
    uint32_t sm[PV_MAX_DEVICES];     /* compute share in percent per device, 0 = none */
    int any_memory, any_sm;          /* some variable asked for a limit */
    uint32_t sm_policy;              /* GPU_CORE_UTILIZATION_POLICY: 0 default, 1 force, 2 disable */
    uint64_t sm_batch_ns;            /* PYVGPU_SM_BATCH_MS */
    int turns;                       /* PYVGPU_SM_TURN */
    int clock;                       /* PYVGPU_CLOCK: 0 auto, 1 tsc, 2 system */
    int trust_shared;                /* PYVGPU_TRUST_SHARED (pyvgpu/safefile.py) */
    int priority;                    /* CUDA_TASK_PRIORITY: 0 high, 1 low; -1 unset (a new group's is low) */
    int sm_borrow;                   /* PYVGPU_SM_BORROW: 1, 0; -1 unset (a new group's share is a cap) */
    const char *region, *region_var; /* PYVGPU_REGION, else CUDA_DEVICE_MEMORY_SHARED_CACHE; NULL if neither */
} pv_env_t;
int pv_read_env(char *const *envp, pv_env_t *env, char *err, size_t n); /* 0, or -1 naming the variable */
void pv_human(uint64_t bytes, char *out, size_t n);                       /* "4 GiB", as limits.human */

/* pv_load.c: the compiled callbacks, loaded without an interpreter; NULL with the reason in err */
const pv_cblib_t *pv_load_callbacks(char *err, size_t n);

/* pv_attach.c: join the group named by the environment (region, turn file, the context); 0 or -1 */
int pv_attach(char *err, size_t n);

/* pv_procaddr.c */
int pv_select_variant(int hook, int cuda_version, cuuint64_t flags);
CUresult pv_impl_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult pv_impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                     int *symbolStatus);

/* pv_core.c: the boot (make the callbacks ready; PV_BOOT_*), fork */
int pv_boot(void);

/* pv_vpmm.c: VPMM's malloc/free for PyTorch's pluggable allocator (exported only) */
#endif
