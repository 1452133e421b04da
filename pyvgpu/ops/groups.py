"""Named groups' lifecycle: when each was made and last used, removal, and the idle expiry.

A named group (`pyvgpu wrap --group NAME`) is a region file in <runtime dir>/groups. Its last use is the
latest of its creation, a `pyvgpu wrap` joining it (which touches the file) and its newest event (an OOM
refusal, a limit change, a dead member's quota reclaimed); while a member lives, it is in use now.

Idle expiry: a named group with no live member, unused for PYVGPU_GROUP_IDLE_HOURS hours (default 12; 0
never expires), is stale. The next `pyvgpu wrap --group NAME` starts it afresh with the limits it asks for
(and says so on stderr), and `pyvgpu group ls` removes it. `pyvgpu group rm NAME` removes one at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping

from pyvgpu.contract import envspec
from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.group import region as R
from pyvgpu.native import grouplib

TYPE_CHECKING = False  # not `typing`'s: a wrap with --group imports this module, and its paths are text
if TYPE_CHECKING:
    from pathlib import Path

IDLE_VAR = envspec.GROUP_IDLE_HOURS.name


def idle_hours(env: Mapping[str, str] = os.environ) -> float:
    """Hours a named group may stay unused before it expires (0: never), read by the group core (pv_env.c)."""
    return grouplib.env_setting(env, grouplib.GROUP_IDLE_NS) / 3.6e12


def last_used_ns(r: R.Region) -> int:
    """CLOCK_REALTIME of the group's last use that the file shows (not counting live members)."""
    newest = r.events(1)
    return max(r.header.created_ns, os.fstat(r.fd).st_mtime_ns, newest[-1]["time_ns"] if newest else 0)


def members(r: R.Region) -> list[int]:
    """Pids of the group's live members."""

    return [r.slot(i).pid for i in range(r.header.n_slots)
            if r.slot(i).state != L.SLOT_FREE and R.slot_alive(r, i)]


def touch(path: str | Path) -> None:
    """Mark a join as the group's latest use."""
    try:
        os.utime(path)
    except OSError:  # another user's shared group: its use is theirs to record
        pass


def _stale(r: R.Region, env: Mapping[str, str], now_ns: int) -> float | None:
    """Hours the group has been idle, if that is past the expiry and no member lives; else None."""
    hours = idle_hours(env)
    if not hours:
        return None
    idle = (now_ns - last_used_ns(r)) / 3.6e12
    if idle < hours or R.has_live_member(r):
        return None
    return idle


def expire_if_idle(path: str | Path, env: Mapping[str, str] = os.environ) -> str | None:
    """Remove the named group at ``path`` if it is stale; the note to print, or None."""
    try:
        r = R.open_region(path)
    except PyvgpuError:  # absent or not ours: create_or_open says what is wrong
        return None
    try:
        idle = _stale(r, env, time.time_ns())
        if idle is None:
            return None
        os.unlink(path)
    finally:
        os.close(r.fd)
    return (f"group {r.name!r} was idle for {idle:.1f} h with no member (more than {IDLE_VAR}="
            f"{idle_hours(env):g}); starting it afresh")


def idle_hint(path: str | Path) -> str:
    """For a refusal to join: how to get rid of a group nobody uses."""
    try:
        r = R.open_region(path, writable=False)
    except PyvgpuError:
        return ""
    try:
        if R.has_live_member(r):
            return ""
    finally:
        os.close(r.fd)
    return f"; it has no live member: `pyvgpu group rm {r.name}` removes it"


def _where(devices: list[int], asked: list[int]) -> str:
    every = [d for d, v in enumerate(asked) if v]
    return "on every device" if devices == every and len(every) == L.MAX_DEVICES else \
        f"on device{'s' if len(devices) > 1 else ''} {','.join(map(str, devices))}"


def _differences(have: list[int], want: list[int]) -> dict[tuple[int, int], list[int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for d in range(L.MAX_DEVICES):
        if want[d] and want[d] != have[d]:
            out.setdefault((have[d], want[d]), []).append(d)
    return out


def join_notes(r: R.Region, spec: R.GroupSpec) -> list[str]:
    """What a joiner asked for (``spec``) that the group no longer has (`pyvgpu limits set` changed it since
    the group was made with it): the join is accepted, and the program runs under the group's limits."""
    notes = []
    source, sm_source = spec.limits_source, spec.sm_source
    want = spec.limits.as_list()
    for (have, asked), devs in _differences(r.limits(), want).items():
        now = lim.human(have) if have else "no limit"
        notes.append(f"group {r.name!r} has {now} {_where(devs, want)} now (`pyvgpu limits set` changed it from "
                     f"{lim.human(asked)}); {source} follows the group: the program runs under {now}")
    want = spec.sm.as_list()
    for (have, asked), devs in _differences(r.sm_limits(), want).items():
        now = f"{have}%" if have else "no compute share"
        notes.append(f"group {r.name!r} has {now} {_where(devs, want)} now (`pyvgpu limits set` changed it from "
                     f"{asked}%); {sm_source} follows the group: the program runs under {now}")
    return notes


def list_groups(env: Mapping[str, str] = os.environ, expire: bool = True) -> list[dict]:
    """Every named group of this user: name, path, made, last used, live members; stale ones removed first
    (each said on stderr)."""
    idle_hours(env)  # a bad setting is an error even with no group to expire
    d = R.runtime_dir() / "groups"
    out = []
    now = time.time_ns()
    for p in sorted(d.glob("*.region")) if d.is_dir() else []:
        try:
            r = R.open_region(p)
        except PyvgpuError as e:
            print(f"pyvgpu: skipped {p}: {e}", file=sys.stderr)
            continue
        try:
            idle = _stale(r, env, now) if expire else None
            if idle is not None:
                p.unlink()
                print(f"pyvgpu: removed group {r.name!r}: idle for {idle:.1f} h with no member (more than "
                      f"{IDLE_VAR}={idle_hours(env):g})", file=sys.stderr)
                continue
            pids = members(r)
            out.append({"name": r.name, "path": str(p), "created_ns": r.header.created_ns,
                        "last_used_ns": now if pids else last_used_ns(r), "members": pids,
                        "memory_limits": r.limits(), "sm_limits": r.sm_limits()})
        finally:
            os.close(r.fd)
    return out


def _ago(ns: int, now_ns: int) -> str:
    s = max(0, now_ns - ns) / 1e9
    if s < 60:
        return "now" if s < 1 else f"{s:.0f} s ago"
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago" if s < 172800 else f"{s / 86400:.0f} days ago"


def _caps(values: list[int], text) -> list[str]:
    """One value for every device when they agree (4 GiB), else DEV=VALUE for each device that has one."""
    if values and values[0] and all(v == values[0] for v in values):
        return [text(values[0])]
    return [f"{d}={text(v)}" for d, v in enumerate(values) if v]


def render(groups: list[dict], env: Mapping[str, str] = os.environ) -> str:
    if not groups:
        return f"no named groups under {R.runtime_dir() / 'groups'}"
    now = time.time_ns()
    hours = idle_hours(env)
    lines = [f"{'group':<20} {'made':>16} {'last used':>14} {'members':>7}  limits"]
    for g in groups:
        caps = _caps(g["memory_limits"], lim.human) + _caps(g["sm_limits"], lambda v: f"{v}%")
        made = time.strftime("%Y-%m-%d %H:%M", time.localtime(g["created_ns"] / 1e9))
        lines.append(f"{g['name'][:20]:<20} {made:>16} {_ago(g['last_used_ns'], now):>14} {len(g['members']):>7}  "
                     f"{' '.join(caps) or 'none'}")
    lines.append(f"a group with no member expires after {hours:g} h unused ({IDLE_VAR}; 0: never)" if hours else
                 f"groups never expire ({IDLE_VAR}=0)")
    return "\n".join(lines)


def remove(name: str) -> Path:
    """`pyvgpu group rm NAME`: remove a named group nobody is in."""
    path = R.group_path(name)
    try:
        r = R.open_region(path)
    except PyvgpuError:
        if not path.exists():
            raise PyvgpuError(f"there is no group {name!r} ({path}); `pyvgpu group ls` lists them") from None
        raise
    try:
        pids = members(r)
        if pids:
            raise PyvgpuError(f"group {name!r} has {len(pids)} live member(s) (pid {', '.join(map(str, pids))}); "
                              "stop them first, then remove it")
        path.unlink()
    finally:
        os.close(r.fd)
    return path
