"""GPU tests run only where a real NVIDIA driver answers; elsewhere they are skipped, never passed."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _real_gpu() -> str | None:
    if os.environ.get("LD_LIBRARY_PATH", "").find("fakecuda") >= 0:
        return "the fake driver is on LD_LIBRARY_PATH"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no libcuda.so.1"
    if lib.cuInit(0) != 0:
        return "cuInit failed"
    n = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
        return "no CUDA device"
    name = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(name, 256, 0)
    if name.value.startswith(b"Fake"):
        return "the fake driver answered"
    return None


_WHY = _real_gpu()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if _WHY:
                item.add_marker(pytest.mark.skip(reason=f"needs a real GPU: {_WHY}"))


@pytest.fixture(scope="session")
def hosts(tmp_path_factory) -> Path:
    """The test hosts, built here; they run against the real driver (libcuda.so.1 by soname)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakecuda"))
    from build import build

    return build(tmp_path_factory.mktemp("hosts"))
