"""VPMM and CUDA contexts (issue 32): every driver call the pool makes runs with its device's primary context
current, on whichever thread calls it, and the thread's own context is given back afterwards.

PyTorch calls its allocator from threads that may have no current context: the autograd engine's device
thread skips cudaSetDevice when cudaGetDevice already names the device (c10::cuda::SetDevice), so until
its first kernel binds the primary context it has none; and on a machine with two GPUs the pools were
made on a thread where the first GPU's context was current. The fake driver refuses, with
CUDA_ERROR_INVALID_CONTEXT, every call made with no context, a destroyed one, or another device's
(tests/fakecuda/fakecuda.c); each scenario runs in its own process (tests/hosts/vpmm_threads.py) on two
fake devices, through every path that calls the driver, those reached only after the pool grew to a
second VA chunk or after a trim included.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run

HOST = Path(__file__).resolve().parent / "hosts" / "vpmm_threads.py"

# every step of tests/hosts/vpmm_threads.py's exercise, in order (the test fails if one is skipped)
STEPS = ["small request", "small free", "first chunk, new pages", "second chunk (growth)", "record_stream",
         "free with a side stream", "free on a busy stream", "pages moved from busy regions", "zombies made",
         "wait for the side stream", "unmap zombies (trim, no release)", "no zombie left", "free before pressure",
         "malloc under pressure", "capture begins", "fake capture on", "malloc during a capture",
         "free during a capture", "fake capture off", "capture ends", "graph memory released", "free", "trim",
         "everything given back"]
SHIM_STEPS = ["shim malloc small", "shim malloc 8 MiB", "shim malloc 12 MiB", "shim malloc 6 MiB",
              "grew to a second chunk", "shim free 0", "shim free 1", "shim free 2", "shim free 3", "all freed",
              "trim"]


def scenario(env, kind: str) -> dict:
    p = run([sys.executable, str(HOST), kind], env=dict(env, FAKECUDA_DEVICES="64G,64G"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind,thread_context,steps", [
    ("main", "primary 0", STEPS),
    ("none", "none", STEPS),
    ("other", "primary 1", ["pool made (2 pages preallocated)", *STEPS]),
    ("dead", "destroyed", STEPS),
    ("shim", "none", SHIM_STEPS),
])
def test_every_driver_call_runs_in_the_pools_context(env, kind, thread_context, steps):
    r = scenario(env, kind)
    assert r["thread_context"] == thread_context  # the scenario really ran where it says
    assert r["failed"] is None, r["failed"]
    assert r["done"] == steps
    assert r["ctx_refusals"] == 0  # no driver call of the pool ran without its device's context
    assert r["ctx_changed"] == []  # each thread got its own context back (none, another device's, a dead one)
    assert r["main_context_kept"]
    pool = r["pool"]
    assert pool["live"] == 0 and pool["pages"] == 0 and pool["mapped"] == 0
    if kind == "main":
        assert pool["context_switches"] == 0  # the common case costs one cuCtxGetCurrent, no switch
    else:
        assert pool["context_switches"] > 0
        assert (pool["entered_without_context"] > 0) == (kind in ("none", "shim"))
        assert (pool["entered_with_another_context"] > 0) == (kind in ("other", "dead"))


def test_with_the_switch_off_the_old_failure_comes_back(env):
    """VPMM_CONTEXT=caller (a diagnostic) makes the calls in the calling thread's context, as before the fix:
    from a thread without one, the first call fails with the issue's CUresult 201. (On a GPU the same switch
    shows whether the driver refuses them there: tests/gpu/test_gpu_vpmm_loops.py.)"""
    r = scenario(dict(env, VPMM_CONTEXT="caller"), "none")
    assert r["failed"] == "small request: PyvgpuError: VPMM malloc(1000): the driver returned CUresult 201; the " \
                          "pool is unchanged"
    assert r["ctx_refusals"] == 1


def test_vpmm_context_takes_pool_or_caller():
    from pyvgpu.errors import PyvgpuError
    from pyvgpu.vpmm.pool import VirtualMemoryPool

    with pytest.raises(PyvgpuError, match=r"VPMM_CONTEXT=thread: give 'pool' \(the default"):
        VirtualMemoryPool(env={"VPMM_CONTEXT": "thread"})
