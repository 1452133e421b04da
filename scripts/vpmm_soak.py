"""VPMM soak (issue 32): a mixed run under `pyvgpu wrap --allocator vpmm`, ending with the pool's accounting
compared with the driver's; prints PASS or FAIL and one JSON line of figures.

    python scripts/vpmm_soak.py [--seconds 600] [--memory 40G] [--seed 0]

It wraps itself (`pyvgpu wrap --memory M --allocator vpmm`, CUDA_MODULE_LOADING=EAGER so that kernels loaded
on first use do not take device memory mid-run, outside the pool) and runs, chosen at random until the time
is up: varying-shape decoding (pyvgpu.bench.vpmm_loops: transformers' GPT-2 shape if installed, else a
plain-PyTorch decoder of that shape), training steps of 8 x Linear 2048 with Adam, torch.cuda.empty_cache(),
a CUDA graph replayed on new inputs (and now and then reset and captured again) checked against eager
results, and a side stream reading a tensor freed after record_stream while the main stream reuses memory
(its result is checked). Every allocation must succeed.

At the start (after one of each, everything dropped and the cache emptied) and at the end (the same) it
reads the driver's free memory (torch.cuda.mem_get_info, virtualized by the wrap), the pool's reserved
bytes (torch.cuda.memory_reserved: its pages and its small requests) and what the group charges this
process by kind (data, context, module). The driver's change is the pool's plus what was charged outside
the pool: code modules that libraries load when a kernel is first used (CUDA_MODULE_LOADING=EAGER covers
only modules loaded at start; on an H100 a 214 s run's module charge grew by exactly the driver's change
while the pool's was 0). PASS when the driver's change equals the pool's plus the context and module
charges' (within 2 MiB: one page, or the small requests' pool's chunk), the group's data charge changed as
the pool's reserved bytes did, the pool's figures agree with each other (mapped = pages x page size,
reserved = mapped + small, no zombie after the trim), and nothing failed. Without the charge by kind it
compares the driver's change with the pool's alone (and fails on any module loaded mid-run).
Exit status 0 PASS, 1 FAIL, 2 could not run (no GPU, no PyTorch).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time

MiB = 1 << 20
TOLERANCE = 2 * MiB


def outer(a: argparse.Namespace) -> int:
    env = dict(os.environ, CUDA_MODULE_LOADING="EAGER")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    cmd = [sys.executable, "-m", "pyvgpu", "wrap", "--allocator", "vpmm"] + (["--memory", a.memory] if a.memory else [])
    cmd += ["--", sys.executable, os.path.abspath(__file__), "--inner", "--seconds", str(a.seconds), "--seed",
            str(a.seed)]
    p = subprocess.run(cmd, env=env, timeout=a.seconds + 900)
    return p.returncode


def inner(a: argparse.Namespace) -> int:
    from pyvgpu.bench import vpmm_loops as L
    from pyvgpu.errors import PyvgpuError

    try:
        torch = L.need_gpu()
    except PyvgpuError as e:
        print(f"vpmm_soak: {e}", file=sys.stderr)
        return 2
    if not L.pools():
        print("vpmm_soak: not running on VPMM (run it without --inner: it wraps itself)", file=sys.stderr)
        return 2
    pool = L.pools()[0]
    rnd = random.Random(a.seed)
    counts: dict[str, int] = {}
    checks: list[str] = []  # failed checks, in words
    worst_mid = 0

    def consistent(where: str) -> None:
        st = pool.stats()
        if st["mapped"] != st["pages"] * st["page_size"]:
            checks.append(f"{where}: mapped {st['mapped']} != pages x page size")
        if torch.cuda.memory_reserved() != st["mapped"] + st["small_live"]:
            checks.append(f"{where}: memory_reserved {torch.cuda.memory_reserved()} != mapped + small "
                          f"{st['mapped'] + st['small_live']}")

    state: dict = {}

    def build() -> None:
        state["dec"], state["dec_kind"] = L.decode_model(torch)
        state["mlp"] = L.mlp(torch)
        state["opt"] = torch.optim.Adam(state["mlp"].parameters(), lr=1e-4)
        state["side"] = torch.cuda.Stream()
        capture()

    def capture() -> None:
        g_old = state.pop("graph", None)
        if g_old is not None:
            g_old.reset()
        net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
        x = torch.randn(256, 1024, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on a side stream, as torch.cuda.graph's documentation asks
            for _ in range(3):
                net(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            y = net(x)
        state.update(graph=g, gnet=net, gx=x, gy=y)

    def decode() -> None:
        L.decode(torch, state["dec"], 0.01, rnd)  # one generate call of a random shape

    def train() -> None:
        net, opt = state["mlp"], state["opt"]
        for _ in range(rnd.randint(5, 20)):
            x = torch.randn(L.MLP_BATCH, L.MLP_WIDTH, device="cuda")
            loss = (net(x) - x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if not torch.isfinite(loss):
            checks.append("training loss is not finite")

    def graph() -> None:
        if rnd.random() < 0.1:
            capture()
            counts["recapture"] = counts.get("recapture", 0) + 1
        for _ in range(rnd.randint(1, 8)):
            x = torch.randn(256, 1024, device="cuda")
            state["gx"].copy_(x)
            state["graph"].replay()
            with torch.no_grad():
                want = state["gnet"](x)
            if not torch.allclose(state["gy"], want, rtol=1e-3, atol=1e-3):
                checks.append("a CUDA graph replay differs from the eager result")
                return

    def side_stream() -> None:
        n = rnd.randint(1, 64) * MiB // 4
        x = torch.randn(n, device="cuda")
        want = float(x.double().sum())
        side = state["side"]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)  # keeps the side stream busy while the main stream goes on
            y = x.double().sum()
        x.record_stream(side)
        del x
        junk = [torch.full((n,), 7.0, device="cuda") for _ in range(3)]  # would overwrite x if reused too early
        side.synchronize()
        del junk
        if abs(float(y) - want) > 1e-6 * max(1.0, abs(want)) + 1e-3:
            checks.append(f"the side stream read {float(y)}, not {want}: its memory was reused under it")

    def empty_cache() -> None:
        torch.cuda.empty_cache()

    acts = [(decode, 4), (train, 3), (graph, 2), (side_stream, 2), (empty_cache, 1)]
    names, weights = [f.__name__ for f, _ in acts], [w for _, w in acts]
    funcs = dict(zip(names, [f for f, _ in acts], strict=True))

    def drop() -> None:
        g = state.pop("graph", None)
        if g is not None:
            g.reset()
        state.clear()
        gc.collect()
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:  # PyTorch keeps a cuBLAS workspace per stream used, live in the pool
            clear()
        torch.cuda.empty_cache()

    def accounting() -> tuple[int, int]:
        free, _ = torch.cuda.mem_get_info()
        return free, torch.cuda.memory_reserved()

    def kinds() -> dict:
        """What the group charges this process on device 0, by kind (data, context, module): where a
        difference between the driver's and the pool's change lies."""
        from pyvgpu.ops import status

        try:
            for g in status.collect(region_path=os.environ.get("PYVGPU_REGION")):
                for p in g["processes"]:
                    if p["pid"] == os.getpid():
                        return dict(p["devices"].get("0", {}))
        except Exception as e:  # noqa: BLE001 - a diagnostic; the soak's verdict does not depend on it
            return {"error": f"{type(e).__name__}: {e}"}
        return {}

    def driver_side() -> dict:
        """Beside the group's charge: what the device's default memory pool (behind VPMM's small requests)
        reserves, and what NVML says this process holds on the GPU (the driver's own count, contexts and
        modules included), so that a difference can be placed."""
        import ctypes

        out: dict = {}
        try:
            cu = ctypes.CDLL("libcuda.so.1")
            pool, v = ctypes.c_void_p(), ctypes.c_uint64()
            if cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0) == 0 and \
                    cu.cuMemPoolGetAttribute(pool, 5, ctypes.byref(v)) == 0:  # RESERVED_MEM_CURRENT
                out["mempool_reserved"] = v.value
            if cu.cuMemPoolGetAttribute(pool, 7, ctypes.byref(v)) == 0:  # USED_MEM_CURRENT
                out["mempool_used"] = v.value
        except (OSError, AttributeError) as e:
            out["mempool_error"] = str(e)
        try:
            nv = ctypes.CDLL("libnvidia-ml.so.1")

            class Proc(ctypes.Structure):
                _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint),
                            ("ci", ctypes.c_uint)]

            h, n = ctypes.c_void_p(), ctypes.c_uint(64)
            procs = (Proc * 64)()
            if nv.nvmlInit_v2() == 0 and nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0 and \
                    nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), procs) == 0:
                out["nvml_process_used"] = next((procs[i].used for i in range(n.value)
                                                 if procs[i].pid == os.getpid()), None)
        except (OSError, AttributeError) as e:
            out["nvml_error"] = str(e)
        return out

    def outside(k0: dict, k1: dict) -> int | None:
        """What the group charged outside the pool between two readings (contexts, code modules), or None."""
        try:
            return sum(int(k1[k]) - int(k0[k]) for k in ("context", "module"))
        except (KeyError, TypeError, ValueError):
            return None

    error = None
    t_start = time.time()
    try:
        build()
        for f in funcs.values():  # one of each: every kernel loaded, cuBLAS's workspaces made
            f()
        drop()
        free0, res0 = accounting()
        kinds0 = {**kinds(), **driver_side()}
        consistent("start")
        build()
        last_check = time.time()
        deadline = time.time() + a.seconds
        while time.time() < deadline:
            name = rnd.choices(names, weights)[0]
            funcs[name]()
            counts[name] = counts.get(name, 0) + 1
            if time.time() - last_check > 30:
                torch.cuda.synchronize()
                consistent(f"after {time.time() - t_start:.0f} s")
                free, res = accounting()
                worst_mid = max(worst_mid, abs((free0 - free) - (res - res0) - (outside(kinds0, kinds()) or 0)))
                last_check = time.time()
        drop()
        free1, res1 = accounting()
        kinds1 = {**kinds(), **driver_side()}
    except Exception as e:  # noqa: BLE001 - the soak reports any failure, whatever raised it
        error = f"{type(e).__name__}: {e}"
        free1 = res1 = free0 = res0 = 0
        kinds0 = kinds1 = {}
    st = pool.stats()
    if error is None:
        consistent("end")
        if st["zombies"]:
            checks.append(f"end: {st['zombies']} bytes of zombies after empty_cache")
        if st["ooms"]:
            checks.append(f"the pool refused {st['ooms']} allocations")
    driver_delta, pool_delta = free0 - free1, res1 - res0
    other_delta = outside(kinds0, kinds1)  # None: the group's charge by kind could not be read
    if error is None and other_delta is not None:
        data_delta = kinds1["data"] - kinds0["data"]
        if abs(data_delta - pool_delta) > TOLERANCE:
            checks.append(f"the group's data charge changed by {data_delta} B, the pool's reserved by {pool_delta} B")
    expected = pool_delta + (other_delta or 0)
    ok = error is None and not checks and abs(driver_delta - expected) <= TOLERANCE
    out = {"seconds": round(time.time() - t_start, 1), "activities": counts, "error": error, "checks": checks,
           "driver_used_change": driver_delta, "pool_reserved_change": pool_delta,
           "charged_outside_pool_change": other_delta,
           "worst_mid_run_difference": worst_mid, "charged_start": kinds0, "charged_end": kinds1,
           "pool": {k: st.get(k) for k in L.POOL_KEYS},
           "device": torch.cuda.get_device_name(0)}
    print(json.dumps(out))
    if ok:
        print(f"PASS: {out['seconds']} s, {sum(counts.values())} activities {counts}; driver's used memory changed "
              f"by {driver_delta} B, the pool's reserved by {pool_delta} B, contexts and modules by {other_delta} B")
        return 0
    why = error or "; ".join(checks) or (
        f"the driver's used memory changed by {driver_delta} B, the pool's reserved by {pool_delta} B and the "
        + ("group's charge could not be read by kind" if other_delta is None else
           f"contexts and modules by {other_delta} B") + f" (more than {TOLERANCE} B apart)")
    print(f"FAIL: {why}")
    return 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="length of the mixed run (default 600)")
    ap.add_argument("--memory", default="40G", help="the wrap's --memory cap ('' for none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.seconds <= 0:
        ap.error(f"--seconds {a.seconds}: give a positive number of seconds")
    return inner(a) if a.inner else outer(a)


if __name__ == "__main__":
    sys.exit(main())
