"""Allocations in flight: what filter has promised and bind has not yet written (kube-scheduler's "assume").

kube-scheduler filters the next pod while the binds of the previous ones are still running (it keeps
several in flight). A filter that counts only what the cache has seen sends consecutive pods to the same
fullest node, and their binds then refuse each other ("no longer fits") or queue on the node's lock. So:

* filter reserves the GPUs of its first-ranked node for the pod (the node kube-scheduler takes unless its
  own scoring prefers another);
* bind reserves them again on the node kube-scheduler chose, before it takes the node's lock;
* the reservation ends when the bind is written to the cache (the annotations then count), when the bind
  fails, or after `ttl_s` (a pod that kube-scheduler never binds, e.g. another plugin refused it).

Filter counts every other pod's reservation on a node as if it were bound. Bind counts only the
reservations older than its own pod's: the later ones were planned with this pod already placed, and fit
is not symmetric (a GPU whose cores a later pod fills to 100% refuses a container that asks 0 cores, which
fitted before it). One reservation per pod: a new filter of the same pod replaces it (and makes it the
newest), bind's keeps its place in the order. Everything here is in memory and bounded by the number of
pods being scheduled at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from pyvgpu.cluster.core.decide import allocation_annotations
from pyvgpu.cluster.core.model import NodeInfo, PodDevices, PodRequest
from pyvgpu.cluster.core.place import placement_fits
from pyvgpu.cluster.core.quota import QuotaView, use_of
from pyvgpu.cluster.core.usage import add_pod

PodKey = tuple[str, str]
DEFAULT_TTL_S = 30.0
MAX_RESERVATIONS = 100_000  # far above any number of pods in flight; past it the oldest go first


@dataclass(frozen=True)
class Reservation:
    node: str
    devices: PodDevices
    n_init: int
    expires: float
    seq: int  # the order reservations were first made in


class InFlight:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._by_pod: dict[PodKey, Reservation] = {}
        self._by_node: dict[str, set[PodKey]] = {}
        self._seq = 0

    def reserve(self, pod: PodKey, node: str, devices: PodDevices, n_init: int = 0, keep_order: bool = False) -> None:
        """The pod's GPUs on `node` count from now on, until released or `ttl_s` from now. `keep_order`: the
        pod keeps its place among the reservations (bind moving filter's promise), else it is the newest."""
        with self._lock:
            old = self._by_pod.get(pod)
            if old is not None and keep_order:
                seq = old.seq
            else:
                self._seq += 1
                seq = self._seq
            self._drop(pod)
            if len(self._by_pod) >= MAX_RESERVATIONS:
                oldest = min(self._by_pod, key=lambda k: self._by_pod[k].expires)
                self._drop(oldest)
            self._by_pod[pod] = Reservation(node, devices, n_init, self.clock() + self.ttl_s, seq)
            self._by_node.setdefault(node, set()).add(pod)

    def promise(self, pod: PodKey) -> Reservation | None:
        """The pod's live reservation, if any."""
        with self._lock:
            r = self._by_pod.get(pod)
            return r if r is not None and r.expires > self.clock() else None

    def order(self, pod: PodKey) -> int | None:
        """The pod's place in the order of reservations, None when it has none."""
        with self._lock:
            r = self._by_pod.get(pod)
            return None if r is None else r.seq

    def release(self, pod: PodKey) -> None:
        with self._lock:
            self._drop(pod)

    def _drop(self, pod: PodKey) -> None:
        r = self._by_pod.pop(pod, None)
        if r is not None:
            keys = self._by_node.get(r.node)
            if keys is not None:
                keys.discard(pod)
                if not keys:
                    del self._by_node[r.node]

    def _expire(self, node: str, now: float) -> None:
        for k in [k for k in self._by_node.get(node, ()) if self._by_pod[k].expires <= now]:
            self._drop(k)

    def on_node(self, node: str, exclude: PodKey | None = None) -> list[tuple[PodKey, Reservation]]:
        """The live reservations on `node` of pods other than `exclude`."""
        with self._lock:
            if node not in self._by_node:
                return []
            self._expire(node, self.clock())
            return [(k, self._by_pod[k]) for k in self._by_node.get(node, ()) if k != exclude]

    def nodes(self) -> set[str]:
        with self._lock:
            return set(self._by_node)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_pod)

    def apply(self, infos: list[NodeInfo], exclude: PodKey | None = None,
              counted: Callable[[PodKey, str], bool] | None = None, before: int | None = None) -> list[NodeInfo]:
        """`infos` with the other pods' reservations counted: a node that has some is copied (the cache's own
        NodeInfo is shared and stays as the cache built it); the others are returned as they are.
        `counted(pod, node)`: the cache already counts that pod there (its bind was written), so its
        reservation is not counted twice. `before`: only reservations older than this place count."""
        with self._lock:
            promised = set(self._by_node)
        if not promised:
            return infos
        out = list(infos)
        for i in _positions(infos, promised):  # few: the rest stay as they are
            info = infos[i]
            held = self.on_node(info.name, exclude) if not info.error else []
            if counted is not None:
                held = [(k, r) for k, r in held if not counted(k, info.name)]
            if before is not None:
                held = [(k, r) for k, r in held if r.seq < before]
            if not held:
                continue
            copy = NodeInfo(info.name, [d.copy() for d in info.devices], info.pair_scores, info.error,
                            list(info.warnings))
            for (ns, name), r in held:
                add_pod(copy, r.devices, r.n_init, who=f"pod {ns}/{name} (being bound)")
            out[i] = copy
        return out


def _positions(infos: list[NodeInfo], names: set[str]) -> list[int]:
    """The positions of the nodes named in `names` (few) among `infos` (thousands), in order: searched in
    C (list.index) rather than a Python pass over every node."""
    all_names = list(map(_NAME, infos))
    out = []
    for name in names:
        i = -1
        try:
            while True:
                i = all_names.index(name, i + 1)
                out.append(i)
        except ValueError:
            pass
    out.sort()
    return out


_NAME = attrgetter("name")


def kept_promise(promise: Reservation | None, node: NodeInfo, req: PodRequest,
                 quota: QuotaView | None) -> dict[str, str] | None:
    """The annotations of the GPUs the pod was promised on `node`, when they still fit it as used now (and
    its namespace's quota); else None and bind decides afresh. Keeping the promised GPUs keeps the later
    pods' promises, which were planned around them, true."""
    if promise is None or promise.node != node.name or not placement_fits(node, req, promise.devices):
        return None
    if quota is not None and quota.reason(use_of(promise.devices, promise.n_init)) is not None:
        return None
    return allocation_annotations(node.name, promise.devices)
