"""`pyvgpu wrap` parsed without typer (pyvgpu/fastwrap.py) against the typer command line (pyvgpu/cli/wrap.py).

The fast path must give the program the same environment, and refuse what the typer path refuses with
the same message and exit code; whatever it does not parse itself goes to typer."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from helpers import run

from pyvgpu import fastwrap

FAST = [sys.executable, "-m", "pyvgpu"]  # pyvgpu/__main__.py: the console script's entry
SLOW = [sys.executable, "-m", "pyvgpu.cli"]  # the typer command line, always
DUMP = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def _both(env, args, tmp_path):
    out = []
    for i, entry in enumerate((FAST, SLOW)):
        e = dict(env, XDG_RUNTIME_DIR=str(tmp_path / f"run{i}"))
        (tmp_path / f"run{i}").mkdir(mode=0o700, exist_ok=True)
        p = run([*entry, "wrap", *[a.replace("@T", str(tmp_path / f"run{i}")) for a in args]], env=e)
        got = json.loads(p.stdout) if p.stdout.startswith("{") else p.stdout
        if isinstance(got, dict):
            got = {k: v.replace(str(tmp_path / f"run{i}"), "@T") for k, v in got.items()
                   if k not in ("PYVGPU_REGION",) or "/private/" not in v}
        out.append((p.returncode, p.stderr.replace(str(tmp_path / f"run{i}"), "@T"), got))
    return out


@pytest.mark.parametrize("args", [
    ["-m", "8M", "--", *DUMP],
    ["--memory=8M", "-g", "team", *DUMP],
    ["-m8M", "--group=team2", "--stats", "--on-error", "OPEN", *DUMP],
    ["--memory", "6M", "--memory", "8M", "--sm-cap", "--priority", "high", "--region", "@T/r.region", *DUMP],
    ["--stats-file", "@T/s-%p.json", "--allocator", "default", "--sm-borrow", "-g", "b", "--", *DUMP, "-m", "2G"],
    ["-d", "0", "-m", "8M", *DUMP],
    [*DUMP],
], ids=["short", "long=", "attached", "repeated", "flags", "devices", "bare"])
def test_fast_and_typer_paths_give_the_program_the_same_environment(env, tmp_path, args):
    assert fastwrap.parse(args) is not None  # these are the fast path's
    fast, slow = _both(env, args, tmp_path)
    assert fast[0] == slow[0] == 0, (fast[1], slow[1])
    assert fast[2] == slow[2]
    assert fast[2]["LD_PRELOAD"] and fast[2]["PYVGPU_CALLBACKS"]


@pytest.mark.parametrize("args", [
    ["--memory", "4GB", "--", "true"],
    ["--memory", "0", "--", "true"],
    ["--memory", "4X", "--", "true"],
    ["--memory=", "--", "true"],
    ["-m", "９G", "--", "true"],
    ["--memory", "64T", "--", "true"],
    ["--sm", "130", "--", "true"],
    ["--devices", "7", "--", "true"],
    ["--allocator", "banana", "--", "true"],
    ["--mode", "banana", "--", "true"],
    ["--priority", "mid", "--", "true"],
    ["--region", "@T", "--", "true"],
    ["--group", "g", "--region", "@T/x.region", "--", "true"],
    ["-m", "8M", "--", "no-such-program-here"],
])
def test_fast_and_typer_paths_refuse_alike(env, tmp_path, args):
    assert fastwrap.parse(args) is not None
    fast, slow = _both(env, args, tmp_path)
    assert fast[0] != 0
    assert fast[:2] == slow[:2]
    assert fast[1].startswith("pyvgpu: ") and fast[1].count("\n") == 1


def test_a_join_that_differs_is_refused_alike(env, tmp_path):
    name = f"fw-{uuid.uuid4().hex[:8]}"
    for i, entry in enumerate((FAST, SLOW)):
        e = dict(env, XDG_RUNTIME_DIR=str(tmp_path / f"run{i}"))
        (tmp_path / f"run{i}").mkdir(mode=0o700)
        assert run([*entry, "wrap", "-g", name, "-m", "8M", "--", "true"], env=e).returncode == 0
    fast, slow = _both(env, ["-g", name, "-m", "16M", "--", "true"], tmp_path)
    assert fast[0] == slow[0] == 2
    assert fast[1] == slow[1] and name in fast[1]


@pytest.mark.parametrize("args", [
    ["--help"], ["-h"], ["--memroy", "4G", "--", "true"], ["--memory"], ["--memory", "--sm", "30", "true"],
    ["--stats=1", "true"], ["--on-error", "banana", "true"], ["-x", "true"], [], ["--"], ["-m", "4G"],
])
def test_what_the_fast_path_does_not_parse_goes_to_typer(env, tmp_path, args):
    assert fastwrap.parse(args) is None
    fast, slow = _both(env, args, tmp_path)
    assert fast == slow


def test_arguments_after_program_are_the_programs():
    opts, cmd = fastwrap.parse(["-m", "1G", "python", "-m", "2G", "--", "-g"])
    assert opts["memory"] == "1G" and opts["group"] is None
    assert cmd == ["python", "-m", "2G", "--", "-g"]
    assert fastwrap.parse(["--", "--memory", "1G"])[1] == ["--memory", "1G"]
    assert fastwrap.parse(["-", "x"])[1] == ["-", "x"]


def test_both_parsers_make_one_and_the_same_request(monkeypatch):
    """The fast parser and typer's build the same pyvgpu.ops.wrap.WrapRequest, and run hands it on whole."""
    from typer.testing import CliRunner

    from pyvgpu.cli import app

    got = []
    monkeypatch.setattr(fastwrap, "run", lambda command, request: got.append((command, request)) or 0)
    monkeypatch.setenv("PYVGPU_MIN_MEMORY", "1M")  # the request checks -m8M against the floor when it is made
    args = ["-m8M", "--group=t", "--stats-file", "s.json", "--on-error", "OPEN", "--priority", "0", "--sm-cap",
            "--mode", "hami-core", "--allocator", "vpmm", "-d", "0", "--sm", "30", "--", "prog", "-m", "1G"]
    assert fastwrap.wrap(*fastwrap.parse(args)) == 0
    r = CliRunner().invoke(app, ["wrap", *args])
    assert r.exit_code == 0, r.output
    (cmd, fast), (cmd2, slow) = got
    assert cmd == cmd2 == ["prog", "-m", "1G"] and fast == slow
    assert (fast.memory, fast.group, fast.stats, fast.on_error, fast.priority, fast.sm_borrow, fast.mode,
            fast.allocator, fast.devices, fast.sm) == ("8M", "t", "s.json", "open", "high", False, "hami-core",
                                                       "vpmm", "0", "30")


def test_the_wrap_request_is_frozen_and_checked_when_made():
    import dataclasses
    import inspect

    from pyvgpu.errors import PyvgpuError
    from pyvgpu.ops import wrap
    from pyvgpu.ops.wrap import WrapRequest

    r = WrapRequest.from_options(stats=True, memory="1G")
    assert r.stats == "1" and r.memory == "1G" and r.join
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.memory = "2G"
    for kw, says in (({"mode": "mig"}, "--mode 'mig' is not one of hami-core, mps"),
                     ({"allocator": "jemalloc"}, "--allocator 'jemalloc' is not one of default, vpmm"),
                     ({"on_error": "maybe"}, "--on-error 'maybe' is not one of closed, open"),
                     ({"priority": "urgent"}, "--priority: 'urgent' is not a priority"),
                     ({"group": "a", "region_path": "b"}, "give --group or --region, not both"),
                     ({"join": False, "devices": "0"}, "--devices needs a group region")):
        with pytest.raises(PyvgpuError) as e:
            WrapRequest(**kw)
        assert says in str(e.value), kw
    assert list(inspect.signature(wrap.build_env).parameters) == ["base", "request"]
    assert list(inspect.signature(wrap.join_group).parameters) == ["env", "request"]


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("driver", [True, False], ids=["driver", "no-driver"])
def test_a_plain_wrap_imports_neither_typer_nor_pydantic_nor_rich(env, tmp_path, driver):
    e = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    if not driver:  # as on a machine without a GPU: the wrap says so in one line, and runs the program
        e["PYVGPU_REAL_LIBCUDA"] = str(tmp_path / "no-such-libcuda.so.1")
    # The first wrap on a machine may compile the callback library, which looks up the compiler (shutil):
    # that is a one-time cost, so warm the cache first and measure the wrap people run every time.
    warm = run([sys.executable, "-m", "pyvgpu", "wrap", "-m", "8M", "-g", "imp", "--", "true"], env=e)
    assert warm.returncode == 0, warm.stderr
    p = run([sys.executable, "-X", "importtime", "-m", "pyvgpu", "wrap", "-m", "8M", "-g", "imp", "--", "true"],
            env=e)
    assert p.returncode == 0, p.stderr
    assert ("no CUDA driver" in p.stderr) != driver, p.stderr
    imported = _imported(p.stderr)
    assert "pyvgpu.ops.wrap" in imported and "pyvgpu.group.region" in imported
    # What the interpreter imports before any of pyvgpu (site, .pth files of the environment) is not ours.
    bare = run([sys.executable, "-X", "importtime", "-c", "pass"], env=e)
    imported -= _imported(bare.stderr)
    heavy = {m for m in imported
             if m.split(".")[0] in ("typer", "click", "pydantic", "rich", "subprocess", "numba", "shutil")}
    assert not heavy, sorted(heavy)
    # nor dataclasses (with inspect and ast: pyvgpu/contract/record.py), nor the hook table (the layouts it
    # sizes are made at first use, and the callback library is chosen without loading one: cache.choose)
    slow = imported & {"dataclasses", "inspect", "ast", "pyvgpu.contract.hooks", "pyvgpu.contract.hooks_model",
                       "pyvgpu.ops.doctor"}
    assert not slow, sorted(slow)


@pytest.mark.parametrize("cmd", ["true", "sh", "/bin/sh", "no-such-program-here", "./x", "/tmp", "bin/sh", "tmp"])
@pytest.mark.parametrize("path", [None, "/usr/bin:/bin", "", "/nonexistent", ":/bin"])
def test_the_program_lookup_is_shutil_which(cmd, path):
    import shutil

    from pyvgpu.ops.wrap import _which

    assert _which(cmd, path) == shutil.which(cmd, path=path)


def test_bench_startup_concurrent_runs_waves_of_wraps(env, tmp_path):
    out = tmp_path / "c.json"
    p = run([*FAST, "bench", "startup", "--concurrent", "4", "--runs", "1", "--output", str(out)], env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["concurrent"] == 4 and r["machine"]["cores"] >= 1
    assert len(r["samples"]["wrapped_s"]) == 1 and len(r["samples"]["single_cpu_ms"]) == 5
    assert all(v > 0 for v in r["median"].values())
    assert "4 x pyvgpu wrap --group --memory at once" in p.stdout and "goal <= 3.0 s" in p.stdout


def test_a_wave_that_fails_says_which_and_why():
    from pyvgpu.bench.wraps import _wave
    from pyvgpu.errors import PyvgpuError

    with pytest.raises(PyvgpuError, match="2 of 2 processes failed; the first: exit 3: boom"):
        _wave([["sh", "-c", "echo boom >&2; exit 3"]] * 2, {"PATH": "/usr/bin:/bin"})
    with pytest.raises(PyvgpuError, match="had not ended after 0.5 s; killed"):
        _wave([["sleep", "30"]], {"PATH": "/usr/bin:/bin"}, timeout_s=0.5)
