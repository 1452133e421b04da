"""What the ctypes test hosts share: the fake (or real) driver, a context on device 0 and its one kernel.

    from cuda_host import check, cuda, fn, launch      (a host run as a script finds this module beside it)
"""

from __future__ import annotations

import ctypes

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
check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"kernel"), "cuModuleGetFunction")
launch = cuda.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
