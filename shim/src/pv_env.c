/* The environment contract, read in C: HAMi's CUDA_DEVICE_MEMORY_LIMIT[_i],
 * CUDA_DEVICE_SM_LIMIT[_i], GPU_CORE_UTILIZATION_POLICY, the group's region
 * (PYVGPU_REGION, CUDA_DEVICE_MEMORY_SHARED_CACHE) and PYVGPU_SM_BATCH_MS,
 * PYVGPU_SM_TURN, PYVGPU_MIN_MEMORY.
 *
 * The grammar is pyvgpu/limits.py's (README, "Sizes"), so that a process with
 * no interpreter reads the variables exactly as `pyvgpu wrap` does: the same
 * values, the same refusals. tests/test_sizes.py runs every case through both
 * readers. The messages name the variable, its value and what to write; they
 * are shorter than Python's (no Unicode character names).
 *
 * No allocation, no locale: this runs inside the program, at its first CUDA
 * or NVML call. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "pv_shim.h"

#define PV_MAX_SIZE ((uint64_t)INT64_MAX)
#define PV_MIN_MEMORY (64ull << 20)
#define PV_DEFAULT_BATCH_MS 10

/* Python's str.isspace() for ASCII: what str.strip() and the regex's \s take */
static int space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }
static int digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int letter(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }

/* The first byte outside ASCII, or -1. */
static int not_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80)
            return (unsigned char)*s;
    return -1;
}

static int fail(char *err, size_t n, const char *fmt, const char *where, const char *text, const char *tail) {
    snprintf(err, n, fmt, where, text, tail);
    return -1;
}

static int ascii_refused(const char *where, const char *text, const char *what, const char *example, char *err,
                         size_t n) {
    int b = not_ascii(text);
    if (b < 0)
        return 0;
    snprintf(err, n, "%s: '%s' has a character outside ASCII (a byte 0x%02X); write %s with ASCII digits and "
             "letters only, e.g. %s", where, text, b, what, example);
    return -1;
}

/* [begin, end) of text without the spaces around it */
static void strip(const char *text, const char **b, const char **e) {
    *b = text;
    *e = text + strlen(text);
    while (*b < *e && space((unsigned char)**b))
        (*b)++;
    while (*e > *b && space((unsigned char)(*e)[-1]))
        (*e)--;
}

/* limits.py _ascii_int: 1-30 ASCII digits between spaces; 0 if it is one (value in *out, capped) */
static int ascii_int(const char *b, const char *e, uint64_t *out) {
    while (b < e && space((unsigned char)*b))
        b++;
    while (e > b && space((unsigned char)e[-1]))
        e--;
    if (b == e || e - b > 30)
        return -1;
    uint64_t v = 0;
    for (const char *p = b; p < e; p++) {
        if (!digit((unsigned char)*p))
            return -1;
        v = v > UINT64_MAX / 16 ? UINT64_MAX / 16 : v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

static const struct { const char *unit; unsigned shift; } UNITS[] = {
    {"", 0}, {"b", 0}, {"k", 10}, {"ki", 10}, {"kib", 10}, {"m", 20}, {"mi", 20}, {"mib", 20},
    {"g", 30}, {"gi", 30}, {"gib", 30}, {"t", 40}, {"ti", 40}, {"tib", 40},
};
static const char *const DECIMAL_UNITS[] = {"kb", "mb", "gb", "tb"};
#define SIZE_HELP "a number of bytes, or a number with a binary unit K, M, G or T (also Ki, Mi, Gi, Ti), e.g. 4G, " \
                  "4.5G or 512Mi"

void pv_human(uint64_t v, char *out, size_t n) {
    static const struct { const char *name; unsigned shift; } U[] = {{"TiB", 40}, {"GiB", 30}, {"MiB", 20},
                                                                    {"KiB", 10}};
    for (unsigned i = 0; i < sizeof U / sizeof *U; i++) {
        uint64_t div = 1ull << U[i].shift;
        if (v >= div) {
            if (v % div == 0)
                snprintf(out, n, "%llu %s", (unsigned long long)(v / div), U[i].name);
            else
                snprintf(out, n, "%.2f %s", (double)v / (double)div, U[i].name);
            return;
        }
    }
    snprintf(out, n, "%llu B", (unsigned long long)v);
}

int pv_parse_size(const char *text, const char *where, uint64_t *out, char *err, size_t n) {
    if (ascii_refused(where, text, "sizes", "4G", err, n))
        return -1;
    const char *b, *e;
    strip(text, &b, &e);
    const char *p = b;
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    int nint = 0, nfrac = 0, point = 0;
    while (p < e && digit((unsigned char)*p) && nint <= 30) {
        whole = whole * 10 + (unsigned)(*p++ - '0');
        nint++;
    }
    if (p < e && *p == '.' && nint <= 30) {
        point = 1;
        p++;
        while (p < e && digit((unsigned char)*p) && nfrac <= 30) {
            frac = frac * 10 + (unsigned)(*p++ - '0');
            scale *= 10;
            nfrac++;
        }
    }
    int number = nint <= 30 && nfrac <= 30 && (nint > 0 || (point && nfrac > 0));
    while (p < e && space((unsigned char)*p))
        p++;
    char unit[4] = {0};
    int nunit = 0;
    while (p < e && letter((unsigned char)*p) && nunit < 3)
        unit[nunit++] = (char)(*p++ | 32);
    if (number && p == e) {
        for (unsigned i = 0; i < sizeof DECIMAL_UNITS / sizeof *DECIMAL_UNITS; i++)
            if (!strcmp(unit, DECIMAL_UNITS[i]))
                return fail(err, n, "%s: '%s' is ambiguous (Kubernetes reads KB, MB, GB and TB as powers of 10, "
                            "HAMi and nvidia-smi as powers of 2)%s", where, text,
                            "; write K, M, G or T (or Ki, Mi, Gi, Ti) for binary units, as pyvgpu reads them, or "
                            "the number of bytes for decimal ones");
        for (unsigned i = 0; i < sizeof UNITS / sizeof *UNITS; i++) {
            if (strcmp(unit, UNITS[i].unit))
                continue;
            if (whole > PV_MAX_SIZE)
                return fail(err, n, "%s: '%s' is too large (the most is %s bytes)", where, text,
                            "9223372036854775807");
            /* floor(0.frac * 2^shift), exactly: binary long division of frac by 10^nfrac */
            unsigned __int128 rem = frac, bits = 0;
            for (unsigned k = 0; k < UNITS[i].shift; k++) {
                rem *= 2;
                bits = bits * 2 + (rem >= scale);
                if (rem >= scale)
                    rem -= scale;
            }
            unsigned __int128 v = (whole << UNITS[i].shift) + bits;
            if (v > PV_MAX_SIZE)
                return fail(err, n, "%s: '%s' is too large (the most is %s bytes)", where, text,
                            "9223372036854775807");
            if (v == 0)
                return fail(err, n, "%s: '%s' would refuse every allocation%s", where, text,
                            "; give a positive size, or leave the limit out for no limit");
            *out = (uint64_t)v;
            return 0;
        }
    }
    return fail(err, n, "%s: '%s' is not a size; give %s", where, text, SIZE_HELP);
}

static int env_get(char *const *envp, const char *name, const char **value) {
    size_t len = strlen(name);
    *value = NULL;
    for (char *const *p = envp; p && *p; p++)
        if (!strncmp(*p, name, len) && (*p)[len] == '=')
            *value = *p + len + 1; /* the last one wins, as in os.environ */
    return *value != NULL;
}

static int min_memory(char *const *envp, uint64_t *out, char *err, size_t n) {
    const char *t;
    *out = PV_MIN_MEMORY;
    if (!env_get(envp, PV_ENV_MIN_MEMORY, &t))
        return 0;
    const char *b, *e;
    strip(t, &b, &e);
    if (b == e)
        return 0;
    return pv_parse_size(t, PV_ENV_MIN_MEMORY, out, err, n);
}

int pv_parse_cap(const char *text, const char *where, uint64_t floor, uint64_t *out, char *err, size_t n) {
    if (pv_parse_size(text, where, out, err, n))
        return -1;
    if (*out >= floor)
        return 0;
    char have[32], least[32], hint[128];
    pv_human(*out, have, sizeof have);
    pv_human(floor, least, sizeof least);
    const char *b, *e;
    uint64_t bare;
    strip(text, &b, &e);
    if (!ascii_int(b, e, &bare))
        snprintf(hint, sizeof hint, "; a bare number is bytes: did you mean %.*sM or %.*sMi?", (int)(e - b), b,
                 (int)(e - b), b);
    else
        snprintf(hint, sizeof hint, "; give a larger cap");
    snprintf(err, n, "%s: %s is below the smallest memory cap, %s: a CUDA context alone takes more (PyTorch's "
             "took 524 MiB on an H100), so the program would fail at its first CUDA call%s", where, have, least,
             hint);
    return -1;
}

int pv_parse_percent(const char *text, const char *where, uint32_t *out, char *err, size_t n) {
    if (ascii_refused(where, text, "a compute share", "30", err, n))
        return -1;
    const char *b, *e;
    uint64_t v;
    strip(text, &b, &e);
    if (e > b && e[-1] == '%')
        e--;
    if (ascii_int(b, e, &v) || v < 1 || v > 100)
        return fail(err, n, "%s: '%s' is not a compute share%s", where, text,
                    "; give a whole percent from 1 to 100 (100 = the whole device), or leave the limit out");
    *out = (uint32_t)v;
    return 0;
}

/* the device index after "<base>_" in a variable's name */
static int device_of(const char *name, size_t base_len, char *err, size_t n) {
    char var[128], idx[64];
    size_t vl = strcspn(name, "=");
    snprintf(var, sizeof var, "%.*s", (int)vl, name);
    snprintf(idx, sizeof idx, "%.*s", (int)(vl - base_len - 1), name + base_len + 1);
    if (ascii_refused(var, idx, "device indices", "0=2G,1=6G", err, n))
        return -1;
    uint64_t d;
    if (ascii_int(idx, idx + strlen(idx), &d) || d >= PV_MAX_DEVICES) {
        snprintf(err, n, "%s: '%s' is not a device index 0..%d", var, idx, PV_MAX_DEVICES - 1);
        return -1;
    }
    return (int)d;
}

/* The index of text (spaces around it ignored, any case) among names; empty text is the first; -1 if none */
static int one_of(const char *text, const char *const *names, int count) {
    const char *b, *e;
    strip(text, &b, &e);
    if (b == e)
        return 0;
    for (int i = 0; i < count; i++)
        if ((size_t)(e - b) == strlen(names[i]) && !strncasecmp(b, names[i], (size_t)(e - b)))
            return i;
    return -1;
}

int pv_read_env(char *const *envp, pv_env_t *env, char *err, size_t n) {
    memset(env, 0, sizeof *env);
    const char *t;
    char where[128];
    /* GPU_CORE_UTILIZATION_POLICY */
    if (env_get(envp, PV_ENV_GPU_CORE_UTILIZATION_POLICY, &t)) {
        static const char *const names[] = {"default", "force", "disable"};
        int found = one_of(t, names, 3);
        if (found < 0)
            return fail(err, n, "%s='%s' is not one of default, force, disable%s", PV_ENV_GPU_CORE_UTILIZATION_POLICY,
                        t, "");
        env->sm_policy = (uint32_t)found;
    }
    /* PYVGPU_SM_BATCH_MS */
    env->sm_batch_ns = PV_DEFAULT_BATCH_MS * 1000000ull;
    if (env_get(envp, PV_ENV_SM_BATCH_MS, &t)) {
        const char *b, *e;
        uint64_t ms;
        strip(t, &b, &e);
        if (b != e) {
            if (ascii_int(b, e, &ms) || ms > 1000)
                return fail(err, n, "%s='%s': give whole milliseconds from 0 to 1000%s", PV_ENV_SM_BATCH_MS, t,
                            "");
            env->sm_batch_ns = ms * 1000000ull;
        }
    }
    /* PYVGPU_SM_TURN */
    env->turns = 1;
    if (env_get(envp, PV_ENV_SM_TURN, &t)) {
        const char *b, *e;
        strip(t, &b, &e);
        if (e - b > 1 || (e - b == 1 && *b != '0' && *b != '1'))
            return fail(err, n, "%s='%s': give 1 (groups with a share take turns on a GPU, the default) or 0 (they "
                        "time-slice it)%s", PV_ENV_SM_TURN, t, "");
        env->turns = !(e - b == 1 && *b == '0');
    }
    /* PYVGPU_CLOCK (pyvgpu/limits.py clock_mode) */
    if (env_get(envp, PV_ENV_CLOCK, &t)) {
        static const char *const names[] = {"auto", "tsc", "system"};
        int found = one_of(t, names, 3);
        if (found < 0)
            return fail(err, n, "%s='%s' is not one of auto (the TSC where the kernel's clock runs on it, the "
                        "default), tsc, system%s", PV_ENV_CLOCK, t, "");
        env->clock = found;
    }
    /* PYVGPU_TRUST_SHARED (pyvgpu/safefile.py trust_shared) */
    if (env_get(envp, PV_ENV_TRUST_SHARED, &t)) {
        const char *b, *e;
        strip(t, &b, &e);
        if (e - b > 1 || (e - b == 1 && *b != '0' && *b != '1'))
            return fail(err, n, "%s='%s': give 1 (use regions and turn files that another user owns or others can "
                        "write) or 0 (the default: refuse them)%s", PV_ENV_TRUST_SHARED, t, "");
        env->trust_shared = e - b == 1 && *b == '1';
    }
    /* CUDA_TASK_PRIORITY (limits.priority_from_env) and PYVGPU_SM_BORROW (limits.sm_borrow_from_env): a new
     * group's settings; a member follows its group's */
    env->priority = env->sm_borrow = -1;
    if (env_get(envp, PV_ENV_CUDA_TASK_PRIORITY, &t)) {
        static const char *const words[][2] = {{"high", "0"}, {"low", "1"}};
        const char *b, *e;
        if (ascii_refused(PV_ENV_CUDA_TASK_PRIORITY, t, "a priority", "high", err, n))
            return -1;
        strip(t, &b, &e);
        for (int p = 0; p < 2 && b != e && env->priority < 0; p++)
            for (int w = 0; w < 2; w++)
                if ((size_t)(e - b) == strlen(words[p][w]) && !strncasecmp(b, words[p][w], (size_t)(e - b)))
                    env->priority = p;
        if (b != e && env->priority < 0)
            return fail(err, n, "%s: '%s' is not a priority; give high (HAMi's 0) or low (HAMi's 1, the default)%s",
                        PV_ENV_CUDA_TASK_PRIORITY, t, "");
    }
    if (env_get(envp, PV_ENV_SM_BORROW, &t)) {
        static const char *const on[] = {"on", "1", "true", "yes"}, *const off[] = {"off", "0", "false", "no"};
        const char *b, *e;
        strip(t, &b, &e);
        for (int i = 0; i < 4 && b != e && env->sm_borrow < 0; i++) {
            if ((size_t)(e - b) == strlen(on[i]) && !strncasecmp(b, on[i], (size_t)(e - b)))
                env->sm_borrow = 1;
            else if ((size_t)(e - b) == strlen(off[i]) && !strncasecmp(b, off[i], (size_t)(e - b)))
                env->sm_borrow = 0;
        }
        if (b != e && env->sm_borrow < 0)
            return fail(err, n, "%s: '%s' is neither on nor off; give on (or 1) or off (or 0)%s", PV_ENV_SM_BORROW,
                        t, "");
    }
    /* memory: CUDA_DEVICE_MEMORY_LIMIT, then CUDA_DEVICE_MEMORY_LIMIT_<i> over it */
    uint64_t floor;
    if (min_memory(envp, &floor, err, n))
        return -1;
    static const char MEM[] = PV_ENV_CUDA_DEVICE_MEMORY_LIMIT, SM[] = PV_ENV_CUDA_DEVICE_SM_LIMIT;
    uint64_t mem_default = 0, mem_dev[PV_MAX_DEVICES] = {0};
    uint32_t sm_default = 0, sm_dev[PV_MAX_DEVICES] = {0};
    if (env_get(envp, MEM, &t) && *t) {
        if (pv_parse_cap(t, MEM, floor, &mem_default, err, n))
            return -1;
        env->any_memory = 1;
    }
    if (env_get(envp, SM, &t) && *t) {
        const char *b, *e;
        strip(t, &b, &e);
        if (!(e - b == 1 && *b == '0')) { /* 0: no limit, as in HAMi */
            if (pv_parse_percent(t, SM, &sm_default, err, n))
                return -1;
            env->any_sm = 1;
        }
    }
    for (char *const *p = envp; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        if (!eq || !eq[1])
            continue;
        int is_mem = !strncmp(*p, MEM, sizeof MEM - 1) && (*p)[sizeof MEM - 1] == '_';
        int is_sm = !strncmp(*p, SM, sizeof SM - 1) && (*p)[sizeof SM - 1] == '_';
        if (!is_mem && !is_sm)
            continue;
        int d = device_of(*p, is_mem ? sizeof MEM - 1 : sizeof SM - 1, err, n);
        if (d < 0)
            return -1;
        snprintf(where, sizeof where, "%.*s", (int)(eq - *p), *p);
        if (is_mem) {
            if (pv_parse_cap(eq + 1, where, floor, &mem_dev[d], err, n))
                return -1;
            env->any_memory = 1;
        } else {
            const char *b, *e;
            strip(eq + 1, &b, &e);
            if (e - b == 1 && *b == '0')
                continue;
            if (pv_parse_percent(eq + 1, where, &sm_dev[d], err, n))
                return -1;
            env->any_sm = 1;
        }
    }
    for (int d = 0; d < PV_MAX_DEVICES; d++) {
        env->memory[d] = mem_dev[d] ? mem_dev[d] : mem_default;
        env->sm[d] = sm_dev[d] ? sm_dev[d] : sm_default;
    }
    /* the group's region */
    if (env_get(envp, PV_ENV_REGION, &t) && *t) {
        env->region = t;
        env->region_var = PV_ENV_REGION;
    } else if (env_get(envp, PV_ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, &t) && *t) {
        env->region = t;
        env->region_var = PV_ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE;
    }
    return 0;
}

/* For tests/test_sizes.py: the same cases as pyvgpu/limits.py. */
PV_EXPORT int pyvgpu_parse_size(const char *text, const char *where, uint64_t *out, char *err, size_t n) {
    return pv_parse_size(text, where, out, err, n);
}
PV_EXPORT int pyvgpu_parse_percent(const char *text, const char *where, uint32_t *out, char *err, size_t n) {
    return pv_parse_percent(text, where, out, err, n);
}
/* {priority, sm_borrow} (-1: unset) out of an environment array, for tests/test_turns.py */
PV_EXPORT int pyvgpu_read_group_env(char *const *envp, int32_t *out, char *err, size_t n) {
    pv_env_t env;
    if (pv_read_env(envp, &env, err, n))
        return -1;
    out[0] = env.priority;
    out[1] = env.sm_borrow;
    return 0;
}

/* memory[16], sm[16], {policy, turns, trust_shared}, batch_ns out of an environment array */
PV_EXPORT int pyvgpu_read_env(char *const *envp, uint64_t *memory, uint32_t *sm, uint32_t *policy_turns,
                              uint64_t *batch_ns, char *err, size_t n) {
    pv_env_t env;
    if (pv_read_env(envp, &env, err, n))
        return -1;
    memcpy(memory, env.memory, sizeof env.memory);
    memcpy(sm, env.sm, sizeof env.sm);
    policy_turns[0] = env.sm_policy;
    policy_turns[1] = (uint32_t)env.turns;
    policy_turns[2] = (uint32_t)env.trust_shared;
    *batch_ns = env.sm_batch_ns;
    return 0;
}
