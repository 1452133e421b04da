"""What a container needs to run under the shim: the environment and the read-only mounts.

The device plugin gives every container the pyvgpu runtime it runs itself: the shim (libpyvgpu.so), the
startup hook, the Python that the shim embeds in a non-Python program, pyvgpu's package, and the warm
callback cache. They are mounted read-only at the same paths as on the host, so the absolute paths the
plugin sees are the paths the container sees (the chart's init container copies the image's runtime,
/opt/pyvgpu/<release>, to the same host path, and the plugin runs from there: deploy/helm/pyvgpu).

The environment is what `pyvgpu wrap` sets for the shim (pyvgpu/wrap.py build_env): LD_PRELOAD,
PYTHONPATH (the startup hook), PYVGPU_PYTHON, PYVGPU_LIBPYTHON, PYVGPU_PYTHON_HOME, PYVGPU_SYSPATH and
PYVGPU_CACHE_DIR. A container whose own Python is another version than the runtime's is issue 16 item 2
(any container image): that work changes what this module returns, not its callers.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pyvgpu.errors import PyvgpuError

# Directories a runtime must never be: mounting them over a container's own would break it.
_SYSTEM = {"/", "/usr", "/usr/local", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt", "/var", "/home", "/tmp",
           "/root", "/run", "/srv", "/dev", "/proc", "/sys"}


@dataclass(frozen=True)
class Runtime:
    env: dict[str, str]
    mounts: tuple[str, ...]  # host directories, mounted read-only at the same path

    def check(self) -> None:
        """Every path the env names exists (the plugin checks this once, at start)."""
        for key in ("LD_PRELOAD", "PYVGPU_PYTHON", "PYVGPU_CACHE_DIR"):
            if not Path(self.env[key]).exists():
                raise PyvgpuError(f"the pyvgpu runtime is incomplete: {key}={self.env[key]} does not exist; "
                                  "reinstall pyvgpu")


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

    runtime_dirs: the host directories to mount (each read-only, at the same path); by default the
    fewest that hold everything: this Python's prefix and base prefix, its libpython's directory and the
    callback cache. Raises PyvgpuError naming a needed path outside them, or a system directory.
    """
    from pyvgpu import cache, pyinfo
    from pyvgpu.shim import BOOT_DIR, shim_path

    shim = str(shim_path().resolve())
    if not Path(shim).exists():
        raise PyvgpuError(f"the shim {shim} is missing; reinstall pyvgpu (pip install builds it with gcc)")
    manifest = cache.read()
    if manifest is None:
        raise PyvgpuError(f"the callback cache {cache.cache_dir()} is not warm: containers cannot compile into a "
                          "read-only mount; run `pyvgpu warmup` (the node agent does at start), or set "
                          "PYVGPU_CACHE_DIR to a warm cache")
    libpython = pyinfo.libpython()
    home = pyinfo.python_home()
    cache_dir = str(cache.cache_dir().resolve())
    exe = sys.executable
    # What the embedded interpreter imports from: the standard library and the site directories (those of
    # this Python and the one holding pyvgpu), not whatever else this process put on sys.path.
    import pyvgpu

    pkg_root = str(Path(pyvgpu.__file__).resolve().parents[1])
    homes = [sys.prefix, sys.base_prefix, pkg_root]
    syspath = [p for p in pyinfo.import_path()
               if any(_under(os.path.realpath(p), os.path.realpath(h)) or _under(p, h) for h in homes)]
    if pkg_root not in syspath and os.path.realpath(pkg_root) not in map(os.path.realpath, syspath):
        syspath.append(pkg_root)
    needed = {"LD_PRELOAD": shim, "PYTHONPATH": str(BOOT_DIR.resolve()), "PYVGPU_PYTHON": exe,
              "PYVGPU_LIBPYTHON": libpython, "PYVGPU_PYTHON_HOME": home, "PYVGPU_CACHE_DIR": cache_dir}
    paths = [v for v in needed.values() if v] + syspath + [os.path.realpath(exe)]
    if runtime_dirs:
        roots = _cover([str(Path(d).absolute()) for d in runtime_dirs])
        for p in paths:
            if not any(_under(p, r) or _under(os.path.realpath(p), r) for r in roots):
                raise PyvgpuError(f"{p} (part of the pyvgpu runtime) is under none of the runtime directories "
                                  f"{', '.join(roots)}: containers would not see it; add its directory with "
                                  "--runtime-dir")
    else:
        candidates = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(exe)), cache_dir]
        if libpython:
            candidates.append(os.path.dirname(libpython))
        candidates += [p for p in syspath if not any(_under(p, c) for c in candidates)]
        roots = _cover([os.path.realpath(c) for c in candidates] + [c for c in candidates])
        bad = [r for r in roots if r in _SYSTEM]
        if bad:
            raise PyvgpuError(f"the pyvgpu runtime lives in {', '.join(bad)}, which cannot be mounted into containers "
                              "over their own; install pyvgpu and its Python under a directory of their own (the "
                              "image uses /opt/pyvgpu), or name the directories to mount with --runtime-dir")
    for r in roots:
        if r in ("/",):
            raise PyvgpuError("--runtime-dir /: the whole host cannot be mounted into containers")
    env = {k: v for k, v in needed.items() if v}
    env["PYVGPU_SYSPATH"] = os.pathsep.join(syspath)
    return Runtime(env, tuple(roots))
