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

docs/security.md has the threat model these rules serve. The rules are implemented once, in C
(shim/src/pv_group_files.c), for the shim and, through pyvgpu/native/grouplib.py, for pyvgpu's commands.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping

from pyvgpu.contract import envspec
from pyvgpu.native import groupfiles, grouplib

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module, and its paths are text (os.path)
if TYPE_CHECKING:
    from pathlib import Path

TRUST_ENV = envspec.TRUST_SHARED.name
UntrustedFile = groupfiles.UntrustedFile  # a file or directory another user owns or can write, or a link


def trust_shared(env: Mapping[str, str] = os.environ) -> bool:
    """PYVGPU_TRUST_SHARED: 1 lets this process use files of other users, or files others can write."""
    return bool(grouplib.env_setting({TRUST_ENV: env.get(TRUST_ENV, "")}, grouplib.TRUST_SHARED))


def who(uid: int) -> str:
    """'uid 65534 (nobody)'."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def private_dir(path: str | Path, what: str, fix: str) -> str | Path:
    """Make ``path`` a directory that only this user can write, or refuse (UntrustedFile naming ``fix``): made
    0700 when missing, a link or another user's refused, our own with another mode repaired to 0700. Only
    ``path`` itself is created, never its parents."""
    return groupfiles.private_dir(path, what, fix)


def open_regular(path: str | Path, flags: int, what: str, fix: str, mode: int = 0o600) -> int:
    """Open ``path`` with O_NOFOLLOW and O_NONBLOCK, and check that it is a regular file; returns the fd
    (blocking again). A link at the path is refused, a FIFO or device is refused without blocking on it.
    A file created here is 0600."""
    return groupfiles.open_shared(path, flags, what, fix, trust=True)
