"""The `matmul` load of `pyvgpu bench sm`: PyTorch bf16 4096x4096 matmuls back to back.

    python -m pyvgpu.bench.sm_worker SECONDS

Prints "P <CLOCK_MONOTONIC ns> <matmuls done>" four times a second, like
pv_bench sm; the queue is bounded by waiting on an event 8 marks back.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    import torch

    seconds = float(sys.argv[1])
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    ring: list[tuple[torch.cuda.Event, int]] = []
    launched = done = 0
    t0 = time.monotonic_ns()
    end, next_print = t0 + int(seconds * 1e9), t0
    print(f"P {t0} 0", flush=True)
    while time.monotonic_ns() < end:
        for _ in range(4):
            a @ b
        launched += 4
        if len(ring) == 8:
            ev, n = ring.pop(0)
            ev.synchronize()
            done = n
        ev = torch.cuda.Event()
        ev.record()
        ring.append((ev, launched))
        now = time.monotonic_ns()
        if now >= next_print:
            print(f"P {now} {done}", flush=True)
            next_print = now + 250_000_000
    torch.cuda.synchronize()
    print(f"P {time.monotonic_ns()} {launched}", flush=True)


if __name__ == "__main__":
    main()
