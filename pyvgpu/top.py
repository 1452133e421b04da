"""`pyvgpu top`: a live table of every group, device and process, from the regions.

Each refresh reads the regions (the same snapshot as `pyvgpu status`, dead
members reclaimed first) and turns counters into rates against the previous
one. Quits on q or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pyvgpu import status as st
from pyvgpu.limits import human

Snapshot = tuple[float, list[dict]]


def take(group: str | None = None, region_path: str | None = None) -> Snapshot:
    return time.monotonic(), st.collect(group=group, region_path=region_path)


def _launches(groups: list[dict]) -> dict[tuple[str, int, int], int]:
    return {(g["path"], p["slot"], p["pid"]): p["launches"] for g in groups for p in g["processes"]}


def _share(sm: dict) -> str:
    if not sm["limit_percent"]:
        return "-"
    mine = sm["group_utilization_percent"]
    shown = f"{mine:.0f}%" if mine is not None else "?"
    return f"{shown} / {sm['limit_percent']}%" + ("" if sm["enforced"] else " (off)")


def render(now: Snapshot, before: Snapshot | None) -> Group:
    """The table (and the latest events) for one refresh."""
    t, groups = now
    rates: dict[tuple[str, int, int], float] = {}
    if before is not None and t > before[0]:
        old = _launches(before[1])
        for key, n in _launches(groups).items():
            if key in old and n >= old[key]:
                rates[key] = (n - old[key]) / (t - before[0])
    table = Table(title=f"pyvgpu top  {time.strftime('%H:%M:%S')}  (q or Ctrl-C quits)", title_justify="left",
                  expand=False, header_style="bold")
    for col, just in (("group", "left"), ("dev", "right"), ("pid", "right"), ("memory used / limit", "right"),
                      ("SM used / share", "right"), ("device util", "right"), ("launches/s", "right"),
                      ("OOM", "right"), ("held back", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for g in groups:
        first = True
        for d in g["devices"]:
            sm = d["sm"]
            gpu = next((x for x in g["gpus"] or [] if x["index"] == d["index"]), None)
            dev = f"{d['index']}" + (f" (gpu {gpu['nvml_index']})" if gpu else "")
            limit = human(d["limit"]) if d["limit"] else "none"
            util = f"{sm['utilization_percent']:.0f}%" if sm["utilization_percent"] is not None else "-"
            table.add_row(Text(g["name"], style="bold") if first else "", dev, "", f"{human(d['used'])} / {limit}",
                          _share(sm), util, "", str(d["oom_refusals"]) if d["oom_refusals"] else "",
                          f"{sm['throttled_s']:.1f} s" if sm["limit_percent"] else "")
            first = False
        for p in g["processes"]:
            used = sum(sum(k.values()) for k in p["devices"].values())
            devs = ",".join(p["devices"]) or "-"
            rate = rates.get((g["path"], p["slot"], p["pid"]))
            table.add_row(Text(g["name"], style="bold") if first else "", devs,
                          str(p["pid"]) + ("" if p["alive"] else " (dead)"), human(used), "", "",
                          f"{rate:,.0f}" if rate is not None else "…",
                          str(p["oom_refusals"]) if p["oom_refusals"] else "", "")
            first = False
        if first:
            table.add_row(g["name"], "", "", "", "", "", "", "", "")
        table.add_section()
    parts: list = [table if groups else Text(f"no groups under {st.R.runtime_dir()}")]
    latest = sorted(((e, g["name"]) for g in groups for e in g["events"]), key=lambda x: x[0]["time_ns"])[-8:]
    if latest:
        parts.append(Text("latest events", style="bold"))
        parts.extend(Text(f"  {name}: {st.event_text(e)}") for e, name in latest)
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[bool]:
    """cbreak mode on a terminal stdin, so a single q is read without Enter; yields whether keys can be read."""
    if not sys.stdin.isatty():
        yield False
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_for_q(seconds: float, keys: bool) -> bool:
    """Wait up to ``seconds``; True if q was pressed."""
    if not keys:
        time.sleep(seconds)
        return False
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if ready and os.read(sys.stdin.fileno(), 32).lower().find(b"q") >= 0:
            return True
    return False


def run(group: str | None = None, region_path: str | None = None, interval: float = 1.0, once: bool = False,
        console: Console | None = None) -> None:
    console = console or Console()
    before = take(group, region_path)
    if once:  # one frame, with rates over one interval: for scripts and captures
        time.sleep(interval)
        console.print(render(take(group, region_path), before))
        return
    try:
        with _keys() as keys, Live(render(before, None), console=console, screen=False, auto_refresh=False) as live:
            while not _wait_for_q(interval, keys):
                now = take(group, region_path)
                live.update(render(now, before), refresh=True)
                before = now
    except KeyboardInterrupt:
        pass
