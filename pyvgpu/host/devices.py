"""What the machine's GPUs are, asked of NVML (used to check limits and pick devices before a program starts)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

from pyvgpu.contract import envspec
from pyvgpu.contract.record import record  # not dataclasses: a plain wrap imports this
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


@record(frozen=True)
class Gpu:
    """One device a program can be given: a GPU (its NVML index, nvidia-smi's), or a MIG instance of one.

    A MIG instance has a UUID of its own ("MIG-..."), its own memory, and ``index`` is its GPU's NVML
    index; ``parent`` is its GPU's UUID, ``gi``/``ci`` its GPU and compute instance ids (the older
    "MIG-GPU-<uuid>/<gi>/<ci>" name)."""

    index: int
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", or "MIG-..." for a MIG instance
    name: str
    total: int
    parent: str = ""
    gi: int = -1
    ci: int = -1
    mig_mode: bool = False  # a GPU whose MIG mode is on: its memory and SMs are its instances'

    @property
    def is_mig(self) -> bool:
        return bool(self.parent)

    @property
    def legacy_name(self) -> str:
        return f"MIG-{self.parent}/{self.gi}/{self.ci}" if self.is_mig else self.uuid

    @property
    def uuid_bytes(self) -> bytes:
        return uuid_bytes(self.uuid)

    def describe(self) -> str:
        if self.is_mig:
            return f"MIG instance {self.uuid} ({self.name}) of GPU {self.index}"
        return f"device {self.index} ({self.uuid})"


# patterns compiled at their first use (re caches them): a plain `pyvgpu wrap` imports this module and uses none,
# so `re` itself is imported where they are used
_UUID = (r"^(?:GPU|MIG)-([0-9a-fA-F]{8})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-"
         r"([0-9a-fA-F]{12})$")


def uuid_bytes(text: str) -> bytes:
    """The 16 raw bytes of a GPU or MIG UUID in NVML's text form (what cuDeviceGetUuid_v2 returns)."""
    import re

    m = re.match(_UUID, text)
    if not m:
        raise PyvgpuError(f"{text!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return bytes.fromhex("".join(m.groups()))


def uuid_text(raw: bytes, mig: bool = False) -> str:
    h = raw.hex()
    return f"{'MIG' if mig else 'GPU'}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


NVML_ERROR_NOT_FOUND = 6
MAX_MIG_PER_GPU = 8  # bound on nvmlDeviceGetMaxMigDeviceCount's answer (7 on A100/H100)


def _describe(nv, h) -> tuple[str, str, int] | None:
    """UUID, name and total memory of an NVML handle (GPU or MIG), or None."""
    m = _Memory()
    uuid = ctypes.create_string_buffer(96)
    name = ctypes.create_string_buffer(96)
    if nv.nvmlDeviceGetUUID(h, uuid, 96) != 0 or nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) != 0:
        return None
    if nv.nvmlDeviceGetName(h, name, 96) != 0:
        name.value = b"?"
    return uuid.value.decode(), name.value.decode(errors="replace"), m.total


def _mig_mode(nv, h) -> bool:
    """Whether a GPU's current MIG mode is on (False where NVML has no MIG calls or the GPU no MIG)."""
    if not hasattr(nv, "nvmlDeviceGetMigMode"):
        return False
    current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
    return nv.nvmlDeviceGetMigMode(h, ctypes.byref(current), ctypes.byref(pending)) == 0 and current.value == 1


def _instances(nv, gpu: Gpu, h) -> list[Gpu]:
    """The MIG instances that exist on a GPU in MIG mode (read only: nothing is created or destroyed)."""
    n = ctypes.c_uint(0)
    if nv.nvmlDeviceGetMaxMigDeviceCount(h, ctypes.byref(n)) != 0:
        return []
    out = []
    for k in range(min(n.value, MAX_MIG_PER_GPU)):
        m = ctypes.c_void_p()
        if nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k, ctypes.byref(m)) != 0:
            continue  # NVML_ERROR_NOT_FOUND: no instance at that index
        d = _describe(nv, m)
        if d is None:
            continue
        gi, ci = ctypes.c_uint(0), ctypes.c_uint(0)
        ids = (nv.nvmlDeviceGetGpuInstanceId(m, ctypes.byref(gi)) == 0
               and nv.nvmlDeviceGetComputeInstanceId(m, ctypes.byref(ci)) == 0)
        out.append(Gpu(gpu.index, d[0], d[1], d[2], parent=gpu.uuid, gi=gi.value if ids else -1,
                       ci=ci.value if ids else -1))
    return out


def inventory() -> tuple[list[Gpu], list[Gpu]] | None:
    """(every GPU NVML sees, in NVML order; every MIG instance, by GPU), or None when NVML is not there."""
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
        gpus: list[Gpu] = []
        migs: list[Gpu] = []
        for i in range(n.value):
            h = ctypes.c_void_p()
            if nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                return None
            d = _describe(nv, h)
            if d is None:
                return None
            g = Gpu(i, d[0], d[1], d[2], mig_mode=_mig_mode(nv, h))
            gpus.append(g)
            if g.mig_mode:
                migs += _instances(nv, g, h)
        return gpus, migs
    finally:
        nv.nvmlShutdown()


def machine() -> list[Gpu] | None:
    """Every GPU NVML sees, in NVML order, or None when NVML is not there."""
    inv = inventory()
    return None if inv is None else inv[0]


_ENTRY = (r"^(?:[0-9]{1,4}|GPU-[0-9A-Fa-f-]{0,36}|MIG-[0-9A-Fa-f-]{0,36}|"
          r"MIG-GPU-[0-9A-Fa-f-]{36}/[0-9]{1,3}/[0-9]{1,3})$")  # any case
_LEGACY_MIG = r"^MIG-(GPU-[0-9A-Fa-f-]{36})/([0-9]{1,3})/([0-9]{1,3})$"  # any case
MIG_FIX = ("MIG instances are made by an administrator (nvidia-smi mig -cgi ... -C, on a GPU whose MIG "
           "mode is on); pyvgpu only uses the ones that exist")
ONE_MIG = ("a CUDA process sees a single MIG instance (NVIDIA's MIG user guide: only enumeration of a single "
           "MIG instance is supported)")


def check_entry(entry: str, where: str) -> None:
    """Refuse what is neither an index nor (the start of) a GPU UUID, before NVML is asked."""
    import re

    from pyvgpu.group.limits import not_ascii

    not_ascii(entry, where, "devices", "0,2 or GPU-8e1f")
    if not re.match(_ENTRY, entry.strip(), re.IGNORECASE):
        raise PyvgpuError(f"{where}: {entry.strip()!r} is not a device; give indices as nvidia-smi shows them (0,2), "
                          "GPU UUIDs (GPU-...) or a MIG instance's UUID (MIG-...), comma-separated")


def _pick_mig(e: str, gpus: list[Gpu], migs: list[Gpu], where: str) -> Gpu:
    import re

    have = "; ".join(f"{m.uuid} ({m.name}, GPU {m.index})" for m in migs)
    listing = f"this machine's MIG instances: {have}" if migs else (
        "this machine has no MIG instance (no GPU has its MIG mode on"
        + (f"; GPU(s) {', '.join(str(g.index) for g in gpus if g.mig_mode)} have it on but no instance)"
           if any(g.mig_mode for g in gpus) else ")"))
    legacy = re.match(_LEGACY_MIG, e, re.IGNORECASE)
    if legacy:
        parent, gi, ci = legacy.group(1).lower(), int(legacy.group(2)), int(legacy.group(3))
        found = [m for m in migs if m.parent.lower() == parent and (m.gi, m.ci) == (gi, ci)]
    else:
        found = [m for m in migs if m.uuid.lower().startswith(e.lower())]
    if len(found) == 1:
        return found[0]
    if not found:
        raise PyvgpuError(f"{where}: no MIG instance is {e!r}; {listing}. Give one of those (`pyvgpu devices` and "
                          f"nvidia-smi -L list them). {MIG_FIX}")
    raise PyvgpuError(f"{where}: {e!r} is the start of {len(found)} MIG instances' UUIDs; give more of it")


def _pick(entry: str, gpus: list[Gpu], where: str, migs: list[Gpu] | None = None) -> Gpu:
    e = entry.strip()
    if e.upper().startswith("MIG-"):
        return _pick_mig(e, gpus, migs or [], where)
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


def select(spec: str, env: Mapping[str, str], gpus: list[Gpu] | None = None,
           migs: list[Gpu] | None = None) -> list[Gpu]:
    """The devices ``--devices spec`` names, in the order given, checked against the machine.

    A MIG instance (``MIG-<uuid>``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``) is a device of its own,
    and must be the only one: a CUDA process enumerates a single MIG instance. A GPU whose MIG mode
    is on is refused as a whole (its memory and SMs are its instances').
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
        inv = inventory()
        gpus, migs = (None, None) if inv is None else inv
    if gpus is None:
        raise PyvgpuError(f"{where}: NVML (libnvidia-ml.so.1) cannot list this machine's devices, so they cannot "
                          "be chosen; leave --devices out, or check the driver with `pyvgpu doctor`")
    migs = migs or []
    chosen = [_pick(e, gpus, where, migs) for e in entries]
    seen: set[str] = set()
    for g in chosen:
        if g.uuid in seen:
            what = f"MIG instance {g.uuid}" if g.is_mig else f"device {g.index}"
            raise PyvgpuError(f"{where}: {what} is given twice")
        seen.add(g.uuid)
        if g.mig_mode:
            mine = [m.uuid for m in migs if m.index == g.index]
            raise PyvgpuError(f"{where}: GPU {g.index} ({g.uuid}) has its MIG mode on, so its memory and SMs belong "
                              "to its MIG instances; give one of them instead: "
                              + (", ".join(mine) if mine else f"it has none yet ({MIG_FIX})"))
    if any(g.is_mig for g in chosen) and len(chosen) > 1:
        raise PyvgpuError(f"{where}: {ONE_MIG}; give one MIG instance alone, and start a group per instance "
                          "(pyvgpu wrap --devices MIG-... for each program)")
    outer = env.get(envspec.CUDA_VISIBLE_DEVICES.name)
    if outer is not None and outer.strip() != "":
        allowed: set[str] = set()
        for e in outer.split(","):
            try:
                allowed.add(_pick(e, gpus, envspec.CUDA_VISIBLE_DEVICES.name, migs).uuid)
            except PyvgpuError:
                break  # CUDA stops at the first entry it cannot use
        for g in chosen:
            if g.uuid not in allowed:
                raise PyvgpuError(f"{where}: {g.describe()} is not among CUDA_VISIBLE_DEVICES={outer!r} "
                                  "that this shell allows; choose among those")
    elif outer is not None:
        raise PyvgpuError(f"{where}: CUDA_VISIBLE_DEVICES is set empty here, which allows no device")
    return chosen
