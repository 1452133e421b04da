/* The simulated devices, shared by the fake libcuda and libnvidia-ml so both
 * see the same machine: FAKECUDA_DEVICES="16G,8G" lists capacities
 * (default: two devices of 16 GiB and 8 GiB). */
#ifndef FAKE_DEVICES_H
#define FAKE_DEVICES_H
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEV 16

/* "4G", "512m", "1048576": binary K/M/G/T suffixes */
static uint64_t parse_size(const char *s) {
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
static int fake_device_caps(uint64_t caps[MAX_DEV]) {
    const char *d = getenv("FAKECUDA_DEVICES");
    char buf[512];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", d && *d ? d : "16G,8G");
    for (char *tok = strtok(buf, ","); tok && n < MAX_DEV; tok = strtok(NULL, ","))
        caps[n++] = parse_size(tok);
    return n;
}
#endif
