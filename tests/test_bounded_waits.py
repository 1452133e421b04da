"""No wait of the compute share on a CUDA event is unbounded (pyvgpu/jit/compute/drain.py, cost.py).

A collective's kernel (an NCCL all-reduce) waits inside its GPU for its peers' kernels, and a peer held
elsewhere (by its budget, by the turn, or behind other work on its own GPU) may come seconds later. A
process that waited on such a kernel's event with cuEventSynchronize waited all that time inside a launch:
a drain (before a hand-over, before joining the turns, after a lapsed lease) and the wait for a process's
first timed kernel. Each now looks at the event up to a bound (drain.DRAIN_MAX_NS, cost.WAIT_MAX_NS: a
second), then goes on.

On the fake driver's simulated collective (tests/fakecuda/fake_sim.h, FAKECUDA_SIM_COLLECTIVE=2) a kernel
ends a kernel's length after the last rank's matching kernel *starts* on its device. Here the peer (rank 1,
on device 1) queued its kernel behind a LONG_S kernel of an unwrapped program on device 1, so rank 0's
kernel on device 0 waits about that long on its GPU, while rank 0's host goes on. Before the bound, rank 0's
launch, or its drain, ended only when that kernel ended (a LONG_S wait); the bound ends it within about a
second.
The assertions allow BOUND_S, far above the bound and far below the old wait, for a busy 2-core machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from helpers import PYVGPU
from simgpu import Load, sim_busy, sim_env

from pyvgpu.group import turnfile as sched

LONG_S = 60  # the unwrapped program's kernel on device 1, which the peer's collective queues behind
BOUND_S = 8.0  # the longest a launch may take here (the bound is 1 s; the old wait LONG_S less start-up)

HOST = """
import ctypes, sys, time
c = ctypes.CDLL("libcuda.so.1")
assert c.cuInit(0) == 0
d = ctypes.c_int(); ctx = ctypes.c_void_p(); mod = ctypes.c_void_p(); fn = ctypes.c_void_p()
assert c.cuDeviceGet(ctypes.byref(d), int(sys.argv[1])) == 0
assert c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0
assert c.cuCtxSetCurrent(ctx) == 0
assert c.cuModuleLoadData(ctypes.byref(mod), b"spin") == 0
assert c.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin") == 0
iters = ctypes.c_uint32(int(sys.argv[2]))  # x 100 ns of simulated GPU time
params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(iters), ctypes.c_void_p))
print("ready", flush=True)
for k in range(int(sys.argv[3])):
    sys.stdin.readline()  # the test says when
    t = time.monotonic()
    assert c.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None) == 0
    print(f"launched {k} {time.monotonic() - t:.3f}", flush=True)
sys.stdin.readline()  # until the test ends
"""


class Host:
    """HOST on one device (optionally under `pyvgpu wrap`): it launches one kernel each time it is told."""

    def __init__(self, env: dict, device: int, iters: int, launches: int, wrap: list[str] | None, cwd: Path):
        cmd = [sys.executable, "-c", HOST, str(device), str(iters), str(launches)]
        if wrap is not None:
            cmd = [*PYVGPU, "wrap", *wrap, "--", *cmd]
        # cwd: never the repository root, whose unbuilt source tree `python -c` would import first
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=str(cwd))
        assert self._line(120) == "ready", self._fail()

    def _line(self, timeout: float) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
        return self.proc.stdout.readline().strip()

    def _fail(self) -> str:
        self.proc.kill()
        return self.proc.communicate()[1][-3000:]

    def go(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def launch(self, timeout: float) -> float:
        """Launch one kernel; the seconds the launch took (inf: it had not returned after ``timeout``)."""
        self.go()
        line = self._line(timeout)
        if not line:
            return float("inf")
        assert line.startswith("launched"), (line, self._fail())
        return float(line.split()[2])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.communicate()


def _queued(tmp, name: str, pid: int, dev: int) -> int:
    """Kernels the simulation counted for pid on dev (struct sim_proc.kernels)."""
    return sim_busy(tmp, name, dev).get(pid, (0, 0))[1]


def _peer_behind_long_work(env, tmp, name: str, region) -> list[Host]:
    """An unwrapped program's LONG_S kernel on device 1, and rank 1 of a collective queued behind it (its
    launch sits in the fake's full queue meanwhile): rank 0's matching kernel will wait LONG_S on device 0."""
    plain = dict(env)
    plain.pop("FAKECUDA_SIM_COLLECTIVE")
    x = Host(plain, 1, LONG_S * 10_000_000, 1, None, tmp)
    x.go()
    peer = Host(env, 1, 2000, 1, ["--region", str(region), "--sm", "50"], tmp)
    peer.go()
    deadline = time.monotonic() + 60
    while _queued(tmp, name, peer.proc.pid, 1) < 1:  # its collective is in the simulation's rendezvous
        assert time.monotonic() < deadline, "the peer's kernel was never queued"
        time.sleep(0.1)
    return [x, peer]


def test_a_first_timed_launch_does_not_wait_out_a_late_peer(env, tmp_path):
    """A process's first timed launch under the turns is waited for (cost.wait_for). Its collective's
    kernel waits on the GPU for a peer queued behind a long kernel: the launch gives the timing up after
    cost.WAIT_MAX_NS instead of waiting LONG_S (it took the whole wait before)."""
    e = sim_env(env, tmp_path, "first", FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G")
    region = tmp_path / "first.region"
    hosts = _peer_behind_long_work(e, tmp_path, "first", region)
    try:
        rank0 = Host(e, 0, 2000, 1, ["--region", str(region), "--sm", "50"], tmp_path)
        hosts.append(rank0)
        took = rank0.launch(timeout=3 * BOUND_S)
        assert took < BOUND_S, took
    finally:
        for h in hosts:
            h.stop()


def test_joining_the_turns_does_not_wait_out_a_late_peer(env, tmp_path):
    """A process without a share launched a collective outside the turns; when a group with a share comes,
    its next launch lets that work finish first (turn.join, drain.drain). The kernel waits on the GPU for
    a peer queued behind a long kernel: the drain ends after drain.DRAIN_MAX_NS instead of LONG_S."""
    e = sim_env(env, tmp_path, "join", FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G")
    hosts = _peer_behind_long_work(e, tmp_path, "join", tmp_path / "peer.region")
    share = None
    try:
        rank0 = Host(e, 0, 2000, 2, ["--region", str(tmp_path / "rank0.region"), "--memory", "1G"], tmp_path)
        hosts.append(rank0)
        assert rank0.launch(timeout=3 * BOUND_S) < BOUND_S  # outside the turns: nobody waits for it
        # a group with a share on device 0's turn entry (the same turn file), on a simulated GPU of its own
        s = dict(e, FAKECUDA_SIM=str(tmp_path / "share.sim"))
        s.pop("FAKECUDA_SIM_COLLECTIVE")
        share = Load(s, tmp_path, "share", ["--sm", "50"], seconds=30)
        deadline = time.monotonic() + 60
        while not sched.entries(e["PYVGPU_SCHED"]):
            assert time.monotonic() < deadline, "the share never took turns"
            time.sleep(0.1)
        time.sleep(1)  # a few watcher ticks: rank 0's next launch sees the turns taken
        # The launch itself then sits in the fake's full queue (its device runs the waiting kernel), so the
        # drain is read from the turn entry's counters, which it adds to as it ends.
        rank0.go()
        joined = []
        deadline = time.monotonic() + 3 * BOUND_S
        while not joined and time.monotonic() < deadline:
            time.sleep(0.1)
            joined = [g for g in sched.entries(e["PYVGPU_SCHED"]) if g["joins"]]
        assert joined, "the drain before joining the turns had not ended"
        (gpu,) = joined
        assert 0.5e9 <= gpu["join_ns"] < BOUND_S * 1e9, gpu  # it waited for its kernel, up to the bound
    finally:
        for h in hosts:
            h.stop()
        if share is not None:
            share.proc.kill()
            share.proc.communicate()
