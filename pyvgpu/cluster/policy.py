"""Policies (seed section 5): the order GPUs are tried in, the GPU sets offered, and the order of nodes.

GPUs are tried in HAMi's order (pkg/scheduler/policy/gpu_policy.go Less, then Fit walking the sorted list
from its end), so equal GPUs fall as they fall in HAMi:
* spread: the lowest device score first; equal scores: the higher NUMA node first (HAMi#1806), then the
  GPU listed last in the node's registration.
* binpack: the highest score first; equal scores as spread.
* numa-bind: the NUMA nodes first (spread: the highest NUMA id first, binpack the lowest), then the score.
* mutex: the least used GPU first, then the higher NUMA node, then the last listed.
* a comma list (or bare "numa"): its sort keys in the order written (binpack, spread, numa: the lower NUMA
  node is tried last), numa first under numa-bind, then the higher device index first.
HAMi's sort is Go's sort.Sort, which is stable for the 12 or fewer GPUs a node has; ties here follow
that stable order.
Topology: equal link sums go by the order above (the earlier GPUs win). Nodes: equal scores by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from operator import attrgetter
from typing import TypeVar

from pyvgpu.cluster import keys
from pyvgpu.cluster.model import DeviceUsage, NodeResult, PodRequest

T = TypeVar("T")


def _hami_key(req: PodRequest):
    """The ascending key of HAMi's Less for this pod's policy (HAMi then walks the list backwards)."""
    if req.gpu_chain:
        chain = list(req.gpu_chain)
        if req.numa_bind and chain[0] != keys.NUMA:
            chain = [keys.NUMA] + [k for k in chain if k != keys.NUMA]
        parts = {keys.BINPACK: lambda s, d: s, keys.SPREAD: lambda s, d: -s, keys.NUMA: lambda s, d: d.numa}
        fns = [parts[k] for k in chain]
        return lambda c: (*(f(c[0], c[1]) for f in fns), c[1].index)
    if req.mutex:  # no comma: the single value "mutex", which sorts by use
        return lambda c: (-c[1].used, c[1].numa)
    binpack = req.gpu_policy == keys.BINPACK
    if req.numa_bind:
        return (lambda c: (-c[1].numa, c[0])) if binpack else (lambda c: (c[1].numa, -c[0]))
    return (lambda c: (c[0], c[1].numa)) if binpack else (lambda c: (-c[0], c[1].numa))


def order_devices(scored: list[tuple[float, DeviceUsage, T]], req: PodRequest) -> list[tuple[float, DeviceUsage, T]]:
    """`scored` (device score, GPU, ...) in the node's registration order, returned best first."""
    out = sorted(scored, key=_hami_key(req))  # stable, as Go's insertion sort for small lists
    out.reverse()
    return out


def pair(scores: dict[str, dict[str, int]], a: str, b: str) -> int:
    """The link score between two GPUs (seed 5.3: 10 across CPUs ... 100 per NVLink). A pair is read from
    either side, so a one-sided annotation still counts; a missing pair is 0."""
    s = scores.get(a)
    if s is not None and b in s:
        return s[b]
    s = scores.get(b)
    if s is not None and a in s:
        return s[a]
    return 0


def numa_groups(ordered: Sequence[T], numa_of) -> list[list[T]]:
    """The candidates split by NUMA node; a group comes where its most preferred GPU comes."""
    groups: dict[int, list[T]] = {}
    for c in ordered:
        groups.setdefault(numa_of(c), []).append(c)
    return list(groups.values())


def sets(ordered: Sequence[T], n: int, *, topology: bool, scores: dict[str, dict[str, int]],
         uuid_of) -> Iterator[tuple[T, ...]]:
    """The GPU sets one container may take from `ordered` (already in policy order), best first.

    Without topology: every n-combination in lexicographic order of preference, so the first is the n
    most preferred GPUs. With topology (HAMi computeWorstSingleCard / computeBestCombination):
    one GPU: the one with the lowest sum of link scores to the other candidates, which keeps the
    well-connected GPUs for multi-GPU pods; several GPUs: the set with the highest sum of link scores
    between its members.
    """
    if n > len(ordered) or n <= 0:
        return
    if not topology or len(ordered) == n:
        yield from combinations(ordered, n)
        return
    ids = [uuid_of(c) for c in ordered]
    if n == 1:
        sums = [sum(pair(scores, ids[i], ids[j]) for j in range(len(ids)) if j != i) for i in range(len(ids))]
        for i in sorted(range(len(ordered)), key=lambda i: (sums[i], i)):
            yield (ordered[i],)
        return
    combos = list(combinations(range(len(ordered)), n))
    total = [sum(pair(scores, ids[a], ids[b]) for a, b in combinations(c, 2)) for c in combos]
    for k in sorted(range(len(combos)), key=lambda k: -total[k]):  # sorted is stable: ties keep preference order
        yield tuple(ordered[i] for i in combos[k])


def rank_nodes(results: list[NodeResult], policy: str) -> list[NodeResult]:
    """binpack (default): the fullest node first (highest node score); spread: the emptiest first."""
    out = sorted(results, key=attrgetter("name"))  # two stable C sorts: by name, then by score
    if policy == keys.SPREAD:
        out.sort(key=_score)
    else:
        out.sort(key=_score, reverse=True)  # reverse keeps equal scores in name order
    return out


def _score(r: NodeResult) -> float:
    return r.score or 0.0
