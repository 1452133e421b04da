"""Named groups' lifecycle (pyvgpu/ops/groups.py): made and last used, `group ls`/`group rm`, the idle expiry, a
join whose limits differ from the group's, and dead private groups leaving `status` at once."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import pytest
from helpers import PYVGPU, run

HOLD = [sys.executable, "-c", "import ctypes, sys, time\n"
        "assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"]


@pytest.fixture
def genv(env, tmp_path):
    d = tmp_path / "xdg"
    d.mkdir(mode=0o700)
    return dict(env, XDG_RUNTIME_DIR=str(d))


def _ls(genv) -> list[dict]:
    p = run([*PYVGPU, "group", "ls", "--json"], env=genv)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["groups"]


def _hold(genv, *opts):
    """A member that lives until its stdin closes."""
    p = subprocess.Popen([*PYVGPU, "wrap", *opts, "--", *HOLD], env=genv, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return p


def test_group_ls_shows_made_last_used_and_members_and_rm_removes_an_unused_group(genv):
    t0 = time.time_ns()
    assert run([*PYVGPU, "wrap", "-g", "team", "-m", "8M", "--", "true"], env=genv).returncode == 0
    (g,) = _ls(genv)
    assert g["name"] == "team" and g["members"] == []
    assert t0 - 5 * 10**9 <= g["created_ns"] <= g["last_used_ns"] <= time.time_ns()
    text = run([*PYVGPU, "group", "ls"], env=genv).stdout
    assert "team" in text and "8 MiB" in text and "PYVGPU_GROUP_IDLE_HOURS" in text
    p = _hold(genv, "-g", "team")
    try:
        (g,) = _ls(genv)
        assert g["members"] == [p.pid]
        refused = run([*PYVGPU, "group", "rm", "team"], env=genv)
        assert refused.returncode == 2 and f"pid {p.pid}" in refused.stderr and "stop them first" in refused.stderr
    finally:
        p.communicate("", timeout=60)
    done = run([*PYVGPU, "group", "rm", "team"], env=genv)
    assert done.returncode == 0, done.stderr
    assert _ls(genv) == []
    again = run([*PYVGPU, "group", "rm", "team"], env=genv)
    assert again.returncode == 2 and "no group 'team'" in again.stderr and "group ls" in again.stderr


def test_an_idle_group_expires_and_the_next_wrap_starts_it_afresh(genv):
    assert run([*PYVGPU, "wrap", "-g", "old", "-m", "8M", "--", "true"], env=genv).returncode == 0
    kept = run([*PYVGPU, "wrap", "-g", "old", "-m", "16M", "--", "true"], env=genv)  # unused for less than 12 h
    assert kept.returncode == 2
    assert "asks for 16 MiB" in kept.stderr and "`pyvgpu group rm old` removes it" in kept.stderr
    time.sleep(0.05)
    e = dict(genv, PYVGPU_GROUP_IDLE_HOURS="0.00001")  # 36 ms
    fresh = run([*PYVGPU, "wrap", "-g", "old", "-m", "16M", "--", "true"], env=e)
    assert fresh.returncode == 0, fresh.stderr
    assert "group 'old' was idle" in fresh.stderr and "starting it afresh" in fresh.stderr
    (g,) = _ls(genv)
    assert g["memory_limits"][0] == 16 << 20
    time.sleep(0.05)
    p = run([*PYVGPU, "group", "ls"], env=e)
    assert "removed group 'old'" in p.stderr and _ls(genv) == []
    never = run([*PYVGPU, "group", "ls"], env=dict(genv, PYVGPU_GROUP_IDLE_HOURS="soon"))
    assert never.returncode == 2 and "PYVGPU_GROUP_IDLE_HOURS='soon'" in never.stderr


def test_a_live_group_never_expires(genv):
    p = _hold(genv, "-g", "busy", "-m", "8M")
    try:
        time.sleep(0.05)
        e = dict(genv, PYVGPU_GROUP_IDLE_HOURS="0.00001")
        refused = run([*PYVGPU, "wrap", "-g", "busy", "-m", "16M", "--", "true"], env=e)
        assert refused.returncode == 2 and "asks for 16 MiB" in refused.stderr
        assert "group rm" not in refused.stderr  # it has a member
    finally:
        p.communicate("", timeout=60)


def test_a_join_with_the_limits_the_group_had_says_they_changed(genv):
    assert run([*PYVGPU, "wrap", "-g", "g", "-m", "8M", "--", "true"], env=genv).returncode == 0
    assert run([*PYVGPU, "limits", "set", "-g", "g", "-m", "4M"], env=genv).returncode == 0
    p = run([*PYVGPU, "wrap", "-g", "g", "-m", "8M", "--", "true"], env=genv)
    assert p.returncode == 0
    assert p.stderr.count("\n") == 1, p.stderr
    assert "group 'g' has 4 MiB on every device now" in p.stderr and "changed it from 8 MiB" in p.stderr
    quiet = run([*PYVGPU, "wrap", "-g", "g", "-m", "4M", "--", "true"], env=genv)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_dead_private_group_leaves_status_at_once(genv):
    p = _hold(genv, "-m", "8M")
    try:
        live = json.loads(run([*PYVGPU, "status", "--json"], env=genv).stdout)["groups"]
        assert [pr["pid"] for g in live for pr in g["processes"] if pr["alive"]] == [p.pid]
    finally:
        p.communicate("", timeout=60)
    s = run([*PYVGPU, "status", "--json"], env=genv)
    assert s.returncode == 0 and json.loads(s.stdout)["groups"] == []
