"""Launch an empty kernel N times from each of T threads (ctypes, under `pyvgpu wrap`), print "done" and wait
for a line on stdin (the test reads the region meanwhile).

Usage: launch_threads.py THREADS LAUNCHES_PER_THREAD
"""

from __future__ import annotations

import ctypes
import sys
import threading

threads, per = int(sys.argv[1]), int(sys.argv[2])
cuda = ctypes.CDLL("libcuda.so.1")


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what}: CUresult {rc}")


check(cuda.cuInit(0), "cuInit")
dev, ctx, mod, fn = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
check(cuda.cuModuleLoadData(ctypes.byref(mod), b"\0" * 16), "cuModuleLoadData")
check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"empty"), "cuModuleGetFunction")
launch = cuda.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
start = threading.Barrier(threads)


def run() -> None:
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    start.wait()
    for _ in range(per):
        check(launch(fn, 1, 1, 1, 32, 1, 1, 0, None, None, None), "cuLaunchKernel")


ts = [threading.Thread(target=run) for _ in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print("done", flush=True)
sys.stdin.readline()
