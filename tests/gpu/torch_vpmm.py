"""PyTorch on VPMM (run under `pyvgpu wrap --allocator vpmm --memory 4G`): data through the pool, a clean
error past the cap, and the pool still serving afterwards. Prints JSON."""

import json

import torch

import pyvgpu.vpmm.pool as v

GiB = 1 << 30
assert v._TORCH_POOLS, "pyvgpu wrap --allocator vpmm installed no pool"
xs = [torch.full((1 << 20,), float(i), device="cuda") for i in range(64)]  # 4 MiB each
y = torch.stack(xs)
del xs
big = torch.ones(GiB // 4, device="cuda")  # 1 GiB
total = float(big.sum())
error, kind = None, None
try:
    torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError: the class is reported
    error, kind = str(e).splitlines()[0], type(e).__name__
after = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
data_ok = torch.equal(y[:, 0].cpu(), torch.arange(64, dtype=torch.float32)) and total == GiB // 4
print(json.dumps({"data_ok": data_ok, "error": error, "error_type": kind, "after_ok": float(after.sum()) == 1 << 20,
                  "pool": v._TORCH_POOLS[0].stats(), "torch_free_total": torch.cuda.mem_get_info()}))
