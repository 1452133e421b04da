"""The cluster commands' own dependencies, installed with `pip install 'pyvgpu[cluster]'`.

A plain `pip install pyvgpu` gives wrap, status, limits, top and the exporter without them (they are most
of the install's size). The daemons import them lazily; before a daemon starts, `require` checks that
they are there, so a missing one is one line naming the extra, not an ImportError from deep inside.
"""

from __future__ import annotations

import importlib.util

from pyvgpu.errors import PyvgpuError

EXTRA = "cluster"
# module -> the distribution that provides it (what pip installs)
MODULES = {"kubernetes": "kubernetes", "grpc": "grpcio", "google.protobuf": "protobuf"}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken installation
        return False


def missing(modules: dict[str, str] = MODULES) -> list[str]:
    """The distributions of `modules` that cannot be imported here."""
    return [dist for mod, dist in modules.items() if not _present(mod)]


def message(command: str, dists: list[str]) -> str:
    return (f"`pyvgpu cluster {command}` needs {', '.join(dists)}, which this installation lacks; install the "
            f"cluster extra: pip install 'pyvgpu[{EXTRA}]'")


def require(command: str, modules: dict[str, str] = MODULES) -> None:
    """Raise PyvgpuError (one line naming the extra) if a module the command needs is missing."""
    dists = missing(modules)
    if dists:
        raise PyvgpuError(message(command, dists))


def from_import_error(command: str, e: ImportError) -> str | None:
    """The message for an ImportError of one of the extra's modules (a missing submodule, a broken install),
    None for any other ImportError (a bug to show as it is)."""
    name = e.name or ""
    for mod, dist in MODULES.items():
        if name and (name == mod or name.startswith(mod + ".") or mod.startswith(name + ".")):
            return message(command, [dist])
    return None
