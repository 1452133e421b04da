"""`pyvgpu limits set`: change a running group's limits in its region.

Members read the limits from the region at every allocation and launch, so
a change takes effect at their next call; nothing is restarted. A memory cap
lowered below what the group holds refuses new allocations until enough is
freed, and never takes memory away. Every change goes to the group's event log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.group import region
from pyvgpu.host import devices
from pyvgpu.native import groupfiles


@dataclass
class Change:
    """What a `limits set` did, for the command's report."""

    memory: list[int] | None = None  # new caps per device, when changed
    sm: list[int] | None = None  # new shares per device, when changed
    over: list[tuple[int, int, int]] | None = None  # (device, used, cap) now over the cap
    n_devices: int = L.MAX_DEVICES  # the group's devices, as far as NVML tells
    priority: int | None = None  # the new priority, when changed
    sm_borrow: bool | None = None  # the new borrowing, when changed

    def text(self) -> list[str]:
        """The report of `pyvgpu limits set`."""
        out = []
        for what, values, fmt in (("memory cap", self.memory, lim.human), ("compute share", self.sm,
                                                                             lambda v: f"{v}%")):
            if values is None:
                continue
            mine = values[: self.n_devices]
            if len(set(mine)) == 1:
                out.append(f"{what}: {fmt(mine[0]) if mine[0] else 'none'}")
            else:
                out.append(f"{what}: " + ", ".join(f"{d}={fmt(v) if v else 'none'}" for d, v in enumerate(mine)))
        if self.priority is not None:
            out.append(f"priority: {lim.PRIORITIES[self.priority]}")
        if self.sm_borrow is not None:
            out.append("borrowing idle GPU time: " + ("on (work-conserving)" if self.sm_borrow else "off (a hard cap)"))
        for d, used, cap in self.over or []:
            out.append(f"device {d}: the group holds {lim.human(used)}, above the new {lim.human(cap)}: new "
                       f"allocations are refused until it frees {lim.human(used - cap)}")
        return out


def _values(spec: lim.DeviceValues) -> dict[int | None, int]:
    """{device or None (every device): value}, 0 meaning no limit."""
    return ({None: spec.default} if spec.default is not None else {}) | dict(spec.per_device)


def parse_memory(text: str) -> lim.MemoryLimits:
    """--memory for a live change: as wrap's, and none (off, 0) removes the cap."""
    return lim.parse_memory_option(text, none=True)


def parse_sm(text: str) -> lim.SmLimits:
    return lim.parse_sm_option(text, none=True)


def _physical(r: region.Region) -> list[devices.Gpu] | None:
    """The machine's device behind each group device, when NVML can tell."""
    inv = devices.inventory()
    if inv is None:
        return None
    gpus, migs = inv
    chosen = r.visible()
    if not chosen:
        return gpus
    by_uuid = {g.uuid: g for g in gpus + migs}  # a MIG instance by its own UUID: its memory, not its GPU's
    return [by_uuid[u] if u in by_uuid else gpus[i] for i, u in chosen if u in by_uuid or i < len(gpus)]


def set_limits(path: Path, memory: str | None, sm: str | None, priority: str | None = None,
               sm_borrow: str | None = None) -> Change:
    """Apply ``--memory``, ``--sm``, ``--priority`` and ``--sm-borrow`` to the group at ``path``; checks
    everything before changing anything.

    The region is opened once: checked, changed and read back through the same mapping.
    """
    if memory is None and sm is None and priority is None and sm_borrow is None:
        raise PyvgpuError("nothing to change: give --memory, --sm, --priority and/or --sm-borrow")
    mem = parse_memory(memory) if memory is not None else None
    shares = parse_sm(sm) if sm is not None else None
    prio = lim.parse_priority(priority, "--priority") if priority is not None else None
    borrow = lim.parse_switch(sm_borrow, "--sm-borrow") if sm_borrow is not None else None
    r = region.open_region(path)
    try:
        gpus = _physical(r)
        n = len(gpus) if gpus is not None else L.MAX_DEVICES
        # the group core refuses a share for an MPS group, a device the group lacks, a cap above its memory
        if shares is not None:
            groupfiles.check_change(r.path, r.address, True, (shares.default, shares.per_device), n, None, f"--sm {sm}")
        if mem is not None:
            groupfiles.check_change(r.path, r.address, False, (mem.default, mem.per_device), n,
                                  [g.total for g in gpus] if gpus is not None else None, f"--memory {memory}")
        if shares is not None:
            limited = sorted({d for d, v in _values(shares).items() if v and v < 100 and d is not None}
                             | (set(range(n)) if shares.default and shares.default < 100 else set()))
            if limited:
                phys = [gpus[d].index for d in limited] if gpus is not None else limited
                problem = devices.utilization_problem(phys)
                if problem:
                    raise PyvgpuError(f"--sm {sm}: {problem}, so a compute share cannot be enforced")
        out = Change(n_devices=n)
        if mem is not None:
            for d, v in _values(mem).items():
                out.memory = region.change_per_device(r, "limit", v, d)
            out.over = [(d, r.device(d).used, cap) for d, cap in enumerate(out.memory[:n])
                        if cap and r.device(d).used > cap]
        if shares is not None:
            for d, v in _values(shares).items():
                out.sm = region.change_per_device(r, "sm_limit", v, d)
        if prio is not None:
            out.priority = region.change_setting(r, "priority", prio)
        if borrow is not None:
            out.sm_borrow = bool(region.change_setting(r, "sm_borrow", int(borrow)))
        return out
    finally:
        r.close()
