"""The scheduler's cache of nodes and pods: list, then watch, through the official client.

Each kind is listed, then watched from the list's resourceVersion for at most `watch_s` seconds at a
time; a watch that ends is resumed from the last version seen, one that the API server refuses as too old
(410 Gone) or that breaks is followed by a fresh list. While the API server is unreachable the cache keeps
what it has and lists again every `retry_s` seconds; `ready` stays set once both kinds were listed once.

Usage per node (pyvgpu.cluster.core.usage) is kept per node and recomputed only for the nodes an event touched.
`assume(pod)` puts the scheduler's own write in the cache at once, so the next decision counts it before
the watch brings it back.
"""

from __future__ import annotations

import copy
import gc
import logging
import threading
from collections.abc import Iterable

from pyvgpu.cluster.api.kube import Kube, KubeError, KubeUnreachable
from pyvgpu.cluster.core import keys, usage
from pyvgpu.cluster.core.columns import Columns
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import NodeInfo
from pyvgpu.cluster.core.quota import Quotas
from pyvgpu.cluster.core.quota import use_of as quota_use

log = logging.getLogger("pyvgpu.cluster.scheduler.informer")


def _pod_key(p: dict) -> tuple[str, str]:
    m = p.get("metadata") or {}
    return m.get("namespace") or "default", m.get("name") or ""


def slim(pod: dict) -> dict:
    """The parts of a pod the scheduler reads: names, the GPU annotations, node, phase, whether its init
    containers are done. The cache keeps this, not the whole object: a cluster's pods carry managed fields,
    environments and statuses that would otherwise stay in memory and be walked by the garbage collector."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annos = meta.get("annotations") or {}
    out_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
                if k in meta}
    if isinstance(annos, dict):
        out_meta["annotations"] = {k: v for k, v in annos.items()
                                   if isinstance(k, str) and k.startswith(_KEPT_ANNOTATIONS)}
    out_spec = {k: spec[k] for k in ("nodeName", "schedulerName") if k in spec}
    pending = not spec.get("nodeName")
    for part in ("initContainers", "containers"):
        items = spec.get(part)
        if isinstance(items, list):
            out_spec[part] = [_slim_container(c, pending) if isinstance(c, dict) else {} for c in items]
    out_status = {"phase": status.get("phase")} if "phase" in status else {}
    inits = status.get("initContainerStatuses")
    if isinstance(inits, list):
        out_status["initContainerStatuses"] = [
            {"state": {"terminated": {"exitCode": ((st.get("state") or {}).get("terminated") or {}).get("exitCode")}}}
            if isinstance(st, dict) and isinstance((st.get("state") or {}).get("terminated"), dict) else {"state": {}}
            for st in inits]
    return {"metadata": out_meta, "spec": out_spec, "status": out_status}


_KEPT_ANNOTATIONS = ("hami.io/", "nvidia.com/")


def _slim_container(c: dict, pending: bool) -> dict:
    """A container's name, and while its pod waits for a node its resources' limits and requests too: with
    them the cached pod is what pod_request reads, so a bind can decide on it without reading the pod again
    (its patch is conditional on this copy's resourceVersion: Scheduler._bind)."""
    out = {"name": c.get("name")}
    res = c.get("resources")
    if pending and isinstance(res, dict):
        out["resources"] = {k: dict(v) if isinstance(v, dict) else v for k, v in res.items()
                            if k in ("limits", "requests")}
    return out


def _quota_use(pod: dict) -> tuple[int, int] | None:
    """What a cached pod counts against its namespace's quota (None: nothing, or unreadable, or ended)."""
    if usage.ended(pod) or not usage.pod_node(pod):
        return None
    try:
        pd = usage.pod_devices(pod)
    except ClusterInputError:
        return None
    return quota_use(pd, len((pod.get("spec") or {}).get("initContainers") or []), usage.init_done(pod)) if pd else None


def _usage_inputs(node: dict) -> tuple:
    """What of a node its usage is built from (usage.node_info): the registration, pair scores, cordon."""
    annos = (node.get("metadata") or {}).get("annotations") or {}
    return tuple(annos.get(k) for k in (keys.NODE_REGISTER, keys.NODE_PAIR_SCORE, keys.NODE_DEVICE_CORDON))


# The collector's thresholds once the cache is frozen: a filter over thousands of nodes makes tens of
# thousands of short-lived objects, and with the default (700, 10, 10) every few filters set off a full
# collection in the middle of one (issue 30, item 15: filter p99; docs/cluster.md, "Where the time goes").
# Young objects are counted in tens of thousands instead; most die by their reference counts before a
# pass, and a full one comes rarely.
GC_THRESHOLDS = (50_000, 20, 100)


def _rv(obj: dict) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class Informer:
    def __init__(self, kube: Kube, cfg: ClusterConfig | None = None, watch_s: int = 60, retry_s: float = 1.0,
                 freeze_gc: bool = True):
        self.kube = kube
        self.freeze_gc = freeze_gc
        self.cfg = cfg or ClusterConfig()
        self.watch_s = watch_s
        self.retry_s = retry_s
        self.lock = threading.RLock()
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self._pod_node: dict[tuple[str, str], str | None] = {}
        self._by_node: dict[str, set[tuple[str, str]]] = {}
        self._infos: dict[str, NodeInfo] = {}
        self._dirty: set[str] = set()
        self._listed = {"node": threading.Event(), "pod": threading.Event()}
        self.ready = threading.Event()
        self.changed = threading.Condition(self.lock)
        self.generation = 0
        self.seen = {"node": 0, "pod": 0, "resourcequota": 0}  # the latest resourceVersion each kind reflects
        self.quotas = Quotas(self.cfg)  # namespaces' GPU limits and use, kept per pod as pods change
        self.columns = Columns()  # the nodes' GPUs in arrays, for filter's first look at a request shape

    # -- the loops -----------------------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        # ResourceQuotas are followed too but do not gate `ready`: a cluster without quotas (or a role that
        # may not read them) schedules as before, with a warning in the log.
        threads = [threading.Thread(target=self._loop, args=(kind, stop), daemon=True, name=f"informer-{kind}")
                   for kind in ("node", "pod", "resourcequota")]
        for t in threads:
            t.start()
        return threads

    def _loop(self, kind: str, stop: threading.Event) -> None:
        rv = None
        while not stop.is_set():
            try:
                if rv is None:
                    listing = {"node": self.kube.list_nodes, "pod": self.kube.list_pods,
                               "resourcequota": self.kube.list_quotas}[kind]()
                    rv = (listing.get("metadata") or {}).get("resourceVersion") or "0"
                    self._replace(kind, listing.get("items") or [], rv)
                    if kind in self._listed:
                        self._listed[kind].set()
                    if all(e.is_set() for e in self._listed.values()):
                        self.warm()  # the first filter finds every node's usage built
                        if self.freeze_gc and not self.ready.is_set():
                            # The cache is most of the process's objects and lives as long as it: leave it
                            # out of the collector's full passes, which otherwise walk it for up to a second
                            # in the middle of filters (pods hold no reference cycles; refcounts free them).
                            gc.collect()
                            gc.freeze()
                            gc.set_threshold(*GC_THRESHOLDS)
                        self.ready.set()
                for event in self.kube.watch(kind, rv, self.watch_s):
                    if stop.is_set():
                        return
                    obj = event.get("object") or {}
                    if event.get("type") == "BOOKMARK":
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        continue
                    self.apply(kind, event.get("type", ""), obj)
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
            except KubeError as e:
                if e.status != 410:
                    log.warning("%s; listing %ss again", e, kind)
                    stop.wait(self.retry_s)
                rv = None
            except KubeUnreachable as e:
                log.warning("%s; the cache keeps what it has, listing again in %g s", e, self.retry_s)
                stop.wait(self.retry_s)
                rv = None

    # -- the cache -----------------------------------------------------------------------------------------

    def _replace(self, kind: str, objs: list[dict], rv: str = "0") -> None:
        with self.lock:
            self.seen[kind] = int(rv) if str(rv).isdigit() else 0
            if kind == "resourcequota":
                self.quotas.clear_quotas()
                for o in objs:
                    self.quotas.set_quota(o, _pod_key(o))
            elif kind == "node":
                self.nodes = {o["metadata"]["name"]: o for o in objs}
                self._dirty |= set(self.nodes) | set(self._infos)
            else:
                self.pods = {}
                self._pod_node, self._by_node = {}, {}
                self._dirty |= set(self._infos)
                for o in objs:
                    self._set_pod(o)
            self._bump()

    def _bump(self) -> None:
        self.generation += 1
        self.changed.notify_all()

    def _set_pod(self, pod: dict | None, key: tuple[str, str] | None = None) -> None:
        key = key or _pod_key(pod)
        have = self.pods.get(key)
        if pod is not None and have is not None:
            pod = slim(pod)
            if usage.usage_inputs(pod) == usage.usage_inputs(have):
                # charges its node as before (a bind's annotations, then its Binding, seen again through the
                # watch): the node's usage, and the verdicts remembered on it, stay
                self.pods[key] = pod
                return
        old = self._pod_node.pop(key, None)
        if old is not None:
            self._by_node.get(old, set()).discard(key)
            self._dirty.add(old)
        if pod is None:
            self.pods.pop(key, None)
            self.quotas.set_pod(key, None)
            return
        pod = slim(pod)
        self.quotas.set_pod(key, _quota_use(pod))
        self.pods[key] = pod
        node = usage.pod_node(pod)
        self._pod_node[key] = node
        if node:
            self._by_node.setdefault(node, set()).add(key)
            self._dirty.add(node)

    def apply(self, kind: str, typ: str, obj: dict) -> None:
        with self.lock:
            self.seen[kind] = max(self.seen[kind], _rv(obj))
            if kind == "resourcequota":
                self.quotas.set_quota(None if typ == "DELETED" else obj, _pod_key(obj))
            elif kind == "node":
                name = obj["metadata"]["name"]
                old = self.nodes.get(name)
                if typ == "DELETED":
                    self.nodes.pop(name, None)
                    self._infos.pop(name, None)
                elif old is not None and 0 < _rv(obj) < _rv(old):
                    return  # older than what the scheduler's own write (assume_node) put here
                else:
                    self.nodes[name] = obj
                if old is None or typ == "DELETED" or _usage_inputs(old) != _usage_inputs(obj):
                    self._dirty.add(name)  # a lock or handshake change alone leaves the node's usage as it was
            else:
                key = _pod_key(obj)
                have = self.pods.get(key)
                if typ == "DELETED":
                    self._set_pod(None, key)
                elif have is None or _rv(obj) >= _rv(have) or _rv(obj) == 0:
                    self._set_pod(obj)
            self._bump()

    def assume(self, pod: dict) -> None:
        """The scheduler's own write, counted now (the watch brings the API server's copy later)."""
        with self.lock:
            self._set_pod(pod)  # slim() copies what it keeps
            self._bump()

    def assume_node(self, node: dict) -> None:
        """The scheduler's own write of a node (its lock), kept now: the next lock is written on this copy."""
        self.apply("node", "MODIFIED", node)

    def counts(self, key: tuple[str, str], node: str) -> bool:
        """Whether the cache counts pod `key` on `node`: it names the node and has an allocation there."""
        with self.lock:
            pod = self.pods.get(key)
            if pod is None or self._pod_node.get(key) != node:
                return False
            annos = (pod.get("metadata") or {}).get("annotations") or {}
            return bool(annos.get(keys.POD_ALLOCATED) or annos.get(keys.POD_TO_ALLOCATE))

    def pod(self, namespace: str, name: str) -> dict | None:
        with self.lock:
            return self.pods.get((namespace, name))

    def node_infos(self, names: Iterable[str], exclude: tuple[str, str] | None = None,
                   extra_nodes: dict[str, dict] | None = None) -> list[NodeInfo]:
        """NodeInfos (with usage) of the named nodes; a name the cache lacks is taken from `extra_nodes`
        (kube-scheduler sends whole nodes when the extender is not node-cache-capable), else it is a node
        without a registration."""
        names = names if isinstance(names, list) else list(names)
        with self.lock:
            self._rebuild_dirty()
            infos = self._infos
            out = list(map(infos.get, names))  # one C-speed pass: the rest touches few nodes
            # all(): a C-speed pass over objects that are true; `None in out` called NodeInfo.__eq__ per node
            missing = [i for i, info in enumerate(out) if info is None] if not all(out) else ()
            for i in missing:
                name = names[i]
                node = self.nodes.get(name) or (extra_nodes or {}).get(name)
                if node is None:
                    out[i] = NodeInfo(name, error="the scheduler's cache does not have this node yet")
                else:
                    out[i] = self._build(node, [self.pods[k] for k in self._by_node.get(name, set()) if k != exclude])
            on = self._pod_node.get(exclude) if exclude is not None else None
            if on is not None and on in self.nodes:
                # the pod's own earlier allocation does not count against it: its node without it
                keys_ = self._by_node.get(on, set())
                node_built = None
                for i in (i for i, name in enumerate(names) if name == on):
                    if node_built is None:
                        node_built = self._build(self.nodes[on], [self.pods[k] for k in keys_ if k != exclude])
                    out[i] = node_built
        return out

    def _rebuild_dirty(self) -> None:
        """Build the usage of the cached nodes whose pods or registration changed (call with the lock)."""
        for name in list(self._dirty):
            node = self.nodes.get(name)
            if node is not None:
                self._infos[name] = self._build(node, [self.pods[k] for k in self._by_node.get(name, set())])
            else:
                self._infos.pop(name, None)
        self._dirty.clear()

    def warm(self) -> None:
        """Build the usage of every node whose cached usage is out of date (after a list: all of them), and
        write their rows of the columns a filter judges a new request shape on."""
        with self.lock:
            names = [n for n in self.nodes if n in self._dirty or n not in self._infos]
        for i in range(0, len(names), 256):  # in slices, so filters are not kept waiting on the lock long
            with self.lock:
                for name in names[i:i + 256]:
                    node = self.nodes.get(name)
                    if node is not None and (name in self._dirty or name not in self._infos):
                        self._infos[name] = self._build(node, [self.pods[k] for k in self._by_node.get(name, set())])
                        self._dirty.discard(name)
                self.columns.prepare([self._infos[n] for n in names[i:i + 256] if n in self._infos])

    def all_node_infos(self) -> list[NodeInfo]:
        """Every cached node with its usage (what the usage metrics read when scraped)."""
        with self.lock:
            names = sorted(self.nodes)
        return [i for i in self.node_infos(names) if not i.error]

    def _build(self, node: dict, pods: list[dict]) -> NodeInfo:
        try:
            return usage.node_infos([node], pods, self.cfg)[0]
        except Exception as e:  # noqa: BLE001 -- one node's bad annotations must not stop the rebuild of the others
            name = str((node.get("metadata") or {}).get("name", "")) if isinstance(node, dict) else ""
            log.warning("node %s: its usage cannot be read, nothing is placed on it: %s", name, e)
            return NodeInfo(name, error=f"the node's usage cannot be read: {e}")

    def in_flight(self, node: str, exclude: tuple[str, str]) -> list[dict]:
        """Pods the cache has on `node` by annotation only (bound by a bind whose Binding is not seen yet)."""
        with self.lock:
            return [copy.deepcopy(self.pods[k]) for k in self._by_node.get(node, set())
                    if k != exclude and not (self.pods[k].get("spec") or {}).get("nodeName")]
