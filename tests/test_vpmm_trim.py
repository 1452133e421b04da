"""VPMM gives free pages back: on `pool.trim()`, and by itself after the group was refused memory or its
cap was lowered by `pyvgpu limits set` (tests/hosts/vpmm_cases.py: trim, pressure)."""

from __future__ import annotations

import json
import sys

from helpers import PYVGPU, run
from test_vpmm import CASES, MiB


def test_trim_releases_free_pages_to_the_driver(env):
    p = run([sys.executable, str(CASES), "trim"], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["before"] == {"pages": 8, "device_used": 16 * MiB}
    assert r["released"] == 6
    # the device's own count of used memory went down: the pages were unmapped and released for real
    assert r["after"]["device_used"] == 4 * MiB and r["after"]["pages"] == 2
    assert r["after"]["released_mapped"] == 0  # no released handle is kept alive by a forgotten mapping
    assert r["after"]["layout"] == "[*6][+2]" and r["after"]["stats_released"] == 6
    assert r["after"]["reserved_bytes"] == 4 * MiB  # memory_stats follows
    assert r["serves_after"]
    # a region whose work is still queued keeps its pages
    assert r["busy_kept"] == {"released": 0, "reusable": 4 * MiB}


def test_pressure_and_a_lowered_cap_give_pages_back(env, tmp_path):
    """Under `wrap --memory 32M`: the pool holds 24 MiB (16 of them free). Another process of the group asks
    for 16 MiB and is refused; at its next operation the pool gives its free pages back. Then
    `pyvgpu limits set --memory 24M`: at its next operation the pool gives back what it freed since."""
    region = tmp_path / "g.region"
    p = run([*PYVGPU, "wrap", "--memory", "32M", "--region", str(region), "--", sys.executable, str(CASES),
             "pressure"], env=dict(env, FAKECUDA_DEVICES="256G", CASE_REGION=str(region)), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["pages_before"] == 12
    assert r["other_rc"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY for the other member
    # 8 free pages, one of them taken by the operation that noticed: 7 released
    assert r["pages_after_refusal"] == 5 and r["trims"] == 1
    assert r["pages_before_limit"] == 10 and r["limits_set_rc"] == 0
    assert r["pages_after_limit"] == 6 and r["trims_after_limit"] == 2
