"""The command line: help, doctor, warmup, bench (figures printed, never asserted as timings)."""

from __future__ import annotations

import json

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
    p = run([*PYVGPU, "warmup", "--json"], env=env)
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
