"""The ranking filter gave each recent pod, for the prioritize call that follows it.

kube-scheduler calls prioritize right after filter, with the nodes that passed. Deciding again would
double the time per pod; the ranking filter computed a moment earlier answers it (a node's rank may have
moved by a bind since, which only shifts a preference: bind checks the node again under its lock).
Bounded: at most `size` pods, each for `ttl_s` seconds.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

PodKey = tuple[str, str]


class RecentRanks:
    def __init__(self, size: int = 4096, ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._ranks: OrderedDict[tuple[PodKey, str], tuple[float, list[str]]] = OrderedDict()

    def put(self, pod: PodKey, uid: str, ranked: list[str]) -> None:
        with self._lock:
            self._ranks[(pod, uid)] = (self.clock() + self.ttl_s, list(ranked))
            self._ranks.move_to_end((pod, uid))
            while len(self._ranks) > self.size:
                self._ranks.popitem(last=False)

    def get(self, pod: PodKey, uid: str, names: list[str]) -> list[str] | None:
        """The pod's ranking restricted to `names`, when filter ranked every one of them lately; else None."""
        with self._lock:
            got = self._ranks.get((pod, uid))
            if got is None or got[0] < self.clock():
                return None
            ranked = got[1]
        if names == ranked:  # kube-scheduler's prioritize names filter's answer, in its order
            return list(ranked)
        wanted = set(names)
        out = [n for n in ranked if n in wanted]
        return out if len(out) == len(wanted) else None
