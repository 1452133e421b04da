"""The data model of the scheduling core: plain dataclasses, no behaviour beyond small helpers.

Names follow HAMi's (pkg/device/devices.go: DeviceInfo, DeviceUsage, ContainerDeviceRequest,
ContainerDevice) so that the Go reference and this code read alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

from pyvgpu.cluster.core import keys


@dataclass(frozen=True)
class MigTemplate:
    """One MIG instance size of a geometry (docs/cluster.md, "Modes"): `count` instances of `memory` MiB, `core` %."""

    name: str
    core: int
    memory: int
    count: int


Geometry = tuple[MigTemplate, ...]
Slice = tuple[int, int]  # a MIG placement on a GPU: (start, size) in its memory slices


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile a GPU offers (HAMi v2.10 `migProfiles`, pkg/device/devices.go MigProfile): its size and
    every placement NVML says an instance of it may take on the GPU."""

    name: str
    memory: int  # MiB ("memoryMB")
    core: int  # percent of the GPU's compute
    slices: int  # "sliceCount"
    placements: tuple[Slice, ...] = ()


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as a node registers it in hami.io/node-nvidia-register."""

    id: str
    index: int
    count: int  # vGPU slots (deviceSplitCount)
    devmem: int  # MiB
    devcore: int  # percent, usually 100
    type: str  # the model, e.g. "NVIDIA A100-SXM4-80GB"
    numa: int
    mode: str  # hami-core | mig | mps
    health: bool
    mig_geometries: tuple[Geometry, ...] = ()  # only read for mode "mig"
    mig_profiles: tuple[MigProfile, ...] = ()  # HAMi v2.10 dynamic MIG: the profiles a mig GPU offers


@dataclass(slots=True)
class DeviceUsage:
    """A registered GPU and what the pods on it use. Mutable: decisions work on copies of it."""

    id: str
    index: int
    count: int
    totalmem: int
    totalcore: int
    type: str
    numa: int
    mode: str
    health: bool
    geometries: tuple[Geometry, ...] = ()
    used: int = 0  # slots taken
    usedmem: int = 0
    usedcores: int = 0
    mig_geometry: int | None = None  # the geometry the GPU is split by, while an instance is in use
    mig_used: frozenset[int] = frozenset()  # positions of instances in use (in the flattened geometry)
    cordoned: bool = False
    problem: str | None = None  # set when the pods on it contradict its registration: takes nothing new
    # HAMi v2.10 dynamic MIG (a mig GPU registered with migProfiles; then `geometries` is not read): the
    # profiles it offers and the placements reserved on it (hami.io/vgpu-mig-allocations), one per instance
    profiles: tuple[MigProfile, ...] = ()
    slices_used: tuple[Slice, ...] = ()

    @classmethod
    def of(cls, d: DeviceInfo) -> DeviceUsage:
        return cls(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.mode or keys.HAMI_CORE,
                   d.health, d.mig_geometries, profiles=d.mig_profiles)

    def copy(self) -> DeviceUsage:
        return DeviceUsage(self.id, self.index, self.count, self.totalmem, self.totalcore, self.type, self.numa,
                           self.mode, self.health, self.geometries, self.used, self.usedmem, self.usedcores,
                           self.mig_geometry, self.mig_used, self.cordoned, self.problem, self.profiles,
                           self.slices_used)


@dataclass
class NodeInfo:
    """A node: its GPUs with usage, the pair scores between them, or why it cannot be used at all."""

    name: str
    devices: list[DeviceUsage] = field(default_factory=list)
    pair_scores: dict[str, dict[str, int]] = field(default_factory=dict)
    error: str | None = None  # a broken registration: the node fits nothing, with this reason
    warnings: list[str] = field(default_factory=list)  # pods whose allocation could not be read (skipped)
    # The node score of the current usage, computed once: usage.add_pod clears it, and so must any other
    # code that changes the devices' usage.
    score_cache: float | None = field(default=None, repr=False, compare=False)
    # A filter's verdicts on this usage per request shape (decide.decide_on): True, or the brief reason.
    # Cleared with score_cache; bounded there.
    fit_cache: dict | None = field(default=None, repr=False, compare=False)
    # The NodeResults those verdicts stand for, one per distinct verdict (True or a reason): shared by every
    # filter, so a remembered verdict costs a lookup, not an object. Cleared with score_cache.
    results: dict | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class ContainerRequest:
    """What one container asks of GPUs (HAMi: ContainerDeviceRequest)."""

    name: str
    nums: int  # GPUs
    memreq: int  # MiB per GPU; 0 = not asked, then mem_percentage applies
    mem_percentage: int  # percent of each GPU's memory, used when memreq is 0
    coresreq: int  # percent of each GPU's compute; 100 = the GPU alone
    init: bool = False  # an init container: runs alone, before the app containers

    def memory_on(self, totalmem: int) -> int:
        """MiB this container takes on a GPU of `totalmem` MiB (HAMi: percentage only when no MiB were asked)."""
        return self.memreq if self.memreq > 0 else totalmem * self.mem_percentage // 100


@dataclass(frozen=True)
class PodRequest:
    """A pod's GPU request and the annotations that steer where it may go."""

    namespace: str
    name: str
    # Every container, init containers first: the order of the allocation annotation's entries.
    containers: tuple[ContainerRequest, ...]
    node_policy: str = keys.BINPACK
    gpu_policy: str = keys.SPREAD
    topology: bool = False
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()  # empty: any mode
    numa_bind: bool = False
    uid: str = ""
    # HAMi's GPU sort when the policy is a comma list (or bare "numa"): the sort keys in the order written
    # (binpack, spread, numa). Empty: the single-value sort of gpu_policy (policy.order_devices).
    gpu_chain: tuple[str, ...] = ()
    mutex: bool = False  # the "mutex" GPU policy word: only GPUs nothing uses
    weights: tuple[int, int, int] = (1, 1, 1)  # slot, core, memory weights of the device score
    # What was read leniently, as HAMi reads it (a value clamped, a word read as false): said, not refused.
    warnings: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def wants_gpus(self) -> bool:
        return any(c.nums > 0 for c in self.containers)


@dataclass(frozen=True)
class MigSlice:
    """The MIG instance a dynamic-MIG entry stands for: one entry of hami.io/vgpu-mig-allocations."""

    profile: str
    start: int
    size: int


@dataclass(frozen=True)
class ContainerDevice:
    """One entry of the allocation encoding: `UUID,Type,UsedMem,UsedCores` (MIG: UUID[geometry-instance]).
    `mig`: on a dynamic-MIG GPU, its reserved instance, which the encoding does not carry (it goes into
    hami.io/vgpu-mig-allocations)."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int
    mig: MigSlice | None = None


PodDevices = tuple[tuple[ContainerDevice, ...], ...]


@dataclass(frozen=True)
class Placement:
    """One GPU given to one container by a decision, with what the encoding does not carry."""

    uuid: str  # the GPU's id (without a MIG suffix)
    index: int
    usedmem: int
    usedcores: int
    mode: str
    mig_template: str | None = None
    mig_geometry: int | None = None
    mig_instance: int | None = None
    mig_slice: Slice | None = None  # dynamic MIG: the placement (start, size) of profile mig_template

    def entry(self) -> ContainerDevice:
        if self.mig_slice is not None:
            return ContainerDevice(self.uuid, keys.DEVICE_TYPE, self.usedmem, self.usedcores,
                                   MigSlice(self.mig_template or "", *self.mig_slice))
        uuid = self.uuid if self.mig_instance is None else f"{self.uuid}[{self.mig_geometry}-{self.mig_instance}]"
        return ContainerDevice(uuid, keys.DEVICE_TYPE, self.usedmem, self.usedcores)


@dataclass(slots=True)
class NodeResult:
    """One node's verdict: whether the pod fits, its node score, and why not."""

    name: str
    fits: bool
    score: float | None
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    """Where a pod goes: the node, the GPUs per container, the annotations to write, and every node's verdict."""

    pod: str
    node: str | None
    placements: tuple[tuple[Placement, ...], ...]
    annotations: dict[str, str]
    nodes: tuple[NodeResult, ...]
    request: PodRequest
    node_policy: str
    gpu_policy: str
    warnings: tuple[str, ...] = ()  # what was read leniently or skipped (explain prints them; events carry them)

    @property
    def devices(self) -> PodDevices:
        return tuple(tuple(p.entry() for p in ctr) for ctr in self.placements)

    @property
    def init_containers(self) -> int:
        """How many of the entries are init containers (usage.add_pod needs it to charge the pod)."""
        return sum(1 for c in self.request.containers if c.init)

    @property
    def feasible(self) -> list[str]:
        """Every node the pod fits on, best first (the extender returns all of them: HAMi#2264)."""
        nodes = self.nodes
        return list(map(_NAME, compress(nodes, map(_FITS, nodes))))  # C-speed passes over thousands of nodes


_NAME = attrgetter("name")
_FITS = attrgetter("fits")
