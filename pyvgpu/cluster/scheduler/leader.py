"""Which of several scheduler replicas leads (issue 30, item 12): the one whose kube-scheduler holds the Lease.

With several replicas the kube-schedulers elect a leader through a Lease (coordination.k8s.io/v1; the
chart names it kube-scheduler in the release namespace) and only the leader calls its own pod's extender,
so filter and bind run on one replica. What an extender does on its own, asking every node's agent for
its handshake, must run on that replica too, or each replica writes every node twice a minute. As HAMi's
scheduler does (v2.10 pkg/util/leaderelection, fed by a Lease informer), the extender does not take part
in the election: it reads the Lease its kube-scheduler writes and leads while

  * the Lease's holderIdentity is its own pod's (client-go writes `<hostname>_<uuid>`, and the two
    containers of the pod share the hostname), and
  * the Lease was seen to change less than leaseDurationSeconds ago, by this process's own clock (a holder
    that stopped renewing has lost it by then; clocks of other machines are not trusted).

Different on purpose: HAMi takes any holder that begins with the hostname, so the pod `sched-1` also
leads while `sched-12` holds the Lease; here the hostname must be followed by `_` or end the identity.
A Lease that cannot be read (none yet, no permission, the API server away) means not leading.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from pyvgpu.cluster.api.kube import Kube, KubeError, KubeUnreachable

log = logging.getLogger("pyvgpu.cluster.scheduler.leader")
READ_S = 2.0  # how often the Lease is read; kube-scheduler renews every 2 s by default (retryPeriod)


class LeaseLeader:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or socket.gethostname()
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: tuple | None = None  # (holder, renewTime, leaseDurationSeconds) last read
        self._seen_at = float("-inf")  # when it last changed, by our clock
        self._leading = False

    def _holds(self, holder: str | None) -> bool:
        return bool(holder) and (holder == self.identity or holder.startswith(self.identity + "_"))

    def observe(self) -> None:
        """Read the Lease once (a failed read leaves the last one seen, which expires by itself)."""
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
        except (KubeError, KubeUnreachable) as e:
            log.debug("lease %s/%s: %s", self.namespace, self.name, e)
            return
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        with self._lock:
            if record != self._seen:
                self._seen, self._seen_at = record, self.clock()

    def is_leader(self) -> bool:
        with self._lock:
            if self._seen is None:
                leading = False
            else:
                holder, _, duration = self._seen
                valid = isinstance(duration, int) and not isinstance(duration, bool) and duration > 0 \
                    and self.clock() < self._seen_at + duration
                leading = valid and self._holds(holder)
            if leading != self._leading:
                self._leading = leading
                log.info("this replica (%s) %s", self.identity, "leads: it asks nodes for their handshake" if leading
                         else "does not lead: another replica's kube-scheduler holds the lease, or none does")
        return leading

    def run(self, stop: threading.Event, every_s: float = READ_S) -> None:
        while not stop.is_set():
            self.observe()
            stop.wait(every_s)
