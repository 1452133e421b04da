"""The process's first gated timing comes while its other stream captures a graph in the global mode (the fake's
fakecuda_capture): the timing gate's pinned page is made then. A kernel's first launch is timed ungated, so the
kernel is launched once before the capture, then 300 times during it (one launch in 256 is timed). Prints the
launches' result and the fake's capture violations as JSON (run under `pyvgpu wrap --sm ...`).
"""

from __future__ import annotations

import ctypes
import json
import time

from cuda_host import check, cuda, fn, launch

cuda.fakecuda_capture.argtypes = [ctypes.c_void_p, ctypes.c_int]
cuda.fakecuda_capture_violations.restype = ctypes.c_uint64
captured, other = ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuStreamCreate(ctypes.byref(captured), 0), "cuStreamCreate")
check(cuda.cuStreamCreate(ctypes.byref(other), 0), "cuStreamCreate")
check(launch(fn, 1, 1, 1, 32, 1, 1, 0, other, None, None), "cuLaunchKernel")  # timed: a new kernel
time.sleep(0.3)  # past the shortest time between two timings, and the watcher has ticked (a gate needs it)
cuda.fakecuda_capture(captured, 1)
rc = 0
for _ in range(300):
    rc = rc or launch(fn, 1, 1, 1, 32, 1, 1, 0, other, None, None)
violations = cuda.fakecuda_capture_violations()
cuda.fakecuda_capture(captured, 0)
print(json.dumps({"launch": rc, "violations": violations}))
