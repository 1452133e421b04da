"""The headroom policy of docs/vpmm.md ("Fresh pages within the 1.01x bound"), counted on the fake driver.

Not part of pyvgpu: the policy did not pay, so its code is not in the allocator. To run it again, from the
root of a checkout at the commit that added this folder, on the test suite's fake driver:

    git apply docs/runs/2core-2026-11-23-vpmm-headroom/headroom-experiment.patch
    python tests/fakecuda/build.py /tmp/fake
    LD_LIBRARY_PATH=/tmp/fake FAKECUDA_DEVICES=256G PYTHONPATH=. \\
        python docs/runs/2core-2026-11-23-vpmm-headroom/headroom_model.py > results.md
    git apply -R docs/runs/2core-2026-11-23-vpmm-headroom/headroom-experiment.patch

The patch adds, in the header: H_HEADROOM (1/10000 of the most bytes ever live at once, this request
included), H_FRESH_MODE (bit 0: a defragmentation creates the pages it lacks, as far as the headroom goes,
instead of moving the pool's free pages; bit 1: a span that grows to the right, or a fresh one, is mapped
up to H_AHEAD pages further, free, for its stream's next larger request), H_RESERVE (bytes kept out of the
headroom for the small requests, which the pool does not gate), and counters. Counts are the fake's: exact
calls, not GPU time.
"""

import json
import random

from pyvgpu.bench import vpmm as bench
from pyvgpu.jit import vpmm_tables as T
from pyvgpu.vpmm import VirtualMemoryPool

MiB = 1 << 20
STEPS = 600
RUNS = [  # (headroom in 1/10000, mode, ahead pages, reserve MiB)
    (0, 0, 0, 0), (100, 1, 0, 0), (100, 1, 0, 2), (100, 2, 8, 0), (100, 2, 8, 2), (100, 3, 8, 2),
    (200, 1, 0, 2), (500, 1, 0, 2), (1000, 1, 0, 2), (200, 3, 16, 2), (500, 3, 16, 2), (1000, 3, 16, 2)]


def kinds() -> dict[int, str]:
    """bench.trace's allocations by kind (its generator replayed): a new request's KV buffer, a KV buffer
    grown by a step, or an activation."""
    rnd = random.Random(0)
    out: dict[int, str] = {}
    next_id = 0
    kv: dict[int, tuple[int, int]] = {}
    for step in range(STEPS):
        r = step % 4
        if r not in kv or rnd.random() < 0.02:
            size, k = rnd.randrange(16, 48) * MiB + rnd.randrange(4096), "kv-new"
        else:
            size, k = kv[r][1] + rnd.randrange(1, 5) * MiB + 4096 * rnd.randrange(1, 256), "kv-grow"
        out[next_id] = k
        kv[r] = (next_id, size)
        next_id += 1
        act = [next_id + j for j in range(rnd.randrange(1, 4))]
        for a in act:
            rnd.randrange(1, 24)
            rnd.randrange(4096)
            out[a] = "activation"
        next_id += len(act)
    return out


def one(head: int, mode: int, ahead: int, reserve: int) -> dict:
    pool = VirtualMemoryPool(page_size=2 * MiB)
    pool.hd[T.H_HEADROOM], pool.hd[T.H_FRESH_MODE], pool.hd[T.H_AHEAD] = head, mode, ahead
    pool.hd[T.H_RESERVE] = reserve * MiB
    ops = bench.trace(STEPS)
    kind = kinds()
    held: dict[int, int] = {}
    by_kind: dict[str, int] = {}
    for op, i, n in ops:
        if op == "alloc":
            d0 = int(pool.hd[T.H_DEFRAGS])
            held[i] = pool.malloc(n)
            by_kind[kind[i]] = by_kind.get(kind[i], 0) + int(pool.hd[T.H_DEFRAGS]) - d0
        else:
            pool.free(held.pop(i))
    st, live = pool.stats(), bench.peak_live(ops)
    c = st["calls"]
    return {"headroom_pct": head / 100, "mode": mode, "ahead": ahead, "reserve_mib": reserve,
            "setaccess": c["cuMemSetAccess"], "setaccess_pages": c["cuMemSetAccess_pages"], "map": c["cuMemMap"],
            "create": c["cuMemCreate"], "unmap": c["cuMemUnmap"], "defrags": st["defragmentations"],
            "defrags_by_kind": by_kind, "moved": st["moved_pages"], "fresh": int(pool.hd[T.H_FRESH_PAGES]),
            "ahead_pages": int(pool.hd[T.H_AHEAD_PAGES]), "taken_over_live": round(st["peak_taken"] / live, 5),
            "mapped_over_live": round(st["peak_mapped"] / live, 5)}


if __name__ == "__main__":
    for run in RUNS:
        print(json.dumps(one(*run)))
