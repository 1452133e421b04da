/* Loading the compiled callbacks, with no interpreter in the process.
 *
 * The callbacks are numba code linked into a shared object (pyvgpu/native/cblib.py)
 * that exports one table, PV_CBLIB_SYMBOL (pv_cblib_t, pyvgpu/contract/layout.py CBLIB):
 * an address per hook entry and per service, the hook table's hash, the key of
 * the sources and the CPU it was compiled for. Which library:
 *
 *   1. PYVGPU_CALLBACKS, when set (`pyvgpu wrap` names the one it chose);
 *   2. else the one `pyvgpu warmup` tuned for this CPU, in the user's cache
 *      (PYVGPU_CACHE_DIR, else $XDG_CACHE_HOME/pyvgpu, else ~/.cache/pyvgpu),
 *      named callbacks-<key>-<cpu id>.so, when it fits the packaged library's
 *      sources and is stamped with this CPU's id (pyvgpu/host/cpuid.py, computed
 *      here the same way);
 *   3. else the packaged one, libpyvgpu_callbacks.so beside this shim.
 *
 * Code runs from these files, so one is loaded only if it is a regular file of
 * this user or root that no other user may write, whose bytes match the
 * SHA-256 written beside it (pv_verify.c). It is opened once, checked, and
 * loaded through that descriptor, which stays open: the dynamic loader knows
 * the library by its /proc/self/fd name, never to be reused. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_shim.h"

#define PV_CBLIB_FILE "libpyvgpu_callbacks.so"

/* ---- the CPU's id: pyvgpu/host/cpuid.py, byte for byte ---------------------- */

static const char *const CPU_KEYS[] = {
    "vendor_id", "cpu family", "model", "model name", "stepping", "flags",
    "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision", "Features",
};

static uint64_t fnv1a(const char *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001B3ull;
    return h;
}

static void trim(const char **b, const char **e, const char *chars) {
    while (*b < *e && strchr(chars, **b) && **b)
        (*b)++;
    while (*e > *b && strchr(chars, (*e)[-1]) && (*e)[-1])
        (*e)--;
}

uint64_t pv_cpu_id_of(const char *text, size_t len) {
    uint64_t h = 0xCBF29CE484222325ull;
    int seen = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *b = p, *e = nl ? nl : end;
        p = nl ? nl + 1 : end;
        trim(&b, &e, " \t\r");
        if (b == e) {
            if (seen)
                break; /* the end of the first processor's block */
            continue;
        }
        const char *colon = memchr(b, ':', (size_t)(e - b));
        if (!colon)
            continue;
        const char *kb = b, *ke = colon, *vb = colon + 1, *ve = e;
        trim(&kb, &ke, " \t");
        trim(&vb, &ve, " \t");
        for (unsigned i = 0; i < sizeof CPU_KEYS / sizeof *CPU_KEYS; i++) {
            if (strlen(CPU_KEYS[i]) != (size_t)(ke - kb) || memcmp(CPU_KEYS[i], kb, (size_t)(ke - kb)))
                continue;
            h = fnv1a(kb, (size_t)(ke - kb), h);
            h = fnv1a("=", 1, h);
            h = fnv1a(vb, (size_t)(ve - vb), h);
            h = fnv1a("\n", 1, h);
            seen = 1;
            break;
        }
    }
    return seen ? h | 1 : 0;
}

static uint64_t cpu_id(void) {
    static char buf[1 << 16];
    int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf && (r = read(fd, buf + got, sizeof buf - got)) > 0)
        got += (size_t)r;
    close(fd);
    return pv_cpu_id_of(buf, got);
}

PV_EXPORT uint64_t pyvgpu_cpu_id_of(const char *text) { return pv_cpu_id_of(text, strlen(text)); }

/* ---- opening and checking one library ----------------------------------- */

static int check_table(const pv_cblib_t *t, char *why, size_t n) {
    if (t->magic != PV_CBLIB_MAGIC || t->format != PV_CBLIB_FORMAT) {
        snprintf(why, n, "it has another format than this shim's");
        return -1;
    }
    if (t->n_entries != PV_N_ENTRIES || t->n_services != PV_N_SERVICES ||
        strncmp((const char *)t->table_hash, PV_TABLE_HASH, sizeof t->table_hash)) {
        snprintf(why, n, "it was compiled for hook table %.*s, this shim has %s", (int)sizeof t->table_hash,
                 (const char *)t->table_hash, PV_TABLE_HASH);
        return -1;
    }
    for (int i = 0; i < PV_N_ENTRIES; i++)
        if (pv_entry_infos[i].has_callback && !t->entries[i]) {
            snprintf(why, n, "it has no callback for %s", pv_entry_infos[i].name);
            return -1;
        }
    for (int i = 0; i < PV_N_SERVICES; i++)
        if (!t->services[i]) {
            snprintf(why, n, "it has no service %s", pv_service_names[i]);
            return -1;
        }
    return 0;
}

/* Load the library at path; its table, or NULL with the reason in why (*errno_out: ENOENT when missing).
 * pv_verified_fd checks owner, mode and hash; the library is loaded through that descriptor. */
static const pv_cblib_t *load(const char *path, int nofollow, char *why, size_t n, int *errno_out) {
    *errno_out = 0;
    int fd = pv_verified_fd(path, nofollow, why, n);
    if (fd < 0) {
        *errno_out = errno;
        return NULL;
    }
    char byfd[64];
    snprintf(byfd, sizeof byfd, "/proc/self/fd/%d", fd);
    void *h = dlopen(byfd, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        /* no /proc (some containers): load by name, if it is still the file checked */
        struct stat st, again;
        if (access("/proc/self/fd", F_OK) == 0 || fstat(fd, &st) != 0 || stat(path, &again) != 0 ||
            again.st_dev != st.st_dev || again.st_ino != st.st_ino) {
            const char *e = dlerror();
            snprintf(why, n, "it does not load (%s)", e ? e : "unknown error");
            close(fd);
            return NULL;
        }
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        close(fd);
        if (!h) {
            const char *e = dlerror();
            snprintf(why, n, "it does not load (%s)", e ? e : "unknown error");
            return NULL;
        }
    }
    const pv_cblib_t *t = (const pv_cblib_t *)pv_real_dlsym(h, PV_CBLIB_SYMBOL);
    if (!t) {
        snprintf(why, n, "it has no %s table", PV_CBLIB_SYMBOL);
        return NULL; /* left loaded: its code may not be unloaded safely, and it is small */
    }
    if (check_table(t, why, n))
        return NULL;
    return t; /* fd stays open for the life of the process (see above) */
}

/* The directory of this shim, for the packaged library. */
static void shim_dir(char *out, size_t n) {
    Dl_info di;
    out[0] = 0;
    if (dladdr((void *)shim_dir, &di) && di.dli_fname) {
        snprintf(out, n, "%s", di.dli_fname);
        char *slash = strrchr(out, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(out, n, ".");
    }
}

static void cache_dir(char *out, size_t n) {
    const char *d = getenv(PV_ENV_CACHE_DIR), *x = getenv(PV_ENV_XDG_CACHE_HOME), *home = getenv(PV_ENV_HOME);
    if (d && *d)
        snprintf(out, n, "%s", d);
    else if (x && *x)
        snprintf(out, n, "%s/pyvgpu", x);
    else if (home && *home)
        snprintf(out, n, "%s/.cache/pyvgpu", home);
    else
        out[0] = 0;
}

const pv_cblib_t *pv_load_callbacks(char *err, size_t n) {
    char why[512] = "", path[1024];
    int e;
    const char *named = getenv(PV_ENV_CALLBACKS);
    const pv_cblib_t *lib;
    if (named && *named) {
        if (!(lib = load(named, 0, why, sizeof why, &e))) {
            snprintf(err, n, "PYVGPU_CALLBACKS=%s: %s; unset it to use the callbacks installed with pyvgpu", named,
                     why);
            return NULL;
        }
        snprintf(pv_callbacks_path, sizeof pv_callbacks_path, "%s", named);
        return lib;
    }
    char dir[900];
    shim_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, PV_CBLIB_FILE);
    if (!(lib = load(path, 0, why, sizeof why, &e))) {
        snprintf(err, n, "the compiled callbacks %s cannot be used: %s; reinstall pyvgpu (pip install compiles "
                 "them), or set PYVGPU_CALLBACKS to a callback library", path, why);
        return NULL;
    }
    snprintf(pv_callbacks_path, sizeof pv_callbacks_path, "%s", path);
    /* a library tuned for this CPU, by `pyvgpu warmup` */
    uint64_t cpu = cpu_id();
    cache_dir(dir, sizeof dir);
    if (!cpu || !dir[0])
        return lib;
    snprintf(path, sizeof path, "%s/callbacks-%.*s-%016llx.so", dir, (int)sizeof lib->key, (const char *)lib->key,
             (unsigned long long)cpu);
    why[0] = 0;
    const pv_cblib_t *tuned = load(path, 1, why, sizeof why, &e);
    if (!tuned) {
        if (e != ENOENT)
            fprintf(stderr, "pyvgpu: warning: not using %s: %s; using %s\n", path, why, pv_callbacks_path);
        return lib;
    }
    if (!tuned->tuned || tuned->cpu_id != cpu || strncmp((const char *)tuned->key, (const char *)lib->key,
                                                          sizeof lib->key))
        return lib; /* misnamed: not what its name says */
    snprintf(pv_callbacks_path, sizeof pv_callbacks_path, "%s", path);
    return tuned;
}
