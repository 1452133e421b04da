"""CuPy under a cap: its view of memory, and an OutOfMemoryError past the cap."""

import json

import cupy

GiB = 1 << 30
free, total = cupy.cuda.runtime.memGetInfo()
a = cupy.empty(3 * GiB, dtype=cupy.uint8)
try:
    b = cupy.empty(2 * GiB, dtype=cupy.uint8)
    oom = False
except cupy.cuda.memory.OutOfMemoryError:
    oom = True
print(json.dumps({"free": free, "total": total, "oom": oom}))
