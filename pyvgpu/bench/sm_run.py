"""One load of `pyvgpu bench sm` and `bench latency`: its process, its progress lines, and its group's region
sampled while it runs (the controller's series, the time shares, how its launches were timed); the
environment of a wrapped load, and a scenario's turn counters."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from pyvgpu.bench.gpu_util import UtilSampler
from pyvgpu.contract import envspec
from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.group import turnfile as sched
from pyvgpu.ops import wrap

STACKS_SIGNAL = signal.SIGUSR1  # a load (sm_worker) prints every thread's stack on it: where a hang hangs
STACKS_WAIT_S = 2.0  # how long a load that hangs gets to print its stacks before it is killed


class LoadRun:
    """One load process: its progress lines, and its group's region sampled while it runs.

    The load runs in a process group of its own, so that its ranks (a collective load starts one process a
    GPU) go with it: one that hangs is asked for its stacks, then the whole group is killed, and none is left
    on the GPU under the next scenario. ``label`` says which run of a scenario it is, for the errors."""

    live: set[LoadRun] = set()  # started and not finished: ``kill_all`` ends them when a bench stops early

    def __init__(self, cmd: list[str], env: dict[str, str], region_path: Path | None, label: str = "") -> None:
        self._stacks = tempfile.TemporaryDirectory(prefix="pyvgpu-load-stacks-")
        env = {**env, envspec.BENCH_STACKS.name: self._stacks.name}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        LoadRun.live.add(self)
        self.label = label or "load"
        self.turns = env.get(envspec.SCHED.name)  # the scenario's turn file, if it takes turns
        self.region_path = region_path
        self.progress: list[tuple[int, int]] = []
        self.series: list[dict] = []
        self._cost = self._charged = 0.0
        self.timed = [0] * len(L.TIMED_HOW)  # the group's launch timings by how, at the last sample
        self.t0 = time.monotonic()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while self.proc.poll() is None and self.region_path is not None:
            time.sleep(0.1)
            try:
                r = region.open_region(self.region_path, writable=False)
            except PyvgpuError:
                continue
            os.close(r.fd)
            d = r.device(0)
            scale = (d.sm_scale or 65536) / 65536
            cost = sum(r.slot(i).dev[0].sm_cost_ns for i in range(r.header.n_slots) if r.slot(i).state)
            # integrated at the scale of each moment (the scale changes; a process that exits takes its count)
            self._charged += max(0, cost - self._cost) * scale
            self._cost = cost
            charged = self._charged
            self.timed = list(d.sm_timed)
            launches = sum(r.slot(i).dev[0].sm_launches for i in range(r.header.n_slots) if r.slot(i).state)
            self.series.append({"t": round(time.monotonic() - self.t0, 3), "mono": time.monotonic(),
                                "util": d.sm_util / 100, "scale": scale, "state": d.sm_state,
                                "throttle_s": d.sm_throttle_ns / 1e9, "turn_ns": d.sm_turn_ns,
                                "turn_wait_ns": d.sm_turn_wait_ns, "charged_ns": charged,
                                "borrow_ns": d.sm_borrow_ns,
                                COST: (launches, cost, d.sm_unknown, d.sm_unknown_ns, d.sm_timed_ns[L.TIMED_GATED],
                                       d.sm_harvested[L.TIMED_GATED], sum(d.sm_timed_ns), sum(d.sm_harvested))})

    def _signal(self, sig: int) -> None:
        # By the group's id, also when the load itself has exited and been reaped: its ranks keep the id in
        # use (the kernel hands out no pid still a group's id), and they are what a hang leaves behind
        try:
            os.killpg(self.proc.pid, sig)  # its own group: the load and every rank it started
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """End the load and every process it started (a bench that stops early leaves none on the GPU)."""
        self._signal(signal.SIGKILL)
        LoadRun.live.discard(self)

    @classmethod
    def kill_all(cls) -> None:
        for run in list(cls.live):
            run.kill()
            try:
                run.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _stack_text(self) -> str:
        """The stacks each process of the load wrote on STACKS_SIGNAL (one file each), for an error."""
        parts = []
        for f in sorted(Path(self._stacks.name).glob("stacks.*")):
            try:
                text = f.read_text(errors="replace")[-3000:].strip()
            except OSError:
                continue
            if text:
                parts.append(f"process {f.suffix[1:]}:\n{text}")
        return "; its stacks, by process:\n" + "\n".join(parts) if parts else ""

    def _state(self) -> str:
        """Where the load's group stood when it hung: its region's last sample and the scenario's turns."""
        parts = []
        if self.series:
            s = self.series[-1]
            parts.append(f"its group's last sample ({s['t']:.1f} s in): state {s['state']}, waited "
                         f"{s['turn_wait_ns'] / 1e9:.2f} s for turns, held {s['turn_ns'] / 1e9:.2f} s")
        if self.turns and Path(self.turns).exists():
            try:
                es = sched.entries(Path(self.turns))
            except (OSError, ValueError, PyvgpuError) as e:
                parts.append(f"the turn file {self.turns} unreadable: {e}")
            else:
                parts.append("the turns by GPU: " + "; ".join(
                    f"holder {e['holder']}, {e['handovers']} hand-overs, {e['drains']} drains, {e['stucks']} stuck, "
                    f"{e['catchups']} catch-ups, {e['unmatched']} unmatched"
                    for e in es))
        return "; ".join(parts)

    def finish(self, timeout: float, util: UtilSampler | None = None, cut_at: float = 1 / 3) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Where it hangs: every process of the load prints its threads' stacks (sm_worker registers for
            # the signal), then the whole group is killed, which closes the pipes its ranks hold too.
            self._signal(STACKS_SIGNAL)
            time.sleep(STACKS_WAIT_S)
            state = self._state()
            self.kill()
            try:
                out, err = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                out = err = ""
            last = (out or "").strip().splitlines()[-1:]
            raise PyvgpuError(f"bench load ({self.label}) {' '.join(self.proc.args)} did not finish in "
                              f"{timeout:.0f} s{'; ' + state if state else ''}"
                              f"{'; its last progress line: ' + last[0] if last else '; it printed no progress'}"
                              f"{'; its errors: ' + err.strip()[-2000:] if err and err.strip() else ''}"
                              f"{self._stack_text()}") from None
        finally:
            LoadRun.live.discard(self)
            self._stacks.cleanup()
        self._sampler.join(timeout=1)
        if self.proc.returncode != 0:
            raise PyvgpuError(f"bench load ({self.label}) {' '.join(self.proc.args)} failed "
                              f"({self.proc.returncode}): {err.strip()[-2000:]}")
        for line in out.splitlines():
            if line.startswith("P "):
                _, t, n = line.split()
                self.progress.append((int(t), int(n)))
        if len(self.progress) < 3:
            raise PyvgpuError(f"bench load printed no progress: {out[-500:]} {err[-500:]}")
        return self.window(self.progress[0][0] / 1e9 + (self.progress[-1][0] - self.progress[0][0]) / 1e9 * cut_at,
                           self.progress[-1][0] / 1e9, util)

    def window(self, start_s: float, end_s: float, util: UtilSampler | None) -> dict:
        """Throughput and time shares between two CLOCK_MONOTONIC times (s)."""
        pts = [p for p in self.progress if start_s * 1e9 <= p[0] <= end_s * 1e9]
        if len(pts) < 2:
            raise PyvgpuError("a bench window holds too few progress lines; give a longer --seconds")
        (t0, n0), (t1, n1) = pts[0], pts[-1]
        span = (t1 - t0) / 1e9
        out: dict = {"kernels_per_s": (n1 - n0) / span, "window_s": span}
        out["curve"] = [((t - self.progress[0][0]) / 1e9, (b - a) / ((t - ta) / 1e9))
                        for (ta, a), (t, b) in zip(self.progress, self.progress[1:], strict=False) if t > ta]
        out["controller"] = [{k: v for k, v in s.items() if k not in ("mono", COST)} for s in self.series]
        out["timed"] = dict(zip(L.TIMED_HOW, self.timed, strict=True))  # the whole run's, warm-up too
        nv = util.mean(t0 / 1e9, t1 / 1e9) if util is not None else None
        out["time_share_nvml"] = nv  # the device's, for all groups on it
        ss = [s for s in self.series if t0 / 1e9 <= s["mono"] <= t1 / 1e9]
        if len(ss) >= 2:
            dt = (ss[-1]["mono"] - ss[0]["mono"]) * 1e9
            out["time_share_turns"] = 100 * (ss[-1]["turn_ns"] - ss[0]["turn_ns"]) / dt
            out["time_share_charged"] = 100 * (ss[-1]["charged_ns"] - ss[0]["charged_ns"]) / dt
            out["turn_wait_share"] = 100 * (ss[-1]["turn_wait_ns"] - ss[0]["turn_wait_ns"]) / dt
            out["borrowed_share"] = 100 * (ss[-1]["borrow_ns"] - ss[0]["borrow_ns"]) * ss[-1]["scale"] / dt
            out["throttled_share"] = 100 * (ss[-1]["throttle_s"] - ss[0]["throttle_s"]) * 1e9 / dt
            out["cost"] = cost_figures(ss[0][COST], ss[-1][COST], dt, nv)
        return out


COST = "cost_counts"  # a sample's (launches, raw ns charged, launches at the mean, their ns, gated timings' ns,
#                       their count, every timing's ns, their count): the group's, on device 0


def cost_figures(a: tuple, b: tuple, dt_ns: float, nvml: float | None) -> dict:
    """What the cost model charged a launch in a window (between samples a and b, dt_ns apart) against what its
    timings read and what the GPU was busy, in us a launch: an over-charge is told apart into timings that
    read long (``gated_timing_us`` above ``nvml_us``) and estimates that do (``raw_us`` above the timings;
    ``at_mean``: the part of the launches charged the process's mean timing, having no estimate of their own).
    The window's figures: a process that exited in it takes its counts along, so they need a live group."""
    n, raw, unknown, unknown_ns, gated_ns, gated, all_ns, timings = (y - x for x, y in zip(a, b, strict=True))

    def us(ns: float, count: float) -> float | None:
        return round(ns / count / 1e3, 3) if count > 0 and ns >= 0 else None

    return {"launches_per_s": n / dt_ns * 1e9, "raw_us": us(raw, n), "at_mean": unknown / n if n > 0 else None,
            "at_mean_us": us(unknown_ns, unknown), "gated_timing_us": us(gated_ns, gated),
            "timing_us": us(all_ns, timings), "timings": timings,
            "nvml_us": us(nvml / 100 * dt_ns, n) if nvml is not None else None}


def wrapped_env(base: dict[str, str], share: int | None, tmp: Path, name: str, **kw) -> tuple[dict[str, str], Path]:
    """The environment of a load wrapped at ``share`` (None: no share) with its region at tmp/name.region."""
    path = tmp / f"{name}.region"
    request = wrap.WrapRequest(sm=None if share is None else str(share), region_path=str(path), **kw)
    return wrap.build_env(base, request), path


def turn_stats(turns: Path) -> dict:
    """The scenario's turn counters (one GPU), with the mean gap and the longest wait in ms."""
    if not turns.exists():
        return {}
    es = sched.entries(turns)
    if not es:
        return {}
    e = dict(es[0])
    for other in es[1:]:  # a load over several GPUs: the counters of every GPU together
        for k, v in other.items():
            if isinstance(v, int) and isinstance(e.get(k), int) and k not in ("key", "holder", "max_wait_ns"):
                e[k] += v
    e["gpus"] = len(es)
    e["gap_mean_ms"] = e["gap_ns"] / e["gaps"] / 1e6 if e["gaps"] else None
    e["max_wait_ms"] = e["max_wait_ns"] / 1e6
    e["drain_mean_ms"] = e["drain_ns"] / e["drains"] / 1e6 if e["drains"] else None
    return e
