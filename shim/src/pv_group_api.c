/* The group library's exported functions: what Python calls through ctypes (pyvgpu/native/grouplib.py and
 * groupfiles.py).
 *
 * libpyvgpu_group.so is built from the group core's files alone (pv_grammar.c, pv_env.c, pv_group_*.c), so
 * a CLI process that loads it gets the one implementation of the limits grammar, the environment contract,
 * the region and the turn file without the shim's interposition or its start-up work. The shim is built from
 * the same files. Every function returns 0, or -1 with a one-sentence message in err, unless it says. */
#include <stdio.h>
#include <string.h>

#include "pv_shim.h"

PV_EXPORT int pyvgpu_g_abi(void) { return 2; } /* bumped when a signature below changes */

PV_EXPORT int pyvgpu_g_check_ascii(const char *text, size_t len, const char *where, const char *what,
                                   const char *example, char *err, size_t n) {
    return pv_check_ascii(text, len, where, what, example, err, n);
}
PV_EXPORT int pyvgpu_g_repr(const char *text, size_t len, char *out, size_t n) {
    pv_repr(text, len, out, n);
    return 0;
}
PV_EXPORT int pyvgpu_g_size(const char *text, size_t len, const char *where, uint64_t *out, char *err, size_t n) {
    return pv_parse_size(text, len, where, out, err, n);
}
PV_EXPORT int pyvgpu_g_cap(const char *text, size_t len, const char *where, uint64_t floor, uint64_t *out,
                           char *err, size_t n) {
    return pv_parse_cap(text, len, where, floor, out, err, n);
}
PV_EXPORT int pyvgpu_g_percent(const char *text, size_t len, const char *where, uint32_t *out, char *err,
                               size_t n) {
    return pv_parse_percent(text, len, where, out, err, n);
}
PV_EXPORT int pyvgpu_g_device(const char *text, size_t len, const char *where, int *out, char *err, size_t n) {
    return pv_parse_device(text, len, where, out, err, n);
}
PV_EXPORT int pyvgpu_g_priority(const char *text, size_t len, const char *where, int *out, char *err, size_t n) {
    return pv_parse_priority(text, len, where, out, err, n);
}
PV_EXPORT int pyvgpu_g_switch(const char *text, size_t len, const char *where, int *out, char *err, size_t n) {
    return pv_parse_switch(text, len, where, out, err, n);
}
PV_EXPORT int pyvgpu_g_spec(const char *text, size_t len, const char *where, int kind, uint64_t floor,
                            int64_t *dflt, uint64_t *per, uint32_t *mask, char *err, size_t n) {
    return pv_parse_spec(text, len, where, kind, floor, dflt, per, mask, err, n);
}
PV_EXPORT int pyvgpu_g_env_setting(char *const *envp, int which, int64_t *out, char *err, size_t n) {
    return pv_env_setting(envp, which, out, err, n);
}
PV_EXPORT int pyvgpu_g_env_devices(char *const *envp, int kind, int64_t *dflt, uint64_t *per, uint32_t *mask,
                                   char *err, size_t n) {
    return pv_env_devices(envp, kind, dflt, per, mask, err, n);
}
/* the group's region named by an environment: 0 none, else the length of its path, copied into out */
PV_EXPORT size_t pyvgpu_g_env_region(char *const *envp, char *out, size_t n) {
    const char *path, *var;
    pv_env_region(envp, &path, &var);
    if (!path)
        return 0;
    snprintf(out, n, "%s", path);
    return strlen(path);
}
/* what the shim itself reads at its start, for tests: memory[16], sm[16], {policy, turns, trust_shared,
 * priority, sm_borrow, clock}, batch_ns */
PV_EXPORT int pyvgpu_g_read_env(char *const *envp, uint64_t *memory, uint32_t *sm, int32_t *settings,
                                uint64_t *batch_ns, char *err, size_t n) {
    pv_env_t env;
    if (pv_read_env(envp, &env, err, n))
        return -1;
    memcpy(memory, env.memory, sizeof env.memory);
    memcpy(sm, env.sm, sizeof env.sm);
    int32_t s[] = {(int32_t)env.sm_policy, env.turns, env.trust_shared, env.priority, env.sm_borrow, env.clock};
    memcpy(settings, s, sizeof s);
    *batch_ns = env.sm_batch_ns;
    return 0;
}

/* ---- files, the region, the turn file: fd, or -1 with err and *kind (PV_OPEN_*) ---- */
PV_EXPORT int pyvgpu_g_private_dir(const char *path, const char *what, const char *fix, char *err, size_t n) {
    return pv_private_dir(path, what, fix, err, n);
}
PV_EXPORT int pyvgpu_g_runtime_dir(int make, char *out, size_t len, char *err, size_t n) {
    return make ? pv_runtime_dir(out, len, err, n) : pv_runtime_path(out, len, err, n);
}
PV_EXPORT int pyvgpu_g_open_shared(const char *path, int flags, const char *what, const char *fix, int root_group_ok,
                                   int trust_shared, char *err, size_t n, int *kind) {
    return pv_open_shared(path, flags, what, fix, root_group_ok, trust_shared, err, n, kind);
}
PV_EXPORT int pyvgpu_g_machine_turns_problem(const char *path, int trust_shared, char *why, size_t n) {
    return pv_machine_turns_problem(path, trust_shared, why, n);
}
PV_EXPORT int pyvgpu_g_make_region(const char *path, const void *want, const uint64_t *memory, const uint32_t *sm,
                                   unsigned mode, int64_t uid, int64_t gid, char *err, size_t n) {
    return pv_make_region(path, (const pv_region_header_t *)want, memory, sm, mode, uid, gid, err, n);
}
PV_EXPORT int pyvgpu_g_check_limits(const char *path, const void *region, int kind, const uint64_t *want,
                                    const char *source, char *err, size_t n) {
    const pv_region_header_t *h = (const pv_region_header_t *)region;
    const pv_region_device_t *dev = (const pv_region_device_t *)((const char *)region + PV_REGION_DEVICES_OFF);
    return pv_check_limits(path, h, dev, kind, want, source, err, n);
}
PV_EXPORT uint64_t pyvgpu_g_map_shared(int fd, uint64_t size, const char *path, const char *what, const char *fix,
                                      char *err, size_t n) {
    return (uint64_t)(uintptr_t)pv_map_shared(fd, size, path, what, fix, err, n);
}
PV_EXPORT int pyvgpu_g_turn_path(const char *sched, const char *machine, int trust_shared, char *out, size_t len,
                                 int *own, char *why, size_t whylen, char *err, size_t n) {
    return pv_turn_path(sched, machine, trust_shared, out, len, own, why, whylen, err, n);
}

/* ---- a view of a region, its members, the private groups' collection ---- */
PV_EXPORT int pyvgpu_g_view_region(const char *path, int writable, int trust_shared, void *header, void **addr,
                                   char *err, size_t n, int *kind) {
    return pv_view_region(path, writable, trust_shared, (pv_region_header_t *)header, addr, err, n, kind);
}
PV_EXPORT void pyvgpu_g_unmap(void *addr, uint64_t size) { pv_unmap_view(addr, size); }
PV_EXPORT uint64_t pyvgpu_g_watch_region(const char *path, char *err, size_t n) {
    return (uint64_t)(uintptr_t)pv_watch_region(path, err, n);
}
PV_EXPORT int pyvgpu_g_slots_locked(int fd, uint32_t first, uint32_t count) {
    return pv_slots_locked(fd, first, count);
}
PV_EXPORT int pyvgpu_g_gc_private(const char *dir, uint64_t min_age_ns, int trust_shared) {
    return pv_gc_private(dir, min_age_ns, trust_shared);
}

/* ---- a process's wishes against its group's, live changes (region: the view's address) ---- */
PV_EXPORT int pyvgpu_g_check_devices(const char *path, const void *region, uint32_t n_want, const uint32_t *want,
                                     const uint8_t *uuid, const char *source, char *err, size_t n) {
    return pv_check_devices(path, region, n_want, want, uuid, source, err, n);
}
PV_EXPORT int pyvgpu_g_check_setting(const char *path, const void *region, int which, uint32_t want,
                                     const char *source, char *err, size_t n) {
    return pv_check_setting(path, region, which, want, source, err, n);
}
PV_EXPORT int pyvgpu_g_check_bounds(const char *path, const void *region, uint32_t n_physical,
                                    const uint64_t *physical, char *err, size_t n) {
    return pv_check_bounds(path, region, n_physical, physical, err, n);
}
PV_EXPORT int pyvgpu_g_check_change(const char *path, const void *region, int kind, int64_t dflt, const uint64_t *per,
                                    uint32_t mask, uint32_t n_devices, const uint64_t *total, const char *where,
                                    char *err, size_t n) {
    return pv_check_change(path, region, kind, dflt, per, mask, n_devices, total, where, err, n);
}
PV_EXPORT int pyvgpu_g_set_device_limit(void *region, int kind, int device, uint64_t value, uint64_t *old,
                                        uint64_t *now, char *err, size_t n) {
    return pv_set_device_limit(region, kind, device, value, old, now, err, n);
}
PV_EXPORT int pyvgpu_g_set_setting(void *region, int which, uint32_t value, uint32_t *old, char *err, size_t n) {
    return pv_set_setting(region, which, value, old, err, n);
}

/* ---- the turn file: opened (made when it is this user's), read, set up by root ---- */
PV_EXPORT int pyvgpu_g_use_turns(const char *path, const char *machine, int trust_shared, char *err, size_t n,
                                 int *kind) {
    return pv_use_turns(path, machine, trust_shared, err, n, kind);
}
PV_EXPORT int pyvgpu_g_read_turns(const char *path, const char *machine, int trust_shared, void *out, char *err,
                                  size_t n, int *kind) {
    return pv_read_turns(path, machine, trust_shared, out, err, n, kind) ? -1 : 0;
}
PV_EXPORT int pyvgpu_g_node_turns(const char *path, unsigned mode, char *err, size_t n) {
    return pv_node_turns(path, mode, err, n);
}
PV_EXPORT int pyvgpu_g_setup_turns(const char *path, int gid, unsigned mode, int trust_shared, char *err, size_t n) {
    return pv_setup_turns(path, gid, mode, trust_shared, err, n);
}
