"""The callback library `pyvgpu wrap` names (PYVGPU_CALLBACKS), chosen at a small cost.

:func:`choose` answers what :func:`pyvgpu.native.cache.ensure` answers, without loading a library or
importing the hook table: the tuned library of this CPU in the cache when it fits, else the packaged one,
each checked as the shim checks it (pv_verify.c: a regular file of this user or root that nobody else may
write, whose bytes match the hash beside it) and holding the key of these sources in its table. Anything
else (nothing fits, a library that is not sound, a cache another user could write) goes to ``ensure``,
which says why and compiles when it must. The shim checks the library named again as it loads it.

Hashing the sources and the library is most of what is left of that choice, and many wraps start at once,
so a plain choice is remembered in the user's runtime directory (``callbacks-choice``, 0600 in the 0700
directory the groups live in) with the status of every file it rests on: each source of the key and the
folders they are in, both libraries and their hashes, and the cache directory. A wrap whose files all have
the status remembered (device, inode, size, modification and change times) takes the answer; any other
goes the long way and remembers anew.
"""

from __future__ import annotations

import os
import stat

import pyvgpu
from pyvgpu.errors import PyvgpuError
from pyvgpu.host import cpuid
from pyvgpu.native import cache, cblib, groupfiles

TYPE_CHECKING = False  # not `typing`'s: every wrap imports this module, and its paths are text (os.path)
if TYPE_CHECKING:
    from pathlib import Path

MEMO_NAME = "callbacks-choice"
MEMO_FORMAT = "pyvgpu callbacks-choice 1"
MEMO_MAX_BYTES = 1 << 16


def fits(path: str | Path, key: str) -> bool:
    """Whether the library at ``path`` was compiled from the sources of ``key`` and may be named, told without
    loading it (see the top)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if cblib.trust_problem(os.fstat(fd)):
            return False
        try:
            cblib._check_hash(fd, path, "")
        except cblib.CorruptLibrary:
            return False
        data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    return f"{key}\0".encode() in data  # the table's key field, NUL-terminated (layout.CBLIB)


def _status(path: str) -> str:
    """What a change of the file at ``path`` changes (absent: "-")."""
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _sources_status() -> list[tuple[str, str]]:
    """The status of what the key rests on: its sources and their folders (a file added or removed changes
    one), taken before the key is computed, so that an edit during the computation is seen next time."""
    pkg = os.path.dirname(pyvgpu.__file__)
    paths = []
    for pattern in cache._SOURCES:
        top, sep, _ = pattern.partition("/**/")
        if sep:
            paths += [d for d, _, _ in os.walk(os.path.join(pkg, top))]
            paths += cache._matches(pkg, pattern)
        else:
            paths.append(os.path.join(pkg, pattern))  # also when it is missing
    return [(p, _status(p)) for p in paths]


def _libraries_status(directory: str, key: str, cpu: int) -> list[tuple[str, str]]:
    """The status of what the choice among the libraries rests on, taken before they are checked: both
    libraries and their hashes, and the cache directory."""
    paths = []
    for lib in (cache.packaged_file(), cache.tuned_path(directory, key, cpu)):
        paths += [str(lib), str(cblib.hash_path(lib))]
    return [(p, _status(p)) for p in (*paths, str(directory))]


def _memo_path(write: bool) -> str | None:
    """Where the choice is remembered: the runtime directory, to write made or checked as before a group is made
    in it (this user's, 0700, no link); None where it cannot be (nothing is remembered, a later step of the wrap
    says why if it needs the directory)."""
    try:
        return os.path.join(groupfiles.runtime_dir(make=write), MEMO_NAME)
    except (OSError, PyvgpuError):
        return None


def _recall(memo: str, directory: str, cpu: int) -> str | None:
    """The library remembered for this package, cache directory and CPU, if no file it rests on changed."""
    try:
        fd = os.open(memo, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return None
        text = os.read(fd, MEMO_MAX_BYTES).decode("utf-8", "surrogateescape")
    finally:
        os.close(fd)
    lines = text.split("\n")
    if lines[:4] != [MEMO_FORMAT, os.path.dirname(pyvgpu.__file__), str(directory), f"{cpu:x}"] or lines[-1] != "":
        return None
    chosen, rests = lines[4], lines[5:-1]
    for line in rests:
        status, _, path = line.partition(" ")
        if _status(path) != status:
            return None
    if chosen != cache.packaged_file() and cache.dir_problem(directory) is not None:
        return None  # the cache directory's owner or mode: ensure says why
    return chosen if rests else None


def _remember(memo: str, directory: str, cpu: int, chosen: str, rests: list[tuple[str, str]]) -> None:
    """Best effort: a runtime directory that cannot be written only costs the next wrap the long way."""
    lines = [MEMO_FORMAT, os.path.dirname(pyvgpu.__file__), str(directory), f"{cpu:x}", chosen]
    lines += [f"{status} {path}" for path, status in rests]
    part = os.path.join(os.path.dirname(memo), f".{MEMO_NAME}.{os.getpid()}")
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        os.replace(part, memo)
    except OSError:
        try:
            os.unlink(part)
        except OSError:
            pass


def choose(directory: str | Path | None = None, workers: int = 1) -> str:
    """The path of the library ``cache.ensure`` chooses (see the top)."""
    directory = os.fspath(directory) if directory else cache.cache_dir_str()
    cpu = cpuid.cpu_id()
    memo = _memo_path(write=False)
    if memo is not None:
        known = _recall(memo, directory, cpu)
        if known is not None:
            return known
    rests = _sources_status()
    key = cache.cache_key()
    rests += _libraries_status(directory, key, cpu)
    tuned = cache.tuned_path(directory, key, cpu)
    chosen = None
    if cpu and tuned.exists():
        if cache.dir_problem(directory) is None and fits(tuned, key):
            chosen = str(tuned)
    elif fits(cache.packaged_file(), key):
        chosen = cache.packaged_file()
    if chosen is None:
        return cache.ensure(directory, workers)["library"]
    memo = _memo_path(write=True)
    if memo is not None:
        _remember(memo, directory, cpu, chosen, rests)
    return chosen
