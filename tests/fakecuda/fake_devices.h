/* The simulated devices, shared by the fake libcuda and libnvidia-ml so both
 * see the same machine: FAKECUDA_DEVICES="16G,8G" lists capacities
 * (default: two devices of 16 GiB and 8 GiB). These are the physical
 * devices, in NVML's order; CUDA_VISIBLE_DEVICES (fake libcuda only) picks
 * and orders the CUDA devices among them.
 *
 * Physical device i has
 *   UUID    bytes fa 4e c0 da 00 .. 00 i, text "GPU-fa4ec0da-0000-0000-0000-0000000000XX" (XX: i, 2 hex digits)
 *   PCI bus "00000000:XX:00.0" (XX: i + 1, 2 hex digits)
 *   serial  "FAKE%04d" of i (NVML)
 *
 * MIG (a test double of what NVML and CUDA document; no MIG hardware was
 * used): FAKENVML_MIG="0:1g.4gb:4G,0:2g.8gb:8G,1:3g.4gb:4G" lists the MIG
 * instances (GPU index, profile, memory), in order. A GPU with an instance
 * is in MIG mode. Instance k (0-based, in this list) has
 *   UUID    bytes fa 4e c0 da 4d 49 00 .. 00 g k, text "MIG-fa4ec0da-4d49-0000-0000-0000000000GGKK"
 *   GPU instance id: 1 + how many instances of its GPU come before it; compute instance id 0
 *   slot    nphys + k: the index of its per-device state (memory, clock, processes) in both fakes */
#ifndef FAKE_DEVICES_H
#define FAKE_DEVICES_H
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEV 16
#define FAKE_FN static __attribute__((unused))
#define FAKE_UUID_LEN 40 /* "GPU-" + 36 */

/* "4G", "512m", "1048576": binary K/M/G/T suffixes */
FAKE_FN uint64_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (toupper((unsigned char)*end)) {
    case 'T': v <<= 10; /* fallthrough */
    case 'G': v <<= 10; /* fallthrough */
    case 'M': v <<= 10; /* fallthrough */
    case 'K': v <<= 10; break;
    default: break;
    }
    return v;
}

/* Fill caps[] from FAKECUDA_DEVICES; returns the number of devices. */
FAKE_FN int fake_device_caps(uint64_t caps[MAX_DEV]) {
    const char *d = getenv("FAKECUDA_DEVICES");
    char buf[512];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", d && *d ? d : "16G,8G");
    for (char *tok = strtok(buf, ","); tok && n < MAX_DEV; tok = strtok(NULL, ","))
        caps[n++] = parse_size(tok);
    return n;
}

FAKE_FN void fake_uuid_bytes(int i, unsigned char b[16]) {
    static const unsigned char head[4] = {0xfa, 0x4e, 0xc0, 0xda};
    memset(b, 0, 16);
    memcpy(b, head, 4);
    b[15] = (unsigned char)i;
}

/* The text form of 16 UUID bytes: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (out: FAKE_UUID_LEN + 1 bytes). */
FAKE_FN void fake_uuid_format(const unsigned char b[16], char *out) {
    char *o = out + sprintf(out, "GPU-");
    for (int k = 0; k < 16; k++) {
        if (k == 4 || k == 6 || k == 8 || k == 10)
            *o++ = '-';
        o += sprintf(o, "%02x", b[k]);
    }
}

FAKE_FN void fake_uuid_text(int i, char out[FAKE_UUID_LEN + 1]) {
    unsigned char b[16];
    fake_uuid_bytes(i, b);
    fake_uuid_format(b, out);
}

#define MAX_MIG 8
struct fake_mig {
    int gpu, gi, ci;
    uint64_t size;
    char profile[24];
};

/* Fill out[] from FAKENVML_MIG (entries for GPUs past ndev are dropped); returns the number of instances. */
FAKE_FN int fake_migs(struct fake_mig out[MAX_MIG], int ndev) {
    const char *v = getenv("FAKENVML_MIG");
    char buf[512];
    int n = 0;
    if (!v || !*v)
        return 0;
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < MAX_MIG; tok = strtok_r(NULL, ",", &save)) {
        char *c1 = strchr(tok, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = 0;
        int g = atoi(tok);
        if (g < 0 || g >= ndev || ndev + n >= MAX_DEV)
            continue;
        int gi = 1;
        for (int k = 0; k < n; k++)
            gi += out[k].gpu == g;
        out[n] = (struct fake_mig){g, gi, 0, parse_size(c2 + 1), ""};
        snprintf(out[n].profile, sizeof out[n].profile, "%s", c1 + 1);
        n++;
    }
    return n;
}

FAKE_FN void fake_mig_uuid_bytes(int k, const struct fake_mig *m, unsigned char b[16]) {
    fake_uuid_bytes(0, b);
    b[4] = 0x4d;
    b[5] = 0x49;
    b[14] = (unsigned char)m->gpu;
    b[15] = (unsigned char)k;
}

/* "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (out: FAKE_UUID_LEN + 1 bytes) */
FAKE_FN void fake_mig_uuid_text(int k, const struct fake_mig *m, char *out) {
    unsigned char b[16];
    fake_mig_uuid_bytes(k, m, b);
    fake_uuid_format(b, out);
    memcpy(out, "MIG", 3);
}
#endif
