"""The cluster's GPU usage as the scheduler sees it, for Prometheus (item 11), under HAMi's metric names
(v2.10 cmd/scheduler/metrics.go) so that HAMi's dashboards read pyvgpu's scheduler:

    hami_gpu_memory_limit_bytes       a GPU's registered memory                      node, device_uuid,
    hami_gpu_memory_allocated_bytes   memory the pods on it hold (+ device_cores)    device_index,
    hami_gpu_core_limit_ratio         its registered cores (100 = the whole GPU)     device_type
    hami_gpu_core_allocated_ratio     cores the pods on it hold
    hami_gpu_shared_count             containers on it (slots taken)
    hami_node_gpu_memory_allocated_ratio   allocated / registered memory

Computed from the informer's cache when scraped (nothing is kept up to date between scrapes). Values in
HAMi's units: bytes for memory, percent of a GPU for cores (HAMi names them ratios).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyvgpu.cluster.core.model import NodeInfo

MIB = 1 << 20
_LABELS = ["node", "device_uuid", "device_index", "device_type"]


class UsageCollector:
    def __init__(self, nodes: Callable[[], Iterable[NodeInfo]]) -> None:
        """nodes(): every node with its usage (Informer.node_infos of every cached node)."""
        self.nodes = nodes

    def describe(self):
        return []  # collected on scrape only; nothing to check at registration

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        g = {name: GaugeMetricFamily(name, doc, labels=labels) for name, doc, labels in (
            ("hami_gpu_memory_limit_bytes", "A GPU's registered memory in bytes.", _LABELS),
            ("hami_gpu_memory_allocated_bytes", "Memory the pods on a GPU hold, in bytes.",
             ["node", "device_uuid", "device_index", "device_cores", "device_type"]),
            ("hami_gpu_core_limit_ratio", "A GPU's registered cores (100 = the whole GPU).", _LABELS),
            ("hami_gpu_core_allocated_ratio", "Cores the pods on a GPU hold (percent of the GPU).", _LABELS),
            ("hami_gpu_shared_count", "Containers on a GPU (slots taken).", _LABELS),
            ("hami_node_gpu_memory_allocated_ratio", "Allocated over registered memory of a GPU.", _LABELS))}
        for n in self.nodes():
            for d in n.devices:
                base = [n.name, d.id, str(d.index), d.type]
                g["hami_gpu_memory_limit_bytes"].add_metric(base, d.totalmem * MIB)
                g["hami_gpu_memory_allocated_bytes"].add_metric([n.name, d.id, str(d.index), str(d.totalcore), d.type],
                                                                d.usedmem * MIB)
                g["hami_gpu_core_limit_ratio"].add_metric(base, d.totalcore)
                g["hami_gpu_core_allocated_ratio"].add_metric(base, d.usedcores)
                g["hami_gpu_shared_count"].add_metric(base, d.used)
                if d.totalmem:
                    g["hami_node_gpu_memory_allocated_ratio"].add_metric(base, d.usedmem / d.totalmem)
        yield from g.values()
