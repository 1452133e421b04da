"""`pyvgpu bench overhead`: host time per call, raw driver against wrapped.

pv_bench (pyvgpu/bench/pv_bench.c) times batches of calls with
CLOCK_MONOTONIC and reports the median per call. Raw and wrapped runs
alternate, their order flipping every round, so drift in clocks or load
hits both sides alike; the ratio is of the medians across rounds.
"""

from __future__ import annotations

import json
import subprocess

from pyvgpu import cache, wrap
from pyvgpu.bench.common import machine, median, raw_env
from pyvgpu.errors import PyvgpuError
from pyvgpu.shim import BENCH_BIN

GOALS = {"launch": 1.01, "alloc_free": 1.02}


def _one(op: str, env: dict[str, str], samples: int, batch: int, size: int) -> dict:
    args = [str(BENCH_BIN), "launch" if op == "launch" else "alloc", str(samples), str(batch)]
    if op == "alloc_free":
        args.append(str(size))
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise PyvgpuError(f"pv_bench {op} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(rounds: int = 5, samples: int = 200, launch_batch: int = 100, alloc_batch: int = 10,
        size: int = 2 << 20, extra_env: dict[str, str] | None = None) -> dict:
    if not BENCH_BIN.exists():
        raise PyvgpuError(f"{BENCH_BIN} is missing; reinstall pyvgpu")
    cache.ensure()
    raw = raw_env()
    raw.update(extra_env or {})
    wrapped = wrap.build_env(raw)
    ops = {"launch": launch_batch, "alloc_free": alloc_batch}
    per_round: dict[str, dict[str, list[float]]] = {op: {"raw": [], "wrapped": []} for op in ops}
    for r in range(rounds):
        order = [("raw", raw), ("wrapped", wrapped)]
        if r % 2:
            order.reverse()
        for op, batch in ops.items():
            for side, env in order:
                per_round[op][side].append(_one(op, env, samples, batch, size)["median_ns"])
    summary = {}
    for op in ops:
        r_med = median(per_round[op]["raw"])
        w_med = median(per_round[op]["wrapped"])
        summary[op] = {"raw_ns": r_med, "wrapped_ns": w_med, "ratio": w_med / r_med if r_med else float("nan"),
                       "goal": GOALS[op], "rounds": per_round[op]}
    return {"bench": "overhead", "machine": machine(), "rounds": rounds, "samples": samples,
            "alloc_size": size, "ops": summary}


def table(result: dict) -> str:
    lines = [f"pyvgpu bench overhead on {result['machine']['gpu']} ({result['rounds']} rounds, "
             "median host ns per call)",
             f"  {'op':<12} {'raw':>10} {'wrapped':>10} {'ratio':>8} {'goal':>6}"]
    for op, s in result["ops"].items():
        lines.append(f"  {op:<12} {s['raw_ns']:>10.0f} {s['wrapped_ns']:>10.0f} {s['ratio']:>8.4f} "
                     f"{'<=' + str(s['goal']):>6}")
    return "\n".join(lines)
