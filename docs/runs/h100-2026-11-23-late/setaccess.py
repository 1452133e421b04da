"""Diagnostic (not committed): what a cuMemSetAccess costs, and on what it depends."""
import ctypes, json, os, subprocess, statistics, sys, time
cu = ctypes.CDLL("libcuda.so.1")
def ck(rc, what):
    if rc != 0:
        raise SystemExit(f"{what}: {rc}")
ck(cu.cuInit(0), "init")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "cur")
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("requestedHandleTypes", ctypes.c_uint), ("loc_type", ctypes.c_uint),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Access(ctypes.Structure):
    _fields_ = [("loc_type", ctypes.c_uint), ("loc_id", ctypes.c_int), ("flags", ctypes.c_uint)]
prop = Prop(type=1, loc_type=1, loc_id=0)
acc = Access(loc_type=1, loc_id=0, flags=3)
PAGE = 2 << 20
cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
cu.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint64]
cu.cuMemMap.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
cu.cuMemSetAccess.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemUnmap.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
def reserve(size):
    va = ctypes.c_uint64(); ck(cu.cuMemAddressReserve(ctypes.byref(va), size, PAGE, 0, 0), "reserve"); return va.value
def create(n):
    hs = []
    for _ in range(n):
        h = ctypes.c_uint64(); ck(cu.cuMemCreate(ctypes.byref(h), PAGE, ctypes.byref(prop), 0), "create"); hs.append(h.value)
    return hs
res = {}
def measure(name, base, hs, k, reps=60, unmap=True):
    """map k pages at fresh addresses, then time setaccess over them (and the unmap)."""
    sa, um, mp = [], [], []
    pos = base
    for r in range(reps):
        t0 = time.perf_counter_ns()
        for i in range(k):
            ck(cu.cuMemMap(pos + i * PAGE, PAGE, 0, hs[(r * k + i) % len(hs)], 0), "map")
        t1 = time.perf_counter_ns()
        ck(cu.cuMemSetAccess(pos, k * PAGE, ctypes.byref(acc), 1), "access")
        t2 = time.perf_counter_ns()
        if unmap:
            ck(cu.cuMemUnmap(pos, k * PAGE), "unmap")
        t3 = time.perf_counter_ns()
        mp.append(t1 - t0); sa.append(t2 - t1); um.append(t3 - t2)
        pos += (k + 1) * PAGE
    res[name] = {"map_us": statistics.median(mp) / 1e3, "setaccess_us": statistics.median(sa) / 1e3,
                 "setaccess_p90_us": sorted(sa)[int(len(sa) * .9)] / 1e3, "unmap_us": statistics.median(um) / 1e3}
    print(name, res[name], flush=True)
    return pos
hs = create(64)
big = reserve(8 << 40)
small = reserve(4 << 30)
for k in (1, 2, 8, 32):
    measure(f"idle big k={k}", big + (k << 36), hs, k)
measure("idle small k=1", small, hs, 1)
measure("idle small k=8", small + (1 << 30), hs, 8, reps=30)
# many other mappings alive
many = create(800)
vm = reserve(4 << 30)
for i, h in enumerate(many):
    ck(cu.cuMemMap(vm + i * PAGE, PAGE, 0, h, 0), "map")
ck(cu.cuMemSetAccess(vm, 800 * PAGE, ctypes.byref(acc), 1), "acc")
measure("800 mapped k=1", big + (40 << 36), hs, 1)
measure("800 mapped k=8", big + (41 << 36), hs, 8, reps=30)
# access not unmapped: kept (no unmap in loop)
measure("800 mapped k=2 keep", big + (42 << 36), hs, 2, reps=60, unmap=False)
# busy GPU: a spin load in another process (unwrapped) and in this context
bench = sys.argv[1] if len(sys.argv) > 1 else None
if bench:
    p = subprocess.Popen([bench, "sm", "4", "2000", "kernel"], stdout=subprocess.DEVNULL)
    time.sleep(1.0)
    measure("other process busy k=1", big + (50 << 36), hs, 1)
    measure("other process busy k=8", big + (51 << 36), hs, 8, reps=30)
    p.wait()
out = os.environ.get("OUT", "/tmp")
json.dump(res, open(os.path.join(out, "setaccess.json"), "w"), indent=1)
# handles larger than a page: is the cost per byte, per handle or per cuMemMap?
def big_handle(n):
    h = ctypes.c_uint64(); ck(cu.cuMemCreate(ctypes.byref(h), n * PAGE, ctypes.byref(prop), 0), "create big"); return h.value
def m2(name, n, pieces, reps=20):
    h = big_handle(n)
    sa, mp, um = [], [], []
    base = reserve(1 << 34)
    pos = base
    for r in range(reps):
        t0 = time.perf_counter_ns()
        step = n // pieces
        for i in range(pieces):
            ck(cu.cuMemMap(pos + i * step * PAGE, step * PAGE, i * step * PAGE, h, 0), "map piece")
        t1 = time.perf_counter_ns()
        ck(cu.cuMemSetAccess(pos, n * PAGE, ctypes.byref(acc), 1), "acc")
        t2 = time.perf_counter_ns()
        ck(cu.cuMemUnmap(pos, n * PAGE), "unmap")
        t3 = time.perf_counter_ns()
        sa.append(t2 - t1); mp.append(t1 - t0); um.append(t3 - t2)
        pos += (n + 1) * PAGE
    res[name] = {"map_us": statistics.median(mp) / 1e3, "setaccess_us": statistics.median(sa) / 1e3,
                 "unmap_us": statistics.median(um) / 1e3}
    print(name, res[name], flush=True)
m2("one 32M handle, 1 map", 16, 1)
m2("one 32M handle, 16 maps of 2M", 16, 16)
m2("one 32M handle, 4 maps of 8M", 16, 4)
m2("one 2M handle", 1, 1)
m2("one 8M handle", 4, 1)
# a 2 MiB piece of a 32 MiB handle
h = big_handle(16)
base = reserve(1 << 32)
sa = []
for r in range(30):
    ck(cu.cuMemMap(base + r * 2 * PAGE, PAGE, (r % 16) * PAGE, h, 0), "map piece")
    t1 = time.perf_counter_ns(); ck(cu.cuMemSetAccess(base + r * 2 * PAGE, PAGE, ctypes.byref(acc), 1), "acc"); sa.append(time.perf_counter_ns() - t1)
res["2M piece of a 32M handle"] = {"setaccess_us": statistics.median(sa) / 1e3}
print("2M piece of a 32M handle", res["2M piece of a 32M handle"], flush=True)
# 1 GiB pages? 64 MiB handle
m2("one 64M handle", 32, 1, reps=10)
m2("one 256M handle", 128, 1, reps=5)
json.dump(res, open(os.path.join(out, "setaccess.json"), "w"), indent=1)
