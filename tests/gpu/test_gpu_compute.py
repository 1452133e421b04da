"""Compute shares on a real GPU: the spin load at 30% alone, a torch run through every launch path, and (2 GPUs)
two all-reduce gangs at 30/70."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import PYVGPU, clean_env, run


def test_spin_kernel_at_30_percent_is_within_5_points(tmp_path):
    from pyvgpu.bench import sm

    result = sm.run(targets="30", seconds=8, workload="spin", pair="", png=None)
    r = result["runs"][0]
    print(json.dumps({k: v for k, v in r.items() if k not in ("curve", "controller")}))
    assert abs(r["achieved"] - 30) <= 5, r["achieved"]


def test_torch_under_a_share_still_computes_the_same(tmp_path):
    """Throttled launches are delayed, never dropped or reordered: the same losses as without a share."""
    script = Path(__file__).with_name("train_tiny.py")
    env = clean_env()
    raw = run([sys.executable, str(script)], env=env, timeout=600)
    limited = run([*PYVGPU, "wrap", "--sm", "50", "--", sys.executable, str(script)], env=env, timeout=600)
    assert raw.returncode == 0 and limited.returncode == 0, limited.stderr
    assert raw.stdout.strip().splitlines()[-1] == limited.stdout.strip().splitlines()[-1]


def test_two_allreduce_gangs_at_30_and_70_finish_and_both_progress():
    """Item 1 of issue 27: a gang pair with unequal shares never hangs (each run is 6 s; the bench gives a load
    144 s before it calls it hung) and each group gets some of its share. On two H200s at bc64d46 a load did
    not finish; on two H100s the same bench call finished at 4c5330d and ced2515 (28.1 / 46.9, 24.9 / 56.2)."""
    from pyvgpu.bench import sm, sm_matrix

    if sm_matrix.gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    result = sm.run(targets="", seconds=6, workload="allreduce", pair="30,70", png=None)
    got = {r["target"]: r["achieved"] for r in result["runs"] if r["kind"] == "pair"}
    print(got)
    assert got[30] > 10 and got[70] > 30, got
