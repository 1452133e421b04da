"""`pyvgpu cluster scheduler`: a kube-scheduler extender over HTTP, and the webhook that sends pods to it.

    POST /filter       ExtenderArgs -> ExtenderFilterResult         every node the pod fits on, best first
    POST /prioritize   ExtenderArgs -> HostPriorityList              0..10, by the node policy's rank
    POST /bind         ExtenderBindingArgs -> ExtenderBindingResult  lock, choose GPUs, annotate, bind, unlock
    POST /webhook      AdmissionReview -> AdmissionReview            pyvgpu.cluster.webhook
    GET  /healthz      200 while the process serves
    GET  /readyz       200 once the cache has listed nodes and pods, else 503
    GET  /metrics      Prometheus: filter latency, denials, bind latency and outcomes

The JSON is kube-scheduler's (k8s.io/kube-scheduler/extender/v1, types without JSON tags, so the keys are
the Go field names: Pod, Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error; PodName,
PodNamespace, PodUID, Node; Host, Score). With `nodeCacheCapable: true` kube-scheduler sends NodeNames and
reads NodeNames back; otherwise it sends Nodes (a NodeList) and reads Nodes back. Both are served.

Filter decides on the cache (pyvgpu.cluster.informer); the GPUs are chosen at bind, on the node
kube-scheduler picked, with the node locked (pyvgpu.cluster.nodelock) and its pods read fresh from the API
server, so two binds never count the same free memory. A failed bind answers Error: kube-scheduler puts
the pod back in its queue and retries it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from pyvgpu.cluster import httpserve, keys, usage, webhook
from pyvgpu.cluster.config import ClusterConfig
from pyvgpu.cluster.decide import decide_on
from pyvgpu.cluster.errors import ClusterInputError
from pyvgpu.cluster.informer import Informer
from pyvgpu.cluster.kube import Kube, KubeError, KubeUnreachable
from pyvgpu.cluster.nodelock import LockBusy, NodeLock
from pyvgpu.cluster.request import pod_request

log = logging.getLogger("pyvgpu.cluster.scheduler")
MAX_BODY = httpserve.MAX_BODY
MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority


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
        self.ready = Gauge("pyvgpu_scheduler_cache_ready", "1 once nodes and pods were listed.",
                           registry=self.registry)


def _names_and_nodes(args: dict) -> tuple[list[str], dict[str, dict] | None]:
    if args.get("NodeNames") is not None:
        names = args["NodeNames"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("NodeNames: expected a list of node names")
        return names, None
    nodes = args.get("Nodes")
    if isinstance(nodes, dict):
        items = nodes.get("items") or []
        by = {(n.get("metadata") or {}).get("name"): n for n in items if isinstance(n, dict)}
        by.pop(None, None)
        return list(by), by
    raise ValueError("expected NodeNames (nodeCacheCapable: true) or Nodes (a NodeList)")


class Scheduler:
    def __init__(self, kube: Kube, cfg: ClusterConfig | None = None, name: str = "pyvgpu-scheduler",
                 lock_expire_s: float = 300.0, informer: Informer | None = None) -> None:
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
        self._node_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def start(self, stop: threading.Event) -> None:
        self.informer.start(stop)

    # -- filter and prioritize -----------------------------------------------------------------------------

    def _decide(self, args: dict):
        pod = args.get("Pod")
        if not isinstance(pod, dict):
            raise ValueError("Pod: expected the pod being scheduled")
        names, nodes = _names_and_nodes(args)
        req = pod_request(pod, self.cfg)
        infos = self.informer.node_infos(names, exclude=(req.namespace, req.name), extra_nodes=nodes)
        return decide_on(infos, req, self.cfg), names, nodes

    def filter(self, args: dict) -> dict:
        t0 = time.perf_counter()
        try:
            try:
                d, names, nodes = self._decide(args)
            except ClusterInputError as e:
                names, nodes = _names_and_nodes(args)
                self.metrics.filter_total.labels("invalid").inc()
                reason = f"pyvgpu: {e}"
                return self._filter_result([], nodes, {}, {n: reason for n in names})
            if not d.request.wants_gpus:
                self.metrics.filter_total.labels("no_gpu").inc()
                return self._filter_result(names, nodes, {}, {})
            feasible = d.feasible
            failed = {n.name: f"pyvgpu: {n.reason}" for n in d.nodes if not n.fits}
            self.metrics.refused_nodes.inc(len(failed))
            self.metrics.filter_total.labels("fits" if feasible else "denied").inc()
            if not feasible:
                log.info("pod %s fits no node of %d: %s", d.pod, len(names),
                         "; ".join(f"{k}: {v}" for k, v in list(failed.items())[:5]))
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
        try:
            d, names, _ = self._decide(args)
        except ClusterInputError:
            names, _ = _names_and_nodes(args)
            return [{"Host": n, "Score": 0} for n in names]
        ranked = d.feasible if d.request.wants_gpus else []
        score = {}
        for i, n in enumerate(ranked):
            score[n] = MAX_PRIORITY if len(ranked) == 1 else round(MAX_PRIORITY * (len(ranked) - 1 - i)
                                                                   / (len(ranked) - 1))
        return [{"Host": n, "Score": score.get(n, 0)} for n in names]

    # -- bind ----------------------------------------------------------------------------------------------

    def _node_lock(self, node: str) -> threading.Lock:
        with self._guard:
            return self._node_locks.setdefault(node, threading.Lock())

    def bind(self, args: dict) -> dict:
        t0 = time.perf_counter()
        result = "error"
        try:
            result, err = self._bind(args)
            return {"Error": err}
        finally:
            self.metrics.bind_total.labels(result).inc()
            self.metrics.bind_seconds.observe(time.perf_counter() - t0)

    def _bind(self, args: dict) -> tuple[str, str]:
        ns, name = args.get("PodNamespace") or "default", args.get("PodName") or ""
        node, uid = args.get("Node") or "", args.get("PodUID") or ""
        if not name or not node:
            return "invalid", "pyvgpu: bind needs PodName and Node"
        if not uid:
            return "invalid", f"pyvgpu: bind of pod {ns}/{name} needs its PodUID (kube-scheduler always sends it)"
        who = f"pod {ns}/{name}"
        try:
            pod = self.kube.get_pod(ns, name)
        except KubeError as e:
            if e.not_found:
                return "pod_gone", f"pyvgpu: {who} no longer exists"
            return "error", f"pyvgpu: {e}"
        except KubeUnreachable as e:
            return "api_unreachable", f"pyvgpu: {e}"
        if (pod.get("metadata") or {}).get("uid") != uid:
            return "pod_gone", f"pyvgpu: {who} was deleted and created again (UID {uid} is gone)"
        refused = self._not_ours(pod, who)
        if refused:
            return refused
        try:
            req = pod_request(pod, self.cfg)
        except ClusterInputError as e:
            return "invalid", f"pyvgpu: {e}"
        try:
            if not req.wants_gpus:
                self.kube.bind(ns, name, uid, node)
                return "bound", ""
            with self._node_lock(node):
                return self._bind_locked(pod, req, ns, name, uid, node)
        except LockBusy as e:
            return "lock_busy", f"pyvgpu: {e}"
        except KubeUnreachable as e:
            return "api_unreachable", f"pyvgpu: {e}"
        except KubeError as e:
            if e.not_found:
                return "pod_gone", f"pyvgpu: {who} was deleted while being bound: {e}"
            return "error", f"pyvgpu: {e}"

    def _bind_locked(self, pod, req, ns, name, uid, node) -> tuple[str, str]:
        who = f"pod {ns}/{name}"
        node_obj = self.lock.acquire(node, ns, name)
        try:
            fresh = self.kube.list_pods(node=node).get("items") or []
            seen = {((p["metadata"].get("namespace") or "default"), p["metadata"]["name"]) for p in fresh}
            fresh += [p for p in self.informer.in_flight(node, (ns, name))
                      if ((p["metadata"].get("namespace") or "default"), p["metadata"]["name"]) not in seen]
            info = usage.node_infos([node_obj], fresh, self.cfg, exclude=(ns, name))
            d = decide_on(info, req, self.cfg)
            if d.node is None:
                why = d.nodes[0].reason if d.nodes else "no such node"
                return "no_longer_fits", f"pyvgpu: {who} no longer fits on node {node}: {why}"
            now = str(int(time.time()))
            annos = dict(d.annotations)
            annos[keys.POD_TIME] = now
            annos[keys.POD_BIND_TIME] = now
            annos[keys.POD_BIND_PHASE] = keys.BIND_ALLOCATING
            patched = self.kube.patch_pod(ns, name, {"metadata": {"annotations": annos}})
            try:
                self.kube.bind(ns, name, uid, node)
            except (KubeError, KubeUnreachable) as e:
                if not self._undo(ns, name, uid, node, e):
                    raise
            patched.setdefault("spec", {})["nodeName"] = node
            self.informer.assume(patched)
            log.info("bound %s to node %s: %s", who, node, annos[keys.POD_TO_ALLOCATE])
            return "bound", ""
        finally:
            try:
                self.lock.release(node, ns, name)
            except (KubeError, KubeUnreachable) as e:
                log.error("could not release the lock of node %s: %s; it expires", node, e)

    def _not_ours(self, pod: dict, who: str) -> tuple[str, str] | None:
        """Why bind must not touch this pod: one meant for another scheduler, or one already bound (its
        annotations are what its node counts; rewriting or undoing them would free GPUs in use)."""
        spec = pod.get("spec") or {}
        sched = spec.get("schedulerName") or "default-scheduler"
        if sched != self.name:
            return "not_ours", (f"pyvgpu: {who} names the scheduler {sched!r}, not {self.name!r}: {self.name} "
                                "binds only its own pods; nothing was changed")
        if spec.get("nodeName"):
            return "already_bound", f"pyvgpu: {who} is already bound to node {spec['nodeName']}; nothing was changed"
        return None

    def _undo(self, ns: str, name: str, uid: str, node: str, why: Exception) -> bool:
        """The Binding failed after the annotations were written: take them back, so the pod's GPUs do not
        count on the node. The pod is read again first: a Binding whose answer was lost (a timeout) may have
        landed, and a bound pod's annotations are never taken back. True when the pod is bound to `node`
        (the bind succeeded after all)."""
        if isinstance(why, KubeError) and why.not_found:
            return False
        try:
            pod = self.kube.get_pod(ns, name)
            meta = pod.get("metadata") or {}
            if meta.get("uid") != uid:
                return False
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound:
                log.warning("the Binding of pod %s/%s failed (%s) but the pod is bound to %s: its annotations stay",
                            ns, name, why, bound)
                return bound == node
            self.kube.patch_pod(ns, name, {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {
                keys.POD_NODE: None, keys.POD_TO_ALLOCATE: None, keys.POD_ALLOCATED: None,
                keys.POD_BIND_PHASE: keys.BIND_FAILED}}})
        except (KubeError, KubeUnreachable) as e:
            # left as written: the node over-counts this pod until the annotations are rewritten, never under
            log.error("could not take back the annotations of pod %s/%s after a failed bind: %s", ns, name, e)
        return False

    # -- webhook -------------------------------------------------------------------------------------------

    def admit(self, body: dict) -> dict:
        return webhook.review(body, self.cfg, self.name, self.annotation_writers)


def _handler(s: Scheduler):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "pyvgpu-scheduler"
        # kube-scheduler keeps its connection alive: with Nagle's algorithm on, the body (a second small
        # write after the headers) waits for the client's delayed ACK, many times the decision itself
        # (docs/cluster.md, "Measured")
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else (json.dumps(body).encode() if ctype == "application/json"
                                                         else str(body).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/healthz":
                return self._send(200, "ok", "text/plain")
            if path == "/readyz":
                ready = s.informer.ready.is_set()
                s.metrics.ready.set(1 if ready else 0)
                return self._send(200 if ready else 503, "ok" if ready else "the cache has not listed nodes and "
                                                                           "pods yet", "text/plain")
            if path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                s.metrics.ready.set(1 if s.informer.ready.is_set() else 0)
                return self._send(200, generate_latest(s.metrics.registry), CONTENT_TYPE_LATEST)
            self._send(404, f"no such path {path}; see `pyvgpu cluster scheduler --help`", "text/plain")

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            verbs = {"/filter": s.filter, "/prioritize": s.prioritize, "/bind": s.bind, "/webhook": s.admit,
                     "/mutate": s.admit}
            fn = verbs.get(path)
            try:
                raw = httpserve.read_body(self.headers, self.rfile)
            except httpserve.BadRequest as e:
                self.close_connection = True
                return self._send(e.code, f"pyvgpu scheduler {path}: {e}", "text/plain")
            if fn is None:
                return self._send(404, f"no such verb {path}: use /filter, /prioritize, /bind or /webhook",
                                  "text/plain")
            if path in httpserve.EXTENDER_VERBS and not self.server.may_call_extender(self):
                return self._send(403, f"pyvgpu scheduler {path}: the extender verbs are served to kube-scheduler "
                                       "on localhost; on this port they need the bearer token of --token-file or a "
                                       "client certificate signed by --client-ca-file", "text/plain")
            try:
                out = fn(httpserve.parse_object(raw))
            except httpserve.BadRequest as e:
                return self._send(e.code, f"pyvgpu scheduler {path}: bad request: {e}", "text/plain")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                return self._send(400, f"pyvgpu scheduler {path}: bad request: {e}", "text/plain")
            self._send(200, out)

    return Handler


class Server:
    """The HTTP listener of the extender verbs, on localhost unless `host` says otherwise (then a token is
    required), and with a certificate an HTTPS one for the webhook, health and metrics (pyvgpu.cluster.httpserve
    says who may call what)."""

    def __init__(self, scheduler: Scheduler, port: int, host: str = "127.0.0.1", tls_port: int | None = None,
                 cert: str | None = None, key: str | None = None, token_file: str | None = None,
                 client_ca: str | None = None, tls_host: str = "0.0.0.0") -> None:
        self.scheduler = scheduler
        token = httpserve.load_token(token_file)
        if not httpserve.is_loopback(host) and token is None:
            raise ValueError(f"--address {host} exposes /filter, /prioritize and /bind beyond localhost: give "
                             "--token-file (a bearer token callers must send), or keep the default 127.0.0.1")
        self.httpd = httpserve.BoundedServer((host, port), _handler(scheduler), token=token)
        self.port = self.httpd.server_address[1]
        self.httpsd = None
        if tls_port is not None:
            ctx = httpserve.tls_context(cert, key, client_ca)
            self.httpsd = httpserve.BoundedServer((tls_host, tls_port), _handler(scheduler), tls=ctx, token=token)
            self.tls_port = self.httpsd.server_address[1]

    def start(self) -> None:
        for srv in (self.httpd, self.httpsd):
            if srv is not None:
                threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def stop(self) -> None:
        for srv in (self.httpd, self.httpsd):
            if srv is not None:
                srv.shutdown()
                srv.server_close()


def run(kubeconfig: str | None, port: int, name: str, cfg: ClusterConfig, lock_expire_s: float,
        tls_port: int | None = None, cert: str | None = None, key: str | None = None, address: str = "127.0.0.1",
        token_file: str | None = None, client_ca: str | None = None, writers: tuple[str, ...] = ()) -> None:
    from pyvgpu.cluster.daemon import _stop_on_signals

    stop = _stop_on_signals()
    kube = Kube(kubeconfig)
    s = Scheduler(kube, cfg, name, lock_expire_s)
    s.annotation_writers = frozenset(writers)
    if not writers:
        log.warning("no --annotation-writer: the webhook refuses every change to the hami.io allocation "
                    "annotations, also the node agent's; name the scheduler's and the node agent's service accounts")
    srv = Server(s, port, address, tls_port=tls_port, cert=cert, key=key, token_file=token_file, client_ca=client_ca)
    s.start(stop)
    srv.start()
    log.info("extender on %s:%d%s, scheduler name %s, API server %s", address, srv.port,
             f", webhook over TLS on {tls_port}" if tls_port else "", name, kube.server)
    stop.wait()
    srv.stop()

