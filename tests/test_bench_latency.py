"""`pyvgpu bench latency` (issue 27, item 6) without a GPU: the arrivals, the statistics, the goals, and the
input checks. The scenarios themselves run on a GPU (scripts/gpu_check.sh latency)."""

from __future__ import annotations

import sys

import pytest
from helpers import PYVGPU, run

from pyvgpu.bench import latency as L
from pyvgpu.bench.latency_worker import arrivals
from pyvgpu.errors import PyvgpuError


def test_arrivals_are_a_poisson_process_fixed_by_the_seed():
    a = arrivals(200.0, 5.0, seed=1)
    assert a == arrivals(200.0, 5.0, seed=1)  # every scenario replays the same requests
    assert a != arrivals(200.0, 5.0, seed=2)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 200e9
    assert 800 <= len(a) <= 1200  # rate x seconds = 1000 (this seed's count is fixed; the bound is wide)
    gaps = [(b - x) / 1e9 for x, b in zip(a, a[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    assert 0.17 <= mean <= 0.23  # exponential gaps of mean 1 / rate
    assert sum(g > 2 * mean for g in gaps) / len(gaps) == pytest.approx(0.135, abs=0.04)  # e^-2 of them
    with pytest.raises(ValueError):
        arrivals(10.0, 0.0, seed=0)


def test_percentile_is_a_measured_value_by_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert (L.percentile(xs, 50), L.percentile(xs, 99), L.percentile(xs, 100)) == (50.0, 99.0, 100.0)
    assert L.percentile([7.0], 99) == 7.0
    assert L.percentile([3.0, 1.0, 2.0], 50) == 2.0
    with pytest.raises(PyvgpuError, match="no requests were served"):
        L.percentile([], 99)


def test_latencies_leave_out_the_warm_up_and_count_the_wait():
    # 20 requests 100 ms apart, each served in 10 ms; the first (warm-up) and the sixth waited 500 ms more
    lines = ["P 0 0", "noise"]
    for i in range(20):
        due = 1_000_000_000 + i * 100_000_000
        lat = 510_000_000 if i in (0, 5) else 10_000_000
        lines.append(f"L {due} {lat} 10000000")
    r = L.latencies(lines)
    assert r["requests"] == 18  # the first tenth (2) left out
    assert r["p50_ms"] == 10.0 and r["p90_ms"] == 10.0
    assert r["p99_ms"] == r["max_ms"] == 510.0  # the wait counts: one slow request is the p99 of 18
    assert r["mean_service_ms"] == 10.0
    assert r["busy_host"] == pytest.approx(18 * 0.01 / (17 * 0.1 + 0.01))
    assert r["window_s"] == (1.2, pytest.approx(1.2 + 17 * 0.1 + 0.01))
    with pytest.raises(PyvgpuError, match="printed no requests"):
        L.latencies(["P 1 2"])


def _result(busy_nvml):
    svc = {"p50_ms": 50.0, "p99_ms": 80.0, "busy_host": 0.3}
    return {"solo": {"service": svc, "service_busy_nvml": busy_nvml, "train_steps_per_s": 100.0},
            "scenarios": {"sliced": {"service": {"p50_ms": 90.0, "p99_ms": 200.0}, "train_steps_per_s": 70.0},
                          "pyvgpu": {"service": {"p50_ms": 55.0, "p99_ms": 110.0}, "train_steps_per_s": 50.0}}}


def test_the_goals_are_judged_against_the_solo_runs():
    r = _result(0.4)
    L.judge(r)
    assert r["service_busy"] == 0.4  # NVML's busy share when it was sampled
    sl, pv = r["scenarios"]["sliced"], r["scenarios"]["pyvgpu"]
    assert sl["p99_ratio"] == 2.5 and not sl["meets_p99"]
    assert sl["train_of_idle"] == pytest.approx(70 / 60) and sl["meets_idle"]
    assert pv["p99_ratio"] == pytest.approx(1.375) and pv["meets_p99"]
    assert pv["train_of_idle"] == pytest.approx(50 / 60) and pv["meets_idle"]
    assert pv["train_of_solo"] == 0.5
    r = _result(None)  # no NVML: the service's own busy time on the host
    L.judge(r)
    assert r["service_busy"] == 0.3 and r["scenarios"]["pyvgpu"]["train_of_idle"] == pytest.approx(50 / 70)
    r["machine"], r["rate"], r["tokens"], r["seconds"] = {"gpu": "X"}, 4.0, 16, 30.0
    r["train_sm"], r["borrow"] = 50, True
    r["solo"]["service"]["requests"] = 100
    text = L.table(r)
    assert "p99 MISSED" in text and "p99 ok, idle ok" in text and "--sm 50 --sm-borrow" in text


def test_bad_input_is_refused_before_any_gpu_work(env):
    for kw, says in (({"seconds": 2}, "--seconds 2"), ({"rate": 0}, "--rate 0"), ({"tokens": 0}, "--tokens 0"),
                     ({"train_sm": 0}, "--train-sm"), ({"scenarios": ("sliced", "fair")}, "'fair' is not one of")):
        with pytest.raises(PyvgpuError, match=says):
            L.run(**kw)
    p = run([*PYVGPU, "bench", "latency", "--scenarios", "sliced,fair"], env=env)
    assert p.returncode != 0 and "--scenarios: 'fair' is not one of sliced, pyvgpu, mps" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_the_service_says_what_it_needs(env):
    p = run([sys.executable, "-m", "pyvgpu.bench.latency_worker", "1", "2"], env=env)
    assert p.returncode == 2 and "usage:" in p.stderr and "Traceback" not in p.stderr
    p = run([sys.executable, "-m", "pyvgpu.bench.latency_worker", "10", "0", "16", "0"], env=env)
    assert p.returncode == 2 and "must be positive" in p.stderr
    p = run([sys.executable, "-m", "pyvgpu.bench.latency_worker", "10", "2", "16", "0"], env=env, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "needs PyTorch and transformers" in p.stderr or "needs a CUDA GPU" in p.stderr
