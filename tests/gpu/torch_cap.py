"""Under a cap: what torch sees, and whether allocating past it raises torch.OutOfMemoryError."""

import json
import os

import torch

GiB = 1 << 30
free, total = torch.cuda.mem_get_info()
held = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(2)]  # 2 GiB: fits
oom = False
try:
    held.append(torch.empty(3 * GiB, dtype=torch.uint8, device="cuda"))  # 5 GiB in all: past 4 GiB
except torch.OutOfMemoryError as e:
    oom = True
    msg = str(e).splitlines()[0]
else:
    msg = ""
from pyvgpu.group import region  # noqa: E402

used = region.open_region(region.path_from_env(os.environ), writable=False).device(0).used
print(json.dumps({"free": free, "total": total, "oom": oom, "message": msg, "group_used": used,
                  "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}))
