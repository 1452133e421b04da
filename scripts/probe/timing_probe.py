"""GPU probe for the cost model (issue 27): what a timed launch reads when its stream was idle.

pyvgpu charges a launch the time its kernel's sampled launches took between two CUDA events
(pyvgpu/jit/compute/cost.py). A start event recorded on an idle stream runs at once, before the kernel is
even submitted, so its timing may hold the host's launch time, and, with another process's work on the
GPU, that process's time slice. The MLP 30/70 pair on two H100s charged its 30 group about four times
its kernels' time (docs/compute.md, "The workload matrix"). This probe measures the physics without pyvgpu:
a small kernel timed on an idle stream and behind queued work of its own, alone and beside a second
process launching small kernels, against the same kernel's time in a batch of 200. The matmul's host path
(cuBLAS, ~200 us on an H100 host) hides anything shorter in its idle timing, so a spin kernel
(``torch.cuda._sleep``, one launch: a host gap of a few us, as pyvgpu's start event before cuLaunchKernel)
is timed the same two ways: what a context switch to the other process adds shows there.

    python scripts/probe/timing_probe.py [SECONDS_PER_CASE]     (needs torch and a GPU)
"""

import statistics
import subprocess
import sys
import time

NEIGHBOUR = r"""
import sys, time, torch
x = torch.randn(256, 1024, device="cuda"); w = torch.randn(1024, 1024, device="cuda")
t0 = time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[1]):
    for _ in range(6):
        x = torch.relu(x @ w) * 0.01
    x.sum().item()
"""


def cases(torch, seconds: float) -> dict[str, list[float]]:
    """Timings (us) of one small kernel: idle stream (with the host's time from the start event's record
    returning to the launch's return), and behind the process's own queued work (tens of ms)."""
    x = torch.randn(256, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernels = {"": lambda: x @ w, "spin_": lambda: torch.cuda._sleep(SPIN_CYCLES)}
    out: dict[str, list[float]] = {f"{k}{case}": [] for k in kernels for case in ("idle", "idle_host_gap", "queued")}

    def timed(launch) -> tuple[float, float]:
        """(the launch's timing, the host's time from the start event's record to the launch's return), us."""
        s.record()
        h = time.perf_counter()
        launch()
        gap = time.perf_counter() - h
        e.record()
        e.synchronize()
        return s.elapsed_time(e) * 1000, gap * 1e6

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for k, launch in kernels.items():
            torch.cuda.synchronize()
            us, gap = timed(launch)
            out[f"{k}idle"].append(us)
            out[f"{k}idle_host_gap"].append(gap)
            for _ in range(8):
                big @ big  # this process's own work ahead of the timed kernel (fp32 4096^3: ms each)
            out[f"{k}queued"].append(timed(launch)[0])
    return out


SPIN_CYCLES = 30_000  # torch.cuda._sleep's spin: tens of us


def spin_batch_us(torch) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(20):
        torch.cuda._sleep(SPIN_CYCLES)
    s.record()
    for _ in range(200):
        torch.cuda._sleep(SPIN_CYCLES)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1000 / 200


def batch_us(torch) -> float:
    x = torch.randn(256, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(20):
        x @ w
    s.record()
    for _ in range(200):
        x @ w
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1000 / 200


def report(name: str, out: dict[str, list[float]], kernel: float, spin: float) -> None:
    for k, v in out.items():
        v = sorted(v)
        p10, med, p90 = v[len(v) // 10], statistics.median(v), v[9 * len(v) // 10]
        ref = spin if k.startswith("spin") else kernel
        ratio = "" if k.endswith("gap") else f"  median {med / ref:.2f} x the kernel"
        print(f"{name:<16} {k:<14} n={len(v):<5} p10 {p10:8.1f}  median {med:8.1f}  p90 {p90:8.1f} us{ratio}")


def main() -> None:
    import torch

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    kernel, spin = batch_us(torch), spin_batch_us(torch)
    print(f"{torch.cuda.get_device_name()}: the kernel (256x1024 @ 1024x1024, fp32) takes {kernel:.1f} us in a "
          f"batch of 200, the spin kernel {spin:.1f} us")
    report("alone", cases(torch, seconds), kernel, spin)
    nb = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(seconds + 10)])
    try:
        time.sleep(5)  # the neighbour's CUDA start-up
        if nb.poll() is not None:
            raise SystemExit(f"the neighbour loop exited ({nb.returncode}) before the second case")
        out = cases(torch, seconds)
        if nb.poll() is not None:
            raise SystemExit(f"the neighbour loop exited ({nb.returncode}) during the second case")
        report("beside a loop", out, kernel, spin)
    finally:
        nb.kill()
        nb.wait()


if __name__ == "__main__":
    main()
