/* The turn file, the one implementation: which file a group takes turns in (PYVGPU_SCHED, the machine's,
 * or this user's), how it is created (complete, then linked into place) and opened and checked. The shim
 * maps it (pv_attach.c); pyvgpu/group/turnfile.py reaches these through libpyvgpu_group.so. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_shim.h"

/* Why this user cannot use the machine's turn file at p (made by `pyvgpu setup`): 1 with why, or 0 */
int pv_machine_turns_problem(const char *p, int trust_shared, char *why, size_t n) {
    struct stat st;
    char buf[300];
    const char *bad;
    if (lstat(p, &st) != 0) {
        if (errno == ENOENT)
            snprintf(why, n, "%s does not exist (`pyvgpu setup`, run by root, makes it)", p);
        else
            snprintf(why, n, "%s: %s", p, strerror(errno));
        return 1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s is not a regular file", p);
        return 1;
    }
    if ((bad = pv_foreign_problem(&st, 1, buf, sizeof buf)) && !trust_shared) {
        snprintf(why, n, "%s: %s", p, bad);
        return 1;
    }
    if (access(p, R_OK | W_OK) != 0) {
        struct group gr, *got = NULL;
        char gbuf[1024], name[300];
        if (getgrgid_r(st.st_gid, &gr, gbuf, sizeof gbuf, &got) == 0 && got)
            pv_repr(got->gr_name, strlen(got->gr_name), name, sizeof name);
        else
            snprintf(name, sizeof name, "'%u'", (unsigned)st.st_gid);
        snprintf(why, n, "%s is for the members of group %s, and you are not one", p, name);
        return 1;
    }
    return 0;
}

/* sched.choose: PYVGPU_SCHED (sched, "" or NULL when unset), else the machine's file (PV_SHM_TURNS; a
 * test's elsewhere) if usable, else <runtime dir>/turns (this user's; *own set, and why the machine's is not
 * used in why). 0, or -1 with err. */
int pv_turn_path(const char *sched, const char *machine, int trust_shared, char *out, size_t n, int *own, char *why, size_t whylen,
                 char *err, size_t errlen) {
    *own = 0;
    why[0] = 0;
    if (sched && *sched) {
        snprintf(out, n, "%s", sched);
        return 0;
    }
    if (!pv_machine_turns_problem(machine, trust_shared, why, whylen)) {
        snprintf(out, n, "%s", machine);
        return 0;
    }
    char top[900];
    if (pv_runtime_dir(top, sizeof top, err, errlen))
        return -1;
    snprintf(out, n, "%s/turns", top);
    *own = 1;
    return 0;
}

/* sched._write_new: link a complete, empty turn file into place unless one is there; mode, and root:gid
 * unless gid < 0 (`pyvgpu setup`). 0, or -1 with errno. */
int pv_create_turns(const char *p, unsigned mode, int gid) {
    char tmp[1200];
    unsigned char r[4] = {0};
    pv_sched_header_t head = {.magic = PV_SCHED_MAGIC, .version = PV_SCHED_VERSION, .n_entries = PV_SCHED_ENTRIES,
                              .size = PV_SCHED_SIZE};
    if (pv_make_parents(p, 0755) != 0)
        return -1;
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        memset(r, 0, sizeof r);
    const char *slash = strrchr(p, '/');
    snprintf(tmp, sizeof tmp, "%.*s.%s.%d.%02x%02x%02x%02x", slash ? (int)(slash - p + 1) : 0, p,
             slash ? slash + 1 : p, (int)getpid(), r[0], r[1], r[2], r[3]);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = -1;
    if ((gid < 0 || fchown(fd, 0, (gid_t)gid) == 0) && fchmod(fd, mode) == 0 && /* not the umask's choice */
        pwrite(fd, &head, sizeof head, 0) == (ssize_t)sizeof head && ftruncate(fd, PV_SCHED_SIZE) == 0 &&
        (link(tmp, p) == 0 || errno == EEXIST))
        rc = 0;
    int saved = errno;
    close(fd);
    unlink(tmp);
    errno = saved;
    return rc;
}

static void fix_for(const char *p, const char *machine, char *fix, size_t n) {
    if (!strcmp(p, machine))
        snprintf(fix, n, "ask root to run `pyvgpu setup` (it recreates the file), or set PYVGPU_SM_TURN=0");
    else
        snprintf(fix, n, "remove %s when no pyvgpu program runs, or set PYVGPU_SCHED to a file of your own, or "
                 "PYVGPU_SM_TURN=0", p);
}

/* sched.open_fd's fix for the turn file at p */
void pv_turns_fix(const char *p, char *fix, size_t n) { fix_for(p, PV_SHM_TURNS, fix, n); }

/* sched.open_fd: the turn file at p opened and checked (ours or root's, this version, whole); the fd, or -1
 * with err (*kind: PV_OPEN_*). fix: what to do about a bad one. */
int pv_open_turns(const char *p, int trust_shared, const char *fix, char *err, size_t n, int *kind) {
    struct stat st;
    int fd = pv_open_shared(p, O_RDWR, "the turn file", fix, 1, trust_shared, err, n, kind);
    if (fd < 0)
        return -1;
    pv_sched_header_t head;
    memset(&head, 0, sizeof head);
    const char *bad = NULL;
    char why[256];
    if (fstat(fd, &st) != 0 || pread(fd, &head, sizeof head, 0) < 0 || head.magic != PV_SCHED_MAGIC)
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
        *kind = PV_OPEN_REFUSED;
        return -1;
    }
    return fd;
}

/* turnfile.open_fd: the turn file at p opened and checked, made first (0600, this user's) when it is missing
 * and not the machine's (which `pyvgpu setup` makes); the fd, or -1 with err (*kind: PV_OPEN_*) */
int pv_use_turns(const char *p, const char *machine, int trust_shared, char *err, size_t n, int *kind) {
    char fix[1400];
    struct stat st;
    fix_for(p, machine, fix, sizeof fix);
    *kind = PV_OPEN_REFUSED;
    if (lstat(p, &st) != 0 && errno == ENOENT && strcmp(p, machine) && pv_create_turns(p, 0600, -1) != 0) {
        if (errno == EACCES || errno == EPERM)
            return pv_fail(err, n, "the turn file %s: permission denied; %s", p, fix);
        return pv_fail(err, n, "the turn file %s: %s; %s", p, strerror(errno), fix);
    }
    return pv_open_turns(p, trust_shared, fix, err, n, kind);
}

/* turnfile.entries: a snapshot of the turn file at p (PV_SCHED_SIZE bytes into out), opened as pv_use_turns
 * opens it. 0, or -1 with err and *kind. */
int pv_read_turns(const char *p, const char *machine, int trust_shared, void *out, char *err, size_t n, int *kind) {
    int fd = pv_use_turns(p, machine, trust_shared, err, n, kind);
    if (fd < 0)
        return -1;
    ssize_t got = pread(fd, out, PV_SCHED_SIZE, 0);
    close(fd);
    if (got != PV_SCHED_SIZE) {
        *kind = PV_OPEN_REFUSED;
        return pv_fail(err, n, "the turn file %s was truncated while pyvgpu read it; remove it when no pyvgpu program "
                       "runs", p);
    }
    return 0;
}

/* turnfile.setup (root): the machine's turn file at p for the members of group gid, mode. A file already
 * there that is root's, of that group, of that mode and whole is kept (running programs have it mapped);
 * anything else at the path (another user's, an old 0666 one, a link) is removed and replaced. 0 kept, 1
 * replaced, 2 made, or -1 with err. */
int pv_setup_turns(const char *p, int gid, unsigned mode, int trust_shared, char *err, size_t n) {
    struct stat st;
    int kind, there = lstat(p, &st) == 0;
    if (!there && errno != ENOENT)
        return pv_fail(err, n, "%s: %s", p, strerror(errno));
    if (there && S_ISREG(st.st_mode) && st.st_uid == 0 && st.st_gid == (gid_t)gid && (st.st_mode & 07777) == mode) {
        int fd = pv_use_turns(p, p, trust_shared, err, n, &kind);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
    }
    if (there && unlink(p) != 0)
        return pv_fail(err, n, "cannot remove %s (%s)", p, strerror(errno));
    if (pv_create_turns(p, mode, gid) != 0)
        return pv_fail(err, n, "cannot make %s (%s)", p, strerror(errno));
    int fd = pv_use_turns(p, p, trust_shared, err, n, &kind);
    if (fd < 0)
        return -1;
    close(fd);
    return there ? 1 : 2;
}

/* The node agent's turn file (pyvgpu/cluster/node/nodestate.py): made with mode when missing, checked (the
 * agent made it, so trusted), and its mode set back to mode if it was changed. 0, or -1 with err. */
int pv_node_turns(const char *p, unsigned mode, char *err, size_t n) {
    struct stat st;
    int kind;
    if (lstat(p, &st) != 0 && errno == ENOENT && pv_create_turns(p, mode, -1) != 0)
        return pv_fail(err, n, "the turn file %s: %s", p, strerror(errno));
    char fix[1400];
    fix_for(p, PV_SHM_TURNS, fix, sizeof fix);
    int fd = pv_open_turns(p, 1, fix, err, n, &kind);
    if (fd < 0)
        return -1;
    int rc = 0;
    if (fstat(fd, &st) != 0 || ((st.st_mode & 07777) != mode && fchmod(fd, mode) != 0))
        rc = pv_fail(err, n, "the turn file %s: cannot make it mode %04o (%s)", p, mode, strerror(errno));
    close(fd);
    return rc;
}
