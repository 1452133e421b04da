/* The environment contract, read in C, the one reader: HAMi's CUDA_DEVICE_MEMORY_LIMIT[_i],
 * CUDA_DEVICE_SM_LIMIT[_i], GPU_CORE_UTILIZATION_POLICY, CUDA_TASK_PRIORITY, the group's region
 * (PYVGPU_REGION, CUDA_DEVICE_MEMORY_SHARED_CACHE) and PYVGPU_SM_BATCH_MS, PYVGPU_SM_TURN, PYVGPU_CLOCK,
 * PYVGPU_TRUST_SHARED, PYVGPU_SM_BORROW, PYVGPU_MIN_MEMORY, and PYVGPU_GROUP_IDLE_HOURS, which only pyvgpu's
 * commands read (pyvgpu/contract/envspec.py says what each means).
 *
 * The shim reads them inside the program; `pyvgpu wrap` and the device plugin reach the same functions
 * through libpyvgpu_group.so (pyvgpu/native/grouplib.py), so a variable is read one way with one message.
 * The values follow the grammar of pv_grammar.c. No allocation, no locale. */
#include <stdio.h>
#include <string.h>

#include "pv_shim.h"

#define PV_MIN_MEMORY (64ull << 20)
#define PV_DEFAULT_BATCH_MS 10
#define PV_DEFAULT_IDLE_HOURS 12 /* envspec.GROUP_IDLE_HOURS */

static int env_get(char *const *envp, const char *name, const char **value) {
    size_t len = strlen(name);
    *value = NULL;
    for (char *const *p = envp; p && *p; p++)
        if (!strncmp(*p, name, len) && (*p)[len] == '=')
            *value = *p + len + 1; /* the last one wins, as in os.environ */
    return *value != NULL;
}

/* the value of a variable without the spaces around it ("" when unset) */
static void stripped(char *const *envp, const char *name, const char **b, const char **e) {
    const char *t;
    if (!env_get(envp, name, &t))
        t = "";
    pv_strip(t, strlen(t), b, e);
}

/* "NAME='value': what to give" with the stripped value, as Python's f"{NAME}={text!r}..." */
static int refuse(const char *name, const char *b, const char *e, const char *rest, char *err, size_t n) {
    char shown[256];
    pv_repr(b, (size_t)(e - b), shown, sizeof shown);
    return pv_fail(err, n, "%s=%s%s", name, shown, rest);
}

/* a variable that is empty, 0 or 1: *out = its value, or dflt when empty */
static int zero_one(char *const *envp, const char *name, int dflt, const char *rest, int *out, char *err, size_t n) {
    const char *b, *e;
    stripped(envp, name, &b, &e);
    if (e - b > 1 || (e - b == 1 && *b != '0' && *b != '1'))
        return refuse(name, b, e, rest, err, n);
    *out = b == e ? dflt : *b == '1';
    return 0;
}

/* hours as [+]digits[.digits] below a million, no locale; 0 with *ns, or -1 */
static int hours_ns(const char *b, const char *e, int64_t *ns) {
    double v = 0, scale = 1;
    int digits = 0, point = 0;
    for (const char *p = b + (*b == '+'); p < e; p++) {
        if (*p == '.' && !point)
            point = 1;
        else if (*p >= '0' && *p <= '9') {
            digits++;
            if (point)
                v += (*p - '0') * (scale /= 10);
            else
                v = v * 10 + (*p - '0');
        } else
            return -1;
    }
    if (!digits || v >= 1e6)
        return -1;
    *ns = (int64_t)(v * 3.6e12);
    return 0;
}

int pv_env_setting(char *const *envp, int which, int64_t *out, char *err, size_t n) {
    const char *b, *e, *t;
    uint64_t v;
    int got = 0;
    switch (which) {
    case PV_SET_POLICY: {
        static const char *const names[] = {"default", "force", "disable"};
        stripped(envp, PV_ENV_GPU_CORE_UTILIZATION_POLICY, &b, &e);
        int found = b == e ? 0 : pv_word(b, (size_t)(e - b), names, 3);
        if (found < 0) {
            char shown[256];
            env_get(envp, PV_ENV_GPU_CORE_UTILIZATION_POLICY, &t);
            pv_repr(t, strlen(t), shown, sizeof shown);
            return pv_fail(err, n, "%s=%s is not one of default, force, disable", PV_ENV_GPU_CORE_UTILIZATION_POLICY,
                           shown);
        }
        *out = found;
        return 0;
    }
    case PV_SET_BATCH_NS:
        stripped(envp, PV_ENV_SM_BATCH_MS, &b, &e);
        if (b == e) {
            *out = PV_DEFAULT_BATCH_MS * 1000000ll;
            return 0;
        }
        if (pv_ascii_int(b, e, &v) || v > 1000)
            return refuse(PV_ENV_SM_BATCH_MS, b, e, ": give whole milliseconds from 0 to 1000", err, n);
        *out = (int64_t)v * 1000000;
        return 0;
    case PV_SET_TURNS:
        if (zero_one(envp, PV_ENV_SM_TURN, 1, ": give 1 (groups with a share take turns on a GPU, the default) or 0 "
                     "(they time-slice it)", &got, err, n))
            return -1;
        *out = got;
        return 0;
    case PV_SET_CLOCK: {
        static const char *const names[] = {"auto", "tsc", "system"};
        stripped(envp, PV_ENV_CLOCK, &b, &e);
        int found = b == e ? 0 : pv_word(b, (size_t)(e - b), names, 3);
        if (found < 0)
            return refuse(PV_ENV_CLOCK, b, e, " is not one of auto (the TSC where the kernel's clock runs on it, the "
                          "default), tsc, system", err, n);
        *out = found;
        return 0;
    }
    case PV_SET_TRUST_SHARED:
        if (zero_one(envp, PV_ENV_TRUST_SHARED, 0, ": give 1 (use regions and turn files that another user owns or "
                     "others can write) or 0 (the default: refuse them)", &got, err, n))
            return -1;
        *out = got;
        return 0;
    case PV_SET_PRIORITY: /* a new group's; -1 unset */
        *out = -1;
        if (!env_get(envp, PV_ENV_CUDA_TASK_PRIORITY, &t) || (pv_strip(t, strlen(t), &b, &e), b == e))
            return 0;
        if (pv_parse_priority(t, strlen(t), PV_ENV_CUDA_TASK_PRIORITY, &got, err, n))
            return -1;
        *out = got;
        return 0;
    case PV_SET_SM_BORROW: /* a new group's; -1 unset */
        *out = -1;
        if (!env_get(envp, PV_ENV_SM_BORROW, &t) || (pv_strip(t, strlen(t), &b, &e), b == e))
            return 0;
        if (pv_parse_switch(t, strlen(t), PV_ENV_SM_BORROW, &got, err, n))
            return -1;
        *out = got;
        return 0;
    case PV_SET_GROUP_IDLE_NS: /* read by `pyvgpu wrap` and `group ls`, not by the shim */
        stripped(envp, PV_ENV_GROUP_IDLE_HOURS, &b, &e);
        *out = b == e ? PV_DEFAULT_IDLE_HOURS * 3600000000000ll : 0;
        return b == e || !hours_ns(b, e, out) ? 0
               : refuse(PV_ENV_GROUP_IDLE_HOURS, b, e, " is not a number of hours; give e.g. 12, 0.5, or 0 for never",
                        err, n);
    case PV_SET_MIN_MEMORY:
        *out = (int64_t)PV_MIN_MEMORY;
        stripped(envp, PV_ENV_MIN_MEMORY, &b, &e);
        if (b == e)
            return 0;
        if (pv_parse_size(b, (size_t)(e - b), PV_ENV_MIN_MEMORY, &v, err, n))
            return -1;
        *out = (int64_t)v;
        return 0;
    }
    return pv_fail(err, n, "no setting %d", which);
}

int pv_env_devices(char *const *envp, int kind, int64_t *dflt, uint64_t *per, uint32_t *mask, char *err, size_t n) {
    const char *base = kind ? PV_ENV_CUDA_DEVICE_SM_LIMIT : PV_ENV_CUDA_DEVICE_MEMORY_LIMIT, *t;
    size_t bl = strlen(base);
    int64_t floor = -1; /* PYVGPU_MIN_MEMORY, read at the first cap */
    uint32_t pct;
    *dflt = -1;
    *mask = 0;
    /* one value: a cap, or a share where 0 (spaces around it allowed) is no limit, as in HAMi */
#define ONE(text, where, dst, none)                                                                                \
    do {                                                                                                           \
        const char *b_, *e_;                                                                                       \
        pv_strip(text, strlen(text), &b_, &e_);                                                                    \
        none = kind && e_ - b_ == 1 && *b_ == '0';                                                                 \
        if (none)                                                                                                  \
            break;                                                                                                 \
        if (!kind && floor < 0 && pv_env_setting(envp, PV_SET_MIN_MEMORY, &floor, err, n))                         \
            return -1;                                                                                             \
        if (kind ? pv_parse_percent(text, strlen(text), where, &pct, err, n)                                       \
                 : pv_parse_cap(text, strlen(text), where, (uint64_t)floor, &dst, err, n))                         \
            return -1;                                                                                             \
        if (kind)                                                                                                  \
            dst = pct;                                                                                             \
    } while (0)
    int none;
    uint64_t v = 0;
    if (env_get(envp, base, &t) && *t) {
        ONE(t, base, v, none);
        if (!none)
            *dflt = (int64_t)v;
    }
    for (char *const *p = envp; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        if (!eq || !eq[1] || strncmp(*p, base, bl) || (*p)[bl] != '_')
            continue;
        char where[128];
        int d;
        snprintf(where, sizeof where, "%.*s", (int)(eq - *p), *p);
        if (pv_parse_device(*p + bl + 1, (size_t)(eq - *p - (ptrdiff_t)bl - 1), where, &d, err, n))
            return -1;
        ONE(eq + 1, where, per[d], none);
        if (!none)
            *mask |= 1u << d;
    }
#undef ONE
    return 0;
}

/* the group's region: PYVGPU_REGION, else HAMi's CUDA_DEVICE_MEMORY_SHARED_CACHE (a non-empty value) */
void pv_env_region(char *const *envp, const char **path, const char **var) {
    const char *t;
    *path = *var = NULL;
    if (env_get(envp, PV_ENV_REGION, &t) && *t)
        *path = t, *var = PV_ENV_REGION;
    else if (env_get(envp, PV_ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, &t) && *t)
        *path = t, *var = PV_ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE;
}

int pv_read_env(char *const *envp, pv_env_t *env, char *err, size_t n) {
    memset(env, 0, sizeof *env);
    int64_t s[PV_N_SETTINGS];
    for (int i = 0; i < PV_N_SETTINGS; i++)
        if (pv_env_setting(envp, i, &s[i], err, n))
            return -1;
    env->sm_policy = (uint32_t)s[PV_SET_POLICY];
    env->sm_batch_ns = (uint64_t)s[PV_SET_BATCH_NS];
    env->turns = (int)s[PV_SET_TURNS];
    env->clock = (int)s[PV_SET_CLOCK];
    env->trust_shared = (int)s[PV_SET_TRUST_SHARED];
    env->priority = (int)s[PV_SET_PRIORITY];
    env->sm_borrow = (int)s[PV_SET_SM_BORROW];
    int64_t mem_default, sm_default;
    uint64_t mem_dev[PV_MAX_DEVICES] = {0}, sm_dev[PV_MAX_DEVICES] = {0};
    uint32_t mem_mask, sm_mask;
    if (pv_env_devices(envp, 0, &mem_default, mem_dev, &mem_mask, err, n) ||
        pv_env_devices(envp, 1, &sm_default, sm_dev, &sm_mask, err, n))
        return -1;
    env->any_memory = mem_default >= 0 || mem_mask;
    env->any_sm = sm_default >= 0 || sm_mask;
    for (int d = 0; d < PV_MAX_DEVICES; d++) {
        env->memory[d] = mem_mask >> d & 1 ? mem_dev[d] : mem_default > 0 ? (uint64_t)mem_default : 0;
        env->sm[d] = (uint32_t)(sm_mask >> d & 1 ? sm_dev[d] : sm_default > 0 ? (uint64_t)sm_default : 0);
    }
    pv_env_region(envp, &env->region, &env->region_var);
    return 0;
}
