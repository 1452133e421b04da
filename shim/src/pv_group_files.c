/* Files other users may touch, the one implementation (docs/security.md): shared files are opened with
 * O_NOFOLLOW and O_NONBLOCK, must be regular files of this user that nobody else can write (the machine's
 * turn file may be root's, writable by its group) unless PYVGPU_TRUST_SHARED=1; directories pyvgpu makes
 * are 0700, this user's, no link. The shim joins its group with these (pv_attach.c); pyvgpu/native/safefile.py
 * reaches them through libpyvgpu_group.so. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_shim.h"

/* safefile.who: "uid 65534 (nobody)" */
void pv_who(uid_t uid, char *out, size_t n) {
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

/* safefile.private_dir: path made (0700) or checked, this user's, no link; 0, or with err -1 (cannot make it)
 * or -2 (refused: a link, not a directory, another user's, replaced) */
int pv_private_dir(const char *path, const char *what, const char *fix, char *err, size_t n) {
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
        pv_who(st.st_uid, a, sizeof a);
        snprintf(err, n, "%s %s is a symbolic link (to %s, made by %s); pyvgpu does not follow links there, as "
                 "someone may be redirecting your files. %s", what, path, t, a, fix);
        return -2;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, n, "%s %s is not a directory; %s", what, path, fix);
        return -2;
    }
    if (st.st_uid != geteuid()) {
        pv_who(st.st_uid, a, sizeof a);
        pv_who(geteuid(), b, sizeof b);
        snprintf(err, n, "%s %s belongs to %s, not to you (%s): another user made it, and pyvgpu put nothing in "
                 "it. %s", what, path, a, b, fix);
        return -2;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat now;
    int rc = -1;
    if (fd < 0 || fstat(fd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino ||
        now.st_uid != geteuid()) {
        snprintf(err, n, "%s %s was replaced while pyvgpu checked it; %s", what, path, fix);
        rc = -2;
    }
    else if ((now.st_mode & 07777) != 0700 && fchmod(fd, 0700) != 0) /* mkdir passed the umask, or opened up */
        snprintf(err, n, "%s %s: cannot make it 0700 (%s); %s", what, path, strerror(errno), fix);
    else
        rc = 0;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* safefile.foreign_problem: why this user must not trust a file of this stat, or NULL */
const char *pv_foreign_problem(const struct stat *st, int root_group_ok, char *buf, size_t n) {
    unsigned mode = st->st_mode & 07777;
    char a[128], b[128];
    if (st->st_uid == 0 && root_group_ok) {
        if (!(mode & 002))
            return NULL;
    } else if (st->st_uid != geteuid()) {
        pv_who(st->st_uid, a, sizeof a);
        pv_who(geteuid(), b, sizeof b);
        snprintf(buf, n, "it belongs to %s, not to you (%s)", a, b);
        return buf;
    } else if (!(mode & 022)) {
        return NULL;
    }
    snprintf(buf, n, "it is writable by %s (mode %04o)", mode & 002 ? "every user" : "its group", mode);
    return buf;
}

/* safefile.open_regular + check_trusted: the fd (blocking), or -1 with err and *kind (PV_OPEN_*: missing,
 * untrusted, refused otherwise) */
int pv_open_shared(const char *path, int flags, const char *what, const char *fix, int root_group_ok,
                   int trust_shared, char *err, size_t n, int *kind) {
    *kind = PV_OPEN_REFUSED;
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) {
        char t[512];
        if (errno == ENOENT)
            *kind = PV_OPEN_MISSING;
        if (errno == ELOOP) {
            *kind = PV_OPEN_UNTRUSTED;
            link_target(path, t, sizeof t);
            snprintf(err, n, "%s %s is a symbolic link (to %s); pyvgpu does not follow links there. %s", what,
                     path, t, fix);
        } else if ((errno == EACCES || errno == EPERM) && !strcmp(what, "region"))
            snprintf(err, n, "%s %s: permission denied; it belongs to another user or group (see its owner with "
                     "ls -l)", what, path);
        else if (errno == EACCES || errno == EPERM)
            snprintf(err, n, "%s %s: permission denied; %s", what, path, fix);
        else
            snprintf(err, n, "%s %s: %s; %s", what, path, strerror(errno), fix);
        return -1;
    }
    struct stat st;
    char buf[300];
    const char *problem;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, n, "%s %s is not a regular file; %s", what, path, fix);
        *kind = PV_OPEN_UNTRUSTED;
    } else if ((problem = pv_foreign_problem(&st, root_group_ok, buf, sizeof buf)) && !trust_shared) {
        *kind = PV_OPEN_UNTRUSTED;
        snprintf(err, n, "%s %s: %s, so another user could change or truncate it under your program; refusing "
                 "it. %s, " PV_TRUST_NOTE, what, path, problem, fix);
    } else {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        *kind = 0;
        return fd;
    }
    close(fd);
    return -1;
}

/* region.runtime_dir(): $XDG_RUNTIME_DIR/pyvgpu if writable, else /tmp/pyvgpu-<uid>; pv_runtime_dir makes it
 * private */
int pv_runtime_path(char *out, size_t n, char *err, size_t errlen) {
    const char *xdg = getenv(PV_ENV_XDG_RUNTIME_DIR);
    struct stat st;
    if (xdg && *xdg && stat(xdg, &st) == 0 && !S_ISDIR(st.st_mode))
        return pv_fail(err, errlen, "XDG_RUNTIME_DIR=%s is not a directory; set it to a directory of your own, or "
                       "unset it (pyvgpu then keeps its groups in /tmp/pyvgpu-%u)", xdg, (unsigned)getuid());
    if (xdg && *xdg && access(xdg, W_OK) == 0)
        snprintf(out, n, "%s/pyvgpu", xdg);
    else
        snprintf(out, n, "/tmp/pyvgpu-%u", (unsigned)getuid());
    return 0;
}

int pv_runtime_dir(char *out, size_t n, char *err, size_t errlen) {
    if (pv_runtime_path(out, n, err, errlen))
        return -1;
    return pv_private_dir(out, "the runtime directory", PV_RUNTIME_FIX, err, errlen);
}

/* mkdir -p of path's parent directories, each new one with mode */
int pv_make_parents(const char *path, mode_t mode) {
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


/* region.map_forever: the file behind fd mapped shared, read-write, never unmapped, its size checked right
 * before (touching a page past the end of a file is a SIGBUS); NULL with err */
void *pv_map_shared(int fd, uint64_t size, const char *path, const char *what, const char *fix, char *err,
                    size_t n) {
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size) {
        pv_fail(err, n, "%s %s is %lld bytes, %llu expected: it was truncated; %s", what, path, (long long)st.st_size,
                (unsigned long long)size, fix);
        return NULL;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        pv_fail(err, n, "cannot map %s (%s)", what, strerror(errno));
        return NULL;
    }
    return m;
}
