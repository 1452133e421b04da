"""Policies (seed section 5): the order GPUs are tried in, the GPU sets offered, and the order of nodes.

Ties break by a fixed rule, so one input always gives one decision (HAMi's sorts are not stable and its
nodes are scored in goroutines, so its ties fall either way):
* GPUs: equal scores go by device index, then UUID.
* Topology: equal link sums go by the GPU policy's order (the earlier GPUs win).
* Nodes: equal scores go by node name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from typing import TypeVar

from pyvgpu.cluster import keys
from pyvgpu.cluster.model import DeviceUsage, NodeResult

T = TypeVar("T")


def order_devices(scored: list[tuple[float, DeviceUsage, T]], policy: str) -> list[tuple[float, DeviceUsage, T]]:
    """spread (default): the least used GPU first (lowest device score); binpack: the most used first."""
    if policy == keys.BINPACK:
        return sorted(scored, key=lambda s: (-s[0], s[1].index, s[1].id))
    return sorted(scored, key=lambda s: (s[0], s[1].index, s[1].id))


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
    if policy == keys.SPREAD:
        return sorted(results, key=lambda r: (r.score, r.name))
    return sorted(results, key=lambda r: (-(r.score or 0.0), r.name))
