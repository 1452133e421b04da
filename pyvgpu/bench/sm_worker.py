"""The PyTorch loads of `pyvgpu bench sm`.

    python -m pyvgpu.bench.sm_worker SECONDS [matmul|mlp|decode|allreduce|tp-decode]

``matmul``: bf16 4096x4096 matmuls back to back (compute-bound: every kernel fills the GPU for ~200 us).
``mlp``: training steps of a small MLP (6 x Linear 1024 with ReLU, batch 256, SGD): kernels of tens of
microseconds with the host between them, a launch-bound load that leaves the GPU idle part of the time.

``decode``: transformers ``generate`` on a GPT-2-small shape (12 layers, width 768) with random weights
from a config (no download), fp16, batch 8, 32-token prompt, 64 new tokens, greedy: many small kernels
and a host sync per token. Counts tokens.
``allreduce``: one process per GPU (2 by default, ``PYVGPU_BENCH_RANKS``), NCCL all-reduce of 256 MiB
fp32 in a loop; a collective kernel's duration includes waiting for its peers. Counts all-reduces (rank 0).
``tp-decode``: a tensor-parallel decode step over the same ranks: 24 layers of a 4096-wide MLP block split
column/row-wise, one all-reduce per layer, batch 8, one token a step: launch-bound and collective-bound at
once. Counts tokens (rank 0).

Prints "P <CLOCK_MONOTONIC ns> <matmuls or steps done>" four times a second, like pv_bench sm (``Progress``):
work counts as done when the GPU has finished it (an event after each step, queried without waiting), or, for
decode, when the host has read the token; the queue is bounded by waiting on the event 8 steps back.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from pyvgpu.contract import envspec

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


DECODE_BATCH, DECODE_PROMPT, DECODE_NEW = 8, 32, 64
ALLREDUCE_BYTES = 256 << 20
TP_LAYERS, TP_WIDTH, TP_BATCH = 24, 4096, 8


class Progress:
    """The progress lines of a load: how much work the GPU has finished, four times a second.

    A step's count is done once the event recorded after it has completed (queried without waiting), or once
    the host has read a token of it (``finished``), never from the step 8 back that bounds the queue: a load
    whose steps are long (a decode's whole ``generate``) would then print the same count for seconds, and
    its rate over the bench's window would count steps that ended before the window as work done in it."""

    DEPTH, EVERY_NS = 8, 250_000_000

    def __init__(self, out: TextIO = sys.stdout, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.out, self.clock, self.started = out, clock, False
        self.ring: deque[tuple[Any, int]] = deque()
        self.launched = self.done = self.next_print = 0

    def start(self) -> int:
        """Count from now (what ran before, a warm-up, is not printed): the first line; returns its time."""
        self.started, self.launched, self.done = True, 0, 0
        self.ring.clear()
        now = self.clock()
        self.print(now)
        return now

    def print(self, now: int) -> None:
        self.out.write(f"P {now} {self.done}\n")
        self.out.flush()
        self.next_print = now + self.EVERY_NS

    def _tick(self) -> None:
        if not self.started:
            return
        now = self.clock()
        if now >= self.next_print:
            self.print(now)

    def step(self, n: int, event: Any) -> None:
        """A step of n more units was launched and ``event`` recorded after it (``query()``, ``synchronize()``)."""
        self.launched += n
        self.ring.append((event, self.launched))
        while self.ring and (len(self.ring) > self.DEPTH or self.ring[0][0].query()):
            ev, count = self.ring.popleft()
            ev.synchronize()  # past the depth: bounds the queue
            self.done = max(self.done, count)
        self._tick()

    def finished(self, n: int) -> None:
        """The host has seen n units of the step now running done (a token it read)."""
        self.done = max(self.done, self.launched + n)
        self._tick()

    def end(self) -> None:
        """All launched work is finished (the caller synchronized): the last line."""
        self.done = max(self.done, self.launched)
        self.print(self.clock())


class _TokenCount:
    """A streamer for ``generate``: counts the tokens the host has read (the first call is the prompt)."""

    def __init__(self, progress: Progress, batch: int) -> None:
        self.progress, self.batch, self.tokens = progress, batch, -1

    def put(self, value: Any) -> None:
        self.tokens += 1
        if self.tokens:
            self.progress.finished(self.tokens * self.batch)

    def end(self) -> None:
        self.tokens = -1


def _decode(torch, progress: Progress | None = None):
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.float16).eval()
    ids = torch.randint(0, cfg.vocab_size, (DECODE_BATCH, DECODE_PROMPT), device="cuda")
    mask = torch.ones_like(ids)
    counter = _TokenCount(progress, DECODE_BATCH) if progress is not None else None

    def step() -> int:
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=DECODE_NEW, min_new_tokens=DECODE_NEW,
                           do_sample=False, pad_token_id=0, streamer=counter)
        return DECODE_BATCH * DECODE_NEW

    return step


def _allreduce(torch, dist):
    x = torch.ones(ALLREDUCE_BYTES // 4, device="cuda")

    def step() -> int:
        dist.all_reduce(x)
        return 1

    return step


def _tp_decode(torch, dist):
    """Megatron-style MLP blocks split over the ranks: column-parallel up, row-parallel down, all-reduce."""
    world = dist.get_world_size()
    g = torch.Generator(device="cuda").manual_seed(1)
    up = [torch.randn(TP_WIDTH, 4 * TP_WIDTH // world, device="cuda", dtype=torch.float16, generator=g) * 0.01
          for _ in range(TP_LAYERS)]
    down = [torch.randn(4 * TP_WIDTH // world, TP_WIDTH, device="cuda", dtype=torch.float16, generator=g) * 0.01
            for _ in range(TP_LAYERS)]
    x0 = torch.randn(TP_BATCH, TP_WIDTH, device="cuda", dtype=torch.float16)

    def step() -> int:
        x = x0
        for u, d in zip(up, down, strict=True):
            h = torch.nn.functional.gelu(x @ u) @ d
            dist.all_reduce(h)
            x = x + h
        x.sum().item()  # the host reads each token, as a decode loop does
        return TP_BATCH

    return step


def _ranks(seconds: float, kind: str) -> None:
    """Start one process per GPU (this module again, with RANK set) and pass rank 0's lines on."""
    import os
    import socket
    import subprocess

    n = int(os.environ.get(envspec.BENCH_RANKS.name, "2"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        procs.append(subprocess.Popen([sys.executable, "-m", "pyvgpu.bench.sm_worker", str(seconds), kind], env=env,
                                      stdout=None if r == 0 else subprocess.DEVNULL))
    failed = wait_ranks(procs)
    if failed:
        raise SystemExit(f"sm_worker {kind}: {failed}")


RANK_GRACE_S = 5.0  # after a rank fails, how long the others get to fail on their own (and say why)


def wait_ranks(procs: list, poll_s: float = 0.05) -> str:
    """Wait for every rank; '' when all exited 0. A rank that fails leaves its peers waiting for it (in the
    process group's rendezvous or inside a collective) for as long as their own timeouts, many minutes: so
    once one fails, the others get RANK_GRACE_S, then are killed, and the answer names who failed first."""
    first, deadline = None, 0.0
    while any(p.poll() is None for p in procs):
        if first is None:
            first = next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)), None)
            deadline = time.monotonic() + RANK_GRACE_S
        elif time.monotonic() >= deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(poll_s)
    rcs = [p.wait() for p in procs]
    if first is None:
        first = next(((r, rc) for r, rc in enumerate(rcs) if rc != 0), None)
    if first is None:
        return ""
    return f"rank {first[0]} exited {first[1]} first; the ranks' exit codes {rcs} (negative: killed by that signal)"


def _go_on(torch, dist, end: int, steps: int) -> bool:
    """Whether to run another step. Ranks must run the same number of collectives, so every 8 steps they
    agree (one tiny all-reduce: any rank past the end stops them all)."""
    if dist is None:
        return time.monotonic_ns() < end
    if steps % 8:
        return True
    flag = torch.tensor([int(time.monotonic_ns() >= end)], device="cuda", dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0


def main() -> None:
    import faulthandler
    import os
    import signal

    # bench sm's LoadRun sends this to a load that hangs, before it kills it: every thread's stack, into a file
    # of this process's own (the ranks' stacks on one stderr came out interleaved), else on stderr
    stacks = os.environ.get(envspec.BENCH_STACKS.name)
    out = open(os.path.join(stacks, f"stacks.{os.getpid()}"), "w") if stacks else sys.stderr  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
    seconds = float(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "matmul"
    if kind not in ("matmul", "mlp", "decode", "allreduce", "tp-decode"):
        raise SystemExit(f"sm_worker: unknown load {kind!r} (matmul, mlp, decode, allreduce or tp-decode)")
    collective = kind in ("allreduce", "tp-decode")
    if collective and "RANK" not in os.environ:
        return _ranks(seconds, kind)
    import torch

    if collective:
        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    progress = Progress()
    if kind == "decode":
        step = _decode(torch, progress)
    elif collective:
        step = _allreduce(torch, dist) if kind == "allreduce" else _tp_decode(torch, dist)
    else:
        step = {"matmul": _matmul, "mlp": _mlp}[kind](torch)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    end = progress.start() + int(seconds * 1e9)
    steps = 0
    while _go_on(torch, dist if collective else None, end, steps):
        n = step()
        steps += 1
        ev = torch.cuda.Event()
        ev.record()
        progress.step(n, ev)
    torch.cuda.synchronize()
    progress.end()
    if collective:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
