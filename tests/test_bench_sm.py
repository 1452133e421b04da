"""bench sm's load runner: a load that does not finish is killed, and the error says what it printed last."""

from __future__ import annotations

import sys

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
