"""Node liveness through the handshake annotation (HAMi pkg/device/devices.go CheckHealth, v2.10).

The scheduler asks each node's agent whether it is alive by writing `hami.io/node-handshake:
Requesting_<time>`; the agent answers by registering again, `Reported_<time>` (pyvgpu.cluster.node.agent, and
HAMi's device plugin alike). A node still showing the scheduler's request more than `grace_s` (60 s, as
HAMi) after it was made, and whose status no longer lists allocatable GPUs (`nvidia.com/gpu`), has lost
its agent: it takes no new pod until the agent answers. A request that cannot be read (no time, another
format) is taken as alive, as HAMi takes it. Times are written and read in UTC ("2006-01-02 15:04:05").

Kept apart from the decision core: `dead(node, now)` is pure; `Liveness` holds the verdicts the
scheduler's loop made and turns a dead node's NodeInfo into one that fits nothing, with the reason.
"""

from __future__ import annotations

import calendar
import logging
import threading
import time
from collections.abc import Callable, Iterable

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.model import NodeInfo

log = logging.getLogger("pyvgpu.cluster.scheduler.liveness")
GRACE_S = 60.0
_FORMAT = "%Y-%m-%d %H:%M:%S"


def requesting(now: float) -> str:
    return "Requesting_" + time.strftime(_FORMAT, time.gmtime(now))


def _allocatable(node: dict, resource: str) -> int:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        return int(str(raw)) if raw is not None else 0
    except ValueError:
        return 1  # a quantity this does not parse (e.g. "1k") is some GPUs: alive, as the safe reading


def dead(node: dict, now: float, grace_s: float = GRACE_S, resource: str = "nvidia.com/gpu") -> str | None:
    """Why the node's agent is taken for gone, or None while it is alive (or cannot be judged)."""
    hs = str(((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_HANDSHAKE, ""))
    if "Requesting" not in hs:
        return None
    _, sep, stamp = hs.partition("_")
    if not sep:
        return None
    try:
        asked = calendar.timegm(time.strptime(stamp, _FORMAT))
    except ValueError:
        return None
    if now < asked + grace_s:
        return None
    if _allocatable(node, resource) > 0:
        return None
    return (f"the node agent has not answered the handshake ({keys.NODE_HANDSHAKE}: {hs}) for {now - asked:.0f} s "
            f"and the node lists no allocatable {resource}: no new pod goes here until the agent registers again")


def needs_asking(node: dict) -> bool:
    """The scheduler asks (writes Requesting_<now>) wherever the handshake is not a request already."""
    hs = str(((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_HANDSHAKE, ""))
    return "Requesting" not in hs


class Liveness:
    def __init__(self, grace_s: float = GRACE_S, resource: str = "nvidia.com/gpu",
                 clock: Callable[[], float] = time.time) -> None:
        self.grace_s = grace_s
        self.resource = resource
        self.clock = clock
        self._lock = threading.Lock()
        self._dead: dict[str, str] = {}

    def check(self, nodes: Iterable[dict], ask: Callable[[str, str], None] | None = None) -> dict[str, str]:
        """Judge every node; ask the ones that are not asked yet (`ask(name, value)` writes the annotation).
        Returns the dead nodes with their reasons."""
        now = self.clock()
        verdicts = {}
        for n in nodes:
            name = str((n.get("metadata") or {}).get("name") or "")
            why = dead(n, now, self.grace_s, self.resource)
            if why:
                verdicts[name] = why
            elif ask is not None and needs_asking(n):
                try:
                    ask(name, requesting(now))
                except Exception as e:  # one node's failed write must not stop the others' checks
                    log.warning("could not ask node %s for its handshake: %s", name, e)
        with self._lock:
            for name in verdicts.keys() - self._dead.keys():
                log.warning("node %s: %s", name, verdicts[name])
            self._dead = verdicts
        return dict(verdicts)

    def apply(self, infos: list[NodeInfo]) -> list[NodeInfo]:
        """`infos` with every dead node replaced by one that fits nothing, saying why."""
        with self._lock:
            dead_now = dict(self._dead)
        if not dead_now:
            return infos
        return [NodeInfo(i.name, error=dead_now[i.name]) if i.name in dead_now and not i.error else i for i in infos]
