"""Facts about this Python interpreter that the shim needs to embed it."""

from __future__ import annotations

import os
import sys
import sysconfig


def libpython() -> str:
    """Absolute path of this interpreter's shared libpython, or '' if it has none."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    for name in (sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LDLIBRARY")):
        if name and ".so" in name:
            path = os.path.join(libdir, name)
            if os.path.exists(path):
                return os.path.realpath(path)
    return ""


def python_home() -> str:
    """sys.base_prefix: where the standard library of an embedded interpreter lives."""
    return sys.base_prefix


def import_path() -> list[str]:
    """The directories this interpreter imports from (pyvgpu and its dependencies among them)."""
    return [p for p in sys.path if p and os.path.isdir(p)]
