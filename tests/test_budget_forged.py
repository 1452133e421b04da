"""A compute budget that another member wrote far ahead (pyvgpu/jit/compute/limiter.py, ``MAX_AHEAD_NS``).

Every process of a group can write its region, and a region file can outlive a reboot's clock. Before, a
launch obeyed whatever ``sm_tat`` said: one word written an hour ahead held every other member's next
launch for an hour. Now a budget further ahead than any launch waits is started afresh, with an event.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from helpers import PYVGPU, run

from pyvgpu.contract import layout
from pyvgpu.group import region
from pyvgpu.jit.compute import limiter
from pyvgpu.native.shim import BENCH_BIN

ITERS = "2000"  # pv_bench's spin kernel: 200 us of simulated GPU time


def _sm_tat_offset(dev: int) -> int:
    return layout.REGION_DEVICES_OFF + dev * layout.REGION_DEVICE.size + layout.REGION_DEVICE.offset("sm_tat")


def test_a_budget_written_an_hour_ahead_holds_no_member(env, tmp_path: Path):
    path = tmp_path / "g.region"
    e = dict(env, FAKECUDA_SIM=str(tmp_path / "gpu.sim"))
    victim = subprocess.Popen([*PYVGPU, "wrap", "--sm", "50", "--region", str(path), "--",
                               str(BENCH_BIN), "sm", "3", ITERS, "kernel"], env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        first = victim.stdout.readline()
        assert first.startswith("P "), victim.stderr.read()  # launching under the share by now
        ahead = 3600 * 10**9
        with open(path, "r+b") as f:  # what any member (or a file from before a reboot) can leave there
            f.seek(_sm_tat_offset(0))
            f.write((time.monotonic_ns() + ahead).to_bytes(8, "little"))
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
    assert resets and resets[0]["a"] > limiter.MAX_AHEAD_NS, r.events()
    p = run([*PYVGPU, "status", "--region", str(path)], env=e)
    assert "started it afresh" in p.stdout + p.stderr, p.stdout + p.stderr

