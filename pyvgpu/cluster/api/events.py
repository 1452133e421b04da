"""Kubernetes Events on the pods the scheduler handles (HAMi pkg/scheduler/event.go: the reasons
FilteringFailed, FilteringSucceed, BindingFailed, BindingSucceed), plus pyvgpu's LenientRead: what was
read leniently, as HAMi reads it (a value clamped, a word read as false, a pod's allocation skipped).

Events are written by one background thread from a bounded queue, so a filter or bind never waits on the
API server for them; when the queue is full an event is dropped (and counted), never a decision delayed.
The same (pod, reason, message) is written once per `repeat_s`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import datetime, timezone

log = logging.getLogger("pyvgpu.cluster.api.events")
FILTERING_FAILED = "FilteringFailed"
FILTERING_SUCCEED = "FilteringSucceed"
BINDING_FAILED = "BindingFailed"
BINDING_SUCCEED = "BindingSucceed"
LENIENT_READ = "LenientRead"
MAX_MESSAGE = 1024  # the API server refuses longer event messages


def event_body(pod: dict, reason: str, message: str, warning: bool, component: str, now: float) -> dict:
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'pod')}.", "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": meta.get("name"),
                           "uid": meta.get("uid")},
        "reason": reason, "message": message[:MAX_MESSAGE], "type": "Warning" if warning else "Normal",
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class Recorder:
    def __init__(self, kube, component: str, size: int = 1000, repeat_s: float = 60.0) -> None:
        """kube: a pyvgpu.cluster.api.kube.Kube (its create_event writes each Event)."""
        self.kube = kube
        self.component = component
        self.repeat_s = repeat_s
        self.dropped = 0
        self._q: queue.Queue = queue.Queue(maxsize=size)
        self._seen: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._run, args=(stop,), daemon=True, name="events").start()

    def record(self, pod: dict, reason: str, message: str, warning: bool = True) -> None:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"), meta.get("uid"), reason, message)
        now = time.time()
        with self._lock:
            if now < self._seen.get(key, 0.0):
                return
            if len(self._seen) > 10_000:  # bounded: forget the expired
                self._seen = {k: t for k, t in self._seen.items() if t > now}
            self._seen[key] = now + self.repeat_s
        try:
            self._q.put_nowait(event_body(pod, reason, message, warning, self.component, now))
        except queue.Full:
            self.dropped += 1

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                body = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.kube.create_event(body["metadata"]["namespace"], body)
            except Exception as e:  # an event is advice: a failure to write one is logged, never raised
                log.warning("could not write event %s on pod %s/%s: %s", body["reason"],
                            body["metadata"]["namespace"], body["involvedObject"]["name"], e)


def summary(failed: dict[str, str], n_nodes: int, show: int = 5) -> str:
    """A FilteringFailed message: the refusals grouped by reason, the commonest first, node names for each."""
    by_reason: dict[str, list[str]] = {}
    for node, why in failed.items():
        by_reason.setdefault(why.removeprefix("pyvgpu: "), []).append(node)
    groups = sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    parts = [f"{len(nodes)} node(s) ({', '.join(sorted(nodes)[:3])}{', ...' if len(nodes) > 3 else ''}): {why}"
             for why, nodes in groups[:show]]
    more = f"; and {len(groups) - show} other reason(s)" if len(groups) > show else ""
    return f"no node of {n_nodes} fits: " + "; ".join(parts) + more
