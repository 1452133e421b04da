"""Where VPMM's time goes on the bench trace (issue 18): each malloc and free of `bench vpmm --direct`'s
trace timed alone, split by whether it defragmented, with the VMM calls it made (from the pool's counters).
Run on a GPU: python vpmm_profile.py OUT.json"""
import json
import statistics
import sys
import time

from pyvgpu.bench.vpmm import trace
from pyvgpu.jit import vpmm_tables as T
from pyvgpu.vpmm import VMM_FUNCS, VirtualMemoryPool

pool = VirtualMemoryPool()
hd = pool.hd
ops = trace(600)
F = {"create": T.F_CREATE, "map": T.F_MAP, "access": T.F_SET_ACCESS, "unmap": T.F_UNMAP}


def counts():
    c = {k: int(hd[T.H_CALLS + f]) for k, f in F.items()}
    c["access_pages"] = pool.calls()["cuMemSetAccess_pages"]
    c["defrags"] = int(hd[T.H_DEFRAGS])
    return c


rows = []
held = {}
t_all = time.perf_counter_ns()
for op, i, n in ops:
    before = counts()
    t0 = time.perf_counter_ns()
    if op == "alloc":
        held[i] = pool.malloc(n)
    else:
        pool.free(held.pop(i))
    dt = time.perf_counter_ns() - t0
    after = counts()
    rows.append((op, n, dt, {k: after[k] - before[k] for k in after}))
total = time.perf_counter_ns() - t_all


def summ(sel):
    ts = [r[2] for r in sel]
    return {"n": len(ts), "ms": sum(ts) / 1e6, "median_us": statistics.median(ts) / 1e3 if ts else 0,
            "p90_us": sorted(ts)[int(len(ts) * 0.9)] / 1e3 if ts else 0}


defrag = [r for r in rows if r[0] == "alloc" and r[3]["defrags"]]
plain = [r for r in rows if r[0] == "alloc" and not r[3]["defrags"]]
create_only = [r for r in plain if r[3]["create"]]
frees = [r for r in rows if r[0] == "free"]
# time of a defragmentation against its calls: least squares ms = a*access_calls + b*access_pages + c*creates
import numpy as np  # noqa: E402

X = np.array([[r[3]["access"], r[3]["access_pages"], r[3]["create"]] for r in defrag])
y = np.array([r[2] / 1e3 for r in defrag])
coef = np.linalg.lstsq(X, y, rcond=None)[0].tolist() if len(defrag) > 5 else []
timed = sum(r[2] for r in rows)  # the operations alone, without this probe's bookkeeping between them
out = {"ops": len(ops), "timed_ms": timed / 1e6, "ops_per_s": len(ops) / (timed / 1e9), "wall_ms": total / 1e6,
       "defragmenting_mallocs": summ(defrag), "other_mallocs": summ(plain), "mallocs_creating_pages": summ(create_only),
       "frees": summ(frees), "fit_us_per": dict(zip(["access_call", "access_page", "create"], coef, strict=False)),
       "calls": {k: sum(r[3][k] for r in rows) for k in rows[0][3]},
       "stats": {k: v for k, v in pool.stats().items() if k != "calls"}}
print(json.dumps(out, indent=1))
if len(sys.argv) > 1:
    json.dump(out, open(sys.argv[1], "w"), indent=1)
