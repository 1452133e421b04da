"""The shippable wheel (issue 13, item 4): built in one directory, installed into another venv from another.

The source tree is copied to a directory of its own and the wheel built there
(scripts/build_wheel.py: pip wheel, then auditwheel repair). The build
directory is then removed, the wheel installed into a new venv, and that
installation must pass `pyvgpu doctor` against the fake driver and run a
program under a cap. No binary in the wheel may hold a path of the build: not
the source directory, not the building Python or venv.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import clean_env, read_stats, run

ROOT = Path(__file__).resolve().parents[1]
BUILD_OUTPUTS = {"build", "dist", ".git", ".pytest_cache", ".ruff_cache", "__pycache__"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    """What a clean clone does not have: build outputs, and the shared objects a build put in the tree."""
    drop = {n for n in names if n in BUILD_OUTPUTS or n.endswith(".egg-info")}
    if Path(directory).resolve() == (ROOT / "pyvgpu").resolve():
        drop |= {n for n in names if n.startswith("libpyvgpu") or n == "bin"}
    return drop


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str]]:
    """(the repaired wheel, the paths of the build that must not appear in it); the build tree is gone."""
    where = tmp_path_factory.mktemp("build-here")
    src = where / f"pyvgpu-src-{secrets.token_hex(6)}"
    shutil.copytree(ROOT, src, ignore=_ignore)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_wheel
    finally:
        sys.path.pop(0)
    wheel = build_wheel.build(tmp_path_factory.mktemp("dist"), src, isolation=False)
    shutil.rmtree(src)
    return wheel, [str(src), str(where), sys.prefix, sys.base_prefix, str(ROOT)]


def test_the_wheel_is_manylinux_for_any_python3(built):
    wheel, _ = built
    name = wheel.name
    assert name.startswith("pyvgpu-") and "-py3-none-manylinux_" in name and name.endswith("_x86_64.whl"), name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for f in ("pyvgpu/libpyvgpu.so", "pyvgpu/libpyvgpu_group.so", "pyvgpu/libpyvgpu_callbacks.so",
              "pyvgpu/libpyvgpu_callbacks.json", "pyvgpu/bin/pv_bench"):
        assert f in names
    assert not any(n.startswith("pyvgpu.libs/") for n in names)  # auditwheel grafted nothing: libc only


def test_no_path_of_the_build_is_in_its_binaries(built):
    wheel, build_paths = built
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if not (n.endswith((".so", ".json")) or "/bin/" in n):
                continue
            data = z.read(n)
            for p in build_paths:
                assert p.encode() not in data, f"{n} holds {p}"


@pytest.fixture(scope="module")
def other_venv(built, tmp_path_factory) -> Path:
    """A new venv with the wheel installed; its dependencies come from this environment (no network here)."""
    wheel, _ = built
    venv = tmp_path_factory.mktemp("elsewhere") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
                   check=True, cwd=str(venv))
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # after the venv's own site-packages: its pyvgpu is the wheel's, numba and typer are this environment's
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _env(fake: Path, tmp: Path) -> dict[str, str]:
    env = clean_env(LD_LIBRARY_PATH=str(fake), PYVGPU_CACHE_DIR=str(tmp / "empty-cache"), PYVGPU_MIN_MEMORY="1M",
                    PYVGPU_SCHED=str(tmp / "turns"))
    env.pop("PYTHONPATH")
    return env


def test_the_installed_wheel_passes_doctor(other_venv, fake, tmp_path):
    p = run([str(other_venv / "bin" / "pyvgpu"), "doctor", "--json"], env=_env(fake, tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    assert all(c["ok"] for c in checks.values()), checks
    assert str(other_venv) in checks["shim built"]["detail"]
    assert str(other_venv) in checks["compiled callbacks"]["detail"]  # the packaged ones: nothing compiled


def test_the_installed_wheel_runs_a_program_under_its_cap(other_venv, fake, tmp_path):
    env = _env(fake, tmp_path)
    stats = tmp_path / "stats"
    stats.mkdir()
    p = run([str(other_venv / "bin" / "pyvgpu"), "wrap", "--memory", "4M", "--stats-file",
             str(stats / "stats-%p.json"), "--", str(fake / "host_mem_linked"), "boundary", str(4 << 20)], env=env)
    assert "first=0 one_more=2 free=0 after_free=0" in p.stdout, p.stdout + p.stderr
    assert "compiling" not in p.stderr
    (s,) = read_stats(stats)
    assert s["bootstrap"] == "native" and os.path.realpath(s["callbacks"]).startswith(str(other_venv.resolve()))
