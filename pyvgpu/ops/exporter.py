"""`pyvgpu exporter`: Prometheus metrics for every group under the runtime dir.

Each scrape reads the regions afresh (the same snapshot as `pyvgpu status`),
or shares the read of a scrape less than SCRAPE_CACHE_S ago, so many scrapers
cost one read. It runs beside dcgm-exporter:

* served by prometheus-client's threaded WSGI server, one thread per
  connection, so a half-open or slow client holds only its own thread and
  never delays a scrape;
* a stray file or folder in the runtime dir is skipped with one log line (on
  stderr, once per file and reason), never an HTTP 500;
* every per-device series carries ``UUID`` and ``gpu`` (the machine's index),
  the label names dcgm-exporter uses, so ``on(UUID)`` joins the two; the
  group's own device index is ``vgpu_device``. A MIG instance is labelled as
  dcgm-exporter labels it: its parent GPU's ``UUID`` and ``gpu``, with
  ``GPU_I_ID`` and ``GPU_I_PROFILE``;
* on a Kubernetes node (``--state-dir``) the series also carry ``pod``,
  ``namespace`` and ``container`` (dcgm-exporter's Kubernetes labels), and all
  of these labels come from the record the node agent wrote at Allocate
  (pyvgpu.cluster.node.records), never from the region, which the container can
  write;
* a private group (one `pyvgpu wrap` made for its program) with no live
  member left drops out at the next scrape; its file stays for the next wrap
  to remove (see ``_visible``).
"""

from __future__ import annotations

import errno
import platform
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from pyvgpu import __version__
from pyvgpu.contract import layout as L
from pyvgpu.host import devices
from pyvgpu.ops import status as st

DEVICE_LABELS = ["group", "vgpu_device", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace", "container"]
NO_PLACE = ("", "", "", "")  # gpu, UUID, GPU_I_ID, GPU_I_PROFILE unknown (absent in Prometheus)
NO_POD = ("", "", "")
MACHINE_TTL_S = 300.0  # NVML's device list is asked again after this long (devices rarely change)
# One read of the regions serves every scrape within this long: many scrapers at once cost one read
SCRAPE_CACHE_S = 1.0


def log(msg: str) -> None:
    print(f"pyvgpu exporter: {msg}", file=sys.stderr, flush=True)


class RegionCollector(Collector):
    """Turns each scrape into a read of every group region."""

    def __init__(self, group: str | None = None, region_path: Path | str | None = None,
                 machine=devices.machine, state_dir: Path | str | None = None, migs=None,
                 cache_s: float = SCRAPE_CACHE_S, clock=time.monotonic) -> None:
        self.group = group
        self.region_path = region_path
        self.state_dir = state_dir
        self._machine_fn = machine
        self._machine: list[devices.Gpu] | None = None
        self._machine_at = -MACHINE_TTL_S
        self._migs_fn = migs or _mig_instances
        self._migs: dict[str, devices.Gpu] = {}
        self._migs_at = -MACHINE_TTL_S
        self._noted: set[tuple[str, str]] = set()
        self._logged: set[tuple[str, str]] = set()
        # Scrapes may come at once (several Prometheus servers); reclaiming and reading one at a time is
        # cheap (milliseconds) and keeps two reclaims of one dead member apart.
        self._lock = threading.Lock()
        self._cache_s = cache_s
        self._clock = clock
        self._groups: list[dict] | None = None
        self._groups_at = 0.0

    def machine(self) -> list[devices.Gpu] | None:
        now = time.monotonic()
        if now - self._machine_at >= MACHINE_TTL_S:
            self._machine, self._machine_at = self._machine_fn(), now
        return self._machine

    def migs(self) -> dict[str, devices.Gpu]:
        """{MIG instance UUID: the instance} of this machine, asked of NVML at most every MACHINE_TTL_S."""
        now = time.monotonic()
        if now - self._migs_at >= MACHINE_TTL_S:
            self._migs, self._migs_at = {m.uuid: m for m in self._migs_fn() or []}, now
        return self._migs

    def _skip(self, path, why: str) -> None:
        key = (str(path), why)
        if key not in self._logged:
            self._logged.add(key)
            log(f"skipped {path}: {why}")

    def _note(self, path, why: str) -> None:
        key = (str(path), why)
        if key not in self._noted:
            self._noted.add(key)
            log(f"{path}: {why}; its series carry no pod or GPU labels")

    def gpu_of(self, g: dict) -> dict[int, tuple[str, str, str, str]]:
        """{group device: (machine index, UUID, GPU_I_ID, GPU_I_PROFILE)}, as far as it is known.

        With --devices the region records the devices (a MIG instance: its parent's
        index and its own UUID, turned here into dcgm-exporter's parent UUID, GPU
        instance id and profile). Without, group device d is the machine's device d
        (what the shim's NVML view assumes too), trusted only when the group was made
        seeing as many devices as this machine has: a group made in a container that
        sees fewer devices numbers them its own way.
        """
        if g["gpus"]:
            return {x["index"]: self._mig_place(x["nvml_index"], x["uuid"]) if x.get("mig")
                    else (str(x["nvml_index"]), x["uuid"], "", "") for x in g["gpus"]}
        gpus = self.machine()
        if gpus and g.get("n_physical") == len(gpus):
            return {x.index: (str(x.index), x.uuid, "", "") for x in gpus}
        return {}

    def _mig_place(self, index: int, uuid: str) -> tuple[str, str, str, str]:
        m = self.migs().get(uuid)
        if m is None:  # not (or no longer) on this machine: its own UUID, no parent to name
            return str(index), uuid, "", ""
        return str(m.index), m.parent, str(m.gi) if m.gi >= 0 else "", _profile(m.name)

    def cluster_labels(self, g: dict) -> tuple[str, dict[int, tuple[str, str, str, str]], tuple[str, str, str]]:
        """A region of a node's state dir (--state-dir): (group name, gpu_of's mapping, (pod, namespace,
        container)), from the directory's name and the node agent's record alone."""
        from pyvgpu.cluster.node import nodestate, records
        from pyvgpu.errors import PyvgpuError

        d = Path(g["path"]).parent
        uid, _, cname = d.name.partition("_")
        name = nodestate.region_name(uid, cname)
        try:
            rec = records.read(d)
        except PyvgpuError as e:
            self._note(d, str(e))
            return name, {}, NO_POD
        where = {}
        for i, e in enumerate(rec["gpus"][: L.MAX_DEVICES]):
            if isinstance(e, dict):
                idx, gi = e.get("index"), e.get("gpu_instance")
                where[i] = (str(idx) if isinstance(idx, int) else "", str(e.get("uuid") or ""),
                            str(gi) if isinstance(gi, int) and "mig_uuid" in e else "",
                            str(e.get("profile") or "") if "mig_uuid" in e else "")
        return name, where, (str(rec.get("pod") or ""), str(rec.get("namespace") or ""), cname)

    def collect(self) -> Iterator:
        with self._lock:
            if self._groups is None or self._clock() - self._groups_at >= self._cache_s:
                skipped: list = []
                self._groups = st.collect(group=self.group, region_path=self.region_path, skipped=skipped,
                                          strict=False, state_dir=self.state_dir)
                self._groups_at = self._clock()
                for path, why in skipped:
                    self._skip(path, why)
            groups = self._groups
        yield from self._families(groups)

    def _families(self, groups: list[dict]) -> Iterator:
        limit = GaugeMetricFamily("pyvgpu_memory_limit_bytes", "The group's memory cap on the device (absent: none)",
                                  labels=DEVICE_LABELS)
        used = GaugeMetricFamily("pyvgpu_memory_used_bytes", "Device memory charged to a process of the group",
                                 labels=[*DEVICE_LABELS, "pid", "kind"])
        group_used = GaugeMetricFamily("pyvgpu_group_memory_used_bytes",
                                       "Device memory the group holds (what the cap is checked against)",
                                       labels=DEVICE_LABELS)
        sm_limit = GaugeMetricFamily("pyvgpu_sm_limit_percent", "The group's compute share (absent: none)",
                                     labels=DEVICE_LABELS)
        sm_util = GaugeMetricFamily("pyvgpu_sm_utilization_percent",
                                    "The group's own utilization of the device, as its controller estimates it",
                                    labels=DEVICE_LABELS)
        oom = CounterMetricFamily("pyvgpu_oom_refusals", "Allocations refused for the group's cap",
                                  labels=DEVICE_LABELS)
        held = CounterMetricFamily("pyvgpu_throttle_seconds", "Time the group's launches were held for its share",
                                   labels=DEVICE_LABELS)
        launches = CounterMetricFamily("pyvgpu_launches", "Kernel and graph launches of a process of the group",
                                       labels=["group", "pid"])
        timed = CounterMetricFamily("pyvgpu_launch_timings", "Launches timed for the group's cost model, by how: "
                                    "gated (the kernel's own time), or why not", labels=[*DEVICE_LABELS, "how"])
        at_mean = CounterMetricFamily("pyvgpu_launches_at_mean", "Launches charged the process's mean timing: "
                                      "kernels with no estimate of their own yet", labels=DEVICE_LABELS)
        info = GaugeMetricFamily("pyvgpu_device_info", "The machine's device behind each group device",
                                 labels=[*DEVICE_LABELS, "modelName"])
        build = GaugeMetricFamily("pyvgpu_build_info", "The pyvgpu serving these metrics (always 1)",
                                  labels=["version", "python"])
        build.add_metric([__version__, platform.python_version()], 1)
        mode = GaugeMetricFamily("pyvgpu_group_mode", "Who enforces the group's limits: hami-core (pyvgpu) or mps "
                                 "(always 1; the share in pyvgpu_mps_active_threads_percent)", labels=["group", "mode"])
        mps_threads = GaugeMetricFamily("pyvgpu_mps_active_threads_percent",
                                        "Mode mps: the clients' active-thread percentage", labels=["group"])
        names = {x.uuid: x.name for x in self.machine() or []}
        for g in groups:
            if not _visible(g):
                continue
            if self.state_dir is not None and not (self.group or self.region_path):
                name, where, pod = self.cluster_labels(g)
            else:
                name, where, pod = g["name"], self.gpu_of(g), NO_POD
            mode.add_metric([name, g["mode"]], 1)
            if g["mps_active_threads"]:
                mps_threads.add_metric([name], g["mps_active_threads"])
            for d in g["devices"]:
                lab = _labels(name, where, d["index"], pod)
                if d["limit"]:
                    limit.add_metric(lab, d["limit"])
                group_used.add_metric(lab, d["used"])
                oom.add_metric(lab, d["oom_refusals"])
                sm = d["sm"]
                if sm["limit_percent"]:
                    sm_limit.add_metric(lab, sm["limit_percent"])
                    held.add_metric(lab, sm["throttled_s"])
                    for how, n in sm["timed"].items():
                        timed.add_metric([*lab, how], n)
                    at_mean.add_metric(lab, sm["at_mean"])
                    if sm["group_utilization_percent"] is not None:
                        sm_util.add_metric(lab, sm["group_utilization_percent"])
                if lab[3]:
                    info.add_metric([*lab, names.get(lab[3], "")], 1)
            for p in g["processes"]:
                pid = str(p["pid"])
                launches.add_metric([name, pid], p["launches"])
                for dev, kinds in p["devices"].items():
                    for kind, n in kinds.items():
                        used.add_metric([*_labels(name, where, int(dev), pod), pid, kind], n)
        yield from (limit, used, group_used, sm_limit, sm_util, oom, held, timed, at_mean, launches, info, build,
                    mode, mps_threads)


def _labels(name: str, where: dict[int, tuple[str, str, str, str]], d: int, pod: tuple[str, str, str]) -> list[str]:
    """DEVICE_LABELS of group device d; a label empty (absent in Prometheus) where unknown."""
    return [name, str(d), *where.get(d, NO_PLACE), *pod]


def _profile(name: str) -> str:
    """A MIG instance's profile from its NVML name ("NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> "1g.5gb")."""
    return name.rsplit(" MIG ", 1)[1].strip() if " MIG " in name else ""


def _mig_instances() -> list[devices.Gpu]:
    inv = devices.inventory()
    return inv[1] if inv else []


def _visible(g: dict) -> bool:
    """False for a private group with no member left: it drops out of the metrics at once.

    Its file is not removed here. A wrapped program joins its private group at
    start but becomes a member (a live slot) only at its first CUDA call, so a
    group with no live member may belong to a program still starting; hiding it
    costs nothing (it holds no memory), deleting it would split the group.
    """
    return bool(g["processes"]) or not st.is_private(g["path"])


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def server(port: int, address: str = "0.0.0.0", group: str | None = None,
           region_path: Path | str | None = None, state_dir: Path | str | None = None,
           cache_s: float = SCRAPE_CACHE_S) -> WSGIServer:
    """A threaded server for /metrics on address:port (port 0: any free one; see ``server_port``).

    IPv4 or IPv6 by the address, as prometheus-client's start_http_server
    chooses. The caller runs ``serve_forever`` (on any thread) and ``shutdown``.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(group, region_path, state_dir=state_dir, cache_s=cache_s))
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return make_server(address, port, make_wsgi_app(registry), server_class=Server, handler_class=_Quiet)


def listen_error(address: str, port: int, e: OSError) -> str:
    """Why the exporter cannot listen, and the option to change."""
    host = f"[{address}]" if ":" in address else address
    where = f"cannot listen on {host}:{port}"
    if isinstance(e, socket.gaierror) or e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return (f"{where}: {e.strerror}; give --address an address of this host (0.0.0.0 or :: for all, "
                "127.0.0.1 or ::1 for this host only)")
    if e.errno == errno.EADDRINUSE:
        return f"{where}: the port is in use; choose another --port"
    if e.errno == errno.EACCES:
        return f"{where}: {e.strerror} (ports below 1024 need root); choose another --port"
    return f"{where}: {e.strerror}"
