"""PyTorch's autograd worker thread and VPMM (issue 32); run under `pyvgpu wrap --allocator vpmm`, prints JSON.

    python torch_vpmm_threads.py trim|small

The first backward of a process runs on autograd's device thread, which has no current CUDA context until
its first kernel binds the primary one (c10::cuda::SetDevice skips cudaSetDevice when cudaGetDevice already
names the device). Its first allocation comes before that kernel:
  trim   8 x Linear 2048, the loss's 1024 x 2048 gradient (8 MiB) asked right after empty_cache() gave every
         free page back: the pool must create and map pages on that thread (the issue's malloc(8388608))
  small  a 64 x 64 model: the first gradient is under a page, a cuMemAllocAsync on that thread
"""

import json
import sys

import torch

from pyvgpu.vpmm import pool as vpmm

kind = sys.argv[1]
torch.manual_seed(0)
if kind == "trim":
    net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    x = torch.randn(1024, 2048, device="cuda")
else:
    net = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(64, 64, device="cuda")
loss = net(x).pow(2).mean()
torch.cuda.synchronize()
torch.cuda.empty_cache()  # VPMM: pool.trim() gives every free page back
out = {"kind": kind}
try:
    loss.backward()
    torch.optim.SGD(net.parameters(), lr=1e-3).step()
    torch.cuda.synchronize()
    out["ok"] = True
except RuntimeError as e:
    out.update(ok=False, error=str(e).splitlines()[0])
pools = vpmm._TORCH_POOLS
if pools:
    st = pools[0].stats()
    out["pool"] = {k: st.get(k) for k in ("entered_without_context", "entered_with_another_context",
                                           "context_switches", "pages", "defragmentations")}
print(json.dumps(out))
