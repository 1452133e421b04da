"""When the callbacks cannot be installed: fail closed if limits were asked for, say why, lose nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PYVGPU, run

from pyvgpu.errors import PyvgpuError
from pyvgpu.native import cache

BROKEN = {"PYVGPU_CALLBACKS": "/nonexistent/libpyvgpu_callbacks.so"}


def test_fail_closed_when_limits_requested(env, fake, tmp_path):
    env.update(BROKEN, CUDA_DEVICE_MEMORY_LIMIT="1G")
    p = run([*PYVGPU, "wrap", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 1
    assert "FAIL cuInit(0) -> 800" in p.stdout  # CUDA_ERROR_NOT_PERMITTED: the program did not get the GPU
    lines = [x for x in p.stderr.splitlines() if x.startswith("pyvgpu:")]
    assert len(lines) == 1, p.stderr
    assert "PYVGPU_CALLBACKS=/nonexistent/libpyvgpu_callbacks.so" in lines[0] and "refused" in lines[0]
    assert "PYVGPU_ON_ERROR=open" in lines[0]


def test_fail_open_when_asked(env, fake):
    env.update(BROKEN, CUDA_DEVICE_MEMORY_LIMIT="1G")
    p = run([*PYVGPU, "wrap", "--on-error", "open", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("OK")
    assert "warning: cannot install the callbacks" in p.stderr


def test_no_limits_means_pass_through_with_a_warning(env, fake):
    env.update(BROKEN)
    p = run([*PYVGPU, "wrap", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 0
    assert "calls pass to the driver unchanged" in p.stderr


def test_closed_explicitly_without_limits(env, fake):
    env.update(BROKEN)
    p = run([*PYVGPU, "wrap", "--on-error", "closed", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 1 and "-> 800" in p.stdout


def test_bad_on_error_value(env, fake):
    p = run([*PYVGPU, "wrap", "--on-error", "maybe", "--", "true"], env=env)
    assert p.returncode == 2 and "maybe" in p.stderr
    env.update(BROKEN, PYVGPU_ON_ERROR="maybe",
               LD_PRELOAD=str(__import__("pyvgpu.native.shim").native.shim.shim_path()))
    p = run([str(fake / "host_linked")], env=env)
    assert "PYVGPU_ON_ERROR=maybe is not 'open' or 'closed'" in p.stderr and p.returncode == 1


def test_a_python_that_cannot_import_pyvgpu_runs_under_its_limits(env, tmp_path):
    """Another venv, without pyvgpu: once refused ("foreign Python host"), now served like any program."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env.pop("PYTHONPATH")
    code = ("import ctypes\n"
            "try:\n    import pyvgpu\nexcept ImportError:\n    print('NO-PYVGPU')\n"
            "c = ctypes.CDLL('libcuda.so.1'); d = ctypes.c_int(); x = ctypes.c_void_p(); p = ctypes.c_uint64()\n"
            "assert c.cuInit(0) == 0 and c.cuDeviceGet(ctypes.byref(d), 0) == 0\n"
            "assert c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d) == 0 and c.cuCtxSetCurrent(x) == 0\n"
            "print('small', c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20)))\n"
            "print('large', c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(8 << 20)))\n")
    p = run([*PYVGPU, "wrap", "--memory", "4M", "--", py, "-c", code], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "NO-PYVGPU" in p.stdout
    assert "small 0" in p.stdout and "large 2" in p.stdout  # CUDA_ERROR_OUT_OF_MEMORY past the cap


def _fake_library(tmp_path: Path, table_hash: str = "deadbeefdeadbeef", mode: int = 0o755) -> Path:
    """A callback library built from the layout's own table type, with a hook table hash of our choosing."""
    from pyvgpu.contract import hooks
    from pyvgpu.contract import layout as L

    src = tmp_path / "fake_cb.c"
    src.write_text("#include <stddef.h>\n#include <stdint.h>\n" + L.CBLIB.c_struct() + "\n"
                   f"const pv_cblib_t {L.CBLIB_SYMBOL} = {{.magic = {hex(L.CBLIB_MAGIC)}ULL, "
                   f".format = {L.CBLIB_FORMAT}, .n_entries = {len(hooks.ENTRIES)}, "
                   f".n_services = {len(hooks.SERVICES)}, .table_hash = \"{table_hash}\", .key = \"k\"}};\n")
    lib = tmp_path / "libfake_cb.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    lib.chmod(mode)
    (tmp_path / "libfake_cb.so.sha256").write_text(hashlib.sha256(lib.read_bytes()).hexdigest() + "\n")
    return lib


def test_a_callback_library_of_another_build_is_refused(env, fake, tmp_path):
    env["CUDA_DEVICE_MEMORY_LIMIT"] = "1G"
    env["PYVGPU_CALLBACKS"] = str(_fake_library(tmp_path))
    p = run([*PYVGPU, "wrap", "--", str(fake / "host_linked")], env=env)
    assert "-> 800" in p.stdout, p.stdout + p.stderr
    assert "compiled for hook table deadbeefdeadbeef" in p.stderr and "unset it" in p.stderr


def test_a_callback_library_others_may_write_is_not_loaded(env, fake, tmp_path):
    from pyvgpu.contract import hooks

    env["CUDA_DEVICE_MEMORY_LIMIT"] = "1G"
    env["PYVGPU_CALLBACKS"] = str(_fake_library(tmp_path, hooks.table_hash(), mode=0o777))
    p = run([*PYVGPU, "wrap", "--", str(fake / "host_linked")], env=env)
    assert "-> 800" in p.stdout, p.stdout + p.stderr
    assert "another user owns it or can write it, so it could put code into your programs" in p.stderr


def stale_package(tmp_path: Path) -> Path:
    """A copy of the installed package whose sources changed since it was built: no compiled library fits."""
    import pyvgpu

    root = tmp_path / "stale"
    shutil.copytree(Path(pyvgpu.__file__).parent, root / "pyvgpu", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "pyvgpu" / "jit" / "runtime" / "context.py", "a") as f:
        f.write("\n# edited after the build\n")
    return root


def test_unwritable_cache_is_a_clear_error(env, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):
        pytest.skip("running as a user who can write anywhere (root)")
    env["PYVGPU_CACHE_DIR"] = str(ro)
    env["PYTHONPATH"] = str(stale_package(tmp_path))
    p = run([*PYVGPU, "wrap", "--", "true"], env=env)
    assert p.returncode == 2
    assert str(ro) in p.stderr and "PYVGPU_CACHE_DIR" in p.stderr


def test_cache_under_a_file_is_a_clear_error_from_wrap(env, tmp_path):
    """Only when no compiled library fits (a source tree edited since its build) is the cache needed."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env["PYVGPU_CACHE_DIR"] = str(blocker / "cache")
    p = run([*PYVGPU, "wrap", "--", "true"], env=env)
    assert p.returncode == 0, p.stderr  # the packaged library fits: the cache is not touched
    env["PYTHONPATH"] = str(stale_package(tmp_path))
    p = run([*PYVGPU, "wrap", "--", "true"], env=env)
    assert p.returncode == 2
    assert str(blocker / "cache") in p.stderr and "PYVGPU_CACHE_DIR" in p.stderr
    assert "no compiled callbacks fit this pyvgpu" in p.stderr


def test_uncreatable_cache_is_a_clear_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("PYVGPU_CACHE_DIR", str(blocker / "cache"))
    assert cache.ensure()["origin"] == "package"  # nothing to compile, nothing to write
    monkeypatch.setattr(cache, "packaged_path", lambda: tmp_path / "missing.so")
    with pytest.raises(PyvgpuError, match="PYVGPU_CACHE_DIR"):
        cache.ensure()


def test_a_broken_tuned_library_falls_back_to_the_packaged_one(monkeypatch, tmp_path, tuned_cache, capfd):
    d = tmp_path / "c"
    shutil.copytree(tuned_cache, d)
    assert cache.read(d)["origin"] == "cache"
    (lib,) = d.glob("callbacks-*.so")
    lib.unlink()  # a new file, as every writer of the cache makes one: this process has the old one mapped
    lib.write_bytes(b"garbage")
    m = cache.read(d)
    assert m["origin"] == "package" and not m["tuned"]
    assert str(lib) in capfd.readouterr().err
    lib.unlink()
    shutil.copy(next(Path(tuned_cache).glob("callbacks-*.so")), lib)
    lib.chmod(0o722)  # writable by others: its code would be anyone's
    m = cache.read(d)
    assert m["origin"] == "package"
    assert "other users may write it" in capfd.readouterr().err


def test_a_tuned_library_of_another_cpu_or_version_is_ignored(tmp_path, tuned_cache):
    from pyvgpu.host import cpuid

    d = tmp_path / "c"
    shutil.copytree(tuned_cache, d)
    (lib,) = d.glob("callbacks-*.so")
    assert lib.name == f"callbacks-{cache.cache_key()}-{cpuid.cpu_id():016x}.so"
    other_cpu = d / f"callbacks-{cache.cache_key()}-{cpuid.cpu_id() ^ 2:016x}.so"
    lib.rename(other_cpu)
    assert cache.read(d)["origin"] == "package"
    other_key = d / f"callbacks-{'0' * 20}-{cpuid.cpu_id():016x}.so"
    shutil.copy(other_cpu, other_key)
    assert cache.read(d, key="0" * 20) is None  # compiled from other sources: its table says so


def test_a_compute_share_that_cannot_be_measured_fails_closed(env, fake):
    """No way to measure utilization: the share is refused (wrap and bare shim), or dropped out loud when open."""
    env["FAKENVML_NO_UTILIZATION"] = "1"
    env["CUDA_DEVICE_SM_LIMIT"] = "30"
    p = run([*PYVGPU, "wrap", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 2 and "CUDA_DEVICE_SM_LIMIT" in p.stderr and "utilization" in p.stderr, p.stderr
    env["LD_PRELOAD"] = str(__import__("pyvgpu.native.shim").native.shim.shim_path())
    p = run([str(fake / "host_linked")], env=env)  # as HAMi's device plugin would start it
    assert "-> 800" in p.stdout and "utilization" in p.stderr, (p.stdout, p.stderr)
    env.pop("LD_PRELOAD")
    env["PYVGPU_ON_ERROR"] = "open"
    p = run([*PYVGPU, "wrap", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 0 and p.stdout.startswith("OK") and "warning" in p.stderr
    env.pop("PYVGPU_ON_ERROR")
    env.pop("CUDA_DEVICE_SM_LIMIT")
    p = run([*PYVGPU, "wrap", "--memory", "1G", "--", str(fake / "host_linked")], env=env)
    assert p.returncode == 0 and p.stdout.startswith("OK"), p.stderr  # memory isolation needs no utilization
