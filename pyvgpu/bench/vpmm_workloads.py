"""`pyvgpu bench vpmm --workload decode|train|all`: real loops under the three allocators (issue 32).

Each run is its own process under `pyvgpu wrap` (with ``--memory`` if a cap is given): PyTorch's default
caching allocator, expandable_segments (PYTORCH_CUDA_ALLOC_CONF), and VPMM (`--allocator vpmm`). The
allocators take turns, round after round (default, expandable, VPMM, default, ...), so that a GPU that
clocks differently over time is seen by all three alike. A run is a loop of pyvgpu.bench.vpmm_loops:
``decode`` (transformers' generate with GPT-2's architecture, 8 layers of width 1024, fp16, random weights;
batch 1-32, prompt 16-512, 16-64 new tokens at random; tokens/s) or ``train`` (8 x Linear 2048, fp32,
batch 1024, Adam; steps/s). Each reports its throughput and peak reserved bytes
(torch.cuda.max_memory_reserved; under VPMM every byte the pool took). The table gives the median of the
rounds and VPMM's throughput and peak reserved against expandable_segments'. ``all`` also replays the
fragmenting trace of `--workload trace` (ops/s: a diagnostic of the allocator alone, not what a user feels).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group.limits import human

MODES = ("default", "expandable_segments", "vpmm")
WORKLOADS = ("decode", "train")
UNIT = {"decode": "tokens_per_s", "train": "steps_per_s"}


def one(mode: str, workload: str, seconds: float, seed: int, cap: str | None, page_size: str | None) -> dict:
    env = dict(os.environ)
    env.pop(envspec.PYTORCH_CUDA_ALLOC_CONF.name, None)
    wrap = [sys.executable, "-m", "pyvgpu", "wrap"] + (["--memory", cap] if cap else [])
    if mode == "expandable_segments":
        env[envspec.PYTORCH_CUDA_ALLOC_CONF.name] = "expandable_segments:True"
    elif mode == "vpmm":
        wrap += ["--allocator", "vpmm"]
        if page_size:
            env[envspec.VPMM_PAGE_SIZE.name] = page_size
    p = subprocess.run([*wrap, "--", sys.executable, "-m", "pyvgpu.bench.vpmm_loops", workload, str(seconds),
                        str(seed)], env=env, capture_output=True, text=True, timeout=max(600.0, 6 * seconds + 300))
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        raise PyvgpuError(f"bench vpmm: the {workload} run under {mode} failed (exit {p.returncode}): "
                          f"{(p.stderr.strip() or p.stdout.strip())[-1200:]}")
    r = json.loads(lines[-1])
    if r.get("allocator") != mode:
        raise PyvgpuError(f"bench vpmm: the {mode} run used the {r.get('allocator')} allocator")
    return r


def check_workload(workload: str, trace: bool = True) -> str:
    """One of `bench vpmm --workload`'s values (``trace``, the one not run here, only with ``trace``)."""
    if workload not in (("trace",) if trace else ()) + (*WORKLOADS, "all"):
        raise PyvgpuError(f"bench vpmm --workload {workload!r}: give trace, decode, train or all")
    return workload


def run(workload: str, seconds: float = 16.0, rounds: int = 2, cap: str | None = None,
        page_size: str | None = None) -> dict:
    check_workload(workload, trace=False)
    if rounds < 1 or seconds <= 0:
        raise PyvgpuError("bench vpmm: give --rounds 1 or more and --seconds above 0")
    if page_size:
        from pyvgpu.group.limits import parse_size

        parse_size(page_size, "--page-size")
    out: dict = {"bench": "vpmm-loops", "seconds": seconds, "rounds": rounds, "cap": cap,
                 "page_size": page_size or "2M", "workloads": {}}
    for w in WORKLOADS if workload == "all" else (workload,):
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        for k in range(rounds):
            for mode in MODES:
                runs[mode].append(one(mode, w, seconds, k, cap, page_size))
        out["workloads"][w] = summarize(w, runs)
    if workload == "all":
        from pyvgpu.bench import vpmm as trace_bench

        out["trace"] = trace_bench.run(cap=cap, page_size=page_size)
    return out


def summarize(workload: str, runs: dict[str, list[dict]]) -> dict:
    key = UNIT[workload]
    s: dict = {"unit": key.replace("_per_s", "/s"), "runs": runs, "median": {}}
    for mode, rs in runs.items():
        s["median"][mode] = {"throughput": statistics.median(r[key] for r in rs),
                             "peak_reserved": statistics.median(r["peak_reserved"] for r in rs),
                             "all": [round(r[key], 1) for r in rs]}
    m = s["median"]
    if m["expandable_segments"]["throughput"]:
        s["vpmm_vs_expandable"] = {
            "throughput": m["vpmm"]["throughput"] / m["expandable_segments"]["throughput"],
            "peak_reserved": m["vpmm"]["peak_reserved"] / (m["expandable_segments"]["peak_reserved"] or 1)}
    return s


def table(result: dict) -> str:
    lines = [f"  {result['rounds']} rounds of {result['seconds']:g} s per allocator, interleaved; cap "
             f"{result['cap'] or 'none'}; VPMM page {result['page_size']}"]
    for w, s in result["workloads"].items():
        lines.append(f"  {w}: {s['unit']} (median; each round) and peak reserved (median)")
        for mode, m in s["median"].items():
            each = " / ".join(f"{x:g}" for x in m["all"])
            lines.append(f"    {mode:<20} {m['throughput']:>10.1f}  ({each})  {human(int(m['peak_reserved'])):>12}")
        if "vpmm_vs_expandable" in s:
            v = s["vpmm_vs_expandable"]
            lines.append(f"    VPMM / expandable_segments: throughput {v['throughput']:.3f}, peak reserved "
                         f"{v['peak_reserved']:.3f}")
    if "trace" in result:
        from pyvgpu.bench import vpmm as trace_bench

        lines.append("  the fragmenting trace (diagnostic: the allocator alone)")
        lines.append(trace_bench.table(result["trace"]))
    return "\n".join(lines)
