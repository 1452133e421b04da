/* The group's region, the one implementation: where a private group's file goes, how a region is created
 * (complete under a temporary name, then linked into place, never half-initialised), how an existing one is
 * opened and checked (ours, this layout version, whole, not replaced), and whether a process's limits agree
 * with its group's. The layouts are generated from pyvgpu/contract/layout.py. The shim joins its group with these
 * (pv_attach.c); pyvgpu/group/region.py reaches them through libpyvgpu_group.so. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pv_shim.h"

uint64_t pv_region_size(uint32_t n_slots) { return PV_REGION_SLOTS_OFF + (uint64_t)n_slots * PV_REGION_SLOT_SIZE; }

/* Path(path).stem: the file name without its last suffix */
static void stem(const char *path, char *out, size_t n) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t len = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    snprintf(out, n, "%.*s", (int)len, base);
}

static uint32_t sm_any(const uint32_t *sm) {
    uint32_t k = 0;
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        k += sm[d] > 0 && sm[d] < 100;
    return k;
}

/* region.create: link a complete region file into place unless one is there. want holds the group's own
 * fields (name, n_slots, n_physical, priority, sm_borrow, n_visible, visible, visible_uuid); the layout's,
 * the owner, the time and the limits (memory[d] bytes, sm[d] percent, 0 = none) are filled here. The owner
 * is this user, or uid (and gid, unless < 0) when uid >= 0: the node agent (root) makes a container's region
 * for the uid the container runs as, and the header records it. 1 when this call made it, 0 when one was
 * there, -1 with err. */
int pv_make_region(const char *path, const pv_region_header_t *want, const uint64_t *memory, const uint32_t *sm,
                   unsigned mode, int64_t uid, int64_t gid, char *err, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return pv_fail(err, n, "region %s is a directory; give the path of a region file, such as %s/NAME.region",
                       path, path);
    if (want->n_visible > PV_MAX_DEVICES)
        return pv_fail(err, n, "region %s: %u devices cannot be made (at most %d)", path, want->n_visible,
                       PV_MAX_DEVICES);
    char header[PV_REGION_SLOTS_OFF]; /* 15.5 KiB on the stack: no state shared between callers */
    memset(header, 0, sizeof header);
    pv_region_header_t *h = (pv_region_header_t *)header;
    *h = *want;
    h->magic = PV_REGION_MAGIC;
    h->version = PV_REGION_VERSION;
    h->n_devices = PV_MAX_DEVICES;
    h->size = pv_region_size(want->n_slots);
    h->owner_uid = uid >= 0 ? (uint32_t)uid : (uint32_t)getuid();
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    h->created_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    h->devices_off = PV_REGION_DEVICES_OFF;
    h->slots_off = PV_REGION_SLOTS_OFF;
    h->device_size = sizeof(pv_region_device_t);
    h->slot_size = PV_REGION_SLOT_SIZE;
    h->name[PV_GROUP_NAME_BYTES - 1] = 0;
    pv_region_device_t *dev = (pv_region_device_t *)(header + PV_REGION_DEVICES_OFF);
    for (int d = 0; d < PV_MAX_DEVICES; d++) {
        dev[d].limit = dev[d].limit_created = memory[d];
        dev[d].sm_limit = dev[d].sm_limit_created = sm[d];
    }
    h->sm_switch = 1;
    h->sm_any = sm_any(sm);

    if (pv_make_parents(path, 0755) != 0)
        return pv_fail(err, n, "cannot create the directory of the region %s (%s)", path, strerror(errno));
    char tmp[1200];
    unsigned char rnd[4] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        clock_gettime(CLOCK_MONOTONIC, &now), memcpy(rnd, &now.tv_nsec, sizeof rnd);
    const char *slash = strrchr(path, '/');
    snprintf(tmp, sizeof tmp, "%.*s.%s.%d.%02x%02x%02x%02x", slash ? (int)(slash - path + 1) : 0, path,
             slash ? slash + 1 : path, (int)getpid(), rnd[0], rnd[1], rnd[2], rnd[3]);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return pv_fail(err, n, "cannot create the region %s (%s)", path, strerror(errno));
    int rc = -1;
    if ((uid >= 0 && fchown(fd, (uid_t)uid, gid >= 0 ? (gid_t)gid : (gid_t)-1) != 0) || fchmod(fd, mode) != 0 ||
        pwrite(fd, header, sizeof header, 0) != (ssize_t)sizeof header ||
        ftruncate(fd, (off_t)h->size) != 0) /* slots: sparse zeros until used */
        pv_fail(err, n, "cannot write the region %s (%s)", path, strerror(errno));
    else if (link(tmp, path) == 0)
        rc = 1;
    else if (errno == EEXIST) /* another process made it first */
        rc = 0;
    else
        pv_fail(err, n, "cannot create the region %s (%s)", path, strerror(errno));
    close(fd);
    unlink(tmp);
    return rc;
}

/* the shim's own group, as the environment asks (a container's, or a program's with a limit but no region) */
int pv_create_region(const char *path, const pv_env_t *env, char *err, size_t n) {
    pv_region_header_t want;
    char name[PV_GROUP_NAME_BYTES];
    memset(&want, 0, sizeof want);
    stem(path, name, sizeof name);
    memcpy(want.name, name, strlen(name));
    want.n_slots = PV_REGION_DEFAULT_SLOTS;
    want.priority = env->priority < 0 ? 1 : (uint32_t)env->priority; /* HAMi's default: 1, low */
    want.sm_borrow = env->sm_borrow > 0;
    return pv_make_region(path, &want, env->memory, env->sm, 0600, -1, -1, err, n) < 0 ? -1 : 0;
}

/* region.new_private_path(): <runtime dir>/private/<pid>-<8 hex>.region, the directories made private */
int pv_private_path(char *out, size_t n, char *err, size_t errlen) {
    char top[900], dir[1000];
    if (pv_runtime_dir(top, sizeof top, err, errlen))
        return -1;
    snprintf(dir, sizeof dir, "%s/private", top);
    if (pv_private_dir(dir, "the runtime directory", PV_RUNTIME_FIX, err, errlen))
        return -1;
    unsigned char r[4] = {0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        memcpy(r, &now.tv_nsec, sizeof r);
    }
    snprintf(out, n, "%s/%d-%02x%02x%02x%02x.region", dir, (int)getpid(), r[0], r[1], r[2], r[3]);
    return 0;
}

/* region.open_region's checks; the fd (read-write), or -1 with err. *missing when there is no file. */
int pv_open_region(const char *path, int writable, int trust_shared, pv_region_header_t *h, char *err, size_t n,
                   int *kind) {
    struct stat st;
    *kind = PV_OPEN_REFUSED;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, n, "region %s is a directory; give the path of a region file, such as %s/NAME.region", path,
                 path);
        return -1;
    }
    /* a read-only open is a snapshot (status, top): another user's region may be read, never mapped */
    int fd = pv_open_shared(path, writable ? O_RDWR : O_RDONLY, "region", PV_REGION_FIX, 0, trust_shared || !writable,
                            err, n, kind);
    if (fd < 0) {
        if (*kind == PV_OPEN_MISSING)
            snprintf(err, n, "region %s does not exist; create it with `pyvgpu wrap --region %s`", path, path);
        return -1;
    }
    const char *bad = NULL;
    char why[512];
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < PV_REGION_SLOTS_OFF ||
        pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h) {
        snprintf(why, sizeof why, "is %lld bytes, too short to be a pyvgpu region (corrupt or not ours); remove it "
                 "and start the group again", (long long)st.st_size);
        bad = why;
    } else if (h->magic != PV_REGION_MAGIC)
        bad = "is not a pyvgpu region (bad magic); check the path, or remove the file if it is stale";
    else if (h->version != PV_REGION_VERSION) {
        snprintf(why, sizeof why, "has layout version %u, this pyvgpu uses %d; stop the group's programs and remove "
                 "the file, or use the pyvgpu version that created it", h->version, PV_REGION_VERSION);
        bad = why;
    } else if (h->n_slots > PV_MAX_SLOTS) {
        snprintf(why, sizeof why, "claims %u process slots, more than the %d any pyvgpu makes (corrupt, or written "
                 "to make its readers read too much); remove it and start the group again", h->n_slots, PV_MAX_SLOTS);
        bad = why;
    } else if (h->size != (uint64_t)st.st_size || h->size != pv_region_size(h->n_slots) ||
               h->n_devices != PV_MAX_DEVICES || h->devices_off != PV_REGION_DEVICES_OFF ||
               h->slots_off != PV_REGION_SLOTS_OFF || h->device_size != sizeof(pv_region_device_t) ||
               h->slot_size != PV_REGION_SLOT_SIZE) {
        snprintf(why, sizeof why, "is damaged: its header says %llu bytes and %u slots, the file has %lld "
                 "(expected %llu); remove it and start the group again", (unsigned long long)h->size, h->n_slots,
                 (long long)st.st_size, (unsigned long long)pv_region_size(h->n_slots));
        bad = why;
    } else if (h->owner_uid != st.st_uid) {
        snprintf(why, sizeof why, "was created by uid %u but the file belongs to uid %u: it has been replaced; "
                 "refusing to use it", h->owner_uid, (unsigned)st.st_uid);
        bad = why;
    }
    if (bad) {
        snprintf(err, n, "region %s %s", path, bad);
        close(fd);
        *kind = PV_OPEN_REFUSED;
        return -1;
    }
    return fd;
}

/* region.check_limits and check_sm: a process's limits against its group's, kind 0 memory caps (bytes), 1
 * compute shares (percent), want[d] 0 for none; source names what asked. A process whose limits are those
 * the group was created with follows the group's (`pyvgpu limits set` changed them since: the process
 * inherited its variables from the group's first programs, or a container's). 0, or -1 with err. */
int pv_check_limits(const char *path, const pv_region_header_t *h, const pv_region_device_t *dev, int kind,
                    const uint64_t *want, const char *source, char *err, size_t n) {
    for (int d = 0; d < PV_MAX_DEVICES; d++) {
        uint64_t have = kind ? dev[d].sm_limit : dev[d].limit, made = kind ? dev[d].sm_limit_created
                                                                           : dev[d].limit_created;
        if (have == want[d] || made == want[d])
            continue;
        const char *none = kind ? "no compute limit" : "no limit";
        char h_text[32], w_text[32], name[3 * PV_GROUP_NAME_BYTES];
        snprintf(h_text, sizeof h_text, "%s", none);
        snprintf(w_text, sizeof w_text, "%s", none);
        if (have && kind)
            snprintf(h_text, sizeof h_text, "%llu%%", (unsigned long long)have);
        else if (have)
            pv_human(have, h_text, sizeof h_text);
        if (want[d] && kind)
            snprintf(w_text, sizeof w_text, "%llu%%", (unsigned long long)want[d]);
        else if (want[d])
            pv_human(want[d], w_text, sizeof w_text);
        pv_repr((const char *)h->name, strnlen((const char *)h->name, PV_GROUP_NAME_BYTES), name, sizeof name);
        return pv_fail(err, n, "group %s (%s) has %s on device %d, but %s asks for %s; use the group's limits, or "
                       "start a group of your own", name, path, h_text, d, source, w_text);
    }
    return 0;
}

/* the shim's check: its variables against its group's */
int pv_check_group(const char *path, const pv_region_header_t *h, const pv_region_device_t *dev,
                   const pv_env_t *env, char *err, size_t n) {
    uint64_t sm[PV_MAX_DEVICES];
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        sm[d] = env->sm[d];
    if (env->any_memory && pv_check_limits(path, h, dev, 0, env->memory, PV_ENV_CUDA_DEVICE_MEMORY_LIMIT, err, n))
        return -1;
    return env->any_sm ? pv_check_limits(path, h, dev, 1, sm, PV_ENV_CUDA_DEVICE_SM_LIMIT, err, n) : 0;
}


/* region.open_region: a checked region (pv_open_region) and a view of it at *addr, h->size bytes: writable,
 * the file mapped shared; else a private snapshot read with pread (a file someone truncates cannot crash the
 * reader; another user's region may be read, never mapped). The fd, or -1 with err and *kind. Unmapped with
 * pv_unmap_view. */
int pv_view_region(const char *path, int writable, int trust_shared, pv_region_header_t *h, void **addr,
                   char *err, size_t n, int *kind) {
    int fd = pv_open_region(path, writable, trust_shared, h, err, n, kind);
    if (fd < 0)
        return -1;
    void *m = mmap(NULL, h->size, PROT_READ | PROT_WRITE, writable ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS,
                   writable ? fd : -1, 0);
    if (m == MAP_FAILED) {
        snprintf(err, n, "cannot map the region %s (%s)", path, strerror(errno));
        close(fd);
        *kind = PV_OPEN_REFUSED;
        return -1;
    }
    for (uint64_t at = 0; !writable && at < h->size;) {
        ssize_t got = pread(fd, (char *)m + at, h->size - at, (off_t)at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            snprintf(err, n, "region %s was truncated while pyvgpu read it; remove it and start the group again",
                     path);
            munmap(m, h->size);
            close(fd);
            *kind = PV_OPEN_REFUSED;
            return -1;
        }
        at += (uint64_t)got;
    }
    *addr = m;
    return fd;
}

void pv_unmap_view(void *addr, uint64_t size) { munmap(addr, size); }

/* A region checked as a read-only open is, then mapped shared and read-only, never unmapped: what VPMM's pool
 * watches (a member's refusals, the group's cap) while it runs. The address, or NULL with err. */
void *pv_watch_region(const char *path, char *err, size_t n) {
    pv_region_header_t h;
    int kind, fd = pv_open_region(path, 0, 1, &h, err, n, &kind);
    if (fd < 0)
        return NULL;
    void *m = mmap(NULL, h.size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        pv_fail(err, n, "cannot map the group region %s (%s)", path, strerror(errno));
        return NULL;
    }
    return m;
}

/* region.has_live_member: does a process hold a lock on the bytes of slots first..first+count-1 (every member
 * locks its slot's)? One query for them all. 1, 0, or -1 with errno. */
int pv_slots_locked(int fd, uint32_t first, uint32_t count) {
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = (off_t)(PV_REGION_SLOTS_OFF + (uint64_t)first * PV_REGION_SLOT_SIZE),
                       .l_len = (off_t)((uint64_t)count * PV_REGION_SLOT_SIZE)};
    if (!count)
        return 0;
    if (fcntl(fd, F_OFD_GETLK, &lk) != 0)
        return -1;
    return lk.l_type != F_UNLCK;
}

/* region.gc_private: remove the private regions (NAME.region in dir) whose processes are all gone and that are
 * older than min_age_ns (a region nobody joined yet may belong to a wrap still starting); how many. Regions
 * that cannot be opened as ours are left alone. */
int pv_gc_private(const char *dir, uint64_t min_age_ns, int trust_shared) {
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 7 || strcmp(e->d_name + len - 7, ".region"))
            continue;
        char p[2048], err[512];
        pv_region_header_t h;
        int kind;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int fd = pv_open_region(p, 1, trust_shared, &h, err, sizeof err, &kind);
        if (fd < 0)
            continue;
        int busy = pv_slots_locked(fd, 0, h.n_slots);
        int young = h.created_ns > now_ns || now_ns - h.created_ns < min_age_ns;
        if (!busy && !young && unlink(p) == 0)
            removed++;
        close(fd);
    }
    closedir(d);
    return removed;
}
