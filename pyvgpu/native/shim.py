"""Where the shim is, and its ctypes interface (shim/src/pv_core.c).

Every `pyvgpu wrap` imports this, so its paths are text (os.path): importing pathlib would cost a wrap more
than its own work here (docs/measurements.md). The Path forms stay for everyone else: shim_path(), and the
constants PACKAGE_DIR, BOOT_DIR and BENCH_BIN, made at their first use by the module's __getattr__."""

from __future__ import annotations

import ctypes
import os

from pyvgpu.contract import envspec

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module
if TYPE_CHECKING:
    from pathlib import Path

PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the installed pyvgpu/, as text
BOOT = os.path.join(PACKAGE, "_boot")  # the startup hook's directory (put on PYTHONPATH for VPMM)
_PATHS = {"PACKAGE_DIR": PACKAGE, "BOOT_DIR": BOOT, "BENCH_BIN": os.path.join(PACKAGE, "bin", "pv_bench")}


def __getattr__(name: str) -> Path:
    """PACKAGE_DIR, BOOT_DIR and BENCH_BIN as Paths, made when first asked for (PEP 562)."""
    if name not in _PATHS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pathlib import Path

    globals()[name] = value = Path(_PATHS[name])
    return value


def shim_file() -> str:
    """The libpyvgpu.so of this installation (PYVGPU_SHIM overrides), as text (what a wrap uses)."""
    return os.environ.get(envspec.SHIM_PATH.name) or os.path.join(PACKAGE, "libpyvgpu.so")


def shim_path() -> Path:
    """The libpyvgpu.so of this installation (PYVGPU_SHIM overrides)."""
    from pathlib import Path

    return Path(shim_file())


def missing_fix() -> str:
    """What to do when the shim is missing: reinstall, or, when pyvgpu is imported from its unbuilt source
    tree (run from the checkout's root, or on PYTHONPATH), use the installed one."""
    root = os.path.dirname(PACKAGE)
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isdir(os.path.join(root, "shim", "src")):
        return (f"this pyvgpu is imported from its source tree {root}, which is not built (the current directory "
                "or PYTHONPATH comes first); install it with `pip install .` and run from another directory "
                "(e.g. `cd /tmp`; `pytest`, not `python -m pytest`, from the root), or build it in place with "
                "`python scripts/build_native.py`")
    return "reinstall pyvgpu (pip install builds it with gcc)"


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.pyvgpu_installed.restype = ctypes.c_int
    lib.pyvgpu_table_hash.restype = ctypes.c_char_p
    lib.pyvgpu_boot_mode.restype = ctypes.c_char_p
    lib.pyvgpu_callbacks_path.restype = ctypes.c_char_p
    lib.pyvgpu_last_error.restype = ctypes.c_char_p
    lib.pyvgpu_ctx.restype = ctypes.c_void_p
    lib.pyvgpu_lookups.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.pyvgpu_lookups.restype = ctypes.c_uint64
    lib.pyvgpu_cpu_id_of.argtypes = [ctypes.c_char_p]
    lib.pyvgpu_cpu_id_of.restype = ctypes.c_uint64
    return lib


def loaded() -> ctypes.CDLL | None:
    """The shim preloaded into this process, or None when it is not there."""
    lib = ctypes.CDLL(None)
    try:
        lib.pyvgpu_ctx  # noqa: B018
    except AttributeError:
        return None
    return _declare(lib)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def loaded_path() -> Path | None:
    """The file of the shim preloaded into this process (it may be another build than shim_path():
    a wrapper started from a source tree preloads that tree's shim)."""
    lib = loaded()
    if lib is None:
        return None
    libc = ctypes.CDLL(None)
    info = _DlInfo()
    if not libc.dladdr(ctypes.cast(lib.pyvgpu_ctx, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    from pathlib import Path

    return Path(os.fsdecode(info.dli_fname))


def open_shim(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Load the shim explicitly (tools and tests; a wrapped process uses loaded())."""
    return _declare(ctypes.CDLL(os.fspath(path or shim_file())))
