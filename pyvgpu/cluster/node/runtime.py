"""What a container needs to run under the shim: the environment and the read-only mounts.

Nothing of Python: the shim loads the compiled callbacks that sit beside it (libpyvgpu_callbacks.so,
pyvgpu/native/cblib.py) and joins the container's group by itself (shim/src/pv_load.c, pv_attach.c), so a
container with any Python, or none, needs only

* LD_PRELOAD naming the shim (besides the limits, the region and the turn file that Allocate sets);
* the directory holding the shim and the library, mounted read-only at the same path as on the host.

The chart's init container copies the image's runtime (/opt/pyvgpu/<release>) to the same host path and
the plugin runs from there (deploy/helm/pyvgpu), so the path the plugin sees is the path a container sees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError

# Directories a runtime must never be: mounting them over a container's own would break it.
_SYSTEM = {"/", "/usr", "/usr/local", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt", "/var", "/home", "/tmp",
           "/root", "/run", "/srv", "/dev", "/proc", "/sys"}


@dataclass(frozen=True)
class Runtime:
    env: dict[str, str]
    mounts: tuple[str, ...]  # host directories, mounted read-only at the same path

    def check(self) -> None:
        """The shim exists and the callbacks beside it load (the plugin checks this once, at start)."""
        from pyvgpu.native import cblib

        shim = Path(self.env[envspec.LD_PRELOAD.name])
        if not shim.exists():
            raise PyvgpuError(f"the pyvgpu runtime is incomplete: LD_PRELOAD={shim} does not exist; reinstall pyvgpu")
        cblib.load(shim.parent / cblib.FILE_NAME)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _cover(paths: list[str]) -> list[str]:
    """The fewest directories among `paths` that hold all of them (a path under another is dropped)."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(_under(p, r) for r in out):
            out.append(p)
    return sorted(out)


def current(runtime_dirs: list[str] | None = None) -> Runtime:
    """The runtime of this process's own pyvgpu installation.

    runtime_dirs: the host directories to mount (each read-only, at the same path); by default the package
    directory that holds the shim and its callbacks. Raises PyvgpuError naming a needed file outside them,
    a system directory, or callbacks that do not fit this pyvgpu (a source tree edited since its build).
    """
    from pyvgpu.native import cache, cblib
    from pyvgpu.native.shim import shim_path

    shim = str(shim_path().resolve())
    if not Path(shim).exists():
        raise PyvgpuError(f"the shim {shim} is missing; reinstall pyvgpu (pip install builds it with gcc)")
    library = Path(shim).parent / cblib.FILE_NAME
    lib = cblib.load(library)
    if lib.key != cache.cache_key():
        raise PyvgpuError(f"the callbacks {library} were compiled from other sources than this pyvgpu's (a source "
                          "tree edited since its build); reinstall pyvgpu (pip install compiles them)")
    paths = [shim, str(library), str(cblib.hash_path(library))]
    if runtime_dirs:
        roots = _cover([str(Path(d).absolute()) for d in runtime_dirs])
        for p in paths:
            if not any(_under(p, r) or _under(os.path.realpath(p), r) for r in roots):
                raise PyvgpuError(f"{p} (part of the pyvgpu runtime) is under none of the runtime directories "
                                  f"{', '.join(roots)}: containers would not see it; add its directory with "
                                  "--runtime-dir")
    else:
        roots = [str(Path(shim).parent)]
        bad = [r for r in roots if r in _SYSTEM]
        if bad:
            raise PyvgpuError(f"the pyvgpu runtime lives in {', '.join(bad)}, which cannot be mounted into containers "
                              "over their own; install pyvgpu under a directory of its own (the image uses "
                              "/opt/pyvgpu), or name the directories to mount with --runtime-dir")
    for r in roots:
        if r in ("/",):
            raise PyvgpuError("--runtime-dir /: the whole host cannot be mounted into containers")
    return Runtime({envspec.LD_PRELOAD.name: shim}, tuple(roots))
