"""GroupSpec: what a group region is made with, or checked against when it exists, as one record.

A region is created from a GroupSpec (pyvgpu.group.region.create) and a process joins one with its GroupSpec
(region.create_or_open): its caps, shares, devices and settings, each with where it came from (an option or
a variable: the error of a mismatch names it). `pyvgpu wrap` makes one from its request and the environment
(pyvgpu.ops.wrap.group_spec), the node agent from a pod's allocation. Each field is checked here, once,
when the record is made.
"""

from __future__ import annotations

from pyvgpu.contract import envspec
from pyvgpu.contract import layout as L
from pyvgpu.contract.record import field, record  # not dataclasses: a plain wrap imports this
from pyvgpu.errors import PyvgpuError
from pyvgpu.group.limits import DeviceValues, MemoryLimits, SmLimits

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module
if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyvgpu.host.devices import Gpu


def _per_device(values: DeviceValues | Sequence[int] | None, kind: type[DeviceValues], what: str,
                source: str) -> DeviceValues:
    """``values`` as ``kind``: a list (one entry per device slot, 0 = none, as a region stores them) is read
    as those devices' values; each device below L.MAX_DEVICES and each value at least 0."""
    if values is None:
        return kind()
    if not isinstance(values, DeviceValues):
        values = list(values)
        if len(values) > L.MAX_DEVICES:
            raise PyvgpuError(f"{source}: {len(values)} devices' {what} given, a group has at most {L.MAX_DEVICES}")
        values = kind(per_device={d: int(v) for d, v in enumerate(values) if v})
    for d, v in values.per_device.items():
        if not 0 <= d < L.MAX_DEVICES:
            raise PyvgpuError(f"{source}: there is no device {d} in a group (devices 0-{L.MAX_DEVICES - 1})")
        if v < 0:
            raise PyvgpuError(f"{source}: a {what} of {v} on device {d} is negative; give 0 or more")
    if values.default is not None and values.default < 0:
        raise PyvgpuError(f"{source}: a {what} of {values.default} is negative; give 0 or more")
    return values


@record(frozen=True)
class GroupSpec:
    """A group's caps (``limits``, bytes), compute shares (``sm``, percent), devices (``visible``: the
    group's device d is visible[d]; empty: as CUDA sees them), ``priority`` (L.PRIORITY_HIGH or
    PRIORITY_LOW) and ``sm_borrow``; each ``*_source`` names the option or variable it came from. A priority
    or sm_borrow of None is not asked: a new region gets the default (low, no borrowing) and an existing one
    keeps its own. ``n_physical``: how many devices the machine has (0: not known).

    ``limits`` and ``sm`` may be given as a region stores them, one entry per device slot (0 = none)."""

    name: str
    limits: MemoryLimits = field(default_factory=MemoryLimits)
    sm: SmLimits = field(default_factory=SmLimits)
    visible: tuple[Gpu, ...] = ()
    priority: int | None = None
    sm_borrow: bool | None = None
    n_physical: int = 0
    limits_source: str = envspec.CUDA_DEVICE_MEMORY_LIMIT.name
    sm_source: str = envspec.CUDA_DEVICE_SM_LIMIT.name
    devices_source: str = "--devices"
    priority_source: str = envspec.CUDA_TASK_PRIORITY.name
    borrow_source: str = envspec.SM_BORROW.name

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked values replace what was given, once, here
        if not isinstance(self.name, str):
            raise PyvgpuError(f"a group's name is text, not {self.name!r}")
        set_(self, "limits", _per_device(self.limits, MemoryLimits, "memory cap", self.limits_source))
        set_(self, "sm", _per_device(self.sm, SmLimits, "compute share", self.sm_source))
        over = [(d, v) for d, v in self.sm.per_device.items() if v > 100]
        if self.sm.default is not None and self.sm.default > 100:
            over.insert(0, (None, self.sm.default))
        if over:
            d, v = over[0]
            where = "" if d is None else f" on device {d}"
            raise PyvgpuError(f"{self.sm_source}: a compute share of {v}%{where} is over 100%; give a percent from "
                              f"1 to 100")
        set_(self, "visible", tuple(self.visible or ()))
        if len(self.visible) > L.MAX_DEVICES:
            raise PyvgpuError(f"{self.devices_source}: {len(self.visible)} devices given, a group has at most "
                              f"{L.MAX_DEVICES}")
        if self.priority not in (None, L.PRIORITY_HIGH, L.PRIORITY_LOW):
            raise PyvgpuError(f"{self.priority_source}: priority {self.priority!r} is not {L.PRIORITY_HIGH} (high) "
                              f"or {L.PRIORITY_LOW} (low)")
        if self.sm_borrow is not None:
            set_(self, "sm_borrow", bool(self.sm_borrow))
        if not isinstance(self.n_physical, int) or self.n_physical < 0:
            raise PyvgpuError(f"n_physical {self.n_physical!r} is not a count of devices; give 0 (not known) or more")
