"""Re-run issue 14's attacks on the fake driver and print the table of docs/security.md.

    sudo python scripts/security_attacks.py [--output JSON]

Needs root: the attacker is a child that drops to uid/gid 65534 (nobody). The victim is this user.
Runs against the pyvgpu it imports (PYTHONPATH=OTHER_TREE measures another checkout the same way, e.g.
main before the fixes). The turn attacks are made as the issue made them, on a turn file the victim's
`pyvgpu wrap` created (PYVGPU_SCHED in a sticky directory, as /dev/shm is); with this tree they are also
made by a member of the turn file's group (`pyvgpu setup`), the one other user who can still open it.
Victim: `pyvgpu wrap --sm 50 -- pv_bench sm` (spin kernels of 200 us simulated GPU time, so 2500/s is
its full share). Figures are kernels/s over the run and over its last 2 s, and exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakecuda"))

import pyvgpu  # noqa: E402
from pyvgpu.contract import layout  # noqa: E402
from pyvgpu.group import region  # noqa: E402
from pyvgpu.group import turnfile as sched  # noqa: E402
from pyvgpu.native import cache  # noqa: E402
from pyvgpu.native.shim import BENCH_BIN  # noqa: E402

NOBODY = 65534
PY = [sys.executable, "-m", "pyvgpu"]
NEW = hasattr(sched, "setup")


def as_nobody(fn, *args, groups=()) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups(list(groups))
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn(*args)
            code = 0
        except PermissionError as e:
            print(f"attacker: {e}", file=sys.stderr)
            code = 13
        except BaseException:
            traceback.print_exc()
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def loop_as_nobody(fn, *args, groups=(), period=0.2) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups(list(groups))
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            while True:
                fn(*args)
                time.sleep(period)
        except BaseException:
            os._exit(13)
    return pid


def hold(turns: Path) -> None:
    lease = ((time.monotonic_ns() + 900_000_000) >> 10) & 0xFFFFFFFF
    with open(turns, "r+b") as f:
        for i in range(layout.SCHED_ENTRIES):
            at = layout.SCHED_ENTRIES_OFF + i * layout.SCHED_ENTRY.size
            f.seek(at + layout.SCHED_ENTRY.offset("key"))
            if struct.unpack("<Q", f.read(8))[0]:
                f.seek(at + layout.SCHED_ENTRY.offset("turn"))
                f.write(struct.pack("<Q", (0xBAD << 32) | lease))


def fill(turns: Path) -> None:
    with open(turns, "r+b") as f:
        for i in range(layout.SCHED_ENTRIES):
            key = layout.SCHED_ENTRIES_OFF + i * layout.SCHED_ENTRY.size + layout.SCHED_ENTRY.offset("key")
            f.seek(key)
            if not struct.unpack("<Q", f.read(8))[0]:
                f.seek(key)
                f.write(struct.pack("<Q", (i << 8) | 1))


def smash_magic(turns: Path) -> None:
    with open(turns, "r+b") as f:
        f.write(b"GARBAGE!")


class Lab:
    def __init__(self, work: Path, fake: Path):
        self.work = work
        self.n = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYVGPU_", "CUDA_DEVICE_", "FAKE"))}
        self.env.update(LD_LIBRARY_PATH=str(fake), PYVGPU_MIN_MEMORY="1M", XDG_RUNTIME_DIR=str(work / "run"),
                        PYTHONPATH=str(Path(pyvgpu.__file__).resolve().parents[1]))
        (work / "run").mkdir()
        self.fake = fake

    def sticky(self) -> Path:
        self.n += 1
        d = self.work / f"s{self.n}"
        d.mkdir()
        d.chmod(0o1777)
        return d

    def victim(self, d: Path, seconds: float, turns: Path, attack=None, at: float = 0.5, **extra) -> dict:
        """pv_bench under --sm 50; attack(d) is called ``at`` s after its first launch; its figures."""
        env = dict(self.env, FAKECUDA_SIM=str(d / "gpu.sim"), PYVGPU_SCHED=str(turns), **extra)
        p = subprocess.Popen([*PY, "wrap", "--sm", "50", "--region", str(d / "victim.region"), "--",
                              str(BENCH_BIN), "sm", str(seconds), "2000", "kernel"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(d))
        lines, undo, t_attack = [], None, None
        try:
            first = p.stdout.readline()
            lines.append(first)
            if attack and first.startswith("P "):
                time.sleep(at)
                t_attack = time.monotonic_ns()  # pv_bench's P lines are CLOCK_MONOTONIC too
                undo = attack(d)
            out, err = p.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += "\n[killed: still running 60 s past its end]"
        finally:
            if callable(undo):
                undo()
        t_end = time.monotonic_ns()
        lines += out.splitlines()
        pts = [(int(a), int(b)) for _, a, b in (x.split() for x in lines if x.startswith("P "))]
        res = {"exit": p.returncode, "stderr": [x for x in err.splitlines() if x.startswith("pyvgpu")][:2]}
        if len(pts) >= 2:
            res["kernels_per_s"] = round(pts[-1][1] / ((pts[-1][0] - pts[0][0]) / 1e9))
            tail = [q for q in pts if q[0] >= pts[-1][0] - 2e9]
            if len(tail) >= 2 and tail[-1][0] > tail[0][0]:
                res["last_2s_per_s"] = round((tail[-1][1] - tail[0][1]) / ((tail[-1][0] - tail[0][0]) / 1e9))
        else:
            res["kernels_per_s"] = 0
        if t_attack is not None and pts:
            base = max([q for q in pts if q[0] < t_attack] or [pts[0]])[1]
            end = pts[-1][0] if pts[-1][0] >= t_attack and "killed" not in err else t_end
            res["after_attack_s"] = round((end - t_attack) / 1e9, 1)
            res["after_attack_per_s"] = round(max(0, pts[-1][1] - base) / ((end - t_attack) / 1e9))
        if "killed" in err:
            res["killed"] = True
            res["kernels_per_s"] = round(pts[-1][1] / ((t_end - pts[0][0]) / 1e9)) if pts else 0
        return res

    def wrap(self, *args, **extra) -> dict:
        p = subprocess.run([*PY, "wrap", *args], env=dict(self.env, **extra), capture_output=True, text=True,
                           timeout=120, cwd=str(self.work))
        return {"exit": p.returncode, "stderr": [x for x in p.stderr.splitlines() if x.startswith("pyvgpu")][:1]}


def turn_attacks(lab: Lab, member: bool) -> dict:
    """The issue's five attacks on the turn file. member: the attacker is in the file's group."""
    out = {}
    groups = ()

    def make(d: Path) -> Path:
        turns = d / "turns"
        if member:
            sched.setup("nogroup", turns)
        return turns

    if member:
        groups = (NOBODY,)
    d = lab.sticky()
    out["baseline"] = lab.victim(d, 4, make(d))

    d = lab.sticky()
    turns = make(d)
    state = {}

    def start_hold(_d):
        state["pid"] = loop_as_nobody(hold, turns, groups=groups)
        time.sleep(0.3)
        return lambda: (os.kill(state["pid"], signal.SIGKILL), os.waitpid(state["pid"], 0))

    out["hold the turn"] = lab.victim(d, 10, turns, start_hold)

    d = lab.sticky()
    turns = make(d)
    rc = {}
    out["truncate the file"] = lab.victim(d, 3, turns, lambda _d: rc.setdefault(
        "attacker_exit", as_nobody(os.truncate, turns, 0, groups=groups)))
    out["truncate the file"].update(rc)

    d = lab.sticky()
    turns = make(d)
    lab.victim(d, 0.3, turns)
    a = as_nobody(smash_magic, turns, groups=groups)
    w = lab.wrap("--sm", "50", "--", "true", PYVGPU_SCHED=str(turns), FAKECUDA_SIM=str(d / "gpu.sim"))
    out["overwrite the magic"] = {"attacker_exit": a, "new_wrap_exit": w["exit"], "stderr": w["stderr"]}

    d = lab.sticky()
    turns = d / "turns"

    def squat():
        turns.write_bytes(b"\0" * layout.SCHED_SIZE)
        turns.chmod(0o644)

    a = as_nobody(squat)
    if NEW:  # the squatted file at the machine path: pyvgpu goes to the user's own turn file, with a warning
        saved = sched.SHM_PATH
        sched.SHM_PATH = turns
        try:
            own, note = sched.choose({"XDG_RUNTIME_DIR": str(lab.work / "run")})
        finally:
            sched.SHM_PATH = saved
        res = lab.victim(d, 4, own)
        res["warning"] = note
        out["pre-create the file"] = res
    else:
        res = lab.victim(d, 4, turns)
        out["pre-create the file"] = res
    out["pre-create the file"]["attacker_exit"] = a

    d = lab.sticky()
    turns = make(d)
    if not member:
        os.close(sched.open_fd(turns))  # made as the victim's `pyvgpu wrap --sm` makes it, before any launch
    a = as_nobody(fill, turns, groups=groups)
    res = lab.victim(d, 4, turns)
    res["attacker_exit"] = a
    res["events"] = [e["kind"] for e in region.open_region(d / "victim.region", writable=False).events()
                     if e["kind"].startswith("turn")]
    out["fill all 64 keys"] = res
    return out


def other_attacks(lab: Lab) -> dict:
    out = {}
    d = lab.sticky()
    target = d / "target"

    def plant():
        target.mkdir(mode=0o777)
        (d / "pyvgpu").symlink_to(target)

    as_nobody(plant)
    r = lab.wrap("--group", "g", "--memory", "64M", "--", "true", XDG_RUNTIME_DIR=str(d))
    r["written_through_link"] = [str(p.relative_to(target)) for p in target.rglob("*")]
    out["runtime dir: planted link"] = r

    d = lab.sticky()
    as_nobody(lambda: (d / "pyvgpu").mkdir(mode=0o777))
    r = lab.wrap("--group", "g", "--memory", "64M", "--", "true", XDG_RUNTIME_DIR=str(d))
    r["created_inside"] = [p.name for p in (d / "pyvgpu").iterdir()]
    out["runtime dir: squatted"] = r

    d = lab.sticky()
    runs = []
    for _ in range(2):
        p = subprocess.run([*PY, "wrap", "--group", "g", "--memory", "64M", "--", "true"],
                           env=dict(lab.env, XDG_RUNTIME_DIR=str(d)), capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: os.umask(0o002), cwd=str(d))
        runs.append(p.returncode)
    out["runtime dir: umask 002, twice"] = {"exits": runs, "mode": f"{os.lstat(d / 'pyvgpu').st_mode & 0o777:04o}"}

    d = lab.sticky()
    path = d / "theirs.region"
    as_nobody(lambda: region.create(path, region.GroupSpec("theirs", [1 << 30] * layout.MAX_DEVICES), mode=0o666))
    out["region: another user's, 0666"] = lab.wrap("--region", str(path), "--", "true")

    d = lab.sticky()
    path = d / "theirs.region"
    as_nobody(lambda: region.create(path, region.GroupSpec("theirs", [4 << 60] * layout.MAX_DEVICES), mode=0o666))
    out["region: cap 4 EiB (with the opt-in)"] = lab.wrap("--region", str(path), "--", "true",
                                                          PYVGPU_TRUST_SHARED="1")

    d = lab.sticky()
    path = d / "theirs.region"
    as_nobody(lambda: region.create(path, region.GroupSpec("theirs", [1 << 30] * layout.MAX_DEVICES), mode=0o666))
    host = ("import ctypes,sys\nc=ctypes.CDLL('libcuda.so.1')\nassert c.cuInit(0)==0\nd,x,p=ctypes.c_int(),"
            "ctypes.c_void_p(),ctypes.c_uint64()\nc.cuDeviceGet(ctypes.byref(d),0)\n"
            "c.cuDevicePrimaryCtxRetain(ctypes.byref(x),d)\nc.cuCtxSetCurrent(x)\n"
            "print(c.cuMemAlloc_v2(ctypes.byref(p),1<<20),flush=True)\nsys.stdin.readline()\n"
            "print(c.cuMemAlloc_v2(ctypes.byref(p),1<<20),flush=True)\n")
    p = subprocess.Popen([*PY, "wrap", "--region", str(path), "--", sys.executable, "-c", host],
                         env=dict(lab.env, PYVGPU_TRUST_SHARED="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=str(d))
    before = p.stdout.readline().strip()
    as_nobody(os.truncate, path, 0)
    o, e = p.communicate("go\n", timeout=60)
    out["region: truncated under a member (with the opt-in)"] = {
        "exit": p.returncode, "alloc_rc_before": before, "alloc_rc_after": o.strip(),
        "stderr": [x for x in e.splitlines() if x.startswith("pyvgpu")][:1]}

    out["--region DIR"] = lab.wrap("--region", str(lab.work), "--", "true")

    d = lab.sticky()
    shared = d / "open"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: the kernel's protected_symlinks does not apply
    secret = d / "root-only"
    secret.write_text("secret\n")
    secret.chmod(0o600)
    as_nobody(lambda: (shared / "stats.json").symlink_to(secret))
    r = lab.wrap("--stats-file", str(shared / "stats.json"), "--", str(lab.fake / "host_linked"))
    r["root-only file grew by"] = len(secret.read_text()) - len("secret\n")
    out["--stats-file through a link"] = r

    d = lab.sticky()
    from pyvgpu.native import cblib

    lib = d / "c" / cblib.FILE_NAME
    lib.parent.mkdir()
    shutil.copy(cache.packaged_path(), lib)
    shutil.copy(cblib.hash_path(cache.packaged_path()), cblib.hash_path(lib))
    data = bytearray(lib.read_bytes())
    for i in range(64, len(data), 97):
        data[i] ^= 0x5A
    lib.write_bytes(bytes(data))
    p = subprocess.run([*PY, "wrap", "--memory", "64M", "--", str(lab.fake / "host_linked")],
                       env=dict(lab.env, PYVGPU_CALLBACKS=str(lib)), capture_output=True, text=True, timeout=120,
                       cwd=str(d))
    out["corrupt callback library, hash file unchanged"] = {
        "exit": p.returncode, "says": (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [""])[-1]}

    view = ("import ctypes\nc=ctypes.CDLL('libcuda.so.1')\nc.cuInit(0)\nd,x=ctypes.c_int(),ctypes.c_void_p()\n"
            "c.cuDeviceGet(ctypes.byref(d),0)\nc.cuDevicePrimaryCtxRetain(ctypes.byref(x),d)\n"
            "c.cuCtxSetCurrent(x)\nt=ctypes.c_size_t(0)\nrc=c.cuMemGetInfo_v2(None,ctypes.byref(t))\n"
            "print(rc,t.value)")
    p = subprocess.run([*PY, "wrap", "--memory", "4G", "--", sys.executable, "-c", view],
                       env=dict(lab.env, FAKECUDA_MEMINFO_ONE_NULL="1"), capture_output=True, text=True, timeout=120,
                       cwd=str(lab.work))
    rc, total = p.stdout.split()
    out["cuMemGetInfo(NULL, &total) under --memory 4G (16 GiB device)"] = {"rc": int(rc), "total": int(total)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", type=Path)
    ap.add_argument("--label", default="", help="what is measured, for the JSON (e.g. main at 5ecb7ee)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the attacker is a child that setuid()s to 65534")
    from build import build

    work = Path(tempfile.mkdtemp(prefix="pyvgpu-attacks-", dir="/tmp"))
    work.chmod(0o755)
    try:
        fake = build(work / "fake")
        lab = Lab(work, fake)
        cache.ensure()
        res = {"pyvgpu": str(Path(pyvgpu.__file__).parent), "label": args.label, "script_commit": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "nproc": os.cpu_count(),
            "turns, attacker outside the group": turn_attacks(lab, member=False)}
        if NEW:
            res["turns, attacker in the turn file's group"] = turn_attacks(lab, member=True)
        res["files"] = other_attacks(lab)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(res, indent=1)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
