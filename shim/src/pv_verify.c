/* Checking the compiled callbacks before they are loaded (pyvgpu/native/cblib.py
 * load applies the same rules in Python).
 *
 * The callback library is machine code that runs in every wrapped program,
 * so it is read through one descriptor (O_NOFOLLOW where asked; a regular
 * file of this user or root that nobody else can write), hashed with SHA-256
 * (FIPS 180-4) and compared with the hash written beside it. The loader
 * (pv_load.c) then loads through that same descriptor, never the path again,
 * so the file cannot change between check and load. pyvgpu_verify_object is
 * the same check for bytes a caller loads itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_shim.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

/* SHA-256 of data, as 64 lower-case hex digits and a NUL. */
static void sha256_hex(const unsigned char *data, size_t n, char out[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        block(h, data + i);
    unsigned char tail[128] = {0};
    size_t r = n - i;
    memcpy(tail, data + i, r);
    tail[r] = 0x80;
    size_t len = r < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int j = 0; j < 8; j++)
        tail[len - 1 - j] = (unsigned char)(bits >> (8 * j));
    block(h, tail);
    if (len == 128)
        block(h, tail + 64);
    for (int j = 0; j < 8; j++)
        snprintf(out + 8 * j, 9, "%08x", h[j]);
}

PV_EXPORT int pyvgpu_sha256_hex(const void *data, uint64_t n, char *out65) {
    if (!out65 || (!data && n))
        return -1;
    sha256_hex(data, (size_t)n, out65);
    return 0;
}

static int trusted(const struct stat *st) {
    return (st->st_uid == geteuid() || st->st_uid == 0) && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

/* Read the object at path and check it against sha256 (64 hex digits). On success *data (malloc'ed, the
 * caller frees it) and *len hold the bytes to load and 0 is returned; else -1 with the reason in err. */
PV_EXPORT int pyvgpu_verify_object(const char *path, const char *sha256, void **data, uint64_t *len, char *err,
                                   uint64_t errlen) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    unsigned char *buf = NULL;
    const char *why = NULL;
    if (fd < 0)
        why = errno == ELOOP ? "it is a symbolic link" : strerror(errno);
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        why = "it is not a regular file";
    else if (!trusted(&st))
        why = "another user owns it or can write it, so it could put code into your programs";
    else if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
        why = "out of memory";
    size_t got = 0;
    while (!why && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r <= 0)
            why = r < 0 ? strerror(errno) : "it shrank while being read";
        else
            got += (size_t)r;
    }
    char hex[65];
    if (!why) {
        sha256_hex(buf, got, hex);
        if (!sha256 || strcmp(hex, sha256))
            why = "it does not match the hash in its manifest (corrupt or changed)";
    }
    if (fd >= 0)
        close(fd);
    if (why) {
        free(buf);
        snprintf(err, (size_t)errlen, "the callback object %s: %s; run `pyvgpu warmup --force`", path, why);
        return -1;
    }
    *data = buf;
    *len = got;
    return 0;
}

/* For the loader (pv_load.c): open the callback library at path (O_NOFOLLOW with nofollow), check that it
 * is a regular file of this user or root that nobody else can write, and that its bytes hash to the 64 hex
 * digits of path + ".sha256" (written beside it by pyvgpu/native/cblib.py; checked the same way). Returns the fd
 * the bytes were read through: the loader loads through it, so the code that runs is the code hashed (only
 * its owner could change it meanwhile). -1 with the reason in why; errno is ENOENT when path is missing. */
int pv_verified_fd(const char *path, int nofollow, char *why, size_t n) {
    int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0);
    int fd = open(path, flags);
    if (fd < 0) {
        int e = errno;
        snprintf(why, n, "%s", e == ELOOP ? "it is a symbolic link" : strerror(e));
        errno = e;
        return -1;
    }
    char sidecar[1100], want[65] = "", hex[65];
    struct stat st, sst;
    unsigned char *buf = NULL;
    const char *bad = NULL;
    size_t got = 0;
    snprintf(sidecar, sizeof sidecar, "%s.sha256", path);
    int sfd = open(sidecar, flags);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        bad = "it is not a regular file";
    else if (!trusted(&st))
        bad = "another user owns it or can write it, so it could put code into your programs";
    else if (st.st_size > (256 << 20) || !(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
        bad = "it is too large to be a callback library";
    else if (sfd < 0)
        bad = "its hash file (.sha256 beside it) cannot be opened";
    else if (fstat(sfd, &sst) != 0 || !S_ISREG(sst.st_mode) || !trusted(&sst) || read(sfd, want, 64) != 64)
        bad = "its hash file (.sha256 beside it) is not a 64-digit hash of this user or root";
    while (!bad && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r <= 0)
            bad = r < 0 ? "it cannot be read" : "it shrank while being read";
        else
            got += (size_t)r;
    }
    if (!bad) {
        want[64] = 0;
        sha256_hex(buf, got, hex);
        if (strcmp(hex, want))
            bad = "it does not match the hash beside it (corrupt or changed)";
    }
    free(buf);
    if (sfd >= 0)
        close(sfd);
    if (bad) {
        snprintf(why, n, "%s", bad);
        close(fd);
        errno = EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}
