"""The shared region: one file per group of processes that share a quota.

Its layout is pyvgpu.contract.layout (REGION_HEADER, REGION_DEVICE, REGION_SLOT);
the callbacks in pyvgpu/jit/state/quota.py work on it through the same offsets.
Regions are created (atomically: a complete file is linked into place, never
a half-initialised one), opened and validated (magic, version, size, owner,
who may write it) and mapped by the group core in C (shim/src/pv_group_*.c,
through pyvgpu/native/grouplib.py), the code the shim joins its group with. This
module gives them Python's shape: the Region view, live changes, the event
log, and reading them for `pyvgpu status`.

Paths: ``--region PATH``; ``--group NAME`` -> <runtime dir>/groups/NAME.region;
HAMi's CUDA_DEVICE_MEMORY_SHARED_CACHE names a path too. Without either,
`pyvgpu wrap` makes a private group: <runtime dir>/private/<pid>-<random>.region.
The runtime dir is $XDG_RUNTIME_DIR/pyvgpu, else /tmp/pyvgpu-<uid>.

A plain `pyvgpu wrap` imports this module, and importing pathlib would cost it more than its own work here
(docs/measurements.md): the wrap's paths are text (group_file, new_private_path), the functions take a str
or a Path, and the Path forms (runtime_dir, private_runtime_dir, group_path) import pathlib when called.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence

from pyvgpu.contract import layout as L
from pyvgpu.contract.record import record  # not dataclasses: a plain wrap imports this
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.group.spec import GroupSpec  # what a region is made with or checked against; here for callers
from pyvgpu.host.devices import Gpu, uuid_text
from pyvgpu.native import groupfiles, grouplib, safefile

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module
if TYPE_CHECKING:
    from pathlib import Path

Header = L.REGION_HEADER.ctypes_class()
Event = L.REGION_EVENT.ctypes_class()
Device = L.REGION_DEVICE.ctypes_class()
Slot = L.REGION_SLOT.ctypes_class()
_NAME_PUNCTUATION = frozenset("_.-")  # a group name: 1-63 of these, ASCII letters and digits


def runtime_dir() -> Path:
    """Where this user's groups are (not made here: private_runtime_dir makes it)."""
    from pathlib import Path

    return Path(groupfiles.runtime_dir(make=False))


RUNTIME_FIX = ("Ask its owner or root to remove it, or set XDG_RUNTIME_DIR to a directory of your own (pyvgpu "
               "then keeps its groups in $XDG_RUNTIME_DIR/pyvgpu)")  # pv_shim.h PV_RUNTIME_FIX


def _private_dir(sub: str | None) -> str:
    top = groupfiles.runtime_dir(make=True)
    if sub is None:
        return top
    return safefile.private_dir(os.path.join(top, sub), "the runtime directory", RUNTIME_FIX)


def private_runtime_dir(sub: str | None = None) -> Path:
    """The runtime dir (and ``sub`` in it), made or checked by safefile.private_dir: 0700, this user's,
    no link; checked before anything is created inside."""
    from pathlib import Path

    return Path(_private_dir(sub))


def check_group_name(name: str) -> str:
    """``name`` if it can name a group (a file name in the runtime dir), else the error that names --group."""
    if not (name and len(name) <= 63 and name.isascii()
            and all(c.isalnum() or c in _NAME_PUNCTUATION for c in name)):
        raise PyvgpuError(f"--group {name!r}: a group name is 1-63 letters, digits, '.', '_' or '-'")
    return name


def group_file(name: str) -> str:
    """The region file of the group ``name``, as text (what a wrap uses); the runtime dir made first."""
    return os.path.join(_private_dir("groups"), f"{check_group_name(name)}.region")


def group_path(name: str) -> Path:
    """group_file as a Path."""
    from pathlib import Path

    return Path(group_file(name))


def new_private_path() -> str:
    """A new private group's region file (text): <runtime dir>/private/<pid>-<random>.region."""
    return os.path.join(_private_dir("private"), f"{os.getpid()}-{os.urandom(4).hex()}.region")


def path_from_env(env: Mapping[str, str]) -> Path | None:
    """The region this process belongs to, by the environment contract (as the shim reads it)."""
    return grouplib.env_region(env)


@record
class Region:
    """A mapped region file (or, read-only, a snapshot of one): ``view`` is its memory, mapped by the group
    core (groupfiles.view_region) and unmapped when nothing uses it any more; the fields are read through the
    generated layout's ctypes classes."""

    path: str | Path  # as it was opened: text on a wrap's path
    fd: int
    view: ctypes.Array
    header: ctypes.Structure
    writable: bool = True

    @property
    def address(self) -> int:
        return ctypes.addressof(self.view)

    def device(self, d: int) -> ctypes.Structure:
        return Device.from_buffer(self.view, L.REGION_DEVICES_OFF + d * L.REGION_DEVICE.size)

    def slot(self, i: int) -> ctypes.Structure:
        return Slot.from_buffer(self.view, L.REGION_SLOTS_OFF + i * L.REGION_SLOT.size)

    def limits(self) -> list[int]:
        return [self.device(d).limit for d in range(L.MAX_DEVICES)]

    def sm_limits(self) -> list[int]:
        return [self.device(d).sm_limit for d in range(L.MAX_DEVICES)]

    def visible(self) -> list[tuple[int, str]]:
        """The group's devices (--devices): (NVML index, UUID) of each; [] = as CUDA sees them.

        A MIG instance: its GPU's NVML index and its own UUID ("MIG-...")."""
        raw = bytes(self.header.visible_uuid)
        return [(self.header.visible[g] & L.VISIBLE_INDEX,
                 uuid_text(raw[g * L.UUID_BYTES:(g + 1) * L.UUID_BYTES], bool(self.header.visible[g] & L.VISIBLE_MIG)))
                for g in range(self.header.n_visible)]

    def event(self, i: int) -> ctypes.Structure:
        return Event.from_buffer(self.view, L.REGION_EVENTS_OFF + (i % L.N_EVENTS) * L.REGION_EVENT.size)

    def events(self, last: int = L.N_EVENTS) -> list[dict]:
        """The latest events, oldest first; entries being written or overwritten are skipped."""
        end = self.header.ev_next
        out = []
        for i in range(max(0, end - min(last, L.N_EVENTS)), end):
            e = self.event(i)
            seq = e.seq
            if seq != i + 1:
                continue
            item = {"time_ns": e.time_ns, "kind": L.EVENT_KINDS[e.kind] if e.kind < len(L.EVENT_KINDS) else "?",
                    "device": e.device if e.device >= 0 else None, "pid": e.pid, "a": e.a, "b": e.b}
            if e.seq == seq:  # not overwritten while we read it
                out.append(item)
        return out

    @property
    def name(self) -> str:
        return bytes(self.header.name).rstrip(b"\0").decode(errors="replace")

    def log_event(self, kind: int, device: int, a: int, b: int, pid: int | None = None) -> None:
        """Append an event to the group's ring: by the callbacks' own writer (pyvgpu/jit/state/events.py), called
        through the callback library."""
        from pyvgpu.native import services

        services.log_event(self.address, kind, device, a, b, 0 if pid is None else pid)

    def close(self) -> None:
        """Close the file descriptor (and with it this process's locks); the mapping goes with the object."""
        os.close(self.fd)


def slot_launches(slot: ctypes.Structure) -> int:
    """Every launch a process made: its slot counts each once, in ``launches`` or, when the launch was charged
    to the group's accounting on a device, in that device's ``sm_launches`` (pyvgpu/jit/compute/launch.py)."""
    return slot.launches + sum(d.sm_launches for d in slot.dev)


def create(path: str | Path, spec: GroupSpec, n_slots: int = L.DEFAULT_SLOTS, mode: int = 0o600,
           owner: tuple[int, int | None] | None = None) -> bool:
    """Create the region file of the group ``spec`` describes if it does not exist; True if this call
    created it.

    The complete file is written under a temporary name and linked into place (shim/src/pv_group_region.c,
    as the shim makes its own), so nobody ever opens a half-initialised region. ``owner`` (uid, gid or
    None; root only): the file belongs to them and its header records the uid (the node agent's regions).
    """
    want = Header(n_slots=n_slots, n_physical=spec.n_physical,
                  priority=L.PRIORITY_LOW if spec.priority is None else spec.priority,
                  sm_borrow=int(bool(spec.sm_borrow)))
    raw = spec.name.encode()[: L.GROUP_NAME_BYTES - 1]
    ctypes.memmove(ctypes.addressof(want) + L.REGION_HEADER.offset("name"), raw, len(raw))
    indices, uuids = _visible_fields(spec.visible)
    want.n_visible = len(indices)
    ctypes.memmove(ctypes.addressof(want) + L.REGION_HEADER.offset("visible_uuid"), uuids, len(uuids))
    for i, v in enumerate(indices):
        want.visible[i] = v
    return groupfiles.make_region(path, want, spec.limits.as_list(), spec.sm.as_list(), mode, owner)


def _visible_fields(visible: Sequence[Gpu]) -> tuple[list[int], bytes]:
    """The header's encoding of a group's devices: NVML index | VISIBLE_MIG each, and their raw UUIDs."""
    return [g.index | (L.VISIBLE_MIG if g.is_mig else 0) for g in visible], b"".join(g.uuid_bytes for g in visible)


# A reader (status, the exporter) reads every slot of a region: a member writing a huge n_slots into the
# header (and growing the file to match) would make each read cost gigabytes. No pyvgpu makes more.
MAX_SLOTS = 4 * L.DEFAULT_SLOTS  # pv_shim.h PV_MAX_SLOTS


def open_region(path: str | Path, writable: bool = True, env: Mapping[str, str] = os.environ) -> Region:
    """Map an existing region, checked (shim/src/pv_group_region.c, the shim's own checks) to be one of ours,
    of this version, whole and not foreign.

    Opened with O_NOFOLLOW and O_NONBLOCK: a link or a FIFO at the path is refused, never followed or
    waited on. Mapped writable only if this user owns it and nobody else can write it
    (PYVGPU_TRUST_SHARED=1 is the opt-in), else refused with UntrustedFile.
    A read-only open is a snapshot read with pread: a file someone truncates cannot crash the reader.
    """
    head = Header()
    fd, view = groupfiles.view_region(path, writable, safefile.trust_shared(env) if writable else True, head)
    return Region(path, fd, view, Header.from_buffer(view, 0), writable)


def watch(path: str | Path) -> int:
    """The region at ``path``, checked as a read-only open is, mapped shared and read-only and never unmapped
    (a pool that watches its group's cap and refusals while it runs); the address."""
    return groupfiles.watch_region(path)


GUARDS = {"region": 0, "turns": 1}  # pv_guard.c's PV_GUARD_*


def map_forever(fd: int, size: int, guard: str = "region") -> int:
    """Map the region (or the turn file) for the callbacks, never to be unmapped.

    Python's mmap objects are unmapped when the interpreter finalizes, but
    hooked calls keep coming after that (libraries' static destructors free
    their device memory), so the callbacks get a mapping of their own. The
    file's size is checked right before mapping, and the mapping is registered
    with the shim's SIGBUS guard (shim/src/pv_guard.c): if someone truncates
    the file later, the process fails closed (a region) or stops taking turns
    (the turn file) instead of dying.
    """
    what = "the turn file" if guard == "turns" else "the group region"
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = f"(fd {fd})"
    addr = groupfiles.map_shared(fd, size, name, what, "remove it and start again")
    from pyvgpu.native import shim

    lib = shim.loaded()
    register = getattr(lib, "pyvgpu_guard", None) if lib is not None else None
    if register is not None:
        register.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
        register.restype = ctypes.c_int
        register(addr, size, GUARDS[guard])
    return addr


def check_bounds(r: Region, physical: list[int]) -> None:
    """A region whose cap on a device is above the device's memory was not written by pyvgpu (wrap and
    `limits set` refuse such caps): refuse it rather than trust a cap no GPU has (pv_group_checks.c)."""
    groupfiles.check_bounds(r.path, r.address, physical)


def check_limits(region: Region, wanted: lim.MemoryLimits, source: str) -> None:
    """A process whose limits disagree with its group's gets a clear error (shim/src/pv_group_region.c, the
    shim's own check): the same, or the limits the group was created with, which it then follows."""
    if wanted:
        groupfiles.check_limits(region.path, region.address, False, wanted.as_list(), source)


def check_sm(region: Region, wanted: lim.SmLimits, source: str) -> None:
    """Like check_limits, for compute shares."""
    if wanted:
        groupfiles.check_limits(region.path, region.address, True, wanted.as_list(), source)


def check_devices(region: Region, wanted: Sequence[Gpu], source: str) -> None:
    """A process asking for other devices than its group's gets a clear error (pv_group_checks.c)."""
    indices, uuids = _visible_fields(wanted)
    groupfiles.check_devices(region.path, region.address, indices, uuids, source)


SETTINGS = {"priority": groupfiles.PRIORITY_SETTING, "sm_borrow": groupfiles.SM_BORROW_SETTING}  # the header's


def check_setting(region: Region, field: str, wanted: int | None, source: str) -> None:
    """Like check_limits, for a group setting of the header (priority, sm_borrow)."""
    if wanted is not None:
        groupfiles.check_setting(region.path, region.address, SETTINGS[field], wanted, source)


def create_or_open(path: str | Path, spec: GroupSpec) -> Region:
    """The group region at ``path``: created from ``spec`` if there is none, else opened and checked to be
    the group ``spec`` asks for (caps, shares, devices and the settings it asks for; each mismatch an error
    that names the spec's source of the value)."""
    if not os.path.exists(path):
        create(path, spec)
    r = open_region(path)
    check_limits(r, spec.limits, spec.limits_source)
    check_sm(r, spec.sm, spec.sm_source)
    check_devices(r, spec.visible, spec.devices_source)
    check_setting(r, "priority", spec.priority, spec.priority_source)
    check_setting(r, "sm_borrow", None if spec.sm_borrow is None else int(spec.sm_borrow), spec.borrow_source)
    return r


def _log_change(r: Region, kind: int, device: int | None, old: list[int], new: list[int]) -> None:
    """One event per device changed; one with device -1 when every device was set alike."""
    if old == new:
        return
    if device is None and len(set(old)) == 1:
        r.log_event(kind, -1, old[0], new[0])
        return
    for d in range(L.MAX_DEVICES):
        if old[d] != new[d]:
            r.log_event(kind, d, old[d], new[d])


def change_per_device(r: Region, field: str, value: int, device: int | None) -> list[int]:
    """Set a per-device field (``limit`` or ``sm_limit``) on one device or all of an open region
    (pv_group_checks.c), and log the change; the new values. Members read it at their next call."""
    kind = {"limit": L.EV_MEMORY_LIMIT, "sm_limit": L.EV_SM_LIMIT}[field]
    old, new = groupfiles.set_device_limit(r.address, field == "sm_limit", device, value)
    _log_change(r, kind, device, old, new)
    return new


def change_setting(r: Region, field: str, value: int) -> int:
    """Set a group setting of the header (``priority`` or ``sm_borrow``) of an open region and log the
    change; members follow at their next launch."""
    kind = {"priority": L.EV_PRIORITY, "sm_borrow": L.EV_SM_BORROW}[field]
    old = groupfiles.set_setting(r.address, SETTINGS[field], value)
    if old != value:
        r.log_event(kind, -1, old, value)
    return value


def has_live_member(r: Region) -> bool:
    """Does a process of the group live? Every member holds a lock on its slot's bytes: one query over all
    the slots tells (a loop over every slot in Python made `pyvgpu wrap` slow on a machine with many regions)."""
    return groupfiles.slots_locked(r.fd, 0, r.header.n_slots)


def slot_alive(r: Region, i: int) -> bool:
    """Does the process of slot ``i`` live (it holds the lock on its slot's bytes)?"""
    return groupfiles.slots_locked(r.fd, i, 1)


PRIVATE_MIN_AGE_NS = 60 * 10**9  # a region nobody joined yet is kept a minute: its wrap may still be starting


def gc_private(env: Mapping[str, str] = os.environ) -> int:
    """Remove private regions whose processes are all gone (pv_group_region.c); returns how many."""
    return groupfiles.gc_private(os.path.join(groupfiles.runtime_dir(make=False), "private"), PRIVATE_MIN_AGE_NS,
                                 safefile.trust_shared(env))
