"""Launch one spin kernel (the fake's: ITERS x 100 ns of simulated GPU time) in SHAPES launch shapes in turn, the
host sleeping GAP_US after each launch (its stream idle at every launch), for SECONDS; print the launch count.
Under `pyvgpu wrap`, each shape is a kernel of its own whose first launch is timed, as a decode loop's growing
sequence lengths make new shapes of the same functions.

With FILL, it first launches FILL other shapes once each (2 us kernels, no gap): more kernels than the cost
table holds, as a server's changing shapes make over hours.

Usage: shapes_loop.py SECONDS SHAPES GAP_US [FILL]
"""

from __future__ import annotations

import ctypes
import sys
import time

from cuda_host import check, cuda, fn, launch

seconds, shapes, gap = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) / 1e6
fill = int(sys.argv[4]) if len(sys.argv) > 4 else 0
iters = ctypes.c_uint32(2000)
params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(iters), ctypes.c_void_p))
tiny = ctypes.c_uint32(20)
tiny_params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(tiny), ctypes.c_void_p))
for k in range(fill):
    check(launch(fn, 100_000 + k, 1, 1, 32, 1, 1, 0, None, tiny_params, None), "cuLaunchKernel")
if fill:
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    time.sleep(0.5)
n = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    check(launch(fn, 1 + n % shapes, 1, 1, 32, 1, 1, 0, None, params, None), "cuLaunchKernel")
    n += 1
    time.sleep(gap)
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print(n, flush=True)
