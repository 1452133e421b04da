"""The command line: help, doctor, warmup, bench (figures printed, never asserted as timings)."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import PYVGPU, run

import pyvgpu
from pyvgpu import hooks


def test_version_and_help(env):
    p = run([*PYVGPU, "--version"], env=env)
    assert p.returncode == 0 and p.stdout.strip() == f"pyvgpu {pyvgpu.__version__}"
    p = run([*PYVGPU, "wrap", "--help"], env=env)
    assert p.returncode == 0 and "--on-error" in p.stdout and "--stats" in p.stdout
    p = run([*PYVGPU], env=env)  # no command: the help, as a usage error (click prints it on stderr)
    assert "wrap" in p.stdout + p.stderr and "doctor" in p.stdout + p.stderr


def test_wrap_without_a_program(env):
    p = run([*PYVGPU, "wrap"], env=env)
    assert p.returncode == 2 and "PROGRAM" in p.stderr


def test_doctor_on_the_fake_driver(env):
    p = run([*PYVGPU, "doctor", "--json"], env=env)
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    assert checks["shim built"]["ok"]
    assert checks["CUDA driver found"]["ok"] and "CUDA 13.0" in checks["CUDA driver found"]["detail"]
    assert checks["NVML found"]["ok"]
    assert checks["libpython embeddable"]["ok"]
    assert checks["callback cache"]["ok"] and "compiled" in checks["callback cache"]["detail"]
    assert p.returncode == 0


def test_doctor_without_a_driver(env):
    env["LD_LIBRARY_PATH"] = "/nonexistent"
    p = run([*PYVGPU, "doctor"], env=env)
    assert p.returncode == 1
    assert "[FAIL] CUDA driver found" in p.stdout and "fix:" in p.stdout


def test_warmup_compiles_into_the_given_dir(env, tmp_path):
    env["PYVGPU_CACHE_DIR"] = str(tmp_path)
    # a cold compile: ~3 min on an idle 2-core box, several times that on a loaded one
    p = run([*PYVGPU, "warmup", "--json"], env=env, timeout=1800)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    assert m["object_path"].startswith(str(tmp_path))
    assert set(m["entries"]) == {e.abi for e in hooks.ENTRIES if e.policy}


def test_bench_overhead_runs_on_the_fake(env, tmp_path):
    out = tmp_path / "o.json"
    p = run([*PYVGPU, "bench", "overhead", "--rounds", "1", "--samples", "20", "--output", str(out)], env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    for op in ("launch", "alloc_free"):
        s = r["ops"][op]
        assert s["raw_ns"] > 0 and s["hook_ns"] > 0 and s["ratio"] > 0
    assert "ratio" in p.stdout and f"wrote {out}" in p.stderr
    # --json: the same result on stdout, and nothing else there
    p = run([*PYVGPU, "bench", "overhead", "--rounds", "1", "--samples", "20", "--json"], env=env)
    assert p.returncode == 0, p.stderr
    assert set(json.loads(p.stdout)["ops"]) == set(r["ops"])


# --- wrap parses like `docker run` ----------------------------------------------------------------

PY = sys.executable
SHOW = ("import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('CUDA_DEVICE_MEMORY_LIMIT'), "
        "os.environ.get('CUDA_DEVICE_SM_LIMIT')]))")


def shown(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("wrap_args,argv,cap", [
    # everything after PROGRAM is the program's, untouched: no cap from its -m
    ([PY, "-c", SHOW, "-m", "2G"], ["-m", "2G"], None),
    ([PY, "-c", SHOW, "--memory", "2G", "--sm", "30", "--help"], ["--memory", "2G", "--sm", "30", "--help"],
     None),
    # `--` before PROGRAM is allowed, and a `--` after PROGRAM is the program's
    (["--", PY, "-c", SHOW, "-m", "2G"], ["-m", "2G"], None),
    (["--memory", "64M", "--", PY, "-c", SHOW, "--", "x"], ["--", "x"], str(64 << 20)),
    (["--memory", "64M", PY, "-c", SHOW, "--", "-m", "2G"], ["--", "-m", "2G"], str(64 << 20)),
    (["-m", "64M", PY, "-c", SHOW], [], str(64 << 20)),
])
def test_wrap_gives_everything_after_program_to_the_program(env, wrap_args, argv, cap):
    got_argv, got_cap, got_sm = shown(run([*PYVGPU, "wrap", *wrap_args], env=env))
    assert got_argv == argv and got_cap == cap and got_sm is None


@pytest.mark.parametrize("wrap_args,bad,suggest", [
    (["--memroy", "4G", PY, "-c", "print('ran')"], "--memroy", "--memory"),
    (["--memory", "64M", "--sm30", PY, "-c", "print('ran')"], "--sm30", None),
    (["-x", "--", PY, "-c", "print('ran')"], "-x", None),
])
def test_wrap_refuses_an_unknown_option_before_program(env, wrap_args, bad, suggest):
    p = run([*PYVGPU, "wrap", *wrap_args], env=env)
    assert p.returncode == 2 and "ran" not in p.stdout
    assert f"No such option: {bad}" in p.stderr and "program not found" not in p.stderr
    if suggest:
        assert suggest in p.stderr.split(f"No such option: {bad}")[1]


def test_help_has_one_grammar(env):
    """No typer type placeholders (<bool>, <str>, <int>), extras visible, completion offered, the usage line."""
    p = run([*PYVGPU, "--help"], env=env)
    assert "--install-completion" in p.stdout
    for cmd in (["wrap"], ["status"], ["top"], ["exporter"], ["warmup"], ["doctor"], ["limits", "set"],
                ["bench", "overhead"], ["bench", "startup"], ["bench", "sm"], ["bench", "vpmm"]):
        p = run([*PYVGPU, *cmd, "--help"], env=env)
        assert p.returncode == 0, p.stderr
        assert "<" not in p.stdout.replace("<=", ""), (cmd, p.stdout)
        if cmd[0] == "bench" or cmd[0] in ("status", "doctor", "warmup"):
            assert "--json " in p.stdout
    assert "pip install 'pyvgpu[bench]'" in run([*PYVGPU, "bench", "sm", "--help"], env=env).stdout
    assert "Usage: pyvgpu wrap [OPTIONS] [--] PROGRAM [ARGS]..." in run([*PYVGPU, "wrap", "--help"], env=env).stdout


def test_the_quick_start_example_runs_or_says_what_it_needs(env):
    """examples/train.py (the README's quick start): trains, or names what is missing."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    p = run([PY, str(example), "--steps", "2", "--width", "8", "--batch", "4"], env=env, timeout=600)
    try:
        import torch  # noqa: F401
    except ImportError:
        assert p.returncode == 2 and "needs PyTorch: pip install torch" in p.stderr
    else:
        assert p.returncode == 0, p.stderr
        assert "2 steps in" in p.stdout and "loss" in p.stdout
