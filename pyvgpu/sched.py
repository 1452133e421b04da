"""The turn file: one per machine, where the groups on each GPU take turns.

Its layout is pyvgpu.layout (SCHED_HEADER, then SCHED_ENTRIES x SCHED_ENTRY);
the callbacks in pyvgpu/jit/turn.py work on it. Every group on the machine
must use the same file, whoever started it, so it is not in a user's runtime
directory: ``/dev/shm/pyvgpu-turns-v2`` (mode 0666; users who share a GPU
share its turns), else ``<runtime dir>/turns``; ``PYVGPU_SCHED=PATH`` names
another. ``PYVGPU_SM_TURN=0`` leaves it out: groups then time-slice the GPU.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from pyvgpu import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.region import map_forever, runtime_dir

Header = L.SCHED_HEADER.ctypes_class()
Entry = L.SCHED_ENTRY.ctypes_class()
SHM_PATH = Path("/dev/shm/pyvgpu-turns-v2")


def enabled(env: Mapping[str, str]) -> bool:
    """PYVGPU_SM_TURN: 1 (the default) or 0."""
    text = env.get("PYVGPU_SM_TURN", "").strip()
    if text not in ("", "0", "1"):
        raise PyvgpuError(f"PYVGPU_SM_TURN={text!r}: give 1 (groups with a share take turns on a GPU, the "
                          "default) or 0 (they time-slice it)")
    return text != "0"


def path(env: Mapping[str, str]) -> Path:
    if env.get("PYVGPU_SCHED"):
        return Path(env["PYVGPU_SCHED"])
    if SHM_PATH.parent.is_dir() and os.access(SHM_PATH.parent, os.W_OK):
        return SHM_PATH
    return runtime_dir() / "turns"


def _create(p: Path) -> None:
    """Link a complete, empty turn file into place unless one is there already."""
    p.parent.mkdir(parents=True, exist_ok=True)
    head = Header(magic=L.SCHED_MAGIC, version=L.SCHED_VERSION, n_entries=L.SCHED_ENTRIES, size=L.SCHED_SIZE)
    tmp = p.parent / f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        os.fchmod(fd, 0o666)  # every user's groups take turns on the same GPUs
        os.write(fd, bytes(head))
        os.ftruncate(fd, L.SCHED_SIZE)
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass
    finally:
        os.close(fd)
        os.unlink(tmp)


def open_fd(p: Path) -> int:
    """Open (creating it if needed) and check the turn file; returns a read-write fd."""
    fix = f"remove {p} when no pyvgpu program runs, or set PYVGPU_SM_TURN=0"
    try:
        if not p.exists():
            _create(p)
        fd = os.open(p, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except PermissionError:
        raise PyvgpuError(f"the turn file {p}: permission denied (it should be mode 0666); {fix}") from None
    except OSError as e:
        raise PyvgpuError(f"the turn file {p}: {e.strerror}; {fix}, or set PYVGPU_SCHED to a writable "
                          "path that every group uses") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PyvgpuError(f"the turn file {p} is not a regular file; {fix}")
        head = Header.from_buffer_copy(os.pread(fd, L.SCHED_HEADER.size, 0).ljust(L.SCHED_HEADER.size, b"\0"))
        if head.magic != L.SCHED_MAGIC:
            raise PyvgpuError(f"the turn file {p} is not a pyvgpu turn file (bad magic); {fix}")
        if head.version != L.SCHED_VERSION or head.n_entries != L.SCHED_ENTRIES:
            raise PyvgpuError(f"the turn file {p} has version {head.version} with {head.n_entries} entries, this "
                              f"pyvgpu uses {L.SCHED_VERSION} with {L.SCHED_ENTRIES}; {fix}")
        if head.size != L.SCHED_SIZE or st.st_size != L.SCHED_SIZE:
            raise PyvgpuError(f"the turn file {p} is {st.st_size} bytes, expected {L.SCHED_SIZE} (damaged); {fix}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def attach(env: Mapping[str, str] = os.environ) -> int:
    """Map the turn file for the callbacks (never unmapped); 0 when PYVGPU_SM_TURN=0."""
    if not enabled(env):
        return 0
    fd = open_fd(path(env))
    try:
        return map_forever(fd, L.SCHED_SIZE)
    finally:
        os.close(fd)


def attach_member(env: Mapping[str, str], has_share: bool) -> int:
    """The turn file for a group's process. A group with a share cannot run without it (its share would
    not hold). One without a share only takes part, best effort: if the file is broken it runs without
    turns, with a warning, since the groups with a share refuse to start on the same file anyway."""
    try:
        return attach(env)
    except PyvgpuError as e:
        if has_share:
            raise
        print(f"pyvgpu: warning: {e}; this program does not take turns on the GPU", file=sys.stderr)
        return 0


def entries(p: Path) -> list[dict]:
    """The GPUs in use in the turn file, for reports: key, holder id and the counters (layout SCHED_ENTRY)."""
    fd = open_fd(p)
    try:
        data = os.pread(fd, L.SCHED_SIZE, 0)
    finally:
        os.close(fd)
    out = []
    for i in range(L.SCHED_ENTRIES):
        e = Entry.from_buffer_copy(data, L.SCHED_ENTRIES_OFF + i * L.SCHED_ENTRY.size)
        if e.key:
            out.append({"key": e.key, "holder": e.turn >> 32, "handovers": e.handovers, "wait_ns": e.wait_ns,
                        "drains": e.drains, "drain_ns": e.drain_ns, "gaps": e.gaps, "gap_ns": e.gap_ns,
                        "coruns": e.coruns, "preempts": e.preempts, "max_wait_ns": e.max_wait_ns})
    return out
