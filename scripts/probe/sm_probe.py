"""GPU probe for the compute controller (issue 4): what NVML reports for
utilization, per process, under duty-cycled and competing matmul loops, and
whether CUDA events can be queried from a thread with no current context."""
import ctypes
import json
import subprocess
import sys
import threading
import time

WORKER = r"""
import sys, time, torch, os
duty = float(sys.argv[1]); secs = float(sys.argv[2])
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(20): a @ b
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(100): a @ b
e.record(); torch.cuda.synchronize(); k = s.elapsed_time(e) / 100
n = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < secs:
    if duty >= 1:
        for _ in range(50): a @ b
        n += 50; torch.cuda.synchronize()
    else:
        c0 = time.perf_counter()
        for _ in range(10): a @ b
        torch.cuda.synchronize(); n += 10
        busy = time.perf_counter() - c0
        time.sleep(busy * (1 - duty) / duty)
dt = time.perf_counter() - t0
print(f"RESULT pid={os.getpid()} duty={duty} kernel_ms={k:.4f} matmul_per_s={n/dt:.1f}", flush=True)
"""

nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit_v2()
h = ctypes.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class PSample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


def poll(secs, label):
    out = []
    last = 0
    t0 = time.time()
    while time.time() - t0 < secs:
        time.sleep(0.25)
        u = Util()
        r1 = nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u))
        n = ctypes.c_uint(0)
        r0 = nv.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(n), ctypes.c_ulonglong(last))
        cap = max(n.value, 1) * 2
        n = ctypes.c_uint(cap)
        arr = (PSample * cap)()
        r2 = nv.nvmlDeviceGetProcessUtilization(h, arr, ctypes.byref(n), ctypes.c_ulonglong(last))
        if r2 != 0:
            r2 = (r0, cap, r2)
        samples = []
        if r2 == 0:
            for i in range(n.value):
                samples.append((arr[i].pid, arr[i].timeStamp, arr[i].smUtil))
                last = max(last, arr[i].timeStamp)
        out.append({"t": round(time.time() - t0, 2), "dev": u.gpu if r1 == 0 else f"err{r1}", "proc_rc": r2,
                    "samples": samples})
    print(label, json.dumps(out)[:6000], flush=True)
    return out


def scenario(label, duties, secs=6):
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(d), str(secs)], stdout=subprocess.PIPE, text=True)
             for d in duties]
    time.sleep(3.5)
    poll(secs - 2, label)
    for p in procs:
        print(label, p.communicate()[0].strip(), flush=True)


scenario("alone100", [1.0], 8)
scenario("pair30+100", [0.3, 1.0], 8)

# events queried from a thread with no current context
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
dev = ctypes.c_int()
cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p()
print("ctx", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), cu.cuCtxSetCurrent(ctx))
e1, e2 = ctypes.c_void_p(), ctypes.c_void_p()
print("evcreate", cu.cuEventCreate(ctypes.byref(e1), 0), cu.cuEventCreate(ctypes.byref(e2), 0))
t = time.perf_counter()
for _ in range(1000):
    cu.cuEventRecord(e1, None)
print("cuEventRecord via ctypes us", (time.perf_counter() - t) * 1000)
cu.cuEventRecord(e2, None)
cu.cuCtxSynchronize()
res = {}


def other():
    ms = ctypes.c_float()
    cur = ctypes.c_void_p()
    res["cur"] = (cu.cuCtxGetCurrent(ctypes.byref(cur)), cur.value)
    res["query"] = cu.cuEventQuery(e2)
    res["elapsed"] = (cu.cuEventElapsedTime(ctypes.byref(ms), e1, e2), ms.value)


th = threading.Thread(target=other)
th.start()
th.join()
print("other-thread", res)
