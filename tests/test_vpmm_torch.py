"""What VPMM gives PyTorch beyond malloc and free, checked on the CPU (tests/gpu/test_gpu_vpmm.py checks
them with PyTorch on a GPU):

* a refusal is thrown as c10::OutOfMemoryError (torch.OutOfMemoryError in Python), through the C++ ABI
  from the shim's C, and any other failure as c10::Error (RuntimeError);
* the pool's statistics under torch.cuda.memory_stats' key names, and a snapshot in memory_snapshot's shape;
* record_stream: a freed allocation waits for its side streams;
* CUDA graph capture: no event query while a capture runs, the capture's memory kept for it.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run
from test_vpmm import CASES, MiB

MOCK = Path(__file__).resolve().parent / "hosts" / "c10_mock"


def case(env, *args: str) -> dict:
    p = run([sys.executable, str(CASES), *args], env=dict(env, FAKECUDA_DEVICES="256G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def oom_host(tmp_path_factory) -> Path:
    """The stand-in libc10 (PyTorch's exception classes, our bodies) and a C++ host that catches what the
    shim throws through it."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler (g++) to build the stand-in libc10 and its host")
    d = tmp_path_factory.mktemp("c10")
    vis = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]  # PyTorch's: inline members stay unexported
    for cmd in ([cxx, "-shared", "-fPIC", "-O1", *vis, "-Wl,-soname,libc10.so", "-o", str(d / "libc10.so"),
                 str(MOCK / "c10_mock.cpp")],
                [cxx, "-shared", "-fPIC", "-O1", *vis, "-Wl,-soname,libc10_cuda.so", "-o",
                 str(d / "libc10_cuda.so"), str(MOCK / "c10_cuda_mock.cpp"), f"-L{d}", "-lc10", f"-Wl,-rpath,{d}"],
                [cxx, "-O1", "-o", str(d / "host"), str(MOCK / "oom_host.cpp"), f"-L{d}",
                 "-Wl,--no-as-needed", "-lc10_cuda", "-lc10", "-ldl", f"-Wl,-rpath,{d}"]):  # both loaded, as in torch
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
    return d / "host"


def test_the_stand_in_libc10_exports_what_pytorch_2_11_does(oom_host):
    """What the shim finds by name must be what PyTorch's libraries export (nm -D of the 2.11 wheel): no
    c10::Error destructor anywhere (a GPU run, docs/measurements.md: the shim looked one up, found none, and every
    refusal became a RuntimeError), OutOfMemoryError's typeinfo and vtable in libc10_cuda only."""
    c10 = ctypes.CDLL(str(oom_host.parent / "libc10.so"))
    cuda = ctypes.CDLL(str(oom_host.parent / "libc10_cuda.so"))
    for lib in (c10, cuda):
        assert not hasattr(lib, "_ZN3c105ErrorD1Ev") and not hasattr(lib, "_ZN3c105ErrorD2Ev")
        assert not hasattr(lib, "_ZN3c1016OutOfMemoryErrorD1Ev")
    assert hasattr(c10, "_ZN3c106detail14torchCheckFailEPKcS2_jS2_")
    assert hasattr(c10, "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE")
    assert not hasattr(c10, "_ZTIN3c1016OutOfMemoryErrorE")
    assert hasattr(cuda, "_ZTIN3c1016OutOfMemoryErrorE") and hasattr(cuda, "_ZTVN3c1016OutOfMemoryErrorE")


def test_a_refusal_is_thrown_as_c10_out_of_memory_error(oom_host):
    """PyTorch's CUDAPluggableAllocator passes on whatever the malloc throws; its Python binding turns
    c10::OutOfMemoryError into torch.OutOfMemoryError and c10::Error into RuntimeError."""
    from pyvgpu.native.shim import shim_path

    p = subprocess.run([str(oom_host), str(shim_path())], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cannot throw" not in p.stderr, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("OutOfMemoryError: CUDA out of memory: pyvgpu VPMM could not map 1073741824 bytes "
                               "on device 0"), lines
    assert lines[1] == "Error: pyvgpu VPMM: malloc(1073741824) on device 1 failed: CUresult 999", lines


# torch.cuda.memory_stats' documented key families (torch/cuda/memory.py): every one is answered
CORE = ("allocation", "allocated_bytes", "active", "active_bytes", "requested_bytes", "reserved_bytes", "segment",
        "inactive_split", "inactive_split_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
            "num_oom_rejections", "max_split_size")


def test_memory_stats_under_pytorchs_key_names(env):
    """5 MiB (3 pages), 1000 bytes (cuMemAllocAsync), and 8 MiB allocated and freed."""
    r = case(env, "stats")
    s = r["stats"]
    for name in CORE:
        for pool in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{metric}" in s, f"{name}.{pool}.{metric}"
    for k in COUNTERS:
        assert k in s, k
    for k in ("oversize_allocations", "oversize_segments"):
        assert all(f"{k}.{m}" in s for m in ("current", "peak", "allocated", "freed"))
    assert s["allocated_bytes.large_pool.current"] == 6 * MiB and s["allocated_bytes.small_pool.current"] == 1000
    assert s["allocated_bytes.all.current"] == 6 * MiB + 1000
    assert s["allocated_bytes.all.peak"] == 14 * MiB + 1000 and s["allocated_bytes.all.freed"] == 8 * MiB
    assert s["requested_bytes.large_pool.current"] == 5 * MiB  # what was asked, before page rounding
    assert s["allocation.all.current"] == 2 and s["allocation.all.allocated"] == 3
    assert s["reserved_bytes.large_pool.current"] == 14 * MiB  # 3 + 4 pages mapped, the 4 free ones kept
    assert s["reserved_bytes.all.peak"] == 14 * MiB + 1000  # every byte the pool took, small ones included
    assert s["segment.large_pool.current"] == 7 and s["num_ooms"] == 0 and s["max_split_size"] == -1
    assert s["num_device_alloc"] == 7 + 1  # 7 cuMemMap, 1 cuMemAllocAsync
    seg = r["snapshot"]
    assert [b["state"] for g in seg for b in g["blocks"]] == ["active_allocated", "inactive"]
    assert seg[0]["total_size"] == 14 * MiB and seg[0]["allocated_size"] == 6 * MiB
    assert seg[0]["blocks"][0]["requested_size"] == 5 * MiB and seg[0]["is_expandable"]
    assert r["peak_after_reset"] == 6 * MiB + 1000  # reset_peak_memory_stats: the peak is the current value


def test_record_stream_makes_the_free_wait_for_the_side_stream(env):
    r = case(env, "record_stream")
    # the side stream is busy: the same-stream request gets the memory back only after a GPU-side wait
    assert r["same_address"] and r["waits"] == 1
    assert r["without"] == {"same_address": True, "waits": 0}
    assert r["small"] == {"cuStreamWaitEvent": 1, "cuMemFreeAsync": 1}  # small requests too
    assert "not a live allocation" in r["bad"]


def test_graph_capture_queries_nothing_and_keeps_its_memory(env):
    """On the fake, while a stream captures, event queries, waits and records on it, and VMM calls from a
    thread not in relaxed mode fail (as on a real driver in global capture mode, PyTorch's default, which
    would also invalidate the capture), and are counted."""
    r = case(env, "capture")
    assert r["violations"] == 0
    # it did create and map a page during the capture, in relaxed mode (set and restored around each
    # malloc), and queried and recorded nothing
    d = r["during"]
    assert d["cuMemCreate"] >= 1 and d["cuMemMap"] >= 1 and d["cuEventQuery"] == 0 and d["cuEventRecord"] == 0
    assert d["cuThreadExchangeStreamCaptureMode"] == 2 * 3  # three mallocs during the capture
    assert r["epoch"] == 1 and r["reuse_inside"] and r["small_is_page"]
    assert r["graph_frees_record_nothing"]  # the graph's memory needs no event: only its capture reuses it
    # the ordinary allocation freed during the capture gets its event at the first operation after it, and
    # is then reused as usual
    assert r["deferred_recorded"] and r["eager_reused_after"]
    assert r["graph_memory_kept"]  # after the capture, the graph's memory is not given to anyone else
    assert r["release"] >= 1 and r["reused_after_release"]  # until the graph is gone (CUDAGraph.reset)


def test_a_capture_keeps_the_epoch_pytorch_announced(env):
    """PyTorch allocates on the capture stream between announcing the capture (pyvgpu.vpmm.pytorch's hook on
    CUDAGraph.capture_begin) and starting it (the RNG generator's graph-safe state). Those allocations must
    not end the announced epoch: the capture's memory is the announced epoch's, and releasing it (the
    CUDAGraph.reset hook) leaves no region of any capture (tests/gpu once found 4 left on a GPU)."""
    r = case(env, "capture_prologue")
    assert r["tags_before_reset"] == [r["epoch"]], r
    assert r["released"] >= 2 and r["tags_after_reset"] == [], r
