"""GPU probe for the compute share's controller (issue 27): does NVML's per-process utilization tell two
processes' GPU time apart?

Beside another group the controller sees only the device's busy time (pyvgpu/jit/compute/controller.py), so
it cannot tell which of two groups its cost model over-charges. ``nvmlDeviceGetProcessUtilization`` answers
per process. This probe runs two loads side by side, each measuring its own GPU time with events on a busy
stream (exact), and prints, per window, what each process measured against NVML's per-process and device
figures:

* ``duty``: 4096^2 fp32 matmuls in batches, then a sleep, busy about DUTY of the time;
* ``small``: launch-bound small matmuls with a host sync each step (an MLP's shape).

    python scripts/probe/nvml_process_probe.py [SECONDS] [DUTY]     (needs torch, a GPU and libnvidia-ml)
"""

import ctypes
import json
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time, torch
mode, seconds, duty = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
if mode == "duty":
    a = torch.randn(4096, 4096, device="cuda")
    def step():
        for _ in range(10):
            a @ a
else:
    x = torch.randn(256, 1024, device="cuda"); w = torch.randn(1024, 1024, device="cuda")
    def step():
        y = x
        for _ in range(6):
            y = torch.relu(y @ w)
        return y
for _ in range(20):
    step()
torch.cuda.synchronize()
s.record()
for _ in range(50):
    step()  # queued back to back: the step's own GPU time
e.record(); e.synchronize()
per_step_ms = s.elapsed_time(e) / 50
t_end = time.time() + seconds
win, busy_ms, t0 = 0, 0.0, time.time()
while time.time() < t_end:
    if mode == "duty":
        s.record(); step(); e.record(); e.synchronize()
        ms = s.elapsed_time(e)
        busy_ms += ms
        time.sleep(ms / 1000 * (1 - duty) / duty)
    else:
        step()[0, 0].item()
        busy_ms += per_step_ms
    if time.time() - t0 >= 1.0:
        print(json.dumps({"t": time.time(), "span": time.time() - t0, "busy": busy_ms / 1000 / (time.time() - t0)}),
              flush=True)
        t0, busy_ms = time.time(), 0.0
"""


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 12.0
    duty = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    h = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
    kids = {m: subprocess.Popen([sys.executable, "-c", CHILD, m, str(seconds), str(duty)], stdout=subprocess.PIPE,
                                text=True) for m in ("duty", "small")}
    time.sleep(6)  # CUDA start-up and the children's calibration
    pids = {p.pid: m for m, p in kids.items()}
    last = int(time.time() * 1e6)
    rows = []
    t_end = time.time() + seconds - 4
    while time.time() < t_end:
        time.sleep(1.0)
        n = ctypes.c_uint(0)
        rc = nvml.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(n), ctypes.c_ulonglong(last))
        n.value += 8  # slack: a process that appears between the two calls would else lose the window
        buf = (Sample * n.value)()
        rc = nvml.nvmlDeviceGetProcessUtilization(h, buf, ctypes.byref(n), ctypes.c_ulonglong(last))
        got: dict[str, list[int]] = {}
        if rc == 0:
            for smp in buf[:n.value]:
                got.setdefault(pids.get(smp.pid, f"pid{smp.pid}"), []).append(smp.smUtil)
                last = max(last, smp.timeStamp)
        rows.append({"t": time.time(), "rc": rc, "n": n.value,
                     "sm": {k: round(sum(v) / len(v), 1) for k, v in got.items()},
                     "samples": {k: len(v) for k, v in got.items()}})
        print(json.dumps(rows[-1]), flush=True)
    for m, p in kids.items():
        out, _ = p.communicate(timeout=seconds + 30)
        own = [json.loads(x)["busy"] for x in out.splitlines() if x.startswith("{")]
        print(f"{m}: own busy (events) per second: {' '.join(f'{b * 100:.1f}' for b in own)}")
    for m in ("duty", "small"):
        vals = [r["sm"].get(m) for r in rows if m in r["sm"]]
        if vals:
            print(f"{m}: NVML smUtil per window: {' '.join(str(v) for v in vals)}")


if __name__ == "__main__":
    main()
