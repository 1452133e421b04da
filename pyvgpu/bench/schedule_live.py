"""`pyvgpu bench schedule --live-sizes 1000,5000`: the extender driven as kube-scheduler drives it.

A test API server (tests/cluster/fake_apiserver.py, so this runs from a checkout) holds N nodes of 8 GPUs
filled with random pods (bench.schedule.make_cluster); the extender (pyvgpu.cluster.scheduler.extender.Scheduler,
its informer listing and watching through the official client) serves HTTP on localhost. The driver is
kube-scheduler's loop with `nodeCacheCapable: true`: one pod at a time, POST /filter with every node's
name, POST /prioritize with the nodes that fit, the best-scored node taken, then POST /bind handed to one
of `inflight` workers (kube-scheduler binds asynchronously) while the next pod is filtered. A failed bind
puts the pod back at the end of the queue (kube-scheduler retries it), up to `attempts` times.

Reported: the pods placed before the run and the GPU slots they charge in the extender's cache (each GPU a
pod takes is one slot), pods bound per second (wall time of the whole run), the failed-bind rate, filter and bind
latency (p50, p99, as the driver sees them over HTTP), the first filter after the cache is ready, and
over-committed GPUs: after the run, every pod the API server holds is counted against every GPU, and a GPU
whose slots, memory or cores are over its registration is one.
"""

from __future__ import annotations

import http.client
import json
import random
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyvgpu.errors import PyvgpuError


def _fake_apiserver():
    """The test API server module from a checkout: the working directory's (or a directory above it, so that
    pytest run from tests/ finds it too), else the one beside the package."""
    import pyvgpu

    cwd = Path.cwd()
    for root in (cwd, *cwd.parents, Path(pyvgpu.__file__).resolve().parents[1]):
        d = root / "tests" / "cluster"
        if (d / "fake_apiserver.py").is_file():
            if str(d) not in sys.path:
                sys.path.insert(0, str(d))
            import fake_apiserver

            return fake_apiserver
    raise PyvgpuError("the live scheduling bench needs the test API server (tests/cluster/fake_apiserver.py): "
                      "run it from a pyvgpu checkout")


def _kind_of_failure(error: str) -> str:
    for words in ("no longer fits", "lock", "unreachable", "no longer exists", "deleted", "changed"):
        if words in error:
            return words
    return "other"


def _q(xs: list[float], k: float) -> float:
    return round(sorted(xs)[min(len(xs) - 1, int(k * len(xs)))] * 1000, 2) if xs else 0.0


class _Http:
    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: dict) -> Any:
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise PyvgpuError(f"{path}: HTTP {r.status}: {data[:200]!r}")
        return json.loads(data)


def overcommitted(nodes: list[dict], pods: list[dict]) -> int:
    """GPUs whose slots, memory or cores the pods on them exceed."""
    from pyvgpu.cluster.core.usage import node_infos

    bad = 0
    for n in node_infos(nodes, pods):
        for d in n.devices:
            if d.used > d.count or d.usedmem > d.totalmem or d.usedcores > d.totalcore:
                bad += 1
    return bad


def serve(n_nodes: int, new_pods: int, seed: int, policy: str) -> None:
    """The API server's process: build the cluster, serve it, print the port, stop when stdin closes."""
    from pyvgpu.bench import schedule as sim
    from pyvgpu.cluster.core import keys

    fa = _fake_apiserver()
    rng = random.Random(seed)
    api = fa.FakeApiServer()
    nodes, placed = sim.make_cluster(n_nodes, rng)
    for n in nodes:
        api.put_node(fa.node(n["metadata"]["name"], n["metadata"]["annotations"]))
    for p in placed:
        api.put_pod(fa.pod(p["metadata"]["name"], [p["spec"]["containers"][0]], namespace="bench",
                           node_name=p["spec"]["nodeName"], phase="Running", annotations=p["metadata"]["annotations"]))
    for i in range(new_pods):
        nums, mem, cores = sim.random_ask(rng)
        annos = {keys.NODE_POLICY: policy, keys.GPU_POLICY: policy}
        api.put_pod(fa.pod(f"new-{i}", [fa.gpu_container("main", nums, mem, cores)], namespace="bench",
                           annotations=annos))
    del nodes, placed
    api.start()
    print(api.port, flush=True)
    sys.stdin.read()
    api.stop()


def run_one(n_nodes: int, new_pods: int, inflight: int, seed: int, policy: str, attempts: int = 3) -> dict:
    import subprocess

    from pyvgpu.cluster.api.kube import Kube
    from pyvgpu.cluster.scheduler.extender import Scheduler
    from pyvgpu.cluster.scheduler.extender_server import Server
    from pyvgpu.cluster.scheduler.informer import Informer

    fa = _fake_apiserver()
    # The API server runs in a process of its own, as it does in a cluster (and so does not take the
    # extender's interpreter lock).
    code = (f"import sys; sys.path.insert(0, {str(Path(fa.__file__).parent)!r}); "
            f"from pyvgpu.bench.schedule_live import serve; serve({n_nodes}, {new_pods}, {seed}, {policy!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    srv = None
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.strip().isdigit():
            raise PyvgpuError(f"the test API server process did not start (it printed {line!r})")
        port = int(line)
        tmp = Path(tempfile.mkdtemp(prefix="pyvgpu-bench-"))
        kubeconfig = tmp / "kubeconfig.json"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
        kube = Kube(str(kubeconfig), timeout=60)
        t0 = time.perf_counter()
        s = Scheduler(kube, informer=Informer(kube, watch_s=300, retry_s=0.5))
        s.start(stop)
        if not s.informer.ready.wait(600):
            raise PyvgpuError(f"the extender's cache did not list {n_nodes} nodes in 600 s")
        ready_s = time.perf_counter() - t0
        srv = Server(s, 0, host="127.0.0.1")
        srv.start()
        names = sorted(s.informer.nodes)
        pending = [p for p in kube.list_pods().get("items") or []
                   if not (p.get("spec") or {}).get("nodeName")]
        pending.sort(key=lambda p: int(p["metadata"]["name"].split("-")[1]))
        pods_placed = len(s.informer.pods) - len(pending)
        # what the placed pods charge in the extender's cache before the run: a pod the cache holds but does
        # not count (another schedulerName, an annotation it cannot read) would leave its GPUs free
        slots_charged = sum(d.used for i in s.informer.all_node_infos() for d in i.devices)
        # kube-scheduler is a process of its own: the driver runs in one, so its JSON and HTTP work does
        # not share the extender's interpreter lock (as it did before: docs/cluster.md, "Measured")
        code = "from pyvgpu.bench.schedule_live import drive_main; drive_main()"
        job = json.dumps({"port": srv.port, "pending": pending, "names": names, "inflight": inflight,
                          "attempts": attempts})
        done = subprocess.run([sys.executable, "-c", code], input=job, capture_output=True, text=True,
                              timeout=DRIVE_TIMEOUT_S)
        if done.returncode != 0:
            raise PyvgpuError(f"the kube-scheduler-shaped driver failed: {done.stderr[-2000:]}")
        d = json.loads(done.stdout)
        filter_s, bind_s, outcome, reasons, errors = d["filter_s"], d["bind_s"], d["outcome"], d["reasons"], d["errors"]
        first_filter, run_s = d["first_filter"], d["run_s"]
        listing = kube.list_pods().get("items") or []
        binds = outcome["bound"] + outcome["failed_binds"]
        return {
            "nodes": n_nodes, "pods_placed": pods_placed, "slots_charged": slots_charged, "new_pods": new_pods,
            "policy": policy,
            "inflight": inflight, "cache_ready_s": round(ready_s, 2),
            "first_filter_ms": round((first_filter or 0) * 1000, 1),
            "bound": outcome["bound"], "unschedulable": outcome["unschedulable"], "gave_up": outcome["gave_up"],
            "bound_per_s": round(outcome["bound"] / run_s, 1) if run_s else 0.0,
            "failed_bind_rate": round(outcome["failed_binds"] / binds, 4) if binds else 0.0,
            "filter_ms": {"p50": _q(filter_s, 0.5), "p99": _q(filter_s, 0.99)},
            "bind_ms": {"p50": _q(bind_s, 0.5), "p99": _q(bind_s, 0.99)},
            "failed_bind_reasons": reasons,
            "failed_bind_errors": errors[:5],
            "overcommitted_gpus": overcommitted(kube.list_nodes().get("items") or [], listing),
        }
    finally:
        stop.set()
        if srv is not None:
            srv.stop()
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()

DRIVE_TIMEOUT_S = 3600  # the whole driven run; far above what 1000 pods take


def drive(port: int, pending: list[dict], names: list[str], inflight: int, attempts: int) -> dict:
    """kube-scheduler's loop against the extender at `port`: one pod at a time, filter then prioritize, the
    best-scored node bound by one of `inflight` workers while the next pod is filtered."""
    front = _Http(port)
    local = threading.local()
    lock = threading.Lock()
    filter_s: list[float] = []
    bind_s: list[float] = []
    outcome = {"bound": 0, "failed_binds": 0, "unschedulable": 0, "gave_up": 0}
    reasons: dict[str, int] = {}  # failed binds by kind
    errors: list[str] = []
    queue = deque((p, 1) for p in pending)

    def bind(p: dict, node: str, attempt: int) -> None:
        if not hasattr(local, "http"):
            local.http = _Http(port)
        m = p["metadata"]
        t = time.perf_counter()
        out = local.http.post("/bind", {"PodName": m["name"], "PodNamespace": m["namespace"],
                                        "PodUID": m["uid"], "Node": node})
        with lock:
            bind_s.append(time.perf_counter() - t)
            if not out.get("Error"):
                outcome["bound"] += 1
                return
            outcome["failed_binds"] += 1
            why = _kind_of_failure(str(out["Error"]))
            reasons[why] = reasons.get(why, 0) + 1
            errors.append(str(out["Error"]))
            if attempt < attempts:
                queue.append((p, attempt + 1))
            else:
                outcome["gave_up"] += 1

    first_filter = None
    slots = threading.BoundedSemaphore(inflight)
    running = [0]
    t_run = time.perf_counter()
    with ThreadPoolExecutor(inflight) as pool:
        while True:
            with lock:
                item = queue.popleft() if queue else None
            if item is None:
                with lock:
                    if not running[0] and not queue:  # nothing in flight and nothing queued
                        break
                time.sleep(0.001)
                continue
            p, attempt = item
            t = time.perf_counter()
            res = front.post("/filter", {"Pod": p, "NodeNames": names})
            dt = time.perf_counter() - t
            filter_s.append(dt)
            first_filter = dt if first_filter is None else first_filter
            fit = res.get("NodeNames") or []
            if not fit:
                outcome["unschedulable"] += 1
                continue
            prio = front.post("/prioritize", {"Pod": p, "NodeNames": fit})
            best = max(prio, key=lambda h: h["Score"])["Host"] if prio else fit[0]
            slots.acquire()
            with lock:
                running[0] += 1

            def job(p=p, best=best, attempt=attempt):
                try:
                    bind(p, best, attempt)
                finally:
                    with lock:
                        running[0] -= 1
                    slots.release()

            pool.submit(job)
    return {"filter_s": filter_s, "bind_s": bind_s, "outcome": outcome, "reasons": reasons, "errors": errors,
            "first_filter": first_filter, "run_s": time.perf_counter() - t_run}


def drive_main() -> None:
    """The driver's process: the job as JSON on stdin, the figures as JSON on stdout."""
    job = json.loads(sys.stdin.read())
    print(json.dumps(drive(job["port"], job["pending"], job["names"], job["inflight"], job["attempts"])))


def run(sizes: list[int], new_pods: int, inflight: int = 8, seed: int = 1, policy: str = "binpack") -> list[dict]:
    return [run_one(n, new_pods, inflight, seed, policy) for n in sizes]


def table(rows: list[dict]) -> str:
    out = ["kube-scheduler-shaped run (nodeCacheCapable; filter, prioritize, then bind with "
           f"{rows[0]['inflight'] if rows else 8} in flight; the test API server):",
           f"  {'nodes':>6} {'pods':>7} {'slots':>7} {'new':>5} {'policy':<8} {'bound/s':>8} {'failed binds':>13} "
           f"{'filter p50/p99 ms':>18} {'bind p50/p99 ms':>16} {'first filter':>13} {'ready s':>8} {'over':>5}"]
    for r in rows:
        out.append(f"  {r['nodes']:>6} {r['pods_placed']:>7} {r['slots_charged']:>7} {r['new_pods']:>5} "
                   f"{r['policy']:<8} "
                   f"{r['bound_per_s']:>8} {r['failed_bind_rate'] * 100:>12.2f}% "
                   f"{r['filter_ms']['p50']:>8}/{r['filter_ms']['p99']:<9} {r['bind_ms']['p50']:>7}/"
                   f"{r['bind_ms']['p99']:<8} {r['first_filter_ms']:>10} ms {r['cache_ready_s']:>8} "
                   f"{r['overcommitted_gpus']:>5}")
    out.append("  (pods: placed before the run; slots: the GPUs they take, as the extender's cache counts them;\n"
               "   bound/s over the whole run; failed binds: of all bind calls (a failed pod is retried up to "
               "3 times);\n   over: GPUs over their slots, memory or cores after the run; first filter: the "
               "first after the cache is ready)")
    return "\n".join(out)
