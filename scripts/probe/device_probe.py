"""GPU probe: is each launch under a share charged on its own device, when pyvgpu skips asking the driver?

A launch under a share is charged on its device. A process whose contexts are all on one device launches
there, so pyvgpu takes that device without asking the driver (pyvgpu/jit/runtime/context.py,
``launch_device``); one with contexts on several asks at each launch. That rests on the hooks seeing every
context PyTorch's runtime makes (cuDevicePrimaryCtxRetain). This probe runs, each under
``pyvgpu wrap --sm 90`` on a machine with two GPUs or more:

* ``one``: a PyTorch loop on cuda:0 only, seeing every GPU;
* ``alternate``: the same loop switching between cuda:0 and cuda:1 (``torch.cuda.set_device``, the runtime's
  cudaSetDevice) every ROUND launches;

and prints, per device, the launches the loop made (one elementwise kernel per ``torch.add``) against what
the group's region counted there. Extra launches (PyTorch's set-up) are a few; a swap shows as counts on the
wrong device.

    python scripts/probe/device_probe.py [LAUNCHES] [ROUND]     (needs torch and two GPUs)
"""

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, torch
from pyvgpu.contract import layout
from pyvgpu.group import region
mode, launches, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
devs = [0] if mode == "one" else [0, 1]
xs = {d: torch.ones(1024, device=f"cuda:{d}") for d in devs}
torch.cuda.synchronize()
def mine():  # a read-only open is a snapshot: one each time
    r = region.open_region(os.environ["PYVGPU_REGION"], writable=False)
    try:
        for i in range(r.header.n_slots):
            s = r.slot(i)
            if s.state == layout.SLOT_LIVE and s.pid == os.getpid():
                return [s.dev[d].sm_launches for d in range(2)]
    finally:
        r.close()
before = mine()
made = [0, 0]
done = 0
while done < launches:
    for d in devs:
        torch.cuda.set_device(d)
        x = xs[d]
        for _ in range(per):
            torch.add(x, x, out=x)
        made[d] += per
    done += per * len(devs)
for d in devs:
    torch.cuda.synchronize(d)
after = mine()
print(json.dumps({"mode": mode, "made": made, "counted": [a - b for a, b in zip(after, before)]}))
"""


def main() -> int:
    launches = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("one", "alternate"):
            reg = os.path.join(tmp, f"{mode}.region")
            p = subprocess.run([sys.executable, "-m", "pyvgpu", "wrap", "--sm", "90", "--region", reg, "--",
                                sys.executable, "-c", CHILD, mode, str(launches), str(per)],
                               capture_output=True, text=True, timeout=600, cwd=tmp)
            if p.returncode != 0:
                print(f"{mode}: exit {p.returncode}\n{p.stderr[-3000:]}")
                return 1
            res = json.loads(p.stdout.strip().splitlines()[-1])
            out.append(res)
            print(f"{mode:9s} launches made per device {res['made']}, counted {res['counted']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
