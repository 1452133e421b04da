/* Mapped shared files that another process truncates: no SIGBUS.
 *
 * The callbacks work on the group's region and the machine's turn file
 * through shared mappings. Touching a mapped page past the end of its file is
 * a SIGBUS, so a process that can write either file could kill every member
 * by truncating it. Sizes are checked before mapping (pyvgpu/native/safefile.py);
 * this covers a truncation afterwards. The mappings are registered here, and
 * a SIGBUS inside one of them replaces that mapping with private zero pages
 * (mmap MAP_FIXED, async-signal-safe), so the faulting access runs again and
 * succeeds:
 *
 *   - the turn file: the process stops taking turns (every word it reads is
 *     free, on a page of its own), its launches time-slice the GPU;
 *   - the region: its limits can no longer be enforced, so the process fails
 *     closed: the copy gets a 1-byte cap on every device, and every later
 *     CUDA and NVML call is refused.
 *
 * One line on stderr says which. A SIGBUS anywhere else goes to the handler
 * that was there before (the program's, or the default: the process dies
 * as it would have without pyvgpu). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pv_shim.h"

#define PV_GUARDS 8

static struct {
    uintptr_t addr;
    size_t size;
    int kind;
    int hit;
} pv_guards[PV_GUARDS];
static int pv_n_guards;
static struct sigaction pv_old_bus;
static int pv_guard_installed;

static void say(const char *msg) {
    ssize_t r = write(2, msg, strlen(msg));
    (void)r;
}

static void fail_closed_copy(uintptr_t addr) {
    pv_region_device_t *d = (pv_region_device_t *)(addr + PV_REGION_DEVICES_OFF);
    for (int i = 0; i < PV_MAX_DEVICES; i++)
        d[i].limit = 1; /* nothing more can be charged: in-flight allocations are refused */
    for (int i = 0; i < PV_N_ENTRIES; i++)
        __atomic_store_n(&pv_callbacks[i], NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&pv_boot_state, PV_BOOT_REFUSE, __ATOMIC_RELEASE); /* every later call is refused */
}

static void chain(int sig, siginfo_t *si, void *uc) {
    if ((pv_old_bus.sa_flags & SA_SIGINFO) && pv_old_bus.sa_sigaction) {
        pv_old_bus.sa_sigaction(sig, si, uc);
        return;
    }
    if (!(pv_old_bus.sa_flags & SA_SIGINFO) && pv_old_bus.sa_handler != SIG_DFL &&
        pv_old_bus.sa_handler != SIG_IGN) {
        pv_old_bus.sa_handler(sig);
        return;
    }
    /* The default action: put it back; a fault repeats when we return, a sent signal is sent again
     * (sigaction and raise are async-signal-safe, signal() is not). */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (si->si_code <= 0)
        raise(SIGBUS);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    int n = __atomic_load_n(&pv_n_guards, __ATOMIC_ACQUIRE);
    if (si->si_code > 0)
        for (int i = 0; i < n; i++) {
            if (a < pv_guards[i].addr || a - pv_guards[i].addr >= pv_guards[i].size)
                continue;
            if (__atomic_exchange_n(&pv_guards[i].hit, 1, __ATOMIC_ACQ_REL))
                return; /* another thread is replacing it: the access repeats until it is done */
            void *m = mmap((void *)pv_guards[i].addr, pv_guards[i].size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (m == MAP_FAILED)
                break;
            if (pv_guards[i].kind == PV_GUARD_REGION) {
                fail_closed_copy(pv_guards[i].addr);
                say("pyvgpu: the group's region file was truncated by another process, so its limits cannot "
                    "be enforced: this process's CUDA and NVML calls are refused from now on. Start the group "
                    "again; see docs/security.md\n");
            } else {
                say("pyvgpu: the turn file was truncated by another process; this process stops taking turns "
                    "(its launches time-slice the GPU). `pyvgpu doctor` names the file\n");
            }
            return;
        }
    chain(sig, si, uc);
}

PV_EXPORT int pyvgpu_guard(uint64_t addr, uint64_t size, int kind) {
    if (!addr || !size || (kind != PV_GUARD_REGION && kind != PV_GUARD_TURNS))
        return -1;
    int i = __atomic_load_n(&pv_n_guards, __ATOMIC_ACQUIRE);
    if (i >= PV_GUARDS)
        return -1;
    pv_guards[i].addr = (uintptr_t)addr;
    pv_guards[i].size = (size_t)size;
    pv_guards[i].kind = kind;
    pv_guards[i].hit = 0;
    __atomic_store_n(&pv_n_guards, i + 1, __ATOMIC_RELEASE);
    if (!__atomic_exchange_n(&pv_guard_installed, 1, __ATOMIC_ACQ_REL)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &pv_old_bus) != 0)
            return -1;
    }
    return 0;
}
