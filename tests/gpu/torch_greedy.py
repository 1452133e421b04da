"""Take 256 MiB blocks until refused; report what was held, then hold it until stdin closes."""

import json
import sys

import torch

held = []
error = ""
while len(held) < 64:
    try:
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        break
    except RuntimeError as e:  # the group had no room left even for this process's CUDA context
        error = str(e).splitlines()[0]
        break
print(json.dumps({"held": len(held) * (256 << 20), "error": error}), flush=True)
sys.stdin.read()
