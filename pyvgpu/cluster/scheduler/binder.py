"""The extender's bind: lock the node, choose the GPUs on its pods read fresh, annotate the pod, create its
Binding, unlock (a mixin of pyvgpu.cluster.scheduler.extender.Scheduler, which holds the state it uses).

The pod is the cache's copy when that copy is waiting for a node and has the UID kube-scheduler sent, else
it is read fresh. Either way its annotations are written with a patch conditional on the resourceVersion
the bind decided on, and the Binding carries the pod's UID and the resourceVersion that write produced:
kube-apiserver refuses a Binding whose metadata.uid or metadata.resourceVersion is not the pod's with 409
Conflict (pkg/registry/core/pod/storage/storage.go, BindingREST.Create -> setPodHostAndAnnotations, which
makes them storage preconditions; kubernetes/kubernetes#105913, 2021). So a pod changed between the
bind's read and its Binding (a user's edit, another scheduler's annotations) is never bound on annotations
chosen for an older version. A conflict on the cache's copy (409 on either write) binds the pod again, once,
on a fresh read; a conflict on a fresh read answers Error. Any refusal decided on the cache's copy is
checked on a fresh read too. A failed bind answers Error: kube-scheduler puts the pod back in its queue and
retries it, and the pod's GPUs promised in flight are released. A Binding whose answer was lost is judged on
the pod read again: bound to the node by this bind, it is a success (the kubelet may have allocated it already).
"""

from __future__ import annotations

import logging
import threading
import time

from pyvgpu.cluster.api import events
from pyvgpu.cluster.api.kube import KubeError, KubeUnreachable
from pyvgpu.cluster.api.nodelock import LockBusy
from pyvgpu.cluster.core import keys, usage
from pyvgpu.cluster.core.decide import decide_on
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.request import pod_request
from pyvgpu.cluster.scheduler.inflight import kept_promise

log = logging.getLogger("pyvgpu.cluster.scheduler")


# the annotations a bind writes that say which GPUs the pod holds, and when they were chosen
_WRITTEN = (keys.POD_NODE, keys.POD_TO_ALLOCATE, keys.POD_ALLOCATED, keys.POD_MIG_ALLOCATIONS, keys.POD_BIND_TIME)
# those of them the kubelet's Allocate never rewrites (it rewrites POD_TO_ALLOCATE and bind-phase as it hands
# out the GPUs): on a bound pod they still say whether the bind that bound it was this one
_KEPT_ONCE_BOUND = (keys.POD_NODE, keys.POD_ALLOCATED, keys.POD_BIND_TIME)


class _Stale(Exception):
    """The cache's copy of the pod being bound is not current: bind it again on a fresh read."""


class _Changed(Exception):
    """The pod changed since the version the bind decided on (a write conditional on it got 409)."""


class Binder:
    """Scheduler's POST /bind. Uses the Scheduler's kube, cfg, name, informer, lock, inflight, metrics,
    events, _guard and _node_locks."""

    def _node_lock(self, node: str) -> threading.Lock:
        with self._guard:
            return self._node_locks.setdefault(node, threading.Lock())

    def bind(self, args: dict) -> dict:
        t0 = time.perf_counter()
        result = "error"
        try:
            result, err = self._bind(args)
            if err and args.get("PodName"):
                who = {"metadata": {"name": args.get("PodName"), "namespace": args.get("PodNamespace") or "default",
                                    "uid": args.get("PodUID")}}
                self.events.record(who, events.BINDING_FAILED, err)
            return {"Error": err}
        finally:
            if result != "bound":  # kube-scheduler filters the pod again; its promise ends here
                self.inflight.release((args.get("PodNamespace") or "default", args.get("PodName") or ""))
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
        cached = self._cached_pod(ns, name, uid)
        if cached is not None:
            try:
                return self._bind_pod(cached, ns, name, uid, node, cached=True)
            except _Stale:
                log.info("the cache's copy of %s was not current; binding it on a fresh read", who)
        try:
            pod = self.kube.get_pod(ns, name)
        except KubeError as e:
            if e.not_found:
                return "pod_gone", f"pyvgpu: {who} no longer exists"
            return "error", f"pyvgpu: {e}"
        except KubeUnreachable as e:
            return "api_unreachable", f"pyvgpu: {e}"
        meta = pod.get("metadata") or {}
        if meta.get("uid") != uid:
            return "pod_gone", f"pyvgpu: {who} was deleted and created again (UID {uid} is gone)"
        if not meta.get("resourceVersion"):  # every write of the bind is conditional on it: none, no bind
            return "error", f"pyvgpu: the API server sent {who} without metadata.resourceVersion; nothing was changed"
        return self._bind_pod(pod, ns, name, uid, node, cached=False)

    def _cached_pod(self, ns: str, name: str, uid: str) -> dict | None:
        """The cache's copy of a pod waiting for a node, when it can stand for a fresh read: it has the UID
        kube-scheduler sent and a resourceVersion, on which the bind's writes to the pod are conditional
        (a pod changed since fails one with 409, and the bind starts again on a fresh read)."""
        pod = self.informer.pod(ns, name)
        if pod is None:
            return None
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != uid or not meta.get("resourceVersion") or spec.get("nodeName") \
                or meta.get("deletionTimestamp"):
            return None
        return pod

    def _bind_pod(self, pod: dict, ns: str, name: str, uid: str, node: str, cached: bool) -> tuple[str, str]:
        """Bind `pod`, read fresh or the cache's copy (`cached`: then every refusal, a pod without GPUs and a
        conflict are confirmed on a fresh read, by _Stale). The annotations are written only on the pod's
        resourceVersion, and the Binding only on the version that write made."""
        who = f"pod {ns}/{name}"
        refused = self._not_ours(pod, who)
        if refused:
            if cached:
                raise _Stale
            return refused
        try:
            req = pod_request(pod, self.cfg)
        except ClusterInputError as e:
            if cached:
                raise _Stale from None
            return "invalid", f"pyvgpu: {e}"
        if cached and not req.wants_gpus:
            raise _Stale  # no annotations to write on the cached version: bound on the pod as it is now
        try:
            if not req.wants_gpus:
                self.kube.bind(ns, name, uid, node)  # its UID only, as kube-scheduler's own binder sends
                return "bound", ""
            self._reserve_for_bind(req, node)
            with self._node_lock(node):
                return self._bind_locked(pod, req, ns, name, uid, node)
        except _Changed as e:
            if cached:
                raise _Stale from None
            return "conflict", (f"pyvgpu: {who} changed while it was being bound ({e}); it was not bound, and "
                                "kube-scheduler retries it")
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
        with self.informer.lock:
            cached = self.informer.nodes.get(node)
        node_obj = self.lock.acquire(node, ns, name, cached=cached)
        self.informer.assume_node(node_obj)  # the next bind's lock is written on this copy
        try:
            fresh = self.kube.list_pods(node=node).get("items") or []
            seen = {((p["metadata"].get("namespace") or "default"), p["metadata"]["name"]) for p in fresh}
            fresh += [p for p in self.informer.in_flight(node, (ns, name))
                      if ((p["metadata"].get("namespace") or "default"), p["metadata"]["name"]) not in seen]
            info = usage.node_infos([node_obj], fresh, self.cfg, exclude=(ns, name))
            info = self.inflight.apply(info, (ns, name), self.informer.counts, self.inflight.order((ns, name)))
            quota = self.informer.quotas.view(ns, exclude=(ns, name))
            annos = kept_promise(self.inflight.promise((ns, name)), info[0], req, quota)
            if annos is None:
                d = decide_on(info, req, self.cfg, quota=quota)
                if d.node is None:
                    why = d.nodes[0].reason if d.nodes else "no such node"
                    return "no_longer_fits", f"pyvgpu: {who} no longer fits on node {node}: {why}"
                annos = dict(d.annotations)
            annos.setdefault(keys.POD_MIG_ALLOCATIONS, None)  # none left from an earlier decision of the pod
            now = str(int(time.time()))
            annos[keys.POD_TIME] = now
            annos[keys.POD_BIND_TIME] = now
            annos[keys.POD_BIND_PHASE] = keys.BIND_ALLOCATING
            meta = {"annotations": annos, "resourceVersion": pod["metadata"]["resourceVersion"]}
            try:
                patched = self.kube.patch_pod(ns, name, {"metadata": meta})
            except KubeError as e:
                if e.conflict:
                    raise _Changed("its annotations were not written: the patch conditional on resourceVersion "
                                   f"{meta['resourceVersion']} got 409") from None
                raise
            written = (patched.get("metadata") or {}).get("resourceVersion")
            try:
                if not written:  # fail closed: a Binding not conditional on it could land on a pod changed since
                    raise KubeError(f"patch pod {ns}/{name}", 200, "OK", "the answer has no metadata.resourceVersion "
                                    "to make the Binding conditional on; the pod was not bound")
                self.kube.bind(ns, name, uid, node, resource_version=written)
                patched.setdefault("spec", {})["nodeName"] = node
            except (KubeError, KubeUnreachable) as e:
                # an error answer (4xx) is a Binding refused; without one (or 5xx) it may have landed
                landed = self._undo(ns, name, uid, node, e, annos, isinstance(e, KubeUnreachable) or e.status >= 500)
                if landed is None:
                    if isinstance(e, KubeError) and e.conflict:
                        raise _Changed(f"the Binding conditional on resourceVersion {written}, the one its "
                                       f"annotations were written at, was refused: {e}") from None
                    raise
                patched = landed  # as read: the kubelet's Allocate may have written it since
            self.informer.assume(patched)
            self.inflight.release((ns, name))  # the cache counts the written annotations now
            log.info("bound %s to node %s: %s", who, node, annos[keys.POD_TO_ALLOCATE])
            return "bound", ""
        finally:
            try:
                released = self.lock.release(node, ns, name, locked=node_obj)
                if released is not None:
                    self.informer.assume_node(released)
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

    def _reserve_for_bind(self, req, node: str) -> None:
        """The pod's GPUs on the node kube-scheduler chose count for the others' filters from now on (filter
        reserved its own first choice, which kube-scheduler may not have taken)."""
        key = (req.namespace, req.name)
        infos = self.inflight.apply(self.informer.node_infos([node], exclude=key), key, self.informer.counts,
                                    self.inflight.order(key))
        old = self.inflight.promise(key)
        if old is not None and kept_promise(old, infos[0], req, None) is not None:
            self.inflight.reserve(key, node, old.devices, old.n_init, keep_order=True)  # still good: renewed
            return
        d = decide_on(infos, req, self.cfg)
        if d.node is not None:
            self.inflight.reserve(key, d.node, d.devices, d.init_containers, keep_order=True)

    def _undo(self, ns: str, name: str, uid: str, node: str, why: Exception, wrote: dict,
              may_have_landed: bool) -> dict | None:
        """The Binding failed after the annotations `wrote` were written: take them back, so the pod's GPUs
        do not count on the node. The pod is read again first: a Binding whose answer was lost (a timeout,
        a 5xx: `may_have_landed`) may have landed, a bound pod's annotations are never taken back, and
        annotations another writer has put in their place since are not ours to take back. Returns the pod as
        read when the bind succeeded after all: the Binding may have landed and the pod is bound to `node`
        by this bind (its POD_NODE, POD_ALLOCATED and bind time are ours; the kubelet's Allocate may already
        have rewritten the rest). A Binding the API server refused did not bind it (a 409: it was bound by
        another, or changed since its annotations were written). The take-back is a patch conditional on the
        version read; a write in between (409) reads the pod again and decides once more, once."""
        if isinstance(why, KubeError) and why.not_found:
            return None
        who = f"pod {ns}/{name}"
        for last in (False, True):
            try:
                pod = self.kube.get_pod(ns, name)
                meta = pod.get("metadata") or {}
                if meta.get("uid") != uid:
                    return None
                have = meta.get("annotations") or {}
                bound = (pod.get("spec") or {}).get("nodeName")
                if bound:
                    if bound == node and may_have_landed and all(have.get(k) == wrote.get(k)
                                                                 for k in _KEPT_ONCE_BOUND):
                        log.info("the Binding of %s got no answer (%s) but it landed: the pod is bound to %s",
                                 who, why, node)
                        return pod
                    log.warning("the Binding of %s failed (%s) but the pod is bound to %s: its annotations stay",
                                who, why, bound)
                    return None
                if not all(have.get(k) == wrote.get(k) for k in _WRITTEN):
                    log.warning("the Binding of %s failed (%s) and another writer has changed its allocation "
                                "annotations since: they stay as that writer left them", who, why)
                    return None
                back = {keys.POD_NODE: None, keys.POD_TO_ALLOCATE: None, keys.POD_ALLOCATED: None,
                        keys.POD_MIG_ALLOCATIONS: None, keys.POD_BIND_PHASE: keys.BIND_FAILED}
                self.kube.patch_pod(ns, name, {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                                            "annotations": back}})
                return None
            except KubeError as e:
                if e.conflict and not last:
                    log.info("%s changed while its annotations were being taken back (%s); reading it again",
                             who, e)
                    continue
                self._undo_failed(who, e)
            except KubeUnreachable as e:
                self._undo_failed(who, e)
            return None
        return None

    def _undo_failed(self, who: str, e: Exception) -> None:
        # left as written: the node over-counts this pod until the annotations are rewritten, never under
        self.metrics.undo_failed.inc()
        log.warning("could not take back the allocation annotations of %s after a failed bind: %s; they stay, "
                    "and its node counts its GPUs until they are rewritten", who, e)
