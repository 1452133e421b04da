"""The decision pipeline (docs/cluster.md, its picture): one pod, every node, one answer with a verdict per node.

    read the pod's request -> per node: the usage, the node score, does the pod fit
    -> rank the nodes that fit by the node policy -> place the pod's containers on the first
    -> the annotations the scheduler writes.

Every node the pod fits on is kept, ranked (HAMi's filter returns one node only, which leaves
kube-scheduler's own scoring nothing to weigh: HAMi#2264). Nothing here reads a clock or a network.
"""

from __future__ import annotations

from typing import Any

from pyvgpu.cluster import codec, keys
from pyvgpu.cluster.config import ClusterConfig
from pyvgpu.cluster.fit import has_filters
from pyvgpu.cluster.model import Decision, NodeInfo, NodeResult, PodRequest
from pyvgpu.cluster.place import count_fit, feasible, plan, why_not
from pyvgpu.cluster.policy import rank_nodes
from pyvgpu.cluster.request import pod_request
from pyvgpu.cluster.score import node_score
from pyvgpu.cluster.usage import node_infos


def decide(nodes: Any, pods: Any, pod: dict, config: ClusterConfig | None = None) -> Decision:
    """Decide where `pod` goes, from Kubernetes objects as dicts.

    nodes: a NodeList (`kubectl get nodes -o json`), a list of Nodes or one Node.
    pods:  a PodList (`kubectl get pods -A -o json`) or a list of Pods: their usage counts.
    pod:   the Pod to place. Its own entry in `pods`, if any, does not count against it.
    Raises ClusterInputError (naming the field) for an invalid pod or list; a node with a broken
    registration is a node that does not fit, with the reason.
    """
    cfg = config or ClusterConfig()
    req = pod_request(pod, cfg)
    return decide_on(node_infos(nodes, pods, cfg, exclude=(req.namespace, req.name)), req, cfg)


def decide_on(nodes: list[NodeInfo], req: PodRequest, config: ClusterConfig | None = None) -> Decision:
    """The same decision on nodes already read, with their usage (what a long-running scheduler keeps)."""
    cfg = config or ClusterConfig()
    if not req.wants_gpus:
        verdicts = tuple(NodeResult(n.name, True, None if n.error else node_score(n.devices),
                                    "the pod asks no GPU: any node will do, as far as GPUs go")
                         for n in sorted(nodes, key=lambda n: n.name))
        return Decision(req.key, None, (), {}, verdicts, req, req.node_policy, req.gpu_policy)
    fit, unfit = [], []
    by_name = {}
    gpu = [c for c in req.containers if c.nums > 0]
    single = gpu[0] if len(gpu) == 1 else None  # one container asking GPUs: a count decides (place.count_fit)
    filtered = has_filters(req)
    for n in nodes:
        by_name[n.name] = n
        if n.error:
            unfit.append(NodeResult(n.name, False, None, n.error))
            continue
        score = n.score_cache
        if score is None:
            score = n.score_cache = node_score(n.devices)
        if count_fit(n.devices, single, req, filtered) if single is not None else feasible(n, req, cfg):
            fit.append(NodeResult(n.name, True, score))
        else:
            unfit.append(NodeResult(n.name, False, score, why_not(n, req, cfg)))
    ranked = rank_nodes(fit, req.node_policy)
    verdicts = tuple(ranked) + tuple(sorted(unfit, key=lambda r: r.name))
    if not ranked:
        return Decision(req.key, None, (), {}, verdicts, req, req.node_policy, req.gpu_policy)
    best = ranked[0].name
    placed = plan(by_name[best], req, cfg)
    if not placed.fits:  # feasible() and plan() share their checks; this would be a bug, said plainly
        raise AssertionError(f"node {best} was feasible but no placement was found: {placed.reason}")
    encoded = codec.encode_pod_devices(tuple(tuple(p.entry() for p in c) for c in placed.placements))
    annotations = {
        keys.POD_NODE: best,
        keys.POD_TO_ALLOCATE: encoded,
        keys.POD_ALLOCATED: encoded,  # HAMi's filter writes both with one value (PatchAnnotations)
        keys.POD_BIND_PHASE: keys.BIND_ALLOCATING,  # written at bind, with hami.io/bind-time
    }
    return Decision(req.key, best, placed.placements, annotations, verdicts, req, req.node_policy, req.gpu_policy)
