/* What a process asks of its group, checked against the group's region, and a live change of the group's
 * limits (`pyvgpu limits set`): the one implementation. pyvgpu/group/region.py and live.py reach these
 * through libpyvgpu_group.so; the region is an open, checked one (pv_open_region), mapped at h. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "pv_shim.h"

static void group_name(const pv_region_header_t *h, char *out, size_t n) {
    pv_repr((const char *)h->name, strnlen((const char *)h->name, PV_GROUP_NAME_BYTES), out, n);
}

static const pv_region_device_t *devices_of(const pv_region_header_t *h) {
    return (const pv_region_device_t *)((const char *)h + PV_REGION_DEVICES_OFF);
}

/* region.check_devices: the group's devices (n_visible, visible, visible_uuid) against the n ones a process
 * asks for (want[g]: NVML index | PV_VISIBLE_MIG, uuid[16 g..]); none asked is no check. */
int pv_check_devices(const char *path, const pv_region_header_t *h, uint32_t n_want, const uint32_t *want,
                     const uint8_t *uuid, const char *source, char *err, size_t n) {
    if (!n_want)
        return 0;
    uint32_t have = h->n_visible < PV_MAX_DEVICES ? h->n_visible : PV_MAX_DEVICES;
    int same = have == n_want;
    for (uint32_t g = 0; same && g < n_want; g++)
        same = (h->visible[g] & PV_VISIBLE_MIG) == (want[g] & PV_VISIBLE_MIG) &&
               !memcmp(h->visible_uuid + g * PV_UUID_BYTES, uuid + g * PV_UUID_BYTES, PV_UUID_BYTES);
    if (same)
        return 0;
    char h_text[200] = "every device CUDA sees (no --devices)", w_text[200] = "", name[3 * PV_GROUP_NAME_BYTES];
    size_t at = 0;
    for (uint32_t g = 0; g < have; g++)
        at += (size_t)snprintf(h_text + at, sizeof h_text - at, "%s%u", g ? "," : "devices ",
                               h->visible[g] & PV_VISIBLE_INDEX);
    at = 0;
    for (uint32_t g = 0; g < n_want && g < PV_MAX_DEVICES; g++)
        at += (size_t)snprintf(w_text + at, sizeof w_text - at, "%s%u", g ? "," : "", want[g] & PV_VISIBLE_INDEX);
    group_name(h, name, sizeof name);
    return pv_fail(err, n, "group %s (%s) uses %s, but %s asks for %s; use the group's devices, or start a group "
                   "of your own", name, path, h_text, source, w_text);
}

static const char *const SETTING_FIELD[] = {"priority", "sm-borrow"};
static const char *const SETTING_WORDS[][2] = {{"high", "low"}, {"off", "on"}}; /* limits.PRIORITIES, on/off */

static uint32_t *setting(pv_region_header_t *h, int which) {
    return which == PV_SETTING_PRIORITY ? &h->priority : &h->sm_borrow;
}

static void word(int which, uint32_t v, char *out, size_t n) {
    if (v < 2)
        snprintf(out, n, "%s", SETTING_WORDS[which][v]);
    else
        snprintf(out, n, "%u (not a value pyvgpu writes)", v);
}

/* region.check_setting: a group setting of the header (PV_SETTING_*) against what a process asks for */
int pv_check_setting(const char *path, const pv_region_header_t *h, int which, uint32_t want, const char *source,
                     char *err, size_t n) {
    if (which != PV_SETTING_PRIORITY && which != PV_SETTING_SM_BORROW)
        return pv_fail(err, n, "no group setting %d", which);
    uint32_t have = *setting((pv_region_header_t *)h, which);
    if (have == want)
        return 0;
    char name[3 * PV_GROUP_NAME_BYTES], a[64], b[64];
    group_name(h, name, sizeof name);
    word(which, have, a, sizeof a);
    word(which, want, b, sizeof b);
    return pv_fail(err, n, "group %s (%s) has %s %s, but %s asks for %s; change the group's with `pyvgpu limits "
                   "set`, or start a group of your own", name, path, SETTING_FIELD[which], a, source, b);
}

/* region.check_bounds: a cap above its device's memory (physical[d] bytes, n_physical of them, 0 unknown) was
 * not written by pyvgpu (wrap and `limits set` refuse such caps) */
int pv_check_bounds(const char *path, const pv_region_header_t *h, uint32_t n_physical, const uint64_t *physical,
                    char *err, size_t n) {
    const pv_region_device_t *dev = devices_of(h);
    for (uint32_t d = 0; d < PV_MAX_DEVICES && d < n_physical; d++) {
        if (!dev[d].limit || !physical[d] || dev[d].limit <= physical[d])
            continue;
        char a[32], b[32];
        pv_human(dev[d].limit, a, sizeof a);
        pv_human(physical[d], b, sizeof b);
        return pv_fail(err, n, "region %s holds a cap of %s on device %u, more than the device's %s: pyvgpu never "
                       "writes such a cap, so the file was altered; refusing it. Remove it and start the group again",
                       path, a, d, b);
    }
    return 0;
}

/* live.set_limits' checks of a change before anything is changed: kind 0 a memory spec, 1 a compute share
 * spec (dflt -1 or every device's, per[d] for bit d of mask), against the group's n devices and their memory
 * (total[d] bytes; NULL when NVML cannot tell). where names the option. */
int pv_check_change(const char *path, const pv_region_header_t *h, int kind, int64_t dflt, const uint64_t *per,
                    uint32_t mask, uint32_t n_devices, const uint64_t *total, const char *where, char *err, size_t n) {
    char name[3 * PV_GROUP_NAME_BYTES];
    group_name(h, name, sizeof name);
    if (kind && h->mode == PV_MODE_MPS)
        return pv_fail(err, n, "%s: group %s runs in mode mps, where the share is MPS's active-thread percentage, "
                       "fixed when each client starts; start a new group with the new --sm", where, name);
    for (uint32_t d = 0; d < PV_MAX_DEVICES; d++)
        if (mask >> d & 1 && d >= n_devices)
            return pv_fail(err, n, "%s: group %s has no device %u (%u devices)", where, name, d, n_devices);
    for (uint32_t d = 0; !kind && total && d < n_devices && d < PV_MAX_DEVICES; d++) {
        uint64_t want = mask >> d & 1 ? per[d] : dflt < 0 ? 0 : (uint64_t)dflt;
        if (want && want > total[d]) {
            char a[32], b[32];
            pv_human(want, a, sizeof a);
            pv_human(total[d], b, sizeof b);
            return pv_fail(err, n, "%s: %s is more than device %u's %s; give a limit at most the device's memory",
                           where, a, d, b);
        }
    }
    (void)path;
    return 0;
}

static uint32_t sm_any(const pv_region_device_t *dev) {
    uint32_t k = 0;
    for (int d = 0; d < PV_MAX_DEVICES; d++)
        k += dev[d].sm_limit > 0 && dev[d].sm_limit < 100;
    return k;
}

/* region.change_per_device: kind 0 the memory cap, 1 the compute share, of device d (-1: every device) set to
 * value; old[] and now[] get every device's before and after (the caller logs the change). Members read it at
 * their next call. */
int pv_set_device_limit(pv_region_header_t *h, int kind, int device, uint64_t value, uint64_t *old, uint64_t *now,
                        char *err, size_t n) {
    if (device < -1 || device >= PV_MAX_DEVICES)
        return pv_fail(err, n, "device %d is not a device index 0..%d", device, PV_MAX_DEVICES - 1);
    if (kind && value > 100)
        return pv_fail(err, n, "a compute share of %llu%% is not 0..100", (unsigned long long)value);
    pv_region_device_t *dev = (pv_region_device_t *)devices_of(h);
    for (int d = 0; d < PV_MAX_DEVICES; d++) {
        old[d] = kind ? dev[d].sm_limit : dev[d].limit;
        if (device < 0 || d == device) {
            if (kind)
                dev[d].sm_limit = (uint32_t)value;
            else
                dev[d].limit = value;
        }
        now[d] = kind ? dev[d].sm_limit : dev[d].limit;
    }
    if (kind)
        h->sm_any = sm_any(dev);
    return 0;
}

/* region.change_setting: a group setting (PV_SETTING_*) set to value (0 or 1); *old gets the one before */
int pv_set_setting(pv_region_header_t *h, int which, uint32_t value, uint32_t *old, char *err, size_t n) {
    if ((which != PV_SETTING_PRIORITY && which != PV_SETTING_SM_BORROW) || value > 1)
        return pv_fail(err, n, "group setting %d cannot be %u", which, value);
    *old = *setting(h, which);
    *setting(h, which) = value;
    return 0;
}
