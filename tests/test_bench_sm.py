"""bench sm's load runner: a load that does not finish is killed, and the error says what it printed last."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyvgpu.bench.sm_run import LoadRun
from pyvgpu.errors import PyvgpuError


def test_a_load_that_does_not_finish_is_killed_and_its_last_words_are_kept():
    code = ("import sys, time; print('P 1 42', flush=True); "
            "print('stuck in a collective', file=sys.stderr, flush=True); time.sleep(60)")
    run = LoadRun([sys.executable, "-c", code], {}, None)
    with pytest.raises(PyvgpuError) as e:
        run.finish(timeout=3)
    msg = str(e.value)
    assert "did not finish in 3 s" in msg and "P 1 42" in msg and "stuck in a collective" in msg, msg
    assert run.proc.poll() is not None  # killed, not left running


# A load as sm_worker's collective loads are: it registers for the stacks signal and starts a rank that
# inherits its pipes (the rank writes its pid to the file named by its argument), and both hang
_HANGING_RANKS = """
import faulthandler, os, signal, subprocess, sys, time
stacks = os.environ.get("PYVGPU_BENCH_STACKS")  # as sm_worker does: a file of its own, else stderr
out = open(os.path.join(stacks, f"stacks.{os.getpid()}"), "w") if stacks else sys.stderr
faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
def wait_for_a_peer():
    time.sleep(600)
if len(sys.argv) == 2:
    subprocess.Popen([sys.executable, sys.argv[0], sys.argv[1], "rank"])
    print("P 1 7", flush=True)
else:
    with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))
wait_for_a_peer()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_hung_load_says_which_run_and_where_it_hangs_and_leaves_no_rank_behind(tmp_path):
    """A collective load whose ranks hang (issue 27: one all-reduce scenario did not finish on two H100s and
    said nothing): the error names the run, holds each process's stack, and no rank is left on the GPU."""
    script = tmp_path / "load.py"
    script.write_text(_HANGING_RANKS)
    run = LoadRun([sys.executable, str(script), str(tmp_path / "rank.pid")], {}, None, label="pair group 2 at 50")
    deadline = time.monotonic() + 30
    while not (tmp_path / "rank.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rank = int((tmp_path / "rank.pid").read_text())
    with pytest.raises(PyvgpuError) as e:
        run.finish(timeout=2)
    msg = str(e.value)
    assert "(pair group 2 at 50)" in msg and "P 1 7" in msg, msg
    # the load's stack and its rank's, each whole under its own process (one stderr interleaved them)
    stacks = msg.split("its stacks, by process:\n", 1)[1].split("\nprocess ")
    assert len(stacks) == 2 and all("in wait_for_a_peer" in x and "in <module>" in x for x in stacks), msg
    assert f"process {rank}:" in msg, msg
    deadline = time.monotonic() + 10
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rank), "the hung load's rank was left running"
    assert run not in LoadRun.live


def test_a_bench_that_stops_early_ends_the_loads_it_started():
    """A pair whose first group fails leaves its second running unless the bench ends it (sm.run's finally)."""
    run = LoadRun([sys.executable, "-c", "import time; time.sleep(600)"], {}, None, label="pair group 2 at 50")
    assert run in LoadRun.live
    LoadRun.kill_all()
    assert run.proc.poll() is not None and run not in LoadRun.live


class _Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


class _Event:
    """A CUDA event of the fake clock: complete once the clock passes its GPU end time."""

    def __init__(self, clock: _Clock, done_at: int) -> None:
        self.clock, self.done_at, self.waited = clock, done_at, False

    def query(self) -> bool:
        return self.clock.ns >= self.done_at

    def synchronize(self) -> None:
        self.waited = self.waited or self.clock.ns < self.done_at  # the host waited for the GPU
        self.clock.ns = max(self.clock.ns, self.done_at)


def _lines(out) -> list[tuple[int, int]]:
    return [(int(t), int(n)) for _, t, n in (line.split() for line in out.getvalue().splitlines())]


def _window_rate(lines: list[tuple[int, int]], cut: float = 1 / 3) -> float:
    """The bench's window (pyvgpu/bench/sm_run.py ``LoadRun.window``): from a third of the run to its last line."""
    start = lines[0][0] + (lines[-1][0] - lines[0][0]) * cut
    pts = [p for p in lines if p[0] >= start]
    (t0, n0), (t1, n1) = pts[0], pts[-1]
    return (n1 - n0) / ((t1 - t0) / 1e9)


def test_a_decode_loads_progress_counts_the_tokens_the_host_read_not_whole_generates():
    """A generate of 512 tokens takes 0.4 s and syncs on every token: its progress lines follow the tokens,
    and the window's rate is the load's rate. Counting whole steps 8 back, as the worker did, printed 0 for
    the first 3 s of a 6 s run and then jumped: a window's rate was off by up to the run's whole count."""
    import io

    from pyvgpu.bench.sm_worker import Progress, _TokenCount

    clock, out = _Clock(), io.StringIO()
    prog = Progress(out, clock)
    counter = _TokenCount(prog, 8)
    end = prog.start() + 6_000_000_000
    while clock.ns < end:
        counter.put("prompt")
        for _ in range(64):
            clock.ns += 6_250_000  # 0.4 s a generate: 1280 tokens/s
            counter.put("token")
        counter.end()
        prog.step(512, _Event(clock, clock.ns))
    prog.end()
    lines = _lines(out)
    assert [n for _, n in lines] == sorted(n for _, n in lines)
    assert all(b - a <= 300_000_000 for (a, _), (b, _) in zip(lines, lines[1:], strict=False))
    assert lines[-1][1] == 512 * 15
    assert _window_rate(lines) == pytest.approx(1280, rel=0.02)


def test_a_queued_loads_progress_is_what_the_gpu_finished_and_its_queue_stays_bounded():
    """Steps launched in 1 ms that the GPU takes 5 ms for: done is the steps whose events completed (without
    waiting), and the host waits on the event 8 steps back (the queue's bound)."""
    import io

    from pyvgpu.bench.sm_worker import Progress

    clock, out = _Clock(), io.StringIO()
    prog = Progress(out, clock)
    end = prog.start() + 2_000_000_000
    gpu_free, events = clock.ns, []
    while clock.ns < end:
        clock.ns += 1_000_000
        gpu_free = max(gpu_free, clock.ns) + 5_000_000
        events.append(_Event(clock, gpu_free))
        prog.step(4, events[-1])
        assert len(prog.ring) <= Progress.DEPTH
        finished = sum(4 for e in events if e.query())
        assert prog.done == finished or prog.done == finished - 4  # an event completed since the last look
    assert any(e.waited for e in events)
    assert _window_rate(_lines(out)) == pytest.approx(800, rel=0.05)  # 4 units per 5 ms of GPU


def test_a_rank_that_fails_takes_its_waiting_peers_down_with_it():
    """A collective load whose rank 0 fails (its rendezvous port taken, an NCCL error) left rank 1 waiting for
    it for as long as torch's own timeouts (minutes): the load now ends within the grace, naming rank 0."""
    from pyvgpu.bench import sm_worker

    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"]),
             subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])]
    t0 = time.monotonic()
    failed = sm_worker.wait_ranks(procs)
    assert time.monotonic() - t0 < sm_worker.RANK_GRACE_S + 5
    assert failed.startswith("rank 0 exited 3 first"), failed
    assert procs[1].returncode is not None  # killed, not left waiting
    ok = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert sm_worker.wait_ranks(ok) == ""
