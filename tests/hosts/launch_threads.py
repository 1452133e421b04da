"""Launch an empty kernel N times from each of T threads (ctypes, under `pyvgpu wrap`), print "done" and wait
for a line on stdin (the test reads the region meanwhile).

Usage: launch_threads.py THREADS LAUNCHES_PER_THREAD
"""

from __future__ import annotations

import sys
import threading

from cuda_host import check, ctx, cuda, fn, launch

threads, per = int(sys.argv[1]), int(sys.argv[2])
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
