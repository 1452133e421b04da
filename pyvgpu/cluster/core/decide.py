"""The decision pipeline (docs/cluster.md, its picture): one pod, every node, one answer with a verdict per node.

    read the pod's request -> per node: the usage, the node score, does the pod fit
    -> rank the nodes that fit by the node policy -> place the pod's containers on the first
    -> the annotations the scheduler writes.

Every node the pod fits on is kept, ranked (HAMi's filter returns one node only, which leaves
kube-scheduler's own scoring nothing to weigh: HAMi#2264). Nothing here reads a clock or a network.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from operator import attrgetter
from typing import Any

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.columns import Columns, usable
from pyvgpu.cluster.core.columns import brief_reason as columns_reason
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.fit import has_filters
from pyvgpu.cluster.core.model import ContainerRequest, Decision, NodeInfo, NodeResult, PodDevices, PodRequest
from pyvgpu.cluster.core.place import brief_reason, count_fit, feasible, plan, why_not
from pyvgpu.cluster.core.policy import rank_nodes
from pyvgpu.cluster.core.quota import QuotaView, use_of_placements
from pyvgpu.cluster.core.request import pod_request
from pyvgpu.cluster.core.score import node_score
from pyvgpu.cluster.core.usage import node_infos


def decide(nodes: Any, pods: Any, pod: dict, config: ClusterConfig | None = None, quotas: Any = None,
           dead: Mapping[str, str] | None = None) -> Decision:
    """Decide where `pod` goes, from Kubernetes objects as dicts.

    nodes: a NodeList (`kubectl get nodes -o json`), a list of Nodes or one Node.
    pods:  a PodList (`kubectl get pods -A -o json`) or a list of Pods: their usage counts.
    pod:   the Pod to place. Its own entry in `pods`, if any, does not count against it.
    quotas: a ResourceQuotaList (`kubectl get resourcequotas -A -o json`), or None.
    dead:  node name -> why its agent is taken for gone (the scheduler's liveness verdicts): such a node fits
           nothing, with that reason, as in the running scheduler.
    Raises ClusterInputError (naming the field) for an invalid pod or list; a node with a broken
    registration is a node that does not fit, with the reason.
    """
    cfg = config or ClusterConfig()
    req = pod_request(pod, cfg)
    quota = None
    if quotas is not None:
        from pyvgpu.cluster.core.quota import view_of

        quota = view_of(quotas, pods, req.namespace, cfg, exclude=(req.namespace, req.name))
    infos = node_infos(nodes, pods, cfg, exclude=(req.namespace, req.name))
    if dead:
        infos = [NodeInfo(i.name, error=dead[i.name]) if i.name in dead and not i.error else i for i in infos]
    return decide_on(infos, req, cfg, quota=quota)


def decide_on(nodes: list[NodeInfo], req: PodRequest, config: ClusterConfig | None = None,
              brief: bool = False, quota: QuotaView | None = None, columns: Columns | None = None) -> Decision:
    """The same decision on nodes already read, with their usage (what a long-running scheduler keeps).
    `brief`: a refusing node's reason is place.brief_reason (refusals counted by kind), not every GPU's.
    `quota`: the pod's namespace's GPU quota (pyvgpu.cluster.core.quota): a node where the pod's GPUs would take
    the namespace over it does not fit.
    `columns`: the nodes' GPUs in arrays (pyvgpu.cluster.core.columns), where a brief decision judges a request
    shape it has not met on a node; the same verdicts and reasons as the Python path."""
    cfg = config or ClusterConfig()
    warnings = gather_warnings(req, nodes)
    if not req.wants_gpus:
        verdicts = tuple(NodeResult(n.name, True, None if n.error else node_score(n.devices),
                                    "the pod asks no GPU: any node will do, as far as GPUs go")
                         for n in sorted(nodes, key=lambda n: n.name))
        return Decision(req.key, None, (), {}, verdicts, req, req.node_policy, req.gpu_policy, warnings)
    fit, unfit = [], []
    gpu = [c for c in req.containers if c.nums > 0]
    single = gpu[0] if len(gpu) == 1 else None  # one container asking GPUs: a count decides (place.count_fit)
    filtered = has_filters(req)
    # Filter's verdicts are remembered per node usage and request shape: a node's usage changes far less
    # often than pods of one shape come (a job's replicas), and the cache goes with the usage (usage.add_pod
    # clears it; a rebuilt node starts without one). A verdict is remembered as True (fits) or the brief
    # reason, plain values: the garbage collector stops tracking a dict that holds only such values, and
    # the memos of thousands of nodes hold a verdict per node and shape, which as objects every full
    # collection walked in the middle of filters. One NodeResult per node and verdict stands for them.
    shape = _shape_id((single, req.numa_bind, req.mutex, (req.use_types, req.nouse_types, req.use_uuids,
                                                         req.nouse_uuids, req.modes) if filtered else None)) \
        if brief and single else None
    todo = nodes
    if shape is not None:
        # the remembered verdicts in one pass of comprehensions (a Python loop per node was most of a filter
        # at 5000 nodes); only the nodes without one go through the loop below
        got = [(n.fit_cache or _NO_MEMO).get(shape) for n in nodes]
        fit = [(n.results or _NO_MEMO).get(True) or _result(n, True) for n, v in zip(nodes, got, strict=True)
               if v is True]
        unfit = [(n.results or _NO_MEMO).get(v) or _result(n, v) for n, v in zip(nodes, got, strict=True)
                 if v is not None and v is not True]
        todo = [n for n, v in zip(nodes, got, strict=True) if v is None] if len(fit) + len(unfit) < len(nodes) else ()
        if todo and columns is not None and usable(req, single, filtered):
            todo = _judged(todo, columns.judge(todo, single, req.mutex), single, shape, fit, unfit)
    for n in todo:
        if n.error:
            unfit.append(NodeResult(n.name, False, None, n.error))
            continue
        score = n.score_cache
        if score is None:
            score = n.score_cache = node_score(n.devices)
        if shape is not None:
            memo = n.fit_cache
            if memo is None:
                memo = n.fit_cache = {}
            elif len(memo) >= FIT_CACHE:
                for old in list(memo)[:FIT_CACHE // 4]:  # the oldest quarter goes (dicts keep insertion order)
                    del memo[old]
            if count_fit(n.devices, single, req, filtered):
                memo[shape] = True
                fit.append(_result(n, True))
            else:
                reason = memo[shape] = _interned(brief_reason(n, req, cfg))
                unfit.append(_result(n, reason))
            continue
        if count_fit(n.devices, single, req, filtered) if single is not None else feasible(n, req, cfg):
            fit.append(NodeResult(n.name, True, score))
        else:
            unfit.append(NodeResult(n.name, False, score, brief_reason(n, req, cfg) if brief else why_not(n, req, cfg)))
    ranked = rank_nodes(fit, req.node_policy)
    placed = None
    by_name = _ByName(nodes)
    if quota is not None and ranked:
        ranked, over, placed = _within_quota(ranked, by_name, req, cfg, quota)
        unfit += over
    verdicts = tuple(ranked) + tuple(sorted(unfit, key=lambda r: r.name))
    if not ranked:
        return Decision(req.key, None, (), {}, verdicts, req, req.node_policy, req.gpu_policy, warnings)
    best = ranked[0].name
    placed = placed or plan(by_name[best], req, cfg)
    if not placed.fits:  # feasible() and plan() share their checks; this would be a bug, said plainly
        raise AssertionError(f"node {best} was feasible but no placement was found: {placed.reason}")
    annotations = allocation_annotations(best, tuple(tuple(p.entry() for p in c) for c in placed.placements))
    return Decision(req.key, best, placed.placements, annotations, verdicts, req, req.node_policy, req.gpu_policy,
                    warnings)


_NO_MEMO: dict = {}
_NAME = attrgetter("name")
_WARNINGS = attrgetter("warnings")


def _judged(nodes: list[NodeInfo], judged: list, ctr: ContainerRequest, shape: int, fit: list, unfit: list) -> list:
    """The verdicts of the nodes Columns.judge counted, remembered on them; the nodes it left out."""
    rest = [n for n, counts in zip(nodes, judged, strict=True) if counts is None]
    if rest:
        nodes = [n for n, counts in zip(nodes, judged, strict=True) if counts is not None]
        judged = [counts for counts in judged if counts is not None]
    for n in [n for n in nodes if n.score_cache is None]:
        n.score_cache = node_score(n.devices)
    nums = ctr.nums
    values = [True if counts & 15 >= nums else _interned(columns_reason(counts, ctr))  # columns.fitting
              for counts in judged]
    for n, value in zip(nodes, values, strict=True):
        memo = n.fit_cache  # Columns.judge gave the node one
        if len(memo) >= FIT_CACHE:
            for old in list(memo)[:FIT_CACHE // 4]:
                del memo[old]
        memo[shape] = value
    fit += [_result(n, v) for n, v in zip(nodes, values, strict=True) if v is True]
    unfit += [_result(n, v) for n, v in zip(nodes, values, strict=True) if v is not True]
    return rest


def _result(n: NodeInfo, verdict) -> NodeResult:
    """The node's shared NodeResult for a remembered verdict (True, or the brief reason)."""
    results = n.results
    if results is None:
        results = n.results = {}
    got = results.get(verdict)
    if got is None:
        if len(results) >= FIT_CACHE:
            results.clear()
        got = results[verdict] = (NodeResult(n.name, True, n.score_cache) if verdict is True
                                  else NodeResult(n.name, False, n.score_cache, verdict))
    return got


class _ByName:
    """The NodeInfo of a name, looked up on demand: a decision needs one or a few (the best node, the quota's
    tries), and a dict of every node per filter cost as much as the remembered verdicts' pass."""

    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.nodes = nodes
        self.index: dict[str, NodeInfo] | None = None
        self.looked = False

    def __getitem__(self, name: str) -> NodeInfo:
        if self.index is not None:
            return self.index[name]
        names = list(map(_NAME, self.nodes))
        if not self.looked:  # the first look-up: a C-speed search of the names
            self.looked = True
            return self.nodes[names.index(name)]
        self.index = dict(zip(names, self.nodes, strict=True))
        return self.index[name]


def _interned(reason: str) -> str:
    return _REASONS.setdefault(reason, reason) if len(_REASONS) < MAX_SHAPES else reason


def allocation_annotations(node: str, devices: PodDevices) -> dict[str, str]:
    """The annotations a decision writes for the pod's GPUs on `node`."""
    encoded = codec.encode_pod_devices(devices)
    out = {
        keys.POD_NODE: node,
        keys.POD_TO_ALLOCATE: encoded,
        keys.POD_ALLOCATED: encoded,  # HAMi's filter writes both with one value (PatchAnnotations)
        keys.POD_BIND_PHASE: keys.BIND_ALLOCATING,  # written at bind, with hami.io/bind-time
    }
    reserved = codec.encode_mig_allocations(devices)  # dynamic MIG: the instances (HAMi v2.10 PatchAnnotations)
    if reserved is not None:
        out[keys.POD_MIG_ALLOCATIONS] = reserved
    return out


FIT_CACHE = 128  # request shapes remembered per node usage
# Request shapes by a small number: the verdict caches of every node are looked up by it (hashing the
# shape itself once per node was a large part of a filter). Numbers are never given twice: past the bound
# the table starts again with new numbers, and verdicts under the old ones are never found again.
_SHAPES: dict[tuple, int] = {}
_NUMBERS = itertools.count()
MAX_SHAPES = 65536
_REASONS: dict[str, str] = {}  # one copy of each brief reason, shared by the nodes' caches


def _shape_id(shape: tuple) -> int:
    got = _SHAPES.get(shape)
    if got is None:
        if len(_SHAPES) >= MAX_SHAPES:
            _SHAPES.clear()
            _REASONS.clear()
        got = _SHAPES.setdefault(shape, next(_NUMBERS))
    return got
QUOTA_TRIES = 32  # ranked nodes whose placement is checked against the quota before the rest are assumed alike


def _within_quota(ranked: list[NodeResult], by_name: dict[str, NodeInfo], req: PodRequest, cfg: ClusterConfig,
                  quota: QuotaView):
    """The ranked nodes minus those where the pod's placement takes the namespace over its quota, the refused
    ones, and the first node's placement. A node whose first placement goes over is searched again for one
    within the quota (HAMi's Fit skips a GPU that would go over and tries the next). A pod whose use does not
    depend on the node (MiB asked, no init container asks GPUs) is refused everywhere or nowhere; otherwise the
    first QUOTA_TRIES nodes are checked one by one and the rest are kept (bind checks the node it gets again)."""
    gpu = [c for c in req.containers if c.nums > 0]
    fixed = all(c.memreq > 0 and not c.init for c in gpu)
    over: list[NodeResult] = []
    for i, r in enumerate(ranked[:QUOTA_TRIES]):
        placed = plan(by_name[r.name], req, cfg)
        why = quota.reason(use_of_placements(placed.placements, sum(1 for c in req.containers if c.init)))
        if why is None:
            return ranked[i:], over, placed
        if not fixed:  # as HAMi checks the quota per candidate GPU: other GPUs of the node may keep within it
            placed = plan(by_name[r.name], req, cfg, quota=quota)
            if placed.fits:
                return ranked[i:], over, placed
        over.append(NodeResult(r.name, False, r.score, why))
        if fixed:
            over += [NodeResult(x.name, False, x.score, why) for x in ranked[i + 1:]]
            return [], over, None
    return ranked[QUOTA_TRIES:], over, None


MAX_WARNINGS = 20  # a decision carries this many skipped pods' lines at most, then a count


def gather_warnings(req: PodRequest, nodes: list[NodeInfo]) -> tuple[str, ...]:
    """The pod's lenient readings, then the pods skipped on the nodes (bounded: a count past MAX_WARNINGS)."""
    out = list(req.warnings)
    skipped = 0
    for warnings in filter(None, map(_WARNINGS, nodes)):  # few nodes have any: found in one C-speed pass
        for w in warnings:
            if skipped < MAX_WARNINGS:
                out.append(w)
            skipped += 1
    if skipped > MAX_WARNINGS:
        out.append(f"and {skipped - MAX_WARNINGS} more pod(s) skipped for an allocation that cannot be read")
    return tuple(out)
