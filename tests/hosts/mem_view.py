"""Ask every memory-info path for every pointer combination; print JSON {name: [rc, values...]}.

    python mem_view.py ALLOC_BYTES

Allocates ALLOC_BYTES first, then asks cuMemGetInfo_v2 and cuMemGetInfo (the 32-bit ABI) with
(free, total), (NULL, total), (free, NULL) and (NULL, NULL); cuDeviceTotalMem_v2 and cuDeviceTotalMem;
nvmlDeviceGetMemoryInfo and _v2. A value is None where its pointer was NULL, and the sentinel
0xAAAA... is left where the driver wrote nothing.
"""

import ctypes
import json
import sys

c = ctypes.CDLL("libcuda.so.1")
nv = ctypes.CDLL("libnvidia-ml.so.1")
SENTINEL64 = 0xAAAAAAAAAAAAAAAA
SENTINEL32 = 0xAAAAAAAA


def ok(rc, what):
    if rc != 0:
        raise SystemExit(f"FAIL {what} -> {rc}")


ok(c.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok(c.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(c.cuCtxSetCurrent(ctx), "setcur")
p = ctypes.c_uint64()
ok(c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[1]))), "alloc")

out = {}
for name, fn, ty, sentinel in (("cuMemGetInfo_v2", c.cuMemGetInfo_v2, ctypes.c_size_t, SENTINEL64),
                               ("cuMemGetInfo", c.cuMemGetInfo, ctypes.c_uint, SENTINEL32)):
    for give_free in (True, False):
        for give_total in (True, False):
            f, t = ty(sentinel), ty(sentinel)
            rc = fn(ctypes.byref(f) if give_free else None, ctypes.byref(t) if give_total else None)
            key = f"{name}({'free' if give_free else 'NULL'},{'total' if give_total else 'NULL'})"
            out[key] = [rc, f.value if give_free else None, t.value if give_total else None]
t64, t32 = ctypes.c_size_t(SENTINEL64), ctypes.c_uint(SENTINEL32)
out["cuDeviceTotalMem_v2"] = [c.cuDeviceTotalMem_v2(ctypes.byref(t64), dev), t64.value]
out["cuDeviceTotalMem"] = [c.cuDeviceTotalMem(ctypes.byref(t32), dev), t32.value]


class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Mem2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


ok(nv.nvmlInit_v2(), "nvmlInit")
h = ctypes.c_void_p()
ok(nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)), "handle")
m, m2 = Mem(), Mem2()
m2.version = (2 << 24) | ctypes.sizeof(Mem2)
out["nvmlDeviceGetMemoryInfo"] = [nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), m.total, m.free, m.used]
out["nvmlDeviceGetMemoryInfo_v2"] = [nv.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m2)), m2.total, m2.free,
                                     m2.used]
out["nvmlDeviceGetMemoryInfo(NULL)"] = [nv.nvmlDeviceGetMemoryInfo(h, None)]
print(json.dumps(out))
