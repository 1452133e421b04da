"""`pyvgpu top` at 80 columns and piped."""

from __future__ import annotations

import os
import select
import subprocess
import tempfile
import time

from helpers import PYVGPU, run
from test_groups import _hold


def test_top_fits_80_columns_with_its_legend_unwrapped(env, tmp_path):
    e = dict(env, XDG_RUNTIME_DIR=str(tmp_path), COLUMNS="80")
    m = _hold(e, "-g", "a-team-with-a-long-name", "-m", "64M")
    try:
        assert run([*PYVGPU, "limits", "set", "-g", "a-team-with-a-long-name", "-m", "32M"], env=e).returncode == 0
        p = run([*PYVGPU, "top", "--once", "--interval", "0.1"], env=e)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
        legend = [line for line in lines if line.startswith("dev:")]
        assert len(legend) == 1 and "pid!: dead" in legend[0]  # one phrase per line, none cut by a wrap
        assert any("memory" in line for line in lines)  # the limit change's event
    finally:
        m.communicate("", timeout=60)


def test_top_piped_prints_a_frame_per_interval(env, tmp_path):
    e = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    m = _hold(e, "-g", "piped", "-m", "64M")
    p = subprocess.Popen([*PYVGPU, "top", "--interval", "0.2"], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=tempfile.gettempdir())
    try:
        out = b""
        deadline = time.monotonic() + 60
        while out.count(b"pyvgpu top") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        assert out.count(b"pyvgpu top") >= 2, (out, p.stderr.read() if p.poll() is not None else b"")
        assert b"piped" in out
    finally:
        p.kill()
        p.wait(timeout=60)
        m.communicate("", timeout=60)
