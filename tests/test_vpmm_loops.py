"""The GPU-side tools of issue 32 on a machine without PyTorch or a GPU: they import, take their arguments,
and fail with one clear line and exit status 2 ("could not run"), never a traceback or a PASS."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers import PYVGPU, run

ROOT = Path(__file__).resolve().parents[1]


def no_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return True
    return False


def test_the_loops_say_what_they_need(env):
    for kind in ("decode", "train", "repro"):
        p = run([sys.executable, "-m", "pyvgpu.bench.vpmm_loops", kind, "1"], env=env)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "Traceback" not in p.stderr and not p.stdout.strip()
        want = "the VPMM loops need PyTorch" if no_torch() else "the VPMM loops need a CUDA GPU"
        assert want in p.stderr, p.stderr
    p = run([sys.executable, "-m", "pyvgpu.bench.vpmm_loops", "decode", "soon"], env=env)
    assert p.returncode == 2 and "SECONDS 'soon'" in p.stderr


def test_bench_vpmm_workload_checks_its_input_and_reports_a_run_that_cannot_start(env):
    p = run([*PYVGPU, "bench", "vpmm", "--workload", "bogus"], env=env)
    assert p.returncode != 0 and "give trace, decode, train or all" in p.stderr, p.stderr
    p = run([*PYVGPU, "bench", "vpmm", "--workload", "train", "--seconds", "1", "--rounds", "1"], env=env,
            timeout=600)
    assert p.returncode != 0
    assert "bench vpmm: the train run under default failed" in p.stderr and "Traceback" not in p.stderr


def test_repro_and_soak_scripts_cannot_pass_without_a_gpu(env):
    for script, args in (("vpmm_repro.py", ["--torch-decoder", "--seconds", "1"]),
                         ("vpmm_soak.py", ["--seconds", "1"])):
        p = run([sys.executable, str(ROOT / "scripts" / script), *args], env=env, timeout=600)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "PASS" not in p.stdout and "Traceback" not in p.stderr
    p = run([sys.executable, str(ROOT / "scripts" / "vpmm_soak.py"), "--seconds", "0"], env=env)
    assert p.returncode == 2 and "give a positive number of seconds" in p.stderr
