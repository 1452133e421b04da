"""Which driver calls VPMM makes need the calling thread's context, on this driver (issue 32); prints JSON.

    python tests/gpu/vpmm_ctx_probe.py

1. A new thread, no context current: each call VPMM makes (pyvgpu/jit/vpmm/driver.py), with handles and
   streams of device 0's primary context, and its CUresult (201: CUDA_ERROR_INVALID_CONTEXT); then the same
   after cuCtxSetCurrent(primary) on that thread (the fix: every entry point does this).
2. With PyTorch: the context current on autograd's worker thread when the first backward node runs (before
   its first kernel): None is what made a VPMM malloc there fail.
The fake driver refuses every one of these calls without a context (tests/fakecuda/fakecuda.c); this says
which ones the real driver refuses. Needs a GPU (exit 2 without one).
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading

c_u64, c_sz, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_uint), ("handle_types", ctypes.c_uint), ("loc_type", ctypes.c_uint),
                ("loc_id", ctypes.c_int), ("win32", vp), ("compression", ctypes.c_ubyte), ("rdma", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", ctypes.c_uint), ("loc_id", ctypes.c_int), ("flags", ctypes.c_uint)]


def driver():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(f"vpmm_ctx_probe: no CUDA driver ({e})", file=sys.stderr)
        raise SystemExit(2) from None
    if cu.cuInit(0) != 0:
        print("vpmm_ctx_probe: cuInit failed: no GPU", file=sys.stderr)
        raise SystemExit(2)
    cu.cuCtxSetCurrent.argtypes = [vp]
    cu.cuMemMap.argtypes = [c_u64, c_sz, c_sz, c_u64, c_u64]
    cu.cuMemUnmap.argtypes = [c_u64, c_sz]
    cu.cuMemRelease.argtypes = [c_u64]
    cu.cuMemAddressFree.argtypes = [c_u64, c_sz]
    cu.cuMemSetAccess.argtypes = [c_u64, c_sz, vp, c_sz]
    cu.cuMemAddressReserve.argtypes = [vp, c_sz, c_sz, c_u64, c_u64]
    cu.cuMemCreate.argtypes = [vp, c_sz, vp, c_u64]
    cu.cuStreamIsCapturing.argtypes = [vp, vp]
    cu.cuEventRecord.argtypes = [vp, vp]
    cu.cuEventQuery.argtypes = [vp]
    cu.cuStreamWaitEvent.argtypes = [vp, vp, ctypes.c_uint]
    cu.cuMemAllocAsync.argtypes = [vp, c_sz, vp]
    cu.cuMemFreeAsync.argtypes = [c_u64, vp]
    cu.cuMemPoolTrimTo.argtypes = [vp, c_sz]
    return cu


def calls(cu, ev: int, pool: int) -> dict:
    """Every kind of call VPMM makes, in order, on the calling thread; their CUresults."""
    out = {}
    cur = vp()
    cu.cuCtxGetCurrent(ctypes.byref(cur))
    out["current context"] = "none" if not cur.value else "set"
    st = ctypes.c_int()
    out["cuStreamIsCapturing(NULL)"] = cu.cuStreamIsCapturing(None, ctypes.byref(st))
    page = 2 << 20
    va = c_u64()
    out["cuMemAddressReserve"] = cu.cuMemAddressReserve(ctypes.byref(va), page, page, 0, 0)
    prop = Prop(type=1, loc_type=1, loc_id=0)
    h = c_u64()
    out["cuMemCreate"] = cu.cuMemCreate(ctypes.byref(h), page, ctypes.byref(prop), 0)
    out["cuMemMap"] = cu.cuMemMap(va.value, page, 0, h.value, 0) if va.value and h.value else "skipped"
    acc = Access(loc_type=1, loc_id=0, flags=3)
    out["cuMemSetAccess"] = cu.cuMemSetAccess(va.value, page, ctypes.byref(acc), 1) if out["cuMemMap"] == 0 \
        else "skipped"
    out["cuMemUnmap"] = cu.cuMemUnmap(va.value, page) if out["cuMemMap"] == 0 else "skipped"
    out["cuMemRelease"] = cu.cuMemRelease(h.value) if h.value else "skipped"
    out["cuMemAddressFree"] = cu.cuMemAddressFree(va.value, page) if va.value else "skipped"
    e = vp()
    out["cuEventCreate"] = cu.cuEventCreate(ctypes.byref(e), 2)
    out["cuEventQuery (main's event)"] = cu.cuEventQuery(ev)
    out["cuEventRecord (main's event, NULL)"] = cu.cuEventRecord(ev, None)
    out["cuStreamWaitEvent(NULL, main's event)"] = cu.cuStreamWaitEvent(None, ev, 0)
    p = c_u64()
    out["cuMemAllocAsync(NULL)"] = cu.cuMemAllocAsync(ctypes.byref(p), 1024, None)
    out["cuMemFreeAsync(NULL)"] = cu.cuMemFreeAsync(p.value, None) if p.value else "skipped"
    out["cuMemPoolTrimTo"] = cu.cuMemPoolTrimTo(pool, 0)
    out["cuCtxSynchronize"] = cu.cuCtxSynchronize()
    return out


def autograd_thread_context() -> dict:
    try:
        import torch
    except ImportError:
        return {"skipped": "no PyTorch"}
    cu = ctypes.CDLL("libcuda.so.1")
    seen = {}

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            c = vp()
            cu.cuCtxGetCurrent(ctypes.byref(c))
            seen["thread"] = threading.current_thread().name
            seen["context"] = "none" if not c.value else "set"
            return g * 2

    x = torch.randn(4, device="cuda", requires_grad=True)
    Probe.apply(x.sum()).backward()
    return {"backward ran on": seen.get("thread"), "context at the first backward node": seen.get("context"),
            "torch": torch.__version__}


def main() -> None:
    cu = driver()
    ctx = vp()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    ev, pool = vp(), vp()
    assert cu.cuEventCreate(ctypes.byref(ev), 2) == 0
    assert cu.cuEventRecord(ev, None) == 0
    cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0)
    version = ctypes.c_int()
    cu.cuDriverGetVersion(ctypes.byref(version))
    out = {"driver": version.value}

    def body():
        out["without a context"] = calls(cu, ev, pool)
        cu.cuCtxSetCurrent(ctx)
        out["with the primary context set"] = calls(cu, ev, pool)

    t = threading.Thread(target=body)
    t.start()
    t.join(120)
    out["autograd"] = autograd_thread_context()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
