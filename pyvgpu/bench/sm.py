"""`pyvgpu bench sm`: does a compute share hold?

A compute-bound load runs unlimited (raw, no pyvgpu), then alone under each
target share, then as a pair of groups at once. Achieved share = throughput
/ unlimited throughput, over the last two thirds of each run (the first
third is the controller's warm-up). While each run goes, the group's region
is sampled ten times a second for the controller's view (measured
utilization, cost scale, state), which the PNG plots.

Loads: ``spin`` (pv_bench's FMA-loop kernel, about 200 us, every SM busy),
``graph`` (the same kernel replayed as a CUDA graph of 10 launches) and
``matmul`` (PyTorch bf16 4096x4096 matmuls, pyvgpu/bench/sm_worker.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pyvgpu import cache, region, sched, wrap
from pyvgpu.bench.common import machine, raw_env
from pyvgpu.errors import PyvgpuError
from pyvgpu.limits import parse_percent
from pyvgpu.shim import BENCH_BIN

WORKLOADS = ("spin", "graph", "matmul")
KERNEL_NS = 200_000  # the spin kernel's target length
GOAL_POINTS = 5.0


def _calibrate(env: dict[str, str]) -> tuple[int, float]:
    """Iterations for a ~200 us spin kernel, and the kernel's measured ns."""
    iters, ns = 2000, 0.0
    for _ in range(2):
        p = subprocess.run([str(BENCH_BIN), "calibrate", str(iters)], env=env, capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            raise PyvgpuError(f"pv_bench calibrate failed: {p.stderr.strip() or p.stdout.strip()}")
        ns = json.loads(p.stdout.strip().splitlines()[-1])["kernel_ns"]
        if ns <= 0:
            break
        iters = max(1, round(iters * KERNEL_NS / ns))
    return iters, ns


def _command(workload: str, seconds: float, iters: int) -> list[str]:
    if workload == "matmul":
        return [sys.executable, "-m", "pyvgpu.bench.sm_worker", str(seconds)]
    return [str(BENCH_BIN), "sm", str(seconds), str(iters), "graph" if workload == "graph" else "kernel"]


class _Run:
    """One load process: its progress lines, and its group's region sampled while it runs."""

    def __init__(self, cmd: list[str], env: dict[str, str], region_path: Path | None) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.region_path = region_path
        self.progress: list[tuple[int, int]] = []
        self.series: list[dict] = []
        self.t0 = time.monotonic()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while self.proc.poll() is None and self.region_path is not None:
            time.sleep(0.1)
            try:
                r = region.open_region(self.region_path, writable=False)
            except PyvgpuError:
                continue
            os.close(r.fd)
            d = r.device(0)
            self.series.append({"t": round(time.monotonic() - self.t0, 3), "util": d.sm_util / 100,
                                "scale": (d.sm_scale or 65536) / 65536, "state": d.sm_state,
                                "throttle_s": d.sm_throttle_ns / 1e9})

    def finish(self, timeout: float) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise PyvgpuError("a bench load did not finish in time") from None
        self._sampler.join(timeout=1)
        if self.proc.returncode != 0:
            raise PyvgpuError(f"bench load {' '.join(self.proc.args)} failed ({self.proc.returncode}): "
                              f"{err.strip()[-2000:]}")
        for line in out.splitlines():
            if line.startswith("P "):
                _, t, n = line.split()
                self.progress.append((int(t), int(n)))
        if len(self.progress) < 3:
            raise PyvgpuError(f"bench load printed no progress: {out[-500:]} {err[-500:]}")
        t_first, t_last = self.progress[0][0], self.progress[-1][0]
        cut = t_first + (t_last - t_first) / 3
        start = next(p for p in self.progress if p[0] >= cut)
        end = self.progress[-1]
        rate = (end[1] - start[1]) / ((end[0] - start[0]) / 1e9)
        curve = [((t - t_first) / 1e9, (n1 - n0) / ((t - t0) / 1e9))
                 for (t0, n0), (t, n1) in zip(self.progress, self.progress[1:], strict=False) if t > t0]
        return {"kernels_per_s": rate, "curve": curve, "controller": self.series, **self._charged()}

    def _charged(self) -> dict:
        """What the limiter charged: launches and their mean estimated GPU time."""
        if self.region_path is None:
            return {}
        r = region.open_region(self.region_path, writable=False)
        os.close(r.fd)
        n = sum(r.slot(i).sm_launches[0] for i in range(r.header.n_slots))
        cost = sum(r.slot(i).sm_cost_ns[0] for i in range(r.header.n_slots))
        return {"launches_charged": n, "mean_cost_us": cost / n / 1000 if n else 0.0,
                "throttled_s": r.device(0).sm_throttle_ns / 1e9}


def _wrapped(base: dict[str, str], share: int, tmp: Path, name: str,
             mode: str = "hami-core") -> tuple[dict[str, str], Path]:
    path = tmp / f"{name}.region"
    return wrap.build_env(base, sm=str(share), region_path=str(path), mode=mode), path


def run(targets: str = "10,30,50,70,90", seconds: float = 8.0, workload: str = "spin", pair: str = "30,70",
        png: Path | None = Path("bench-sm.png"), mode: str = "hami-core") -> dict:
    if workload not in WORKLOADS:
        raise PyvgpuError(f"--workload {workload!r} is not one of {', '.join(WORKLOADS)}")
    shares = [parse_percent(t, "--targets") for t in targets.split(",") if t.strip()]
    pair_shares = [parse_percent(t, "--pair") for t in pair.split(",") if t.strip()]
    if pair_shares and len(pair_shares) != 2:
        raise PyvgpuError(f"--pair {pair!r}: give two shares, e.g. 30,70, or '' to skip the pair")
    if png is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PyvgpuError("the plot needs matplotlib: pip install 'pyvgpu[bench]' (or pass --png '' "
                              "to skip it)") from None
    if not BENCH_BIN.exists():
        raise PyvgpuError(f"{BENCH_BIN} is missing; reinstall pyvgpu")
    cache.ensure()
    raw = raw_env()
    iters, kernel_ns = _calibrate(raw) if workload != "matmul" else (0, 0.0)
    cmd = _command(workload, seconds, iters)
    limit = seconds * 4 + 120
    result: dict = {"bench": "sm", "machine": machine(), "workload": workload, "seconds": seconds, "mode": mode,
                    "spin_iters": iters, "spin_kernel_ns": kernel_ns, "runs": []}
    with tempfile.TemporaryDirectory(prefix="pyvgpu-bench-sm-") as tmpdir:
        tmp = Path(tmpdir)
        turns = sched.enabled(raw)
        raw.setdefault("PYVGPU_SCHED", str(tmp / "turns"))  # this bench's groups take turns among themselves
        result["turns"] = turns
        base = _Run(cmd, raw, None).finish(limit)
        result["unlimited_kernels_per_s"] = base["kernels_per_s"]
        for s in shares:
            env, path = _wrapped(raw, s, tmp, f"single-{s}", mode)
            r = _Run(cmd, env, path).finish(limit)
            result["runs"].append({"kind": "single", "target": s, **r,
                                   "achieved": 100 * r["kernels_per_s"] / base["kernels_per_s"]})
        if pair_shares:
            runs = []
            for i, s in enumerate(pair_shares):
                env, path = _wrapped(raw, s, tmp, f"pair{i}-{s}", mode)
                runs.append((s, _Run(cmd, env, path)))
            for s, run_ in runs:
                r = run_.finish(limit)
                result["runs"].append({"kind": "pair", "target": s, **r,
                                       "achieved": 100 * r["kernels_per_s"] / base["kernels_per_s"]})
        if turns and Path(raw["PYVGPU_SCHED"]).exists():
            result["turn_stats"] = sched.entries(Path(raw["PYVGPU_SCHED"]))
    for r in result["runs"]:
        r["error_points"] = r["achieved"] - r["target"]
    result["max_error_points"] = max((abs(r["error_points"]) for r in result["runs"]), default=0.0)
    result["goal_points"] = GOAL_POINTS
    if png is not None:
        plot(result, png)
        result["png"] = str(png)
    return result


def table(result: dict) -> str:
    lines = [f"pyvgpu bench sm on {result['machine']['gpu']}: workload {result['workload']}, "
             f"{result['seconds']:.0f} s per run (first third left out)"
             + (", shares enforced by NVIDIA MPS (--mode mps)" if result.get("mode") == "mps" else ""),
             f"  unlimited: {result['unlimited_kernels_per_s']:.1f} kernels/s"
             + (f" (spin kernel {result['spin_kernel_ns'] / 1000:.0f} us)" if result["spin_kernel_ns"] else ""),
             f"  {'run':<7} {'target':>6} {'achieved':>9} {'error':>7} {'util':>6} {'scale':>6} {'cost us':>8}"]
    for r in result["runs"]:
        last = r["controller"][-1] if r["controller"] else {"util": float("nan"), "scale": float("nan")}
        lines.append(f"  {r['kind']:<7} {r['target']:>5}% {r['achieved']:>8.1f}% {r['error_points']:>+6.1f} "
                     f"{last['util']:>5.0f}% {last['scale']:>6.3f} {r.get('mean_cost_us', 0):>8.1f}")
    lines.append(f"  largest error {result['max_error_points']:.1f} points (goal: within {result['goal_points']:.0f})")
    if not result.get("turns", True):
        lines.append("  groups time-sliced the GPU (PYVGPU_SM_TURN=0)")
    for t in result.get("turn_stats", []):
        lines.append(f"  turns (all runs): {t['handovers']} hand-overs, {t['drains']} waited "
                     f"{t['drain_ns'] / 1e6:.0f} ms for the holder's work, launches waited {t['wait_ns'] / 1e6:.0f} "
                     "ms for the turn")
    return "\n".join(lines)


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    xs = [0, 100]
    ax1.plot(xs, xs, color="grey", lw=1, label="ideal")
    ax1.fill_between(xs, [x - GOAL_POINTS for x in xs], [x + GOAL_POINTS for x in xs], color="grey", alpha=0.15,
                     label=f"±{GOAL_POINTS:.0f} points")
    for kind, marker in (("single", "o"), ("pair", "s")):
        rs = [r for r in result["runs"] if r["kind"] == kind]
        if rs:
            ax1.plot([r["target"] for r in rs], [r["achieved"] for r in rs], marker, label=kind, ms=8)
    ax1.set_xlabel("target share (%)")
    ax1.set_ylabel("achieved share = throughput / unlimited (%)")
    ax1.set_title(f"{result['workload']} on {result['machine']['gpu'][:40]}")
    ax1.set_xlim(0, 100)
    ax1.set_ylim(0, 105)
    ax1.legend()
    for r in result["runs"]:
        label = f"{r['kind']} {r['target']}%"
        if r["controller"]:
            line, = ax2.plot([c["t"] for c in r["controller"]], [c["util"] for c in r["controller"]], label=label)
            ax2.axhline(r["target"], color=line.get_color(), lw=0.6, ls=":")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("device utilization seen by the controller (%)")
    ax2.set_title("controller time series (NVML utilization; pair runs share the device)")
    ax2.set_ylim(0, 105)
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
