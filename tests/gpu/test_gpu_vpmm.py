"""Issue 6 on a real GPU: the seed walkthrough with data surviving defragmentation, PyTorch on VPMM under a
cap (a clean error past it, not a tensor at address 0)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import PYVGPU, clean_env, run
from test_vpmm import WALK

HERE = Path(__file__).resolve().parent
GiB = 1 << 30


def last_json(p):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pages", sorted(WALK, reverse=True), ids=lambda p: f"case-{WALK[p][0]}-{p}-pages")
def test_walkthrough_on_real_memory_keeps_the_data(pages):
    _, steps, final_pages = WALK[pages]
    r = last_json(run([sys.executable, str(HERE / "vpmm_real.py"), "walk", str(pages)], env=clean_env()))
    r = r[str(pages)]
    print(json.dumps(r))
    assert r["steps"] == steps
    assert r["data_intact"]  # patterns written before the defragmentation read back after it
    assert r["pages"] == final_pages
    assert r["defragmentations"] == (0 if pages == 22 else 1)


def test_torch_on_vpmm_under_a_cap():
    r = last_json(run([*PYVGPU, "wrap", "--allocator", "vpmm", "--memory", "4G", "--", sys.executable,
                       str(HERE / "torch_vpmm.py")], env=clean_env()))
    print(json.dumps(r))
    assert r["data_ok"] and r["after_ok"]
    assert r["error"] and "CUDA out of memory" in r["error"], r
    assert r["pool"]["live"] >= GiB and r["pool"]["mapped"] <= 4 * GiB
    assert r["torch_free_total"][1] == 4 * GiB
