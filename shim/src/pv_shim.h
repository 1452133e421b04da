/* Internal interface between the generated hooks (shim/generated) and the
 * hand-written plumbing (shim/src). */
#ifndef PV_SHIM_H
#define PV_SHIM_H
#include <sys/types.h>

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

/* pv_grammar.c: the grammar of limits (sizes, shares, devices, priorities, switches, --memory/--sm specs);
 * values as (text, length); 0, or -1 with the message in err */
int pv_space(unsigned char c);
int pv_fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void pv_repr(const char *text, size_t len, char *out, size_t n); /* as Python's repr() of the str */
void pv_strip(const char *text, size_t len, const char **b, const char **e);
int pv_ascii_int(const char *b, const char *e, uint64_t *out);
int pv_word(const char *text, size_t len, const char *const *words, int count);
int pv_check_ascii(const char *text, size_t len, const char *where, const char *what, const char *example,
                   char *err, size_t n);
void pv_human(uint64_t bytes, char *out, size_t n); /* "4 GiB", as limits.human */
int pv_parse_size(const char *text, size_t len, const char *where, uint64_t *out, char *err, size_t n);
int pv_parse_cap(const char *text, size_t len, const char *where, uint64_t floor, uint64_t *out, char *err, size_t n);
int pv_parse_percent(const char *text, size_t len, const char *where, uint32_t *out, char *err, size_t n);
int pv_parse_device(const char *text, size_t len, const char *where, int *out, char *err, size_t n);
int pv_parse_priority(const char *text, size_t len, const char *where, int *out, char *err, size_t n);
int pv_parse_switch(const char *text, size_t len, const char *where, int *out, char *err, size_t n);
#define PV_SPEC_NONE 2 /* pv_parse_spec's kind: "none" is no limit */
int pv_parse_spec(const char *text, size_t len, const char *where, int kind, uint64_t floor, int64_t *dflt,
                  uint64_t *per, uint32_t *mask, char *err, size_t n);

/* pv_env.c: the environment contract, the one reader */
enum { PV_SET_POLICY, PV_SET_BATCH_NS, PV_SET_TURNS, PV_SET_CLOCK, PV_SET_TRUST_SHARED, PV_SET_PRIORITY,
       PV_SET_SM_BORROW, PV_SET_MIN_MEMORY, PV_N_SETTINGS, /* the shim reads these at its start */
       PV_SET_GROUP_IDLE_NS = PV_N_SETTINGS };             /* pyvgpu's commands only */
typedef struct {
    uint64_t memory[PV_MAX_DEVICES]; /* bytes per device, 0 = none */
    uint32_t sm[PV_MAX_DEVICES];     /* compute share in percent per device, 0 = none */
    int any_memory, any_sm;          /* some variable asked for a limit */
    uint32_t sm_policy;              /* GPU_CORE_UTILIZATION_POLICY: 0 default, 1 force, 2 disable */
    uint64_t sm_batch_ns;            /* PYVGPU_SM_BATCH_MS */
    int turns;                       /* PYVGPU_SM_TURN */
    int clock;                       /* PYVGPU_CLOCK: 0 auto, 1 tsc, 2 system */
    int trust_shared;                /* PYVGPU_TRUST_SHARED */
    int priority;                    /* CUDA_TASK_PRIORITY: 0 high, 1 low; -1 unset (a new group's is low) */
    int sm_borrow;                   /* PYVGPU_SM_BORROW: 1, 0; -1 unset (a new group's share is a cap) */
    const char *region, *region_var; /* PYVGPU_REGION, else CUDA_DEVICE_MEMORY_SHARED_CACHE; NULL if neither */
} pv_env_t;
int pv_env_setting(char *const *envp, int which, int64_t *out, char *err, size_t n); /* PV_SET_* */
/* kind 0: CUDA_DEVICE_MEMORY_LIMIT[_i], 1: CUDA_DEVICE_SM_LIMIT[_i]; *dflt -1 or the plain value; per[d] for
 * bit d of *mask */
int pv_env_devices(char *const *envp, int kind, int64_t *dflt, uint64_t *per, uint32_t *mask, char *err, size_t n);
void pv_env_region(char *const *envp, const char **path, const char **var); /* NULL, NULL if none */
int pv_read_env(char *const *envp, pv_env_t *env, char *err, size_t n); /* 0, or -1 naming the variable */

/* pv_group_files.c: files other users may touch; 0/fd, or -1 with err */
#define PV_RUNTIME_FIX "Ask its owner or root to remove it, or set XDG_RUNTIME_DIR to a directory of your own " \
                       "(pyvgpu then keeps its groups in $XDG_RUNTIME_DIR/pyvgpu)"
#define PV_REGION_FIX "use a region of your own (--group NAME, or --region PATH in a directory only you can write)"
#define PV_TRUST_NOTE "or set PYVGPU_TRUST_SHARED=1 if whoever can write it is trusted (docs/security.md)"
enum { PV_OPEN_MISSING = 1, PV_OPEN_UNTRUSTED = 2, PV_OPEN_REFUSED = 3 }; /* why an open failed */
struct stat;
void pv_who(uid_t uid, char *out, size_t n); /* "uid 65534 (nobody)" */
int pv_private_dir(const char *path, const char *what, const char *fix, char *err, size_t n);
const char *pv_foreign_problem(const struct stat *st, int root_group_ok, char *buf, size_t n);
int pv_open_shared(const char *path, int flags, const char *what, const char *fix, int root_group_ok,
                   int trust_shared, char *err, size_t n, int *kind);
int pv_runtime_path(char *out, size_t n, char *err, size_t errlen); /* where, not made */
int pv_runtime_dir(char *out, size_t n, char *err, size_t errlen);  /* made private */
int pv_make_parents(const char *path, mode_t mode);
void *pv_map_shared(int fd, uint64_t size, const char *path, const char *what, const char *fix, char *err,
                    size_t n); /* never unmapped; NULL with err */

/* pv_group_region.c: the group's region */
#define PV_MAX_SLOTS (4 * PV_REGION_DEFAULT_SLOTS) /* region.MAX_SLOTS: more is a corrupt or hostile header */
uint64_t pv_region_size(uint32_t n_slots);
int pv_make_region(const char *path, const pv_region_header_t *want, const uint64_t *memory, const uint32_t *sm,
                   unsigned mode, int64_t uid, int64_t gid, char *err, size_t n); /* 1 made, 0 there, -1 err */
int pv_create_region(const char *path, const pv_env_t *env, char *err, size_t n);
int pv_private_path(char *out, size_t n, char *err, size_t errlen);
int pv_open_region(const char *path, int writable, int trust_shared, pv_region_header_t *h, char *err, size_t n,
                   int *kind);
int pv_check_limits(const char *path, const pv_region_header_t *h, const pv_region_device_t *dev, int kind,
                    const uint64_t *want, const char *source, char *err, size_t n);
int pv_check_group(const char *path, const pv_region_header_t *h, const pv_region_device_t *dev,
                   const pv_env_t *env, char *err, size_t n);
int pv_view_region(const char *path, int writable, int trust_shared, pv_region_header_t *h, void **addr,
                   char *err, size_t n, int *kind); /* the fd, the view at *addr */
void pv_unmap_view(void *addr, uint64_t size);
void *pv_watch_region(const char *path, char *err, size_t n); /* read-only, shared, never unmapped */
int pv_slots_locked(int fd, uint32_t first, uint32_t count); /* 1 a member holds one, 0, -1 with errno */
int pv_gc_private(const char *dir, uint64_t min_age_ns, int trust_shared); /* how many removed */

/* pv_group_checks.c: a process's wishes against its group's region, and live changes of the group's limits */
#define PV_VISIBLE_MIG (1u << 31)              /* pyvgpu/contract/layout.py VISIBLE_MIG */
#define PV_VISIBLE_INDEX (PV_VISIBLE_MIG - 1u) /* VISIBLE_INDEX */
#define PV_UUID_BYTES 16                       /* UUID_BYTES */
#define PV_MODE_MPS 1                          /* MODE_MPS */
enum { PV_SETTING_PRIORITY, PV_SETTING_SM_BORROW }; /* the header's group settings */
int pv_check_devices(const char *path, const pv_region_header_t *h, uint32_t n_want, const uint32_t *want,
                     const uint8_t *uuid, const char *source, char *err, size_t n);
int pv_check_setting(const char *path, const pv_region_header_t *h, int which, uint32_t want, const char *source,
                     char *err, size_t n);
int pv_check_bounds(const char *path, const pv_region_header_t *h, uint32_t n_physical, const uint64_t *physical,
                    char *err, size_t n);
int pv_check_change(const char *path, const pv_region_header_t *h, int kind, int64_t dflt, const uint64_t *per,
                    uint32_t mask, uint32_t n_devices, const uint64_t *total, const char *where, char *err, size_t n);
int pv_set_device_limit(pv_region_header_t *h, int kind, int device, uint64_t value, uint64_t *old, uint64_t *now,
                        char *err, size_t n);
int pv_set_setting(pv_region_header_t *h, int which, uint32_t value, uint32_t *old, char *err, size_t n);

/* pv_group_turns.c: the turn file */
#define PV_SHM_TURNS "/dev/shm/pyvgpu-turns-v1"
int pv_machine_turns_problem(const char *p, int trust_shared, char *why, size_t n); /* 1 with why, or 0 */
int pv_turn_path(const char *sched, const char *machine, int trust_shared, char *out, size_t n, int *own, char *why, size_t whylen,
                 char *err, size_t errlen);
int pv_create_turns(const char *p, unsigned mode, int gid); /* 0, or -1 with errno */
void pv_turns_fix(const char *p, char *fix, size_t n);
int pv_open_turns(const char *p, int trust_shared, const char *fix, char *err, size_t n, int *kind);
int pv_use_turns(const char *p, const char *machine, int trust_shared, char *err, size_t n, int *kind); /* fd */
int pv_read_turns(const char *p, const char *machine, int trust_shared, void *out, char *err, size_t n, int *kind);
int pv_node_turns(const char *p, unsigned mode, char *err, size_t n); /* 0, or -1 with err */
int pv_setup_turns(const char *p, int gid, unsigned mode, int trust_shared, char *err, size_t n); /* 0 kept,
                                                                                   1 replaced, 2 made, -1 err */

/* pv_group_api.c: the group library's exported functions, for Python's ctypes (pyvgpu/native/group*.py) */

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
