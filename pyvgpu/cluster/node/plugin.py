"""`pyvgpu cluster device-plugin`: the kubelet's device-plugin API v1beta1 over gRPC.

    plugin dir (/var/lib/kubelet/device-plugins)
      kubelet.sock                 the kubelet's Registration service
      pyvgpu-nvidia.com-gpu.sock   this plugin's DevicePlugin service

* Registers its resource at kubelet.sock, serves on a socket of its own in the same directory, and
  registers again when the kubelet restarts: a restarting kubelet removes the plugins' sockets and
  creates kubelet.sock anew; the plugin sees either (it looks every `poll` seconds) and starts over.
* ListAndWatch: split x GPUs virtual devices, `GPU-uuid::k` (HAMi's IDs: a node can move from HAMi's
  plugin to this one with the kubelet's checkpoint intact), each with its GPU's health and NUMA node; the
  list is sent again whenever a GPU's health changes.
* Allocate: pyvgpu.cluster.node.allocate; calls are taken one at a time (the pod search and the annotation
  pop must not interleave).
Neither registration nor ListAndWatch needs the API server.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from pyvgpu.cluster.node import gpus as G
from pyvgpu.cluster.node.allocate import AllocateError, Allocator
from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2 as pb
from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2_grpc as pbg
from pyvgpu.contract import envspec

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")

log = logging.getLogger("pyvgpu.cluster.node.plugin")


def socket_name(resource: str) -> str:
    return "pyvgpu-" + resource.replace("/", "-") + ".sock"


def device_ids(uuid: str, split: int) -> list[str]:
    return [f"{uuid}::{k}" for k in range(split)]


class Devices:
    """The node's GPUs and their health, watched: ListAndWatch and the node agent read it."""

    def __init__(self, gpus: list[G.GpuInfo], probe: Callable[[list[str]], dict[str, str | None]] = G.health):
        self.gpus = list(gpus)
        self.probe = probe
        self.cond = threading.Condition()
        self.version = 0
        self.health: dict[str, str | None] = {g.uuid: None for g in self.gpus}
        self.refresh()

    def refresh(self) -> bool:
        """Ask NVML again; True (and waiters woken) when some GPU's health changed."""
        new = self.probe([g.uuid for g in self.gpus])
        with self.cond:
            if new == self.health:
                return False
            for u, why in new.items():
                if why != self.health.get(u):
                    if why:
                        log.warning("GPU %s is unhealthy: %s", u, why)
                    else:
                        log.info("GPU %s is healthy again", u)
            self.health = dict(new)
            self.version += 1
            self.cond.notify_all()
            return True

    def snapshot(self) -> tuple[int, dict[str, str | None]]:
        with self.cond:
            return self.version, dict(self.health)

    def wait_change(self, seen: int, timeout: float) -> None:
        with self.cond:
            if self.version == seen:
                self.cond.wait(timeout)


class DevicePluginService(pbg.DevicePluginServicer):
    def __init__(self, devices: Devices, split: int, allocator: Allocator | None, stopping: threading.Event):
        self.devices = devices
        self.split = split
        self.allocator = allocator
        self.stopping = stopping
        self.lock = threading.Lock()

    def list_response(self, health: dict[str, str | None]) -> pb.ListAndWatchResponse:
        out = []
        for g in self.devices.gpus:
            state = UNHEALTHY if health.get(g.uuid) else HEALTHY
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=g.numa)])
            out += [pb.Device(ID=i, health=state, topology=topo) for i in device_ids(g.uuid, self.split)]
        return pb.ListAndWatchResponse(devices=out)

    def GetDevicePluginOptions(self, request, context):  # noqa: N802 (gRPC's names)
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request, context):  # noqa: N802
        seen = -1
        while context.is_active() and not self.stopping.is_set():
            version, health = self.devices.snapshot()
            if version != seen:
                seen = version
                yield self.list_response(health)
            self.devices.wait_change(seen, 0.5)

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        out = []
        for r in request.container_requests:
            must = list(r.must_include_deviceIDs)
            rest = [d for d in r.available_deviceIDs if d not in must]
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=(must + rest)[: r.allocation_size]))
        return pb.PreferredAllocationResponse(container_responses=out)

    def PreStartContainer(self, request, context):  # noqa: N802
        return pb.PreStartContainerResponse()

    def Allocate(self, request, context):  # noqa: N802
        reqs = [list(c.devices_ids) for c in request.container_requests]
        if self.allocator is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "this device plugin runs without the API server "
                                                       "(--no-api): it cannot allocate")
        with self.lock:
            try:
                answers = self.allocator.allocate(reqs)
            except AllocateError as e:
                log.error("Allocate %s: %s", reqs, e)
                context.abort(getattr(grpc.StatusCode, e.code, grpc.StatusCode.INTERNAL), str(e))
        for a in answers:
            log.info("Allocate: pod %s container %s gets %s", a.pod, a.container,
                     a.envs.get(envspec.CUDA_VISIBLE_DEVICES.name))
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(envs=a.envs, mounts=[pb.Mount(container_path=m.container_path,
                                                                       host_path=m.host_path, read_only=m.read_only)
                                                              for m in a.mounts]) for a in answers])


class PluginServer:
    """Serves the DevicePlugin service on its socket and keeps it registered with the kubelet."""

    def __init__(self, plugin_dir: Path, resource: str, service: DevicePluginService, poll: float = 0.5,
                 register_timeout: float = 5.0) -> None:
        self.dir = Path(plugin_dir)
        self.resource = resource
        self.service = service
        self.poll = poll
        self.register_timeout = register_timeout
        self.socket = self.dir / socket_name(resource)
        self.kubelet = self.dir / KUBELET_SOCKET
        self.server: grpc.Server | None = None
        self.registrations = 0

    def _serve(self) -> None:
        if self.server is not None:
            self.server.stop(0)
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="plugin"))
        pbg.add_DevicePluginServicer_to_server(self.service, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        self._socket_id = _ident(self.socket)
        log.info("serving %s on %s", self.resource, self.socket)

    def register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet}") as ch:
            pbg.RegistrationStub(ch).Register(pb.RegisterRequest(
                version=VERSION, endpoint=self.socket.name, resource_name=self.resource,
                options=pb.DevicePluginOptions(pre_start_required=False,
                                               get_preferred_allocation_available=False)),
                timeout=self.register_timeout)
        self.registrations += 1
        log.info("registered %s with the kubelet (%s)", self.resource, self.kubelet)

    def run(self, stop: threading.Event) -> None:
        """Serve and stay registered until `stop` is set."""
        if not self.dir.is_dir():
            raise FileNotFoundError(f"--plugin-dir {self.dir}: no such directory; is the kubelet's "
                                    "device-plugins directory mounted?")
        self._serve()
        registered_with = None
        try:
            while not stop.is_set():
                if _ident(self.socket) != self._socket_id:  # the kubelet removed it: it restarted
                    log.info("%s was removed (the kubelet restarted?): serving again", self.socket)
                    self._serve()
                    registered_with = None
                kubelet = _ident(self.kubelet)
                if kubelet is not None and kubelet != registered_with:
                    try:
                        self.register()
                        registered_with = kubelet
                    except grpc.RpcError as e:
                        log.warning("cannot register with the kubelet at %s: %s (trying again)", self.kubelet,
                                    e.details() if hasattr(e, "details") else e)
                stop.wait(self.poll)
        finally:
            self.service.stopping.set()
            if self.server is not None:
                self.server.stop(1)
            try:
                if _ident(self.socket) == self._socket_id:
                    self.socket.unlink()
            except OSError:
                pass


def _ident(p: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns
