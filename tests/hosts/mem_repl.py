"""A member that allocates on command (the driver API through ctypes), for live-limit tests.

    python mem_repl.py        then, on stdin, one command per line:
    alloc BYTES   -> prints the CUresult
    free          -> frees the oldest live allocation, prints the CUresult
    quit
"""

import ctypes
import sys

c = ctypes.CDLL("libcuda.so.1")
assert c.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert c.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert c.cuCtxSetCurrent(ctx) == 0
live = []
print("READY", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] == "alloc":
        p = ctypes.c_uint64()
        rc = c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(cmd[1])))
        if rc == 0:
            live.append(p.value)
        print(rc, flush=True)
    elif cmd[0] == "free":
        print(c.cuMemFree_v2(ctypes.c_uint64(live.pop(0))), flush=True)
