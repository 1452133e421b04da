"""`pyvgpu exporter`: Prometheus metrics for every group under the runtime dir.

Each scrape reads the regions afresh (the same snapshot as `pyvgpu status`),
so the figures are as current as the scrape. Served with prometheus-client
on a plain WSGI server.
"""

from __future__ import annotations

from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pyvgpu import status as st


class RegionCollector(Collector):
    """Turns each scrape into a read of every group region."""

    def __init__(self, group: str | None = None, region_path: str | None = None) -> None:
        self.group = group
        self.region_path = region_path

    def collect(self) -> Iterator:
        limit = GaugeMetricFamily("pyvgpu_memory_limit_bytes", "The group's memory cap on the device (absent: none)",
                                  labels=["group", "device"])
        used = GaugeMetricFamily("pyvgpu_memory_used_bytes", "Device memory charged to a process of the group",
                                 labels=["group", "device", "pid", "kind"])
        group_used = GaugeMetricFamily("pyvgpu_group_memory_used_bytes",
                                       "Device memory the group holds (what the cap is checked against)",
                                       labels=["group", "device"])
        sm_limit = GaugeMetricFamily("pyvgpu_sm_limit_percent", "The group's compute share (absent: none)",
                                     labels=["group", "device"])
        sm_util = GaugeMetricFamily("pyvgpu_sm_utilization_percent",
                                    "The group's own utilization of the device, as its controller estimates it",
                                    labels=["group", "device"])
        oom = CounterMetricFamily("pyvgpu_oom_refusals", "Allocations refused for the group's cap",
                                  labels=["group", "device"])
        held = CounterMetricFamily("pyvgpu_throttle_seconds", "Time the group's launches were held for its share",
                                   labels=["group", "device"])
        launches = CounterMetricFamily("pyvgpu_launches", "Kernel and graph launches of a process of the group",
                                       labels=["group", "pid"])
        gpu = GaugeMetricFamily("pyvgpu_device_info", "The machine's device behind a group device (--devices)",
                                labels=["group", "device", "nvml_index", "uuid"])
        for g in st.collect(group=self.group, region_path=self.region_path):
            name = g["name"]
            for d in g["devices"]:
                dev = str(d["index"])
                if d["limit"]:
                    limit.add_metric([name, dev], d["limit"])
                group_used.add_metric([name, dev], d["used"])
                oom.add_metric([name, dev], d["oom_refusals"])
                sm = d["sm"]
                if sm["limit_percent"]:
                    sm_limit.add_metric([name, dev], sm["limit_percent"])
                    held.add_metric([name, dev], sm["throttled_s"])
                    if sm["group_utilization_percent"] is not None:
                        sm_util.add_metric([name, dev], sm["group_utilization_percent"])
            for p in g["processes"]:
                pid = str(p["pid"])
                launches.add_metric([name, pid], p["launches"])
                for dev, kinds in p["devices"].items():
                    for kind, n in kinds.items():
                        used.add_metric([name, dev, pid, kind], n)
            for x in g["gpus"] or []:
                gpu.add_metric([name, str(x["index"]), str(x["nvml_index"]), x["uuid"]], 1)
        yield from (limit, used, group_used, sm_limit, sm_util, oom, held, launches, gpu)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def server(port: int, address: str = "0.0.0.0", group: str | None = None,
           region_path: str | None = None) -> WSGIServer:
    """A server for /metrics on address:port (port 0: any free one; see ``server_port``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(group, region_path))
    return make_server(address, port, make_wsgi_app(registry), handler_class=_Quiet)
