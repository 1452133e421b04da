"""A compute budget that another member wrote far ahead (pyvgpu/jit/compute/limiter.py, ``MAX_AHEAD_NS``).

Every process of a group can write its region, and a region file can outlive a reboot's clock. Before, a
launch obeyed whatever ``sm_tat`` said: one word written far ahead held every other member's next launch
that long. Now a budget that cannot be one (negative as a signed time, or further ahead than any launch
waits) is started afresh, with an event.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PYVGPU, run

from pyvgpu.contract import layout
from pyvgpu.group import region
from pyvgpu.native.shim import BENCH_BIN

ITERS = "2000"  # pv_bench's spin kernel on the simulated GPU (a fraction of a millisecond)


def _sm_tat_offset(dev: int) -> int:
    return layout.REGION_DEVICES_OFF + dev * layout.REGION_DEVICE.size + layout.REGION_DEVICE.offset("sm_tat")


@pytest.mark.parametrize("forged, opts", [("hour", []), (1 << 63, []), ((1 << 64) - 1, []), ("hour", ["--sm-borrow"])])
def test_a_budget_written_far_ahead_holds_no_member(env, tmp_path: Path, forged, opts):
    """An hour ahead; 2^63 (the smallest negative int64: it wrapped the wait to centuries); all ones; and
    under --sm-borrow, where a budget that looked spent sent every launch down the borrowing path (its
    share booked as borrowed time) and the word was never started afresh."""
    path = tmp_path / "g.region"
    e = dict(env, FAKECUDA_SIM=str(tmp_path / "gpu.sim"))
    victim = subprocess.Popen([*PYVGPU, "wrap", "--sm", "50", *opts, "--region", str(path), "--",
                               str(BENCH_BIN), "sm", "3", ITERS, "kernel"], env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        first = victim.stdout.readline()
        assert first.startswith("P "), victim.stderr.read()  # launching under the share by now
        word = time.monotonic_ns() + 3600 * 10**9 if forged == "hour" else forged
        with open(path, "r+b") as f:  # what any member (or a file from before a reboot) can leave there
            f.seek(_sm_tat_offset(0))
            f.write(word.to_bytes(8, "little"))
        try:
            out, err = victim.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            raise AssertionError("a member's launch held for the forged budget (no bound on the wait)") from None
    finally:
        victim.kill()
    assert victim.returncode == 0, err
    kernels = json.loads(out.strip().splitlines()[-1])["kernels"]
    assert kernels > 0
    r = region.open_region(path, writable=False)
    r.close()
    resets = [ev for ev in r.events() if ev["kind"] == "budget_reset"]
    assert resets and resets[0]["a"] == word, r.events()  # the word found, as found
    p = run([*PYVGPU, "status", "--region", str(path)], env=e)
    shown = p.stdout + p.stderr
    assert "started it afresh" in shown and ("not a time" if word >> 63 else "s ahead") in shown, shown

