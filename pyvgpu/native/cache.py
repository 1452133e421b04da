"""Which compiled callbacks a process uses, and compiling them when none fits.

The callbacks are compiled ahead of time by numba into a shared object
(pyvgpu/native/cblib.py) that a process loads in about a millisecond, with no
interpreter and no JIT linker:

* the package carries one for the baseline CPU of the architecture, built
  by ``pip install`` (setup.py), so nothing is compiled at run time;
* ``pyvgpu warmup`` compiles one tuned for this host's CPU into the user's
  cache (PYVGPU_CACHE_DIR, else $XDG_CACHE_HOME/pyvgpu, else
  ~/.cache/pyvgpu). It is used when present, on a CPU with the same id
  (pyvgpu/host/cpuid.py): a home directory may be shared by different CPUs.

A library serves only the sources it was compiled from: its key covers the
pyvgpu version, the hook table, the layouts, the jit package (VPMM's
allocator included: one key for everything compiled) and the architecture.
A source tree edited since its package was built has no library that fits;
its first ``wrap`` compiles a tuned one (with progress and an estimate).

The shim makes the same choice by itself (shim/src/pv_load.c) when
``pyvgpu wrap`` did not name the library (PYVGPU_CALLBACKS), as in a
container the device plugin starts.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import time

import pyvgpu
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.host import cpuid
from pyvgpu.native import cblib, safefile

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module, and its paths are text (os.path):
if TYPE_CHECKING:  # cache_dir_str and packaged_file; the Path forms import pathlib when called
    from pathlib import Path

FORMAT = 2
# what the machine code is compiled from
_SOURCES = ("contract/abi.py", "contract/structs.py", "contract/record.py", "contract/hooks.py",
            "contract/hooks_model.py", "contract/layout.py", "jit/**/*.py", "native/callbacks.py", "native/aot.py")
# CPU-seconds of one compile on a loaded small machine (docs/measurements.md, native loading): the estimate when
# nothing better is known
DEFAULT_CPU_SECONDS = 200.0
WARMUP = "`pyvgpu warmup`"  # why a compile runs, when the user asked for it
LOCK_WAIT_S = 1800  # the longest a process waits for another one's compile (minutes on a loaded 2-core box)


def cache_dir_str() -> str:
    """PYVGPU_CACHE_DIR, else $XDG_CACHE_HOME/pyvgpu, else ~/.cache/pyvgpu, as text (what a wrap uses)."""
    env = os.environ.get(envspec.CACHE_DIR.name)
    if env:
        return env
    xdg = os.environ.get(envspec.XDG_CACHE_HOME.name)
    return os.path.join(xdg, "pyvgpu") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "pyvgpu")


def cache_dir() -> Path:
    """cache_dir_str as a Path."""
    from pathlib import Path

    return Path(cache_dir_str())


def cache_key() -> str:
    """The key of the sources the callbacks are compiled from (the hook table among them: contract/hooks*.py)."""
    import hashlib  # here: a wrap that remembers its choice (pyvgpu/native/choice.py) hashes nothing

    h = hashlib.sha256(f"{pyvgpu.__version__}|{os.uname().machine}|{FORMAT}".encode())
    pkg = os.path.dirname(pyvgpu.__file__)
    for pattern in _SOURCES:
        for path in _matches(pkg, pattern):
            h.update(os.path.basename(path).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:20]


def _matches(pkg: str, pattern: str) -> list[str]:
    """The files of ``pkg`` a pattern of _SOURCES names, in the order Path.glob's results sort in: a path, or
    DIR/**/*.py (walked here: pathlib's glob compiles a pattern at every wrap)."""
    top, sep, rest = pattern.partition("/**/")
    if not sep:
        path = os.path.join(pkg, pattern)
        return [path] if os.path.isfile(path) else []
    if not rest.startswith("*") or "*" in rest[1:] or "/" in rest:
        raise ValueError(f"_SOURCES: {pattern!r} is neither a path nor DIR/**/*SUFFIX")
    found = []
    for d, _, files in os.walk(os.path.join(pkg, top)):
        found += [os.path.join(d, f) for f in files if f.endswith(rest[1:])]
    return sorted(found, key=lambda path: path.split(os.sep))  # as Paths sort: part by part


def packaged_file() -> str:
    """The library the package carries, beside the shim, as text (what a wrap uses)."""
    return os.path.join(os.path.dirname(os.path.realpath(pyvgpu.__file__)), cblib.FILE_NAME)


def packaged_path() -> Path:
    """packaged_file as a Path."""
    from pathlib import Path

    return Path(packaged_file())


def tuned_path(directory: str | Path, key: str, cpu: int) -> Path:
    """Where `pyvgpu warmup` puts the library tuned for CPU ``cpu`` (the shim looks for the same name)."""
    from pathlib import Path

    return Path(directory) / f"callbacks-{key}-{cpu:016x}.so"


def _describe(lib: cblib.Library, origin: str) -> dict:
    from pyvgpu.contract import hooks

    return {"format": FORMAT, "library": str(lib.path), "origin": origin, "key": lib.key, "cpu": lib.cpu,
            "tuned": lib.tuned, "cpu_id": f"{lib.cpu_id:016x}" if lib.tuned else "",
            "table_hash": hooks.table_hash(), "callbacks": sum(1 for a in lib.entries if a),
            "services": sorted(lib.services)}


def dir_problem(directory: Path) -> str | None:
    """Why code must not be taken from (or put into) this cache directory, or None: it must be this user's
    or root's, not a link, and nobody else may write it (whoever can could put code into every program).
    Our own directory made under umask 002 is repaired (chmod go-w)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o022:
        os.chmod(directory, stat.S_IMODE(st.st_mode) & ~0o022)
        st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        return f"{directory} is a symbolic link"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{directory} belongs to {safefile.who(st.st_uid)}"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _tuned(directory: Path, key: str) -> dict | None:
    cpu = cpuid.cpu_id()
    path = tuned_path(directory, key, cpu)
    if not cpu or not path.exists():
        return None
    problem = dir_problem(directory)
    if problem:
        print(f"pyvgpu: warning: not using the callbacks in {directory}: {problem}, so another user could put "
              "code into your programs; using the packaged ones. Set PYVGPU_CACHE_DIR to a directory of your "
              "own (or chmod go-w it)", file=sys.stderr)
        return None
    try:
        lib = cblib.load(path)
    except PyvgpuError as e:
        print(f"pyvgpu: warning: {e}; using the packaged callbacks", file=sys.stderr)
        return None
    if lib.key != key or not lib.tuned or lib.cpu_id != cpu:
        return None
    return _describe(lib, "cache")


def _packaged(key: str) -> dict | None:
    path = packaged_path()
    if not path.exists():
        return None
    lib = cblib.load(path)
    return _describe(lib, "package") if lib.key == key else None


def read(directory: Path | None = None, key: str | None = None) -> dict | None:
    """The library a process of this installation uses: this CPU's tuned one in the cache when there is
    one, else the packaged one; None when none was compiled from these sources."""
    from pathlib import Path

    directory = Path(directory or cache_dir())
    key = key or cache_key()
    return _tuned(directory, key) or _packaged(key)


def writable_problem(directory: Path) -> str | None:
    """Why the cache cannot be written there, or None if it can."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        return f"cannot create {directory}: {e.strerror}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable by this user"
    return None


def cli_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def estimate_seconds(workers: int) -> float:
    """How long a compile should take here: the package's own build time scaled to ``workers``."""
    import json

    try:
        facts = json.loads(cblib.info_path(packaged_path()).read_text())
        cpu_seconds = float(facts["build_seconds"]) * max(1, int(facts["build_workers"]))
    except (OSError, ValueError, KeyError, TypeError):
        cpu_seconds = DEFAULT_CPU_SECONDS
    return cpu_seconds / max(1, workers)


class _Progress:
    """Progress of a compile on stderr, with an estimate of the time left."""

    def __init__(self, workers: int, why: str) -> None:
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.shown = 0
        est = estimate_seconds(workers)
        print(f"pyvgpu: compiling the callbacks for this CPU ({why}); about {est:.0f} s on {workers} "
              f"process{'es' if workers > 1 else ''}, once", file=sys.stderr, flush=True)

    def __call__(self, done: int, total: int) -> None:
        spent = time.monotonic() - self.t0
        left = spent / done * (total - done) * 1.15 if done else 0.0  # + linking, about a seventh
        line = f"pyvgpu: {done}/{total} callbacks compiled, {spent:.0f} s, about {left:.0f} s left"
        if self.tty:
            print("\r" + line, end="\n" if done == total else "", file=sys.stderr, flush=True)
        elif done == total or done * 4 // total > self.shown:  # quarters, when stderr is a log
            self.shown = done * 4 // total
            print(line, file=sys.stderr, flush=True)


def _lock(directory: Path):
    """An exclusive lock on the cache, so that concurrent starts compile once; waits at most LOCK_WAIT_S."""
    lock_path = directory / ".lock"
    fd = safefile.open_regular(lock_path, os.O_RDWR | os.O_CREAT, "the callback cache lock", f"remove {lock_path}",
                               0o600)
    f = os.fdopen(fd, "a+")
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP):  # NFS without locks: just build
                return f
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                f.close()
                raise
        if time.monotonic() > deadline:
            f.close()
            raise PyvgpuError(f"another process has held the callback cache lock {directory / '.lock'} for "
                              f"{LOCK_WAIT_S} s; if no pyvgpu compile runs, remove that file and try again")
        time.sleep(0.2)


def _compile(directory: Path, key: str, workers: int, why: str, again: bool) -> dict:
    """Compile the library tuned for this CPU into ``directory`` (unless, with ``again`` False, another
    process did while this one waited for the lock)."""
    problem = writable_problem(directory)
    if problem and why == WARMUP:  # the user ran warmup: naming warmup again would not help
        raise PyvgpuError(f"`pyvgpu warmup` cannot write the callback cache ({problem}); set PYVGPU_CACHE_DIR "
                          "to a writable directory of your own and run it again")
    if problem:
        raise PyvgpuError(
            f"no compiled callbacks fit this pyvgpu and the cache cannot be written ({problem}); set "
            "PYVGPU_CACHE_DIR to a writable directory, or run `pyvgpu warmup` once as a user who can write it"
        )
    problem = dir_problem(directory)
    if problem:
        raise PyvgpuError(f"the callback cache: {problem}, so another user could put code into your programs; "
                          "refusing it. Set PYVGPU_CACHE_DIR to a directory of your own (or chmod go-w it)")
    with _lock(directory):
        if not again:
            m = _tuned(directory, key)
            if m is not None:
                return m
        cpu = cpuid.cpu_id()
        if not cpu:
            raise PyvgpuError(f"cannot tell this CPU ({cpuid.CPUINFO} is not readable), so a library tuned for "
                              "it could not be told apart from another CPU's; reinstall pyvgpu, whose package "
                              "carries callbacks for every CPU of the architecture")
        cblib.build(tuned_path(directory, key, cpu), key=key, tuned=True, cpu_id=cpu, workers=workers,
                    progress=_Progress(workers, why))
        m = _tuned(directory, key)
        if m is None:
            raise PyvgpuError(f"the callbacks compiled into {directory} do not load; see the warning above")
        return m


def ensure(directory: Path | None = None, workers: int = 1) -> dict:
    """The library to use (``read``); when none fits these sources, compile one tuned for this CPU into
    the cache first. Concurrent processes compile once (a lock on the cache)."""
    from pathlib import Path

    directory = Path(directory or cache_dir())
    key = cache_key()
    m = read(directory, key)
    if m is not None:
        return m
    return _compile(directory, key, workers, "none was compiled from these sources", again=False)


def warmup(directory: Path | None = None, force: bool = False, workers: int = 1) -> dict:
    """`pyvgpu warmup`: compile the library tuned for this CPU into the cache, unless it is there already
    (``force``: compile it again)."""
    from pathlib import Path

    directory = Path(directory or cache_dir())
    key = cache_key()
    if not force:
        m = _tuned(directory, key)
        if m is not None:
            return m
    return _compile(directory, key, workers, WARMUP, again=force)
