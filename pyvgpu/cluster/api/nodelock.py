"""The per-node lock annotation `hami.io/mutex.lock`, in HAMi's format and with an expiry.

Value: `<time, RFC 3339>,<namespace>,<pod>` (HAMi pkg/util/nodelock/nodelock.go: GenerateNodeLockKeyByPod,
ParseNodeLock; a bare time is read as a lock without a holder). It is taken with a patch conditional on
the node's resourceVersion, so of two schedulers that saw the node unlocked exactly one gets it: the other
gets 409 Conflict and its bind fails, to be retried by kube-scheduler.

A lock is stale, and taken over, when
* it is older than `expire_s` (HAMi's default is 5 minutes, HAMI_NODELOCK_EXPIRE; pyvgpu's bind holds it
  for a handful of API calls, so a lock that old was left by a holder that died);
* its pod no longer exists (HAMi's rule too);
* its pod has finished binding (`hami.io/bind-phase` success or failed): a HAMi device plugin releases
  the lock after marking the phase, so a lock left past that point is left over.
A lock that cannot be parsed is stale too (it is logged).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from pyvgpu.cluster.api.kube import Kube, KubeError, annotations
from pyvgpu.cluster.core import keys
from pyvgpu.errors import PyvgpuError

LOCK_KEY = keys.NODE_LOCK
SEP = ","
DEFAULT_EXPIRE_S = 300.0

log = logging.getLogger("pyvgpu.cluster.api.nodelock")


class LockBusy(PyvgpuError):
    """The node is locked by another live bind."""


def lock_value(namespace: str, name: str, now: float | None = None) -> str:
    t = datetime.fromtimestamp(time.time() if now is None else now, tz=timezone.utc).replace(microsecond=0)
    return f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')}{SEP}{namespace}{SEP}{name}"


def parse(value: str) -> tuple[float, str, str]:
    """(unix time, namespace, pod) of a lock value; namespace and pod are '' for a bare time."""
    parts = value.split(SEP)
    if len(parts) not in (1, 3):
        raise ValueError(f"{LOCK_KEY}: {value!r} is neither TIME nor TIME,NAMESPACE,POD")
    text = parts[0].strip()
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{LOCK_KEY}: {text!r} is not an RFC 3339 time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp(), (parts[1] if len(parts) == 3 else ""), (parts[2] if len(parts) == 3 else "")


@dataclass
class NodeLock:
    kube: Kube
    expire_s: float = DEFAULT_EXPIRE_S

    def stale(self, value: str, now: float) -> str | None:
        """Why the lock `value` may be taken over, or None when its holder is live."""
        try:
            t, ns, name = parse(value)
        except ValueError as e:
            return str(e)
        if now - t > self.expire_s:
            return f"it is {now - t:.0f} s old (expiry {self.expire_s:g} s)"
        if not name:
            return None
        try:
            holder = self.kube.get_pod(ns, name)
        except KubeError as e:
            if e.not_found:
                return f"its pod {ns}/{name} no longer exists"
            raise
        phase = annotations(holder).get(keys.POD_BIND_PHASE)
        if phase in (keys.BIND_SUCCESS, keys.BIND_FAILED):
            return f"its pod {ns}/{name} has finished binding ({keys.POD_BIND_PHASE}: {phase})"
        return None

    def acquire(self, node: str, namespace: str, name: str, cached: dict | None = None) -> dict:
        """Take the node's lock for pod namespace/name; returns the node as it was written. Raises LockBusy.
        `cached`: the node as a cache last saw it; when it shows no lock, the lock is written conditionally on
        its resourceVersion without reading the node first. A node changed since (the cache's watch behind
        another writer) is read and decided again, as without a cached copy: refusing it turned every
        write the cache had not seen yet into a failed bind."""
        rv = ((cached or {}).get("metadata") or {}).get("resourceVersion")
        if rv and not annotations(cached).get(LOCK_KEY):
            try:
                return self._write(node, {LOCK_KEY: lock_value(namespace, name, time.time())}, rv)
            except LockBusy:
                pass  # the cached copy was behind: read the node and decide on it
        n = self.kube.get_node(node)
        meta = n.get("metadata") or {}
        current = annotations(n).get(LOCK_KEY)
        now = time.time()
        if current:
            mine = current.endswith(f"{SEP}{namespace}{SEP}{name}")
            why = None if mine else self.stale(current, now)
            if not mine and why is None:
                raise LockBusy(f"node {node} is locked by another bind ({LOCK_KEY}: {current}); kube-scheduler "
                               "tries again")
            if why:
                log.warning("taking over the lock of node %s (%s): %s", node, current, why)
        return self._write(node, {LOCK_KEY: lock_value(namespace, name, now)}, meta.get("resourceVersion"))

    def _write(self, node: str, annos: dict, rv: str | None) -> dict:
        try:
            return self.kube.patch_node(node, {"metadata": {"annotations": annos, "resourceVersion": rv}})
        except KubeError as e:
            if e.conflict:
                raise LockBusy(f"node {node} changed while its lock was being taken (another scheduler's bind?); "
                               "kube-scheduler tries again") from None
            raise

    def release(self, node: str, namespace: str, name: str, tries: int = 3,
                locked: dict | None = None) -> dict | None:
        """Remove the lock if this pod holds it (another holder's lock is left alone); returns the node as
        written, if it was. `locked`: the node as acquire() wrote it; unchanged since (its resourceVersion),
        the lock is still this pod's and goes without a read."""
        rv = ((locked or {}).get("metadata") or {}).get("resourceVersion")
        if rv and str(annotations(locked).get(LOCK_KEY, "")).endswith(f"{SEP}{namespace}{SEP}{name}"):
            try:
                return self.kube.patch_node(node, {"metadata": {"annotations": {LOCK_KEY: None},
                                                                "resourceVersion": rv}})
            except KubeError as e:
                if not e.conflict:
                    raise
        for _ in range(tries):
            n = self.kube.get_node(node)
            current = annotations(n).get(LOCK_KEY)
            if not current or not current.endswith(f"{SEP}{namespace}{SEP}{name}"):
                return None
            try:
                rv = n["metadata"].get("resourceVersion")
                unlock = {"metadata": {"annotations": {LOCK_KEY: None}, "resourceVersion": rv}}
                return self.kube.patch_node(node, unlock)
            except KubeError as e:
                if not e.conflict:
                    raise
        log.error("could not release the lock of node %s after %d tries; it expires in %g s", node, tries,
                  self.expire_s)
        return None
