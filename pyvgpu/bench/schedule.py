"""`pyvgpu bench schedule`: the scheduling core on a simulated cluster.

* Decision time: N nodes of 8 GPUs (A100 80 GB, split 10, two NUMA nodes, NVLink pairs), random pods
  already on them; the median time to decide one pod from the nodes already read (what a scheduler
  with a cache does), for one GPU and for four GPUs with and without topology-aware placement; and
  the time to read the whole cluster from `kubectl`-style dicts.
* Packing: pods arrive and leave (random sizes and lifetimes) on a fixed cluster; binpack against
  spread (node and GPU policy alike): GPUs in use, memory stranded on partly used GPUs, pods refused.

Everything random comes from one seeded generator, so a seed gives the same cluster, pods and
decisions; only the times vary.
"""

from __future__ import annotations

import gc
import heapq
import json
import os
import platform
import random
import statistics
import subprocess
import time
from typing import Any

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.decide import decide, decide_on
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.fit import fits
from pyvgpu.cluster.core.model import ContainerRequest, DeviceInfo, DeviceUsage, NodeInfo, PodRequest
from pyvgpu.cluster.core.usage import add_pod, node_infos

GPU_TYPE = "NVIDIA A100-SXM4-80GB"
GPU_MEM = 81920
GPUS = 8
SPLIT = 10
MEMS = (4096, 8192, 10240, 16384, 20480, 40960)
CORES = (0, 10, 20, 30, 50)
# The scheduler counts only the pods of its own schedulerName on a node: the bench's pods are the default one's.
SCHEDULER_NAME = ClusterConfig().scheduler_names[0]


def pair_scores(ids: list[str]) -> dict[str, dict[str, int]]:
    """A PCIe box with NVLink bridges: 0-1, 2-3, 4-5, 6-7 have 4 NVLinks (400); the same CPU 20; across CPUs
    10 (the link scores of docs/cluster.md)."""
    out: dict[str, dict[str, int]] = {}
    for i, a in enumerate(ids):
        out[a] = {}
        for j, b in enumerate(ids):
            if i != j:
                out[a][b] = 400 if i // 2 == j // 2 else 20 if i // 4 == j // 4 else 10
    return out


def node_dict(name: str) -> dict:
    ids = [f"GPU-{name}-{i}" for i in range(GPUS)]
    devs = [DeviceInfo(u, i, SPLIT, GPU_MEM, 100, GPU_TYPE, i // 4, keys.HAMI_CORE, True) for i, u in enumerate(ids)]
    annos = {keys.NODE_REGISTER: codec.encode_register(devs),
             keys.NODE_PAIR_SCORE: codec.encode_pair_scores(pair_scores(ids))}
    return {"kind": "Node", "metadata": {"name": name, "annotations": annos}}


def random_ask(rng: random.Random) -> tuple[int, int, int]:
    """(GPUs, MiB, cores) of a random pod: mostly one GPU, some two, four, a few whole GPUs."""
    r = rng.random()
    if r < 0.05:
        return rng.choice((1, 2)), GPU_MEM, 100
    nums = 1 if r < 0.85 else 2 if r < 0.95 else 4
    return nums, rng.choice(MEMS), rng.choice(CORES)


def capacity_pods(n_nodes: int) -> float:
    """How many pods of random_ask's mix the cluster holds on average: the scarcest of memory, cores and
    slots divided by what a pod takes of it on average."""
    whole, one, two, four = 0.05, 0.80, 0.10, 0.05
    mem = sum(MEMS) / len(MEMS)
    cores = sum(CORES) / len(CORES)
    per_pod = {  # (expected demand per pod, capacity)
        "memory": (whole * 1.5 * GPU_MEM + (one + 2 * two + 4 * four) * mem, GPU_MEM),
        "cores": (whole * 1.5 * 100 + (one + 2 * two + 4 * four) * cores, 100),
        "slots": (whole * 1.5 + one + 2 * two + 4 * four, SPLIT),
    }
    return min(cap * n_nodes * GPUS / demand for demand, cap in per_pod.values())


def pod_dict(name: str, nums: int, mem: int, cores: int, node: str | None = None, allocated: str | None = None) -> dict:
    limits = {"nvidia.com/gpu": str(nums), "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    pod: dict[str, Any] = {"kind": "Pod", "metadata": {"name": name, "namespace": "bench", "annotations": {}},
                           "spec": {"schedulerName": SCHEDULER_NAME,
                                    "containers": [{"name": "main", "resources": {"limits": limits}}]},
                           "status": {"phase": "Running" if node else "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"][keys.POD_ALLOCATED] = allocated
    return pod


def make_cluster(n_nodes: int, rng: random.Random, fill: float = 0.45) -> tuple[list[dict], list[dict]]:
    """Nodes and the pods on them: each node is filled with random pods to a random share (up to 2*fill) of
    its memory, each pod on random GPUs that can take it."""
    nodes, pods = [], []
    for n in range(n_nodes):
        name = f"node-{n:05d}"
        nodes.append(node_dict(name))
        devs = [DeviceUsage(f"GPU-{name}-{i}", i, SPLIT, GPU_MEM, 100, GPU_TYPE, i // 4, keys.HAMI_CORE, True)
                for i in range(GPUS)]
        target = rng.random() * 2 * fill * GPU_MEM * GPUS
        placed, misses = 0, 0
        while placed < target and misses < 5:
            nums, mem, cores = random_ask(rng)
            ctr = ContainerRequest("main", nums, mem, 100, cores)
            free = [d for d in devs if fits(d, ctr, mem)]
            if len(free) < nums:
                misses += 1
                continue
            chosen = rng.sample(free, nums)
            for d in chosen:
                d.used, d.usedmem, d.usedcores = d.used + 1, d.usedmem + mem, d.usedcores + cores
            enc = "".join(f"{d.id},{keys.DEVICE_TYPE},{mem},{cores}:" for d in chosen) + ";"
            pods.append(pod_dict(f"p-{n}-{len(pods)}", nums, mem, cores, name, enc))
            placed += nums * mem
    return nodes, pods


def request(nums: int, mem: int, cores: int, topology: bool = False, policy: str = keys.BINPACK) -> PodRequest:
    gpu = keys.BINPACK if policy == keys.BINPACK else keys.SPREAD
    return PodRequest("bench", "new", (ContainerRequest("main", nums, mem, 100, cores),), node_policy=policy,
                      gpu_policy=gpu, topology=topology)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def time_decisions(sizes: list[int], repeats: int, rng: random.Random) -> list[dict]:
    cfg = ClusterConfig()
    out = []
    cases = {"1 GPU": request(1, 8192, 30), "4 GPUs": request(4, 16384, 20),
             "4 GPUs topology-aware": request(4, 16384, 20, topology=True)}
    for n in sizes:
        nodes, pods = make_cluster(n, rng)
        t0 = time.perf_counter()
        infos = node_infos(nodes, pods, cfg)
        read_ms = (time.perf_counter() - t0) * 1000
        row: dict[str, Any] = {"nodes": n, "gpus": n * GPUS, "pods": len(pods), "read_ms": round(read_ms, 1)}
        pod = pod_dict("new", 4, 16384, 20)
        pod["metadata"]["annotations"][keys.GPU_POLICY] = keys.TOPOLOGY
        row["from_dicts_ms"] = round(_median_ms(lambda nodes=nodes, pods=pods, pod=pod: decide(nodes, pods, pod, cfg),
                                                max(1, min(repeats, 3))), 1)
        # A scheduler keeps the nodes' usage, not the dumps: drop them, so the garbage collector does not walk
        # a million dicts no scheduler would hold while the decisions are timed.
        del nodes, pods
        gc.collect()
        for name, req in cases.items():
            d = decide_on(infos, req, cfg)
            row[name] = {"ms": round(_median_ms(lambda req=req, infos=infos: decide_on(infos, req, cfg), repeats), 2),
                         "fit_nodes": len(d.feasible), "node": d.node}
        out.append(row)
    return out


def _snapshot(infos: list[NodeInfo]) -> tuple[int, int, int]:
    in_use = stranded = total_used = 0
    for n in infos:
        for d in n.devices:
            if d.used:
                in_use += 1
                total_used += d.usedmem
                stranded += d.totalmem - d.usedmem
    return in_use, stranded, total_used


def pack(policy: str, n_nodes: int, arrivals: int, seed: int, load: float) -> dict:
    """Arrivals with random asks and lifetimes on `n_nodes` nodes; the same stream for every policy.

    One pod arrives per step and lives an exponential number of steps, with a mean of `load` times the
    pods the cluster holds (capacity_pods): load 1 offers as much as fits on average."""
    rng = random.Random(seed)
    cfg = ClusterConfig()
    infos = node_infos([node_dict(f"node-{i:03d}") for i in range(n_nodes)], [], cfg)
    by_name = {n.name: n for n in infos}
    mean_life = load * capacity_pods(n_nodes)
    leaving: list[tuple[float, int, str, tuple]] = []
    refused = {"1 GPU": 0, "2+ GPUs": 0}
    asked = {"1 GPU": 0, "2+ GPUs": 0}
    samples = []
    decide_s = 0.0
    for k in range(arrivals):
        now = float(k)
        while leaving and leaving[0][0] <= now:
            _, _, node, pd = heapq.heappop(leaving)
            add_pod(by_name[node], pd, 0, -1)
        nums, mem, cores = random_ask(rng)
        life = rng.expovariate(1 / mean_life)
        kind = "1 GPU" if nums == 1 else "2+ GPUs"
        asked[kind] += 1
        t0 = time.perf_counter()
        d = decide_on(infos, request(nums, mem, cores, policy=policy), cfg)
        decide_s += time.perf_counter() - t0
        if d.node is None:
            refused[kind] += 1
        else:
            add_pod(by_name[d.node], d.devices, 0, 1)
            heapq.heappush(leaving, (now + life, k, d.node, d.devices))
        if k >= arrivals // 5 and k % 50 == 0:  # after a warm-up fifth, sample the state
            samples.append(_snapshot(infos))
    gib = 1024
    return {
        "policy": policy,
        "load": load,
        "arrivals": arrivals,
        "refused": sum(refused.values()),
        "refused_by_size": refused,
        "asked_by_size": asked,
        "gpus": n_nodes * GPUS,
        "gpus_in_use_mean": round(statistics.mean(s[0] for s in samples), 1) if samples else 0,
        "stranded_gib_mean": round(statistics.mean(s[1] for s in samples) / gib, 1) if samples else 0,
        "used_gib_mean": round(statistics.mean(s[2] for s in samples) / gib, 1) if samples else 0,
        "decision_ms_mean": round(decide_s / max(arrivals, 1) * 1000, 3),
    }


def _machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = ""
    for where in (os.path.dirname(os.path.abspath(__file__)), os.getcwd()):  # a checkout, else where it runs
        try:
            r = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                               timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip():
            commit = f"{r.stdout.strip()} ({where})"
            break
    return {"cpu": cpu, "cpus": str(os.cpu_count()), "python": platform.python_version(),
            "commit": commit or "unknown (not a git checkout)"}


def run(sizes: str = "100,1000,5000", repeats: int = 20, arrivals: int = 10_000, pack_nodes: int = 50,
        seed: int = 1, loads: str = "0.8,1.0") -> dict:
    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise ClusterInputError("--sizes", f"{sizes!r}: give node counts separated by commas, e.g. 100,1000") from None
    if not size_list or any(s < 1 for s in size_list):
        raise ClusterInputError("--sizes", f"{sizes!r}: give positive node counts, e.g. 100,1000,5000")
    try:
        load_list = [float(x) for x in loads.split(",") if x.strip()]
    except ValueError:
        raise ClusterInputError("--loads", f"{loads!r}: give load factors separated by commas, e.g. 0.8,1.0") from None
    if any(x <= 0 for x in load_list):
        raise ClusterInputError("--loads", f"{loads!r}: load factors are positive, e.g. 0.8,1.0")
    rng = random.Random(seed)
    result: dict[str, Any] = {"machine": _machine(), "seed": seed, "gpus_per_node": GPUS, "split": SPLIT,
                              "decisions": time_decisions(size_list, repeats, rng)}
    if arrivals:
        result["packing"] = [pack(p, pack_nodes, arrivals, seed, x) for x in load_list
                             for p in (keys.BINPACK, keys.SPREAD)]
    return result


def table(result: dict) -> str:
    m = result["machine"]
    out = [f"machine: {m['cpu']} ({m['cpus']} CPUs), Python {m['python']}, commit {m['commit']}; seed {result['seed']}",
           "",
           "one decision (median ms), nodes of 8 GPUs with random pods on them:",
           f"  {'nodes':>6} {'pods':>7} {'1 GPU':>8} {'4 GPUs':>8} {'4 topo':>8} {'read':>9} {'from dicts':>11}"
           "  fit (1/4)"]
    for r in result["decisions"]:
        out.append(f"  {r['nodes']:>6} {r['pods']:>7} {r['1 GPU']['ms']:>8.2f} {r['4 GPUs']['ms']:>8.2f} "
                   f"{r['4 GPUs topology-aware']['ms']:>8.2f} {r['read_ms']:>9.1f} {r['from_dicts_ms']:>11.1f}  "
                   f"{r['1 GPU']['fit_nodes']}/{r['4 GPUs']['fit_nodes']}")
    out.append("  (read: parse every node and pod into usage once; from dicts: read + decide, as `cluster explain`)")
    if "packing" in result:
        p0 = result["packing"][0]
        out += ["", f"packing: {p0['arrivals']} arrivals with departures on {p0['gpus'] // GPUS} nodes "
                    f"({p0['gpus']} GPUs); means over the run after a warm-up fifth:",
                f"  {'load':>4} {'policy':<8} {'GPUs in use':>11} {'used GiB':>9} {'stranded GiB':>13} {'refused':>8} "
                f"{'1 GPU':>6} {'2+ GPUs':>8} {'ms/decision':>12}"]
        for p in result["packing"]:
            out.append(f"  {p['load']:>4} {p['policy']:<8} {p['gpus_in_use_mean']:>11} {p['used_gib_mean']:>9} "
                       f"{p['stranded_gib_mean']:>13} {p['refused']:>8} {p['refused_by_size']['1 GPU']:>6} "
                       f"{p['refused_by_size']['2+ GPUs']:>8} {p['decision_ms_mean']:>12}")
        out.append("  (load 1: pods live as long as it takes the mix to fill the cluster on average; stranded: free "
                   "memory on\n   GPUs that are partly used; refused: no node fits at arrival)")
    return "\n".join(out)


if __name__ == "__main__":
    print(json.dumps(run(sizes="100", arrivals=200), indent=1))
