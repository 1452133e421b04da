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
