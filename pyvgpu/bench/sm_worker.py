"""The PyTorch loads of `pyvgpu bench sm`.

    python -m pyvgpu.bench.sm_worker SECONDS [matmul|mlp]

``matmul``: bf16 4096x4096 matmuls back to back (compute-bound: every kernel fills the GPU for ~200 us).
``mlp``: training steps of a small MLP (6 x Linear 1024 with ReLU, batch 256, SGD): kernels of tens of
microseconds with the host between them, a launch-bound load that leaves the GPU idle part of the time.

Prints "P <CLOCK_MONOTONIC ns> <matmuls or steps done>" four times a second, like pv_bench sm; the queue is
bounded by waiting on an event 8 marks back.
"""

from __future__ import annotations

import sys
import time

MLP_LAYERS, MLP_WIDTH, MLP_BATCH = 6, 1024, 256


def _matmul(torch):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)

    def step() -> int:
        for _ in range(4):
            a @ b
        return 4

    return step


def _mlp(torch):
    layers = []
    for _ in range(MLP_LAYERS):
        layers += [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(MLP_BATCH, MLP_WIDTH, device="cuda")
    y = torch.randn(MLP_BATCH, MLP_WIDTH, device="cuda")

    def step() -> int:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return 1

    return step


def main() -> None:
    import torch

    seconds = float(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "matmul"
    if kind not in ("matmul", "mlp"):
        raise SystemExit(f"sm_worker: unknown load {kind!r} (matmul or mlp)")
    step = _matmul(torch) if kind == "matmul" else _mlp(torch)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    ring: list[tuple[torch.cuda.Event, int]] = []
    launched = done = 0
    t0 = time.monotonic_ns()
    end, next_print = t0 + int(seconds * 1e9), t0
    print(f"P {t0} 0", flush=True)
    while time.monotonic_ns() < end:
        launched += step()
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
