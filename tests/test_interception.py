"""The whole chain on the fake driver: app -> shim -> callback -> driver, by every lookup path and host kind."""

from __future__ import annotations

import json
import sys
import textwrap

from helpers import PYVGPU, calls, lookups, run, wrapped

from pyvgpu.contract import hooks
from pyvgpu.native import cache
from pyvgpu.native.shim import shim_path

PY_HOST = textwrap.dedent("""
    import ctypes, sys
    c = ctypes.CDLL("libcuda.so.1")
    assert c.cuInit(0) == 0
    d = ctypes.c_int(); ctx = ctypes.c_void_p()
    assert c.cuDeviceGet(ctypes.byref(d), 0) == 0
    assert c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0
    assert c.cuCtxSetCurrent(ctx) == 0
    p = ctypes.c_uint64()
    for i in range(7):
        assert c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0
        assert c.cuMemFree_v2(p) == 0
    print("PYOK")
""")


def fake_calls(tmp_path, pattern="fake.*"):
    out = {}
    for f in tmp_path.glob(pattern):
        for k, v in json.loads(f.read_text()).items():
            out[k] = out.get(k, 0) + v
    return out


def test_python_host_loads_the_callbacks_natively_and_counts(env, tmp_path):
    env["FAKECUDA_STATS"] = str(tmp_path / "fake")
    p, stats = wrapped([sys.executable, "-c", PY_HOST], env, tmp_path / "s")
    assert p.returncode == 0, p.stderr
    assert "PYOK" in p.stdout
    (s,) = stats
    assert s["bootstrap"] == "native" and s["callbacks"] == cache.read()["library"]
    assert calls(s, "cuInit") == 1
    assert calls(s, "cuMemAlloc_v2") == 7 and calls(s, "cuMemFree_v2") == 7
    assert lookups(s, "cuMemAlloc_v2", "dlsym") == 1  # ctypes resolves through dlsym
    fk = fake_calls(tmp_path)
    assert fk["cuMemAlloc_v2"] == 7 and fk["cuMemFree_v2"] == 7  # and the calls reached the driver


def test_python_in_isolated_mode_is_served_alike(env, tmp_path):
    # -I ignores PYTHONPATH and the user's site: nothing of pyvgpu's Python is there to help, none is needed.
    code = "import sys\ntry:\n    import pyvgpu\nexcept ImportError:\n    print('NO-PYVGPU')\n" + PY_HOST
    p, stats = wrapped([sys.executable, "-I", "-S", "-c", code], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "NO-PYVGPU" in p.stdout and "PYOK" in p.stdout
    (s,) = stats
    assert s["bootstrap"] == "native"
    assert calls(s, "cuMemAlloc_v2") == 7


def test_c_host_linked_loads_the_callbacks_natively(env, fake, tmp_path):
    env["FAKECUDA_STATS"] = str(tmp_path / "fake")
    p, stats = wrapped([str(fake / "host_linked")], env, tmp_path / "s")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("OK")
    (s,) = stats
    assert s["bootstrap"] == "native"
    expect = {"cuInit": 1, "cuDeviceGetCount": 1, "cuDeviceTotalMem_v2": 1, "cuMemAlloc_v2": 3,
              "cuMemFree_v2": 3, "cuMemGetInfo_v2": 1, "cuLaunchKernel": 5, "cuLaunchKernel_ptsz": 2,
              "cuLaunchKernelEx": 1, "cuLaunchKernelEx_ptsz": 1, "nvmlInit_v2": 1, "nvmlDeviceGetMemoryInfo": 1}
    assert {k: calls(s, k) for k in expect} == expect
    fk = fake_calls(tmp_path)
    assert all(fk[k] == v for k, v in expect.items() if not k.startswith("nvml"))


def test_c_host_through_cuGetProcAddress(env, fake, tmp_path):
    p, stats = wrapped([str(fake / "host_procaddr"), "run"], env, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    # hooked names come back as hooks, others untouched
    assert "alloc=libpyvgpu.so launch=libpyvgpu.so launch_pt=libpyvgpu.so setcur=libcuda.so.1" in p.stdout
    (s,) = stats
    assert s["bootstrap"] == "native" and s["procaddr_mismatches"] == 0
    assert lookups(s, "cuGetProcAddress_v2", "dlsym") == 1
    assert calls(s, "cuMemAlloc_v2") == 4 and lookups(s, "cuMemAlloc_v2", "procaddr") == 1
    assert calls(s, "cuLaunchKernel") == 6 and calls(s, "cuLaunchKernel_ptsz") == 3
    assert calls(s, "cuLaunchKernelEx") == 1


def test_procaddr_returns_the_hook_of_the_drivers_variant(env, fake, tmp_path):
    """Every hooked name at many versions and flags: same rc, status and variant as the driver."""
    versions = (2000, 3000, 3020, 4000, 5000, 6000, 6050, 7000, 9020, 10020, 11000, 11030, 11060, 12000, 13000, 13010)
    queries = "".join(f"{h.name} {v} {f}\n" for h in hooks.HOOKS if h.lib == "cuda"
                      for v in versions for f in (0, 1, 2))
    queries += "cuMemAlloc_v2 12000 0\ncuNoSuchSymbol 12000 0\ncuDeviceGetName 12000 2\n"
    raw = run([str(fake / "host_procaddr"), "query"], env=env, input=queries)
    p, stats = wrapped([str(fake / "host_procaddr"), "query"], env, tmp_path, input=queries)
    assert raw.returncode == 0 and p.returncode == 0, raw.stderr + p.stderr
    hooked = 0
    for r, w in zip(raw.stdout.splitlines(), p.stdout.splitlines(), strict=True):
        name, ver, fl, rc, st, lib, sym = r.split()
        wname, wver, wfl, wrc, wst, wlib, wsym = w.split()
        assert (rc, st, sym) == (wrc, wst, wsym), (r, w)
        expected_lib = "libpyvgpu.so" if sym in hooks.BY_ABI else lib
        assert wlib == expected_lib, (r, w)
        hooked += sym in hooks.BY_ABI
    assert hooked > 100
    assert stats[0]["procaddr_mismatches"] == 0


def test_dlsym_override_keeps_rtld_next(fake, env):
    p = run([str(fake / "rtld_next")], env={**env, "LD_PRELOAD": str(shim_path())})
    assert p.stdout.strip() == "next=2", p.stdout + p.stderr


def test_wrapped_program_keeps_pid_exit_code_and_signals(env):
    import subprocess

    proc = subprocess.Popen([*PYVGPU, "wrap", "--", sys.executable, "-c", "import os; print(os.getpid())"],
                            env=env, stdout=subprocess.PIPE, text=True, cwd="/")
    out, _ = proc.communicate(timeout=60)
    assert int(out.strip()) == proc.pid
    assert run([*PYVGPU, "wrap", "--", sys.executable, "-c", "raise SystemExit(7)"], env=env).returncode == 7
    sig = run([*PYVGPU, "wrap", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 15)"],
              env=env)
    assert sig.returncode == -15


def test_user_ld_preload_and_pythonpath_are_kept(env, fake, tmp_path):
    env["LD_PRELOAD"] = str(fake / "libnvidia-ml.so.1")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    code = "import os, sys; print(os.environ['LD_PRELOAD']); print(sys.path)"
    p = run([*PYVGPU, "wrap", "--", sys.executable, "-c", code], env=env)
    assert p.returncode == 0, p.stderr
    preload, path = p.stdout.splitlines()
    assert preload.split() == [str(shim_path()), str(fake / "libnvidia-ml.so.1")]
    assert str(tmp_path) in path


def test_program_not_found(env):
    p = run([*PYVGPU, "wrap", "--", "no-such-program-xyz"], env=env)
    assert p.returncode == 127
    assert "program not found: 'no-such-program-xyz'" in p.stderr


def test_forked_child_counts_its_own_calls(env, tmp_path):
    code = PY_HOST + textwrap.dedent("""
        import os
        pid = os.fork()
        if pid == 0:
            for i in range(3):
                assert c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096)) == 0
            sys.exit(0)
        os.waitpid(pid, 0)
    """)
    p, stats = wrapped([sys.executable, "-c", code], env, tmp_path)
    assert p.returncode == 0, p.stderr
    by_allocs = sorted(calls(s, "cuMemAlloc_v2") for s in stats)
    assert by_allocs == [3, 7]


def test_stats_on_stderr(env):
    p = run([*PYVGPU, "wrap", "--stats", "--", sys.executable, "-c", PY_HOST], env=env)
    assert p.returncode == 0
    assert "pyvgpu stats: pid" in p.stderr and "bootstrap native" in p.stderr
    line = next(x for x in p.stderr.splitlines() if x.strip().startswith("cuMemAlloc_v2"))
    assert line.split()[1] == "7"


def test_bare_ld_preload_without_wrap(env, fake, tmp_path):
    """HAMi's device plugin sets LD_PRELOAD itself: the shim finds its callbacks alone."""
    bare = {k: v for k, v in env.items()}
    bare["LD_PRELOAD"] = str(shim_path())
    bare["PYVGPU_STATS"] = str(tmp_path / "stats-%p.json")
    bare["PYVGPU_CACHE_DIR"] = str(tmp_path / "empty-cache")  # no tuned library: the packaged one
    p = run([str(fake / "host_linked")], env=bare)
    assert p.returncode == 0, p.stdout + p.stderr
    p = run([sys.executable, "-c", PY_HOST], env=bare)
    assert p.returncode == 0, p.stderr
    from helpers import read_stats

    stats = read_stats(tmp_path)
    assert [s["bootstrap"] for s in stats] == ["native", "native"]
    assert {s["callbacks"] for s in stats} == {str(shim_path().parent / "libpyvgpu_callbacks.so")}
