"""Launch an empty kernel on device 0, then on device 1, in turn from one thread (ctypes, under `pyvgpu wrap`),
print "done" and wait for a line on stdin (the test reads the region meanwhile).

Usage: launch_devices.py ROUNDS PER_ROUND primary|create|hidden

Device 1's context is its primary context (primary), one of cuCtxCreate_v2 (create), or its primary context
retained through the driver's own function, which the hooks do not see (hidden: the shim's
pyvgpu_real_function), as a context made by a call pyvgpu does not cover would be.
"""

from __future__ import annotations

import ctypes
import sys

from cuda_host import check, ctx, cuda, fn, launch

rounds, per, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx1, mod1, fn1 = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
if how == "primary":
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx1), 1), "cuDevicePrimaryCtxRetain")
elif how == "create":
    check(cuda.cuCtxCreate_v2(ctypes.byref(ctx1), 0, 1), "cuCtxCreate_v2")
else:
    real = ctypes.CDLL(None).pyvgpu_real_function
    real.restype, real.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    addr = real(b"cuDevicePrimaryCtxRetain")
    if not addr:
        raise SystemExit("pyvgpu_real_function(cuDevicePrimaryCtxRetain): not found")
    retain = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)(addr)
    check(retain(ctypes.byref(ctx1), 1), "the driver's own cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx1), "cuCtxSetCurrent")
check(cuda.cuModuleLoadData(ctypes.byref(mod1), b"\0" * 16), "cuModuleLoadData")
check(cuda.cuModuleGetFunction(ctypes.byref(fn1), mod1, b"kernel"), "cuModuleGetFunction")
for _ in range(rounds):
    for c, f in ((ctx, fn), (ctx1, fn1)):
        check(cuda.cuCtxSetCurrent(c), "cuCtxSetCurrent")
        for _ in range(per):
            check(launch(f, 1, 1, 1, 32, 1, 1, 0, None, None, None), "cuLaunchKernel")
for c in (ctx, ctx1):
    check(cuda.cuCtxSetCurrent(c), "cuCtxSetCurrent")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print("done", flush=True)
sys.stdin.readline()
