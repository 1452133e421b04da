"""The group core's region and turn-file services as pyvgpu's commands reach them (pyvgpu/native/grouplib.py):
the view of a region (mapped, or a snapshot), the checks of what a process asks against its group, a live
change's checks and writes, the members' locks, and the turn file opened, read and refused. Each is done in C
(shim/src/pv_group_*.c); these tests hold the C to the behaviour pyvgpu/group/ promises.
"""

from __future__ import annotations

import fcntl
import gc
import os
import stat
import struct
import time
from pathlib import Path

import pytest

from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.group import turnfile as sched
from pyvgpu.host.devices import Gpu
from pyvgpu.native import groupfiles, grouplib, safefile

MiB = 1 << 20
GIB = 1 << 30
A = Gpu(0, "GPU-00000000-0000-0000-0000-00000000000a", "A", 16 * GIB)
B = Gpu(1, "GPU-00000000-0000-0000-0000-00000000000b", "B", 16 * GIB)
MIG_A = Gpu(0, "MIG-00000000-0000-0000-0000-0000000000a1", "A 1g", 4 * GIB, parent=A.uuid, gi=1, ci=0)


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


def test_a_writable_view_is_the_file_and_a_read_only_one_a_snapshot(tmp_path):
    p = tmp_path / "v.region"
    region.create(p, region.GroupSpec("v", [64 * MiB] * 16))
    rw, ro = region.open_region(p), region.open_region(p, writable=False)
    assert rw.writable and not ro.writable
    rw.device(0).limit = 128 * MiB
    assert region.open_region(p, writable=False).device(0).limit == 128 * MiB  # the file changed
    assert ro.device(0).limit == 64 * MiB  # the snapshot did not
    ro.device(1).limit = 1  # a snapshot is this process's own memory
    assert region.open_region(p, writable=False).device(1).limit == 64 * MiB
    assert _mapped(p) and ro.name == "v"
    rw.close()
    ro.close()


def test_a_view_is_unmapped_once_nothing_uses_its_memory(tmp_path):
    p = tmp_path / "u.region"
    region.create(p, region.GroupSpec("u", [64 * MiB] * 16))
    r = region.open_region(p)
    dev = r.device(0)  # a field object keeps the mapping alive after the region is gone
    r.close()
    del r
    gc.collect()
    assert _mapped(p) and dev.limit == 64 * MiB
    del dev
    gc.collect()
    assert not _mapped(p)  # the exporter and status open regions forever: no mapping may stay behind


def test_a_member_is_known_by_the_lock_on_its_slot(tmp_path):
    p = tmp_path / "m.region"
    region.create(p, region.GroupSpec("m", [64 * MiB] * 16))
    r = region.open_region(p, writable=False)
    assert not region.has_live_member(r) and not region.slot_alive(r, 3)
    fd = os.open(p, os.O_RDWR)  # another open file description: a member's lock (F_OFD_SETLK, one byte)
    try:
        lk = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, L.REGION_SLOTS_OFF + 3 * L.REGION_SLOT.size, 1, 0)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lk)
        assert region.has_live_member(r) and region.slot_alive(r, 3) and not region.slot_alive(r, 2)
    finally:
        os.close(fd)
    assert not region.has_live_member(r)
    r.close()


def test_a_region_from_the_future_is_young_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    private = region.private_runtime_dir("private")
    future, old = private / "future.region", private / "old.region"
    for p, shift in ((future, 3600 * 10**9), (old, -120 * 10**9)):
        region.create(p, region.GroupSpec(p.stem, [64 * MiB] * 16))
        r = region.open_region(p)
        r.header.created_ns = time.time_ns() + shift
        r.close()
    (private / "notes.txt").write_text("not a region")
    assert region.gc_private() == 1
    assert future.exists() and not old.exists() and (private / "notes.txt").exists()


def test_the_devices_a_process_asks_for_are_checked_against_its_groups(tmp_path):
    p = tmp_path / "d.region"
    region.create(p, region.GroupSpec("d", [0] * 16, visible=[B]))
    r = region.open_region(p)
    region.check_devices(r, [B], "--devices 1")
    region.check_devices(r, [], "--devices")  # none asked: the group's
    with pytest.raises(PyvgpuError, match=r"^group 'd' \(.*d\.region\) uses devices 1, but --devices 0,1 asks for "
                                          r"0,1; use the group's devices, or start a group of your own$"):
        region.check_devices(r, [A, B], "--devices 0,1")
    r.close()
    region.create(tmp_path / "m.region", region.GroupSpec("m", [0] * 16, visible=[MIG_A]))
    m = region.open_region(tmp_path / "m.region")
    assert m.visible() == [(0, MIG_A.uuid)]
    region.check_devices(m, [MIG_A], "--devices MIG")
    with pytest.raises(PyvgpuError, match="uses devices 0, but --devices 0 asks for 0"):  # the GPU, not its MIG
        region.check_devices(m, [A], "--devices 0")
    region.create(tmp_path / "all.region", region.GroupSpec("all", [0] * 16))
    with pytest.raises(PyvgpuError, match=r"uses every device CUDA sees \(no --devices\), but --devices 1 asks"):
        region.check_devices(region.open_region(tmp_path / "all.region"), [B], "--devices 1")


def test_settings_and_caps_read_from_a_region_are_checked(tmp_path):
    p = tmp_path / "s.region"
    region.create(p, region.GroupSpec("s", [0] * 16, priority=0, sm_borrow=True))
    r = region.open_region(p)
    region.check_setting(r, "priority", 0, "--priority")
    region.check_setting(r, "priority", None, "--priority")
    with pytest.raises(PyvgpuError, match=r"has priority high, but CUDA_TASK_PRIORITY asks for low; change the "
                                          r"group's with `pyvgpu limits set`"):
        region.check_setting(r, "priority", 1, "CUDA_TASK_PRIORITY")
    with pytest.raises(PyvgpuError, match="has sm-borrow on, but --sm-cap asks for off"):
        region.check_setting(r, "sm_borrow", 0, "--sm-cap")
    r.header.priority = 7  # written by hand: named, not indexed out of a table
    with pytest.raises(PyvgpuError, match=r"has priority 7 \(not a value pyvgpu writes\)"):
        region.check_setting(r, "priority", 0, "--priority")
    r.device(2).limit = 32 * GIB
    region.check_bounds(r, [16 * GIB, 16 * GIB])  # device 2's memory is not known
    region.check_bounds(r, [16 * GIB, 16 * GIB, 0])  # nor here (0: NVML could not tell)
    r.device(3).limit = 1 << 62
    with pytest.raises(PyvgpuError, match=r"holds a cap of 32 GiB on device 2, more than the device's 16 GiB: pyvgpu "
                                          r"never writes such a cap, so the file was altered"):
        region.check_bounds(r, [16 * GIB] * 4)
    r.close()


def test_a_live_change_is_checked_then_written_with_the_share_count(tmp_path):
    p = tmp_path / "l.region"
    region.create(p, region.GroupSpec("l", [64 * MiB] * 16))
    r = region.open_region(p)
    with pytest.raises(PyvgpuError, match=r"^--memory 5=1G: group 'l' has no device 5 \(2 devices\)$"):
        groupfiles.check_change(r.path, r.address, False, (None, {5: GIB}), 2, None, "--memory 5=1G")
    with pytest.raises(PyvgpuError, match=r"^--memory 32G: 32 GiB is more than device 1's 16 GiB; give a limit at "
                                          r"most the device's memory$"):
        groupfiles.check_change(r.path, r.address, False, (32 * GIB, {0: GIB}), 2, [16 * GIB] * 2, "--memory 32G")
    groupfiles.check_change(r.path, r.address, False, (32 * GIB, {}), 2, None, "--memory 32G")  # memory unknown
    groupfiles.check_change(r.path, r.address, True, (30, {1: 50}), 2, None, "--sm 30")
    r.header.mode = L.MODE_MPS
    with pytest.raises(PyvgpuError, match=r"^--sm 30: group 'l' runs in mode mps, where the share is MPS's"):
        groupfiles.check_change(r.path, r.address, True, (30, {}), 2, None, "--sm 30")
    r.header.mode = L.MODE_HAMI_CORE
    assert r.header.sm_any == 0
    assert region.change_per_device(r, "sm_limit", 30, 1)[:3] == [0, 30, 0] and r.header.sm_any == 1
    assert region.change_per_device(r, "sm_limit", 100, None)[:2] == [100, 100] and r.header.sm_any == 0
    assert region.change_per_device(r, "limit", 0, 0)[:2] == [0, 64 * MiB]
    with pytest.raises(PyvgpuError, match=r"^device 16 is not a device index 0\.\.15$"):
        region.change_per_device(r, "limit", GIB, 16)
    with pytest.raises(PyvgpuError, match="a compute share of 101% is not 0..100"):
        region.change_per_device(r, "sm_limit", 101, 0)
    assert region.change_setting(r, "priority", 0) == 0 and r.header.priority == 0
    with pytest.raises(PyvgpuError, match="cannot be 2"):
        region.change_setting(r, "sm_borrow", 2)
    kinds = [e["kind"] for e in r.events()]
    # one event for device 1, then one per device (they differed before): 1 + 16
    assert kinds.count(L.EVENT_KINDS[L.EV_SM_LIMIT]) == 17 and L.EVENT_KINDS[L.EV_PRIORITY] in kinds
    r.close()


def test_the_turn_file_is_made_read_and_a_link_refused(tmp_path):
    own = tmp_path / "t" / "turns"
    assert sched.entries(own) == [] and stat.S_IMODE(own.stat().st_mode) == 0o600  # made whole, this user's
    (tmp_path / "elsewhere").write_bytes(b"\0" * L.SCHED_SIZE)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(safefile.UntrustedFile, match="is a symbolic link"):
        sched.entries(link)
    machine = tmp_path / "machine"
    with pytest.raises(PyvgpuError, match="ask root to run `pyvgpu setup`"):
        groupfiles.use_turns(machine, machine, trust=False)  # the machine's is made by `pyvgpu setup` only
    assert not machine.exists()
    own.write_bytes(b"\0" * 64)
    with pytest.raises(PyvgpuError, match=r"is not a pyvgpu turn file \(bad magic\); remove .* or set PYVGPU_SCHED"):
        sched.entries(own)


def test_a_region_is_made_for_the_uid_a_container_runs_as(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a file for another user needs root")
    p = tmp_path / "c.region"
    assert region.create(p, region.GroupSpec("c", [64 * MiB] * 16), mode=0o600, owner=(1234, 5678))
    st = os.lstat(p)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, 0o600)
    r = region.open_region(p, writable=False)  # the header agrees with the file's owner: not "replaced"
    assert r.header.owner_uid == 1234
    assert not [q for q in tmp_path.iterdir() if q != p]  # no temporary file left behind


@pytest.mark.parametrize("text,hours", [("", 12.0), (" 12 ", 12.0), ("0.5", 0.5), (".5", 0.5), ("+3", 3.0),
                                        ("0", 0.0), ("0.00001", 0.00001)])
def test_the_idle_expiry_is_read_by_the_group_core(text, hours):
    from pyvgpu.ops import groups

    assert groups.idle_hours({"PYVGPU_GROUP_IDLE_HOURS": text}) == pytest.approx(hours)


@pytest.mark.parametrize("text", ["soon", "-1", "1000000", ".", "1.2.3", "nan", "1e3", "１２"])
def test_a_bad_idle_expiry_is_refused_by_wrap_not_by_the_shim(text):
    from pyvgpu.ops import groups

    with pytest.raises(PyvgpuError, match=r"^PYVGPU_GROUP_IDLE_HOURS=.* is not a number of hours; give e\.g\. 12, "
                                          r"0\.5, or 0 for never$"):
        groups.idle_hours({"PYVGPU_GROUP_IDLE_HOURS": text})
    assert grouplib.read_env({"PYVGPU_GROUP_IDLE_HOURS": text})["turns"]  # a program's shim does not read it


def test_a_watched_region_is_checked_then_seen_live_and_read_only(tmp_path):
    """region.watch (VPMM's pool): the group's cap as it changes, through a mapping nobody can write."""
    import ctypes

    p = tmp_path / "w.region"
    region.create(p, region.GroupSpec("w", [64 * MiB] * 16))
    addr = region.watch(p)
    cap = ctypes.c_uint64.from_address(addr + L.REGION_DEVICES_OFF + 1 * L.REGION_DEVICE.size
                                       + L.REGION_DEVICE.offset("limit"))
    assert cap.value == 64 * MiB
    r = region.open_region(p)
    region.change_per_device(r, "limit", 128 * MiB, 1)
    assert cap.value == 128 * MiB  # shared: a live change is seen
    with open("/proc/self/maps") as f:
        (line,) = [ln for ln in f if ln.rstrip().endswith(str(p)) and ln.split()[0].startswith(f"{addr:x}-")]
    assert line.split()[1].startswith("r--")  # read-only
    (tmp_path / "bad.region").write_bytes(b"\0" * 20000)
    with pytest.raises(PyvgpuError, match="is not a pyvgpu region"):
        region.watch(tmp_path / "bad.region")


def test_a_command_gets_the_group_core_alone_without_the_shim(env, tmp_path):
    """What `wrap`, `status`, `limits set`, the exporter and the node agent do with regions and turn files loads
    libpyvgpu_group.so and never the shim (libpyvgpu.so), whose interposition a command must not have."""
    import subprocess
    import sys

    code = f"""
from pathlib import Path
from pyvgpu.group import live, region, turnfile
from pyvgpu.ops import status
p = Path({str(tmp_path / "c.region")!r})
region.create(p, region.GroupSpec("c", [64 << 20] * 16))
r = region.open_region(p)
region.check_bounds(r, [1 << 34])
region.has_live_member(r)
live.set_limits(p, "128M", "50", "high", "on")
status.collect(region_path=p)
turnfile.entries(Path({str(tmp_path / "turns")!r}))
maps = open("/proc/self/maps").read()
print("libpyvgpu_group.so" in maps, "/libpyvgpu.so" in maps)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=env)  # the fake driver's NVML: a share can be checked
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "False"]
