/* Joining the process's group, with no interpreter: the region file named by
 * PYVGPU_REGION or HAMi's CUDA_DEVICE_MEMORY_SHARED_CACHE is opened, checked
 * and mapped, the machine's turn file too when the group has a compute share,
 * and the context is filled. What pyvgpu/bootstrap.py attach_region did in
 * Python, with the same checks and messages (pyvgpu/region.py open_region,
 * check_limits, check_sm; pyvgpu/sched.py open_fd), against the layouts
 * generated from pyvgpu/layout.py.
 *
 * A region that does not exist yet is created here as pyvgpu/region.py
 * creates it (complete under a temporary name, then linked into place), so a
 * container started by HAMi's device plugin, or a program started with
 * LD_PRELOAD and a limit but no region, needs no Python either; tests check
 * that both writers make the same header. `pyvgpu wrap` and pyvgpu's device
 * plugin create the region before the program starts.
 *
 * Every shared file is treated as pyvgpu/safefile.py treats it (docs/security.md):
 * opened with O_NOFOLLOW and O_NONBLOCK, a regular file, this user's and
 * writable by nobody else (the turn file may be root's, writable by its group)
 * unless PYVGPU_TRUST_SHARED=1, its size checked right before mapping, and the
 * mapping registered with the SIGBUS guard (pv_guard.c). Directories pyvgpu
 * makes are 0700, this user's, no link.
 *
 * The slot itself is claimed later, at the first GPU call (svc_claim). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pv_shim.h"

extern char **environ;

/* ---- files other users may touch (pyvgpu/safefile.py) -------------------- */

#define RUNTIME_FIX "Ask its owner or root to remove it, or set XDG_RUNTIME_DIR to a directory of your own (pyvgpu " \
                    "then keeps its groups in $XDG_RUNTIME_DIR/pyvgpu)"
#define REGION_FIX "use a region of your own (--group NAME, or --region PATH in a directory only you can write)"
#define TRUST_NOTE "or set PYVGPU_TRUST_SHARED=1 if whoever can write it is trusted (docs/security.md)"

/* safefile.who: "uid 65534 (nobody)" */
static void who(uid_t uid, char *out, size_t n) {
    struct passwd pw, *got = NULL;
    char buf[1024];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &got) == 0 && got)
        snprintf(out, n, "uid %u (%s)", (unsigned)uid, got->pw_name);
    else
        snprintf(out, n, "uid %u", (unsigned)uid);
}

static void link_target(const char *path, char *out, size_t n) {
    ssize_t r = readlink(path, out, n - 1);
    out[r > 0 ? r : 0] = 0;
    if (r <= 0)
        snprintf(out, n, "?");
}

/* safefile.private_dir: path made (0700) or checked, this user's, no link; 0 or -1 with err */
static int private_dir(const char *path, const char *what, const char *fix, char *err, size_t n) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT || (mkdir(path, 0700) != 0 && errno != EEXIST) || lstat(path, &st) != 0) {
            snprintf(err, n, "%s %s: cannot create it (%s); %s", what, path, strerror(errno), fix);
            return -1;
        }
    }
    char a[128], b[128], t[512];
    if (S_ISLNK(st.st_mode)) {
        link_target(path, t, sizeof t);
        who(st.st_uid, a, sizeof a);
        snprintf(err, n, "%s %s is a symbolic link (to %s, made by %s); pyvgpu does not follow links there, as "
                 "someone may be redirecting your files. %s", what, path, t, a, fix);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, n, "%s %s is not a directory; %s", what, path, fix);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        who(st.st_uid, a, sizeof a);
        who(geteuid(), b, sizeof b);
        snprintf(err, n, "%s %s belongs to %s, not to you (%s): another user made it, and pyvgpu put nothing in "
                 "it. %s", what, path, a, b, fix);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat now;
    int rc = -1;
    if (fd < 0 || fstat(fd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino ||
        now.st_uid != geteuid())
        snprintf(err, n, "%s %s was replaced while pyvgpu checked it; %s", what, path, fix);
    else if ((now.st_mode & 07777) != 0700 && fchmod(fd, 0700) != 0) /* mkdir passed the umask, or opened up */
        snprintf(err, n, "%s %s: cannot make it 0700 (%s); %s", what, path, strerror(errno), fix);
    else
        rc = 0;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* safefile.foreign_problem: why this user must not trust a file of this stat, or NULL */
static const char *foreign_problem(const struct stat *st, int root_group_ok, char *buf, size_t n) {
    unsigned mode = st->st_mode & 07777;
    char a[128], b[128];
    if (st->st_uid == 0 && root_group_ok) {
        if (!(mode & 002))
            return NULL;
    } else if (st->st_uid != geteuid()) {
        who(st->st_uid, a, sizeof a);
        who(geteuid(), b, sizeof b);
        snprintf(buf, n, "it belongs to %s, not to you (%s)", a, b);
        return buf;
    } else if (!(mode & 022)) {
        return NULL;
    }
    snprintf(buf, n, "it is writable by %s (mode %04o)", mode & 002 ? "every user" : "its group", mode);
    return buf;
}

/* safefile.open_regular + check_trusted: the fd (blocking), or -1 with err (*missing: ENOENT) */
static int open_shared(const char *path, int flags, const char *what, const char *fix, int root_group_ok,
                       int trust_shared, char *err, size_t n, int *missing) {
    *missing = 0;
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) {
        char t[512];
        if (errno == ENOENT)
            *missing = 1;
        if (errno == ELOOP) {
            link_target(path, t, sizeof t);
            snprintf(err, n, "%s %s is a symbolic link (to %s); pyvgpu does not follow links there. %s", what,
                     path, t, fix);
        } else if (errno == EACCES || errno == EPERM)
            snprintf(err, n, "%s %s: permission denied; it belongs to another user or group (see its owner with "
                     "ls -l)", what, path);
        else
            snprintf(err, n, "%s %s cannot be opened (%s); %s", what, path, strerror(errno), fix);
        return -1;
    }
    struct stat st;
    char buf[300];
    const char *problem;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, n, "%s %s is not a regular file; %s", what, path, fix);
    } else if ((problem = foreign_problem(&st, root_group_ok, buf, sizeof buf)) && !trust_shared) {
        snprintf(err, n, "%s %s: %s, so another user could change or truncate it under your program; refusing "
                 "it. %s, " TRUST_NOTE, what, path, problem, fix);
    } else {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        return fd;
    }
    close(fd);
    return -1;
}

/* region.map_forever: the size checked right before mapping, the mapping registered with the guard */
static void *map_shared(int fd, uint64_t size, int guard, const char *path, const char *what, const char *fix,
                        char *err, size_t n) {
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size) {
        snprintf(err, n, "%s %s is %lld bytes, %llu expected: it was truncated; %s", what, path,
                 (long long)st.st_size, (unsigned long long)size, fix);
        return NULL;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, n, "cannot map %s (%s)", what, strerror(errno));
        return NULL;
    }
    pyvgpu_guard((uint64_t)(uintptr_t)m, size, guard);
    return m;
}

/* region.runtime_dir(): $XDG_RUNTIME_DIR/pyvgpu if writable, else /tmp/pyvgpu-<uid>; made private */
static int runtime_dir(char *out, size_t n, char *err, size_t errlen) {
    const char *xdg = getenv(PV_ENV_XDG_RUNTIME_DIR);
    if (xdg && *xdg && access(xdg, W_OK) == 0)
        snprintf(out, n, "%s/pyvgpu", xdg);
    else
        snprintf(out, n, "/tmp/pyvgpu-%u", (unsigned)getuid());
    return private_dir(out, "the runtime directory", RUNTIME_FIX, err, errlen);
}

static uint64_t region_size(uint32_t n_slots) { return PV_REGION_SLOTS_OFF + (uint64_t)n_slots * PV_REGION_SLOT_SIZE; }

/* mkdir -p of path's parent directories, each new one with mode */
static int make_parents(const char *path, mode_t mode) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return 0;
}

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

/* region.create: link a complete region file into place unless one is there. 0, or -1 with err. */
static int create_region(const char *path, const pv_env_t *env, char *err, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, n, "region %s is a directory; give the path of a region file, such as %s/NAME.region", path,
                 path);
        return -1;
    }
    static char header[PV_REGION_SLOTS_OFF];
    memset(header, 0, sizeof header);
    pv_region_header_t *h = (pv_region_header_t *)header;
    h->magic = PV_REGION_MAGIC;
    h->version = PV_REGION_VERSION;
    h->n_devices = PV_MAX_DEVICES;
    h->size = region_size(PV_REGION_DEFAULT_SLOTS);
    h->n_slots = PV_REGION_DEFAULT_SLOTS;
    h->owner_uid = (uint32_t)getuid();
    h->n_physical = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    h->created_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    h->devices_off = PV_REGION_DEVICES_OFF;
    h->slots_off = PV_REGION_SLOTS_OFF;
    h->device_size = sizeof(pv_region_device_t);
    h->slot_size = PV_REGION_SLOT_SIZE;
    char name[PV_GROUP_NAME_BYTES];
    stem(path, name, sizeof name);
    memcpy(h->name, name, strlen(name));
    pv_region_device_t *dev = (pv_region_device_t *)(header + PV_REGION_DEVICES_OFF);
    for (int d = 0; d < PV_MAX_DEVICES; d++) {
        dev[d].limit = dev[d].limit_created = env->memory[d];
        dev[d].sm_limit = dev[d].sm_limit_created = env->sm[d];
    }
    h->sm_switch = 1;
    h->sm_any = sm_any(env->sm);
    h->n_visible = 0;
    h->priority = env->priority < 0 ? 1 : (uint32_t)env->priority; /* HAMi's default: 1, low */
    h->sm_borrow = env->sm_borrow > 0;

    if (make_parents(path, 0755) != 0) {
        snprintf(err, n, "cannot create the directory of the region %s (%s)", path, strerror(errno));
        return -1;
    }
    char tmp[1200], rnd[4] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        clock_gettime(CLOCK_MONOTONIC, &now), memcpy(rnd, &now.tv_nsec, sizeof rnd);
    const char *slash = strrchr(path, '/');
    snprintf(tmp, sizeof tmp, "%.*s.%s.%d.%02x%02x%02x%02x", slash ? (int)(slash - path + 1) : 0, path,
             slash ? slash + 1 : path, (int)getpid(), (unsigned char)rnd[0], (unsigned char)rnd[1],
             (unsigned char)rnd[2], (unsigned char)rnd[3]);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, n, "cannot create the region %s (%s)", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    if (fchmod(fd, 0600) != 0 || pwrite(fd, header, sizeof header, 0) != (ssize_t)sizeof header ||
        ftruncate(fd, (off_t)h->size) != 0)
        snprintf(err, n, "cannot write the region %s (%s)", path, strerror(errno));
    else if (link(tmp, path) != 0 && errno != EEXIST) /* EEXIST: another process made it first */
        snprintf(err, n, "cannot create the region %s (%s)", path, strerror(errno));
    else
        rc = 0;
    close(fd);
    unlink(tmp);
    return rc;
}

/* region.new_private_path(): <runtime dir>/private/<pid>-<8 hex>.region, the directories made private */
static int private_path(char *out, size_t n, char *err, size_t errlen) {
    char top[900], dir[1000];
    if (runtime_dir(top, sizeof top, err, errlen))
        return -1;
    snprintf(dir, sizeof dir, "%s/private", top);
    if (private_dir(dir, "the runtime directory", RUNTIME_FIX, err, errlen))
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
static int open_region(const char *path, const pv_env_t *env, pv_region_header_t *h, char *err, size_t n,
                       int *missing) {
    struct stat st;
    *missing = 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, n, "region %s is a directory; give the path of a region file, such as %s/NAME.region", path,
                 path);
        return -1;
    }
    int fd = open_shared(path, O_RDWR, "region", REGION_FIX, 0, env->trust_shared, err, n, missing);
    if (fd < 0)
        return -1;
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
    } else if (h->size != (uint64_t)st.st_size || h->size != region_size(h->n_slots) ||
               h->n_devices != PV_MAX_DEVICES || h->devices_off != PV_REGION_DEVICES_OFF ||
               h->slots_off != PV_REGION_SLOTS_OFF || h->device_size != sizeof(pv_region_device_t) ||
               h->slot_size != PV_REGION_SLOT_SIZE) {
        snprintf(why, sizeof why, "is damaged: its header says %llu bytes and %u slots, the file has %lld "
                 "(expected %llu); remove it and start the group again", (unsigned long long)h->size, h->n_slots,
                 (long long)st.st_size, (unsigned long long)region_size(h->n_slots));
        bad = why;
    } else if (h->owner_uid != st.st_uid) {
        snprintf(why, sizeof why, "was created by uid %u but the file belongs to uid %u: it has been replaced; "
                 "refusing to use it", h->owner_uid, (unsigned)st.st_uid);
        bad = why;
    }
    if (bad) {
        snprintf(err, n, "region %s %s", path, bad);
        close(fd);
        return -1;
    }
    return fd;
}

/* region.check_limits and check_sm: the process's variables against its group's. A process whose variables
 * name the limits the group was created with follows the group's (`pyvgpu limits set` changed them since:
 * the process inherited its variables from the group's first programs, or a container's). */
static int check_group(const char *path, const pv_region_header_t *h, const pv_region_device_t *dev,
                       const pv_env_t *env, char *err, size_t n) {
    for (int d = 0; d < PV_MAX_DEVICES && env->any_memory; d++) {
        if (dev[d].limit == env->memory[d] || dev[d].limit_created == env->memory[d])
            continue;
        char have[32] = "no limit", want[32] = "no limit";
        if (dev[d].limit)
            pv_human(dev[d].limit, have, sizeof have);
        if (env->memory[d])
            pv_human(env->memory[d], want, sizeof want);
        snprintf(err, n, "group '%.*s' (%s) has %s on device %d, but CUDA_DEVICE_MEMORY_LIMIT asks for %s; use the "
                 "group's limits, or start a group of your own", PV_GROUP_NAME_BYTES, (const char *)h->name, path,
                 have, d, want);
        return -1;
    }
    for (int d = 0; d < PV_MAX_DEVICES && env->any_sm; d++) {
        if (dev[d].sm_limit == env->sm[d] || dev[d].sm_limit_created == env->sm[d])
            continue;
        char have[32] = "no compute limit", want[32] = "no compute limit";
        if (dev[d].sm_limit)
            snprintf(have, sizeof have, "%u%%", dev[d].sm_limit);
        if (env->sm[d])
            snprintf(want, sizeof want, "%u%%", env->sm[d]);
        snprintf(err, n, "group '%.*s' (%s) has %s on device %d, but CUDA_DEVICE_SM_LIMIT asks for %s; use the "
                 "group's limits, or start a group of your own", PV_GROUP_NAME_BYTES, (const char *)h->name, path,
                 have, d, want);
        return -1;
    }
    return 0;
}

/* ---- the turn file (pyvgpu/sched.py) ------------------------------------ */

#define SHM_TURNS "/dev/shm/pyvgpu-turns-v1"

/* sched.machine_problem: can this user use the machine's turn file (made by `pyvgpu setup`)? */
static int machine_turns_usable(const pv_env_t *env) {
    struct stat st;
    char buf[300];
    if (lstat(SHM_TURNS, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    if (foreign_problem(&st, 1, buf, sizeof buf) && !env->trust_shared)
        return 0;
    return access(SHM_TURNS, R_OK | W_OK) == 0;
}

/* sched.choose: PYVGPU_SCHED, else the machine's file if usable, else <runtime dir>/turns (this user's) */
static int turn_path(const pv_env_t *env, char *out, size_t n, int *own, char *err, size_t errlen) {
    const char *s = getenv(PV_ENV_SCHED);
    *own = 0;
    if (s && *s) {
        snprintf(out, n, "%s", s);
        return 0;
    }
    if (machine_turns_usable(env)) {
        snprintf(out, n, "%s", SHM_TURNS);
        return 0;
    }
    char top[900];
    if (runtime_dir(top, sizeof top, err, errlen))
        return -1;
    snprintf(out, n, "%s/turns", top);
    *own = 1;
    return 0;
}

/* sched._write_new: link a complete, empty turn file (0600) into place unless one is there */
static void create_turns(const char *p) {
    char tmp[1200];
    pv_sched_header_t head = {.magic = PV_SCHED_MAGIC, .version = PV_SCHED_VERSION, .n_entries = PV_SCHED_ENTRIES,
                              .size = PV_SCHED_SIZE};
    make_parents(p, 0755);
    const char *slash = strrchr(p, '/');
    snprintf(tmp, sizeof tmp, "%.*s.%s.%d.turns", slash ? (int)(slash - p + 1) : 0, p, slash ? slash + 1 : p,
             (int)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return; /* the open after it reports */
    if (fchmod(fd, 0600) == 0 && pwrite(fd, &head, sizeof head, 0) == (ssize_t)sizeof head &&
        ftruncate(fd, PV_SCHED_SIZE) == 0)
        (void)link(tmp, p);
    close(fd);
    unlink(tmp);
}

/* sched.attach: the turn file mapped (never unmapped) and guarded; 0 with err set on failure */
static uint64_t map_turns(const pv_env_t *env, char *err, size_t n) {
    char p[1024], fix[1400];
    int own, missing;
    if (turn_path(env, p, sizeof p, &own, err, n))
        return 0;
    if (!strcmp(p, SHM_TURNS))
        snprintf(fix, sizeof fix, "ask root to run `pyvgpu setup` (it recreates the file), or set PYVGPU_SM_TURN=0");
    else
        snprintf(fix, sizeof fix, "remove %s when no pyvgpu program runs, or set PYVGPU_SCHED to a file of your "
                 "own, or PYVGPU_SM_TURN=0", p);
    struct stat st;
    if (lstat(p, &st) != 0 && errno == ENOENT && strcmp(p, SHM_TURNS))
        create_turns(p);
    int fd = open_shared(p, O_RDWR, "the turn file", fix, 1, env->trust_shared, err, n, &missing);
    if (fd < 0)
        return 0;
    pv_sched_header_t head;
    memset(&head, 0, sizeof head);
    const char *bad = NULL;
    char why[256];
    if (fstat(fd, &st) != 0 || pread(fd, &head, sizeof head, 0) < 0 || head.magic != PV_SCHED_MAGIC)
        bad = "is not a pyvgpu turn file (bad magic)";
    else if (head.version != PV_SCHED_VERSION || head.n_entries != PV_SCHED_ENTRIES) {
        snprintf(why, sizeof why, "has version %u with %u entries, this pyvgpu uses %d with %d", head.version,
                 head.n_entries, PV_SCHED_VERSION, PV_SCHED_ENTRIES);
        bad = why;
    } else if (head.size != PV_SCHED_SIZE || st.st_size != PV_SCHED_SIZE) {
        snprintf(why, sizeof why, "is %lld bytes, expected %d (damaged)", (long long)st.st_size, PV_SCHED_SIZE);
        bad = why;
    }
    if (bad) {
        snprintf(err, n, "the turn file %s %s; %s", p, bad, fix);
        close(fd);
        return 0;
    }
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

/* ---- the launch clock (pyvgpu/jit/clock.py) -------------------------------- */

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
        if (private_path(path, sizeof path, err, n))
            return -1;
        if (create_region(path, &env, err, n))
            return -1;
        setenv(PV_ENV_REGION, path, 1); /* children join this group */
    } else {
        snprintf(path, sizeof path, "%s", env.region);
    }
    pv_region_header_t h;
    int missing;
    int clk = clock_mode(env.clock, err, n);
    if (clk < 0)
        return -1;
    int fd = open_region(path, &env, &h, err, n, &missing);
    if (fd < 0 && missing && create_region(path, &env, err, n) == 0)
        fd = open_region(path, &env, &h, err, n, &missing);
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
    if (check_group(path, &h, dev, &env, err, n)) {
        close(fd); /* the mapping stays (guarded, unused): a refused process makes no more calls */
        return -1;
    }
    uint64_t sched = 0;
    int shared = 0;
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        shared |= dev[d].sm_limit > 0 && dev[d].sm_limit < 100;
    /* Every group takes part in the GPU's turns (pyvgpu/jit/turn.py): one with a share, one without (best
     * effort, while a group with a share takes turns), one given a share later by a live change. A group
     * with a share cannot run without them; one without runs on, said once, when the file is unusable (the
     * groups with a share refuse it too). */
    if (env.turns && !(sched = map_turns(&env, err, n))) {
        if (shared) {
            close(fd);
            return -1;
        }
        fprintf(stderr, "pyvgpu: warning: %s; this program does not take turns on the GPU\n", err);
        err[0] = 0;
    }
    pv_ctx.sm_policy = env.sm_policy;
    pv_ctx.sm_batch_ns = env.sm_batch_ns;
    pv_ctx.clk_mode = (uint32_t)clk;
    pv_ctx.region = (uint64_t)(uintptr_t)m;
    pv_ctx.sched = sched;
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
