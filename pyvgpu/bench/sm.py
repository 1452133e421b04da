"""`pyvgpu bench sm`: does a compute share hold, and what does it cost?

A load runs unlimited (raw, no pyvgpu), then alone under each target share,
then in scenarios of two groups at once:

* ``pair``: two groups with shares (``--pair 30,70``), taking turns; with
  ``--sliced`` once more time-sliced (PYVGPU_SM_TURN=0), to compare (the
  neighbour scenario too);
  ``--priorities high,low`` gives the two groups priorities;
* ``neighbour``: a group with a share (``--neighbour-share``) beside a wrapped
  group without one (``--neighbour unlimited``);
* ``burst``: a group with ``--sm-borrow`` alone for half the run (it borrows
  the idle GPU), then a neighbour with a share joins: how long the neighbour's
  launches waited for the turn (the time to give it back) and the split after.

Every run reports its throughput share (throughput / the unlimited
throughput, over the last two thirds of the run: the first third is the
controller's warm-up) and its time share, as NVML saw the device and as the
turns counted it: the time the group held the device's turn, and the GPU
time its launches were charged (cost model x scale). Each scenario has a turn
file of its own, whose counters (hand-overs, gaps, drains, launches beside
the holder, longest wait) are reported with it.

Loads: ``spin`` (pv_bench's FMA-loop kernel, about 200 us, every SM busy),
``graph`` (the same kernel replayed as a CUDA graph of 10 launches),
``matmul`` (PyTorch bf16 4096x4096 matmuls) and ``mlp`` (PyTorch training
steps of a small MLP: kernels of tens of microseconds, launch-bound;
pyvgpu/bench/sm_worker.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyvgpu.bench.common import machine, raw_env
from pyvgpu.bench.gpu_util import UtilSampler
from pyvgpu.bench.sm_run import LoadRun, turn_stats, wrapped_env
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.group import turnfile as sched
from pyvgpu.group.limits import parse_percent
from pyvgpu.native import cache
from pyvgpu.native.shim import BENCH_BIN

WORKLOADS = ("spin", "graph", "matmul", "mlp", "decode", "allreduce", "tp-decode")
TORCH_WORKLOADS = WORKLOADS[2:]
NEIGHBOURS = ("none", "unlimited")
DRIFT_WARN = 0.05  # the raw rate's change between the first and the last run worth a warning
KERNEL_NS = 200_000  # the spin kernel's target length
GOAL_POINTS = 5.0
GIVE_BACK_GOAL_MS = 100.0


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
    if workload in TORCH_WORKLOADS:
        return [sys.executable, "-m", "pyvgpu.bench.sm_worker", str(seconds), workload]
    return [str(BENCH_BIN), "sm", str(seconds), str(iters), "graph" if workload == "graph" else "kernel"]


def _mean_ms(ns: int, n: int) -> str:
    return f"{ns / n / 1e6:.2f} ms" if n else "-"


def _shares(text: str, where: str, n: int | None = None) -> list[int]:
    out = [parse_percent(t, where) for t in text.split(",") if t.strip()]
    if n is not None and out and len(out) != n:
        raise PyvgpuError(f"{where} {text!r}: give {n} shares, e.g. 30,70, or '' to skip it")
    return out


def run(targets: str = "10,30,50,70,90", seconds: float = 8.0, workload: str = "spin", pair: str = "30,70",
        png: Path | None = Path("bench-sm.png"), neighbour: str = "none", neighbour_share: int = 50,
        sliced: bool = False, priorities: str | None = None, burst: bool = False, burst_share: int = 30,
        mode: str = "hami-core") -> dict:
    if workload not in WORKLOADS:
        raise PyvgpuError(f"--workload {workload!r} is not one of {', '.join(WORKLOADS)}")
    if mode == "mps" and (neighbour != "none" or burst or sliced or priorities):
        raise PyvgpuError("--neighbour, --burst, --sliced and --priorities measure pyvgpu's turns; "
                          "with --mode mps give only --targets and --pair")
    if neighbour not in NEIGHBOURS:
        raise PyvgpuError(f"--neighbour {neighbour!r} is not one of {', '.join(NEIGHBOURS)}")
    shares = _shares(targets, "--targets")
    pair_shares = _shares(pair, "--pair", 2)
    prios: list[str | None] = [None, None]
    if priorities:
        prios = [p.strip() for p in priorities.split(",")]
        if len(prios) != 2:
            raise PyvgpuError(f"--priorities {priorities!r}: give two, one per group of the pair, e.g. high,low")
        for p in prios:
            lim.parse_priority(p, "--priorities")
        if not pair_shares:
            raise PyvgpuError("--priorities applies to the pair: give --pair too")
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
    iters, kernel_ns = _calibrate(raw) if workload in ("spin", "graph") else (0, 0.0)
    cmd = _command(workload, seconds, iters)
    limit = seconds * 4 + 120
    result: dict = {"bench": "sm", "machine": machine(), "workload": workload, "seconds": seconds, "mode": mode,
                    "spin_iters": iters, "spin_kernel_ns": kernel_ns, "runs": [], "scenarios": {}}
    result["turns"] = sched.enabled(raw)
    util = UtilSampler()
    try:
        with tempfile.TemporaryDirectory(prefix="pyvgpu-bench-sm-") as tmpdir:
            tmp = Path(tmpdir)

            def scenario(name: str, sliced_: bool = False) -> dict[str, str]:
                env = {**raw, envspec.SCHED.name: str(tmp / f"{name}.turns")}  # its own turn counters
                if sliced_:
                    env[envspec.SM_TURN.name] = "0"
                return env

            base = LoadRun(cmd, raw, None, "unlimited, first").finish(limit, util)
            result["unlimited_kernels_per_s"] = rate = _baseline(base["kernels_per_s"], "first")
            result["unlimited_time_share_nvml"] = base["time_share_nvml"]

            def record(kind: str, target: int | None, r: dict, **extra) -> None:
                result["runs"].append({"kind": kind, "target": target, **r, **extra})

            for s in shares:
                env, path = wrapped_env(scenario(f"single-{s}"), s, tmp, f"single-{s}", mode=mode)
                record("single", s, LoadRun(cmd, env, path, f"alone at {s}").finish(limit, util))
            pairs = [("pair", False)] + ([("pair-sliced", True)] if sliced else [])
            for kind, sl in pairs if pair_shares else []:
                env0 = scenario(kind, sl)
                runs = []
                for i, s in enumerate(pair_shares):
                    env, path = wrapped_env(env0, s, tmp, f"{kind}{i}-{s}", priority=prios[i], mode=mode)
                    runs.append((s, prios[i], LoadRun(cmd, env, path, f"{kind} group {i + 1} at {s}")))
                for s, p, run_ in runs:
                    record(kind, s, run_.finish(limit, util), priority=p)
                result["scenarios"][kind] = turn_stats(Path(env0[envspec.SCHED.name]))
            neighbours = [("neighbour", False)] + ([("neighbour-sliced", True)] if sliced else [])
            for kind, sl in neighbours if neighbour == "unlimited" else []:
                env0 = scenario(kind, sl)
                env, path = wrapped_env(env0, neighbour_share, tmp, f"{kind}-share")
                env_n, path_n = wrapped_env(env0, None, tmp, f"{kind}-unlimited")
                a = LoadRun(cmd, env, path, f"{kind}: the group at {neighbour_share}")
                b = LoadRun(cmd, env_n, path_n, f"{kind}: the unlimited neighbour")
                record(kind, neighbour_share, a.finish(limit, util))
                record(f"{kind}-unlimited", None, b.finish(limit, util))
                result["scenarios"][kind] = turn_stats(Path(env0[envspec.SCHED.name]))
            if burst:
                result["burst"] = _burst(workload, iters, scenario("burst"), tmp, burst_share, seconds, limit, util)
                result["scenarios"]["burst"] = turn_stats(tmp / "burst.turns")
                result["burst"]["give_back_ms"] = result["scenarios"]["burst"].get("max_wait_ms")
            if result["runs"]:
                # The raw rate can move during a bench (clocks, the other GPU's state, a collective's
                # topology): measured again at the end, the shares are judged against the mean of both, and
                # the table says how far apart they were.
                after = _baseline(LoadRun(cmd, raw, None, "unlimited, last").finish(limit, util)["kernels_per_s"],
                                  "last")
                result["unlimited_after_kernels_per_s"] = after
                result["baseline_drift"] = after / rate - 1
                rate = (rate + after) / 2
    finally:
        LoadRun.kill_all()  # a pair's other group, when one failed: none is left running on the GPU
        util.stop()
    result["baseline_kernels_per_s"] = rate
    for r in result["runs"]:
        r["achieved"] = 100 * r["kernels_per_s"] / rate
        r["error_points"] = r["achieved"] - r["target"] if r["target"] is not None else None
    for part in ("alone", "with_neighbour", "neighbour") if result.get("burst") else ():
        b = result["burst"][part]
        b["achieved"] = 100 * b["kernels_per_s"] / rate  # on the same scale as the runs
    errors = [abs(r["error_points"]) for r in result["runs"] if r["error_points"] is not None
              and r["kind"] in ("single", "pair")]
    result["max_error_points"] = max(errors, default=0.0)
    result["goal_points"] = GOAL_POINTS
    if png is not None:
        plot(result, png)
        result["png"] = str(png)
    return result


def _burst(workload: str, iters: int, env0: dict[str, str], tmp: Path, share: int, seconds: float, limit: float,
           util: UtilSampler) -> dict:
    """A group with --sm-borrow alone, then a neighbour with a share joins half way (each part's share of
    the unlimited rate is added at the end, against the same baseline as the runs)."""
    env, path = wrapped_env(env0, share, tmp, "burst-borrower", sm_borrow=True)
    a = LoadRun(_command(workload, seconds, iters), env, path, f"burst: the borrower at {share}")
    time.sleep(seconds / 2)
    env_b, path_b = wrapped_env(env0, 50, tmp, "burst-neighbour")
    b = LoadRun(_command(workload, seconds / 2, iters), env_b, path_b, "burst: the neighbour at 50")
    rb = b.finish(limit, util)
    a.finish(limit, util)
    joined = b.progress[0][0] / 1e9
    alone = a.window(a.progress[0][0] / 1e9 + (joined - a.progress[0][0] / 1e9) / 3, joined, util)
    after = a.window(joined + (b.progress[-1][0] / 1e9 - joined) / 3, b.progress[-1][0] / 1e9, util)
    return {"share": share, "neighbour_share": 50,
            "alone": alone, "with_neighbour": after, "neighbour": rb,
            "give_back_goal_ms": GIVE_BACK_GOAL_MS}


def _unit(result: dict) -> str:
    return {"mlp": "steps", "matmul": "matmuls", "decode": "tokens", "allreduce": "all-reduces",
            "tp-decode": "tokens"}.get(result["workload"], "kernels")


def _baseline(rate: float, which: str) -> float:
    """An unlimited run's rate, which every share is a fraction of: one that made no progress fails the
    bench, instead of making every share infinite or zero."""
    if not rate > 0:
        raise PyvgpuError(f"the {which} unlimited run made no progress ({rate} a second): the load did not run; "
                          "check that it runs alone without pyvgpu")
    return rate


def _drift_lines(result: dict) -> list[str]:
    after, drift = result.get("unlimited_after_kernels_per_s"), result.get("baseline_drift")
    if after is None or drift is None:
        return []
    lines = [f"  unlimited again at the end: {after:.1f} {_unit(result)}/s ({100 * drift:+.1f}%); "
             "shares are of the mean of both"]
    if abs(drift) > DRIFT_WARN:
        lines.append(f"  warning: the raw rate moved more than {100 * DRIFT_WARN:.0f}% during the bench: "
                     "every share below is uncertain by about that much")
    return lines


def _num(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "-"


def _pct(x: float | None, width: int = 6) -> str:
    return f"{x:>{width - 1}.1f}%" if x is not None else " " * (width - 1) + "-"


def table(result: dict) -> str:
    lines = [f"pyvgpu bench sm on {result['machine']['gpu']}: workload {result['workload']}, "
             f"{result['seconds']:.0f} s per run (first third left out)"
             + (", shares enforced by NVIDIA MPS (--mode mps)" if result.get("mode") == "mps" else ""),
             f"  unlimited: {result['unlimited_kernels_per_s']:.1f} {_unit(result)}/s"
             + (f" (spin kernel {result['spin_kernel_ns'] / 1000:.0f} us)" if result["spin_kernel_ns"] else "")
             + (f", NVML {result['unlimited_time_share_nvml']:.0f}% busy"
                if result.get("unlimited_time_share_nvml") is not None else ""),
             "  throughput = throughput / unlimited (the mean of the first and last unlimited runs); time: NVML "
             "(the device, all groups on it), turns held, GPU time charged",
             f"  {'run':<20} {'target':>6} {'thruput':>8} {'error':>6} {'NVML':>6} {'turns':>6} {'charged':>8} "
             f"{'waited':>7} {'held':>6}"]
    for r in result["runs"]:
        name = r["kind"] + (f" ({r['priority']})" if r.get("priority") else "")
        target = f"{r['target']:>5}%" if r["target"] is not None else "  none"
        err = f"{r['error_points']:>+6.1f}" if r["error_points"] is not None else "      "
        lines.append(f"  {name:<20} {target} {_pct(r['achieved'], 9)} {err} {_pct(r.get('time_share_nvml'))} "
                     f"{_pct(r.get('time_share_turns'))} {_pct(r.get('time_share_charged'), 9)} "
                     f"{_pct(r.get('turn_wait_share'), 8)} {_pct(r.get('throttled_share'), 7)}")
    costs = [(r, r["cost"]) for r in result["runs"] if r.get("cost") and r["cost"].get("raw_us") is not None]
    if costs:  # what a launch was charged against what its timings read and the GPU was busy (sm_run.cost_figures)
        lines.append("  cost a launch (us): raw estimate / gated timing / NVML busy (the device's); launches charged "
                     "the mean timing")
        for r, c in costs:
            lines.append(f"  {r['kind']:<20} {r['target'] if r['target'] is not None else 'none':>5} "
                         f"{c['raw_us']:>8.1f} / {_num(c.get('gated_timing_us'))} / {_num(c.get('nvml_us'))}; "
                         f"{100 * (c.get('at_mean') or 0):.1f}% at {_num(c.get('at_mean_us'))}")
    lines.append(f"  largest error (single, pair) {result['max_error_points']:.1f} points "
                 f"(goal: within {result['goal_points']:.0f})")
    lines += _drift_lines(result)  # at the end, where a tail of the output keeps it
    if not result.get("turns", True):
        lines.append("  groups time-sliced the GPU (PYVGPU_SM_TURN=0)")
    b = result.get("burst")
    if b:
        lines.append(f"  burst: --sm {b['share']} --sm-borrow alone {b['alone']['achieved']:.1f}% (borrowed "
                     f"{_pct(b['alone'].get('borrowed_share')).strip()}); with a --sm {b['neighbour_share']} "
                     f"neighbour {b['with_neighbour']['achieved']:.1f}% / {b['neighbour']['achieved']:.1f}%; "
                     f"gave the turn back within {b['give_back_ms']:.1f} ms (goal {b['give_back_goal_ms']:.0f})"
                     if b.get("give_back_ms") is not None else "  burst: no turn counters")
    for name, t in result.get("scenarios", {}).items():
        if not (t.get("handovers") or t.get("coruns")):  # no turn file, or time-sliced (its entry adds up charges)
            continue
        gap = f"{t['gap_mean_ms']:.3f} ms" if t.get("gap_mean_ms") is not None else "-"
        drain = f"{t['drain_mean_ms']:.2f} ms" if t.get("drain_mean_ms") is not None else "-"
        lines.append(f"  turns ({name}): {t['handovers']} hand-overs, mean gap {gap}, {t['drains']} drains "
                     f"(mean {drain}), {t['coruns']} launches beside the holder, {t['preempts']} pre-emptions, "
                     f"longest wait within a share {t['max_wait_ms']:.1f} ms, {t.get('lapses', 0)} waits after a "
                     f"lapse (mean {_mean_ms(t.get('lapse_ns', 0), t.get('lapses', 0))}), {t.get('joins', 0)} after "
                     f"launching outside the turns (mean {_mean_ms(t.get('join_ns', 0), t.get('joins', 0))})")
        if t.get("stucks") or t.get("catchups") or t.get("unmatched"):
            lines.append(f"  gang hand-overs ({name}): {t['stucks']} drains waited for a peer (mean "
                         f"{_mean_ms(t['stuck_ns'], t['stucks'])}), {t['catchups']} launches to catch up, "
                         f"{t['unmatched']} handed over unmatched")
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
    for kind, marker in (("single", "o"), ("pair", "s"), ("pair-sliced", "x"), ("neighbour", "^")):
        rs = [r for r in result["runs"] if r["kind"] == kind]
        if rs:
            ax1.plot([r["target"] for r in rs], [r["achieved"] for r in rs], marker, label=f"{kind}: throughput",
                     ms=8)
            ts = [r for r in rs if r.get("time_share_turns") is not None]
            # a time-sliced pair takes no turns, so its turn time is 0 by construction: not a measurement
            if ts and kind not in ("single", "pair-sliced"):
                ax1.plot([r["target"] for r in ts], [r["time_share_turns"] for r in ts], marker, mfc="none",
                         label=f"{kind}: time (turns)", ms=10)
    ax1.set_xlabel("target share (%)")
    ax1.set_ylabel("achieved share (%)")
    ax1.set_title(f"{result['workload']} on {result['machine']['gpu'][:40]}")
    ax1.set_xlim(0, 100)
    ax1.set_ylim(0, 105)
    ax1.legend(fontsize=7)
    for r in result["runs"]:
        label = f"{r['kind']} {r['target']}%" if r["target"] is not None else r["kind"]
        if r["controller"]:
            line, = ax2.plot([c["t"] for c in r["controller"]], [c["util"] for c in r["controller"]], label=label)
            if r["target"] is not None:
                ax2.axhline(r["target"], color=line.get_color(), lw=0.6, ls=":")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("device utilization seen by the controller (%)")
    ax2.set_title("controller time series\n(NVML utilization; runs of two groups share the device)", fontsize=10)
    ax2.set_ylim(0, 105)
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
