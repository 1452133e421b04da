"""Placing a whole pod on one node: which GPUs each container gets, or why it cannot go there.

Containers are placed in order and what one takes counts for the next (usage accumulates within a
pod). Init containers run alone before the app containers, so each is placed on the node as it is now.
Each container takes its GPU policy's first choice; only when a later container then finds no room
does the search go back and try the earlier containers' next choices (HAMi stops there and refuses
the node). So a pod is placed on a node whenever any placement exists, up to `search_budget` tries.

A MIG GPU registered with migProfiles (HAMi v2.10) may give one container several of its instances (HAMi's
Fit walks a MIG GPU again after taking one): it is offered as often as it has instances for the container,
one after another, in its place in the policy's order. One registered with templates gives a container one
instance: pyvgpu's device plugin serves those nodes, and a CUDA process sees a single MIG instance.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.fit import (
    fits,
    has_filters,
    mig_bound,
    mig_free,
    mig_pick,
    mig_room,
    mig_work,
    refusal_kind,
    slice_pick,
    static_reason,
    usage_reason,
)
from pyvgpu.cluster.core.model import ContainerRequest, DeviceUsage, NodeInfo, Placement, PodDevices, PodRequest
from pyvgpu.cluster.core.policy import multisets, numa_groups, order_devices, sets
from pyvgpu.cluster.core.quota import QuotaView, use_of_placements
from pyvgpu.cluster.core.score import device_score

Candidate = tuple[float, DeviceUsage, int]  # (device score, GPU, MiB this container takes on it)


@dataclass(frozen=True)
class NodePlan:
    """The GPUs per container (init containers first) when the pod fits, else the reason."""

    fits: bool
    placements: tuple[tuple[Placement, ...], ...] = ()
    reason: str = ""


class _Exhausted(Exception):
    pass


# plan()'s bound on the dynamic-MIG work of one pod on one node, in placements examined (fit.mig_work): an
# option there costs a slice_pick per instance taken and a mig_room per GPU for the next container, so
# search_budget's count of options alone lets a pod creator buy seconds per node.
MIG_SEARCH_WORK = 200_000


def _room_bound(devs: list[DeviceUsage], statics: list[str | None], ctrs: list[ContainerRequest]) -> int:
    """At most how many GPUs the node's GPUs can give `ctrs` together: a dynamic-MIG GPU as many instances as
    fit side by side in its free slices, any other GPU one per container and free slot. Cheap and never too
    low, so a pod asking more is refused without a search."""
    total = 0
    for d, s in zip(devs, statics, strict=True):
        if s is not None:
            continue
        if d.profiles:
            total += mig_bound(d, min(c.memory_on(d.totalmem) for c in ctrs))
        else:
            total += min(len(ctrs), max(0, d.count - d.used))
    return total


def _candidates(devs: list[DeviceUsage], statics: list[str | None], ctr: ContainerRequest,
                req: PodRequest) -> list[Candidate]:
    out = []
    for d, s in zip(devs, statics, strict=True):
        if s is None:
            mem = ctr.memory_on(d.totalmem)
            if fits(d, ctr, mem, req.mutex):
                out.append((device_score(d, mem, ctr.coresreq, weights=req.weights), d, mem))
    ordered = order_devices(out, req)
    if ctr.nums < 2 or not any(c[1].profiles for c in ordered):
        return ordered
    expanded = []
    for c in ordered:
        expanded += [c] * (mig_room(c[1], c[2], ctr.nums) if c[1].profiles else 1)
    return expanded


def _options(cands: list[Candidate], ctr: ContainerRequest, req: PodRequest,
             node: NodeInfo) -> Iterator[tuple[Candidate, ...]]:
    groups = numa_groups(cands, lambda c: c[1].numa) if req.numa_bind else [cands]
    repeats = len({id(c[1]) for c in cands}) < len(cands)  # a MIG GPU offered once per instance
    for g in groups:
        if not repeats:
            yield from sets(g, ctr.nums, topology=req.topology, scores=node.pair_scores, uuid_of=lambda c: c[1].id)
            continue
        items: list[list] = []  # (candidate, copies): a MIG GPU's copies are adjacent
        for c in g:
            if items and items[-1][0] is c:
                items[-1][1] += 1
            else:
                items.append([c, 1])
        yield from multisets([(c, k) for c, k in items], ctr.nums, topology=req.topology, scores=node.pair_scores,
                             uuid_of=lambda c: c[1].id)


def _take(dev: DeviceUsage, ctr: ContainerRequest, mem: int) -> Placement:
    """Charge one GPU of `ctr` to `dev`. A MIG GPU is charged its instance's template, not the request."""
    dev.used += 1
    if dev.mode == keys.MIG and dev.profiles:
        p, sl = slice_pick(dev, mem)  # fits() (or mig_room, for a further instance) checked that there is one
        dev.usedmem += p.memory
        dev.usedcores += p.core
        dev.slices_used = dev.slices_used + (sl,)
        return Placement(dev.id, dev.index, p.memory, p.core, dev.mode, p.name, mig_slice=sl)
    if dev.mode == keys.MIG:
        g, pos, t = mig_pick(dev, mem)  # fits() checked that there is one
        dev.usedmem += t.memory
        dev.usedcores += t.core
        dev.mig_geometry = g
        dev.mig_used = dev.mig_used | {pos}
        return Placement(dev.id, dev.index, t.memory, t.core, dev.mode, t.name, g, pos)
    dev.usedmem += mem
    dev.usedcores += ctr.coresreq
    return Placement(dev.id, dev.index, mem, ctr.coresreq, dev.mode)


def _state(devs: list[DeviceUsage]) -> tuple:
    return tuple((d.used, d.usedmem, d.usedcores, d.mig_geometry, d.mig_used, d.slices_used) for d in devs)


def _canonical(state: tuple) -> tuple:
    """A usage state without the order instances were taken in (what the search can still reach depends only on
    which slices are reserved), so the same instances reached in another order are a known dead end too."""
    return tuple((u, m, c, g, migs, tuple(sorted(sl))) for u, m, c, g, migs, sl in state)


def _restore(devs: list[DeviceUsage], state: tuple) -> None:
    for d, (used, mem, cores, g, migs, slices) in zip(devs, state, strict=True):
        d.used, d.usedmem, d.usedcores, d.mig_geometry, d.mig_used, d.slices_used = used, mem, cores, g, migs, slices


def plan(node: NodeInfo, req: PodRequest, cfg: ClusterConfig | None = None,
         quota: QuotaView | None = None) -> NodePlan:
    """Place every container of `req` on `node` (which is not changed), or say why not.

    With `quota` (the pod's namespace's), a choice of GPUs is taken only while the pod's GPUs so far stay
    within it, as HAMi's Fit checks the quota on each candidate GPU (fitQuota) and goes on to the next: a pod
    asking a share of memory may then get a smaller GPU that keeps it within the quota."""
    cfg = cfg or ClusterConfig()
    if node.error:
        return NodePlan(False, reason=node.error)
    devs = [d.copy() for d in node.devices]
    statics = [static_reason(d, req) for d in devs]
    out: list[tuple[Placement, ...]] = [() for _ in req.containers]
    n_init = sum(1 for c in req.containers if c.init)

    def within() -> bool:  # the pod's use only grows as containers are added, so a partial plan over it is pruned
        return quota is None or quota.reason(use_of_placements(tuple(out), n_init)) is None

    base = _state(devs)
    for i, ctr in enumerate(req.containers):
        if ctr.init and ctr.nums > 0:
            for option in _options(_candidates(devs, statics, ctr, req), ctr, req, node):
                out[i] = tuple(_take(d, ctr, mem) for _, d, mem in option)
                _restore(devs, base)
                if within():
                    break
                out[i] = ()
            else:
                return NodePlan(False, reason=why_not(node, req, cfg))
    apps = [i for i, c in enumerate(req.containers) if not c.init and c.nums > 0]
    if len(apps) > 1 and sum(req.containers[i].nums for i in apps) > _room_bound(
            devs, statics, [req.containers[i] for i in apps]):
        return NodePlan(False, reason=why_not(node, req, cfg))
    tries = 0
    work = 0  # dynamic-MIG placements examined (MIG_SEARCH_WORK)
    cost = {id(d): mig_work(d) for d in devs if d.profiles}
    candidates_cost = 2 * sum(cost.values())  # fits() and mig_room on each dynamic-MIG GPU
    failed: set = set()  # (depth, usage) states known to lead nowhere

    def place(k: int) -> bool:
        nonlocal tries, work
        if k == len(apps):
            return True
        ctr = req.containers[apps[k]]
        state = _state(devs)
        key = (k, _canonical(state))
        if key in failed:
            return False
        work += candidates_cost
        for option in _options(_candidates(devs, statics, ctr, req), ctr, req, node):
            tries += 1
            work += sum(cost.get(id(d), 0) for _, d, _ in option)
            if tries > cfg.search_budget or work > MIG_SEARCH_WORK:
                raise _Exhausted
            out[apps[k]] = tuple(_take(d, ctr, mem) for _, d, mem in option)
            if within() and place(k + 1):
                return True
            _restore(devs, state)
        out[apps[k]] = ()
        failed.add(key)
        return False

    try:
        ok = place(0)
    except _Exhausted:
        if tries > cfg.search_budget:
            return NodePlan(False, reason=f"gave up after {cfg.search_budget} placements of the pod's containers "
                                          "(search_budget): no placement found in them")
        return NodePlan(False, reason=f"gave up after {tries} placements of the pod's containers, which examined "
                                      f"{MIG_SEARCH_WORK} MIG placements in all: no placement found in them")
    if not ok:
        return NodePlan(False, reason=why_not(node, req, cfg))
    return NodePlan(True, tuple(out))


def feasible(node: NodeInfo, req: PodRequest, cfg: ClusterConfig | None = None) -> bool:
    """plan(node, req).fits, fast where it can be: when one container asks GPUs, it fits if enough GPUs can
    take one each (on one NUMA node with numa-bind); which of them it gets cannot matter then."""
    if node.error:
        return False
    gpu = [c for c in req.containers if c.nums > 0]
    if len(gpu) != 1:
        return plan(node, req, cfg).fits
    return count_fit(node.devices, gpu[0], req, has_filters(req))


def count_fit(devices: list[DeviceUsage], ctr: ContainerRequest, req: PodRequest, filtered: bool) -> bool:
    """Whether `ctr.nums` of `devices` pass every check of fit.py (the hot loop of a decision: the checks of
    fit.fits inlined, the same ones in the same order)."""
    n = ctr.nums
    memreq, pct, cores = ctr.memreq, ctr.mem_percentage, ctr.coresreq
    per_numa: dict[int, int] | None = {} if req.numa_bind else None
    k = 0
    for d in devices:
        if d.problem or not d.health or d.cordoned or (filtered and static_reason(d, req) is not None):
            continue
        total = d.totalcore
        mem = memreq if memreq > 0 else d.totalmem * pct // 100
        if (d.used >= d.count or (req.mutex and d.used > 0) or d.totalmem - d.usedmem < mem
                or total - d.usedcores < cores
                or (cores == 100 and total == 100 and d.used > 0) or (cores == 0 and total and d.usedcores >= total)
                or (d.mode == keys.MIG and not mig_free(d, mem))):
            continue
        room = mig_room(d, mem, n) if d.profiles and n > 1 else 1  # instances of one dynamic-MIG GPU
        if per_numa is not None:
            k = per_numa[d.numa] = per_numa.get(d.numa, 0) + room
        else:
            k += room
        if k >= n:
            return True
    return False


def _room(d: DeviceUsage, mem: int, nums: int) -> int:
    """How many of a container's GPUs `d` (which takes one) can give: a dynamic-MIG GPU one per free instance."""
    return mig_room(d, mem, nums) if d.profiles and nums > 1 else 1


def _memory(ctr: ContainerRequest) -> str:
    return f"{ctr.memreq} MiB" if ctr.memreq > 0 else f"{ctr.mem_percentage}% of the memory"


def container_reason(devs: list[DeviceUsage], statics: list[str | None], ctr: ContainerRequest,
                     req: PodRequest) -> str:
    """Which GPU refuses the container, and by which limit."""
    refusals = []
    numa: dict[int, int] = {}
    memreq, pct = ctr.memreq, ctr.mem_percentage
    for d, s in zip(devs, statics, strict=True):
        mem = memreq if memreq > 0 else d.totalmem * pct // 100
        r = s or usage_reason(d, ctr, mem, req.mutex)
        if r:
            refusals.append(f"GPU {d.index} {d.id}: {r}")
        else:
            numa[d.numa] = numa.get(d.numa, 0) + _room(d, mem, ctr.nums)
    n_fit = sum(numa.values())
    head = (f'container "{ctr.name}" asks {ctr.nums} GPU(s) with {_memory(ctr)} and {ctr.coresreq}% cores each; '
            f"{n_fit} of the node's {len(devs)} GPU(s) can take it, {ctr.nums} needed")
    if req.numa_bind and n_fit >= ctr.nums:
        head += (f", but {keys.NUMA_BIND} needs them on one NUMA node ("
                 + ", ".join(f"numa {k}: {v}" for k, v in sorted(numa.items())) + ")")
    return head + (": " + "; ".join(refusals) if refusals else "")


def why_not(node: NodeInfo, req: PodRequest, cfg: ClusterConfig | None = None) -> str:
    """Why the pod does not fit `node`: the first container that finds no room when each takes its first
    choice, with every GPU's refusal."""
    if node.error:
        return node.error
    gpu = [c for c in req.containers if c.nums > 0]
    if len(gpu) == 1:  # nothing accumulates: the GPUs as they are now are the answer
        return container_reason(node.devices, [static_reason(d, req) for d in node.devices], gpu[0], req)
    devs = [d.copy() for d in node.devices]
    statics = [static_reason(d, req) for d in devs]
    base = _state(devs)
    for ctr in (c for c in req.containers if c.init and c.nums > 0):
        if next(_options(_candidates(devs, statics, ctr, req), ctr, req, node), None) is None:
            return container_reason(devs, statics, ctr, req)
    placed = []
    for ctr in (c for c in req.containers if not c.init and c.nums > 0):
        first = next(_options(_candidates(devs, statics, ctr, req), ctr, req, node), None)
        if first is None:
            reason = container_reason(devs, statics, ctr, req)  # with the earlier containers' GPUs taken
            if placed:
                _restore(devs, base)
                if next(_options(_candidates(devs, statics, ctr, req), ctr, req, node), None) is None:
                    return container_reason(devs, statics, ctr, req)
                return (f'container "{ctr.name}" fits alone, but not beside {", ".join(placed)}, however they '
                        f"are placed; with their first choices taken: {reason}")
            return reason
        for _, d, mem in first:
            _take(d, ctr, mem)
        placed.append(f'container "{ctr.name}"')
    return "no placement found"


def brief_reason(node: NodeInfo, req: PodRequest, cfg: ClusterConfig | None = None) -> str:
    """A short why_not: how many GPUs take the pod's container, and the refusals counted by kind. What the
    extender's filter answers for each node (kube-scheduler groups equal reasons in its event; explain gives
    the long one); a pod of several GPU containers gets the long one."""
    if node.error:
        return node.error
    gpu = [c for c in req.containers if c.nums > 0]
    if len(gpu) != 1:
        return why_not(node, req, cfg)
    ctr = gpu[0]
    filtered = has_filters(req)
    kinds: dict[str, int] = {}
    numa: dict[int, int] = {}
    memreq, pct = ctr.memreq, ctr.mem_percentage
    for d in node.devices:
        mem = memreq if memreq > 0 else d.totalmem * pct // 100  # memory_on
        k = refusal_kind(d, ctr, mem, req, filtered)
        if k is None:
            numa[d.numa] = numa.get(d.numa, 0) + _room(d, mem, ctr.nums)
        else:
            kinds[k] = kinds.get(k, 0) + 1
    n_fit = sum(numa.values())
    out = f'{n_fit} of {len(node.devices)} GPU(s) can take container "{ctr.name}", {ctr.nums} needed'
    if req.numa_bind and n_fit >= ctr.nums:
        out += f" on one NUMA node ({keys.NUMA_BIND})"
    if kinds:
        out += "; refused for " + ", ".join(f"{k} ({v})" for k, v in sorted(kinds.items()))
    return out


def placement_fits(node: NodeInfo, req: PodRequest, devices: PodDevices) -> bool:
    """Whether the GPUs `devices` names (one entry per container, as the allocation encodes them) can still
    be given to the pod on `node` as it is used now: the checks of fit.py, containers in order, init
    containers each against the node alone, except one: a GPU whose cores others filled to 100 still takes
    a promised container that asks 0 cores. That rule depends on the order pods arrive in (the 0-core
    container, promised first, fitted; the others filled the cores beside it), and the state is one HAMi
    reaches too. False for a MIG placement (decided afresh) or a shape that does not match the request."""
    if node.error or len(devices) != len(req.containers):
        return False
    devs = {d.id: d.copy() for d in node.devices}
    base = _state(list(devs.values()))
    for ctr, entries in zip(req.containers, devices, strict=True):
        if len(entries) != ctr.nums or len({e.uuid for e in entries}) != len(entries):
            return False
        for e in entries:
            d = devs.get(e.uuid)
            if d is None or d.mode == keys.MIG or static_reason(d, req) is not None \
                    or e.usedmem != ctr.memory_on(d.totalmem):
                return False
            if not fits(d, ctr, e.usedmem, req.mutex) and not (
                    ctr.coresreq == 0 and d.used < d.count and not (req.mutex and d.used > 0)
                    and d.totalmem - d.usedmem >= e.usedmem and d.usedcores <= d.totalcore):
                return False
        if ctr.init:
            continue  # runs alone: the next container sees the node as it was
        for e in entries:
            d = devs[e.uuid]
            d.used += 1
            d.usedmem += e.usedmem
            d.usedcores += ctr.coresreq
    _restore(list(devs.values()), base)
    return True
