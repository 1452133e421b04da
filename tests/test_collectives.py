"""Collectives across devices under a share (issue 27, item 1), on the fake driver's simulated collective
(FAKECUDA_SIM_COLLECTIVE=2, tests/fakecuda/fake_sim.h): each rank's kernel waits on its GPU until the other
rank's matching kernel has started, and that wait is GPU time, as an NCCL all-reduce's is.

Two processes, one a device, in one group (one region): pv_bench's spin kernel at 2 ms (an all-reduce of
256 MiB takes about as long on two H200s), every one of them a collective. Unlimited, each rank runs 500
kernels/s.
"""

from __future__ import annotations

from simgpu import Load, sim_env

ITERS = "20000"  # x 100 ns: 2 ms kernels
UNLIMITED = 500.0


def ranks(env, tmp, name: str, wrap_opts: list[str] | None, seconds: float = 6) -> list[Load]:
    e = sim_env(env, tmp, name, FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G")
    region = tmp / f"{name}.region"
    return [Load(e, tmp, f"{name}-{r}", wrap_opts, seconds, region_path=region, device=r, iters=ITERS)
            for r in (0, 1)]


def shares(loads: list[Load], after: float) -> list[float]:
    """Each rank's share (%) of the unlimited rate, over the time both ran: from ``after`` s past the later
    start to the earlier end (a rank that stops first leaves the other's last collectives without a peer)."""
    for x in loads:
        x.wait()
    start = max(x.points[0][0] for x in loads) + int(after * 1e9)
    end = min(x.points[-1][0] for x in loads)
    return [100 * x.rate_between(start, end) / UNLIMITED for x in loads]


def test_the_simulated_collective_waits_for_the_late_rank(env, tmp_path):
    """The test double itself: unlimited, the ranks keep pace with each other at the kernel's speed."""
    ra, rb = shares(ranks(env, tmp_path, "raw", None, seconds=3), after=1.0)
    assert abs(ra - rb) <= 5, (ra, rb)  # lockstep
    assert ra >= 60, ra


def test_a_gang_under_a_share_gets_its_share_of_a_collective(env, tmp_path):
    got = {}
    for share in (30, 50):
        got[share] = shares(ranks(env, tmp_path, f"sm{share}", ["--sm", str(share)]), after=3.0)
    for share, (sa, sb) in got.items():
        assert abs(sa - share) <= 8 and abs(sb - share) <= 8, got
