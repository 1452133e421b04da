"""Fixtures for the CPU suite: the fake driver and a warm callback cache.

Wrapped programs run as real subprocesses with LD_PRELOAD (through
`pyvgpu wrap`) and LD_LIBRARY_PATH pointing at the fake driver.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "fakecuda"))

from helpers import clean_env  # noqa: E402

from pyvgpu.native.shim import missing_fix, shim_path  # noqa: E402

# VPMM's allocator is compiled by numba at its first use (about a minute on a 2-core machine; cached per
# source version in the user's cache). When VPMM tests were collected, the suite starts that compile in the
# background at once, on the core the mostly one-process-at-a-time tests leave idle, and waits for it before
# the first test that needs it or that measures time on the simulated GPU (a compile beside those would only
# add load they must tolerate, and they come before the VPMM tests).
_VPMM_COMPILE: dict = {}
WAIT_FOR_VPMM = ("test_compute", "test_turns", "test_vpmm", "test_gpu_vpmm", "test_security")


def _start_vpmm_compile() -> None:
    log = tempfile.TemporaryFile()
    code = "from pyvgpu.vpmm import pool as vpmm; vpmm._entries()"  # in the callback library: compiled when it was
    _VPMM_COMPILE["proc"] = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                                             cwd="/")
    _VPMM_COMPILE["log"] = log


def _wait_for_vpmm_compile() -> None:
    proc = _VPMM_COMPILE.pop("proc", None)
    if proc is None:
        return
    try:
        rc = proc.wait(timeout=1800)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "killed after 1800 s"
    log = _VPMM_COMPILE.pop("log")
    if rc != 0:
        log.seek(0)
        pytest.fail(f"compiling VPMM's allocator in the background failed ({rc}):\n"
                    + log.read().decode(errors="replace")[-3000:], pytrace=False)
    log.close()


def pytest_runtest_setup(item):
    if item.module.__name__.rsplit(".", 1)[-1].startswith(WAIT_FOR_VPMM):
        _wait_for_vpmm_compile()


def pytest_collection_modifyitems(session, config, items):
    if any(i.module.__name__.rsplit(".", 1)[-1].startswith(("test_vpmm", "test_gpu_vpmm")) for i in items):
        _start_vpmm_compile()


def pytest_sessionfinish(session):
    proc = _VPMM_COMPILE.pop("proc", None)
    if proc is not None:
        proc.kill()
        proc.wait()


def pytest_sessionstart(session):
    if not shim_path().exists():
        raise pytest.UsageError(
            f"{shim_path()} is missing: the pyvgpu under test has no shim; {missing_fix()}."
        )


@pytest.fixture(scope="session")
def fake(tmp_path_factory) -> Path:
    """Directory with the fake libcuda.so.1, libnvidia-ml.so.1 and the test hosts."""
    from build import build

    return build(tmp_path_factory.mktemp("fakecuda"))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The compiled callbacks, shared by every session: the user's cache (PYVGPU_CACHE_DIR or
    ~/.cache/pyvgpu), compiled once per source version. Its key covers every source the machine code is
    compiled from (pyvgpu/native/cache.py), so a stale entry is never used; tests that need an empty cache make
    their own."""
    from pyvgpu.native import cache

    d = cache.cache_dir()
    cache.ensure(d, workers=cache.cli_workers())
    return d


@pytest.fixture
def env(fake, cache_dir, tmp_path) -> dict[str, str]:
    """Environment for a wrapped program on the fake driver (with a turn file of the test's own).

    The fake's contexts take no memory unless asked (FAKECUDA_CTX_BYTES), so caps of a few MiB are
    meaningful here: PYVGPU_MIN_MEMORY lowers the 64 MiB floor a real GPU needs (tests/test_sizes.py
    checks the floor itself)."""
    return clean_env(LD_LIBRARY_PATH=str(fake), PYVGPU_CACHE_DIR=str(cache_dir),
                     PYVGPU_SCHED=str(tmp_path / "turns"), PYVGPU_MIN_MEMORY="1M")


@pytest.fixture(scope="session")
def tuned_cache(tmp_path_factory, fake) -> Path:
    """A cache holding a library tuned for this CPU, compiled once per session by `pyvgpu warmup` (minutes on
    a 2-core machine: the only compile of the suite). Tests copy it before changing anything."""
    import json

    from helpers import PYVGPU, run

    d = tmp_path_factory.mktemp("tuned") / "cache"
    p = run([*PYVGPU, "warmup", "--json"], env=clean_env(PYVGPU_CACHE_DIR=str(d)), timeout=1800)
    assert p.returncode == 0, p.stderr
    (d.parent / "warmup.json").write_text(p.stdout)  # what it printed, for tests/test_cli.py
    (d.parent / "warmup.stderr").write_text(p.stderr)
    assert json.loads(p.stdout)["library"].startswith(str(d))
    return d
