"""Re-run issue 29's attacks on the cluster side and the turn file, and print their figures as JSON.

Run it once per tree, with that tree's pyvgpu first on the path (the figures in docs/security.md):

    PYTHONPATH=/path/to/old/tree python scripts/cluster_attacks.py > before.json
    python scripts/cluster_attacks.py > after.json

Everything runs on this machine: the test API server (tests/cluster/fake_apiserver.py), the fake driver
(tests/fakecuda, built here) and pv_bench. Sections: topology (a 24- and a 64-GPU node, a topology-aware pod;
each decision in a child capped at 2 GiB of address space), http (the scheduler's listener), exporter (a
region grown to 1.3 M slots; 20 scrapers at once) and turns (pv_bench beside a turn-file attacker).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in ("tests", "tests/cluster", "tests/fakecuda"):
    sys.path.insert(0, str(ROOT / p))

TOPOLOGY_CHILD = """
import resource, sys, time
from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.decide import decide
from pyvgpu.cluster.core import keys
m, n = int(sys.argv[1]), int(sys.argv[2])
ids = [f"GPU-{i:02d}" for i in range(m)]
scores = {a: {b: (100 if int(a[4:]) // 8 == int(b[4:]) // 8 else 10) for b in ids if b != a} for a in ids}
nodes = nodelist(node("big", [gpu(u, i) for i, u in enumerate(ids)], scores=scores))
p = pod("p", containers=[ctr(gpus=n)], annotations={keys.GPU_POLICY: keys.TOPOLOGY})
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
t = time.perf_counter()
try:
    d = decide(nodes, podlist(), p, ClusterConfig())
    out = "placed" if d.node else "refused"
except MemoryError:
    out = "MemoryError at 2 GiB"
print(out, round(time.perf_counter() - t, 2), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def topology() -> dict:
    out = {}
    for m, n in ((16, 8), (24, 12), (64, 8)):
        r = subprocess.run([sys.executable, "-c", TOPOLOGY_CHILD, str(m), str(n)], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                           cwd=tempfile.gettempdir())  # not the tree's root: `-c` puts the cwd first on the path
        line = (r.stdout.strip().splitlines() or ["crashed"])[-1].rsplit(" ", 2)
        out[f"{m} GPUs, {n} asked"] = {"result": line[0], "seconds": float(line[1]), "peak_mb": int(line[2])} \
            if len(line) == 3 else {"result": r.stderr[-300:]}
    return out


def _raw(port: int, data: bytes, timeout: float = 15) -> str:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got.split(b"\r\n", 1)[0].decode() or "connection dropped"
    except OSError as e:
        return f"{type(e).__name__}"
    finally:
        s.close()


def http(work: Path) -> dict:
    from fake_apiserver import FakeApiServer

    from pyvgpu.cluster.api.kube import Kube
    from pyvgpu.cluster.scheduler.extender import Scheduler
    from pyvgpu.cluster.scheduler.extender_server import Server

    api = FakeApiServer().start()
    cert, key = work / "tls.crt", work / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    s = Scheduler(Kube(str(api.kubeconfig(work / "kubeconfig.json")), timeout=5))
    srv = Server(s, 0, tls_port=0, cert=str(cert), key=str(key))  # the default address
    srv.start()
    out = {"extender_address": srv.httpd.server_address[0]}
    try:
        review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "operation": "CREATE", "object": {"kind": "Pod", "metadata": {"name": "p"},
                                                          "spec": {"containers": [{"name": "c"}]}}}}).encode()
        idle = socket.create_connection(("127.0.0.1", srv.tls_port))
        t = time.perf_counter()
        try:
            req = urllib.request.Request(f"https://127.0.0.1:{srv.tls_port}/webhook", review,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10, context=ssl._create_unverified_context()) as r:
                out["webhook_beside_an_idle_connection"] = f"{r.status} in {time.perf_counter() - t:.2f} s"
        except OSError as e:
            out["webhook_beside_an_idle_connection"] = f"{type(e).__name__} after {time.perf_counter() - t:.1f} s"
        finally:
            idle.close()
        for name, head in (("content_length_-1", b"Content-Length: -1"), ("content_length_abc", b"Content-Length: abc"),
                           ("content_length_5MiB_unsent", b"Content-Length: %d" % (5 << 20))):
            out[name] = _raw(srv.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\n{}")
        deep = b"[" * 100_000 + b"]" * 100_000
        out["nesting_100000"] = _raw(srv.port, b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                                     % len(deep) + deep)
        bad = json.dumps({"request": {"uid": "u", "object": {"kind": "Pod", "spec": {"containers": ["x"]}}}}).encode()
        out["containers_not_objects"] = _raw(srv.port, b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: %d"
                                             b"\r\n\r\n" % len(bad) + bad)
        errors = []

        def one():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthz", timeout=30) as r:
                    r.read()
            except OSError as e:
                errors.append(type(e).__name__)

        threads = [threading.Thread(target=one) for _ in range(200)]
        for t_ in threads:
            t_.start()
        for t_ in threads:
            t_.join()
        out["200_concurrent_clients_failed"] = len(errors)
    finally:
        srv.stop()
        api.stop()
    return out


def exporter(work: Path) -> dict:
    from pyvgpu.contract import layout as L
    from pyvgpu.group import region
    from pyvgpu.ops import exporter as ex

    d = work / "state"
    d.mkdir()
    big = d / "big.region"
    region.create(big, region.GroupSpec("big", [0] * L.MAX_DEVICES), n_slots=1_300_000)
    srv = ex.server(0, "127.0.0.1", region_path=str(big))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}/metrics"

    def scrape() -> float:
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            r.read()
        return time.perf_counter() - t

    out = {"region_bytes": big.stat().st_size, "one_scrape_s": round(scrape(), 2)}
    times: list[float] = []
    threads = [threading.Thread(target=lambda: times.append(scrape())) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["20_scrapers_p50_s"] = round(statistics.median(times), 2)
    srv.shutdown()
    return out


def turns(work: Path) -> dict:
    from build import build
    from test_turn_attacks import _stall, _turns, _victim, _want_refresher

    fake = build(work / "fake")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYVGPU_", "CUDA_DEVICE_", "FAKE"))}
    env.update(LD_LIBRARY_PATH=str(fake), PYVGPU_MIN_MEMORY="1M", XDG_RUNTIME_DIR=str(work))
    out = {}
    cases = [("none, no share", [], None), ("none, --sm 50", ["--sm", "50"], None),
             ("active 10 s + qend 0.99 s ahead, no share", [], (_stall, 0.1, 10_000_000_000, 990_000_000)),
             ("active 0.9 s + qend 0.99 s ahead, no share", [], (_stall, 0.1, 900_000_000, 990_000_000)),
             ("active 0.9 s + qend 0.99 s ahead, --sm 30 --sm-borrow", ["--sm", "30", "--sm-borrow"],
              (_stall, 0.1, 900_000_000, 990_000_000))]
    if os.geteuid() == 0:
        cases.append(("want[0] refreshed every 0.2 ms, --sm 50", ["--sm", "50"], (_want_refresher,)))
    for i, (name, opts, attack) in enumerate(cases):
        d = work / f"t{i}"
        d.mkdir()
        t = _turns(d)
        fn = attack or (time.sleep, )
        args = (fn[0], str(t), *fn[1:]) if attack else (time.sleep, 3600)
        r = _victim(env, d, t, 10, opts, args)
        out[name] = {"kernels_per_s_after": round(r["rate_after"]), "turn_timeout": "turn_timeout" in r["events"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["topology", "http", "exporter", "turns"], action="append")
    a = ap.parse_args()
    import pyvgpu

    res = {"pyvgpu": str(Path(pyvgpu.__file__).parent), "machine": f"{os.cpu_count()}-core CPU box"}
    with tempfile.TemporaryDirectory(prefix="pyvgpu-attacks-") as tmp:
        for name, fn in (("topology", topology), ("http", http), ("exporter", exporter), ("turns", turns)):
            if a.only and name not in a.only:
                continue
            w = Path(tmp) / name
            w.mkdir()
            res[name] = fn() if name == "topology" else fn(w)
            print(json.dumps({name: res[name]}), file=sys.stderr, flush=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
