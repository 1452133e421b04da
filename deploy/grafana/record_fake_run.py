"""Record a run of pyvgpu against the test suite's fake driver, scraping the exporter every second.

    python deploy/grafana/record_fake_run.py OUT.jsonl.gz [SECONDS]

Run from a source checkout with pyvgpu installed (the fake driver is built from
tests/fakecuda with gcc). Three groups share one simulated GPU:

* ``train``: a 1 GiB cap and a 60% share; a compute load (pv_bench's spin kernel on
  the fake's simulated clock) and a member that allocates 96 MiB every 2 s until the
  cap refuses it, then frees half;
* ``infer``: a 512 MiB cap and a 30% share; a compute load and a member holding memory;
* a private group (no --group) whose one member exits a third of the way in.

Each line of OUT is {"t": unix seconds, "text": the scrape's body}. deploy/grafana/render.py
turns it into the dashboard's PNG.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


class Member:
    """tests/hosts/mem_repl.py under `pyvgpu wrap`: allocates and frees on command."""

    def __init__(self, env: dict, *wrap_opts: str):
        host = str(ROOT / "tests/hosts/mem_repl.py")
        cmd = [sys.executable, "-m", "pyvgpu", "wrap", *wrap_opts, sys.executable, host]
        self.p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        assert self.p.stdout.readline().startswith("READY")

    def __call__(self, cmd: str) -> int:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return int(self.p.stdout.readline())

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(30)


def main(out: Path, seconds: float = 60.0) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "fakecuda"))
    from build import build

    from pyvgpu.native.shim import BENCH_BIN

    tmp = Path(tempfile.mkdtemp(prefix="pyvgpu-dashboard-"))
    fake = build(tmp / "fake")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYVGPU_", "CUDA_DEVICE_", "FAKECUDA_", "FAKENVML_")) and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(fake), XDG_RUNTIME_DIR=str(tmp), PYVGPU_SCHED=str(tmp / "turns"),
               FAKECUDA_SIM=str(tmp / "gpu.sim"), FAKECUDA_CTX_BYTES="64M")
    subprocess.run([sys.executable, "-m", "pyvgpu", "warmup"], env=env, check=True, cwd="/")
    ex = subprocess.Popen([sys.executable, "-m", "pyvgpu", "exporter", "--port", "0", "--address", "127.0.0.1"],
                          env=env, stderr=subprocess.PIPE, text=True, cwd="/")
    url = ex.stderr.readline().split()[3]
    limits = {"train": ["--memory", "1G", "--sm", "60"], "infer": ["--memory", "512M", "--sm", "30"]}
    # the members make the groups (with their limits) before the loads join them
    train, infer = (Member(env, "--group", g, *limits[g]) for g in ("train", "infer"))
    loads = [subprocess.Popen([sys.executable, "-m", "pyvgpu", "wrap", "--group", g, *limits[g],
                               str(BENCH_BIN), "sm", str(seconds + 5), "2000", "kernel"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
             for g in ("train", "infer")]
    private = Member(env, "--memory", "256M")
    scrapes = []
    t0 = time.time()
    step = 0
    try:
        while (now := time.time()) - t0 < seconds:
            body = urllib.request.urlopen(url, timeout=30).read().decode()
            scrapes.append({"t": now, "text": body})
            if step % 2 == 0:  # every 2 s
                phase = (now - t0) / seconds
                if phase < 0.75:
                    train(f"alloc {96 * MiB}")  # refused once the cap is reached
                else:
                    train("free")
                if phase < 0.4:
                    infer(f"alloc {48 * MiB}")
                if 0.05 < phase < 0.3:
                    private(f"alloc {32 * MiB}")
            if step == int(seconds / 3):
                private.stop()
            step += 1
            time.sleep(max(0.0, t0 + step - time.time()))
    finally:
        for m in (train, infer, private):
            m.stop()
        for p in loads:
            p.terminate()
            err = p.communicate(timeout=30)[1]
            if p.returncode not in (0, -15):
                print(f"a load failed ({p.returncode}): {err}", file=sys.stderr)
        ex.terminate()
        ex.wait(30)
    with gzip.open(out, "wt") as f:
        for s in scrapes:
            f.write(json.dumps(s) + "\n")
    print(f"wrote {len(scrapes)} scrapes to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
