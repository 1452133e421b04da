"""`pyvgpu bench latency`: an inference service beside a training loop, judged by the service's tail latency.

A decode service (pyvgpu/bench/latency_worker.py: requests arriving at random, one served at a time) and a
training loop (the MLP of pyvgpu/bench/sm_worker.py) share one GPU. The same arrivals are replayed in each
scenario:

* ``solo``: the service alone and the training loop alone, without pyvgpu (the references);
* ``sliced``: both side by side without pyvgpu (the GPU's own time slicing);
* ``pyvgpu``: the service wrapped with ``--priority high`` and a share (``--service-sm``: within it, it
  comes before every low-priority launch; without a share it would be best effort, after the training
  loop's share), the training loop with ``--priority low`` and a share (``--train-sm``, borrowing idle time
  unless ``--sm-cap``), taking turns;
* ``mps``: both wrapped with ``--mode mps`` (NVIDIA MPS runs them side by side, no share).

The goals (issue 27, item 6): the stacked service's p99 latency within 1.5 x its solo p99, and the training
loop getting at least 70% of what the service leaves idle (its solo throughput x (1 - the service's NVML
busy share alone)).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from pyvgpu.bench.common import machine, raw_env
from pyvgpu.bench.gpu_util import UtilSampler
from pyvgpu.bench.sm_run import LoadRun, turn_stats, wrapped_env
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group.limits import parse_percent
from pyvgpu.native import cache

SCENARIOS = ("sliced", "pyvgpu", "mps")
P99_GOAL = 1.5  # stacked p99 / solo p99
IDLE_GOAL = 0.70  # training's share of what the service leaves idle
WARM_FRACTION = 0.1  # the first requests of a run, left out (the stacked load's start-up)


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of xs: a value that was measured, never interpolated."""
    if not xs:
        raise PyvgpuError("no requests were served: give a longer --seconds or a higher --rate")
    s = sorted(xs)
    k = max(1, -(-len(s) * q // 100))  # ceil(n q / 100), at least the first
    return s[int(k) - 1]


def latencies(lines: list[str]) -> dict:
    """The service's figures from its ``L arrival latency service`` lines, the first WARM_FRACTION left out."""
    rows = []
    for line in lines:
        if line.startswith("L "):
            _, due, lat, svc = line.split()
            rows.append((int(due), int(lat), int(svc)))
    if not rows:
        raise PyvgpuError("the decode service printed no requests")
    kept = rows[int(len(rows) * WARM_FRACTION):] or rows
    lat_ms = [r[1] / 1e6 for r in kept]
    span = (kept[-1][0] + kept[-1][1] - kept[0][0]) / 1e9
    return {"requests": len(kept), "p50_ms": percentile(lat_ms, 50), "p90_ms": percentile(lat_ms, 90),
            "p99_ms": percentile(lat_ms, 99), "max_ms": max(lat_ms),
            "mean_service_ms": sum(r[2] for r in kept) / len(kept) / 1e6,
            "busy_host": sum(r[2] for r in kept) / 1e9 / span if span > 0 else None,
            "window_s": (kept[0][0] / 1e9, (kept[-1][0] + kept[-1][1]) / 1e9)}


class _Service:
    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, timeout: float) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise PyvgpuError("the decode service did not finish in time") from None
        if self.proc.returncode != 0:
            raise PyvgpuError(f"the decode service failed ({self.proc.returncode}): {err.strip()[-2000:]}")
        return latencies(out.splitlines())


def judge(result: dict) -> None:
    """Add each stacked scenario's ratios and whether it meets the goals, from the solo references."""
    solo, train_solo = result["solo"]["service"], result["solo"]["train_steps_per_s"]
    busy = result["solo"].get("service_busy_nvml")
    if busy is None:
        busy = solo.get("busy_host") or 0.0
    result["service_busy"] = busy
    idle_left = train_solo * max(0.0, 1.0 - busy)
    for s in result["scenarios"].values():
        s["p99_ratio"] = s["service"]["p99_ms"] / solo["p99_ms"]
        s["p50_ratio"] = s["service"]["p50_ms"] / solo["p50_ms"]
        s["train_of_solo"] = s["train_steps_per_s"] / train_solo
        s["train_of_idle"] = s["train_steps_per_s"] / idle_left if idle_left > 0 else None
        s["meets_p99"] = s["p99_ratio"] <= P99_GOAL
        s["meets_idle"] = s["train_of_idle"] is not None and s["train_of_idle"] >= IDLE_GOAL


def run(seconds: float = 30.0, rate: float = 4.0, tokens: int = 16, train_sm: int = 50, borrow: bool = True,
        scenarios: tuple[str, ...] = SCENARIOS, seed: int = 0, service_sm: int = 50) -> dict:
    if seconds < 5:
        raise PyvgpuError(f"--seconds {seconds}: give 5 or more (the first tenth of the requests is left out)")
    if rate <= 0:
        raise PyvgpuError(f"--rate {rate}: give the requests a second, a positive number")
    if tokens < 1:
        raise PyvgpuError(f"--tokens {tokens}: give 1 or more new tokens a request")
    parse_percent(str(train_sm), "--train-sm")
    parse_percent(str(service_sm), "--service-sm")
    for s in scenarios:
        if s not in SCENARIOS:
            raise PyvgpuError(f"--scenarios: {s!r} is not one of {', '.join(SCENARIOS)}")
    cache.ensure()
    raw = raw_env()
    service = [sys.executable, "-m", "pyvgpu.bench.latency_worker", str(seconds), str(rate), str(tokens), str(seed)]
    train = [sys.executable, "-m", "pyvgpu.bench.sm_worker", str(seconds + 20), "mlp"]  # outlasts the service
    limit = seconds * 4 + 180
    result: dict = {"bench": "latency", "machine": machine(), "seconds": seconds, "rate": rate, "tokens": tokens,
                    "train_sm": train_sm, "service_sm": service_sm, "borrow": borrow, "seed": seed, "scenarios": {},
                    "goals": {"p99_ratio": P99_GOAL, "train_of_idle": IDLE_GOAL}}
    util = UtilSampler()
    try:
        with tempfile.TemporaryDirectory(prefix="pyvgpu-bench-latency-") as tmpdir:
            tmp = Path(tmpdir)
            svc = _Service(service, raw)
            ref = svc.finish(limit)
            busy = util.mean(*ref["window_s"])  # the service's NVML busy share alone, over its requests
            result["solo"] = {"service": ref, "service_busy_nvml": None if busy is None else busy / 100}
            alone = LoadRun(train, raw, None, "training alone").finish(limit, util)
            result["solo"]["train_steps_per_s"] = alone["kernels_per_s"]
            for name in scenarios:
                env_s, env_t, path_t, turns = _pair_env(name, raw, tmp, train_sm, borrow, service_sm)
                t = LoadRun(train, env_t, path_t, f"training beside the service ({name})")
                s = _Service(service, env_s)
                got = s.finish(limit)
                tr = t.finish(limit, util)
                result["scenarios"][name] = {"service": got, "train_steps_per_s": tr["kernels_per_s"],
                                             "train_time_share_nvml": tr.get("time_share_nvml"),
                                             "turns": turn_stats(turns) if turns else {}}
    finally:
        LoadRun.kill_all()
        util.stop()
    judge(result)
    return result


def _pair_env(name: str, raw: dict[str, str], tmp: Path, train_sm: int, borrow: bool,
              service_sm: int) -> tuple[dict[str, str], dict[str, str], Path | None, Path | None]:
    """(service env, training env, the training group's region, the scenario's turn file)."""
    if name == "sliced":
        return raw, raw, None, None
    turns = tmp / f"{name}.turns"
    env = {**raw, envspec.SCHED.name: str(turns)}
    if name == "mps":
        e_s, _ = wrapped_env(env, None, tmp, "mps-service", mode="mps")
        e_t, p_t = wrapped_env(env, None, tmp, "mps-train", mode="mps")
        return e_s, e_t, p_t, None
    e_s, _ = wrapped_env(env, service_sm, tmp, "service", priority="high")
    e_t, p_t = wrapped_env(env, train_sm, tmp, "train", priority="low", sm_borrow=borrow)
    return e_s, e_t, p_t, turns


def table(result: dict) -> str:
    solo = result["solo"]["service"]
    lines = [f"pyvgpu bench latency on {result['machine']['gpu']}: a decode service ({result['rate']:g} requests/s "
             f"at random, {result['tokens']} new tokens each) beside an MLP training loop, {result['seconds']:g} s",
             f"  solo: service p50 {solo['p50_ms']:.1f} ms, p99 {solo['p99_ms']:.1f} ms ({solo['requests']} "
             f"requests, busy {100 * result['service_busy']:.0f}% of the GPU); training "
             f"{result['solo']['train_steps_per_s']:.1f} steps/s",
             f"  {'scenario':<8} {'p50 ms':>8} {'p99 ms':>8} {'p99/solo':>9} {'train/s':>8} {'of solo':>8} "
             f"{'of idle':>8}  goals (p99 <= {P99_GOAL:g}x, training >= {100 * IDLE_GOAL:.0f}% of idle)"]
    for name, s in result["scenarios"].items():
        idle = f"{100 * s['train_of_idle']:>7.0f}%" if s["train_of_idle"] is not None else "       -"
        ok = ("p99 ok" if s["meets_p99"] else "p99 MISSED") + ", " + ("idle ok" if s["meets_idle"] else "idle MISSED")
        lines.append(f"  {name:<8} {s['service']['p50_ms']:>8.1f} {s['service']['p99_ms']:>8.1f} "
                     f"{s['p99_ratio']:>8.2f}x {s['train_steps_per_s']:>8.1f} {100 * s['train_of_solo']:>7.0f}% "
                     f"{idle}  {ok}")
    lines.append(f"  pyvgpu: the service --priority high --sm {result.get('service_sm', 50)}, the training "
                 f"--priority low --sm {result['train_sm']}"
                 + (" --sm-borrow" if result["borrow"] else " --sm-cap") + "; mps: both --mode mps")
    return "\n".join(lines)
