"""`pyvgpu status`: read group regions, reclaim dead members' quota, report.

The JSON schema is documented in docs/status.md.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pyvgpu.contract import envspec
from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits
from pyvgpu.group import region as R
from pyvgpu.group.limits import human
from pyvgpu.group.mps import mode_name
from pyvgpu.native import services
from pyvgpu.native.safefile import UntrustedFile


def check_exists(path: Path, group: str | None, region_path: Path | str | None) -> None:
    """A group asked for by name or path that is not there: an error that names the option the user gave."""
    if path.exists():
        return
    if group:
        raise PyvgpuError(f"--group {group!r}: there is no such group (no {path}); start it with "
                          f"`pyvgpu wrap --group {group} PROGRAM`, or see the groups with `pyvgpu status`")
    raise PyvgpuError(f"--region {region_path}: there is no such file; start a group there with "
                      f"`pyvgpu wrap --region {region_path} PROGRAM`")


def is_private(path: Path) -> bool:
    """A private group's region (one `pyvgpu wrap` without --group or --region made for its program)."""
    return Path(path).parent == R.runtime_dir() / "private"


def region_paths(group: str | None = None, region_path: Path | str | None = None,
                 state_dir: Path | None = None) -> list[Path]:
    if region_path:
        return [Path(region_path)]
    if group:
        return [R.group_path(group)]
    if state_dir is not None:
        # a Kubernetes node's state (pyvgpu.cluster.node.nodestate): one region per container
        from pyvgpu.cluster.node.nodestate import NodeState

        return [p / "vgpu.region" for _, _, p in NodeState(Path(state_dir)).container_dirs()]
    base = R.runtime_dir()
    out = sorted((base / "groups").glob("*.region")) + sorted((base / "private").glob("*.region"))
    shared = os.environ.get(envspec.CUDA_DEVICE_MEMORY_SHARED_CACHE.name)
    if shared and Path(shared).exists() and Path(shared) not in out:
        out.append(Path(shared))
    return out


SM_STATES = ("idle", "calibrating (alone on the device)", "holding (others share the device)",
             "no measurement (NVML failed)", "holding (the group borrowed idle time beyond its share)")


def describe(r: R.Region, reclaimed: int) -> dict:
    devices = []
    for d in range(L.MAX_DEVICES):
        dev = r.device(d)
        n = r.header.n_visible or r.header.n_physical
        # the group's devices when known; else device 0 if limited. One that was used is always shown.
        present = d < n if n else d == 0 and bool(dev.limit or dev.sm_limit)
        if not (present or dev.used or dev.peak or dev.oom_refusals):
            continue
        devices.append({
            "index": d,
            "limit": dev.limit or None,
            "used": dev.used,
            "free": max(dev.limit - dev.used, 0) if dev.limit else None,
            "peak": dev.peak,
            "oom_refusals": dev.oom_refusals,
            "reclaimed": dev.reclaimed,
            "sm": {
                "limit_percent": dev.sm_limit or None,
                "enforced": bool(0 < dev.sm_limit < 100 and r.header.sm_switch),
                "utilization_percent": dev.sm_util / 100 if dev.sm_steps else None,
                "group_utilization_percent": dev.sm_group_util / 100 if dev.sm_steps else None,
                "controller": (SM_STATES[dev.sm_state] if dev.sm_state < len(SM_STATES) else f"state {dev.sm_state}")
                if dev.sm_steps else "not started",
                "scale": (dev.sm_scale or 65536) / 65536,
                "throttled_s": dev.sm_throttle_ns / 1e9,
                "turn_s": dev.sm_turn_ns / 1e9,
                "turn_wait_s": dev.sm_turn_wait_ns / 1e9,
                "borrowed_s": dev.sm_borrow_ns / 1e9,
                "timed": dict(zip(L.TIMED_HOW, dev.sm_timed, strict=True)),
                # what those timings read, a mean in us by how; and the launches charged the mean of them
                "timing_us": {h: round(ns / n / 1e3, 3) for h, ns, n in zip(L.TIMED_HOW, dev.sm_timed_ns,
                                                                           dev.sm_harvested, strict=True) if n},
                "at_mean": dev.sm_unknown,
                "at_mean_s": dev.sm_unknown_ns / 1e9,
            },
        })
    procs = []
    for i in range(r.header.n_slots):
        s = r.slot(i)
        if s.state != L.SLOT_LIVE:
            continue
        by_dev = {}
        for d in range(L.MAX_DEVICES):
            kinds = {k: s.used[d * L.N_KINDS + j] for j, k in enumerate(L.KINDS)}
            if any(kinds.values()):
                by_dev[str(d)] = kinds
        procs.append({"slot": i, "pid": s.pid, "alive": R.slot_alive(r, i), "start_ns": s.start_ns,
                      "oom_refusals": s.oom_refusals, "devices": by_dev,
                      "sm_policy": limits.SM_POLICIES[s.sm_policy] if s.sm_policy < 3 else "?",
                      "launches": R.slot_launches(s), "launches_limited": sum(d.sm_launches for d in s.dev)})
    visible = [{"index": g, "nvml_index": i, "uuid": u, "mig": u.startswith("MIG-")}
               for g, (i, u) in enumerate(r.visible())]
    return {"name": r.name, "path": str(r.path), "created_ns": r.header.created_ns,
            "mode": mode_name(r.header.mode), "mps_active_threads": r.header.mps_active_threads or None,
            "sm_switch": bool(r.header.sm_switch), "priority": limits.PRIORITIES[r.header.priority]
            if r.header.priority < 2 else str(r.header.priority), "sm_borrow": bool(r.header.sm_borrow),
            "reclaimed_now": reclaimed, "n_physical": r.header.n_physical,
            "gpus": visible or None, "devices": devices, "processes": procs, "events": r.events(EVENTS_SHOWN)}


EVENTS_SHOWN = 20


def _word(words: tuple[str, ...], v: int) -> str:
    return words[v] if 0 <= v < len(words) else str(v)


def timed_text(timed: dict[str, int]) -> str:
    """How the group's launch timings were taken: gated (the kernel's own time), or why not (docs/status.md)."""
    n = sum(timed.values())
    if not n:
        return "none yet"
    rest = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in timed.items() if k != "gated" and v)
    return f"{n}, {100 * timed['gated'] / n:.0f}% gated" + (f" (not gated: {rest})" if rest else "")


def event_text(e: dict) -> str:
    """One event, as status and top print it."""
    dev = "every device" if e["device"] is None else f"device {e['device']}"
    kind = e["kind"]
    if kind == "oom":
        what = f"refused {human(e['a'])} for the cap on {dev} (group used {human(e['b'])}), pid {e['pid']}"
    elif kind == "reclaim":
        what = f"reclaimed {human(e['a'])} on {dev} from pid {e['pid']}, which ended"
    elif kind == "memory_limit":
        old = human(e["a"]) if e["a"] else "none"
        new = human(e["b"]) if e["b"] else "none"
        what = f"memory limit on {dev}: {old} -> {new} (by pid {e['pid']})"
    elif kind == "sm_limit":
        old = f"{e['a']}%" if e["a"] else "none"
        new = f"{e['b']}%" if e["b"] else "none"
        what = f"compute share on {dev}: {old} -> {new} (by pid {e['pid']})"
    elif kind == "priority":
        what = f"priority: {_word(limits.PRIORITIES, e['a'])} -> {_word(limits.PRIORITIES, e['b'])} (by pid {e['pid']})"
    elif kind == "sm_borrow":
        onoff = ("off", "on")
        what = f"borrowing idle time: {_word(onoff, e['a'])} -> {_word(onoff, e['b'])} (by pid {e['pid']})"
    elif kind == "devices_refused":
        what = f"pid {e['pid']} changed CUDA_VISIBLE_DEVICES; its GPU use was refused"
    elif kind == "turn_timeout":
        what = (f"pid {e['pid']} waited {e['a'] / 1e9:.1f} s for the turn on {dev} (held by id {e['b']}); "
                "it time-slices there from now on")
    elif kind == "budget_reset":
        tat = e["a"] - (1 << 64) if e["a"] >= 1 << 63 else e["a"]  # the word found, as a signed time
        found = "not a time" if tat < 0 else f"{(tat - e['b']) / 1e9:.0f} s ahead"
        what = (f"pid {e['pid']} found the compute budget on {dev} {found} (more than the "
                f"{L.BUDGET_MAX_AHEAD_NS // 10**9} s a launch waits at most) and started it afresh")
    elif kind == "timing_gate":
        what = (f"pid {e['pid']}: a timed launch's gate stayed closed {e['b'] / 1e6:.0f} ms (the launch waited "
                f"inside the driver, or its thread did not run) until the watcher opened it ({e['a']} so far; "
                f"from the {L.TIMING_GATE_FORCED_MAX}th on, each pauses the gate: 2 s, then twice as long each "
                "time)")
    elif kind == "turns_full":
        what = (f"the turn file has no free entry for {dev}: pid {e['pid']} time-slices there, and its share is "
                "not corrected beside other groups (pyvgpu doctor)")
    else:
        what = f"{kind} a={e['a']} b={e['b']} pid {e['pid']}"
    return f"{time.strftime('%H:%M:%S', time.localtime(e['time_ns'] / 1e9))} {what}"


def collect(group: str | None = None, region_path: Path | str | None = None,
            skipped: list[tuple[Path, str]] | None = None, strict: bool = True,
            state_dir: Path | None = None) -> list[dict]:
    """Every group (or the one named), dead members reclaimed first.

    A file in the runtime dir that is not a readable region of ours (a stray
    folder named x.region, another user's file, a damaged one) is skipped and
    noted in ``skipped`` as (path, why). A group named with ``group`` or
    ``region_path`` that cannot be read is an error, unless ``strict`` is False
    (the exporter, which must answer every scrape).
    """
    out = []
    explicit = bool(group or region_path) and strict
    for p in region_paths(group, region_path, state_dir):
        try:
            if explicit:
                check_exists(p, group, region_path)
            elif not p.exists():
                raise PyvgpuError("it does not exist (yet)")
            if not p.is_file():
                raise PyvgpuError("it is not a regular file")
            try:
                r = R.open_region(p, writable=os.access(p, os.W_OK))
            except UntrustedFile:  # another user's, or writable by others: read a snapshot, map nothing
                r = R.open_region(p, writable=False)
        except (PyvgpuError, OSError) as e:
            if explicit:
                raise PyvgpuError(str(e)) from None
            if skipped is not None:
                skipped.append((p, str(e)))
            continue
        try:
            reclaimed = services.reclaim(r) if r.writable else 0  # a read-only snapshot cannot
            shown = describe(r, reclaimed)
            # a private group lives as long as its program: once no member lives it is gone (the next wrap
            # removes the file), unless asked for by name
            if not (is_private(p) and not explicit and not any(pr["alive"] for pr in shown["processes"])):
                out.append(shown)
        except (PyvgpuError, ValueError, IndexError, OSError) as e:  # a region that changed under us, or damaged
            if explicit:
                raise PyvgpuError(f"region {p}: {e}") from None
            if skipped is not None:
                skipped.append((p, f"{type(e).__name__}: {e}"))
        finally:
            os.close(r.fd)
    return out


def render(groups: list[dict]) -> str:
    if not groups:
        return f"no groups under {R.runtime_dir()}"
    lines = []
    for g in groups:
        mode = "" if g["mode"] == "hami-core" else f"  mode {g['mode']}"
        if g["mps_active_threads"]:
            mode += f", MPS active threads {g['mps_active_threads']}%"
        lines.append(f"group {g['name']}  ({g['path']}){mode}")
        if g["reclaimed_now"]:
            lines.append(f"  reclaimed {human(g['reclaimed_now'])} from processes that ended")
        if g["gpus"]:
            lines.append("  devices: " + ", ".join(
                f"{x['index']} = " + (f"MIG instance {x['uuid']} of nvidia-smi {x['nvml_index']}" if x["mig"]
                                      else f"nvidia-smi {x['nvml_index']} ({x['uuid']})") for x in g["gpus"]))
        lines.append(f"  {'device':>6} {'limit':>12} {'used':>12} {'free':>12} {'peak':>12} {'oom':>5}")
        for d in g["devices"]:
            lim = human(d["limit"]) if d["limit"] else "none"
            free = human(d["free"]) if d["free"] is not None else "-"
            lines.append(f"  {d['index']:>6} {lim:>12} {human(d['used']):>12} {free:>12} {human(d['peak']):>12} "
                         f"{d['oom_refusals']:>5}")
        for d in g["devices"]:
            sm = d["sm"]
            if sm["limit_percent"]:
                state = "enforced" if sm["enforced"] else "NOT enforced (the group's switch is off)"
                util = f"{sm['utilization_percent']:.0f}%" if sm["utilization_percent"] is not None else "-"
                lines.append(f"  device {d['index']}: compute share {sm['limit_percent']}% {state}; device "
                             f"utilization {util}, controller {sm['controller']}, scale {sm['scale']:.3f}, "
                             f"held back {sm['throttled_s']:.1f} s")
                lines.append(f"    launch timings: {timed_text(sm['timed'])}")
                if sm["timing_us"] or sm["at_mean"]:
                    read = ", ".join(f"{k.replace('_', ' ')} {v:.1f} us" for k, v in sm["timing_us"].items())
                    lines.append(f"    they read (mean): {read or '-'}; {sm['at_mean']} launches charged the mean "
                                 f"({sm['at_mean_s']:.3f} s, kernels not timed yet)")
        lines.append(f"  {'pid':>8} {'device':>6} {'data':>12} {'context':>12} {'module':>12}")
        for p in g["processes"]:
            note = "" if p["alive"] else "  (dead, not yet reclaimed)"
            if p["sm_policy"] != "default":
                note += f"  (GPU_CORE_UTILIZATION_POLICY={p['sm_policy']})"
            if not p["devices"]:
                lines.append(f"  {p['pid']:>8} {'-':>6} {'0 B':>12} {'0 B':>12} {'0 B':>12}{note}")
            for d, kinds in p["devices"].items():
                lines.append(f"  {p['pid']:>8} {d:>6} {human(kinds['data']):>12} {human(kinds['context']):>12} "
                             f"{human(kinds['module']):>12}{note}")
        if g["events"]:
            lines.append("  latest events:")
            lines.extend(f"    {event_text(e)}" for e in g["events"][-5:])
    return "\n".join(lines)
