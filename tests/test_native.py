"""What the shim does with no interpreter: pick the callback library, tell CPUs apart, make and join regions.

shim/src/pv_load.c does in C what pyvgpu/native/cache.py and cpuid.py do in Python; these tests hold the two to the
same results. Regions, turn files and the variables have one implementation, the group core
(shim/src/pv_group_*.c, pv_env.c, pv_grammar.c), which the shim and pyvgpu share: the tests here check that
a program started without `pyvgpu wrap` gets the group and the messages wrap would give it. (The grammar of
the variables is in tests/test_sizes.py.)
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
from pathlib import Path

import pytest
from helpers import PYVGPU, read_stats, run

from pyvgpu.contract import layout as L
from pyvgpu.group import limits as lim
from pyvgpu.group import region
from pyvgpu.host import cpuid
from pyvgpu.native import cache, shim

MiB = 1 << 20

ARM = b"""processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
"""


@pytest.mark.parametrize("text", [
    b"", b"processor : 0\nbogomips : 1\n", ARM, ARM.replace(b"\n", b"\r\n"),
    b"\n\nvendor_id : GenuineIntel \nflags\t\t: fpu sse2 avx2\nmodel name\t: X\n\nflags : other\n",
    b"flags:a:b\nmodel\t:  \t7\t\n", b"cpu MHz : 2445.406\nflags : a\n",
])
def test_the_cpu_id_is_computed_alike_in_c_and_python(text):
    assert shim.open_shim().pyvgpu_cpu_id_of(text) == cpuid.cpu_id_of(text)


def test_the_cpu_id_ignores_what_changes_while_a_cpu_runs():
    with open(cpuid.CPUINFO, "rb") as f:
        mine = f.read()
    assert cpuid.cpu_id() == cpuid.cpu_id_of(mine) != 0
    assert shim.open_shim().pyvgpu_cpu_id_of(mine) == cpuid.cpu_id()
    assert cpuid.cpu_id_of(b"model name : A\ncpu MHz : 1\n") == cpuid.cpu_id_of(b"model name : A\ncpu MHz : 2\n")
    assert cpuid.cpu_id_of(b"flags : sse2\n") != cpuid.cpu_id_of(b"flags : sse2 avx2\n")
    assert cpuid.cpu_id_of(ARM) != cpuid.cpu_id_of(ARM.replace(b"0xd0c", b"0xd40"))
    assert cpuid.cpu_id_of(b"processor : 0\n") == 0  # nothing that says what it can do: unknown


def bare(env: dict[str, str], tmp_path: Path, **extra: str) -> dict[str, str]:
    """A program started with the shim preloaded and no `pyvgpu wrap`, as a device plugin starts it."""
    out = dict(env, LD_PRELOAD=str(shim.shim_path()), PYVGPU_STATS=str(tmp_path / "stats-%p.json"),
               XDG_RUNTIME_DIR=str(tmp_path / "run"), PYVGPU_CACHE_DIR=str(tmp_path / "cache"))
    out.pop("PYTHONPATH", None)
    (tmp_path / "run").mkdir(mode=0o700, exist_ok=True)
    out.update(extra)
    return out


def test_the_shim_makes_the_region_pyvgpu_would(env, fake, tmp_path):
    """HAMi's device plugin names a region file that does not exist yet: the shim makes it, as region.py would."""
    path = tmp_path / "vgpu" / "pod-a.cache"
    e = bare(env, tmp_path, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(path), CUDA_DEVICE_MEMORY_LIMIT_0="8m",
             CUDA_DEVICE_MEMORY_LIMIT_1="3.5m", CUDA_DEVICE_SM_LIMIT="30")
    p = run([str(fake / "host_mem_linked"), "boundary", str(8 * MiB)], env=e)
    assert "first=0 one_more=2 free=0 after_free=0" in p.stdout, p.stdout + p.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    mine = region.open_region(path, writable=False)
    theirs_path = tmp_path / "python" / "pod-a.cache"
    region.create(theirs_path, region.GroupSpec("pod-a", lim.memory_from_env({"CUDA_DEVICE_MEMORY_LIMIT_0": "8m",
                                                                              "CUDA_DEVICE_MEMORY_LIMIT_1": "3.5m",
                                                                              "PYVGPU_MIN_MEMORY": "1M"}).as_list(),
                                                sm=lim.sm_from_env({"CUDA_DEVICE_SM_LIMIT": "30"}).as_list()))
    theirs = region.open_region(theirs_path, writable=False)
    volatile = {"created_ns", "ev_next"}  # when it was made; the events the run wrote

    def value(x):
        return bytes(x) if isinstance(x, ctypes.Array) else x

    for f in L.REGION_HEADER.fields:
        if f.name not in volatile:
            assert value(getattr(mine.header, f.name)) == value(getattr(theirs.header, f.name)), f.name
    assert mine.limits() == theirs.limits() == [8 * MiB, 3 * MiB + MiB // 2] + [0] * 14
    assert mine.sm_limits() == theirs.sm_limits() == [30] * 16
    assert os.path.getsize(path) == os.path.getsize(theirs_path)


def test_limits_without_a_region_make_a_private_group(env, fake, tmp_path):
    e = bare(env, tmp_path, CUDA_DEVICE_MEMORY_LIMIT="4M")
    p = run([str(fake / "host_mem_linked"), "boundary", str(4 * MiB)], env=e)
    assert "first=0 one_more=2 free=0 after_free=0" in p.stdout, p.stdout + p.stderr
    (made,) = (tmp_path / "run" / "pyvgpu" / "private").glob("*.region")
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert region.open_region(made, writable=False).limits() == [4 * MiB] * 16


def test_a_program_that_disagrees_with_its_group_is_refused(env, fake, tmp_path):
    path = tmp_path / "g.region"
    region.create(path, region.GroupSpec("g", [4 * MiB] * 16))
    e = bare(env, tmp_path, PYVGPU_REGION=str(path), CUDA_DEVICE_MEMORY_LIMIT="8M")
    p = run([str(fake / "host_mem_linked"), "boundary", str(MiB)], env=e)
    assert "-> 800" in p.stdout, p.stdout + p.stderr  # CUDA_ERROR_NOT_PERMITTED at cuInit: fail closed
    assert f"group 'g' ({path}) has 4 MiB on device 0, but CUDA_DEVICE_MEMORY_LIMIT asks for 8 MiB" in p.stderr


def test_a_program_with_the_groups_first_limits_follows_a_live_change(env, fake, tmp_path):
    """After `pyvgpu limits set` lowered a group's cap, a process whose variables still name the cap the group
    was created with (a child of its first programs, or a container's next process) joins under the group's
    new cap instead of being refused; any other limit is still refused."""
    path = tmp_path / "g.region"
    region.create(path, region.GroupSpec("g", [8 * MiB] * 16))
    p = run([*PYVGPU, "limits", "set", "--region", str(path), "--memory", "4M"], env=env)
    assert p.returncode == 0, p.stderr
    e = bare(env, tmp_path, PYVGPU_REGION=str(path), CUDA_DEVICE_MEMORY_LIMIT="8M")
    p = run([str(fake / "host_mem_linked"), "boundary", str(4 * MiB)], env=e)
    assert "first=0 one_more=2 free=0 after_free=0" in p.stdout, p.stdout + p.stderr  # the 4 MiB cap holds
    e = bare(env, tmp_path, PYVGPU_REGION=str(path), CUDA_DEVICE_MEMORY_LIMIT="16M")
    p = run([str(fake / "host_mem_linked"), "boundary", str(MiB)], env=e)
    assert "-> 800" in p.stdout, p.stdout + p.stderr
    assert f"group 'g' ({path}) has 4 MiB on device 0, but CUDA_DEVICE_MEMORY_LIMIT asks for 16 MiB" in p.stderr


@pytest.mark.parametrize("content,message", [
    (b"x" * 100, "is 100 bytes, too short to be a pyvgpu region"),
    (b"\0" * L.REGION_SLOTS_OFF, "is not a pyvgpu region (bad magic)"),
])
def test_a_region_that_is_not_one_is_refused_with_the_reason(env, fake, tmp_path, content, message):
    path = tmp_path / "bad.region"
    path.write_bytes(content)
    e = bare(env, tmp_path, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(path), CUDA_DEVICE_MEMORY_LIMIT="4M")
    p = run([str(fake / "host_mem_linked"), "boundary", str(MiB)], env=e)
    assert "-> 800" in p.stdout, p.stdout + p.stderr
    assert f"(CUDA_DEVICE_MEMORY_SHARED_CACHE: region {path} {message}" in p.stderr


def boundary(fake: Path, env: dict[str, str], tmp_path: Path, nbytes: int):
    """host_mem boundary under ``env``: (process, the library its stats name)."""
    for f in tmp_path.glob("stats-*.json"):
        f.unlink()
    p = run([str(fake / "host_mem_linked"), "boundary", str(nbytes)], env=env)
    (s,) = read_stats(tmp_path)
    return p, os.path.realpath(s["callbacks"])


def test_the_shim_takes_the_library_tuned_for_this_cpu(env, fake, tmp_path, tuned_cache):
    d = tmp_path / "cache"
    shutil.copytree(tuned_cache, d)
    (tuned,) = d.glob("callbacks-*.so")
    packaged = os.path.realpath(cache.packaged_path())
    e = bare(env, tmp_path, CUDA_DEVICE_MEMORY_LIMIT="4M")
    p, lib = boundary(fake, e, tmp_path, 4 * MiB)
    assert "first=0 one_more=2" in p.stdout and lib == str(tuned), p.stdout + p.stderr
    # another CPU's (or one another user may write) is not taken; the packaged one is
    other = d / f"callbacks-{cache.cache_key()}-{cpuid.cpu_id() ^ 2:016x}.so"
    tuned.rename(other)
    p, lib = boundary(fake, e, tmp_path, 4 * MiB)
    assert "first=0 one_more=2" in p.stdout and lib == packaged, p.stdout + p.stderr
    shutil.copy(other, tuned)
    tuned.chmod(0o766)
    p, lib = boundary(fake, e, tmp_path, 4 * MiB)
    assert "first=0 one_more=2" in p.stdout and lib == packaged, p.stdout + p.stderr
    assert f"not using {tuned}: another user owns it or can write it" in p.stderr


def test_wrap_collects_dead_private_groups_only(env, fake, tmp_path, monkeypatch):
    """region.gc_private (run by every `pyvgpu wrap`): a group no process holds a slot in, older than a minute,
    goes; one with a live member, or a young one, stays."""
    import subprocess

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    private = region.private_runtime_dir("private")
    live, dead, young = (private / f"{n}.region" for n in ("live", "dead", "young"))
    for p in (live, dead, young):
        region.create(p, region.GroupSpec(p.stem, [64 * MiB] * 16))
    for p in (live, dead):  # created two minutes ago
        r = region.open_region(p)
        r.header.created_ns -= 120 * 10**9
        r.close()
    member = subprocess.Popen([str(fake / "host_mem_linked"), "hold", str(MiB)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(bare(env, tmp_path), PYVGPU_REGION=str(live)))
    try:
        assert member.stdout.readline().startswith("HELD rc=0")
        assert region.gc_private() == 1
        assert live.exists() and young.exists() and not dead.exists()
    finally:
        member.communicate("", timeout=60)
    assert region.gc_private() == 1 and not live.exists()  # its member is gone now


@pytest.mark.parametrize("var,value,message", [
    ("CUDA_DEVICE_MEMORY_LIMIT", "4GB", "CUDA_DEVICE_MEMORY_LIMIT: '4GB' is ambiguous (Kubernetes reads GB as powers "
     "of 10, HAMi and nvidia-smi as powers of 2); write 4G or 4Gi for binary units, as pyvgpu reads them, or "
     "4000000000 (bytes) for decimal ones"),
    ("CUDA_DEVICE_SM_LIMIT", "3０", "CUDA_DEVICE_SM_LIMIT: '3０' has the character '０' ("),
    ("PYVGPU_SM_TURN", " yes ", "PYVGPU_SM_TURN='yes': give 1 (groups with a share take turns on a GPU, the "
     "default) or 0 (they time-slice it)"),
])
def test_the_shim_and_wrap_refuse_a_variable_in_one_message(env, fake, tmp_path, var, value, message):
    """One reader (shim/src/pv_env.c): a program started by a device plugin and `pyvgpu wrap` refuse a bad
    variable with the same sentence (the shim names a character's code point, wrap its Unicode name too)."""
    e = bare(env, tmp_path, **{var: value, "CUDA_DEVICE_MEMORY_LIMIT_1": "4M"})
    p = run([str(fake / "host_mem_linked"), "boundary", str(MiB)], env=e)
    assert "-> 800" in p.stdout, p.stdout + p.stderr  # refused at cuInit: fail closed
    assert message in p.stderr, p.stderr
    w = run([*PYVGPU, "wrap", "--", "true"], env=dict(env, **{var: value}))
    assert w.returncode == 2 and message in w.stderr, w.stderr
