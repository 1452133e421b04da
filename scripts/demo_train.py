"""A small PyTorch training loop for demos under `pyvgpu wrap` (exporter scrape, top capture).

    python scripts/demo_train.py SECONDS [--mib N] [--try-oom MIB]

Trains an MLP on random data on cuda:0 for SECONDS, holding about N MiB of
extra tensors; with --try-oom, asks for that many MiB once half way through
(under a cap that is refused: an OOM event). Prints steps/s at the end.
"""

import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("seconds", type=float)
ap.add_argument("--mib", type=int, default=512)
ap.add_argument("--try-oom", type=int, default=0)
a = ap.parse_args()
dev = torch.device("cuda:0")
keep = torch.empty(a.mib << 20, dtype=torch.uint8, device=dev)
model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 2048, device=dev)
steps, t0, tried = 0, time.monotonic(), False
while time.monotonic() - t0 < a.seconds:
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    if a.try_oom and not tried and time.monotonic() - t0 > a.seconds / 2:
        tried = True
        try:
            torch.empty(a.try_oom << 20, dtype=torch.uint8, device=dev)
            print("try-oom: allocated", flush=True)
        except RuntimeError as e:  # torch.OutOfMemoryError; a RuntimeError under --allocator vpmm
            print(f"try-oom: refused ({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
torch.cuda.synchronize()
print(f"steps/s {steps / (time.monotonic() - t0):.1f} loss {loss.item():.4f}", flush=True)
