"""Multi-tenant safety (issue 14, docs/security.md): another user cannot stall, crash or bend a vGPU.

Each attack of the issue is played here on the fake driver. The victim runs as this user (root in CI);
the other tenant is a child process that drops to uid/gid 65534 (nobody) with setuid, as root can.
Without root these tests skip, saying so. Attackers work in a sticky, world-writable directory of the
test's own (like /tmp), never in the machine's real /tmp or /dev/shm paths.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest
from helpers import PYVGPU, fake_gpu_turn_key, run

from pyvgpu.contract import layout
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.group import turnfile as sched
from pyvgpu.native import cache, safefile
from pyvgpu.native.shim import BENCH_BIN, shim_path

NOBODY = 65534
HOSTS = Path(__file__).resolve().parent / "hosts"
MiB = 1 << 20
ITERS = "2000"  # pv_bench's spin kernel: 200 us of simulated GPU time


def as_other_user(fn, *args, groups: tuple[int, ...] = (), gid: int = NOBODY) -> int:
    """Run fn(*args) in a child that is uid 65534, gid ``gid`` (with the supplementary ``groups``); its exit
    code."""
    if os.geteuid() != 0:
        pytest.skip("needs root to play a second user (a child that setuid()s to 65534)")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(NOBODY)
            fn(*args)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class OtherUserLoop:
    """fn(*args) called every ``period`` s as uid 65534 until stop() (an attacker that keeps at it)."""

    def __init__(self, fn, *args, period: float = 0.2, groups: tuple[int, ...] = ()):
        if os.geteuid() != 0:
            pytest.skip("needs root to play a second user (a child that setuid()s to 65534)")
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.setgroups(list(groups))
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                while True:
                    fn(*args)
                    time.sleep(period)
            except BaseException:
                traceback.print_exc()
            os._exit(1)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


@pytest.fixture
def sticky():
    """A directory like /tmp: every user may create files in it (mode 1777), each only removes their own."""
    d = Path(tempfile.mkdtemp(prefix="pyvgpu-sec-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def wrap(env, *args, timeout=120, **kw):
    return run([*PYVGPU, "wrap", *args], env=env, timeout=timeout, **kw)


# --- the runtime dir ------------------------------------------------------------------------

def test_a_planted_link_at_the_runtime_dir_is_refused_and_nothing_is_written_through_it(env, sticky):
    target = sticky / "target"

    def plant():
        target.mkdir(mode=0o777)
        (sticky / "pyvgpu").symlink_to(target)

    assert as_other_user(plant) == 0
    env["XDG_RUNTIME_DIR"] = str(sticky)
    p = wrap(env, "--group", "g", "--memory", "64M", "--", "true")
    assert p.returncode == 2, p.stderr
    assert "symbolic link" in p.stderr and "XDG_RUNTIME_DIR" in p.stderr and "uid 65534" in p.stderr, p.stderr
    assert list(target.iterdir()) == []  # nothing created through the link


def test_a_foreign_runtime_dir_is_refused_before_anything_is_created_in_it(env, sticky):
    squat = sticky / "pyvgpu"
    assert as_other_user(lambda: squat.mkdir(mode=0o777)) == 0
    env["XDG_RUNTIME_DIR"] = str(sticky)
    p = wrap(env, "--group", "g", "--memory", "64M", "--", "true")
    assert p.returncode == 2, p.stderr  # not "cannot run 'true'", exit 126
    assert "belongs to uid 65534" in p.stderr and "cannot run" not in p.stderr, p.stderr
    assert list(squat.iterdir()) == []


def test_the_runtime_dir_is_0700_under_any_umask_and_works_again(env, tmp_path):
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    for _ in range(2):  # the second run finds the directories the first made
        p = subprocess.run([*PYVGPU, "wrap", "--group", "g", "--memory", "64M", "--", "true"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                           preexec_fn=lambda: os.umask(0o002))
        assert p.returncode == 0, p.stderr
    for d in (tmp_path / "pyvgpu", tmp_path / "pyvgpu" / "groups"):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700, d


def test_an_own_runtime_dir_with_group_or_other_write_is_repaired(env, tmp_path):
    (tmp_path / "pyvgpu").mkdir()
    (tmp_path / "pyvgpu").chmod(0o777)
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    p = wrap(env, "--group", "g", "--memory", "64M", "--", "true")
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.lstat(tmp_path / "pyvgpu").st_mode) == 0o700


# --- regions --------------------------------------------------------------------------------

def _make_region(path: Path, limit: int, mode: int) -> None:
    region.create(path, region.GroupSpec("theirs", [limit] * layout.MAX_DEVICES), mode=mode)


@pytest.mark.parametrize("how", ["other user, 0666", "other user, 0644"])
def test_joining_another_users_region_is_refused_unless_opted_in(env, sticky, how):
    path = sticky / "theirs.region"
    assert as_other_user(_make_region, path, 1 << 30, 0o666 if "0666" in how else 0o644) == 0
    p = wrap(env, "--region", str(path), "--", "true")
    assert p.returncode == 2, p.stderr
    assert "belongs to uid 65534" in p.stderr and "PYVGPU_TRUST_SHARED=1" in p.stderr, p.stderr
    if "0666" in how:  # the documented opt-in (a node agent's files): joined
        p = wrap(dict(env, PYVGPU_TRUST_SHARED="1"), "--region", str(path), "--", "true")
        assert p.returncode == 0, p.stderr


def test_an_own_region_writable_by_others_is_refused(env, tmp_path):
    path = tmp_path / "mine.region"
    _make_region(path, 1 << 30, 0o666)
    p = wrap(env, "--region", str(path), "--", "true")
    assert p.returncode == 2 and "writable by every user" in p.stderr, p.stderr
    path.chmod(0o660)
    p = wrap(env, "--region", str(path), "--", "true")
    assert p.returncode == 2 and "writable by its group" in p.stderr, p.stderr
    path.chmod(0o600)
    assert wrap(env, "--region", str(path), "--", "true").returncode == 0


def test_a_cap_above_the_devices_memory_in_a_region_is_refused(env, sticky):
    """The owner raised the cap to 4 EiB (the issue's joiner then allocated 8 GiB under a 1 GiB cap)."""
    path = sticky / "theirs.region"
    assert as_other_user(_make_region, path, 4 << 60, 0o666) == 0
    p = wrap(dict(env, PYVGPU_TRUST_SHARED="1"), "--region", str(path), "--", "true")
    assert p.returncode == 2 and "4194304 TiB" in p.stderr and "16 GiB" in p.stderr and "altered" in p.stderr, p.stderr


def test_region_that_is_a_directory_has_its_own_message(env, tmp_path):
    p = wrap(env, "--region", str(tmp_path), "--", "true")
    assert p.returncode == 2, p.stderr
    assert "is a directory" in p.stderr and "NAME.region" in p.stderr and "cannot run" not in p.stderr, p.stderr


def test_a_region_is_size_checked_right_before_mapping(tmp_path):
    path = tmp_path / "g.region"
    _make_region(path, 1 << 30, 0o600)
    r = region.open_region(path)
    os.truncate(path, 4096)
    with pytest.raises(PyvgpuError, match="truncated"):
        region.map_forever(r.fd, r.header.size)
    r.close()


TRUNCATE_HOST = """
import ctypes, sys
c = ctypes.CDLL("libcuda.so.1")
assert c.cuInit(0) == 0
d, ctx, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert c.cuDeviceGet(ctypes.byref(d), 0) == 0
assert c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0 and c.cuCtxSetCurrent(ctx) == 0
assert c.cuMemAlloc_v2(ctypes.byref(p), 1 << 20) == 0
print("ready", flush=True)
sys.stdin.readline()  # the region is truncated now
print("after", c.cuMemAlloc_v2(ctypes.byref(p), 1 << 20), flush=True)
"""


@pytest.mark.parametrize("first", ["the program", "the watcher thread"])
def test_a_region_truncated_under_a_running_member_fails_closed_without_sigbus(env, sticky, first):
    """Whichever thread touches the truncated mapping first: the program's call, or the shim's watcher
    (it reads the region ten times a second, with the program's signals blocked)."""
    path = sticky / "theirs.region"
    assert as_other_user(_make_region, path, 1 << 30, 0o666) == 0
    p = subprocess.Popen([*PYVGPU, "wrap", "--region", str(path), "--", sys.executable, "-c", TRUNCATE_HOST],
                         env=dict(env, PYVGPU_TRUST_SHARED="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=str(sticky))
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        assert as_other_user(os.truncate, path, 0) == 0
        if first == "the watcher thread":
            time.sleep(1.5)  # it reclaims every 0.5 s (either order must pass: this only makes one likelier)
        out, err = p.communicate("go\n", timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, (p.returncode, err)  # not -7 / 135: a Bus error
    rc = int(out.split()[-1])
    assert rc != 0, out  # refused: the cap can no longer be enforced
    assert "region file was truncated" in err and "refused" in err, err


# --- files pyvgpu writes --------------------------------------------------------------------

def test_stats_file_does_not_follow_a_planted_link(env, fake, sticky):
    """In a world-writable directory without the sticky bit, where the kernel's protected_symlinks does
    not apply (in a sticky one it refuses root the link already)."""
    shared = sticky / "open"
    shared.mkdir()
    shared.chmod(0o777)
    secret = sticky / "root-only"
    secret.write_text("secret\n")
    secret.chmod(0o600)
    link = shared / "stats.json"
    assert as_other_user(lambda: link.symlink_to(secret)) == 0
    p = wrap(env, "--stats-file", str(link), "--", str(fake / "host_linked"))
    assert p.returncode == 0, p.stderr
    assert secret.read_text() == "secret\n"
    assert "symbolic link" in p.stderr and str(link) in p.stderr, p.stderr


def test_stats_file_at_a_fifo_or_of_another_user_is_not_written(env, fake, sticky):
    fifo = sticky / "fifo"
    os.mkfifo(fifo)
    p = wrap(env, "--stats-file", str(fifo), "--", str(fake / "host_linked"), timeout=60)  # no reader: no hang
    assert p.returncode == 0 and "cannot write stats" in p.stderr, p.stderr
    theirs = sticky / "theirs.json"
    assert as_other_user(lambda: theirs.write_text("")) == 0
    os.chmod(theirs, 0o666)
    p = wrap(env, "--stats-file", str(theirs), "--", str(fake / "host_linked"))
    assert "another user" in p.stderr and theirs.read_text() == "", p.stderr


def _copy_library(to: Path, name: str = "libpyvgpu_callbacks.so") -> Path:
    """A copy of the packaged callback library and its hash file."""
    from pyvgpu.native import cblib

    to.mkdir(parents=True, exist_ok=True)
    lib = to / name
    shutil.copy(cache.packaged_path(), lib)
    shutil.copy(cblib.hash_path(cache.packaged_path()), cblib.hash_path(lib))
    return lib


def test_a_corrupt_callback_library_is_refused_by_both_loaders_with_a_message(env, fake, tmp_path):
    """The loaders check the bytes they load against the hash beside them: a corrupt library never runs."""
    from pyvgpu.native import cblib

    lib = _copy_library(tmp_path / "c")
    data = bytearray(lib.read_bytes())
    for i in range(64, len(data), 97):  # the ELF header survives, the code and tables do not
        data[i] ^= 0x5A
    lib.write_bytes(bytes(data))
    with pytest.raises(cblib.CorruptLibrary, match="does not match the hash"):
        cblib.load(lib)
    p = wrap(dict(env, PYVGPU_CALLBACKS=str(lib)), "--memory", "64M", "--", str(fake / "host_linked"))
    assert p.returncode == 1 and "-> 800" in p.stdout, (p.returncode, p.stdout, p.stderr)  # refused, not a crash
    assert "does not match the hash beside it" in p.stderr, p.stderr


def test_a_callback_cache_other_users_can_write_is_not_loaded(env, fake, sticky, capfd):
    """A library in the cache is code for every wrapped program: one another user owns or can write is left
    alone (with a warning naming it), and the packaged callbacks serve."""
    from pyvgpu.host import cpuid

    d = sticky / "c"
    lib = _copy_library(d, f"callbacks-{cache.cache_key()}-{cpuid.cpu_id():016x}.so")
    os.chown(lib, NOBODY, NOBODY)
    assert cache.read(d)["origin"] == "package"
    assert "belongs to uid 65534" in capfd.readouterr().err
    e = dict(env, LD_PRELOAD=str(shim_path()), PYVGPU_CACHE_DIR=str(d), CUDA_DEVICE_MEMORY_LIMIT="64M")
    p = run([str(fake / "host_linked")], env=e)
    assert p.returncode == 0 and p.stdout.startswith("OK"), (p.stdout, p.stderr)
    assert f"not using {lib}: another user owns it or can write it" in p.stderr, p.stderr
    os.chown(lib, 0, 0)
    os.chown(d, NOBODY, NOBODY)
    assert cache.read(d)["origin"] == "package"
    assert "another user could put code" in capfd.readouterr().err
    os.chown(d, 0, 0)
    d.chmod(0o777)  # our own directory, made under umask 000: repaired, then read
    cache.read(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


# --- honest fail-open -----------------------------------------------------------------------

BROKEN = {"PYVGPU_CALLBACKS": "/nonexistent/libpyvgpu_callbacks.so"}


def test_fail_open_names_what_was_requested(env, fake):
    env.update(BROKEN)
    p = wrap(env, "--on-error", "open", "--memory", "64M", "--", str(fake / "host_linked"))
    assert p.returncode == 0, p.stderr
    assert "NOT enforced" in p.stderr and f"CUDA_DEVICE_MEMORY_LIMIT={64 * MiB}" in p.stderr, p.stderr
    assert "PYVGPU_REGION=" in p.stderr and "no limits" not in p.stderr, p.stderr


def test_a_group_counts_as_requested_limits_when_the_program_dropped_the_variables(env, fake):
    env.update(BROKEN)
    p = wrap(env, "--memory", "64M", "--", "env", "-u", "CUDA_DEVICE_MEMORY_LIMIT", str(fake / "host_linked"))
    assert p.returncode == 1 and "-> 800" in p.stdout, (p.stdout, p.stderr)  # refused: the cap lives in the file
    assert "PYVGPU_REGION=" in p.stderr and "refused" in p.stderr, p.stderr


def test_a_region_variable_naming_a_fifo_fails_closed_without_hanging(env, fake, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env.update(BROKEN, LD_PRELOAD=str(shim_path()), PYVGPU_REGION=str(fifo))
    p = run([str(fake / "host_linked")], env=env, timeout=60)
    assert "-> 800" in p.stdout and f"PYVGPU_REGION={fifo}" in p.stderr, (p.stdout, p.stderr)


# --- the virtual view -----------------------------------------------------------------------

CAP = 64 * MiB
USED = 16 * MiB


def _views(env, *wrap_opts):
    cmd = [sys.executable, str(HOSTS / "mem_view.py"), str(USED)]
    p = wrap(env, *wrap_opts, "--", *cmd) if wrap_opts else run(cmd, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("one_null", ["1", "0"])
def test_every_memory_query_shows_at_most_the_cap(env, one_null):
    """cuMemGetInfo (both ABIs) with every pointer combination, cuDeviceTotalMem (both), NVML v1/v2: a
    group sees its cap as the total and its headroom as free, whatever the driver does with NULL."""
    env["FAKECUDA_MEMINFO_ONE_NULL"] = one_null
    raw = _views(env)
    if one_null == "1":  # the fake answers through one NULL pointer, as driver 580 does: the physical total
        assert raw["cuMemGetInfo_v2(NULL,total)"] == [0, None, 16 << 30]
    v = _views(env, "--memory", "64M")
    for name, (rc, *values) in v.items():
        assert rc == raw[name][0], (name, rc, raw[name])  # the driver's answer, unchanged
        if rc == 0:
            assert all(x is None or x <= CAP for x in values), (name, values)
    for name in ("cuMemGetInfo_v2", "cuMemGetInfo"):
        assert v[f"{name}(free,total)"] == [0, CAP - USED, CAP]
        assert v[f"{name}(NULL,NULL)"][0] != 0
        if one_null == "1":
            assert v[f"{name}(NULL,total)"] == [0, None, CAP]
            assert v[f"{name}(free,NULL)"] == [0, CAP - USED, None]
        else:
            assert v[f"{name}(NULL,total)"][0] != 0 and v[f"{name}(free,NULL)"][0] != 0
    assert v["cuDeviceTotalMem_v2"] == [0, CAP] and v["cuDeviceTotalMem"] == [0, CAP]
    assert v["nvmlDeviceGetMemoryInfo"] == [0, CAP, CAP - USED, USED]
    assert v["nvmlDeviceGetMemoryInfo_v2"] == [0, CAP, CAP - USED, USED]
    assert v["nvmlDeviceGetMemoryInfo(NULL)"][0] != 0


# --- the turn file --------------------------------------------------------------------------

def _turn_env(env, tmp: Path, turns: Path, **extra) -> dict:
    return dict(env, FAKECUDA_SIM=str(tmp / "gpu.sim"), PYVGPU_SCHED=str(turns), **extra)


def _bench(env, tmp: Path, seconds: float, *wrap_opts: str) -> subprocess.Popen:
    return subprocess.Popen([*PYVGPU, "wrap", "--sm", "50", "--region", str(tmp / "victim.region"), *wrap_opts,
                             "--", str(BENCH_BIN), "sm", str(seconds), ITERS, "kernel"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp))


def _kernels(out: str) -> int:
    return json.loads(out.strip().splitlines()[-1])["kernels"]


def _events(path: Path) -> list[str]:
    r = region.open_region(path, writable=False)
    r.close()
    return [e["kind"] for e in r.events()]


def _nogroup() -> tuple[str, int]:
    import grp

    g = grp.getgrgid(NOBODY) if NOBODY in [g.gr_gid for g in grp.getgrall()] else None
    if g is None:
        pytest.skip("no group with gid 65534 to stand for the pyvgpu group")
    return g.gr_name, g.gr_gid


def test_setup_makes_a_turn_file_only_its_group_can_touch(sticky):
    if os.geteuid() != 0:
        pytest.skip("`pyvgpu setup` runs as root")
    name, gid = _nogroup()
    p = sticky / "turns"
    # another user got there first (the issue: every other user was then told "permission denied")
    assert as_other_user(lambda: (p.write_bytes(b"x" * layout.SCHED_SIZE), p.chmod(0o644))) == 0
    problem = sched.machine_problem(p)
    assert problem and "belongs to uid 65534" in problem
    assert "replaced" in sched.setup(name, p)
    st = os.lstat(p)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o660)
    assert "kept" in sched.setup(name, p)  # running programs keep their mapping
    assert sched.machine_problem(p) is None

    def member():
        assert sched.machine_problem(p) is None
        os.close(sched.open_fd(p))

    def outsider():
        assert "not one" in sched.machine_problem(p)
        try:
            os.open(p, os.O_RDWR)
        except PermissionError:
            return
        raise AssertionError("an outsider opened the turn file")

    assert as_other_user(member, groups=(gid,)) == 0
    assert as_other_user(outsider, gid=NOBODY - 1) == 0  # in no group of the file


def test_an_untrusted_machine_turn_file_is_left_for_ones_own_with_a_fix(env, sticky, tmp_path, monkeypatch):
    machine = sticky / "pyvgpu-turns-v1"
    assert as_other_user(lambda: (machine.write_bytes(b"x"), machine.chmod(0o644))) == 0
    monkeypatch.setattr(sched, "SHM_PATH", machine)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    got, note = sched.choose({})
    assert got == str(tmp_path / "pyvgpu" / "turns")
    assert "belongs to uid 65534" in note and "pyvgpu setup" in note and "remove" not in note
    os.close(sched.open_fd(got))
    assert stat.S_IMODE(os.lstat(got).st_mode) == 0o600
    os.unlink(machine)
    machine.write_bytes(b"x")
    machine.chmod(0o666)  # the old default: every user could stall every other
    assert "writable by every user" in sched.choose({})[1]


@pytest.mark.parametrize("kind", ["link", "fifo", "other user's"])
def test_a_turn_file_that_is_not_a_file_of_ours_is_refused_without_waiting(env, sticky, kind):
    p = sticky / "turns"
    if kind == "link":
        p.symlink_to(sticky / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        assert as_other_user(lambda: os.close(sched.open_fd(p))) == 0
    r = wrap(dict(env, PYVGPU_SCHED=str(p)), "--sm", "30", "--", "true", timeout=60)
    assert r.returncode == 2 and str(p) in r.stderr, r.stderr
    assert {"link": "symbolic link", "fifo": "not a regular file", "other user's": "uid 65534"}[kind] in r.stderr


def _word(lease_ns: int) -> int:
    return (0xBAD << 32) | (((time.monotonic_ns() + lease_ns) >> 10) & 0xFFFFFFFF)


def _hold(turns: Path, lease_ns: int = 990_000_000) -> None:
    """An attacker's move: claim the GPU's entry (before the victim's first launch, so the test does not
    race it) and take its turn with a lease just under the longest (1 s); calling again renews it."""
    with open(turns, "r+b") as f:
        f.seek(layout.SCHED_ENTRIES_OFF + layout.SCHED_ENTRY.offset("key"))
        f.write(struct.pack("<Q", fake_gpu_turn_key()))
        f.seek(layout.SCHED_ENTRIES_OFF + layout.SCHED_ENTRY.offset("turn"))
        f.write(struct.pack("<Q", _word(lease_ns)))


def _setup_turns(sticky: Path) -> tuple[Path, int]:
    if os.geteuid() != 0:
        pytest.skip("`pyvgpu setup` runs as root")
    name, gid = _nogroup()
    turns = sticky / "turns"
    sched.setup(name, turns)
    return turns, gid


def test_a_member_holding_the_turn_stalls_others_for_a_bounded_time(env, sticky):
    """The issue: a holder renewing a 900 ms lease every 200 ms gave the victim 0 kernels in 20 s."""
    turns, gid = _setup_turns(sticky)
    e = _turn_env(env, sticky, turns)
    attacker = OtherUserLoop(_hold, turns, groups=(gid,), period=0.1)
    try:
        deadline = time.monotonic() + 60
        while sched.entries(turns) == [] and time.monotonic() < deadline:  # it holds the turn now
            time.sleep(0.05)
        victim = _bench(e, sticky, 3)
        try:
            out, err = victim.communicate(timeout=120)
        finally:
            victim.kill()
    finally:
        attacker.stop()
    assert victim.returncode == 0, err
    assert _kernels(out) > 0
    assert "turn_timeout" in _events(sticky / "victim.region")
    (gpu,) = sched.entries(turns)
    assert gpu["wait_ns"] >= 5e9  # it waited for the bound (turn.MAX_WAIT_NS), then went on


def test_a_lease_far_in_the_future_is_ignored(env, tmp_path):
    turns = tmp_path / "turns"
    os.close(sched.open_fd(turns))
    _hold(turns, 600 * 10**9)  # held by nobody that exists, until 10 minutes from now
    e = _turn_env(env, tmp_path, turns)
    victim = _bench(e, tmp_path, 1.5)
    out, err = victim.communicate(timeout=120)
    assert victim.returncode == 0, err
    (gpu,) = sched.entries(turns)
    assert gpu["handovers"] >= 1 and gpu["wait_ns"] < 1e9, gpu  # taken at once: a lease reaches 1 s at most
    assert "turn_timeout" not in _events(tmp_path / "victim.region")


def test_a_turn_file_truncated_under_a_running_program_costs_it_only_its_turns(env, sticky):
    turns, gid = _setup_turns(sticky)
    e = _turn_env(env, sticky, turns)
    victim = _bench(e, sticky, 5)
    try:
        assert victim.stdout.readline().startswith("P "), victim.stderr.read()  # the file is mapped by now
        assert as_other_user(os.truncate, turns, 0, groups=(gid,)) == 0
        out, err = victim.communicate(timeout=120)
    finally:
        victim.kill()
    assert victim.returncode == 0, (victim.returncode, err)  # the issue: SIGBUS, exit 135
    assert "turn file was truncated" in err and err.count("pyvgpu:") == 1, err
    assert _kernels(out) > 0


def test_a_full_turn_table_is_an_event_and_a_doctor_warning(env, tmp_path):
    turns = tmp_path / "turns"
    os.close(sched.open_fd(turns))
    with open(turns, "r+b") as f:  # 64 other GPUs (or someone filling the table)
        for i in range(layout.SCHED_ENTRIES):
            f.seek(layout.SCHED_ENTRIES_OFF + i * layout.SCHED_ENTRY.size + layout.SCHED_ENTRY.offset("key"))
            f.write(struct.pack("<Q", (i << 8) | 1))
    e = _turn_env(env, tmp_path, turns)
    victim = _bench(e, tmp_path, 0.5)
    out, err = victim.communicate(timeout=120)
    assert victim.returncode == 0 and _kernels(out) > 0, err
    assert "turns_full" in _events(tmp_path / "victim.region")
    p = run([*PYVGPU, "doctor", "--json"], env=e)
    (check,) = [c for c in json.loads(p.stdout) if c["name"] == "turn file"]
    assert not check["ok"] and "all 64 entries" in check["detail"], check


def test_the_trust_opt_in_is_checked(monkeypatch):
    assert safefile.trust_shared({"PYVGPU_TRUST_SHARED": "1"})
    assert not safefile.trust_shared({})
    with pytest.raises(PyvgpuError, match="PYVGPU_TRUST_SHARED='yes'"):
        safefile.trust_shared({"PYVGPU_TRUST_SHARED": "yes"})


def _shim_verify():
    import ctypes

    from pyvgpu.native import shim

    lib = shim.open_shim()
    lib.pyvgpu_sha256_hex.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p]
    lib.pyvgpu_verify_object.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64]
    return lib


def test_the_shims_object_check_for_a_c_loader(tmp_path):
    """pyvgpu_verify_object (shim/src/pv_verify.c) applies the loader's rules in C: SHA-256 of the bytes it
    returns, a regular file of this user or root that nobody else can write, no link."""
    import ctypes
    import hashlib

    from pyvgpu.native import cblib

    lib = _shim_verify()
    out = ctypes.create_string_buffer(65)
    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100_003):
        data = bytes((i * 7 + n) & 0xFF for i in range(n))
        assert lib.pyvgpu_sha256_hex(data, n, out) == 0
        assert out.value.decode() == hashlib.sha256(data).hexdigest(), n
    path = _copy_library(tmp_path / "c")
    digest = cblib.hash_path(path).read_text().strip().encode()
    obj = str(path).encode()
    buf, n, err = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.create_string_buffer(512)
    assert lib.pyvgpu_verify_object(obj, digest, buf, n, err, 512) == 0, err.value
    assert ctypes.string_at(buf, n.value) == path.read_bytes()
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(buf)
    assert lib.pyvgpu_verify_object(obj, b"0" * 64, buf, n, err, 512) == -1
    assert b"does not match the hash" in err.value and not buf.value
    link = tmp_path / "link.so"
    link.symlink_to(path)
    assert lib.pyvgpu_verify_object(str(link).encode(), digest, buf, n, err, 512) == -1
    assert b"symbolic link" in err.value
    os.chmod(path, 0o666)
    assert lib.pyvgpu_verify_object(obj, digest, buf, n, err, 512) == -1
    assert b"can write it" in err.value


FOREIGN_SIGBUS = """
import ctypes, mmap, os, tempfile
c = ctypes.CDLL("libcuda.so.1")
assert c.cuInit(0) == 0  # the shim is booted and its guard installed (the group's region is mapped)
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd, path = tempfile.mkstemp()
os.ftruncate(fd, 4096)
addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
os.ftruncate(fd, 0)
os.unlink(path)
print("read", ctypes.string_at(addr, 1), flush=True)
"""


def test_a_sigbus_outside_pyvgpus_mappings_is_left_to_the_program(env, tmp_path):
    """The guard replaces only pyvgpu's own mappings: the program's own SIGBUS kills it as before."""
    p = wrap(env, "--memory", "64M", "--", sys.executable, "-c", FOREIGN_SIGBUS)
    assert p.returncode == -signal.SIGBUS and "read" not in p.stdout, (p.returncode, p.stdout, p.stderr)
