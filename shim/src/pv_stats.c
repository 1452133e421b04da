/* Per-symbol statistics: calls (counted by the callbacks in pv_ctx.entry[].calls),
 * lookups by each path (dlsym, cuGetProcAddress), and cuGetProcAddress
 * answers that disagreed with the hook table. Printed at exit under
 * PYVGPU_STATS. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_shim.h"

static uint64_t pv_lookups[PV_N_ENTRIES][PV_N_VIA];
static uint64_t pv_mismatches;

void pv_count_lookup(int entry, int via) { __atomic_add_fetch(&pv_lookups[entry][via], 1, __ATOMIC_RELAXED); }
void pv_count_call(int entry) {
    if (pv_ctx.count_calls)
        __atomic_add_fetch(&pv_ctx.entry[entry].calls, 1, __ATOMIC_RELAXED);
}

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

/* A forked child counts its own calls. */
void pv_stats_reset(void) {
    for (size_t i = 0; i < sizeof pv_ctx.entry / sizeof pv_ctx.entry[0]; i++)
        pv_ctx.entry[i].calls = 0;
    memset(pv_lookups, 0, sizeof pv_lookups);
    pv_mismatches = 0;
}

static int used(void) {
    if (pv_boot_state >= 0)
        return 1;
    for (int i = 0; i < PV_N_ENTRIES; i++)
        if (pv_lookups[i][0] || pv_lookups[i][1] || pv_ctx.entry[i].calls)
            return 1;
    return 0;
}

static void write_text(FILE *f) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    fprintf(f, "pyvgpu stats: pid %d, %s, bootstrap %s, procaddr mismatches %llu\n", (int)getpid(), exe,
            pv_boot_mode, (unsigned long long)pv_mismatches);
    if (pv_callbacks_path[0])
        fprintf(f, "  callbacks %s\n", pv_callbacks_path);
    fprintf(f, "  %-32s %12s %8s %10s\n", "symbol", "calls", "dlsym", "procaddr");
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        uint64_t c = pv_ctx.entry[i].calls, d = pv_lookups[i][PV_VIA_DLSYM], p = pv_lookups[i][PV_VIA_PROCADDR];
        if (c || d || p)
            fprintf(f, "  %-32s %12llu %8llu %10llu\n", pv_entry_infos[i].name, (unsigned long long)c,
                    (unsigned long long)d, (unsigned long long)p);
    }
}

static void write_json(FILE *f) {
    fprintf(f, "{\"pid\": %d, \"bootstrap\": \"%s\", \"callbacks\": \"", (int)getpid(), pv_boot_mode);
    for (const char *c = pv_callbacks_path; *c; c++) /* a path, as a JSON string */
        fprintf(f, (unsigned char)*c < 0x20 || *c == '"' || *c == '\\' ? "\\u%04x" : "%c", (unsigned char)*c);
    fprintf(f, "\", \"procaddr_mismatches\": %llu, \"symbols\": {", (unsigned long long)pv_mismatches);
    int first = 1;
    for (int i = 0; i < PV_N_ENTRIES; i++) {
        uint64_t c = pv_ctx.entry[i].calls, d = pv_lookups[i][PV_VIA_DLSYM], p = pv_lookups[i][PV_VIA_PROCADDR];
        if (!(c || d || p))
            continue;
        fprintf(f, "%s\"%s\": {\"calls\": %llu, \"dlsym\": %llu, \"procaddr\": %llu}", first ? "" : ", ",
                pv_entry_infos[i].name, (unsigned long long)c, (unsigned long long)d, (unsigned long long)p);
        first = 0;
    }
    fprintf(f, "}}\n");
}

/* Calls are counted only for these statistics: otherwise an atomic add per hooked call that nobody reads. */
static int stats_wanted(void) {
    const char *s = getenv(PV_ENV_STATS);
    return s && *s && strcmp(s, "0");
}

/* PYVGPU_STATS=1: a table on stderr at exit. PYVGPU_STATS=PATH: JSON appended
 * to PATH, where %p becomes the pid. */
static void print_stats(void) {
    const char *s = getenv(PV_ENV_STATS);
    if (!stats_wanted() || !used())
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
    /* Appended to a file of this user only: a link planted at the path is not followed (O_NOFOLLOW), a
     * FIFO does not block the exit (O_NONBLOCK, then refused), a file of another user is left alone. */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    struct stat st;
    const char *why = NULL;
    if (fd < 0)
        why = errno == ELOOP ? "it is a symbolic link, which pyvgpu does not follow" : strerror(errno);
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        why = "it is not a regular file";
    else if (st.st_uid != geteuid())
        why = "it belongs to another user";
    FILE *f = why ? NULL : fdopen(fd, "a");
    if (!f) {
        fprintf(stderr, "pyvgpu: cannot write stats to %s (%s); set PYVGPU_STATS to a path of your own or 1\n",
                path, why ? why : strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    write_json(f);
    fclose(f);
}

__attribute__((constructor)) static void pv_stats_init(void) { pv_ctx.count_calls = (uint32_t)stats_wanted(); }
__attribute__((destructor)) static void pv_stats_fini(void) { print_stats(); }
