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
 * The slot itself is claimed later, at the first GPU call (svc_claim). */
#define _GNU_SOURCE
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

extern char **environ;

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
        dev[d].limit = env->memory[d];
        dev[d].sm_limit = env->sm[d];
    }
    h->sm_switch = 1;
    h->sm_any = sm_any(env->sm);
    h->n_visible = 0;

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

/* region.runtime_dir()/private, made and checked as region.py does */
static int private_path(char *out, size_t n, char *err, size_t errlen) {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    char top[900];
    if (xdg && *xdg && access(xdg, W_OK) == 0)
        snprintf(top, sizeof top, "%s/pyvgpu", xdg);
    else
        snprintf(top, sizeof top, "/tmp/pyvgpu-%u", (unsigned)getuid());
    char dir[1000];
    snprintf(dir, sizeof dir, "%s/private/", top);
    if (make_parents(dir, 0700) != 0) {
        snprintf(err, errlen, "cannot create %s (%s); set XDG_RUNTIME_DIR to a directory of your own", dir,
                 strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(top, &st) != 0 || st.st_uid != getuid() || (st.st_mode & 022)) {
        snprintf(err, errlen, "the runtime directory %s belongs to another user or is writable by others; remove "
                 "it, or set XDG_RUNTIME_DIR to a directory of your own", top);
        return -1;
    }
    unsigned char r[4] = {0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        memcpy(r, &now.tv_nsec, sizeof r);
    }
    snprintf(out, n, "%s%d-%02x%02x%02x%02x.region", dir, (int)getpid(), r[0], r[1], r[2], r[3]);
    return 0;
}

/* region.open_region's checks; the fd (read-write), or -1 with err. ENOENT in *missing. */
static int open_region(const char *path, pv_region_header_t *h, char *err, size_t n, int *missing) {
    *missing = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            *missing = 1;
        else if (errno == EACCES || errno == EPERM)
            snprintf(err, n, "region %s: permission denied; it belongs to another user or group (see its owner "
                     "with ls -l)", path);
        else
            snprintf(err, n, "region %s cannot be opened (%s)", path, strerror(errno));
        return -1;
    }
    struct stat st;
    const char *bad = NULL;
    char why[512];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        bad = "is not a regular file";
    else if ((uint64_t)st.st_size < PV_REGION_SLOTS_OFF ||
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

/* region.check_limits and check_sm: the process's variables against its group's */
static int check_group(const char *path, const pv_region_header_t *h, const pv_region_device_t *dev,
                       const pv_env_t *env, char *err, size_t n) {
    for (int d = 0; d < PV_MAX_DEVICES && env->any_memory; d++) {
        if (dev[d].limit == env->memory[d])
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
        if (dev[d].sm_limit == env->sm[d])
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

static void turn_path(char *out, size_t n) {
    const char *s = getenv("PYVGPU_SCHED");
    struct stat st;
    if (s && *s)
        snprintf(out, n, "%s", s);
    else if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0)
        snprintf(out, n, "/dev/shm/pyvgpu-turns-v1");
    else {
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        if (xdg && *xdg && access(xdg, W_OK) == 0)
            snprintf(out, n, "%s/pyvgpu/turns", xdg);
        else
            snprintf(out, n, "/tmp/pyvgpu-%u/turns", (unsigned)getuid());
    }
}

static void create_turns(const char *p) {
    char tmp[1200];
    pv_sched_header_t head = {.magic = PV_SCHED_MAGIC, .version = PV_SCHED_VERSION, .n_entries = PV_SCHED_ENTRIES,
                              .size = PV_SCHED_SIZE};
    make_parents(p, 0755);
    const char *slash = strrchr(p, '/');
    snprintf(tmp, sizeof tmp, "%.*s.%s.%d.turns", slash ? (int)(slash - p + 1) : 0, p, slash ? slash + 1 : p,
             (int)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return; /* the open below reports it */
    /* every user's groups take turns on the same GPUs (sched.py) */
    if (fchmod(fd, 0666) == 0 && pwrite(fd, &head, sizeof head, 0) == (ssize_t)sizeof head &&
        ftruncate(fd, PV_SCHED_SIZE) == 0)
        (void)link(tmp, p);
    close(fd);
    unlink(tmp);
}

static uint64_t map_turns(char *err, size_t n) {
    char p[1024];
    turn_path(p, sizeof p);
    char fix[1200];
    snprintf(fix, sizeof fix, "remove %s when no pyvgpu program runs, or set PYVGPU_SM_TURN=0", p);
    if (access(p, F_OK) != 0)
        create_turns(p);
    int fd = open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == EACCES || errno == EPERM)
            snprintf(err, n, "the turn file %s: permission denied (it should be mode 0666); %s", p, fix);
        else
            snprintf(err, n, "the turn file %s: %s; %s, or set PYVGPU_SCHED to a writable path that every group "
                     "uses", p, strerror(errno), fix);
        return 0;
    }
    struct stat st;
    pv_sched_header_t head;
    memset(&head, 0, sizeof head);
    const char *bad = NULL;
    char why[256];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        bad = "is not a regular file";
    else if (pread(fd, &head, sizeof head, 0) < 0 || head.magic != PV_SCHED_MAGIC)
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
    void *m = mmap(NULL, PV_SCHED_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, n, "the turn file %s cannot be mapped (%s); %s", p, strerror(errno), fix);
        return 0;
    }
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
        setenv("PYVGPU_REGION", path, 1); /* children join this group */
    } else {
        snprintf(path, sizeof path, "%s", env.region);
    }
    pv_region_header_t h;
    int missing;
    int fd = open_region(path, &h, err, n, &missing);
    if (fd < 0 && missing && create_region(path, &env, err, n) == 0)
        fd = open_region(path, &h, err, n, &missing);
    if (fd < 0) {
        if (env.region_var) { /* name the variable that named the file */
            char why[1024];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, n, "%s: %s", env.region_var, why);
        }
        return -1;
    }
    void *m = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); /* never unmapped */
    if (m == MAP_FAILED) {
        snprintf(err, n, "cannot map the group region %s (%s)", path, strerror(errno));
        close(fd);
        return -1;
    }
    const pv_region_device_t *dev = (const pv_region_device_t *)((char *)m + PV_REGION_DEVICES_OFF);
    if (check_group(path, &h, dev, &env, err, n)) {
        munmap(m, h.size);
        close(fd);
        return -1;
    }
    uint64_t sched = 0;
    int shared = 0;
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        shared |= dev[d].sm_limit > 0 && dev[d].sm_limit < 100;
    /* Groups with a share take turns on the GPU. One that gets its first share
     * by a live change later launches without turns (it time-slices). */
    if (shared && env.turns && !(sched = map_turns(err, n))) {
        munmap(m, h.size);
        close(fd);
        return -1;
    }
    pv_ctx.sm_policy = env.sm_policy;
    pv_ctx.sm_batch_ns = env.sm_batch_ns;
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
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%u", g ? "," : "", h.visible[g]);
        snprintf((char *)pv_ctx.devices_msg, sizeof pv_ctx.devices_msg,
                 "pyvgpu: CUDA in this process does not see its vGPU's devices (nvidia-smi's %s), in that order: "
                 "CUDA_VISIBLE_DEVICES was changed inside the program. Choose devices with `pyvgpu wrap "
                 "--devices`, not in the program. Its GPU use is refused.\n", list);
    }
    return 0;
}
