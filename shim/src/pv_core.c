/* Core plumbing: real-function resolution, the bootstrap state machine,
 * the install API the Python side calls, per-process stats and fork.
 *
 * Callbacks arrive in two steps. pyvgpu_install() (called from Python,
 * possibly at interpreter start, before any CUDA use) only stages them.
 * The first hooked call runs pv_boot(): it resolves the real driver
 * functions, installs through Python if nothing was staged (first-call
 * fallback or embedded interpreter), then publishes the callbacks. So a
 * Python process that never touches CUDA never loads libcuda because of us.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "pv_shim.h"

extern char **environ;

pv_ctx_t pv_ctx = {.magic = PV_CTX_MAGIC, .n_entries = PV_N_ENTRIES};
void *pv_callbacks[PV_N_ENTRIES];

static void *pv_staged[PV_N_ENTRIES];
typedef int64_t (*pv_service_t)(pv_ctx_t *);
static pv_service_t pv_services[PV_N_SERVICES];
#define PV_TABLE_ENTRIES (1u << 20) /* allocation records: 16 MiB of address space, touched as used */
static int pv_staged_ok;
static uint64_t pv_lookups[PV_N_ENTRIES][PV_N_VIA];
static uint64_t pv_mismatches;
static int pv_state = -1; /* PV_BOOT_* once booted */
static char pv_err[1024];  /* why the install failed */
static __thread int pv_in_boot;
const char *pv_boot_mode = "none";

/* ---- name lookup --------------------------------------------------------- */

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

/* ---- real functions ------------------------------------------------------ */

static pthread_once_t pv_real_once = PTHREAD_ONCE_INIT;

static void *open_lib(const char *env, const char *dflt) {
    const char *name = getenv(env);
    if (!name || !*name)
        name = dflt;
    void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    return h ? h : dlopen(name, RTLD_LAZY);
}

static void resolve_real_once(void) {
    void *libs[2] = {open_lib("PYVGPU_REAL_LIBCUDA", "libcuda.so.1"),
                     open_lib("PYVGPU_REAL_LIBNVML", "libnvidia-ml.so.1")};
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        void *h = libs[pv_entry_infos[i].lib];
        pv_ctx.real[i] = h ? (uint64_t)(uintptr_t)pv_real_dlsym(h, pv_entry_infos[i].name) : 0;
    }
    for (int i = 0; i < PV_N_HELPERS; i++) {
        void *h = libs[pv_helper_infos[i].lib];
        pv_ctx.helper[i] = h ? (uint64_t)(uintptr_t)pv_real_dlsym(h, pv_helper_infos[i].name) : 0;
    }
}

void pv_resolve_real(void) { pthread_once(&pv_real_once, resolve_real_once); }

/* ---- bootstrap ----------------------------------------------------------- */

static int limits_requested(void) {
    static const char *const prefixes[] = {"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                                           "PYVGPU_MEMORY", "PYVGPU_SM"};
    for (char **e = environ; e && *e; e++)
        for (unsigned i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
            size_t n = strlen(prefixes[i]);
            const char *eq = strchr(*e, '=');
            if (!strncmp(*e, prefixes[i], n) && eq && eq[1])
                return 1;
        }
    return 0;
}

/* ---- the watcher thread -------------------------------------------------
 * Calls the svc_tick callback ten times a second while this process is in a
 * group: the compute controller steps from it (pyvgpu/jit/compute.py) and
 * quota of dead members comes back within a second. It never takes the GIL
 * and never calls the CUDA driver. */

static void *watcher(void *arg) {
    (void)arg;
    const struct timespec tenth = {0, 100 * 1000 * 1000};
    for (;;) {
        nanosleep(&tenth, NULL);
        pv_service_t tick = __atomic_load_n(&pv_services[PV_S_svc_tick], __ATOMIC_ACQUIRE);
        if (tick && pv_ctx.region)
            tick(&pv_ctx);
    }
    return NULL;
}

static void start_watcher(void) {
    if (!pv_ctx.region || !pv_services[PV_S_svc_tick])
        return;
    pthread_attr_t a;
    pthread_t t;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the program's signals go to its own threads */
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, watcher, NULL) != 0)
        fprintf(stderr, "pyvgpu: warning: cannot start the watcher thread (%s); dead processes' quota "
                        "returns only when an allocation would fail\n", strerror(errno));
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void publish(void) {
    for (int i = 0; i < PV_N_ENTRIES; i++)
        __atomic_store_n(&pv_callbacks[i], pv_staged[i], __ATOMIC_RELEASE);
    start_watcher();
}

static void boot_once(void) {
    pv_in_boot = 1;
    pv_resolve_real();
    if (!pv_staged_ok && !pv_err[0]) {
        if (pv_python_install(pv_err, sizeof pv_err) != 0 && !pv_err[0])
            snprintf(pv_err, sizeof pv_err, "the Python bootstrap did not install them");
    }
    if (pv_staged_ok && pv_ctx.region && !pv_ctx.slot) {
        /* join the group now, at the first GPU call (pyvgpu/jit/quota.py claim_slot) */
        pv_service_t claim = pv_services[PV_S_svc_claim];
        if (!claim || claim(&pv_ctx) < 0) {
            snprintf(pv_err, sizeof pv_err, "the group's region has no free slot (%u processes are members); "
                     "end some, or start a group of your own", pv_ctx.n_slots);
            pv_staged_ok = 0;
        }
    }
    if (pv_staged_ok) {
        publish();
        pv_state = PV_BOOT_READY;
    } else {
        const char *oe = getenv("PYVGPU_ON_ERROR");
        int open = oe && !strcmp(oe, "open");
        int closed = (oe && !strcmp(oe, "closed")) || (!open && limits_requested());
        if (oe && *oe && strcmp(oe, "open") && strcmp(oe, "closed")) {
            fprintf(stderr, "pyvgpu: PYVGPU_ON_ERROR=%s is not 'open' or 'closed'; treating it as 'closed'\n", oe);
            closed = 1;
        }
        if (closed) {
            fprintf(stderr,
                    "pyvgpu: cannot install the callbacks (%s); limits are requested, so CUDA and NVML calls "
                    "are refused. Fix the cause (pyvgpu doctor helps), or set PYVGPU_ON_ERROR=open to run "
                    "without limits.\n",
                    pv_err);
            pv_state = PV_BOOT_REFUSE;
        } else {
            fprintf(stderr,
                    "pyvgpu: warning: cannot install the callbacks (%s); calls pass to the driver unchanged "
                    "(no limits were requested%s).\n",
                    pv_err, open ? ", PYVGPU_ON_ERROR=open" : "");
            pv_state = PV_BOOT_PASSTHROUGH;
        }
    }
    pv_in_boot = 0;
}

static pthread_once_t pv_boot_once_ctl = PTHREAD_ONCE_INIT;

int pv_boot(void) {
    if (pv_in_boot) /* a hooked call made by the bootstrap itself */
        return PV_BOOT_PASSTHROUGH;
    pthread_once(&pv_boot_once_ctl, boot_once);
    return pv_state;
}

/* ---- the API the Python side calls (pyvgpu/shim.py) ---------------------- */

PV_EXPORT const char *pyvgpu_table_hash(void) { return PV_TABLE_HASH; }
PV_EXPORT pv_ctx_t *pyvgpu_ctx(void) { return &pv_ctx; }
PV_EXPORT int pyvgpu_installed(void) { return pv_staged_ok; }

/* The driver's own function behind a hooked ABI name (benchmarks compare it
 * with the hook in one process). NULL for names that are not hooked. */
PV_EXPORT void *pyvgpu_real_function(const char *abi) {
    int e = abi ? pv_find_abi(abi) : -1;
    if (e < 0)
        return NULL;
    pv_resolve_real();
    return pv_real(e);
}
PV_EXPORT const char *pyvgpu_boot_mode(void) { return pv_boot_mode; }

/* Stage the callback addresses, one per entry (0 for entries implemented
 * in C). Returns 0, or -1 with the reason in pyvgpu_last_error(). */
PV_EXPORT int pyvgpu_install(const uint64_t *addrs, uint32_t n, const char *table_hash, const char *mode) {
    if (n != PV_N_ENTRIES || !table_hash || strcmp(table_hash, PV_TABLE_HASH)) {
        snprintf(pv_err, sizeof pv_err,
                 "the shim (table %s, %d entries) and the pyvgpu package (table %s, %u entries) come from "
                 "different builds; reinstall pyvgpu",
                 PV_TABLE_HASH, PV_N_ENTRIES, table_hash ? table_hash : "?", n);
        return -1;
    }
    if (!pv_ctx.table) {
        void *t = mmap(NULL, (size_t)PV_TABLE_ENTRIES * 16, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (t == MAP_FAILED) {
            snprintf(pv_err, sizeof pv_err, "cannot map the allocation table (%s)", strerror(errno));
            return -1;
        }
        pv_ctx.table = (uint64_t)(uintptr_t)t;
        pv_ctx.table_mask = PV_TABLE_ENTRIES - 1;
    }
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        if (pv_entry_infos[i].has_callback && !addrs[i]) {
            snprintf(pv_err, sizeof pv_err, "no callback for %s", pv_entry_infos[i].name);
            return -1;
        }
        pv_staged[i] = (void *)(uintptr_t)addrs[i];
    }
    (void)mode; /* informational; the shim knows whether it is inside pv_boot */
    if (!pv_in_boot) /* installed before the first hooked call: the startup hook */
        pv_boot_mode = "startup";
    pv_err[0] = 0;
    __atomic_store_n(&pv_staged_ok, 1, __ATOMIC_RELEASE);
    return 0;
}

/* Services (pyvgpu.hooks.SERVICES), set by name before pyvgpu_install. */
PV_EXPORT int pyvgpu_set_service(const char *name, uint64_t addr) {
    for (int i = 0; i < PV_N_SERVICES; i++)
        if (name && !strcmp(name, pv_service_names[i])) {
            __atomic_store_n(&pv_services[i], (pv_service_t)(uintptr_t)addr, __ATOMIC_RELEASE);
            return 0;
        }
    return -1;
}

/* The Python side reports why it could not install, so the fail-closed
 * line names the cause and the first hooked call does not retry. */
PV_EXPORT void pyvgpu_set_error(const char *msg) {
    snprintf(pv_err, sizeof pv_err, "%s", msg ? msg : "unknown error");
}

PV_EXPORT const char *pyvgpu_last_error(void) { return pv_err; }

/* ---- stats --------------------------------------------------------------- */

void pv_count_lookup(int entry, int via) { __atomic_add_fetch(&pv_lookups[entry][via], 1, __ATOMIC_RELAXED); }
void pv_count_call(int entry) { __atomic_add_fetch(&pv_ctx.calls[entry], 1, __ATOMIC_RELAXED); }

void pv_note_procaddr_mismatch(const char *symbol, int table_entry, int driver_entry) {
    __atomic_add_fetch(&pv_mismatches, 1, __ATOMIC_RELAXED);
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "pyvgpu: warning: cuGetProcAddress(%s): the hook table chose %s but the driver returned %s; "
                "following the driver%s. Please report this with your driver version.\n",
                symbol, table_entry >= 0 ? pv_entry_infos[table_entry].name : "no variant",
                driver_entry >= 0 ? pv_entry_infos[driver_entry].name : "a variant the table lacks",
                driver_entry >= 0 ? "" : " (that function is not intercepted)");
}

PV_EXPORT uint64_t pyvgpu_lookups(int entry, int via) {
    return (entry >= 0 && entry < PV_N_ENTRIES && via >= 0 && via < PV_N_VIA) ? pv_lookups[entry][via] : 0;
}
PV_EXPORT uint64_t pyvgpu_procaddr_mismatches(void) { return pv_mismatches; }

static int used(void) {
    if (pv_state >= 0)
        return 1;
    for (int i = 0; i < PV_N_ENTRIES; i++)
        if (pv_lookups[i][0] || pv_lookups[i][1] || pv_ctx.calls[i])
            return 1;
    return 0;
}

static void write_text(FILE *f) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    fprintf(f, "pyvgpu stats: pid %d, %s, bootstrap %s, procaddr mismatches %llu\n", (int)getpid(), exe,
            pv_boot_mode, (unsigned long long)pv_mismatches);
    fprintf(f, "  %-32s %12s %8s %10s\n", "symbol", "calls", "dlsym", "procaddr");
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        uint64_t c = pv_ctx.calls[i], d = pv_lookups[i][PV_VIA_DLSYM], p = pv_lookups[i][PV_VIA_PROCADDR];
        if (c || d || p)
            fprintf(f, "  %-32s %12llu %8llu %10llu\n", pv_entry_infos[i].name, (unsigned long long)c,
                    (unsigned long long)d, (unsigned long long)p);
    }
}

static void write_json(FILE *f) {
    fprintf(f, "{\"pid\": %d, \"bootstrap\": \"%s\", \"procaddr_mismatches\": %llu, \"symbols\": {", (int)getpid(),
            pv_boot_mode, (unsigned long long)pv_mismatches);
    int first = 1;
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        uint64_t c = pv_ctx.calls[i], d = pv_lookups[i][PV_VIA_DLSYM], p = pv_lookups[i][PV_VIA_PROCADDR];
        if (!(c || d || p))
            continue;
        fprintf(f, "%s\"%s\": {\"calls\": %llu, \"dlsym\": %llu, \"procaddr\": %llu}", first ? "" : ", ",
                pv_entry_infos[i].name, (unsigned long long)c, (unsigned long long)d, (unsigned long long)p);
        first = 0;
    }
    fprintf(f, "}}\n");
}

/* PYVGPU_STATS=1: a table on stderr at exit. PYVGPU_STATS=PATH: JSON appended
 * to PATH, where %p becomes the pid. */
static void print_stats(void) {
    const char *s = getenv("PYVGPU_STATS");
    if (!s || !*s || !strcmp(s, "0") || !used())
        return;
    if (!strcmp(s, "1")) {
        write_text(stderr);
        return;
    }
    char path[1024];
    size_t o = 0;
    for (const char *c = s; *c && o + 12 < sizeof path; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            o += snprintf(path + o, sizeof path - o, "%d", (int)getpid());
            c++;
        } else {
            path[o++] = *c;
        }
    }
    path[o] = 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "pyvgpu: cannot write stats to %s (%s); set PYVGPU_STATS to a writable path or 1\n",
                path, strerror(errno));
        return;
    }
    write_json(f);
    fclose(f);
}

/* A forked child counts its own calls and is its own member of the group:
 * it opens the region file anew (its own open file description, so its own
 * locks), drops the parent's description, claims a slot, and starts with an
 * empty allocation table (the parent's CUDA allocations are not its own). */
static void atfork_child(void) {
    memset(pv_ctx.calls, 0, sizeof pv_ctx.calls);
    memset(pv_lookups, 0, sizeof pv_lookups);
    pv_mismatches = 0;
    memset(pv_ctx.pool_handle, 0, sizeof pv_ctx.pool_handle);
    memset(pv_ctx.pool_reserved, 0, sizeof pv_ctx.pool_reserved);
    pv_ctx.lock = 0;
    /* The child takes turns on the GPU as a process of its own: a new id, drawn at its next lookup. */
    pv_ctx.turn_id = 0;
    memset(pv_ctx.turn_entry, 0, sizeof pv_ctx.turn_entry);
    memset(pv_ctx.turn_since, 0, sizeof pv_ctx.turn_since);
    memset(pv_ctx.turn_qend, 0, sizeof pv_ctx.turn_qend);
    pv_ctx.drain_ev = pv_ctx.drain_ctx = 0;
    if (pv_ctx.table) {
        void *t = mmap(NULL, (size_t)PV_TABLE_ENTRIES * 16, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        pv_ctx.table = t == MAP_FAILED ? 0 : (uint64_t)(uintptr_t)t;
        pv_ctx.table_maxdisp = pv_ctx.table_live = pv_ctx.table_full = 0;
    }
    if (!pv_ctx.region)
        return;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", pv_ctx.region_fd);
    int fd = open(path, O_RDWR | O_CLOEXEC); /* our own open file description, so our own locks */
    close(pv_ctx.region_fd);
    pv_ctx.region_fd = fd;
    int member = pv_ctx.slot != 0;
    pv_ctx.slot = 0;
    pv_ctx.slot_index = -1;
    if (!member)
        return; /* the parent had not joined yet: the child joins at its own first GPU call */
    pv_service_t claim = pv_services[PV_S_svc_claim];
    if (fd < 0 || !claim || claim(&pv_ctx) < 0) {
        /* No slot: the child must not allocate against the group unseen. */
        fprintf(stderr, "pyvgpu: forked child %d cannot join its group (%s); its CUDA calls are refused\n",
                (int)getpid(), fd < 0 ? strerror(errno) : "no free slot in the region");
        for (int i = 0; i < PV_N_ENTRIES; i++)
            pv_callbacks[i] = NULL;
        pv_state = PV_BOOT_REFUSE;
        return;
    }
    start_watcher();
}

__attribute__((constructor)) static void pv_init(void) { pthread_atfork(NULL, NULL, atfork_child); }
__attribute__((destructor)) static void pv_fini(void) { print_stats(); }
