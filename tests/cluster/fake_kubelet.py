"""A test kubelet: the Registration service on DIR/kubelet.sock, and a client of the plugins' sockets.

`restart()` does what a restarting kubelet does to the directory: its server goes away, every socket in
DIR is removed (the plugins' too), and kubelet.sock is created anew.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2 as pb
from pyvgpu.cluster.node.deviceplugin.v1beta1 import api_pb2_grpc as pbg


class FakeKubelet(pbg.RegistrationServicer):
    def __init__(self, plugin_dir: Path) -> None:
        self.dir = Path(plugin_dir)
        self.socket = self.dir / "kubelet.sock"
        self.registrations: list[pb.RegisterRequest] = []
        self.cond = threading.Condition()
        self.server: grpc.Server | None = None

    def Register(self, request, context):  # noqa: N802
        with self.cond:
            self.registrations.append(request)
            self.cond.notify_all()
        return pb.Empty()

    def start(self) -> FakeKubelet:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None
        for p in self.dir.glob("*.sock"):
            p.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def wait_registrations(self, n: int, timeout: float = 20.0) -> pb.RegisterRequest:
        end = time.monotonic() + timeout
        with self.cond:
            while len(self.registrations) < n:
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for registration {n} ({len(self.registrations)} so far)")
                self.cond.wait(left)
            return self.registrations[n - 1]

    def plugin(self, endpoint: str) -> tuple[grpc.Channel, pbg.DevicePluginStub]:
        ch = grpc.insecure_channel(f"unix://{self.dir / endpoint}")
        return ch, pbg.DevicePluginStub(ch)
