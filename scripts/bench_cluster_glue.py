"""Latency of the Kubernetes glue against the test API server (tests/cluster/fake_apiserver.py).

    python scripts/bench_cluster_glue.py     (from the repository root, pyvgpu installed with '.[test]')

Prints: the extender's /filter over one keep-alive HTTP connection (as kube-scheduler calls it); filter and
bind in process over 20 registered nodes, 200 pods (bind makes 8 API calls through the official client);
Allocate over gRPC for one container, 50 pods. The figures in docs/cluster.md ("Measured") come from it.
"""

from __future__ import annotations

import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "cluster"), str(ROOT / "tests")]

from fake_apiserver import FakeApiServer, gpu_container, node, pod  # noqa: E402

from pyvgpu.cluster.api.kube import Kube  # noqa: E402
from pyvgpu.cluster.core import codec, keys  # noqa: E402
from pyvgpu.cluster.core.model import DeviceInfo  # noqa: E402
from pyvgpu.cluster.scheduler.extender import Scheduler  # noqa: E402
from pyvgpu.cluster.scheduler.extender_server import Server  # noqa: E402
from pyvgpu.cluster.scheduler.informer import Informer  # noqa: E402


def q(xs: list[float], k: float) -> float:
    return sorted(xs)[int(k * (len(xs) - 1))] * 1000


def main() -> None:
    api = FakeApiServer().start()
    tmp = Path(tempfile.mkdtemp())
    kube = Kube(str(api.kubeconfig(tmp / "kubeconfig.json")), timeout=5)
    names = [f"n{i}" for i in range(20)]
    for n in names:
        devs = [DeviceInfo(id=f"GPU-{n}-{i}", index=i, count=10, devmem=81920, devcore=100, type="NVIDIA A100",
                           numa=0, mode="hami-core", health=True) for i in range(8)]
        api.put_node(node(n, {keys.NODE_REGISTER: codec.encode_register(devs), keys.NODE_HANDSHAKE: "Reported_"}))
    stop = threading.Event()
    s = Scheduler(kube, informer=Informer(kube, watch_s=30, retry_s=0.1))
    s.start(stop)
    s.informer.ready.wait(10)

    srv = Server(s, 0, host="127.0.0.1")
    srv.start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port)
    a_pod = {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [{"name": "c"}]}}
    body = json.dumps({"Pod": a_pod, "NodeNames": []})
    http_ts = []
    for _ in range(30):
        t = time.perf_counter()
        conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
        conn.getresponse().read()
        http_ts.append(time.perf_counter() - t)
    srv.stop()
    print(f"/filter over one keep-alive connection: median {q(http_ts, .5):.2f} ms")

    f, b = [], []
    for i in range(200):
        p = api.put_pod(pod(f"p{i}", [gpu_container("main", 1, 4096, 10)]))
        deadline = time.monotonic() + 5
        while s.informer.pod("default", f"p{i}") is None and time.monotonic() < deadline:
            time.sleep(0.001)
        t = time.perf_counter()
        res = s.filter({"Pod": p, "NodeNames": names})
        f.append(time.perf_counter() - t)
        m = p["metadata"]
        t = time.perf_counter()
        out = s.bind({"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"],
                      "Node": res["NodeNames"][0]})
        b.append(time.perf_counter() - t)
        assert out == {"Error": ""}, out
    print(f"filter over {len(names)} nodes: median {q(f, .5):.2f} ms, p90 {q(f, .9):.2f} ms; "
          f"bind: median {q(b, .5):.2f} ms, p90 {q(b, .9):.2f} ms ({len(b)} pods)")
    stop.set()

    import test_cluster_plugin as T  # the plugin test's node: the production server, allocator and a kubelet

    n = T.Node(tmp, kube)
    api.put_node(node("node-a"))
    ts = []
    for i in range(50):
        api.put_pod(T.binding_pod(f"a{i}", to_allocate=f"{T.U0},NVIDIA,1024,10:;;"))
        t = time.perf_counter()
        n.allocate([f"{T.U0}::1"])
        ts.append(time.perf_counter() - t)
    n.close()
    print(f"Allocate, one container over gRPC: median {q(ts, .5):.1f} ms, max {max(ts) * 1000:.1f} ms ({len(ts)} pods)")
    api.stop()


if __name__ == "__main__":
    main()
