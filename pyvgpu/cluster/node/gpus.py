"""The node's GPUs as NVML tells them: inventory, health, and the links between them.

NVML is opened through ctypes and shut again after each question, as pyvgpu/host/devices.py does, so a
driver reload or a GPU that falls off the bus is seen at the next question, not hidden by a stale handle.

* Inventory: index, UUID, name, memory (MiB), NUMA node (from the PCI bus id in sysfs, as HAMi reads
  it: /sys/bus/pci/devices/<bus id>/numa_node; -1 or unreadable is 0); for a GPU whose MIG mode is on,
  the MIG instances that exist (read only: pyvgpu never creates or destroys one), and `mig_layout`, the
  one geometry they make and the order of its positions, which the node agent registers and Allocate
  reads back.
* Health: a GPU is unhealthy when NVML cannot find it, answers NVML_ERROR_GPU_IS_LOST (fallen off the
  bus) or any other error for its handle or memory (NOT_SUPPORTED aside). XID event watching is not
  done (docs/cluster.md, "not built").
* Links: for each pair, the PCIe/board level from nvmlDeviceGetTopologyCommonAncestor scored as in docs/cluster.md
  (same board 60, single switch 50, multiple switches 40, host bridge 30, same CPU 20, across
  CPUs 10), plus 100 per direct NVLink between the two (HAMi pkg/device/nvidia/links.go and
  calculate_score.go sum the same). NVML without the topology call (the test double has none): every
  pair scores DEFAULT_PAIR_SCORE, the worst link, and `pair_scores` says so.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

from pyvgpu.cluster.core.model import Geometry, MigTemplate
from pyvgpu.errors import PyvgpuError

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVLINK_MAX_LINKS = 18
DEFAULT_PAIR_SCORE = 10  # P2PLinkCrossCPU: claims no better link than NVML can show
# nvmlGpuTopologyLevel_t -> the P2P link score (docs/cluster.md, "The model")
TOPOLOGY_SCORES = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
NVLINK_SCORE = 100
SYSFS_PCI = Path("/sys/bus/pci/devices")


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


@dataclass(frozen=True)
class MigInfo:
    """One MIG instance that exists: its own UUID, its profile ("1g.10gb", from NVML's name "<GPU> MIG
    1g.10gb"), memory and GPU/compute instance ids."""

    uuid: str
    profile: str
    memory_mib: int
    gi: int = -1
    ci: int = -1


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mib: int
    numa: int = 0
    bus_id: str = ""
    mig_mode: bool = False
    migs: tuple[MigInfo, ...] = ()


def profile_of(name: str, memory_mib: int) -> str:
    """The MIG profile in a MIG device's NVML name ("NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> "1g.5gb")."""
    if " MIG " in name:
        return name.rsplit(" MIG ", 1)[1].strip()
    return f"{memory_mib}mb"


_SLICES = re.compile(r"^(?:\d+c\.)?(\d+)g\.")


def mig_layout(g: GpuInfo, known: tuple[Geometry, ...] = ()) -> tuple[Geometry, list[str]]:
    """The geometry a MIG GPU's instances make (one template per profile, in order of first appearance,
    counting its instances; memory: the profile's smallest instance) and the instance UUID at each of its
    positions, in HAMi's flattened order (template by template). A template's cores come from a template
    of the same name among `known` (the config's table for this model), else from the profile's compute
    slices out of 7 (A100, H100), else 0."""
    by_profile: dict[str, list[MigInfo]] = {}
    for m in g.migs:
        by_profile.setdefault(m.profile, []).append(m)
    cores = {t.name: t.core for geometry in known for t in geometry}
    templates = []
    uuids: list[str] = []
    for profile, ms in by_profile.items():
        s = _SLICES.match(profile)
        core = cores.get(profile, round(int(s.group(1)) * 100 / 7) if s else 0)
        templates.append(MigTemplate(profile, min(core, 100), min(m.memory_mib for m in ms), len(ms)))
        uuids += [m.uuid for m in ms]
    return tuple(templates), uuids


def mig_positions(known_of=None) -> dict[str, list[str]]:
    """{GPU UUID: the MIG instance UUID at each position of its registered geometry}, for the GPUs whose
    MIG mode is on, read from NVML now."""
    return {g.uuid: mig_layout(g, known_of(g) if known_of else ())[1] for g in inventory() if g.mig_mode}


class _Session:
    """One nvmlInit ... nvmlShutdown."""

    def __init__(self) -> None:
        try:
            self.nv = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            raise PyvgpuError("NVML (libnvidia-ml.so.1) cannot be loaded: no NVIDIA driver here, or the "
                              "container lacks the driver's libraries (NVIDIA container toolkit)") from None
        rc = self.nv.nvmlInit_v2()
        if rc != NVML_SUCCESS:
            raise PyvgpuError(f"NVML does not initialise (nvmlReturn_t {rc})")

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc) -> None:
        self.nv.nvmlShutdown()

    def has(self, name: str) -> bool:
        try:
            getattr(self.nv, name)
        except AttributeError:
            return False
        return True

    def count(self) -> int:
        n = ctypes.c_uint(0)
        rc = self.nv.nvmlDeviceGetCount_v2(ctypes.byref(n))
        if rc != NVML_SUCCESS:
            raise PyvgpuError(f"NVML cannot count the GPUs (nvmlReturn_t {rc})")
        return n.value

    def handle(self, index: int) -> tuple[int, ctypes.c_void_p]:
        h = ctypes.c_void_p()
        return self.nv.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)), h

    def by_uuid(self, uuid: str) -> tuple[int, ctypes.c_void_p]:
        h = ctypes.c_void_p()
        return self.nv.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(h)), h

    def text(self, fn: str, h) -> str:
        buf = ctypes.create_string_buffer(96)
        rc = getattr(self.nv, fn)(h, buf, 96)
        return buf.value.decode(errors="replace") if rc == NVML_SUCCESS else ""

    def memory(self, h) -> tuple[int, _Memory]:
        m = _Memory()
        return self.nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), m

    def mig(self, h) -> tuple[bool, tuple[MigInfo, ...]]:
        """Whether a GPU's MIG mode is on, and its instances (NVML's MIG calls; read only)."""
        if not self.has("nvmlDeviceGetMigMode"):
            return False, ()
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        if self.nv.nvmlDeviceGetMigMode(h, ctypes.byref(current), ctypes.byref(pending)) != NVML_SUCCESS \
                or current.value != 1:
            return False, ()
        n = ctypes.c_uint(0)
        if self.nv.nvmlDeviceGetMaxMigDeviceCount(h, ctypes.byref(n)) != NVML_SUCCESS:
            return True, ()
        out = []
        for k in range(min(n.value, 8)):
            m = ctypes.c_void_p()
            if self.nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k, ctypes.byref(m)) != NVML_SUCCESS:
                continue  # NOT_FOUND: no instance at that index
            uuid, name = self.text("nvmlDeviceGetUUID", m), self.text("nvmlDeviceGetName", m)
            rc, mem = self.memory(m)
            if not uuid or rc != NVML_SUCCESS:
                continue
            gi, ci = ctypes.c_uint(0), ctypes.c_uint(0)
            ids = (self.nv.nvmlDeviceGetGpuInstanceId(m, ctypes.byref(gi)) == NVML_SUCCESS
                   and self.nv.nvmlDeviceGetComputeInstanceId(m, ctypes.byref(ci)) == NVML_SUCCESS)
            out.append(MigInfo(uuid, profile_of(name, mem.total >> 20), mem.total >> 20,
                               gi.value if ids else -1, ci.value if ids else -1))
        return True, tuple(out)

    def bus_id(self, h) -> str:
        if not self.has("nvmlDeviceGetPciInfo_v3"):
            return ""
        p = _PciInfo()
        if self.nv.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(p)) != NVML_SUCCESS:
            return ""
        return p.busId.decode(errors="replace")


def numa_of(bus_id: str, sysfs: Path = SYSFS_PCI) -> int:
    """The NUMA node of a PCI device (NVML's bus id "00000000:3B:00.0" -> sysfs "0000:3b:00.0"); 0 if unknown."""
    if not bus_id:
        return 0
    short = bus_id.lower()
    if len(short.split(":")[0]) == 8:
        short = short[4:]
    try:
        node = int((sysfs / short / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return 0
    return max(node, 0)


def inventory() -> list[GpuInfo]:
    """Every GPU NVML sees, in NVML order. Raises PyvgpuError when NVML is missing or a GPU cannot be read."""
    out = []
    with _Session() as s:
        for i in range(s.count()):
            rc, h = s.handle(i)
            if rc != NVML_SUCCESS:
                raise PyvgpuError(f"NVML cannot open GPU {i} (nvmlReturn_t {rc})")
            uuid = s.text("nvmlDeviceGetUUID", h)
            rc, m = s.memory(h)
            if rc != NVML_SUCCESS or not uuid:
                raise PyvgpuError(f"NVML cannot read GPU {i}'s UUID or memory (nvmlReturn_t {rc})")
            bus = s.bus_id(h)
            mig_mode, migs = s.mig(h)
            out.append(GpuInfo(i, uuid, s.text("nvmlDeviceGetName", h) or "NVIDIA GPU", m.total >> 20,
                               numa_of(bus), bus, mig_mode, migs))
    return out


def health(uuids: list[str]) -> dict[str, str | None]:
    """Per UUID: None when healthy, else why not. NVML itself failing makes every GPU unhealthy."""
    try:
        s = _Session()
    except PyvgpuError as e:
        return {u: str(e) for u in uuids}
    out: dict[str, str | None] = {}
    with s:
        for u in uuids:
            rc, h = s.by_uuid(u)
            if rc == NVML_ERROR_GPU_IS_LOST:
                out[u] = "NVML: the GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST)"
                continue
            if rc == NVML_ERROR_NOT_FOUND:
                out[u] = "NVML no longer finds the GPU"
                continue
            if rc != NVML_SUCCESS:
                out[u] = f"NVML cannot open the GPU (nvmlReturn_t {rc})"
                continue
            rc, _ = s.memory(h)
            if rc not in (NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED):
                out[u] = ("NVML: the GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST)"
                          if rc == NVML_ERROR_GPU_IS_LOST else f"NVML cannot read the GPU (nvmlReturn_t {rc})")
                continue
            out[u] = None
    return out


def pair_scores(gpus: list[GpuInfo]) -> tuple[dict[str, dict[str, int]], str | None]:
    """{uuid: {other_uuid: score}} and, when NVML cannot tell the topology, why (then every pair scores
    DEFAULT_PAIR_SCORE)."""
    if len(gpus) < 2:
        return {g.uuid: {} for g in gpus}, None
    with _Session() as s:
        if not s.has("nvmlDeviceGetTopologyCommonAncestor"):
            note = (f"NVML has no nvmlDeviceGetTopologyCommonAncestor: the links between GPUs are unknown, every "
                    f"pair scores {DEFAULT_PAIR_SCORE}")
            return {a.uuid: {b.uuid: DEFAULT_PAIR_SCORE for b in gpus if b is not a} for a in gpus}, note
        handles = {}
        for g in gpus:
            rc, h = s.by_uuid(g.uuid)
            if rc != NVML_SUCCESS:
                raise PyvgpuError(f"NVML cannot open GPU {g.uuid} (nvmlReturn_t {rc})")
            handles[g.uuid] = h
        links = {g.uuid: _nvlink_peers(s, handles[g.uuid]) for g in gpus}
        out: dict[str, dict[str, int]] = {}
        for a in gpus:
            row = {}
            for b in gpus:
                if b is a:
                    continue
                level = ctypes.c_int(-1)
                rc = s.nv.nvmlDeviceGetTopologyCommonAncestor(handles[a.uuid], handles[b.uuid], ctypes.byref(level))
                score = TOPOLOGY_SCORES.get(level.value, 0) if rc == NVML_SUCCESS else 0
                score += NVLINK_SCORE * sum(1 for peer in links[a.uuid] if peer and peer == b.bus_id.lower())
                row[b.uuid] = score
            out[a.uuid] = row
    return out, None


def _nvlink_peers(s: _Session, h) -> list[str]:
    """The PCI bus id at the far end of each active NVLink of a GPU (lower case)."""
    if not (s.has("nvmlDeviceGetNvLinkState") and s.has("nvmlDeviceGetNvLinkRemotePciInfo_v2")):
        return []
    out = []
    for link in range(NVLINK_MAX_LINKS):
        active = ctypes.c_int(0)
        if s.nv.nvmlDeviceGetNvLinkState(h, link, ctypes.byref(active)) != NVML_SUCCESS or not active.value:
            continue
        p = _PciInfo()
        if s.nv.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link, ctypes.byref(p)) == NVML_SUCCESS:
            out.append(p.busId.decode(errors="replace").lower())
    return out
