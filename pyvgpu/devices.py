"""What the machine's GPUs are, asked of NVML (used to check limits and pick devices before a program starts)."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pyvgpu.errors import PyvgpuError


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def physical_memory() -> list[int] | None:
    """Total bytes of each device in NVML order, or None when NVML is not there."""
    gpus = machine()
    return None if gpus is None else [g.total for g in gpus]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def utilization_problem(devices: list[int]) -> str | None:
    """Why NVML cannot measure the utilization of these devices (the compute controller's input), or None.

    Devices past the machine's count are ignored here when the list names every
    slot (a limit for all devices); a named device the machine lacks is a problem.
    """
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "NVML (libnvidia-ml.so.1) cannot be loaded"
    rc = nv.nvmlInit_v2()
    if rc != 0:
        return f"NVML does not initialise (nvmlReturn_t {rc})"
    try:
        n = ctypes.c_uint(0)
        if nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return "NVML cannot count the devices"
        every = len(devices) >= 16
        for d in devices:
            if d >= n.value:
                if every:
                    continue
                return f"there is no device {d} (this machine has {n.value})"
            h = ctypes.c_void_p()
            u = _Utilization()
            if nv.nvmlDeviceGetHandleByIndex_v2(d, ctypes.byref(h)) != 0:
                return f"NVML cannot open device {d}"
            rc = nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u))
            if rc != 0:
                return f"NVML does not report device {d}'s utilization (nvmlReturn_t {rc})"
        return None
    finally:
        nv.nvmlShutdown()


@dataclass(frozen=True)
class Gpu:
    """One physical device: its NVML index (nvidia-smi's), UUID and memory."""

    index: int
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    name: str
    total: int

    @property
    def uuid_bytes(self) -> bytes:
        return uuid_bytes(self.uuid)


_UUID = re.compile(r"^GPU-([0-9a-fA-F]{8})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{12})$")


def uuid_bytes(text: str) -> bytes:
    """The 16 raw bytes of a GPU UUID in NVML's text form (what cuDeviceGetUuid returns)."""
    m = _UUID.match(text)
    if not m:
        raise PyvgpuError(f"{text!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return bytes.fromhex("".join(m.groups()))


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def machine() -> list[Gpu] | None:
    """Every device NVML sees, in NVML order, or None when NVML is not there."""
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nv.nvmlInit_v2() != 0:
        return None
    try:
        n = ctypes.c_uint(0)
        if nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return None
        out = []
        for i in range(n.value):
            h = ctypes.c_void_p()
            m = _Memory()
            uuid = ctypes.create_string_buffer(96)
            name = ctypes.create_string_buffer(96)
            if (nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0
                    or nv.nvmlDeviceGetUUID(h, uuid, 96) != 0
                    or nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) != 0):
                return None
            if nv.nvmlDeviceGetName(h, name, 96) != 0:
                name.value = b"?"
            out.append(Gpu(i, uuid.value.decode(), name.value.decode(errors="replace"), m.total))
        return out
    finally:
        nv.nvmlShutdown()


_ENTRY = re.compile(r"^(?:[0-9]{1,4}|GPU-[0-9A-Fa-f-]{0,36})$", re.IGNORECASE)


def check_entry(entry: str, where: str) -> None:
    """Refuse what is neither an index nor (the start of) a GPU UUID, before NVML is asked."""
    from pyvgpu.limits import not_ascii

    not_ascii(entry, where, "devices", "0,2 or GPU-8e1f")
    if not _ENTRY.match(entry.strip()):
        raise PyvgpuError(f"{where}: {entry.strip()!r} is not a device; give indices as nvidia-smi shows them (0,2) "
                          "or GPU UUIDs (GPU-...), comma-separated")


def _pick(entry: str, gpus: list[Gpu], where: str) -> Gpu:
    e = entry.strip()
    if e.isascii() and e.isdigit():
        if int(e) >= len(gpus):
            have = ", ".join(f"{g.index} ({g.name})" for g in gpus) or "none"
            raise PyvgpuError(f"{where}: there is no device {e}; this machine has {len(gpus)}: {have}")
        return gpus[int(e)]
    if e.upper().startswith("GPU-"):
        found = [g for g in gpus if g.uuid.lower().startswith(e.lower())]
        if len(found) == 1:
            return found[0]
        if not found:
            raise PyvgpuError(f"{where}: no device has the UUID {e!r} (nvidia-smi -L lists them)")
        raise PyvgpuError(f"{where}: {e!r} is the start of {len(found)} devices' UUIDs; give more of it")
    raise PyvgpuError(f"{where}: {e!r} is not a device; give indices as nvidia-smi shows them (0,2) or GPU UUIDs "
                      "(GPU-...), comma-separated")


def select(spec: str, env: Mapping[str, str], gpus: list[Gpu] | None = None) -> list[Gpu]:
    """The devices ``--devices spec`` names, in the order given, checked against the machine.

    Under a CUDA_VISIBLE_DEVICES already set (by a scheduler, say), the devices must
    be among those it allows; its indices are taken as NVML's (PCI bus order).
    """
    where = f"--devices {spec!r}"
    entries = [e for e in (spec or "").split(",")]
    if not spec or any(not e.strip() for e in entries):
        raise PyvgpuError(f"{where}: give device indices or GPU UUIDs, comma-separated (e.g. 0,2)")
    for e in entries:
        check_entry(e, where)
    if gpus is None:
        gpus = machine()
    if gpus is None:
        raise PyvgpuError(f"{where}: NVML (libnvidia-ml.so.1) cannot list this machine's devices, so they cannot "
                          "be chosen; leave --devices out, or check the driver with `pyvgpu doctor`")
    chosen = [_pick(e, gpus, where) for e in entries]
    seen: set[int] = set()
    for g in chosen:
        if g.index in seen:
            raise PyvgpuError(f"{where}: device {g.index} is given twice")
        seen.add(g.index)
    outer = env.get("CUDA_VISIBLE_DEVICES")
    if outer is not None and outer.strip() != "":
        allowed: set[int] = set()
        for e in outer.split(","):
            try:
                allowed.add(_pick(e, gpus, "CUDA_VISIBLE_DEVICES").index)
            except PyvgpuError:
                break  # CUDA stops at the first entry it cannot use
        for g in chosen:
            if g.index not in allowed:
                raise PyvgpuError(f"{where}: device {g.index} ({g.uuid}) is not among CUDA_VISIBLE_DEVICES={outer!r} "
                                  "that this shell allows; choose among those")
    elif outer is not None:
        raise PyvgpuError(f"{where}: CUDA_VISIBLE_DEVICES is set empty here, which allows no device")
    return chosen
