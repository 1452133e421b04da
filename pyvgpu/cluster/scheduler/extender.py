"""`pyvgpu cluster scheduler`: a kube-scheduler extender over HTTP, and the webhook that sends pods to it.

    POST /filter       ExtenderArgs -> ExtenderFilterResult         every node the pod fits on, best first
    POST /prioritize   ExtenderArgs -> HostPriorityList              0..10, by the node policy's rank
    POST /bind         ExtenderBindingArgs -> ExtenderBindingResult  lock, choose GPUs, annotate, bind, unlock
    POST /webhook      AdmissionReview -> AdmissionReview            pyvgpu.cluster.scheduler.webhook
    GET  /healthz      200 while the process serves
    GET  /readyz       200 once the cache has listed nodes and pods, else 503
    GET  /metrics      Prometheus: filter latency, denials, bind latency and outcomes

The JSON is kube-scheduler's (k8s.io/kube-scheduler/extender/v1, types without JSON tags, so the keys are
the Go field names: Pod, Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error; PodName,
PodNamespace, PodUID, Node; Host, Score). With `nodeCacheCapable: true` kube-scheduler sends NodeNames and
reads NodeNames back; otherwise it sends Nodes (a NodeList) and reads Nodes back. Both are served.

Filter decides on the cache (pyvgpu.cluster.scheduler.informer); the GPUs are chosen at bind, on the node
kube-scheduler picked, with the node locked (pyvgpu.cluster.api.nodelock) and its pods read fresh from the API
server, so two binds never count the same free memory (bind is pyvgpu.cluster.scheduler.binder). A failed
bind answers Error: kube-scheduler puts the pod back in its queue and retries it. The HTTP server and
`run()` are pyvgpu.cluster.scheduler.extender_server.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from pyvgpu.cluster.api import events
from pyvgpu.cluster.api.kube import Kube
from pyvgpu.cluster.api.nodelock import NodeLock
from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.decide import decide_on
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.request import pod_request
from pyvgpu.cluster.scheduler import httpserve, webhook
from pyvgpu.cluster.scheduler.binder import Binder
from pyvgpu.cluster.scheduler.inflight import InFlight
from pyvgpu.cluster.scheduler.informer import Informer
from pyvgpu.cluster.scheduler.leader import LeaseLeader
from pyvgpu.cluster.scheduler.liveness import Liveness
from pyvgpu.cluster.scheduler.recent import RecentRanks
from pyvgpu.cluster.scheduler.usage_metrics import UsageCollector

log = logging.getLogger("pyvgpu.cluster.scheduler")
MAX_BODY = httpserve.MAX_BODY
MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority
HANDSHAKE_S = 30.0  # how often the running scheduler asks every node's agent for its handshake


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        buckets = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
        self.filter_seconds = Histogram("pyvgpu_scheduler_filter_seconds", "Time to answer one filter call.",
                                        buckets=buckets, registry=self.registry)
        self.filter_total = Counter("pyvgpu_scheduler_filter", "Filter calls by outcome: fits (some node fits), "
                                    "denied (no node fits), invalid (the pod's request is invalid), no_gpu.",
                                    ["result"], registry=self.registry)
        self.refused_nodes = Counter("pyvgpu_scheduler_filter_refused_nodes", "Nodes a filter call refused.",
                                     registry=self.registry)
        self.bind_seconds = Histogram("pyvgpu_scheduler_bind_seconds", "Time to answer one bind call (lock, "
                                      "decide, annotate, bind, unlock).", buckets=buckets, registry=self.registry)
        self.bind_total = Counter("pyvgpu_scheduler_bind", "Bind calls by outcome.", ["result"],
                                  registry=self.registry)
        self.undo_failed = Counter("pyvgpu_scheduler_bind_undo_failed", "Failed binds whose annotations could not "
                                   "be taken back (the pod's GPUs count on the node until they are rewritten).",
                                   registry=self.registry)
        self.ready = Gauge("pyvgpu_scheduler_cache_ready", "1 once nodes and pods were listed.",
                           registry=self.registry)


def rank_scores(n: int) -> list[int]:
    """Scores of n ranked nodes: MAX_PRIORITY for the first, 0 for the last, evenly between (rounded half to
    even, as Python's round)."""
    if n <= 1:
        return [MAX_PRIORITY] * n
    import numpy as np

    last = n - 1
    # float64 division of exact integers, rounded half to even: what round(MAX_PRIORITY * (last - i) / last) gives
    return np.rint(np.arange(last, -1, -1, dtype=np.float64) * MAX_PRIORITY / last).astype(np.int64).tolist()


@functools.lru_cache(maxsize=32)
def _rank_scores(n: int) -> tuple[int, ...]:
    """rank_scores(n), kept: kube-scheduler sends the same number of nodes again and again."""
    return tuple(rank_scores(n))


_PLAIN_NAMES = re.compile(r"[A-Za-z0-9._-]*")  # names JSON writes unescaped
_SCORE_TAILS = tuple(f'", "Score": {sc}' for sc in range(MAX_PRIORITY + 1))


def _names_and_nodes(args: dict) -> tuple[list[str], dict[str, dict] | None]:
    if args.get("NodeNames") is not None:
        names = args["NodeNames"]
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise ValueError("NodeNames: expected a list of node names")
        return names, None
    nodes = args.get("Nodes")
    if isinstance(nodes, dict):
        items = nodes.get("items") or []
        by = {(n.get("metadata") or {}).get("name"): n for n in items if isinstance(n, dict)}
        by.pop(None, None)
        return list(by), by
    raise ValueError("expected NodeNames (nodeCacheCapable: true) or Nodes (a NodeList)")


_NAME = attrgetter("name")
_FITS = attrgetter("fits")
_REASON = attrgetter("reason")


def _failed(verdicts: tuple, n_fit: int) -> dict[str, str]:
    """FailedNodes: each refusing node's reason. decide_on lists the nodes that fit first: the rest refuse,
    read in C-speed passes (a Python pass over thousands of nodes was a part of every filter)."""
    unfit = verdicts[n_fit:]
    if any(map(_FITS, unfit)) or not all(map(_FITS, verdicts[:n_fit])):  # not in that order: one by one
        return {n.name: f"pyvgpu: {n.reason}" for n in verdicts if not n.fits}
    return dict(zip(map(_NAME, unfit), map("pyvgpu: ".__add__, map(str, map(_REASON, unfit))), strict=True))


class Scheduler(Binder):
    def __init__(self, kube: Kube, cfg: ClusterConfig | None = None, name: str = "pyvgpu-scheduler",
                 lock_expire_s: float = 300.0, informer: Informer | None = None, handshake_s: float = 0.0,
                 leader: LeaseLeader | None = None) -> None:
        self.kube = kube
        self.cfg = cfg or ClusterConfig()
        if name not in self.cfg.scheduler_names:  # its own pods count on their nodes
            self.cfg = dataclasses.replace(self.cfg, scheduler_names=(*self.cfg.scheduler_names, name))
        self.name = name
        self.informer = informer or Informer(kube, self.cfg)
        self.lock = NodeLock(kube, lock_expire_s)
        # users (service accounts) the webhook lets write the allocation annotations (webhook.py)
        self.annotation_writers: frozenset[str] = frozenset()
        self.metrics = Metrics()
        self.inflight = InFlight()  # filter's and bind's promises, counted until the cache has them
        self.ranks = RecentRanks()  # filter's ranking, for the prioritize call that follows
        self.liveness = Liveness()  # nodes whose agent stopped answering the handshake (0 s: not asked)
        self.handshake_s = handshake_s
        self.leader = leader  # several replicas: only the one whose kube-scheduler leads asks the nodes
        self.events = events.Recorder(kube, name)  # why a pod was refused or read leniently, on the pod
        self.metrics.registry.register(UsageCollector(self.informer.all_node_infos))
        self._node_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def start(self, stop: threading.Event) -> None:
        self.informer.start(stop)
        self.events.start(stop)
        if self.leader is not None:
            threading.Thread(target=self.leader.run, args=(stop,), daemon=True, name="leader").start()
        if self.handshake_s > 0:
            threading.Thread(target=self._handshakes, args=(stop,), daemon=True, name="handshake").start()

    def _handshakes(self, stop: threading.Event) -> None:
        while not stop.wait(self.handshake_s):
            self.handshake_once()

    def handshake_once(self) -> None:
        """Judge every node's liveness; the leading replica (or the only one) also asks them for the handshake."""
        def ask(node: str, value: str) -> None:
            self.kube.patch_node(node, {"metadata": {"annotations": {keys.NODE_HANDSHAKE: value}}})

        with self.informer.lock:
            nodes = list(self.informer.nodes.values())
        self.liveness.check(nodes, ask if self.leader is None or self.leader.is_leader() else None)

    # -- filter and prioritize -----------------------------------------------------------------------------

    def _decide(self, args: dict, brief: bool = False):
        pod = args.get("Pod")
        if not isinstance(pod, dict):
            raise ValueError("Pod: expected the pod being scheduled")
        names, nodes = _names_and_nodes(args)
        req = pod_request(pod, self.cfg)
        infos = self.informer.node_infos(names, exclude=(req.namespace, req.name), extra_nodes=nodes)
        infos = self.inflight.apply(self.liveness.apply(infos), (req.namespace, req.name), self.informer.counts)
        quota = self.informer.quotas.view(req.namespace, exclude=(req.namespace, req.name))
        columns = self.informer.columns if brief else None
        return decide_on(infos, req, self.cfg, brief=brief, quota=quota, columns=columns), names, nodes

    def filter(self, args: dict) -> dict:
        t0 = time.perf_counter()
        try:
            try:
                d, names, nodes = self._decide(args, brief=True)  # per-GPU detail: `cluster explain`
            except ClusterInputError as e:
                names, nodes = _names_and_nodes(args)
                self.metrics.filter_total.labels("invalid").inc()
                reason = f"pyvgpu: {e}"
                return self._filter_result([], nodes, {}, {n: reason for n in names})
            if d.warnings:
                self.events.record(args["Pod"], events.LENIENT_READ, "; ".join(d.warnings))
            if not d.request.wants_gpus:
                self.metrics.filter_total.labels("no_gpu").inc()
                return self._filter_result(names, nodes, {}, {})
            feasible = d.feasible
            if d.node is not None:  # kube-scheduler's likely pick: counted for the next pods until bind ends
                self.inflight.reserve((d.request.namespace, d.request.name), d.node, d.devices,
                                      d.init_containers)
            self.ranks.put((d.request.namespace, d.request.name), d.request.uid, feasible)
            failed = _failed(d.nodes, len(feasible))
            self.metrics.refused_nodes.inc(len(failed))
            self.metrics.filter_total.labels("fits" if feasible else "denied").inc()
            if not feasible:
                log.info("pod %s fits no node of %d: %s", d.pod, len(names),
                         "; ".join(f"{k}: {v}" for k, v in list(failed.items())[:5]))
                self.events.record(args["Pod"], events.FILTERING_FAILED, events.summary(failed, len(names)))
            return self._filter_result(feasible, nodes, failed, {})
        finally:
            self.metrics.filter_seconds.observe(time.perf_counter() - t0)

    @staticmethod
    def _filter_result(fit: list[str], nodes: dict[str, dict] | None, failed: dict, unresolvable: dict) -> dict:
        out: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": failed,
                               "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if nodes is None:
            out["NodeNames"] = list(fit)
        else:
            out["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [nodes[n] for n in fit]}
        return out

    def prioritize(self, args: dict) -> list[dict]:
        names, scores = self._priorities(args)
        return [{"Host": n, "Score": sc} for n, sc in zip(names, scores, strict=True)]

    def prioritize_body(self, args: dict) -> bytes:
        """prioritize's answer as the JSON the HTTP server sends: written straight from the names (node names
        are DNS names, which JSON writes as they are; any other name goes through json.dumps). At 5000 nodes
        the general encoder's list of dicts cost more than the ranking itself."""
        names, scores = self._priorities(args)
        if not names:
            return b"[]"
        if not _PLAIN_NAMES.fullmatch("".join(names)):
            return json.dumps([{"Host": n, "Score": sc} for n, sc in zip(names, scores, strict=True)]).encode()
        rest = _SCORE_TAILS
        return ('[{"Host": "' + '}, {"Host": "'.join([n + rest[sc] for n, sc in zip(names, scores, strict=True)])
                + "}]").encode()

    def _priorities(self, args: dict) -> tuple[list[str], Sequence[int]]:
        """The names kube-scheduler sent and each one's score, 0..MAX_PRIORITY by filter's ranking."""
        ranked = self._recent_rank(args)
        if ranked is not None:
            names = _names_and_nodes(args)[0]
        else:
            try:
                d, names, _ = self._decide(args)
            except ClusterInputError:
                names, _ = _names_and_nodes(args)
                return names, [0] * len(names)
            ranked = d.feasible if d.request.wants_gpus else []
        scores = _rank_scores(len(ranked))
        if names == ranked:  # kube-scheduler sends filter's answer back in its order: no lookups needed
            return names, scores
        score = dict(zip(ranked, scores, strict=True))
        return names, [score.get(n, 0) for n in names]

    def _recent_rank(self, args: dict) -> list[str] | None:
        pod = args.get("Pod")
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict) or not meta.get("name"):
            return None
        names = _names_and_nodes(args)[0]
        return self.ranks.get((str(meta.get("namespace") or "default"), str(meta["name"])), str(meta.get("uid") or ""),
                              names)

    # -- webhook -------------------------------------------------------------------------------------------

    def admit(self, body: dict) -> dict:
        return webhook.review(body, self.cfg, self.name, self.annotation_writers, self.informer.quotas)
