"""Files other users may touch: directories, regions, turn files and caches opened safely.

pyvgpu keeps state in files that several processes share. On a machine with
several users, another user may have planted a link at a path we use, made a
file of their own there first, or may truncate a file we have mapped. The
rules here, applied by every module that opens such a file:

* a directory of ours is created 0700 by mkdir (whatever the umask), checked
  with lstat (a symbolic link is refused), its owner checked before anything
  is made inside, and group/other write on our own directory is removed;
* a shared file is opened with O_NOFOLLOW and O_NONBLOCK (a FIFO planted at
  the path cannot stall us), and checked with fstat: a regular file, of a
  trusted owner, not writable by others, of the size we are about to map;
* ``PYVGPU_TRUST_SHARED=1`` is the documented opt-in to use a file that
  belongs to another user or that others can write (a node agent that creates
  the files for containers sets it). Whoever can write such a file can change
  the limits it holds.

docs/security.md has the threat model these rules serve.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from pyvgpu import envspec
from pyvgpu.errors import PyvgpuError

TRUST_ENV = envspec.TRUST_SHARED.name


class UntrustedFile(PyvgpuError):
    """A file or directory that another user owns or can write, or a link where a file should be."""


def trust_shared(env: Mapping[str, str] = os.environ) -> bool:
    """PYVGPU_TRUST_SHARED: 1 lets this process use files of other users, or files others can write."""
    text = env.get(TRUST_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise PyvgpuError(f"{TRUST_ENV}={text!r}: give 1 (use regions and turn files that another user owns or "
                          "others can write) or 0 (the default: refuse them)")
    return text == "1"


def who(uid: int) -> str:
    """'uid 65534 (nobody)'."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}"


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


# --- directories ------------------------------------------------------------------------

def private_dir(path: Path, what: str, fix: str) -> Path:
    """Make ``path`` a directory that only this user can write, or refuse.

    Missing: created with mkdir 0700 (then set to 0700 exactly: mkdir's mode passes the umask). Present:
    checked with lstat, so a link is refused rather than followed, and its owner is checked before anything
    is created inside. Our own directory with another mode (group or other write) is repaired to 0700;
    another user's is refused with UntrustedFile, naming ``fix``. Only ``path`` itself is created, never its parents.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # another process made it meanwhile: checked below like any existing one
        except OSError as e:
            raise PyvgpuError(f"{what} {path}: cannot create it ({e.strerror}); {fix}") from None
        st = os.lstat(path)
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedFile(f"{what} {path} is a symbolic link (to {_link_target(path)}, made by {who(st.st_uid)}); "
                            f"pyvgpu does not follow links there, as someone may be redirecting your files. {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedFile(f"{what} {path} is not a directory; {fix}")
    if st.st_uid != euid:
        raise UntrustedFile(f"{what} {path} belongs to {who(st.st_uid)}, not to you ({who(euid)}): another user "
                            f"made it, and pyvgpu put nothing in it. {fix}")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or now.st_uid != euid:
            raise UntrustedFile(f"{what} {path} was replaced while pyvgpu checked it; {fix}")
        if stat.S_IMODE(now.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # just made (mkdir's mode passed the umask), or our own opened up: repaired
    finally:
        os.close(fd)
    return path


# --- shared files -----------------------------------------------------------------------

def foreign_problem(st: os.stat_result, root_group_ok: bool = False) -> str | None:
    """Why a file of this stat must not be trusted by this user, or None.

    Trusted: our own file that only we can write. With ``root_group_ok``, also a file of root's that its
    group may write but others may not (the machine's turn file, made by `pyvgpu setup`).
    """
    mode = stat.S_IMODE(st.st_mode)
    euid = os.geteuid()
    if st.st_uid == 0 and root_group_ok:
        return f"it is writable by every user ({_mode(st)})" if mode & 0o002 else None
    if st.st_uid != euid:
        return f"it belongs to {who(st.st_uid)}, not to you ({who(euid)})"
    if mode & 0o002:
        return f"it is writable by every user ({_mode(st)})"
    if mode & 0o020:
        return f"it is writable by its group ({_mode(st)})"
    return None


def check_trusted(st: os.stat_result, path: Path, what: str, fix: str, env: Mapping[str, str] = os.environ,
                  root_group_ok: bool = False) -> None:
    """Refuse (UntrustedFile) a file that another user owns or can write, unless PYVGPU_TRUST_SHARED=1."""
    problem = foreign_problem(st, root_group_ok)
    if problem and not trust_shared(env):
        raise UntrustedFile(f"{what} {path}: {problem}, so another user could change or truncate it under your "
                            f"program; refusing it. {fix}, or set {TRUST_ENV}=1 if whoever can write it is "
                            "trusted (docs/security.md)")


def open_regular(path: Path, flags: int, what: str, fix: str, mode: int = 0o600) -> int:
    """Open ``path`` with O_NOFOLLOW and O_NONBLOCK, and check that it is a regular file; returns the fd
    (blocking again).

    A link at the path is refused (ELOOP), a FIFO or device is refused without blocking on it.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UntrustedFile(f"{what} {path} is a symbolic link (to {_link_target(path)}); pyvgpu does not "
                                f"follow links there. {fix}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile(f"{what} {path} is not a regular file; {fix}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_size(fd: int, size: int, path: Path | str, what: str, fix: str) -> None:
    """The file behind fd holds at least ``size`` bytes (checked right before mapping it: touching a mapped
    page past the end of the file is a SIGBUS)."""
    have = os.fstat(fd).st_size
    if have < size:
        raise PyvgpuError(f"{what} {path} is {have} bytes, {size} expected: it was truncated; {fix}")
