/* Joining the process's group, with no interpreter: the region file named by
 * PYVGPU_REGION or HAMi's CUDA_DEVICE_MEMORY_SHARED_CACHE is opened and
 * checked (pv_group_region.c, created there first when it does not exist yet,
 * so a container started by HAMi's device plugin, or a program started with
 * LD_PRELOAD and a limit but no region, needs no Python either), mapped and
 * guarded here, the turn file too (pv_group_turns.c), and the context is
 * filled. The group core (pv_group_*.c, pv_env.c, pv_grammar.c) is also
 * built alone as libpyvgpu_group.so, which pyvgpu's commands reach through
 * ctypes: one implementation of the group protocol.
 *
 * Every mapping's size is checked right before mapping it, and the mapping is
 * registered with the SIGBUS guard (pv_guard.c).
 *
 * The slot itself is claimed later, at the first GPU call (svc_claim). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pv_shim.h"

extern char **environ;

/* region.map_forever: mapped (pv_map_shared, its size checked right before), registered with the guard */
static void *map_shared(int fd, uint64_t size, int guard, const char *path, const char *what, const char *fix,
                        char *err, size_t n) {
    void *m = pv_map_shared(fd, size, path, what, fix, err, n);
    if (m)
        pyvgpu_guard((uint64_t)(uintptr_t)m, size, guard);
    return m;
}

/* ---- the turn file (pv_group_turns.c) ----------------------------------- */

/* sched.attach: the turn file mapped (never unmapped) and guarded; 0 with err set on failure */
static uint64_t map_turns(const pv_env_t *env, char *err, size_t n) {
    char p[1024], fix[1400], why[512];
    int own, kind;
    if (pv_turn_path(getenv(PV_ENV_SCHED), PV_SHM_TURNS, env->trust_shared, p, sizeof p, &own, why, sizeof why, err, n))
        return 0;
    int fd = pv_use_turns(p, PV_SHM_TURNS, env->trust_shared, err, n, &kind); /* made if missing, checked */
    if (fd < 0)
        return 0;
    pv_turns_fix(p, fix, sizeof fix);
    void *m = map_shared(fd, PV_SCHED_SIZE, PV_GUARD_TURNS, p, "the turn file", fix, err, n);
    close(fd);
    return (uint64_t)(uintptr_t)m;
}

/* ---- the compute check before making a private group -------------------- */

typedef int (*nvml_void_t)(void);
typedef int (*nvml_count_t)(unsigned int *);
typedef int (*nvml_handle_t)(unsigned int, void **);
typedef int (*nvml_util_t)(void *, unsigned int *);

/* devices.utilization_problem: can NVML measure these devices' utilization? */
static int utilization_problem(const pv_env_t *env, char *why, size_t n) {
    nvml_void_t init = (nvml_void_t)pv_real(PV_E_nvmlInit_v2);
    nvml_count_t count = (nvml_count_t)pv_real(PV_E_nvmlDeviceGetCount_v2);
    nvml_handle_t handle = (nvml_handle_t)pv_real(PV_E_nvmlDeviceGetHandleByIndex_v2);
    nvml_util_t util = (nvml_util_t)pv_real(PV_E_nvmlDeviceGetUtilizationRates);
    if (!init || !count || !handle || !util) {
        snprintf(why, n, "NVML (libnvidia-ml.so.1) cannot be loaded");
        return -1;
    }
    int rc = init();
    if (rc != 0) {
        snprintf(why, n, "NVML does not initialise (nvmlReturn_t %d)", rc);
        return -1;
    }
    unsigned int ndev = 0;
    if (count(&ndev) != 0) {
        snprintf(why, n, "NVML cannot count the devices");
        return -1;
    }
    int limited = 0;
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        limited += env->sm[d] > 0 && env->sm[d] < 100;
    int every = limited == PV_MAX_DEVICES; /* a share for every device: those the machine lacks do not count */
    for (unsigned d = 0; d < PV_MAX_DEVICES; d++) {
        if (!(env->sm[d] > 0 && env->sm[d] < 100))
            continue;
        if (d >= ndev) {
            if (every)
                continue;
            snprintf(why, n, "there is no device %u (this machine has %u)", d, ndev);
            return -1;
        }
        void *h = NULL;
        unsigned int u[2];
        if (handle(d, &h) != 0) {
            snprintf(why, n, "NVML cannot open device %u", d);
            return -1;
        }
        if ((rc = util(h, u)) != 0) {
            snprintf(why, n, "NVML does not report device %u's utilization (nvmlReturn_t %d)", d, rc);
            return -1;
        }
    }
    return 0;
}

/* ---- the launch clock (pyvgpu/jit/runtime/clock.py) -------------------------------- */

/* 1 if launches extrapolate CLOCK_MONOTONIC from the TSC: asked (PYVGPU_CLOCK=tsc), or by default where the
 * kernel keeps CLOCK_MONOTONIC on the TSC itself (it found the counter invariant and synchronized across
 * CPUs); 0 for the system clock at every launch; -1 with err when the TSC was asked for and there is none. */
static int clock_mode(int asked, char *err, size_t n) {
#if defined(__x86_64__)
    if (asked)
        return asked == 1;
    char cs[32] = "";
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t r = read(fd, cs, sizeof cs - 1);
        close(fd);
        cs[r > 0 ? r : 0] = 0;
    }
    return !strcmp(cs, "tsc\n");
#else
    if (asked == 1) {
        snprintf(err, n, "PYVGPU_CLOCK=tsc: this CPU has no time-stamp counter pyvgpu can read (x86-64 only); "
                 "unset it or give auto or system");
        return -1;
    }
    return 0;
#endif
}

/* ---- attach -------------------------------------------------------------- */

int pv_attach(char *err, size_t n) {
    pv_env_t env;
    if (pv_read_env(environ, &env, err, n))
        return -1;
    char path[1024];
    if (!env.region) {
        if (!env.any_memory && !env.any_sm)
            return 0; /* no group and no limits: nothing to account */
        /* not started by `pyvgpu wrap` or a device plugin, which make the region first */
        char why[256];
        int limited = 0;
        for (int d = 0; d < PV_MAX_DEVICES; d++)
            limited |= env.sm[d] > 0 && env.sm[d] < 100;
        if (limited && utilization_problem(&env, why, sizeof why)) {
            snprintf(err, n, "CUDA_DEVICE_SM_LIMIT: %s, so a compute share cannot be enforced; unset it (memory "
                     "limits work without it)", why);
            return -1;
        }
        if (pv_private_path(path, sizeof path, err, n))
            return -1;
        if (pv_create_region(path, &env, err, n))
            return -1;
        setenv(PV_ENV_REGION, path, 1); /* children join this group */
    } else {
        snprintf(path, sizeof path, "%s", env.region);
    }
    pv_region_header_t h;
    int kind;
    int clk = clock_mode(env.clock, err, n);
    if (clk < 0)
        return -1;
    int fd = pv_open_region(path, 1, env.trust_shared, &h, err, n, &kind);
    if (fd < 0 && kind == PV_OPEN_MISSING && pv_create_region(path, &env, err, n) == 0)
        fd = pv_open_region(path, 1, env.trust_shared, &h, err, n, &kind);
    if (fd < 0) {
        if (env.region_var) { /* name the variable that named the file */
            char why[1024];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, n, "%s: %s", env.region_var, why);
        }
        return -1;
    }
    void *m = map_shared(fd, h.size, PV_GUARD_REGION, path, "the group region", "remove it and start again", err,
                         n); /* never unmapped */
    if (!m) {
        close(fd);
        return -1;
    }
    const pv_region_device_t *dev = (const pv_region_device_t *)((char *)m + PV_REGION_DEVICES_OFF);
    if (pv_check_group(path, &h, dev, &env, err, n)) {
        close(fd); /* the mapping stays (guarded, unused): a refused process makes no more calls */
        return -1;
    }
    uint64_t sched = 0;
    int shared = 0;
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        shared |= dev[d].sm_limit > 0 && dev[d].sm_limit < 100;
    /* Every group takes part in the GPU's turns (pyvgpu/jit/compute/turn.py): one with a share, one without (best
     * effort, while a group with a share takes turns), one given a share later by a live change. A group
     * with a share cannot run without them; one without runs on, said once, when the file is unusable (the
     * groups with a share refuse it too). */
    uint64_t acct = 0;
    if (env.turns && !(sched = map_turns(&env, err, n))) {
        if (shared) {
            close(fd);
            return -1;
        }
        fprintf(stderr, "pyvgpu: warning: %s; this program does not take turns on the GPU\n", err);
        err[0] = 0;
    } else if (env.turns) {
        acct = sched;
    } else {
        /* Time-sliced (PYVGPU_SM_TURN=0), a group with a share still adds its charge to the GPU's entry in the
         * turn file, taking no turns: beside others the controller compares every group's charge with NVML's
         * busy time (pyvgpu/jit/compute/controller.py). Without it the share stays a cap, never corrected. A
         * group without a share maps it too, unused until a live change gives it one (an entry is looked up at
         * its first timed launch under a share: gpuentry.account); quietly, as it may never get one: a
         * memory-only group that set PYVGPU_SM_TURN=0 because the file was unusable is not told again. */
        if (!(acct = map_turns(&env, err, n)) && !shared) {
            err[0] = 0; /* quietly: nothing to correct unless a live change gives this group a share */
        } else if (!acct) {
            /* the file's usual fixes end with "or set PYVGPU_SM_TURN=0", which is set: not that one */
            static const char *const tails[] = {", or set PYVGPU_SM_TURN=0", ", or PYVGPU_SM_TURN=0"};
            for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
                char *at = strstr(err, tails[i]);
                if (at)
                    *at = 0;
            }
            fprintf(stderr, "pyvgpu: warning: %s; the compute share stays a cap but is not corrected beside other "
                    "groups (PYVGPU_SM_TURN=0 still maps the turn file for that)\n", err);
            err[0] = 0;
        }
    }
    pv_ctx.sm_policy = env.sm_policy;
    pv_ctx.sm_batch_ns = env.sm_batch_ns;
    pv_ctx.clk_mode = (uint32_t)clk;
    pv_ctx.region = (uint64_t)(uintptr_t)m;
    pv_ctx.sched = sched;
    pv_ctx.acct = acct;
    pv_ctx.region_fd = fd;
    pv_ctx.n_slots = h.n_slots;
    pv_ctx.slot = 0;
    pv_ctx.slot_index = -1;
    if (h.n_visible) {
        char list[256] = "";
        size_t o = 0;
        for (uint32_t g = 0; g < h.n_visible && g < PV_MAX_DEVICES && o < sizeof list - 12; g++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%u%s", g ? "," : "", h.visible[g] & 0x7fffffffu,
                                  h.visible[g] & 0x80000000u ? " (a MIG instance)" : "");
        snprintf((char *)pv_ctx.devices_msg, sizeof pv_ctx.devices_msg,
                 "pyvgpu: CUDA in this process does not see its vGPU's devices (nvidia-smi's %s), in that order: "
                 "CUDA_VISIBLE_DEVICES was changed inside the program. Choose devices with `pyvgpu wrap "
                 "--devices`, not in the program. Its GPU use is refused.\n", list);
    }
    return 0;
}
