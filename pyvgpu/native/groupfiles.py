"""The ctypes binding of libpyvgpu_group.so, its second half: files other users may touch, the group's region
and the turn file (shim/src/pv_group_files.c, pv_group_region.c, pv_group_checks.c, pv_group_turns.c).

Opening, trusting, creating, checking, mapping and changing a region or the turn file is done there, in the
code the shim joins its group with; pyvgpu.group and the node agent reach it here. pyvgpu/native/grouplib.py
loads the library and binds the grammar and the environment's values.
"""

from __future__ import annotations

import ctypes
import weakref

from pyvgpu.errors import PyvgpuError
from pyvgpu.native.grouplib import ERR_BYTES, MAX_DEVICES, _b, _call, lib

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module, and its paths are text (os.path)
if TYPE_CHECKING:
    from pathlib import Path

# pv_shim.h PV_OPEN_*: why an open failed
OPEN_MISSING, OPEN_UNTRUSTED, OPEN_REFUSED = 1, 2, 3
PRIORITY_SETTING, SM_BORROW_SETTING = 0, 1  # pv_shim.h PV_SETTING_*: the region header's group settings


class UntrustedFile(PyvgpuError):
    """A file or directory that another user owns or can write, or a link where a file should be."""


def _open(fn: str, *args) -> int:
    """An fd from one of the open functions; its refusal as FileNotFoundError's message (missing), UntrustedFile
    or PyvgpuError."""
    err, kind = ctypes.create_string_buffer(ERR_BYTES), ctypes.c_int()
    fd = getattr(lib(), fn)(*args, err, ERR_BYTES, ctypes.byref(kind))
    if fd >= 0:
        return fd
    message = err.value.decode("utf-8", "replace")
    raise (UntrustedFile if kind.value == OPEN_UNTRUSTED else PyvgpuError)(message)


def private_dir(p: str | Path, what: str, fix: str) -> str | Path:
    """``p`` made (0700) or checked: a directory of this user's, no link, that nobody else can write."""
    err = ctypes.create_string_buffer(ERR_BYTES)
    rc = lib().pyvgpu_g_private_dir(_b(str(p)), _b(what), _b(fix), err, ERR_BYTES)
    if rc:
        raise (UntrustedFile if rc == -2 else PyvgpuError)(err.value.decode("utf-8", "replace"))
    return p


def spelt(path: str) -> str:
    """``path`` spelt as str(pathlib.Path(path)) spells it: no empty or '.' parts, no trailing '/' (a '..' is
    kept: it may cross a link). The paths a wrap hands on are text, and the same as before they were."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return ("/" if path.startswith("/") else "") + "/".join(parts) or "."


def runtime_dir(make: bool) -> str:
    """$XDG_RUNTIME_DIR/pyvgpu if that is writable, else /tmp/pyvgpu-<uid>; with ``make``, made private
    (private_dir)."""
    out = ctypes.create_string_buffer(4096)
    _call("pyvgpu_g_runtime_dir", int(make), out, len(out))
    return spelt(out.value.decode("utf-8", "surrogateescape"))


def open_shared(p: str | Path, flags: int, what: str, fix: str, trust: bool, root_group_ok: bool = False) -> int:
    """A regular file opened with O_NOFOLLOW and O_NONBLOCK (then blocking), refused (UntrustedFile) when another
    user owns it or can write it unless ``trust``; the fd."""
    return _open("pyvgpu_g_open_shared", _b(str(p)), flags, _b(what), _b(fix), int(root_group_ok), int(trust))


def use_turns(p: str | Path, machine: str | Path, trust: bool) -> int:
    """The turn file at ``p`` opened read-write and checked (ours or root's, this version, whole), made first
    (0600) when it is missing and not the ``machine``'s; the fd."""
    return _open("pyvgpu_g_use_turns", _b(str(p)), _b(str(machine)), int(trust))


def read_turns(p: str | Path, machine: str | Path, trust: bool, size: int) -> bytes:
    """A snapshot of the turn file at ``p`` (``size`` bytes, the layout's), opened as use_turns opens it."""
    out = ctypes.create_string_buffer(size)
    _open("pyvgpu_g_read_turns", _b(str(p)), _b(str(machine)), int(trust), out)
    return out.raw


def node_turns(p: str | Path, mode: int) -> None:
    """The node agent's turn file at ``p``: made with ``mode`` when missing, checked, its mode kept ``mode``."""
    _call("pyvgpu_g_node_turns", _b(str(p)), mode)


def setup_turns(p: str | Path, gid: int, mode: int, trust: bool) -> str:
    """The machine's turn file at ``p`` for group ``gid`` (root): "kept", "replaced" or "made"."""
    err = ctypes.create_string_buffer(ERR_BYTES)
    rc = lib().pyvgpu_g_setup_turns(_b(str(p)), gid, mode, int(trust), err, ERR_BYTES)
    if rc < 0:
        raise PyvgpuError(err.value.decode("utf-8", "replace"))
    return ("kept", "replaced", "made")[rc]


def machine_turns_problem(p: str | Path, trust: bool) -> str | None:
    """Why this user cannot use the machine's turn file at ``p`` (made by `pyvgpu setup`), or None."""
    why = ctypes.create_string_buffer(ERR_BYTES)
    if lib().pyvgpu_g_machine_turns_problem(_b(str(p)), int(trust), why, ERR_BYTES):
        return why.value.decode("utf-8", "replace")
    return None


def make_region(p: str | Path, want: ctypes.Structure, memory: list[int], sm: list[int], mode: int,
                owner: tuple[int, int | None] | None = None) -> bool:
    """Link a complete region into place unless one is there; True if this call made it. ``want`` (a region
    header) holds the group's own fields; the layout's, the owner, the time and the limits are filled in C.
    ``owner`` (uid, gid or None): the file is theirs and the header says so, else this user's."""
    err = ctypes.create_string_buffer(ERR_BYTES)
    uid, gid = owner if owner is not None else (-1, None)
    rc = lib().pyvgpu_g_make_region(_b(str(p)), ctypes.addressof(want), (ctypes.c_uint64 * MAX_DEVICES)(*memory),
                                    (ctypes.c_uint32 * MAX_DEVICES)(*sm), mode, uid, -1 if gid is None else gid,
                                    err, ERR_BYTES)
    if rc < 0:
        raise PyvgpuError(err.value.decode("utf-8", "replace"))
    return rc == 1


def check_limits(p: str | Path, region_address: int, shares: bool, want: list[int], source: str) -> None:
    """A process's caps (or shares) against its group's in the region mapped at ``region_address``: raise
    naming ``source`` when they disagree (the group's first limits are followed)."""
    _call("pyvgpu_g_check_limits", _b(str(p)), region_address, int(shares), (ctypes.c_uint64 * MAX_DEVICES)(*want),
          _b(source))


def map_shared(fd: int, size: int, p: str, what: str, fix: str) -> int:
    """The file behind ``fd`` mapped shared and read-write, never unmapped, its size checked right before; the
    address."""
    err = ctypes.create_string_buffer(ERR_BYTES)
    addr = lib().pyvgpu_g_map_shared(fd, size, _b(p), _b(what), _b(fix), err, ERR_BYTES)
    if not addr:
        raise PyvgpuError(err.value.decode("utf-8", "replace"))
    return addr


def turn_path(sched: str, machine: str | Path, trust: bool) -> tuple[str, str | None]:
    """The turn file: ``sched`` (PYVGPU_SCHED) if given, else the machine's (at ``machine``) if usable, else
    this user's; with why the machine's is not used when this user's is chosen."""
    out, why, own = ctypes.create_string_buffer(4096), ctypes.create_string_buffer(ERR_BYTES), ctypes.c_int()
    _call("pyvgpu_g_turn_path", _b(sched), _b(str(machine)), int(trust), out, len(out), ctypes.byref(own), why,
          ERR_BYTES)
    return out.value.decode("utf-8", "surrogateescape"), (why.value.decode("utf-8", "replace")
                                                          if own.value else None)


# ---- a view of a region, its members; a process's wishes against its group's; live changes -------------

def view_region(p: str | Path, writable: bool, trust: bool, header: ctypes.Structure) -> tuple[int, ctypes.Array]:
    """The region at ``p`` opened and checked as open_region does, and a view of its ``header.size`` bytes:
    writable, the file mapped shared; else a private snapshot. (fd, the view); the view is unmapped when the
    last object that uses its memory goes."""
    addr = ctypes.c_void_p()
    fd = _open("pyvgpu_g_view_region", _b(str(p)), int(writable), int(trust), ctypes.addressof(header),
               ctypes.byref(addr))
    view = (ctypes.c_char * header.size).from_address(addr.value)
    # unmapped once unused; at exit it is left to the kernel, so no exit handler reads an unmapped view
    weakref.finalize(view, lib().pyvgpu_g_unmap, addr.value, header.size).atexit = False
    return fd, view


def watch_region(p: str | Path) -> int:
    """The region at ``p``, checked, mapped shared and read-only for good; the address."""
    err = ctypes.create_string_buffer(ERR_BYTES)
    addr = lib().pyvgpu_g_watch_region(_b(str(p)), err, ERR_BYTES)
    if not addr:
        raise PyvgpuError(err.value.decode("utf-8", "replace"))
    return addr


def slots_locked(fd: int, first: int, count: int) -> bool:
    """Does a process hold the lock of one of the slots first..first+count-1 of the region open at ``fd``?"""
    got = lib().pyvgpu_g_slots_locked(fd, first, count)
    if got < 0:
        import os

        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return bool(got)


def gc_private(directory: str | Path, min_age_ns: int, trust: bool) -> int:
    """Remove the regions in ``directory`` no process holds and older than ``min_age_ns``; how many."""
    return lib().pyvgpu_g_gc_private(_b(str(directory)), min_age_ns, int(trust))


def check_devices(p: str | Path, region_address: int, want: list[int], uuids: bytes, source: str) -> None:
    """The group's devices against those a process asks for (NVML index | VISIBLE_MIG each, their raw UUIDs)."""
    _call("pyvgpu_g_check_devices", _b(str(p)), region_address, len(want), (ctypes.c_uint32 * MAX_DEVICES)(*want),
          uuids, _b(source))


def check_setting(p: str | Path, region_address: int, which: int, want: int, source: str) -> None:
    """A group setting (PRIORITY_SETTING, SM_BORROW_SETTING) against what a process asks for."""
    _call("pyvgpu_g_check_setting", _b(str(p)), region_address, which, want, _b(source))


def check_bounds(p: str | Path, region_address: int, physical: list[int]) -> None:
    """Refuse a region with a cap above its device's memory (``physical``: bytes per device, 0 unknown)."""
    phys = physical[:MAX_DEVICES]
    _call("pyvgpu_g_check_bounds", _b(str(p)), region_address, len(phys), (ctypes.c_uint64 * MAX_DEVICES)(*phys))


def check_change(p: str | Path, region_address: int, shares: bool, spec: tuple[int | None, dict[int, int]],
                 n_devices: int, total: list[int] | None, where: str) -> None:
    """A live change (a --memory or --sm spec: every device's value or None, {device: value}) against the
    group's ``n_devices`` devices and their memory (``total``, None when unknown), before anything changes."""
    dflt, per = spec
    values = (ctypes.c_uint64 * MAX_DEVICES)(*[per.get(d, 0) for d in range(MAX_DEVICES)])
    mask = sum(1 << d for d in per if 0 <= d < MAX_DEVICES)
    totals = (ctypes.c_uint64 * MAX_DEVICES)(*total[:MAX_DEVICES]) if total is not None else None
    _call("pyvgpu_g_check_change", _b(str(p)), region_address, int(shares), -1 if dflt is None else dflt, values,
          mask, n_devices, totals, _b(where))


def set_device_limit(region_address: int, shares: bool, device: int | None, value: int) -> tuple[list[int], list[int]]:
    """Device ``device``'s (None: every device's) memory cap, or compute share, set to ``value``; (before, after)."""
    old, new = (ctypes.c_uint64 * MAX_DEVICES)(), (ctypes.c_uint64 * MAX_DEVICES)()
    _call("pyvgpu_g_set_device_limit", region_address, int(shares), -1 if device is None else device, value, old, new)
    return list(old), list(new)


def set_setting(region_address: int, which: int, value: int) -> int:
    """A group setting (PRIORITY_SETTING, SM_BORROW_SETTING) set to ``value``; the one before."""
    old = ctypes.c_uint32()
    _call("pyvgpu_g_set_setting", region_address, which, value, ctypes.byref(old))
    return old.value
