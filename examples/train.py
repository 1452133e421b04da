"""A small PyTorch training loop, the README's quick start:

    pyvgpu wrap --memory 4G python examples/train.py

It trains a 6-layer MLP to imitate a fixed random linear map and prints what
the program sees of its GPU: under pyvgpu, the cap as the device's total
memory. Without a CUDA GPU it says so and trains a smaller model on the CPU;
without PyTorch it says how to install it.

    python examples/train.py [--steps N] [--batch N] [--width N] [--cpu]
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="training steps (default 300 on a GPU, 60 on the CPU)")
    ap.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    ap.add_argument("--width", type=int, help="width of each linear layer (default 1024 on a GPU, 128 on the CPU)")
    ap.add_argument("--cpu", action="store_true", help="train on the CPU even if there is a GPU")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("examples/train.py needs PyTorch: pip install torch (https://pytorch.org/get-started/locally/)",
              file=sys.stderr)
        return 2
    if args.cpu or not torch.cuda.is_available():
        if not args.cpu:
            print("no CUDA GPU is available to PyTorch here: training on the CPU (pyvgpu's limits apply to GPUs; "
                  "`pyvgpu doctor` checks the driver)")
        device = torch.device("cpu")
    else:
        device = torch.device("cuda")
        free, total = torch.cuda.mem_get_info()
        print(f"GPU: {torch.cuda.get_device_name()}, total {total / 2**30:.2f} GiB, free {free / 2**30:.2f} GiB "
              "(under `pyvgpu wrap --memory`, the total is the cap)")
    gpu = device.type == "cuda"
    args.steps = args.steps or (300 if gpu else 60)
    args.width = args.width or (1024 if gpu else 128)
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(args.width, args.width, device=device) / args.width**0.5
    x = torch.randn(args.batch, args.width, device=device)
    y = x @ teacher
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % max(1, args.steps // 5) == 0 or step == args.steps:
            print(f"step {step:5d}  loss {loss.item():.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize()
        print(f"peak memory allocated by PyTorch: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    took = time.perf_counter() - t0
    print(f"{args.steps} steps in {took:.2f} s ({args.steps / took:.0f} steps/s) on {device.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
