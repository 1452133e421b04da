"""A --sm 50 all-reduce gang beside an unlimited 2-rank all-reduce neighbour on the fake driver's simulated
collective (each group its own communicator, FAKECUDA_SIM_COMM). Prints the neighbour's and the gang's
gang words as sampled during the run, the turn file's counters per device, and each rank's share.
Usage: python dev/neigh_scenario.py OUTDIR [seconds]"""
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "fakecuda")]
from helpers import clean_env  # noqa: E402
from simgpu import UNLIMITED, Load, sim_env  # noqa: E402

from build import build  # noqa: E402
from pyvgpu.errors import PyvgpuError  # noqa: E402
from pyvgpu.group import region  # noqa: E402
from pyvgpu.group import turnfile as sched  # noqa: E402
from pyvgpu.native import cache  # noqa: E402


def hdr(path):
    try:
        r = region.open_region(path, writable=False)
    except (PyvgpuError, OSError):
        return None
    h = r.header
    slots = [(i, r.slot(i).launches, [r.slot(i).dev[d].sm_launches for d in range(2)],
              [r.slot(i).dev[d].sm_cost_ns // max(1, r.slot(i).dev[d].sm_launches) // 1000 for d in range(2)])
             for i in range(8) if r.slot(i).state == 1]
    out = (h.sm_any, hex(h.sm_gang), h.sm_devs, h.turn_gid, slots)
    os.close(r.fd)
    return out


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 6
    fake = build(Path(tempfile.mkdtemp(dir=out)))
    cd = cache.cache_dir()
    cache.ensure(cd, workers=cache.cli_workers())
    env = clean_env(LD_LIBRARY_PATH=str(fake), PYVGPU_CACHE_DIR=str(cd), PYVGPU_MIN_MEMORY="1M")
    e = sim_env(env, out, "nb", FAKECUDA_SIM_COLLECTIVE="2", FAKECUDA_DEVICES="16G,16G")
    greg, nreg = out / "gang.region", out / "neigh.region"
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.monotonic(), hdr(nreg), hdr(greg)))
            time.sleep(0.5)
    g = [Load(dict(e, FAKECUDA_SIM_COMM="0"), out, f"g{r}", ["--sm", "50"], seconds, region_path=greg, device=r)
         for r in (0, 1)]
    comm = os.environ.get("NB_COMM", "1")  # NB_COMM=0: both groups in one communicator (the fake before)
    n = [Load(dict(e, FAKECUDA_SIM_COMM=comm), out, f"n{r}", [], seconds, region_path=nreg, device=r)
         for r in (0, 1)]
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    loads = g + n
    for x in loads:
        x.wait()
    stop.set()
    t.join()
    start = max(x.points[0][0] for x in loads) + int(1.0 * 1e9)
    end = min(x.points[-1][0] for x in loads)
    sh = [round(100 * x.rate_between(start, end) / UNLIMITED, 1) for x in loads]
    print("samples (t, neighbour (sm_any, sm_gang, sm_devs, turn_gid, slots (i, launches, sm_launches per dev, "
          "mean charged cost us per dev)), gang (same)):")
    t0 = samples[0][0]
    for ts, a, b in samples:
        print(f"  {ts - t0:5.1f} N={a} G={b}")
    for i, ent in enumerate(sched.entries(out / "nb.turns")):
        print("entry", i, hex(ent["key"]), {k: ent[k] for k in ("handovers", "coruns", "preempts", "drains", "lapses",
                                                        "joins", "gaps", "stucks", "catchups", "unmatched")})
    print("shares % (g0 g1 n0 n1):", sh)
    for name, p in (("gang", greg), ("neighbour", nreg)):
        r = region.open_region(p, writable=False)
        for d in range(2):
            x = r.device(d)
            print(f"{name} dev{d}: throttle_ms={x.sm_throttle_ns / 1e6:.0f} turn_ms={x.sm_turn_ns / 1e6:.0f} "
                  f"turn_wait_ms={x.sm_turn_wait_ns / 1e6:.0f} scale={x.sm_scale}")
        print(f"{name} events:", [(ev.get("kind"), ev.get("device")) for ev in r.events()][-8:])
        os.close(r.fd)


main()
