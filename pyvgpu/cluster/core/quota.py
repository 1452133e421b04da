"""Namespace GPU quotas in ResourceQuota objects (HAMi pkg/device/quota.go and nvidia fitQuota, v2.10).

A ResourceQuota's `spec.hard` may limit a namespace's GPU memory and cores with the keys
`limits.nvidia.com/gpumem` (MiB, multiplied by memoryFactor as the requests are) and
`limits.nvidia.com/gpucores` (percent of a GPU, summed over GPUs). What a namespace uses is the sum over
its pods that hold GPUs of their memory and cores (init containers collapsed as usage.collapse does).
A pod fits when its namespace's use plus the pod's stays within each limit; a limit of 0 refuses every
pod that asks that resource. HAMi lets the last quota it reads win when two quotas of one namespace
name the same key; pyvgpu takes the smallest (the order of quotas is not something a user controls).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.model import Placement, PodDevices
from pyvgpu.cluster.core.usage import collapse

MEM, CORES = "memory", "cores"


def quota_keys(cfg: ClusterConfig) -> dict[str, str]:
    """spec.hard key -> MEM or CORES."""
    return {f"limits.{cfg.resources.memory}": MEM, f"limits.{cfg.resources.cores}": CORES}


def limits_of(quota: dict, cfg: ClusterConfig) -> dict[str, int]:
    """The GPU limits one ResourceQuota sets (a value that is not a whole number is skipped, as HAMi skips it)."""
    from pyvgpu.cluster.core.errors import ClusterInputError
    from pyvgpu.cluster.core.request import parse_quantity

    hard = ((quota.get("spec") or {}).get("hard") or {})
    out: dict[str, int] = {}
    if not isinstance(hard, dict):
        return out
    for key, what in quota_keys(cfg).items():
        if key in hard:
            try:
                out[what] = parse_quantity(hard[key], key, "ResourceQuota", "8192")
            except ClusterInputError:
                continue
    if MEM in out:
        out[MEM] *= max(cfg.memory_factor, 1)
    return out


def use_of(pd: PodDevices, n_init: int, app_only: bool = False) -> tuple[int, int]:
    """(MiB, cores) a pod's GPUs count against its namespace."""
    mem = cores = 0
    for _, m, c, _, _ in collapse(pd, n_init, app_only).values():
        mem += m
        cores += c
    return mem, cores


def use_of_placements(placements: tuple[tuple[Placement, ...], ...], n_init: int) -> tuple[int, int]:
    return use_of(tuple(tuple(p.entry() for p in c) for c in placements), n_init)


@dataclass(frozen=True)
class QuotaView:
    """One namespace's limits and what its other pods use: what a decision checks the pod against."""

    namespace: str
    limits: dict[str, int]
    used: tuple[int, int] = (0, 0)

    def reason(self, need: tuple[int, int]) -> str | None:
        """Why the pod's (MiB, cores) do not fit the namespace's quota, or None."""
        for what, used, asked, unit in ((MEM, self.used[0], need[0], "MiB"), (CORES, self.used[1], need[1], "% cores")):
            limit = self.limits.get(what)
            if limit is not None and asked > 0 and used + asked > limit:
                return (f"namespace {self.namespace}'s ResourceQuota allows {limit} {unit} of GPU {what}; its pods "
                        f"use {used} and this pod asks {asked}")
        return None


@dataclass
class Quotas:
    """Every namespace's limits (from the ResourceQuotas seen) and use (kept per pod, incrementally)."""

    cfg: ClusterConfig = field(default_factory=ClusterConfig)
    _limits: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)  # (ns, quota name) -> limits
    _use: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (ns, pod) -> (MiB, cores)
    _ns_use: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_quota(self, quota: dict | None, key: tuple[str, str]) -> None:
        with self._lock:
            if quota is None:
                self._limits.pop(key, None)
            else:
                self._limits[key] = limits_of(quota, self.cfg)

    def clear_quotas(self) -> None:
        with self._lock:
            self._limits.clear()

    def set_pod(self, key: tuple[str, str], use: tuple[int, int] | None) -> None:
        """The pod's use now (None: it holds nothing, or is gone or ended)."""
        with self._lock:
            old = self._use.pop(key, None)
            tot = self._ns_use.setdefault(key[0], [0, 0])
            if old is not None:
                tot[0] -= old[0]
                tot[1] -= old[1]
            if use is not None and (use[0] or use[1]):
                self._use[key] = use
                tot[0] += use[0]
                tot[1] += use[1]

    def view(self, namespace: str, exclude: tuple[str, str] | None = None) -> QuotaView | None:
        """The namespace's QuotaView without `exclude`'s own use; None when no quota limits its GPUs."""
        with self._lock:
            limits: dict[str, int] = {}
            for (ns, _), lim in self._limits.items():
                if ns == namespace:
                    for what, v in lim.items():
                        limits[what] = min(v, limits.get(what, v))
            if not limits:
                return None
            mem, cores = self._ns_use.get(namespace, [0, 0])
            own = self._use.get(exclude) if exclude is not None else None
            if own is not None:
                mem, cores = mem - own[0], cores - own[1]
        return QuotaView(namespace, limits, (mem, cores))


def view_of(quotas: Any, pods: Any, namespace: str, cfg: ClusterConfig,
            exclude: tuple[str, str] | None = None) -> QuotaView | None:
    """A QuotaView from `kubectl get -o json` dumps (what `cluster explain --quotas` reads)."""
    from pyvgpu.cluster.core.usage import ended, init_done, items, pod_devices

    q = Quotas(cfg)
    for i, o in enumerate(items(quotas, "ResourceQuota")):
        m = o.get("metadata") or {}
        q.set_quota(o, (str(m.get("namespace") or "default"), str(m.get("name") or i)))
    for p in items(pods, "Pod"):
        m = p.get("metadata") or {}
        key = (str(m.get("namespace") or "default"), str(m.get("name") or ""))
        if key[0] != namespace or key == exclude or ended(p):
            continue
        try:
            pd = pod_devices(p)
        except Exception:  # an unreadable allocation is skipped here as for usage (usage.node_infos)
            continue
        q.set_pod(key, use_of(pd, len((p.get("spec") or {}).get("initContainers") or []), init_done(p)))
    return q.view(namespace)
