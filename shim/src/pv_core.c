/* The boot: the bootstrap state machine, the watcher thread and fork.
 *
 * The first hooked call runs pv_boot(), once: it resolves the real driver
 * functions, loads the compiled callbacks (pv_load.c), joins the process's
 * group (pv_attach.c), claims a slot in it, then publishes the callbacks.
 * No interpreter is involved, whatever the program is: a C program, a
 * Python of any version with or without pyvgpu importable, a JVM. A process
 * that never touches CUDA or NVML never loads libcuda or the callbacks
 * because of us.
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

static void *pv_staged[PV_N_ENTRIES];
static void *pv_services[PV_N_SERVICES]; /* typed by the generated pv_<name>_t (pv_table.h) */
#define PV_TABLE_ENTRIES (1u << 20) /* allocation records: 16 MiB of address space, touched as used */
static int pv_staged_ok;
static char pv_err[1024]; /* why the install failed */
static __thread int pv_in_boot;

#define SERVICE(name) ((pv_##name##_t)__atomic_load_n(&pv_services[PV_S_##name], __ATOMIC_ACQUIRE))

/* ---- bootstrap ----------------------------------------------------------- */

/* Whether the region file at path asks for limits: 0 if it is one of ours
 * with no memory cap and no compute share on any device, else 1 (also when
 * it cannot be read: what it asks for is unknown, so it counts). Read with
 * pread: a file someone truncates cannot crash us; O_NONBLOCK: a FIFO there
 * cannot stall us. */
static int region_has_limits(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 1;
    pv_region_header_t h;
    pv_region_device_t d[PV_MAX_DEVICES];
    int found = 1;
    if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == PV_REGION_MAGIC &&
        h.version == PV_REGION_VERSION && pread(fd, d, sizeof d, PV_REGION_DEVICES_OFF) == (ssize_t)sizeof d) {
        found = 0;
        for (int i = 0; i < PV_MAX_DEVICES; i++)
            found |= d[i].limit != 0 || d[i].sm_limit != 0;
    }
    close(fd);
    return found;
}

/* What was asked for, for the fail-closed and fail-open messages: each
 * variable that asks for limits as NAME=value ("" when none is set). A
 * group's region counts (PYVGPU_REGION, HAMi's CUDA_DEVICE_MEMORY_SHARED_CACHE):
 * a program may have removed CUDA_DEVICE_MEMORY_LIMIT from its own
 * environment, but the group's limits live in the file. */
static const char *limits_requested(char *out, size_t len) {
    static const char *const prefixes[] = {PV_ENV_CUDA_DEVICE_MEMORY_LIMIT, PV_ENV_CUDA_DEVICE_SM_LIMIT,
                                           PV_ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, PV_ENV_REGION};
    size_t o = 0;
    out[0] = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !eq[1])
            continue;
        for (unsigned i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
            size_t n = strlen(prefixes[i]);
            if (strncmp(*e, prefixes[i], n) || !(eq - *e == (ptrdiff_t)n || (*e)[n] == '_'))
                continue;
            if (i >= 2 && !region_has_limits(eq + 1))
                break; /* a group without limits asks for nothing to be enforced */
            if (o + strlen(*e) + 3 < len)
                o += snprintf(out + o, len - o, "%s%s", o ? ", " : "", *e);
            break;
        }
    }
    return out;
}

/* ---- the watcher thread -------------------------------------------------
 * Calls the svc_tick callback ten times a second while this process is in a
 * group: the compute controller steps from it (pyvgpu/jit/compute/controller.py) and
 * quota of dead members comes back within a second. It never takes the GIL
 * and never calls the CUDA driver. */

static void *watcher(void *arg) {
    (void)arg;
    /* It starts with every signal blocked, but a fault it causes must reach the SIGBUS guard
     * (pv_guard.c): a blocked fault signal kills the process whatever its handler. */
    sigset_t faults;
    sigemptyset(&faults);
    sigaddset(&faults, SIGBUS);
    sigaddset(&faults, SIGSEGV);
    pthread_sigmask(SIG_UNBLOCK, &faults, NULL);
    const struct timespec tenth = {0, 100 * 1000 * 1000};
    for (;;) {
        nanosleep(&tenth, NULL);
        pv_svc_tick_t tick = SERVICE(svc_tick);
        if (tick && pv_ctx.region)
            tick(&pv_ctx);
    }
    return NULL;
}

static void start_watcher(void) {
    if (!pv_ctx.region || !SERVICE(svc_tick))
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

/* The timing gate's page: written before CUDA pins it (an untouched anonymous page could be pinned as the
 * shared zero page, which the first write then replaces), and not inherited by a fork (pinned memory). */
static void map_gate_page(void) {
    void *g = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g == MAP_FAILED) {
        pv_ctx.gate_page = 0;
        return;
    }
    memset(g, 0, 4096);
    madvise(g, 4096, MADV_DONTFORK);
    pv_ctx.gate_page = (uint64_t)(uintptr_t)g;
}

/* Stage the library's callbacks and services; 0, or -1 with the reason in pv_err. */
static int stage(const pv_cblib_t *lib) {
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
    if (!pv_ctx.gate_page) {
        /* the timing gate's words (pyvgpu/jit/compute/cost.py): a page of our own, never unmapped, so a
         * write to it stays safe whatever CUDA does with its registration; none: timings go ungated */
        map_gate_page();
    }
    for (int i = 0; i < PV_N_SERVICES; i++)
        __atomic_store_n(&pv_services[i], (void *)(uintptr_t)lib->services[i], __ATOMIC_RELEASE);
    for (int i = 0; i < PV_N_ENTRIES; i++)
        pv_staged[i] = (void *)(uintptr_t)lib->entries[i];
    __atomic_store_n(&pv_staged_ok, 1, __ATOMIC_RELEASE);
    return 0;
}

static void install(void) {
    const pv_cblib_t *lib = pv_load_callbacks(pv_err, sizeof pv_err);
    if (!lib)
        return;
    if (pv_attach(pv_err, sizeof pv_err) != 0)
        return;
    if (stage(lib) == 0)
        pv_boot_mode = "native";
}

static void boot_once(void) {
    pv_in_boot = 1;
    pv_resolve_real();
    install();
    if (!pv_staged_ok && !pv_err[0])
        snprintf(pv_err, sizeof pv_err, "the callbacks were not installed (no reason given: a bug)");
    if (pv_staged_ok && pv_ctx.region && !pv_ctx.slot) {
        /* join the group now, at the first GPU call (pyvgpu/jit/state/quota.py claim_slot) */
        pv_svc_claim_t claim = SERVICE(svc_claim);
        if (!claim || claim(&pv_ctx) < 0) {
            snprintf(pv_err, sizeof pv_err, "the group's region has no free slot (%u processes are members); "
                     "end some, or start a group of your own", pv_ctx.n_slots);
            pv_staged_ok = 0;
        }
    }
    if (pv_staged_ok) {
        publish();
        pv_boot_state = PV_BOOT_READY;
    } else {
        char asked[768];
        limits_requested(asked, sizeof asked);
        const char *oe = getenv(PV_ENV_ON_ERROR);
        int open = oe && !strcmp(oe, "open");
        int closed = (oe && !strcmp(oe, "closed")) || (!open && asked[0]);
        if (oe && *oe && strcmp(oe, "open") && strcmp(oe, "closed")) {
            fprintf(stderr, "pyvgpu: PYVGPU_ON_ERROR=%s is not 'open' or 'closed'; treating it as 'closed'\n", oe);
            closed = 1;
        }
        if (closed) {
            fprintf(stderr,
                    "pyvgpu: cannot install the callbacks (%s); limits are requested (%s), so CUDA and NVML "
                    "calls are refused. Fix the cause (pyvgpu doctor helps), or set PYVGPU_ON_ERROR=open to run "
                    "without limits.\n",
                    pv_err, asked[0] ? asked : "PYVGPU_ON_ERROR=closed");
            pv_boot_state = PV_BOOT_REFUSE;
        } else if (asked[0]) {
            fprintf(stderr,
                    "pyvgpu: warning: cannot install the callbacks (%s); PYVGPU_ON_ERROR=open, so calls pass to "
                    "the driver unchanged and the limits requested by %s are NOT enforced.\n",
                    pv_err, asked);
            pv_boot_state = PV_BOOT_PASSTHROUGH;
        } else {
            fprintf(stderr,
                    "pyvgpu: warning: cannot install the callbacks (%s); calls pass to the driver unchanged "
                    "(no limits or group were requested%s).\n",
                    pv_err, open ? ", PYVGPU_ON_ERROR=open" : "");
            pv_boot_state = PV_BOOT_PASSTHROUGH;
        }
    }
    pv_in_boot = 0;
}

static pthread_once_t pv_boot_once_ctl = PTHREAD_ONCE_INIT;

int pv_boot(void) {
    if (pv_in_boot) /* a hooked call made by the bootstrap itself */
        return PV_BOOT_PASSTHROUGH;
    pthread_once(&pv_boot_once_ctl, boot_once);
    return pv_boot_state;
}

/* ---- what Python tools and tests read (pyvgpu/native/shim.py) ------------------- */

PV_EXPORT const char *pyvgpu_table_hash(void) { return PV_TABLE_HASH; }
PV_EXPORT pv_ctx_t *pyvgpu_ctx(void) { return &pv_ctx; }
PV_EXPORT int pyvgpu_installed(void) { return pv_staged_ok; }

PV_EXPORT const char *pyvgpu_boot_mode(void) { return pv_boot_mode; }
PV_EXPORT const char *pyvgpu_callbacks_path(void) { return pv_callbacks_path; }

PV_EXPORT const char *pyvgpu_last_error(void) { return pv_err; }

/* A forked child counts its own calls and is its own member of the group:
 * it opens the region file anew (its own open file description, so its own
 * locks), drops the parent's description, claims a slot, and starts with an
 * empty allocation table (the parent's CUDA allocations are not its own). */
static void atfork_child(void) {
    pv_stats_reset();
    memset(pv_ctx.pool_handle, 0, sizeof pv_ctx.pool_handle);
    memset(pv_ctx.pool_reserved, 0, sizeof pv_ctx.pool_reserved);
    pv_ctx.lock = 0;
    /* The child takes turns on the GPU as a process of its own: a new id, drawn at its next lookup. */
    pv_ctx.turn_id = 0;
    pv_ctx.launch_dev = 0; /* its contexts are its own (pyvgpu/jit/runtime/context.py note_context) */
    for (size_t d = 0; d < sizeof pv_ctx.dev / sizeof pv_ctx.dev[0]; d++) {
        pv_ctx.dev[d].turn_entry = pv_ctx.dev[d].turn_since = pv_ctx.dev[d].turn_qend = pv_ctx.dev[d].turn_held = 0;
        pv_ctx.dev[d].turn_waited = 0; /* the parent's waits are not the child's debt */
        pv_ctx.dev[d].turn_mine = 0; /* the parent's turn is not the child's to lose */
    }
    /* the parent's streams and events are not the child's (pyvgpu/jit/compute/drain.py) */
    for (size_t i = 0; i < sizeof pv_ctx.stream / sizeof pv_ctx.stream[0]; i++)
        pv_ctx.stream[i].turn_stream = pv_ctx.stream[i].turn_stream_ev = 0;
    pv_ctx.turn_stream_lock = 0;
    pv_ctx.drain_ev = pv_ctx.drain_ctx = 0;
    /* the parent's timing gate (pyvgpu/jit/compute/cost.py) is not the child's, nor its page (not inherited):
     * a child whose parent had a gate times ungated; one whose parent had none yet gets a page of its own */
    memset(pv_ctx.samp_gate_ns, 0, sizeof pv_ctx.samp_gate_ns);
    if (pv_ctx.gate_host != 0)
        pv_ctx.gate_host = 1;
    else if (pv_ctx.gate_page)
        map_gate_page();
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
    pv_svc_claim_t claim = SERVICE(svc_claim);
    if (fd < 0 || !claim || claim(&pv_ctx) < 0) {
        /* No slot: the child must not allocate against the group unseen. */
        fprintf(stderr, "pyvgpu: forked child %d cannot join its group (%s); its CUDA calls are refused\n",
                (int)getpid(), fd < 0 ? strerror(errno) : "no free slot in the region");
        for (int i = 0; i < PV_N_ENTRIES; i++)
            pv_callbacks[i] = NULL;
        pv_boot_state = PV_BOOT_REFUSE;
        return;
    }
    start_watcher();
}

__attribute__((constructor)) static void pv_init(void) { pthread_atfork(NULL, NULL, atfork_child); }
