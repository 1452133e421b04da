"""VPMM called from threads whose current context is not the pool's (issue 32); prints JSON for
tests/test_vpmm_context.py. Run on the fake driver with two devices (FAKECUDA_DEVICES="64G,64G"): the fake
refuses, with CUDA_ERROR_INVALID_CONTEXT, every call made with no context, a destroyed one, or one of
another device than the call acts on (tests/fakecuda/fakecuda.c, CTX_ON), and counts the refusals.

    python vpmm_threads.py KIND

KIND is who calls the pool:
  main   the main thread, the device's primary context current (the control: it passed before the fix too)
  none   a thread that never had a context (PyTorch's autograd worker before its first kernel), on a pool
         made on the main thread
  other  a thread with device 1's primary context current that makes and uses a pool of device 0 (what
         pyvgpu.vpmm.pytorch.enable did for the second GPU of a machine)
  dead   a thread whose current context was destroyed, on a pool made on the main thread
  shim   the shim's pyvgpu_vpmm_malloc/free (PyTorch's CUDAPluggableAllocator's pair) from a thread that
         never had a context, growing the pool by a chunk, then trimming it from that thread

Each walks every path that calls the driver: a small request (cuMemAllocAsync/FreeAsync), preallocation,
the first chunk and a second one when the first is full (cuMemAddressReserve), new pages, a record_stream
free (events on a side stream), pages moved from a busy stream's region (cuStreamWaitEvent, zombies),
unmapping the zombies (trim without release), a malloc under memory pressure (giving free pages back),
a CUDA graph capture (relaxed capture mode, cuCtxSynchronize on release) and a full trim. After every
operation it reads the thread's current context: it must be the one the thread had.
"""

import ctypes
import json
import sys
import threading
import time

from pyvgpu.jit.vpmm import tables as T
from pyvgpu.vpmm.pool import VirtualMemoryPool

MiB = 1 << 20
cu = ctypes.CDLL("libcuda.so.1")
cu.fakecuda_ctx_refusals.restype = ctypes.c_uint64
cu.fakecuda_capture.argtypes = [ctypes.c_void_p, ctypes.c_int]
cu.fakecuda_mapped_pages.restype = ctypes.c_uint64
cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
cu.cuCtxDestroy_v2.argtypes = [ctypes.c_void_p]
POOL = {"page_size": 2 * MiB, "va_size": 16 * MiB, "gap": 0}


def current() -> int:
    c = ctypes.c_void_p()
    assert cu.cuCtxGetCurrent(ctypes.byref(c)) == 0
    return c.value or 0


def primary(dev: int) -> int:
    c = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev) == 0
    return c.value


def busy_stream(ms: int) -> int:
    """A stream of device 0 (made under its primary context) with ms of simulated work queued."""
    s, mod, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), 0) == 0
    assert cu.cuModuleLoadData(ctypes.byref(mod), b"fake module") == 0
    assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin") == 0
    iters = ctypes.c_uint32(ms * 10_000)  # 100 ns an iteration
    params = (ctypes.c_void_p * 1)(ctypes.addressof(iters))
    assert cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, None) == 0
    return s.value


class Steps:
    """Runs named steps on the calling thread: each must succeed and leave the thread's context as it was."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.failed: str | None = None
        self.ctx_changed: list[str] = []

    def __call__(self, name: str, fn):
        if self.failed:
            return None
        before = current()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - the report says which step failed and how
            self.failed = f"{name}: {type(e).__name__}: {e}"
            return None
        if current() != before:
            self.ctx_changed.append(name)
        self.done.append(name)
        return out


def exercise(steps: Steps, pool: VirtualMemoryPool, s: dict) -> None:
    a_s, side, cap = s["a"], s["side"], s["cap"]
    b_s = a_s + 0x1000  # another stream id (the pool only compares them; the fake treats it as the NULL stream)
    small = steps("small request", lambda: pool.malloc(1000, a_s))
    steps("small free", lambda: pool.free(small, a_s))
    a = steps("first chunk, new pages", lambda: pool.malloc(12 * MiB, a_s))
    b = steps("second chunk (growth)", lambda: pool.malloc(8 * MiB, a_s))
    steps("record_stream", lambda: pool.record_stream(b, side))
    steps("free with a side stream", lambda: pool.free(b, a_s))
    steps("free on a busy stream", lambda: pool.free(a, side))
    c = steps("pages moved from busy regions", lambda: pool.malloc(20 * MiB, b_s))
    steps("zombies made", lambda: None if pool.stats()["zombies"] > 0 else 1 / 0)
    steps("wait for the side stream", lambda: time.sleep(0.35))
    steps("unmap zombies (trim, no release)", lambda: pool.trim(release=False))
    steps("no zombie left", lambda: None if pool.stats()["zombies"] == 0 else 1 / 0)
    steps("free before pressure", lambda: pool.free(c, b_s))

    def pressured():
        pool.hd[T.H_PRESSURE] = 1  # what a refusal elsewhere in the group sets: the next malloc gives pages back
        before = pool.stats()["released_pages"]
        p = pool.malloc(2 * MiB, a_s)
        assert pool.stats()["released_pages"] > before, "no page was given back"
        return p

    d = steps("malloc under pressure", pressured)
    epoch = steps("capture begins", lambda: pool.capture_begin(cap))
    steps("fake capture on", lambda: cu.fakecuda_capture(cap, 1))
    g = steps("malloc during a capture", lambda: pool.malloc(6 * MiB, cap))
    steps("free during a capture", lambda: pool.free(g, cap))
    steps("fake capture off", lambda: cu.fakecuda_capture(cap, 0))
    steps("capture ends", lambda: pool.capture_end(cap))
    steps("graph memory released", lambda: pool.release_graph_memory(epoch))
    steps("free", lambda: pool.free(d, a_s))
    steps("trim", lambda: pool.trim())
    steps("everything given back", lambda: None if pool.stats()["pages"] == 0 else 1 / 0)


def shim_exercise(steps: Steps, pool: VirtualMemoryPool) -> None:
    from pyvgpu.native import shim
    from pyvgpu.vpmm import pool as vpmm

    lib = shim.loaded() or shim.open_shim()
    vpmm.install(lib, pool)
    lib.pyvgpu_vpmm_malloc.restype = ctypes.c_void_p
    lib.pyvgpu_vpmm_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.pyvgpu_vpmm_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

    def malloc(n):
        p = lib.pyvgpu_vpmm_malloc(n, 0, None)
        assert p, f"pyvgpu_vpmm_malloc({n}) returned NULL"
        return p

    ptrs = [steps(f"shim malloc {n >> 20} MiB" if n >= MiB else "shim malloc small", lambda n=n: (malloc(n), n))
            for n in (512, 8 * MiB, 12 * MiB, 6 * MiB)]
    steps("grew to a second chunk", lambda: None if pool.stats()["reserved_va"] > POOL["va_size"] else 1 / 0)
    for i, pn in enumerate(ptrs):
        if pn:
            steps(f"shim free {i}", lambda pn=pn: lib.pyvgpu_vpmm_free(pn[0], pn[1], 0, None))
    steps("all freed", lambda: None if pool.stats()["live"] == 0 and pool.stats()["small_live"] == 0 else 1 / 0)
    steps("trim", lambda: pool.trim())


def in_thread(target) -> None:
    t = threading.Thread(target=target, name="vpmm-caller")
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "the thread did not finish in 120 s"


def main(kind: str) -> dict:
    assert cu.cuInit(0) == 0
    ctx0, ctx1 = primary(0), primary(1)
    assert cu.cuCtxSetCurrent(ctx0) == 0  # the main thread: device 0's primary context, as PyTorch's would be
    streams = {"a": busy_stream(150), "side": busy_stream(300), "cap": busy_stream(0)}
    refusals0 = cu.fakecuda_ctx_refusals()
    steps = Steps()
    out: dict = {"kind": kind}
    pools: list[VirtualMemoryPool] = []

    def seen(thread_ctx: str):
        out["thread_context"] = thread_ctx

    if kind == "main":
        pools.append(VirtualMemoryPool(device=0, pages=2, **POOL))
        seen("primary 0")
        exercise(steps, pools[0], streams)
    elif kind == "none":
        pools.append(VirtualMemoryPool(device=0, **POOL))

        def body():
            seen("none" if current() == 0 else "unexpected")
            exercise(steps, pools[0], streams)

        in_thread(body)
    elif kind == "other":
        def body():
            assert cu.cuCtxSetCurrent(ctx1) == 0
            seen("primary 1")
            p = steps("pool made (2 pages preallocated)", lambda: VirtualMemoryPool(device=0, pages=2, **POOL))
            if p is not None:
                pools.append(p)
                exercise(steps, p, streams)

        in_thread(body)
    elif kind == "dead":
        pools.append(VirtualMemoryPool(device=0, **POOL))
        made = threading.Event()
        go = threading.Event()
        box = {}

        def body():
            c = ctypes.c_void_p()
            assert cu.cuCtxCreate_v2(ctypes.byref(c), 0, 0) == 0  # current on this thread
            box["ctx"] = c.value
            made.set()
            assert go.wait(60)
            seen("destroyed" if current() == box["ctx"] else "unexpected")
            exercise(steps, pools[0], streams)

        t = threading.Thread(target=body)
        t.start()
        assert made.wait(60)
        assert cu.cuCtxDestroy_v2(box["ctx"]) == 0  # destroyed from another thread
        go.set()
        t.join(timeout=120)
        assert not t.is_alive()
    elif kind == "shim":
        pools.append(VirtualMemoryPool(device=0, **POOL))

        def body():
            seen("none" if current() == 0 else "unexpected")
            shim_exercise(steps, pools[0])

        in_thread(body)
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    out.update(done=steps.done, failed=steps.failed, ctx_changed=steps.ctx_changed,
               ctx_refusals=cu.fakecuda_ctx_refusals() - refusals0,
               main_context_kept=current() == ctx0)
    if pools:
        st = pools[-1].stats()
        out["pool"] = {k: st.get(k) for k in ("mapped", "pages", "live", "context_switches", "entered_without_context",
                                               "entered_with_another_context")}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
