"""Operating running groups: live limits, the event log, status, top and the Prometheus exporter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import PYVGPU, run
from prometheus_client.parser import text_string_to_metric_families

from pyvgpu.contract import layout as L
from pyvgpu.group import region

MiB = 1 << 20
HOSTS = Path(__file__).resolve().parent / "hosts"


class Member:
    """tests/hosts/mem_repl.py under `pyvgpu wrap`: allocates and frees on command."""

    def __init__(self, env, *wrap_opts: str):
        self.p = subprocess.Popen([*PYVGPU, "wrap", *wrap_opts, "--", sys.executable, str(HOSTS / "mem_repl.py")],
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd="/")
        line = self.p.stdout.readline()
        assert line.startswith("READY"), line + self.p.stderr.read()

    def __call__(self, cmd: str) -> int:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return int(self.p.stdout.readline())

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(30)


def status(env, reg: Path) -> dict:
    p = run([*PYVGPU, "status", "--region", str(reg), "--json"], env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["groups"][0]


def limits_set(env, *args: str) -> subprocess.CompletedProcess:
    return run([*PYVGPU, "limits", "set", *args], env=env)


# --- live limits ---------------------------------------------------------------------------------

def test_a_full_region_refuses_the_next_process_and_nobody_runs_unaccounted(env, tmp_path):
    """A region with two slots and two live members: a third process of the group gets its GPU calls refused
    with a message saying why (the claim's -1 must reach the shim as -1), and never allocates outside the
    group's accounting."""
    reg = tmp_path / "small.region"
    region.create(reg, region.GroupSpec("small", [64 * MiB] * L.MAX_DEVICES), n_slots=2)
    a = Member(env, "--region", str(reg))
    b = Member(env, "--region", str(reg))
    try:
        assert a(f"alloc {MiB}") == 0 and b(f"alloc {MiB}") == 0
        p = run([*PYVGPU, "wrap", "--region", str(reg), "--", sys.executable, str(HOSTS / "mem_repl.py")],
                env=env, input=f"alloc {MiB}\nquit\n")
        assert p.returncode == 1 and "READY" not in p.stdout, (p.returncode, p.stdout, p.stderr)
        assert "no free slot" in p.stderr and "refused" in p.stderr, p.stderr
        r = region.open_region(reg, writable=False)
        try:
            assert r.device(0).used == 2 * MiB  # the members' bytes only
            assert sorted(r.slot(i).pid for i in range(2)) == sorted([a.p.pid, b.p.pid])
        finally:
            r.close()
        assert a("free") == 0  # the members go on as before
    finally:
        a.stop()
        b.stop()


def test_memory_limit_lowered_below_usage_refuses_until_freed_and_never_kills(env, tmp_path):
    reg = tmp_path / "g.region"
    m = Member(env, "--memory", "64M", "--region", str(reg))
    try:
        assert m(f"alloc {40 * MiB}") == 0
        p = limits_set(env, "--region", str(reg), "--memory", "32M")
        assert p.returncode == 0, p.stderr
        assert "memory cap: 32 MiB" in p.stdout
        assert "the group holds 40 MiB, above the new 32 MiB" in p.stdout and "frees 8 MiB" in p.stdout
        assert m(f"alloc {MiB}") == 2  # over the new cap: refused
        assert m.p.poll() is None  # and nobody was killed
        assert status(env, reg)["devices"][0]["used"] == 40 * MiB  # nor lost memory
        assert m("free") == 0
        assert m(f"alloc {32 * MiB}") == 0  # exactly the new cap
        assert m("alloc 1") == 2
        assert limits_set(env, "--region", str(reg), "--memory", "none").returncode == 0
        assert m(f"alloc {200 * MiB}") == 0
        g = status(env, reg)
        assert g["devices"][0]["limit"] is None and g["devices"][0]["used"] == 232 * MiB
        kinds = [(e["kind"], e["device"], e["a"], e["b"]) for e in g["events"]]
        assert kinds == [("memory_limit", None, 64 * MiB, 32 * MiB), ("oom", 0, MiB, 40 * MiB),
                         ("oom", 0, 1, 32 * MiB), ("memory_limit", None, 32 * MiB, 0)]
        assert {e["pid"] for e in g["events"] if e["kind"] == "oom"} == {m.p.pid}
    finally:
        m.stop()


def test_per_device_memory_limit_change(env, tmp_path):
    reg = tmp_path / "g.region"
    m = Member(env, "--memory", "64M", "--region", str(reg))
    try:
        p = limits_set(env, "--region", str(reg), "--memory", "1=4M")
        assert p.returncode == 0, p.stderr
        assert "memory cap: 0=64 MiB, 1=4 MiB" in p.stdout
        g = status(env, reg)
        assert [d["limit"] for d in g["devices"][:2]] == [64 * MiB, 4 * MiB]
        assert [(e["kind"], e["device"], e["a"], e["b"]) for e in g["events"]] == [
            ("memory_limit", 1, 64 * MiB, 4 * MiB)]
        assert m(f"alloc {60 * MiB}") == 0  # device 0 kept its cap
    finally:
        m.stop()


def test_a_member_started_with_the_groups_first_limits_follows_a_live_change(env, tmp_path):
    """`wrap` again with the limits the group was created with (as a script that started the group does, or
    a child that inherited them) after `limits set` changed them: it joins under the group's limits."""
    reg = tmp_path / "g.region"
    m = Member(env, "--memory", "64M", "--sm", "30", "--region", str(reg))
    try:
        assert limits_set(env, "--region", str(reg), "--memory", "32M", "--sm", "40").returncode == 0
        m2 = Member(env, "--memory", "64M", "--sm", "30", "--region", str(reg))
        try:
            assert m2(f"alloc {40 * MiB}") != 0  # the group's 32 MiB, not the 64 its variables name
            assert m2(f"alloc {30 * MiB}") == 0
        finally:
            m2.stop()
        p = run([*PYVGPU, "wrap", "--memory", "48M", "--region", str(reg), "--", sys.executable, "-c", "0"],
                env=env)
        assert p.returncode == 2 and "has 32 MiB on device 0, but --memory 48M asks for 48 MiB" in p.stderr, p.stderr
    finally:
        m.stop()


def test_sm_limit_set_live_and_removed(env, tmp_path):
    reg = tmp_path / "g.region"
    m = Member(env, "--memory", "64M", "--region", str(reg))
    try:
        p = limits_set(env, "--region", str(reg), "--sm", "40")
        assert p.returncode == 0, p.stderr
        assert "compute share: 40%" in p.stdout
        r = region.open_region(reg, writable=False)
        os.close(r.fd)
        assert r.sm_limits()[:2] == [40, 40] and r.header.sm_any == L.MAX_DEVICES
        assert limits_set(env, "--region", str(reg), "--sm", "none").returncode == 0
        g = status(env, reg)
        assert g["devices"][0]["sm"]["limit_percent"] is None
        assert [(e["kind"], e["a"], e["b"]) for e in g["events"]] == [("sm_limit", 0, 40), ("sm_limit", 40, 0)]
    finally:
        m.stop()


@pytest.mark.parametrize("args,message", [
    ([], "name the group: give --group NAME or --region PATH"),
    (["--region", "R", "--group", "g"], "name the group: give --group NAME or --region PATH"),
    (["--region", "R"], "nothing to change: give --memory, --sm, --priority and/or --sm-borrow"),
    (["--region", "R", "--memory", "4Q"], "'4Q' is not a size"),
    (["--region", "R", "--memory", "7=1G"], "has no device 7 (2 devices)"),
    (["--region", "R", "--memory", "32G"], "32 GiB is more than device 0's 16 GiB"),
    (["--region", "R", "--sm", "130"], "'130' is not a compute share"),
    (["--region", "MISSING", "--sm", "30"], "there is no such file; start a group there with `pyvgpu wrap --region"),
])
def test_limits_set_refuses_bad_input_and_changes_nothing(env, tmp_path, args, message):
    reg = tmp_path / "g.region"
    region.create(reg, region.GroupSpec("g", [64 * MiB] * L.MAX_DEVICES, n_physical=2))
    args = [str(reg) if a == "R" else str(tmp_path / "missing.region") if a == "MISSING" else a for a in args]
    p = limits_set(env, *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    r = region.open_region(reg, writable=False)
    os.close(r.fd)
    assert r.limits() == [64 * MiB] * L.MAX_DEVICES and r.sm_limits() == [0] * L.MAX_DEVICES
    assert r.events() == []


def test_sm_limit_refused_live_when_utilization_cannot_be_measured(env, tmp_path):
    reg = tmp_path / "g.region"
    region.create(reg, region.GroupSpec("g", [0] * L.MAX_DEVICES, n_physical=2))
    p = limits_set(dict(env, FAKENVML_NO_UTILIZATION="1"), "--region", str(reg), "--sm", "30")
    assert p.returncode == 2 and "cannot be enforced" in p.stderr
    assert limits_set(env, "--region", str(reg), "--sm", "30").returncode == 0


# --- the event log ----------------------------------------------------------------------------------

def test_event_ring_keeps_the_latest_in_order(env, tmp_path):
    reg = tmp_path / "g.region"
    region.create(reg, region.GroupSpec("g", [0] * L.MAX_DEVICES))
    r = region.open_region(reg)
    try:
        for i in range(L.N_EVENTS + 40):
            r.log_event(L.EV_MEMORY_LIMIT, i % 3, i, i + 1)
        evs = r.events()
        assert len(evs) == L.N_EVENTS
        assert [e["a"] for e in evs] == list(range(40, L.N_EVENTS + 40))
        assert all(e["pid"] == os.getpid() and e["b"] == e["a"] + 1 for e in evs)
        assert [e["a"] for e in r.events(5)] == list(range(L.N_EVENTS + 35, L.N_EVENTS + 40))
        r.event(L.N_EVENTS + 39).seq = 0  # being rewritten: skipped, never misread
        assert r.events(2)[-1]["a"] == L.N_EVENTS + 38 and len(r.events(2)) == 1
    finally:
        os.close(r.fd)


def test_reclaim_is_logged(env, tmp_path):
    reg = tmp_path / "g.region"
    m = Member(env, "--memory", "64M", "--region", str(reg))
    assert m(f"alloc {5 * MiB}") == 0
    pid = m.p.pid
    m.p.send_signal(signal.SIGKILL)
    m.p.wait(30)
    g = status(env, reg)
    assert g["reclaimed_now"] == 5 * MiB
    assert [(e["kind"], e["device"], e["pid"], e["a"]) for e in g["events"]] == [("reclaim", 0, pid, 5 * MiB)]
    text = run([*PYVGPU, "status", "--region", str(reg)], env=env).stdout
    assert f"reclaimed 5 MiB on device 0 from pid {pid}, which ended" in text


# --- status, top, exporter --------------------------------------------------------------------------

def test_status_json_has_events_launches_and_group_devices(env, tmp_path):
    reg = tmp_path / "g.region"
    m = Member(env, "--memory", "64M", "--region", str(reg))
    try:
        m("alloc 100000000")  # refused: an OOM event
        g = status(env, reg)
        assert set(g) == {"name", "path", "created_ns", "mode", "mps_active_threads", "sm_switch", "priority",
                          "sm_borrow", "reclaimed_now", "n_physical", "gpus", "devices", "processes", "events"}
        assert g["mode"] == "hami-core" and g["mps_active_threads"] is None
        assert g["gpus"] is None  # no --devices: as CUDA sees them
        (pr,) = g["processes"]
        assert pr["launches"] == 0 and pr["oom_refusals"] == 1
        (ev,) = g["events"]
        assert set(ev) == {"time_ns", "kind", "device", "pid", "a", "b"}
        assert ev["kind"] == "oom" and abs(ev["time_ns"] - time.time_ns()) < 60e9
        assert "group_utilization_percent" in g["devices"][0]["sm"]
    finally:
        m.stop()


def test_top_once_shows_groups_processes_and_events(env, tmp_path):
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path), COLUMNS="160")
    m = Member(env, "--memory", "64M", "--group", "team-a")
    try:
        assert m(f"alloc {3 * MiB}") == 0
        assert m(f"alloc {99 * MiB}") == 2
        p = run([*PYVGPU, "top", "--once", "--interval", "0.2"], env=env)
        assert p.returncode == 0, p.stderr
        out = p.stdout
        assert "team-a" in out and "3M/64M" in out and str(m.p.pid) in out
        assert "refused 99 MiB for the cap on device 0" in out
    finally:
        m.stop()


def test_top_quits_on_q(env, tmp_path):
    import pty

    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    pid, fd = pty.fork()
    if pid == 0:  # the child: pyvgpu top on a terminal, the installed one (not the source tree a cwd would give)
        os.chdir(tmp_path)
        os.execvpe(sys.executable, [sys.executable, "-m", "pyvgpu", "top", "--interval", "0.2"], env)
    out = b""
    deadline = time.monotonic() + 60
    while b"q or Ctrl-C" not in out and b"no groups" not in out and time.monotonic() < deadline:
        try:
            out += os.read(fd, 4096)
        except OSError:
            break
    os.write(fd, b"q")
    for _ in range(100):
        done, status_ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        try:
            os.read(fd, 4096)
        except OSError:
            pass
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("pyvgpu top did not quit on q")
    assert os.waitstatus_to_exitcode(status_) == 0


def scrape(url: str) -> dict[str, list]:
    body = urllib.request.urlopen(url, timeout=30).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def test_exporter_scrape_over_loopback(env, tmp_path):
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    a = Member(env, "--memory", "64M", "--group", "team-a")
    b = Member(env, "--memory", "0=32M", "--sm", "30", "--group", "team-b")
    ex = subprocess.Popen([*PYVGPU, "exporter", "--port", "0", "--address", "127.0.0.1", "--cache-seconds", "0"],
                          env=env, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        assert a(f"alloc {3 * MiB}") == 0 and a(f"alloc {80 * MiB}") == 2
        assert b(f"alloc {MiB}") == 0
        line = ex.stderr.readline()
        assert "serving http://127.0.0.1:" in line, line
        url = line.split()[3]
        m = scrape(url)
        lim = {(s.labels["group"], s.labels["vgpu_device"]): s.value for s in m["pyvgpu_memory_limit_bytes"]}
        assert lim[("team-a", "0")] == 64 * MiB and lim[("team-a", "1")] == 64 * MiB
        assert lim[("team-b", "0")] == 32 * MiB and ("team-b", "1") not in lim
        used = {(s.labels["group"], s.labels["vgpu_device"], s.labels["pid"], s.labels["kind"]): s.value
                for s in m["pyvgpu_memory_used_bytes"]}
        assert used[("team-a", "0", str(a.p.pid), "data")] == 3 * MiB
        assert used[("team-b", "0", str(b.p.pid), "data")] == MiB
        oom = {(s.labels["group"], s.labels["vgpu_device"]): s.value for s in m["pyvgpu_oom_refusals"]
               if s.name == "pyvgpu_oom_refusals_total"}
        assert oom[("team-a", "0")] == 1 and oom[("team-b", "0")] == 0
        sm = {(s.labels["group"], s.labels["vgpu_device"]): s.value for s in m["pyvgpu_sm_limit_percent"]}
        assert sm[("team-b", "0")] == 30 and ("team-a", "0") not in sm
        held = {s.name for s in m["pyvgpu_throttle_seconds"]}
        assert held == {"pyvgpu_throttle_seconds_total"}
        how = {(s.labels["group"], s.labels["how"]): s.value for s in m["pyvgpu_launch_timings"]
               if s.name == "pyvgpu_launch_timings_total"}
        assert {h for g, h in how if g == "team-b"} == set(L.TIMED_HOW), how  # with a share: each how
        assert not any(g == "team-a" for g, _ in how), how  # no share, no cost model
        at_mean = {s.labels["group"] for s in m["pyvgpu_launches_at_mean"] if s.name.endswith("_total")}
        assert at_mean == {"team-b"}, at_mean
        assert "pyvgpu_sm_utilization_percent" in m
        # each scrape reads the regions afresh
        assert a("free") == 0
        m = scrape(url)
        used = {(s.labels["group"], s.labels["pid"]): s.value for s in m["pyvgpu_memory_used_bytes"]
                if s.labels["kind"] == "data"}
        assert ("team-a", str(a.p.pid)) not in used and used[("team-b", str(b.p.pid))] == MiB
        group = {(s.labels["group"], s.labels["vgpu_device"]): s.value for s in m["pyvgpu_group_memory_used_bytes"]}
        assert group[("team-a", "0")] == 0 and group[("team-b", "0")] == MiB
    finally:
        ex.send_signal(signal.SIGTERM)
        assert ex.wait(30) == 0
        a.stop()
        b.stop()


def test_exporter_port_in_use_is_a_clear_error(env):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        p = run([*PYVGPU, "exporter", "--port", str(s.getsockname()[1]), "--address", "127.0.0.1"], env=env,
                timeout=60)
        assert p.returncode == 2 and "cannot listen on 127.0.0.1" in p.stderr and "another --port" in p.stderr
    finally:
        s.close()


# --- the exporter beside DCGM ---------------------------------------------------------------------

def fake_uuid(i: int) -> str:
    """The fake NVML's UUID of device i (tests/fakecuda/fake_devices.h)."""
    return f"GPU-fa4ec0da-0000-0000-0000-0000000000{i:02x}"


class Exporter:
    """`pyvgpu exporter --port 0` on a loopback address; ``url`` is where it serves."""

    def __init__(self, env, address="127.0.0.1", *args: str):
        self.p = subprocess.Popen([*PYVGPU, "exporter", "--port", "0", "--address", address, *args], env=env,
                                  stderr=subprocess.PIPE, text=True, cwd="/")
        line = self.p.stderr.readline()
        assert "serving http://" in line, line + self.p.stderr.read()
        self.url = line.split()[3]

    def stop(self) -> str:
        """Stop it (SIGTERM); its stderr after the first line."""
        self.p.send_signal(signal.SIGTERM)
        rest = self.p.communicate(timeout=60)[1]
        assert self.p.returncode == 0, rest
        return rest


def samples(m: dict[str, list], name: str) -> list:
    return m.get(name, [])


def test_exporter_serves_beside_a_half_open_connection_and_skips_stray_files(env, tmp_path):
    import socket

    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    a = Member(env, "--memory", "64M", "--group", "team-a")
    groups = tmp_path / "pyvgpu" / "groups"
    (groups / "x.region").mkdir()  # a stray folder with a region's name
    (groups / "junk.region").write_bytes(b"not a region")
    (tmp_path / "pyvgpu" / "private").mkdir(exist_ok=True)
    (tmp_path / "pyvgpu" / "private" / "y.region").mkdir()
    ex = Exporter(env)
    host, port = ex.url.split("//")[1].split("/")[0].rsplit(":", 1)
    half = socket.create_connection((host, int(port)), timeout=30)
    silent = socket.create_connection((host, int(port)), timeout=30)
    try:
        half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a request that never ends
        for _ in range(2):  # a single-threaded server would wait on `half` for ever: urlopen's timeout fails it
            m = scrape(ex.url)
            lim = {(s.labels["group"], s.labels["vgpu_device"]): s.value for s in m["pyvgpu_memory_limit_bytes"]}
            assert lim[("team-a", "0")] == 64 * MiB
            assert {s.labels["group"] for s in m["pyvgpu_memory_limit_bytes"]} == {"team-a"}
        (build,) = samples(m, "pyvgpu_build_info")
        import pyvgpu

        assert build.labels["version"] == pyvgpu.__version__ and build.value == 1
        st = run([*PYVGPU, "status"], env=env)
        assert st.returncode == 0 and "group team-a" in st.stdout and "Traceback" not in st.stderr
        assert f"pyvgpu: skipped {groups / 'x.region'}: it is not a regular file" in st.stderr
        assert f"pyvgpu: skipped {groups / 'junk.region'}: " in st.stderr
    finally:
        half.close()
        silent.close()
        log = ex.stop()
        a.stop()
    assert log.count(f"skipped {groups / 'x.region'}: it is not a regular file") == 1  # once, not every scrape
    assert f"skipped {groups / 'junk.region'}" in log and f"skipped {tmp_path / 'pyvgpu/private/y.region'}" in log
    assert "Traceback" not in log


def test_exporter_labels_join_dcgm_exporters(env, tmp_path):
    """Every per-device series carries UUID and gpu (dcgm-exporter's label names), and the group's own index."""
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    a = Member(env, "--devices", "1", "--memory", "64M", "--group", "chosen")
    b = Member(env, "--memory", "64M", "--group", "all")
    # a group made where NVML did not tell the devices (as HAMi's pods make theirs): no guess
    region.create(tmp_path / "pyvgpu/groups/unknown.region",
                  region.GroupSpec("unknown", [64 * MiB] * L.MAX_DEVICES, n_physical=0))
    ex = Exporter(env)
    try:
        assert a(f"alloc {3 * MiB}") == 0 and b(f"alloc {MiB}") == 0
        m = scrape(ex.url)
        lim = {(s.labels["group"], s.labels["vgpu_device"]): (s.labels["gpu"], s.labels["UUID"])
               for s in m["pyvgpu_memory_limit_bytes"]}
        assert lim[("chosen", "0")] == ("1", fake_uuid(1)) and ("chosen", "1") not in lim
        assert lim[("all", "0")] == ("0", fake_uuid(0)) and lim[("all", "1")] == ("1", fake_uuid(1))
        assert lim[("unknown", "0")] == ("", "")
        used = {(s.labels["group"], s.labels["kind"]): (s.labels["gpu"], s.labels["UUID"], s.value)
                for s in m["pyvgpu_memory_used_bytes"] if s.labels["pid"] in (str(a.p.pid), str(b.p.pid))}
        assert used[("chosen", "data")] == ("1", fake_uuid(1), 3 * MiB)
        assert used[("all", "data")] == ("0", fake_uuid(0), MiB)
        for name in ("pyvgpu_group_memory_used_bytes", "pyvgpu_oom_refusals"):
            assert all(s.labels["UUID"] for s in m[name] if s.labels["group"] != "unknown"), name
        info = {(s.labels["group"], s.labels["gpu"]): s.labels for s in m["pyvgpu_device_info"]}
        assert info[("chosen", "1")]["UUID"] == fake_uuid(1) and info[("chosen", "1")]["modelName"]
    finally:
        ex.stop()
        a.stop()
        b.stop()


def test_exporter_drops_a_dead_private_group_at_the_next_scrape(env, tmp_path):
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    c = Member(env, "--memory", "64M")  # a private group
    ex = Exporter(env, "127.0.0.1", "--cache-seconds", "0")
    try:
        assert c(f"alloc {MiB}") == 0
        names = {s.labels["group"] for s in scrape(ex.url)["pyvgpu_memory_limit_bytes"]}
        (private,) = list((tmp_path / "pyvgpu" / "private").glob("*.region"))
        assert names == {private.stem}
        c.stop()
        m = scrape(ex.url)
        assert not samples(m, "pyvgpu_memory_limit_bytes") and not samples(m, "pyvgpu_memory_used_bytes")
        assert private.exists()  # hidden, not removed: the next `pyvgpu wrap` collects it
    finally:
        ex.stop()
        c.stop()


def test_exporter_over_ipv6_and_a_wrong_address(env, tmp_path):
    import socket

    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    p = run([*PYVGPU, "exporter", "--port", "0", "--address", "192.0.2.1"], env=env, timeout=60)  # not this host's
    assert p.returncode == 2 and "cannot listen on 192.0.2.1:0" in p.stderr and "give --address" in p.stderr
    assert "--port" not in p.stderr
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("this host has no IPv6 loopback")
    ex = Exporter(env, "::1")
    try:
        assert ex.url.startswith("http://[::1]:")
        assert "pyvgpu_build_info" in scrape(ex.url)
    finally:
        ex.stop()


@pytest.mark.parametrize("args", [["status", "--group", "nosuch"], ["top", "--group", "nosuch", "--once"],
                                  ["limits", "set", "--group", "nosuch", "--sm", "30"]])
def test_an_unknown_group_hint_names_the_option_used(env, tmp_path, args):
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    p = run([*PYVGPU, *args], env=env)
    assert p.returncode == 2
    assert "--group 'nosuch': there is no such group" in p.stderr and "pyvgpu wrap --group nosuch" in p.stderr
    assert "--region" not in p.stderr
    missing = tmp_path / "missing.region"
    p = run([*PYVGPU, *[str(missing) if a == "nosuch" else "--region" if a == "--group" else a for a in args]],
            env=env)
    assert p.returncode == 2 and f"--region {missing}: there is no such file" in p.stderr
    assert f"pyvgpu wrap --region {missing}" in p.stderr and "--group" not in p.stderr


def test_top_fits_80_columns():
    from rich.console import Console

    from pyvgpu.ops import top

    def sm(limit):
        return {"limit_percent": limit, "enforced": True, "utilization_percent": 97.0,
                "group_utilization_percent": 31.0, "controller": "x", "scale": 1.0, "throttled_s": 12345.6}

    g = {"name": "team-a", "path": "/x", "mode": "hami-core",
         "gpus": [{"index": 0, "nvml_index": 15, "uuid": fake_uuid(15)}],
         "devices": [{"index": 0, "limit": 15 << 30, "used": 1023 << 20, "oom_refusals": 12345, "sm": sm(30)},
                     {"index": 1, "limit": None, "used": 3 << 20, "oom_refusals": 0, "sm": sm(None)}],
         "processes": [{"slot": 0, "pid": 4194304, "alive": False, "launches": 10**9, "oom_refusals": 3,
                        "devices": {"0": {"data": 1 << 30, "context": 5 << 29, "module": 0}}}],
         "events": [{"time_ns": time.time_ns(), "kind": "oom", "device": 0, "pid": 42, "a": 1 << 30, "b": 2 << 30}]}
    before = (time.monotonic() - 1, [dict(g, processes=[dict(g["processes"][0], launches=10**9 - 1234567)])])
    console = Console(width=80, record=True, force_terminal=False)
    console.print(top.render((time.monotonic(), [g]), before))
    out = console.export_text()
    assert max(len(line) for line in out.splitlines()) <= 80
    header = next(line for line in out.splitlines() if line.startswith("group"))
    assert header.split() == ["group", "dev", "pid", "used/limit", "SM/share", "util", "launch/s", "OOM", "held"]
    row = next(line for line in out.splitlines() if line.startswith("team-a"))
    assert row.split() == ["team-a", "0=g15", "1023M/15G", "31/30%", "97%", "12k", "206m"]
    assert "4194304!" in out and "1.2M" in out


def test_the_dashboard_asks_for_what_the_exporter_serves(tmp_path, monkeypatch):
    """deploy/grafana/pyvgpu-dashboard.json: every query parses, and names metrics and labels the exporter has."""
    import importlib.util
    import re

    from pyvgpu.ops import exporter

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("render", root / "deploy/grafana/render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    families = list(exporter.RegionCollector(machine=lambda: None).collect())
    served = {f.name for f in families} | {f.name + "_total" for f in families if f.type == "counter"}
    labels = set(exporter.DEVICE_LABELS) | {"pid", "kind", "version", "python", "modelName"}
    dash = json.loads((root / "deploy/grafana/pyvgpu-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        render.Parser(expr, {"node": ".*", "instance": ".*", "group": ".*", "__rate_interval": "1m"}).expr()  # parses
        for name in re.findall(r"\bpyvgpu_\w+", expr):
            assert name in served, (name, expr)
        for group in re.findall(r"by \(([^)]*)\)", expr):
            assert {x.strip() for x in group.split(",")} <= labels, expr
        for legend in re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(dash)):
            assert legend in labels, legend


def test_exporter_labels_a_mig_group_as_dcgm_exporter_does(tmp_path, monkeypatch):
    """A group on a MIG instance (wrap --devices MIG-...): its parent GPU's UUID and index, GPU_I_ID and
    GPU_I_PROFILE, where the series used to carry the instance's own MIG- UUID."""
    from pyvgpu.host import devices
    from pyvgpu.ops import exporter

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    parent = "GPU-fa4ec0da-0000-0000-0000-000000000000"
    mig = devices.Gpu(0, "MIG-fa4ec0da-4d49-0000-0000-000000000001", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 10 << 30,
                      parent=parent, gi=9, ci=0)
    region.create(tmp_path / "pyvgpu/groups/m.region",
                  region.GroupSpec("m", [MiB] + [0] * (L.MAX_DEVICES - 1), visible=[mig]))
    gpu = devices.Gpu(0, parent, "NVIDIA A100-SXM4-80GB", 80 << 30, mig_mode=True)
    fams = {f.name: f for f in exporter.RegionCollector(machine=lambda: [gpu], migs=lambda: [mig]).collect()}
    (lim,) = fams["pyvgpu_memory_limit_bytes"].samples
    assert {k: lim.labels[k] for k in ("UUID", "gpu", "GPU_I_ID", "GPU_I_PROFILE")} == \
        {"UUID": parent, "gpu": "0", "GPU_I_ID": "9", "GPU_I_PROFILE": "1g.10gb"}
    (info,) = fams["pyvgpu_device_info"].samples
    assert info.labels["modelName"] == "NVIDIA A100-SXM4-80GB"
