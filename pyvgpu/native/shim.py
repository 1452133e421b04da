"""Where the shim is, and its ctypes interface (shim/src/pv_core.c)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from pyvgpu.contract import envspec

PACKAGE_DIR = Path(__file__).resolve().parents[1]
BOOT_DIR = PACKAGE_DIR / "_boot"
BENCH_BIN = PACKAGE_DIR / "bin" / "pv_bench"


def shim_path() -> Path:
    """The libpyvgpu.so of this installation (PYVGPU_SHIM overrides)."""
    return Path(os.environ.get(envspec.SHIM_PATH.name) or PACKAGE_DIR / "libpyvgpu.so")


def missing_fix() -> str:
    """What to do when the shim is missing: reinstall, or, when pyvgpu is imported from its unbuilt source
    tree (run from the checkout's root, or on PYTHONPATH), use the installed one."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "shim" / "src").is_dir():
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
    return Path(os.fsdecode(info.dli_fname))


def open_shim(path: Path | None = None) -> ctypes.CDLL:
    """Load the shim explicitly (tools and tests; a wrapped process uses loaded())."""
    return _declare(ctypes.CDLL(str(path or shim_path())))
