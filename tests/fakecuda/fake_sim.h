/* The simulated GPU's busy clock, shared by the fake libcuda (which queues
 * kernels on it) and the fake libnvidia-ml (which reports utilization and
 * compute processes from it). A test double only.
 *
 * Each device is one FIFO timeline: a kernel of d ns starts when the device
 * is free (or now) and ends d ns later; launches block while more than
 * SIM_QUEUE_NS_DEFAULT (or FAKECUDA_SIM_QUEUE_MS) of work is queued, as a full
 * launch queue does.
 * FAKECUDA_SIM_SWITCH_PCT=P models time slicing: a kernel queued while
 * another process still has work on the device takes P% longer (on an H100
 * two contexts with work got ~90% of the GPU together, docs/compute.md). With
 * FAKECUDA_SIM=PATH every process maps the same file, so several processes
 * share one simulated GPU; without it each process has its own.
 * FAKECUDA_SIM_COLLECTIVE=N makes every kernel a rank of a collective over
 * devices 0..N-1 (struct sim_coll below): it waits on the GPU for its peers.
 * FAKECUDA_SIM_COMM=C (0..SIM_COMMS-1, default 0) puts a process's collectives in communicator C: two
 * groups' all-reduces on the same GPUs are matched each within its own group, as NCCL's are.
 * Devices here are always physical indexes (NVML's), never CUDA ordinals,
 * which CUDA_VISIBLE_DEVICES may reorder. */
#ifndef FAKE_SIM_H
#define FAKE_SIM_H
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SIM_DEVS 16 /* physical devices (MAX_DEV of fake_devices.h) */
#define SIM_RING 262144 /* kernels kept per device: NVML's samples look back 2 s, which a load of 10 us kernels
                          * fills with 200000 (a ring of 16384 lost all but the last 0.16 s of them, and NVML
                          * read such a load a fraction of its busy time) */
#define SIM_PROCS 64
#define SIM_QUEUE_NS_DEFAULT 20000000ULL /* FAKECUDA_SIM_QUEUE_MS overrides */
#define SIM_WINDOW_NS 300000000ULL /* NVML utilization: busy share of the last 300 ms */
#define SIM_MAGIC 0x314d495346414b45ULL
#define SIM_FN static __attribute__((unused))

struct sim_kernel {
    uint64_t start, end;
};
struct sim_dev {
    uint64_t free_at; /* CLOCK_MONOTONIC ns when all queued work is done */
    uint64_t next;    /* ring index of the next kernel */
    struct sim_kernel ring[SIM_RING];
};
struct sim_proc {
    int32_t pid;
    uint32_t devmask;            /* devices it holds a context on */
    uint64_t busy_until[SIM_DEVS]; /* when its queued work on each device ends */
    uint64_t busy_ns[SIM_DEVS];  /* GPU time its kernels took on each device (tests read it) */
    uint64_t kernels[SIM_DEVS];  /* kernels it queued on each device */
};
/* Collectives (FAKECUDA_SIM_COLLECTIVE=N): every kernel is one rank's part of a collective over devices
 * 0..N-1, as an NCCL all-reduce's kernel is. The n-th kernel of each device starts when its device reaches
 * it, then waits inside the GPU until every rank's n-th kernel has started, and ends d ns after the last
 * start: a rank that comes late makes the others' kernels longer, and that wait is GPU time (NVML counts
 * it busy, a timing event around the kernel reads it). seq: the collectives each device queued; st: their
 * starts, the last SIM_COLL_RING of them. */
#define SIM_COLL_RING 8
#define SIM_COLL_TIMEOUT_NS 500000000ULL /* a rank that never comes: the others go on alone */
#define SIM_COMMS 4 /* communicators (FAKECUDA_SIM_COMM) */
struct sim_coll {
    uint64_t seq[SIM_DEVS];
    uint64_t st[SIM_DEVS][SIM_COLL_RING];
};
struct sim {
    uint64_t magic;
    uint64_t switch_ns[SIM_DEVS]; /* time added by FAKECUDA_SIM_SWITCH_PCT, per device (tests read it) */
    struct sim_proc procs[SIM_PROCS];
    struct sim_dev dev[SIM_DEVS];
    struct sim_coll coll[SIM_COMMS]; /* last: the tests read the fields above at fixed offsets */
};

SIM_FN uint64_t sim_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

SIM_FN void sim_sleep_until(uint64_t t) {
    for (uint64_t now = sim_now(); now < t; now = sim_now()) {
        uint64_t d = t - now;
        struct timespec ts = {(time_t)(d / 1000000000ULL), (long)(d % 1000000000ULL)};
        nanosleep(&ts, NULL);
    }
}

/* The shared state from FAKECUDA_SIM, or NULL when it is not set. */
SIM_FN struct sim *sim_map_file(void) {
    const char *path = getenv("FAKECUDA_SIM");
    if (!path || !*path)
        return NULL;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, sizeof(struct sim)) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, sizeof(struct sim), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    struct sim *s = p;
    __atomic_store_n(&s->magic, SIM_MAGIC, __ATOMIC_RELEASE);
    return s;
}

SIM_FN struct sim_proc *sim_me(struct sim *s) {
    int32_t me = (int32_t)getpid();
    for (int i = 0; i < SIM_PROCS; i++)
        if (__atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE) == me)
            return &s->procs[i];
    return NULL;
}

/* The time-slicing penalty: d longer by FAKECUDA_SIM_SWITCH_PCT if another process has work queued on dev. */
SIM_FN uint64_t sim_switch_cost(struct sim *s, int dev, uint64_t d, uint64_t now, struct sim_proc *me) {
    static int pct = -1;
    if (pct < 0) {
        const char *v = getenv("FAKECUDA_SIM_SWITCH_PCT");
        pct = v && *v ? atoi(v) : 0;
    }
    if (!pct || !me)
        return d;
    for (int i = 0; i < SIM_PROCS; i++) {
        struct sim_proc *p = &s->procs[i];
        if (p != me && __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) != 0 &&
            __atomic_load_n(&p->busy_until[dev % SIM_DEVS], __ATOMIC_ACQUIRE) > now) {
            __atomic_fetch_add(&s->switch_ns[dev % SIM_DEVS], d * (uint64_t)pct / 100, __ATOMIC_RELAXED);
            return d + d * (uint64_t)pct / 100;
        }
    }
    return d;
}

SIM_FN uint64_t sim_queue_ns(void) {
    static uint64_t queue_ns;
    if (!queue_ns) {
        const char *q = getenv("FAKECUDA_SIM_QUEUE_MS");
        queue_ns = q && *q ? (uint64_t)atoi(q) * 1000000ULL : SIM_QUEUE_NS_DEFAULT;
    }
    return queue_ns;
}

/* A collective's rendezvous (FAKECUDA_SIM_COLLECTIVE=ranks): this device's kernel started at st; the time
 * the last rank's matching kernel starts (waiting, on the host, for the ranks that have not queued theirs). */
SIM_FN uint64_t sim_rendezvous(struct sim *s, int dev, int ranks, uint64_t st) {
    static int comm = -1;
    if (comm < 0) {
        const char *v = getenv("FAKECUDA_SIM_COMM");
        comm = v && *v ? atoi(v) : 0;
        if (comm < 0 || comm >= SIM_COMMS)
            comm = 0;
    }
    struct sim_coll *c = &s->coll[comm];
    int me = dev % SIM_DEVS;
    uint64_t n = __atomic_load_n(&c->seq[me], __ATOMIC_ACQUIRE) + 1;
    __atomic_store_n(&c->st[me][n % SIM_COLL_RING], st, __ATOMIC_RELAXED);
    __atomic_store_n(&c->seq[me], n, __ATOMIC_RELEASE);
    uint64_t last = st, give_up = sim_now() + SIM_COLL_TIMEOUT_NS;
    for (int r = 0; r < ranks && r < SIM_DEVS; r++) {
        while (__atomic_load_n(&c->seq[r], __ATOMIC_ACQUIRE) < n && sim_now() < give_up) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if (__atomic_load_n(&c->seq[r], __ATOMIC_ACQUIRE) >= n) {
            uint64_t t = __atomic_load_n(&c->st[r][n % SIM_COLL_RING], __ATOMIC_RELAXED);
            last = t > last ? t : last;
        }
    }
    return last;
}

/* Queue d ns of work on dev; returns its [start, end). Blocks while the queue is full. A rank of a
 * collective (ranks > 1) ends d after the last rank's start instead. */
SIM_FN void sim_enqueue_ranks(struct sim *s, int dev, uint64_t d, int ranks, uint64_t *start, uint64_t *end) {
    struct sim_dev *x = &s->dev[dev % SIM_DEVS];
    uint64_t now = sim_now(), old, st;
    struct sim_proc *me = sim_me(s);
    d = sim_switch_cost(s, dev, d, now, me);
    old = __atomic_load_n(&x->free_at, __ATOMIC_ACQUIRE);
    do {
        st = old > now ? old : now;
    } while (!__atomic_compare_exchange_n(&x->free_at, &old, st + d, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    uint64_t en = st + d;
    if (ranks > 1) { /* the kernel holds the device until every rank's part has started */
        en = sim_rendezvous(s, dev, ranks, st) + d;
        old = __atomic_load_n(&x->free_at, __ATOMIC_ACQUIRE);
        while (old < en &&
               !__atomic_compare_exchange_n(&x->free_at, &old, en, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            ;
    }
    uint64_t i = __atomic_fetch_add(&x->next, 1, __ATOMIC_RELAXED) % SIM_RING;
    __atomic_store_n(&x->ring[i].start, st, __ATOMIC_RELAXED);
    __atomic_store_n(&x->ring[i].end, en, __ATOMIC_RELEASE);
    *start = st;
    *end = en;
    if (me) {
        __atomic_store_n(&me->busy_until[dev % SIM_DEVS], en, __ATOMIC_RELEASE);
        __atomic_fetch_add(&me->busy_ns[dev % SIM_DEVS], en - st, __ATOMIC_RELAXED);
        __atomic_fetch_add(&me->kernels[dev % SIM_DEVS], 1, __ATOMIC_RELAXED);
    }
    uint64_t queue_ns = sim_queue_ns();
    if (st > now + queue_ns)
        sim_sleep_until(st - queue_ns);
}

SIM_FN void sim_enqueue(struct sim *s, int dev, uint64_t d, uint64_t *start, uint64_t *end) {
    sim_enqueue_ranks(s, dev, d, 1, start, end);
}

/* Nanoseconds during which dev ran a kernel in each of n windows of width ns, the first starting at lo, into
 * busy[0..n): one pass over the ring, however many windows (NVML's samples ask for ten). */
SIM_FN void sim_busy_windows(struct sim *s, int dev, uint64_t lo, uint64_t width, int n, uint64_t *busy) {
    struct sim_dev *x = &s->dev[dev % SIM_DEVS];
    uint64_t hi = lo + width * (uint64_t)n;
    for (int k = 0; k < n; k++)
        busy[k] = 0;
    for (int i = 0; i < SIM_RING; i++) {
        uint64_t a = __atomic_load_n(&x->ring[i].start, __ATOMIC_RELAXED);
        uint64_t b = __atomic_load_n(&x->ring[i].end, __ATOMIC_ACQUIRE);
        if (a < lo)
            a = lo;
        if (b > hi)
            b = hi;
        while (b > a) { /* a kernel across a window's end counts in both */
            int k = (int)((a - lo) / width);
            uint64_t e = lo + width * (uint64_t)(k + 1);
            uint64_t t = b < e ? b : e;
            busy[k] += t - a;
            a = t;
        }
    }
    for (int k = 0; k < n; k++)
        if (busy[k] > width)
            busy[k] = width;
}

/* Nanoseconds of [lo, hi) during which dev ran a kernel. */
SIM_FN uint64_t sim_busy_between(struct sim *s, int dev, uint64_t lo, uint64_t hi) {
    uint64_t busy = 0;
    if (hi > lo)
        sim_busy_windows(s, dev, lo, hi - lo, 1, &busy);
    return busy;
}

/* Percent of the last window_ns (0: SIM_WINDOW_NS) during which dev ran a kernel, rounded. */
SIM_FN unsigned sim_utilization(struct sim *s, int dev, uint64_t window_ns) {
    if (window_ns == 0)
        window_ns = SIM_WINDOW_NS;
    uint64_t now = sim_now(), lo = now > window_ns ? now - window_ns : 0;
    uint64_t busy = sim_busy_between(s, dev, lo, now);
    return (unsigned)((busy * 100 + window_ns / 2) / window_ns);
}

SIM_FN void sim_register(struct sim *s, int dev) {
    int32_t me = (int32_t)getpid();
    for (int i = 0; i < SIM_PROCS; i++)
        if (__atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE) == me) {
            __atomic_fetch_or(&s->procs[i].devmask, 1u << dev, __ATOMIC_RELEASE);
            return;
        }
    for (int i = 0; i < SIM_PROCS; i++) {
        int32_t p = __atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE);
        if ((p == 0 || kill(p, 0) != 0) &&
            __atomic_compare_exchange_n(&s->procs[i].pid, &p, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&s->procs[i].devmask, 1u << dev, __ATOMIC_RELEASE);
            for (int d = 0; d < SIM_DEVS; d++) { /* a slot taken over from a dead process starts at zero */
                __atomic_store_n(&s->procs[i].busy_ns[d], 0, __ATOMIC_RELAXED);
                __atomic_store_n(&s->procs[i].kernels[d], 0, __ATOMIC_RELAXED);
                __atomic_store_n(&s->procs[i].busy_until[d], 0, __ATOMIC_RELAXED);
            }
            return;
        }
    }
}

/* Live processes holding a context on dev; their pids in out[] (up to max). */
SIM_FN unsigned sim_processes(struct sim *s, int dev, int32_t *out, unsigned max) {
    unsigned n = 0;
    for (int i = 0; i < SIM_PROCS; i++) {
        int32_t p = __atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE);
        if (p != 0 && (__atomic_load_n(&s->procs[i].devmask, __ATOMIC_ACQUIRE) & (1u << dev)) && kill(p, 0) == 0) {
            if (out && n < max)
                out[n] = p;
            n++;
        }
    }
    return n;
}
#endif
