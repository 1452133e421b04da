"""`pyvgpu bench startup --concurrent N`: many `pyvgpu wrap` started at once in one group.

Job arrays, `xargs -P`, launchers and CI matrices start many wrapped programs
at once, so what one wrap costs is paid N times on a few cores. Measured:

* bare: N copies of the program started at once, no pyvgpu (the floor);
* python: N `python -c pass` of this interpreter at once (what the interpreter's own start costs there);
* wrapped: N `pyvgpu wrap --group G --memory SIZE -- PROGRAM` started at once
  (the first makes the group, the others join it), seconds from the first
  start to the last exit;
* the CPU each wrap spent (user + system, from wait4; the wrap, then the
  program it became), the median over the wrapped processes, and the same
  for one wrap at a time (no contention).

The wraps run in a runtime directory of their own (XDG_RUNTIME_DIR), so the
user's groups are left alone. One wrap in another group comes first in each, as
any earlier wrap of the user would have: it makes the runtime directory, where
the choice of the callback library is remembered (pyvgpu/native/choice.py).
The load average of the machine when the run started is part of the result:
on a shared machine the figures depend on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyvgpu.bench.common import machine, median, raw_env
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError

GOAL_S = 3.0  # 100 wraps at once in one group on the 2-core box (issue 31)
GOAL_CPU_MS = 30.0  # CPU one wrap spends before its exec
WAVE_TIMEOUT_S = 600.0  # the longest a wave may take (the slowest measured: docs/measurements.md)


def wrap_command() -> list[str]:
    """The `pyvgpu` a user runs: the console script beside this interpreter, else `python -m pyvgpu`."""
    script = Path(sys.executable).parent / "pyvgpu"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pyvgpu"]


def _wave(cmds: list[list[str]], env: dict[str, str], timeout_s: float = WAVE_TIMEOUT_S) -> tuple[float, list[float]]:
    """Start every command at once; seconds from the first start to the last exit, and each one's CPU s.
    Each one's stderr goes to a file of its own (a pipe nobody reads could fill and stall it); a wave that
    has not ended within timeout_s is killed (by a timer: the waits themselves block, costing no CPU that
    the wave would be measured with) and reported."""
    import threading

    errs = [tempfile.TemporaryFile() for _ in cmds]
    expired = threading.Event()
    procs: list[subprocess.Popen] = []

    def kill_all() -> None:
        expired.set()
        for p in procs:
            if p.returncode is None:
                try:
                    p.kill()
                except OSError:
                    pass

    timer = threading.Timer(timeout_s, kill_all)
    try:
        t0 = time.perf_counter()
        procs += [subprocess.Popen(c, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
                  for c, err in zip(cmds, errs, strict=True)]
        timer.start()
        cpu = []
        for p in procs:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            cpu.append(usage.ru_utime + usage.ru_stime)
        took = time.perf_counter() - t0
    finally:
        timer.cancel()
        for p in procs:
            if p.returncode is None:
                p.kill()
                p.wait()
    try:
        if expired.is_set():
            raise PyvgpuError(f"the wave of {len(cmds)} processes had not ended after {timeout_s:g} s; killed")
        failed = []
        for p, err in zip(procs, errs, strict=True):
            if p.returncode != 0:
                err.seek(0)
                failed.append(f"exit {p.returncode}: {err.read(4000).decode(errors='replace').strip()[-500:]}")
        if failed:
            raise PyvgpuError(f"{len(failed)} of {len(cmds)} processes failed; the first: {failed[0]}")
        return took, cpu
    finally:
        for err in errs:
            err.close()


def run(concurrent: int = 100, runs: int = 3, memory: str = "1G", program: str = "true") -> dict:
    found = shutil.which(program)
    if found is None:
        raise PyvgpuError(f"--program {program!r} is not on PATH; give a program that exits 0 at once, e.g. true")
    wrap = wrap_command()
    out: dict[str, list[float]] = {"bare_s": [], "python_s": [], "wrapped_s": [], "wrapped_cpu_ms": [],
                                   "single_cpu_ms": []}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pyvgpu-wraps-") as tmp:
        for i in range(runs):
            env = {**raw_env(), envspec.XDG_RUNTIME_DIR.name: str(Path(tmp) / f"run{i}")}
            os.mkdir(env[envspec.XDG_RUNTIME_DIR.name], 0o700)
            took, _ = _wave([[found]] * concurrent, env)
            out["bare_s"].append(took)
            out["python_s"].append(_wave([[sys.executable, "-c", "pass"]] * concurrent, env)[0])
            _wave([[*wrap, "wrap", "--group", "first", "--memory", memory, "--", found]], env)
            cmd = [*wrap, "wrap", "--group", "bench", "--memory", memory, "--", found]
            took, cpu = _wave([cmd] * concurrent, env)
            out["wrapped_s"].append(took)
            out["wrapped_cpu_ms"].append(median(cpu) * 1e3)
            for _ in range(5):  # one at a time, into the group the wave made
                out["single_cpu_ms"].append(_wave([cmd], env)[1][0] * 1e3)
    return {"bench": "startup-concurrent", "machine": {**machine(), "cores": os.cpu_count()},
            "concurrent": concurrent, "runs": runs, "memory": memory, "program": found, "wrap": wrap,
            "goal_s": GOAL_S, "goal_cpu_ms": GOAL_CPU_MS, "load_average": load,
            "median": {k: median(v) for k, v in out.items()}, "samples": out}


def table(result: dict) -> str:
    m, n = result["median"], result["concurrent"]
    rows = [
        (f"{n} x {result['program']} at once, bare:", f"{m['bare_s']:7.3f} s"),
        (f"{n} x python -c pass at once:", f"{m['python_s']:7.3f} s   (the interpreters alone)"),
        (f"{n} x pyvgpu wrap --group --memory at once:", f"{m['wrapped_s']:7.3f} s   (goal <= {result['goal_s']} s)"),
        (f"CPU per wrap (wrap + program), {n} at once:", f"{m['wrapped_cpu_ms']:7.1f} ms"),
        ("CPU per wrap (wrap + program), one at a time:",
         f"{m['single_cpu_ms']:7.1f} ms  (goal <= {result['goal_cpu_ms']:.0f} ms before exec)"),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join([
        f"pyvgpu bench startup --concurrent {n} on {result['machine']['cpu']}, {result['machine']['cores']} cores "
        f"(median of {result['runs']} runs)",
        f"  load average at the start: {' '.join(f'{v:.2f}' for v in result['load_average'])} (other work on the "
        "machine slows the waves)",
        *(f"  {label:<{width}} {value}" for label, value in rows),
    ])
