"""The turn file: where the groups on each GPU take turns (every wrapped group, with a share or not).

Its layout is pyvgpu.contract.layout (SCHED_HEADER, then SCHED_ENTRIES x SCHED_ENTRY);
the callbacks in pyvgpu/jit/compute/turn.py work on it. Groups take turns only with
groups that use the same file. Which file (docs/security.md says why):

* ``PYVGPU_SCHED=PATH``, if set;
* else the machine's ``/dev/shm/pyvgpu-turns-v1``, if `pyvgpu setup` (run by
  root) made it: owned by root, group ``pyvgpu``, mode 0660. Its group's
  members take turns with each other; nobody else can open it;
* else ``<runtime dir>/turns``, this user's own (0600): the user's groups take
  turns with each other, and time-slice with other users'.

A turn file must be a regular file (no link, no FIFO), owned by this user
(only this user may write it) or by root (its group may write it, others may
not); ``PYVGPU_TRUST_SHARED=1`` is the opt-in for any other. A file at the
machine path that fails this (another user made it first, or it is mode 0666)
is not used, with a warning. Every member can still hold the turn: waits for
it are bounded (pyvgpu/jit/compute/turn.py, MAX_WAIT_NS). ``PYVGPU_SM_TURN=0`` leaves
turns out: groups then time-slice the GPU.
"""

from __future__ import annotations

import grp
import os
from collections.abc import Mapping

from pyvgpu.contract import envspec
from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group.region import map_forever
from pyvgpu.native import groupfiles, grouplib, safefile

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module, and its paths are text (os.path)
if TYPE_CHECKING:
    from pathlib import Path

Header = L.SCHED_HEADER.ctypes_class()
Entry = L.SCHED_ENTRY.ctypes_class()
SHM_PATH = "/dev/shm/pyvgpu-turns-v1"  # text, as every path a wrap handles (a Path works too)
SETUP_GROUP = "pyvgpu"  # the Unix group whose members share the machine's turn file
SETUP_MODE = 0o660


def enabled(env: Mapping[str, str]) -> bool:
    """PYVGPU_SM_TURN: 1 (the default) or 0."""
    return bool(grouplib.env_setting({envspec.SM_TURN.name: env.get(envspec.SM_TURN.name, "")}, grouplib.TURNS))


def machine_problem(p: str | Path = SHM_PATH, env: Mapping[str, str] = os.environ) -> str | None:
    """Why this user cannot use the machine's turn file at p, or None if it can (lstat, owner, mode, access)."""
    return groupfiles.machine_turns_problem(p, safefile.trust_shared(env))


def choose(env: Mapping[str, str]) -> tuple[str, str | None]:
    """The turn file this process uses, and a warning to show when the machine's is there but unusable."""
    p, problem = groupfiles.turn_path(env.get(envspec.SCHED.name, ""), SHM_PATH, safefile.trust_shared(env))
    note = None
    if problem is not None and os.path.lexists(SHM_PATH):
        note = (f"not using the machine's turn file: {problem}; your groups take turns with each other only "
                f"({p}). Ask root to run `pyvgpu setup`")
    return p, note


def path(env: Mapping[str, str]) -> str:
    return choose(env)[0]


def open_fd(p: str | Path, env: Mapping[str, str] = os.environ) -> int:
    """Open (creating it if needed, not the machine's) and check the turn file; returns a read-write fd."""
    return groupfiles.use_turns(p, SHM_PATH, safefile.trust_shared(env))


def node_file(p: str | Path, mode: int) -> None:
    """The turn file a Kubernetes node's agent keeps for every container (pyvgpu/cluster/node/nodestate.py):
    made with ``mode`` when missing, checked (the agent made it, so trusted), its mode set back if changed."""
    groupfiles.node_turns(p, mode)


def setup(group: str = SETUP_GROUP, p: str | Path = SHM_PATH) -> str:
    """Make the machine's turn file for the members of ``group`` (root only); what was done, in words.

    A file already there that is root's, of that group, mode 0660 and whole is kept (running programs
    have it mapped). Anything else at the path (a file another user made first, an old 0666 one, a
    link) is removed and replaced (shim/src/pv_group_turns.c).
    """
    if os.geteuid() != 0:
        raise PyvgpuError("`pyvgpu setup` makes the machine's turn file for every user: run it as root")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise PyvgpuError(f"there is no group {group!r}: create it (groupadd {group}) and add the users who share "
                          f"the GPUs (usermod -aG {group} USER), then run `pyvgpu setup` again") from None
    done = groupfiles.setup_turns(p, gid, SETUP_MODE, safefile.trust_shared())
    if done == "kept":
        return f"{p} is in place (root:{group}, mode {SETUP_MODE:04o}); kept"
    was = "replaced the file that was there" if done == "replaced" else "made it"
    return f"{p}: {was} (root:{group}, mode {SETUP_MODE:04o}); members of {group!r} take turns on the GPUs"


def attach(env: Mapping[str, str] = os.environ) -> int:
    """Map the turn file for the callbacks (never unmapped); 0 when PYVGPU_SM_TURN=0."""
    if not enabled(env):
        return 0
    fd = open_fd(path(env), env)
    try:
        return map_forever(fd, L.SCHED_SIZE, guard="turns")
    finally:
        os.close(fd)


def entries(p: str | Path) -> list[dict]:
    """The GPUs in use in the turn file, for reports: key, holder id and the counters."""
    data = groupfiles.read_turns(p, SHM_PATH, safefile.trust_shared(), L.SCHED_SIZE)
    out = []
    for i in range(L.SCHED_ENTRIES):
        e = Entry.from_buffer_copy(data, L.SCHED_ENTRIES_OFF + i * L.SCHED_ENTRY.size)
        if e.key:
            out.append({"key": e.key, "holder": e.turn >> 32, "handovers": e.handovers, "wait_ns": e.wait_ns,
                        "drains": e.drains, "drain_ns": e.drain_ns, "gaps": e.gaps, "gap_ns": e.gap_ns,
                        "coruns": e.coruns, "preempts": e.preempts, "max_wait_ns": e.max_wait_ns,
                        "lapses": e.lapses, "lapse_ns": e.lapse_ns, "joins": e.joins, "join_ns": e.join_ns,
                        "stucks": e.stucks, "stuck_ns": e.stuck_ns, "catchups": e.catchups,
                        "unmatched": e.unmatched, "charged_ns": e.charged_ns})
    return out
