"""A driver error at any step of a defragmentation leaves the VPMM pool exactly as it was.

The fake driver fails the n-th call of a chosen function (fakecuda_fail, tests/fakecuda/fakecuda.c).
tests/hosts/vpmm_cases.py builds a pool where one request makes every kind of call a defragmentation
makes (a GPU-side wait, new pages, maps, access on both sides of a run; and, for a request too big for
the pool's chunks, a new VA chunk), then fails each call in turn. "Exactly as it was" compares the
region table row by row, the page table, the figures, and what the fake driver has mapped and charged.
"""

from __future__ import annotations

import collections
import json
import sys

from helpers import run
from test_vpmm import CASES

# the calls of each kind the two requests make (tests/hosts/vpmm_cases.py fault_pool): every one is failed
EXPECTED_STEPS = {"cuStreamWaitEvent": 1, "cuMemCreate": 3, "cuMemMap": 5, "cuMemSetAccess": 2,
                  "cuMemAddressReserve@fresh": 1, "cuStreamWaitEvent@fresh": 1, "cuMemCreate@fresh": 6,
                  "cuMemMap@fresh": 10, "cuMemSetAccess@fresh": 1}


def faults(env) -> dict:
    p = run([sys.executable, str(CASES), "faults"], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_every_step_of_a_defragmentation_fails_cleanly(env):
    r = faults(env)
    steps = collections.Counter(c["step"] for c in r["cases"])
    assert steps == EXPECTED_STEPS  # each call of each kind was failed once (nth = 1 .. the calls made)
    for c in r["cases"]:
        assert c["calls"] == c["nth"], c  # the failure hit the call it was armed for
        assert "CUresult 999" in c["error"] and "the pool is unchanged" in c["error"], c
        assert c["unchanged"], (c["step"], c["nth"], c["diff"])
        assert c["then_served"], c  # with no fault, the same request succeeds on the same pool
    # out of memory is retried once, after the small requests' cache is trimmed: served, counted
    assert r["oom_retried"] == {"served": True, "num_alloc_retries": 1, "num_ooms": 0}
    # a full region table refuses before any driver call, with the pool unchanged
    full = r["table_full"]
    assert "tables are full" in full["error"] and full["unchanged"] and full["driver_calls"] == 0
    assert full["served"] > 0


def test_trim_failures_leave_the_pool_consistent(env):
    """trim: an unmap that fails changes nothing; a release that fails puts the pages not yet released back
    where they were (mapped, free), the released ones stay released."""
    p = run([sys.executable, str(CASES), "trim"], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("cuMemUnmap_1", "cuMemRelease_1"):
        assert r[key]["unchanged"] and "CUresult 999" in r[key]["error"], r[key]
    rel2 = r["cuMemRelease_2"]  # the first page went back to the driver, the other two stayed free
    assert rel2["pages_before"] == 6 and rel2["pages_after"] == 5 and rel2["layout"] == "[*1][-2][+3]"
    assert rel2["mapped_ok"] and "stay released" in rel2["error"]
