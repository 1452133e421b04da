"""A group without a share whose two ranks run collectives beside a gang with one (docs/compute.md,
"Launch-bound loads, collectives and neighbours without a share"): it forms a gang too, so that its rank on
the second GPU takes turns with its peer on the lead GPU's entry instead of running its collective beside
the share's turn (best effort). Each group's collectives are matched within the group
(FAKECUDA_SIM_COMM), as NCCL's communicators are."""

from __future__ import annotations

import os
import time

from simgpu import Load, sim_env

from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.jit.compute import gang


def test_an_unshared_two_rank_neighbour_of_a_gang_forms_a_gang_and_takes_turns_on_the_lead_entry(env, tmp_path):
    e = sim_env(env, tmp_path, "ng", FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G")
    greg, nreg = tmp_path / "gang.region", tmp_path / "neigh.region"
    loads = [Load(dict(e, FAKECUDA_SIM_COMM="0"), tmp_path, f"g{r}", ["--sm", "50"], 3, region_path=greg, device=r)
             for r in (0, 1)]
    loads += [Load(dict(e, FAKECUDA_SIM_COMM="1"), tmp_path, f"n{r}", [], 3, region_path=nreg, device=r)
              for r in (0, 1)]
    on1 = []
    seen = set()  # the neighbour's (sm_any, sm_gang, sm_devs, turn_gid given) while its ranks run
    while loads[2].proc.poll() is None and loads[3].proc.poll() is None:
        time.sleep(0.1)
        try:
            r = region.open_region(nreg, writable=False)
        except PyvgpuError:
            continue
        h = r.header
        seen.add((h.sm_any, h.sm_gang, h.sm_devs, h.turn_gid != 0))
        # the rank on device 1: (launches under the turns there or on the lead's entry, launches outside them)
        on1 = [(r.slot(i).dev[1].sm_launches, r.slot(i).launches) for i in range(4)
               if r.slot(i).state == 1 and r.slot(i).dev[1].sm_launches]
        os.close(r.fd)
    for x in loads:
        x.wait()
    # before, the watcher left a group without a share out of gang.update: sm_gang and turn_gid stayed 0
    assert (0, gang.word.py_func(3), 3, True) in seen, seen  # devices 0 and 1, lead 0, a shared turn id
    # and its rank on device 1 launches under the turns to the end: before, once the share's gang took its
    # turns on device 0's entry alone, device 1's went idle and that rank launched outside the turns
    (turns, outside), = on1
    assert turns > 5 * outside, on1


def test_an_unshared_gang_whose_timings_read_long_fills_what_a_gang_with_a_share_leaves(env, tmp_path):
    """A gang at --sm 50 beside a gang without a share whose kernel timings read 3x its kernels
    (FAKECUDA_EVENT_SCALE, for the neighbour only): an all-reduce's timing holds its wait for the peer, and
    a group without a share has no controller to scale its costs down. The neighbour's queue estimate ran 3x
    ahead of the GPU, and as a best-effort holder it was capped by that estimate (turn.py ``take``):
    during the share's holds for its budget it held the turn and slept with the GPU mostly idle, at a third
    of the share's rate (0.33; on two H200s 22.8% of its speed alone beside the share's 48.2%). Now a capped
    holder whose work on the GPU is done brings the estimate back to now and launches."""
    e = sim_env(env, tmp_path, "ngl", FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G")
    greg, nreg = tmp_path / "gang.region", tmp_path / "neigh.region"
    loads = [Load(dict(e, FAKECUDA_SIM_COMM="0"), tmp_path, f"g{r}", ["--sm", "50"], 6, region_path=greg, device=r)
             for r in (0, 1)]
    loads += [Load(dict(e, FAKECUDA_SIM_COMM="1", FAKECUDA_EVENT_SCALE="3"), tmp_path, f"n{r}", [], 6,
                   region_path=nreg, device=r) for r in (0, 1)]
    share, neighbour = min(x.rate(2) for x in loads[:2]), min(x.rate(2) for x in loads[2:])
    # what the share leaves, about as much as it takes: 0.9 of the share's rate here, 0.57 beside two busy loops
    # on 2 cores; 0.22 before
    assert neighbour >= 0.4 * share, (share, neighbour)
    d = region.open_region(greg, writable=False).device(0)
    assert d.sm_throttle_ns > 0.2 * 6e9, "the share was held for its budget: there was time left to fill"
