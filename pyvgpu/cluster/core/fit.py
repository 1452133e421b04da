"""Device fit (docs/cluster.md, "Fit"; HAMi pkg/device/nvidia/device.go Fit): can this GPU take one more container?

Checks, in HAMi's order: the GPU is healthy, not cordoned, of an allowed type and mode, an allowed UUID;
it has a free slot, the memory and the cores; a request of 100 cores finds it empty; it is not already
at 100% cores; a MIG GPU has a free instance of a geometry that holds the memory (or, registered with HAMi
v2.10's migProfiles, an offered profile that holds it with a free placement). The first check that
fails is the reason, and the reason says which limit, with the numbers.
"""

from __future__ import annotations

import functools

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.model import ContainerRequest, DeviceUsage, MigProfile, MigTemplate, PodRequest, Slice


def has_filters(req: PodRequest) -> bool:
    return bool(req.use_types or req.nouse_types or req.use_uuids or req.nouse_uuids or req.modes)


def static_reason(dev: DeviceUsage, req: PodRequest) -> str | None:
    """Why `dev` can never serve this pod, whatever is in use; None when it may."""
    if dev.problem:
        return dev.problem
    if not dev.health:
        return "unhealthy"
    if dev.cordoned:
        return f"cordoned ({keys.NODE_DEVICE_CORDON})"
    if req.use_types or req.nouse_types:
        # Types match as case-insensitive substrings of the model (HAMi pkg/device/devices.go CheckType).
        t = dev.type.upper()
        if req.use_types and not any(u.upper() in t for u in req.use_types):
            return f"type {dev.type!r} is not in {keys.USE_TYPE} {','.join(req.use_types)!r}"
        if req.nouse_types and any(u.upper() in t for u in req.nouse_types):
            return f"type {dev.type!r} is excluded by {keys.NOUSE_TYPE} {','.join(req.nouse_types)!r}"
    if req.modes and dev.mode not in req.modes:
        return f"mode {dev.mode} is not in {keys.VGPU_MODE} {','.join(req.modes)!r}"
    # UUIDs match exactly (CheckUUID).
    if req.use_uuids and dev.id not in req.use_uuids:
        return f"not in {keys.USE_UUID}"
    if req.nouse_uuids and dev.id in req.nouse_uuids:
        return f"excluded by {keys.NOUSE_UUID}"
    return None


def mig_pick(dev: DeviceUsage, mem: int) -> tuple[int, int, MigTemplate] | None:
    """The MIG instance a container of `mem` MiB gets: (geometry, position, template), or None.

    A GPU with no instance in use takes the first geometry (in table order) that has a template of at
    least `mem` MiB, as HAMi does; one in use keeps its geometry. Within it, the smallest free instance
    that holds `mem` wins, ties by position (HAMi takes the first free one in table order).
    """
    candidates = range(len(dev.geometries)) if dev.mig_geometry is None else (dev.mig_geometry,)
    for g in candidates:
        geometry = dev.geometries[g]
        if dev.mig_geometry is None and not any(t.memory >= mem for t in geometry):
            continue
        best = None
        pos = 0
        for t in geometry:
            for _ in range(t.count):
                if pos not in dev.mig_used and t.memory >= mem and (best is None or t.memory < best[2].memory):
                    best = (g, pos, t)
                pos += 1
        return best
    return None


def _prefers_high(profile: str) -> bool:
    # HAMi packs 1g and 3g instances from the top of the GPU, the others from the bottom, which keeps room
    # for every profile longest (pkg/device/nvidia/mig_topology.go preferHighMigPlacement)
    return profile.startswith(("1g.", "3g."))


@functools.lru_cache(maxsize=1024)
def _offer_order(profiles: tuple[MigProfile, ...]) -> tuple[tuple[MigProfile, tuple[tuple[Slice, int], ...]], ...]:
    """The profiles in the order slice_pick tries them, each with its placements in order and their slot masks
    (a GPU's registration changes rarely: sorted once per profile table)."""
    def order(p: MigProfile) -> list[Slice]:
        return sorted(p.placements, key=lambda pl: -pl[0] if _prefers_high(p.name) else pl[0])

    return tuple((p, tuple((sl, _occupied((sl,))) for sl in order(p)))
                 for p in sorted(profiles, key=lambda p: (p.memory, p.slices)))


# Slots past this are never offered (a profile's placement ends by 2 * codec.MAX_MIG_SLICE): a reservation's
# slots are cut here, so a forged huge start or size costs no memory.
_SLOTS = 256


def _occupied(used: tuple[Slice, ...]) -> int:
    """The slots `used` covers, as a bit mask (a slice of size 0 covers none)."""
    occ = 0
    for s, z in used:
        lo, hi = min(s, _SLOTS), min(s + z, _SLOTS)
        if lo < hi:
            occ |= ((1 << (hi - lo)) - 1) << lo
    return occ


def mig_work(dev: DeviceUsage) -> int:
    """What one slice_pick or mig_room on `dev` costs at most: its placements (plan() bounds its search by this)."""
    return sum(len(p.placements) for p in dev.profiles) + 1


def slice_pick(dev: DeviceUsage, mem: int) -> tuple[MigProfile, Slice] | None:
    """The profile and placement a container of `mem` MiB gets on a GPU registered with migProfiles, or None.

    HAMi v2.10 (pkg/device/nvidia/device.go selectMigCandidate, mig_topology.go selectMigPlacement): the
    offered profiles from the smallest memory (then the fewest slices) up, the first that holds `mem` and has
    a placement overlapping none reserved; its placements from the highest start for 1g and 3g profiles,
    from the lowest for the others.
    """
    occ = _occupied(dev.slices_used)
    for p, places in _offer_order(dev.profiles):
        if p.memory < mem:
            continue
        for sl, m in places:
            if not occ & m:
                return p, sl
    return None


def mig_free(dev: DeviceUsage, mem: int) -> bool:
    """Whether the MIG GPU `dev` has an instance for `mem` MiB free (dynamic profiles or templates)."""
    return (slice_pick(dev, mem) if dev.profiles else mig_pick(dev, mem)) is not None


def mig_room(dev: DeviceUsage, mem: int, limit: int) -> int:
    """How many instances of `mem` MiB one container can take of the GPU `dev`, registered with migProfiles,
    one after another, up to `limit`. HAMi's Fit walks a MIG GPU again after taking an instance of it, so one
    container may take several instances of one MIG GPU (pkg/device/nvidia/device.go Fit;
    pkg/scheduler/score.go isMIGRequest lifts the one-GPU-each count for it).

    The count of slice_pick called again and again, in one pass: each pick is the first free placement in
    slice_pick's order, and a placement taken or overlapped stays so, so the next pick lies further on."""
    occ = _occupied(dev.slices_used)
    n = 0
    for p, places in _offer_order(dev.profiles):
        if p.memory < mem:
            continue
        for _, m in places:
            if n >= limit:
                return n
            if not occ & m:
                occ |= m
                n += 1
    return n


def mig_bound(dev: DeviceUsage, mem: int) -> int:
    """The most instances of `mem` MiB or more that can lie side by side on `dev` in its free slices, however
    they are picked (the most disjoint placements: by earliest end): a bound no sequence of picks passes."""
    occ = _occupied(dev.slices_used)
    places = sorted((s + z, s, m) for p, pl in _offer_order(dev.profiles) if p.memory >= mem
                    for (s, z), m in pl if not occ & m)
    n, end = 0, -1
    for e, s, _ in places:
        if s >= end:
            n, end = n + 1, e
    return n


def usage_reason(dev: DeviceUsage, ctr: ContainerRequest, mem: int, mutex: bool = False) -> str | None:
    """Why `dev`, as used now, cannot take one more GPU of `ctr` (which takes `mem` MiB on it); None if it can.
    `mutex`: the pod's GPU policy names mutex, so a GPU anything uses is refused."""
    if dev.used >= dev.count:
        return f"no free slot ({dev.used}/{dev.count} used)"
    if mutex and dev.used > 0:
        return f"{keys.GPU_POLICY} mutex takes only unused GPUs; {dev.used} container(s) use it"
    if dev.totalmem - dev.usedmem < mem:
        return f"memory: {dev.totalmem - dev.usedmem} MiB free of {dev.totalmem}, needs {mem}"
    cores = ctr.coresreq
    if dev.totalcore - dev.usedcores < cores:
        return f"cores: {dev.totalcore - dev.usedcores}% free, needs {cores}%"
    # 100 cores asks for the GPU alone (HAMi: only where the GPU has 100 cores in all).
    if dev.totalcore == 100 and cores == 100 and dev.used > 0:
        return f"asks the whole GPU (100 cores), but {dev.used} container(s) use it"
    # A GPU whose cores are all taken takes nothing more, not even a container that asks no cores.
    if dev.totalcore and dev.usedcores >= dev.totalcore and cores == 0:
        return f"all {dev.totalcore}% cores in use"
    if dev.mode == keys.MIG and dev.profiles and slice_pick(dev, mem) is None:
        offered = ", ".join(f"{p.name} ({p.memory} MiB)" for p in dev.profiles)
        return (f"MIG: no offered profile of {mem} MiB or more has a free placement (offered: {offered}; "
                f"{len(dev.slices_used)} placement(s) reserved)")
    if dev.mode == keys.MIG and not dev.profiles and mig_pick(dev, mem) is None:
        in_use = "no geometry" if dev.mig_geometry is None else f"geometry {dev.mig_geometry}"
        return f"MIG: no free instance of {mem} MiB or more ({in_use}, {len(dev.mig_used)} instance(s) in use)"
    return None


def fits(dev: DeviceUsage, ctr: ContainerRequest, mem: int, mutex: bool = False) -> bool:
    """usage_reason(...) is None, without building the reason: the hot loop of a decision."""
    if dev.used >= dev.count or (mutex and dev.used > 0) or dev.totalmem - dev.usedmem < mem:
        return False
    cores = ctr.coresreq
    total = dev.totalcore
    if total - dev.usedcores < cores:
        return False
    if cores == 100 and total == 100 and dev.used > 0:
        return False
    if cores == 0 and total and dev.usedcores >= total:
        return False
    return dev.mode != keys.MIG or mig_free(dev, mem)


def refusal_kind(dev: DeviceUsage, ctr: ContainerRequest, mem: int, req: PodRequest, filtered: bool) -> str | None:
    """The word for why `dev` refuses one GPU of `ctr` (the first failing check of static_reason, then
    usage_reason, in their order), None when it takes it: what a brief reason counts."""
    if dev.problem:
        return "inconsistent"
    if not dev.health:
        return "unhealthy"
    if dev.cordoned:
        return "cordoned"
    if filtered and static_reason(dev, req) is not None:
        return "excluded by annotation"
    cores = ctr.coresreq
    total = dev.totalcore
    if dev.used >= dev.count:
        return "slots"
    if req.mutex and dev.used > 0:
        return "mutex"
    if dev.totalmem - dev.usedmem < mem:
        return "memory"
    if total - dev.usedcores < cores:
        return "cores"
    if total == 100 and cores == 100 and dev.used > 0:
        return "in use (asks the whole GPU)"
    if total and dev.usedcores >= total and cores == 0:
        return "all cores in use"
    if dev.mode == keys.MIG and not mig_free(dev, mem):
        return "MIG instance"
    return None
