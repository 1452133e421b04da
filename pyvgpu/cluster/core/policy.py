"""Policies (docs/cluster.md, "Policies"): the order GPUs are tried in, the GPU sets offered, and the order of nodes.

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

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from itertools import combinations
from operator import attrgetter
from typing import TypeVar

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.model import DeviceUsage, NodeResult, PodRequest

T = TypeVar("T")
# Up to this many n-GPU sets are all scored and sorted (every node of up to 16 GPUs: C(16, 8) = 12870);
# beyond it the search is bounded (linked_sets).
EXACT_TOPOLOGY_SETS = 20_000


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
    """The link score between two GPUs (docs/cluster.md: 10 across CPUs ... 100 per NVLink). A pair is read from
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
    for combo in linked_sets(ids, n, scores):
        yield tuple(ordered[i] for i in combo)


def linked_sets(ids: Sequence[str], n: int, scores: dict[str, dict[str, int]]) -> Iterator[tuple[int, ...]]:
    """Index sets of n of the GPUs `ids` (in preference order), the highest sum of link scores first.

    Exact while there are at most EXACT_TOPOLOGY_SETS sets: all are scored, ties keep preference order.
    Beyond that (C(64, 8) is 4.4e9 sets) bounded and lazy: first one set grown greedily from each GPU
    (each step adds the GPU with the most links into the set), best first; then every other set in
    preference order, generated only as far as the caller reads (plan() stops at search_budget tries).
    Memory and time before the first set: O(len(ids)^2 * n)."""
    m = len(ids)
    if math.comb(m, n) <= EXACT_TOPOLOGY_SETS:
        combos = list(combinations(range(m), n))
        total = [sum(pair(scores, ids[a], ids[b]) for a, b in combinations(c, 2)) for c in combos]
        for k in sorted(range(len(combos)), key=lambda k: -total[k]):  # stable: ties keep preference order
            yield combos[k]
        return
    link = [[pair(scores, ids[a], ids[b]) if a != b else 0 for b in range(m)] for a in range(m)]
    grown: dict[tuple[int, ...], int] = {}
    for seed in range(m):
        chosen, gain = [seed], list(link[seed])
        while len(chosen) < n:
            best = max((j for j in range(m) if j not in chosen), key=lambda j: (gain[j], -j))
            chosen.append(best)
            gain = [g + x for g, x in zip(gain, link[best], strict=True)]
        key = tuple(sorted(chosen))
        grown[key] = sum(link[a][b] for a, b in combinations(key, 2))
    yield from sorted(grown, key=lambda k: (-grown[k], k))
    for combo in combinations(range(m), n):
        if combo not in grown:
            yield combo


def multisets(items: Sequence[tuple[T, int]], n: int, *, topology: bool = False,
              scores: dict[str, dict[str, int]] | None = None, uuid_of=None) -> Iterator[tuple[T, ...]]:
    """The sets of n GPUs one container may take when a GPU may be taken several times: `items` are
    (GPU, how many times at most) in policy order. Each set once, in the order `sets` gives over the GPUs
    repeated in place (the first: as many of the most preferred as it gives, then the next, as HAMi's Fit
    walks a MIG GPU again); with topology, the first EXACT_TOPOLOGY_SETS sorted by their link sum (pairs
    of two instances of one GPU count 0), the rest after them."""
    caps = tuple(k for _, k in items)

    def expand(takes: tuple[tuple[int, int], ...]) -> tuple[T, ...]:
        return tuple(x for i, k in takes for x in (items[i][0],) * k)

    if not topology:
        yield from map(expand, _takes(caps, n))
        return
    ids = [uuid_of(c) for c, _ in items]
    links = tuple(tuple(pair(scores or {}, a, b) if a != b else 0 for b in ids) for a in ids)
    ranked = _ranked(caps, n, links)
    yield from map(expand, ranked)
    if len(ranked) == EXACT_TOPOLOGY_SETS:
        yield from map(expand, itertools.islice(_takes(caps, n), EXACT_TOPOLOGY_SETS, None))


def _takes(caps: tuple[int, ...], n: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """multisets' sets as (item, copies) pairs of the items taken, in its order: as many of the first item as
    it gives, then fewer, each followed by the same over the rest."""
    suffix = [0] * (len(caps) + 1)
    for i in range(len(caps) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + caps[i]

    def rec(i: int, k: int, prefix: tuple) -> Iterator[tuple[tuple[int, int], ...]]:
        if k == 0:
            yield prefix
            return
        if suffix[i] < k:
            return
        for take in range(min(caps[i], k), 0, -1):
            yield from rec(i + 1, k - take, prefix + ((i, take),))
        yield from rec(i + 1, k, prefix)

    return rec(0, n, ())


@functools.lru_cache(maxsize=4)
def _ranked(caps: tuple[int, ...], n: int, links: tuple[tuple[int, ...], ...]) -> tuple:
    """The first EXACT_TOPOLOGY_SETS of _takes sorted by their link sum, the highest first (stable: ties keep
    preference order); `links[i][j]`: the link score of items i and j. Kept for the few item tables last
    seen: one decision asks for the same ones again (the plan, then the reason it gives). The sums are built
    along the walk of _takes, one item added at a time."""
    suffix = [0] * (len(caps) + 1)
    for i in range(len(caps) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + caps[i]
    found: list[tuple[int, tuple]] = []
    if n <= 0 or suffix[0] < n:
        return ((),) if n == 0 else ()
    stack = [(0, n, (), 0)]  # (next item, GPUs still to take, takes so far, their link sum)
    while stack and len(found) < EXACT_TOPOLOGY_SETS:
        i, k, prefix, total = stack.pop()  # k > 0 and suffix[i] >= k: a set lies below
        gain = sum(kj * links[j][i] for j, kj in prefix)  # read from the earlier GPU's side, as `pair` is
        rest = suffix[i + 1]
        if rest >= k:
            stack.append((i + 1, k, prefix, total))  # pushed first: walked after every take of item i
        for take in range(max(1, k - rest), min(caps[i], k) + 1):  # the most taken is walked first
            if take == k:  # the last pushed, so the next walked: a set, taken now
                found.append((-total - take * gain, prefix + ((i, take),)))
            else:
                stack.append((i + 1, k - take, prefix + ((i, take),), total + take * gain))
    found_order = sorted(range(len(found)), key=lambda x: found[x][0])  # stable: ties keep preference order
    return tuple(found[x][1] for x in found_order)


def rank_nodes(results: list[NodeResult], policy: str) -> list[NodeResult]:
    """binpack (default): the fullest node first (highest node score); spread: the emptiest first."""
    out = sorted(results, key=attrgetter("name"))  # two stable C sorts: by name, then by score
    try:  # a node that fits always has a score (only a node in error has none): a key read in C
        out.sort(key=attrgetter("score"), reverse=policy != keys.SPREAD)  # reverse keeps equal scores in name order
    except TypeError:  # a score of None among them: counted as 0
        out.sort(key=attrgetter("name"))
        out.sort(key=_score, reverse=policy != keys.SPREAD)
    return out


def _score(r: NodeResult) -> float:
    return r.score or 0.0
