"""The compiled-callbacks cache.

numba compiles the callbacks once (cold: 10-20 s, the only place numba is
imported); the linked machine code is kept as one object file plus a JSON
manifest. Every later process loads that object with llvmlite's JIT
linker in a few milliseconds, without importing numba. That is what keeps
startup cheap, where numba's own cache would cost an `import numba`
(0.7-1.0 s measured on the GPU machine) in every process.

The key covers everything the machine code depends on: the pyvgpu
version, the sources of the hook table, layouts and jit package, and the
machine architecture. The code is compiled for a generic CPU of that
architecture, so a cache in a home directory shared by different CPUs
stays valid.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import platform
import stat
import tempfile
import time
from pathlib import Path

import pyvgpu
from pyvgpu import hooks, safefile
from pyvgpu.errors import PyvgpuError

FORMAT = 1
_SOURCES = ("abi.py", "structs.py", "hooks.py", "layout.py", "jit/*.py")  # what the machine code is compiled from


def cache_dir() -> Path:
    """PYVGPU_CACHE_DIR, else $XDG_CACHE_HOME/pyvgpu, else ~/.cache/pyvgpu."""
    env = os.environ.get("PYVGPU_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "pyvgpu" if xdg else Path.home() / ".cache" / "pyvgpu"


def cache_key() -> str:
    h = hashlib.sha256(f"{pyvgpu.__version__}|{hooks.table_hash()}|{platform.machine()}|{FORMAT}".encode())
    pkg = Path(pyvgpu.__file__).parent
    for pattern in _SOURCES:
        for path in sorted(pkg.glob(pattern)):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:20]


def paths(directory: Path, key: str) -> tuple[Path, Path]:
    return directory / f"callbacks-{key}.o", directory / f"callbacks-{key}.json"


class CorruptObject(PyvgpuError):
    """The callback object does not match its manifest's hash."""


_VERIFIED: dict[str, bytes] = {}  # object path -> the bytes read() checked: what load() runs, read once


def trust_problem(path: Path) -> str | None:
    """Why machine code at path (a cache file or its directory) must not be loaded into this process, or
    None: it must be this user's or root's, and nobody else may write it (the code runs in every wrapped
    program, so whoever can write it can run code as its user)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o022:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)  # our own directory, made under umask 002: repaired
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} belongs to {safefile.who(st.st_uid)}"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _read_private(path: Path) -> bytes:
    """The bytes of a cache file, read once through one fd (O_NOFOLLOW; a regular file; trusted owner/mode)."""
    for p in (path.parent, path):
        problem = trust_problem(p)
        if problem:
            raise PyvgpuError(f"the callback cache: {problem}, so another user could put code into your programs; "
                              "refusing it. Set PYVGPU_CACHE_DIR to a directory of your own (or chmod go-w it)")
    fd = safefile.open_regular(path, os.O_RDONLY, "the callback cache file", "run `pyvgpu warmup --force`")
    with os.fdopen(fd, "rb") as f:
        return f.read()


def object_bytes(manifest: dict) -> bytes:
    """The callback object to load, checked against the manifest's sha256: the loader's one call.

    The bytes hashed are the bytes returned (no second read a file swap could slip into). A mismatch
    raises CorruptObject, which names the fix."""
    path = manifest["object_path"]
    data = _VERIFIED.pop(path, None)
    if data is None:
        data = _read_private(Path(path))
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise CorruptObject(f"the callback object {path} does not match the hash in its manifest (corrupt or "
                            "changed); run `pyvgpu warmup --force` to rebuild it")
    return data


def read(directory: Path | None = None, key: str | None = None) -> dict | None:
    """The manifest of a complete, intact cache entry, or None (missing, stale, or corrupt: then rebuilt).

    Raises PyvgpuError for a cache that others can write: rebuilding there would not help."""
    directory = directory or cache_dir()
    key = key or cache_key()
    obj, man = paths(directory, key)
    try:
        m = json.loads(man.read_text())
        if m.get("format") != FORMAT or m.get("key") != key or m.get("table_hash") != hooks.table_hash():
            return None
        data = _read_private(obj)
        if m.get("sha256") != hashlib.sha256(data).hexdigest():
            return None
    except (OSError, ValueError):
        return None
    m["object_path"] = str(obj)
    _VERIFIED[str(obj)] = data
    return m


def writable_problem(directory: Path) -> str | None:
    """Why the cache cannot be written there, or None if it can."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create {directory}: {e.strerror}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable by this user"
    return None


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def ensure(directory: Path | None = None, force: bool = False, workers: int = 1) -> dict:
    """Return the manifest of the compiled callbacks, compiling them if needed.

    Concurrent processes serialise on a lock file, so a cold start of many
    wrapped processes compiles once. ``workers`` > 1 compiles in that many
    processes (the CLI does; a wrapped program compiles in its own process).
    """
    directory = directory or cache_dir()
    key = cache_key()
    if not force:
        m = read(directory, key)
        if m is not None:
            return m
    problem = writable_problem(directory)
    if problem:
        raise PyvgpuError(
            f"the callback cache is missing and cannot be written ({problem}); set PYVGPU_CACHE_DIR to a "
            "writable directory, or run `pyvgpu warmup` once as a user who can write it"
        )
    lock_path = directory / ".lock"
    fd = safefile.open_regular(lock_path, os.O_RDWR | os.O_CREAT, "the callback cache lock",
                               f"remove {lock_path}", 0o600)
    with os.fdopen(fd, "a+") as lock:
        _lock(lock, lock_path)
        if not force:
            m = read(directory, key)
            if m is not None:
                return m
        return _build(directory, key, workers)


LOCK_WAIT_S = 900.0  # a cold compile takes 10-20 s (2-3 min on 2 cores): a holder past this is stuck


def _lock(lock, path: Path, wait_s: float = LOCK_WAIT_S) -> None:
    """Take the compile lock, waiting at most wait_s (whoever holds it could hold it for ever)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise PyvgpuError(f"the callback cache lock {path} has been held for {wait_s:.0f} s by another "
                                  "process (a compile takes a few minutes at most); stop it, or set PYVGPU_CACHE_DIR "
                                  "to a directory of your own") from None
            time.sleep(0.2)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):  # NFS without locks: just build
                raise
            return


def cli_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _build(directory: Path, key: str, workers: int = 1) -> dict:
    # numba's own optimisation of each callback is redundant: aot.py optimises the
    # linked module once (the same machine code, a third less compile time).
    saved = os.environ.get("NUMBA_OPT")
    os.environ["NUMBA_OPT"] = "0"  # read by numba at import, here or in the worker processes
    try:
        return _build_now(directory, key, workers)
    finally:
        if saved is None:
            os.environ.pop("NUMBA_OPT", None)
        else:
            os.environ["NUMBA_OPT"] = saved


def _build_now(directory: Path, key: str, workers: int) -> dict:
    from pyvgpu.jit import aot  # imports numba: the cold path only

    t0 = time.perf_counter()
    if workers > 1:
        import sys

        print(f"pyvgpu: compiling the callbacks once for this version ({workers} processes)...", file=sys.stderr)
    obj_bytes, symbols, entries = aot.compile_object(workers)
    obj, man = paths(directory, key)
    _atomic_write(obj, obj_bytes)
    import llvmlite
    import numba

    m = {
        "format": FORMAT,
        "key": key,
        "table_hash": hooks.table_hash(),
        "sha256": hashlib.sha256(obj_bytes).hexdigest(),
        "symbols": symbols,  # callback name -> object symbol
        "entries": entries,  # ABI name -> callback name
        "built_with": {"pyvgpu": pyvgpu.__version__, "numba": numba.__version__,
                       "llvmlite": llvmlite.__version__},
        "build_seconds": round(time.perf_counter() - t0, 3),
        "build_workers": workers,
    }
    _atomic_write(man, json.dumps(m, indent=1, sort_keys=True).encode())
    m["object_path"] = str(obj)
    return m
