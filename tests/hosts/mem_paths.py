"""Drive one allocation path through the driver API (ctypes: the dlsym path) and print JSON.

    python mem_paths.py PATH LIMIT

Each scenario fills the group's LIMIT through its path and reports the
return codes, the virtual cuMemGetInfo, and the group's usage as the
region shows it.
"""

import ctypes
import json
import os
import sys

c = ctypes.CDLL("libcuda.so.1")
u64, sz = ctypes.c_uint64, ctypes.c_size_t
MiB = 1 << 20


def ok(rc, what):
    if rc != 0:
        raise SystemExit(f"FAIL {what} -> {rc}")


ok(c.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok(c.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(c.cuCtxSetCurrent(ctx), "setcur")


def region_used():
    from pyvgpu.group import region

    r = region.open_region(region.path_from_env(os.environ), writable=False)
    return r.device(0).used


def info():
    f, t = sz(), sz()
    ok(c.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)), "cuMemGetInfo_v2")
    return f.value, t.value


path, limit = sys.argv[1], int(sys.argv[2])
out = {"path": path}

if path == "pitch":
    p, pitch = u64(), sz()
    # width 1000 -> pitch 1024 in the fake: 1024 x 1024 = 1 MiB each
    out["rcs"] = [c.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch), sz(1000), sz(1024), 4)
                  for _ in range(limit // MiB + 1)]
    out["pitch"] = pitch.value
elif path == "managed":
    p = u64()
    out["rcs"] = [c.cuMemAllocManaged(ctypes.byref(p), sz(limit // 2), 1) for _ in range(3)]
elif path == "async":
    p = u64()
    ptrs = []
    rcs = []
    for _ in range(limit // (4 * MiB) + 1):
        rcs.append(c.cuMemAllocAsync(ctypes.byref(p), sz(4 * MiB), None))
        ptrs.append(p.value)
    out["rcs"] = rcs
    out["used_full"] = region_used()
    ok(c.cuMemFreeAsync(u64(ptrs[0]), None), "free async")
    out["used_after_free"] = region_used()  # the pool keeps it reserved
    out["realloc"] = c.cuMemAllocAsync(ctypes.byref(p), sz(4 * MiB), None)  # reuse: no new charge
    out["used_after_reuse"] = region_used()
    ok(c.cuMemFreeAsync(p, None), "free async")
    pool = ctypes.c_void_p()
    ok(c.cuDeviceGetMemPool(ctypes.byref(pool), dev), "pool")
    ok(c.cuMemPoolTrimTo(pool, sz(0)), "trim")  # gives back the free 4 MiB
    out["used_after_trim"] = region_used()
elif path == "vmm":
    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("loc_type", ctypes.c_int),
                    ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", ctypes.c_uint64)]

    h = u64()
    prop = Prop(1, 0, 1, 0, None, 0)
    handles, rcs = [], []
    for _ in range(limit // (2 * MiB) + 1):
        rcs.append(c.cuMemCreate(ctypes.byref(h), sz(2 * MiB), ctypes.byref(prop), u64(0)))
        handles.append(h.value)
    out["rcs"] = rcs
    host = Prop(1, 0, 2, 0, None, 0)  # host-located: not counted
    out["host_rc"] = c.cuMemCreate(ctypes.byref(h), sz(2 * MiB), ctypes.byref(host), u64(0))
    out["used_full"] = region_used()
    ok(c.cuMemRelease(u64(handles[0])), "release")
    out["used_after_release"] = region_used()
elif path == "arrays":
    class Desc(ctypes.Structure):
        _fields_ = [("w", sz), ("h", sz), ("fmt", ctypes.c_uint), ("ch", ctypes.c_uint)]

    class Desc3(ctypes.Structure):
        _fields_ = [("w", sz), ("h", sz), ("d", sz), ("fmt", ctypes.c_uint), ("ch", ctypes.c_uint),
                    ("flags", ctypes.c_uint)]

    a = ctypes.c_void_p()
    rc1 = c.cuArrayCreate_v2(ctypes.byref(a), ctypes.byref(Desc(1024, 1024, 0x20, 4)))  # 16 MiB
    a1 = a.value
    out["used_2d"] = region_used()
    rc2 = c.cuArray3DCreate_v2(ctypes.byref(a), ctypes.byref(Desc3(256, 256, 64, 0x10, 2, 0)))  # 16 MiB
    out["used_3d"] = region_used()
    rc3 = c.cuMipmappedArrayCreate(ctypes.byref(a), ctypes.byref(Desc3(1024, 1024, 0, 0x01, 1, 0)), 3)
    out["used_mip"] = region_used()  # 1 MiB + 256 KiB + 64 KiB
    rc4 = c.cuArrayCreate_v2(ctypes.byref(a), ctypes.byref(Desc(8192, 8192, 0x20, 4)))  # 1 GiB: over
    ok(c.cuArrayDestroy(ctypes.c_void_p(a1)), "destroy")
    out["used_after_destroy"] = region_used()
    out["rcs"] = [rc1, rc2, rc3, rc4]
elif path == "nvml":
    nv = ctypes.CDLL("libnvidia-ml.so.1")

    class Mem(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class Mem2(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                    ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    p = u64()
    ok(c.cuMemAlloc_v2(ctypes.byref(p), sz(limit // 4)), "alloc")
    ok(nv.nvmlInit_v2(), "nvmlInit")
    h = ctypes.c_void_p()
    ok(nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)), "handle")
    m, m2 = Mem(), Mem2()
    ok(nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), "mem")
    m2.version = (2 << 24) | ctypes.sizeof(Mem2)
    ok(nv.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m2)), "mem2")
    out["v1"] = [m.total, m.free, m.used]
    out["v2"] = [m2.total, m2.reserved, m2.free, m2.used]
    out["null_rc"] = nv.nvmlDeviceGetMemoryInfo(h, None)
elif path == "modules":
    ptx = b".version 7.8\n.target sm_75\n.address_size 64\n.visible .entry k()\n{\n\tret;\n}\n"
    mods, rcs = [], []
    for _ in range(limit // (8 * MiB) + 1):
        m = ctypes.c_void_p()
        rcs.append(c.cuModuleLoadData(ctypes.byref(m), ptx))
        mods.append(m.value)
    out["rcs"] = rcs
    out["used_full"] = region_used()
    ok(c.cuModuleUnload(ctypes.c_void_p(mods[0])), "unload")
    out["used_after_unload"] = region_used()
elif path == "info":
    p = u64()
    ok(c.cuMemAlloc_v2(ctypes.byref(p), sz(limit // 4)), "alloc")
    out["info"] = info()
    t = sz()
    ok(c.cuDeviceTotalMem_v2(ctypes.byref(t), dev), "total")
    out["total"] = t.value
    out["null_free"] = c.cuMemGetInfo_v2(None, ctypes.byref(t))
    out["null_total"] = c.cuMemGetInfo_v2(ctypes.byref(t), None)
    out["null_devtotal"] = c.cuDeviceTotalMem_v2(None, dev)
    out["legacy_alloc"] = c.cuMemAlloc(ctypes.byref(ctypes.c_uint()), ctypes.c_uint(4096))
    f32, t32 = ctypes.c_uint(), ctypes.c_uint()
    out["legacy_info_rc"] = c.cuMemGetInfo(ctypes.byref(f32), ctypes.byref(t32))
    out["legacy_info"] = [f32.value, t32.value]
else:
    raise SystemExit(f"unknown path {path}")

out["info_end"] = info()
out["used_end"] = region_used()
print(json.dumps(out))
