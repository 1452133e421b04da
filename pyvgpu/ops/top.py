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
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pyvgpu.ops import status as st

Snapshot = tuple[float, list[dict]]


def take(group: str | None = None, region_path: Path | str | None = None) -> Snapshot:
    return time.monotonic(), st.collect(group=group, region_path=region_path)


def short(n: int) -> str:
    """Bytes in at most 5 characters, binary units: 0, 512, 3.0K, 64M, 1.7G, 16G (as `numfmt --to=iec`)."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.1f}{unit}" if v < 10 and n % (1 << shift) else f"{v:.0f}{unit}"
    return str(n)


def _launches(groups: list[dict]) -> dict[tuple[str, int, int], int]:
    return {(g["path"], p["slot"], p["pid"]): p["launches"] for g in groups for p in g["processes"]}


def _share(sm: dict) -> str:
    """The group's use / its share: 31/30%; a share not enforced (the switch is off) in brackets: 31/(30%)."""
    if not sm["limit_percent"]:
        return "-"
    mine = sm["group_utilization_percent"]
    shown = f"{mine:.0f}" if mine is not None else "?"
    share = f"{sm['limit_percent']}%"
    return f"{shown}/{share}" if sm["enforced"] else f"{shown}/({share})"


def _count(n: float) -> str:
    """A count or rate in at most 6 characters: 1,234  12k  1.2M."""
    if n < 10_000:
        return f"{n:,.0f}"
    if n < 1_000_000:
        return f"{n / 1000:.0f}k"
    return f"{n / 1e6:.1f}M" if n < 10e6 else f"{n / 1e6:.0f}M"


def _seconds(s: float) -> str:
    """A duration in at most 6 characters: 12.3s  1234s  123m  12h."""
    if s < 100:
        return f"{s:.1f}s"
    if s < 10_000:
        return f"{s:.0f}s"
    return f"{s / 60:.0f}m" if s < 360_000 else f"{s / 3600:.0f}h"


def render(now: Snapshot, before: Snapshot | None) -> Group:
    """The table (and the latest events) for one refresh."""
    t, groups = now
    rates: dict[tuple[str, int, int], float] = {}
    if before is not None and t > before[0]:
        old = _launches(before[1])
        for key, n in _launches(groups).items():
            if key in old and n >= old[key]:
                rates[key] = (n - old[key]) / (t - before[0])
    # Fits 80 columns: short headers and values (at most the widths below, 69 in all), no vertical rules,
    # one space between columns. Only a group name longer than 12 characters is cut.
    table = Table(title=f"pyvgpu top  {time.strftime('%H:%M:%S')}  (q or Ctrl-C quits)", title_justify="left",
                  expand=False, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1),
                  pad_edge=False, collapse_padding=True)
    for col, just, width in (("group", "left", 12), ("dev", "right", 5), ("pid", "right", 8),
                             ("used/limit", "right", 11), ("SM/share", "right", 10), ("util", "right", 4),
                             ("launch/s", "right", 8), ("OOM", "right", 5), ("held", "right", 6)):
        table.add_column(col, justify=just, min_width=len(col), max_width=width, no_wrap=True,  # type: ignore
                         overflow="ellipsis")
    for g in groups:
        first = True
        label = g["name"] if g["mode"] == "hami-core" else f"{g['name']} ({g['mode']})"
        for d in g["devices"]:
            sm = d["sm"]
            gpu = next((x for x in g["gpus"] or [] if x["index"] == d["index"]), None)
            dev = f"{d['index']}" + (f"=g{gpu['nvml_index']}" if gpu else "")
            limit = short(d["limit"]) if d["limit"] else "none"
            util = f"{sm['utilization_percent']:.0f}%" if sm["utilization_percent"] is not None else "-"
            table.add_row(Text(label, style="bold") if first else "", dev, "", f"{short(d['used'])}/{limit}",
                          _share(sm), util, "", _count(d["oom_refusals"]) if d["oom_refusals"] else "",
                          _seconds(sm["throttled_s"]) if sm["limit_percent"] else "")
            first = False
        for p in g["processes"]:
            used = sum(sum(k.values()) for k in p["devices"].values())
            devs = ",".join(p["devices"]) or "-"
            rate = rates.get((g["path"], p["slot"], p["pid"]))
            table.add_row(Text(label, style="bold") if first else "", devs,
                          str(p["pid"]) + ("" if p["alive"] else "!"), short(used), "", "",
                          _count(rate) if rate is not None else "…",
                          _count(p["oom_refusals"]) if p["oom_refusals"] else "", "")
            first = False
        if first:
            table.add_row(label, "", "", "", "", "", "", "", "")
        table.add_section()
    parts: list = [table if groups else Text(f"no groups under {st.R.runtime_dir()}")]
    if groups:
        # two lines under 80 columns: a legend that wraps moves every refresh of a live view down a line
        parts.append(Text("dev: the group's device (=gN: the machine's GPU N); pid!: dead; held: time its\n"
                          "launches waited; SM/share: its use and share of the GPU's time, (30%) when off",
                          style="dim", no_wrap=True, overflow="ellipsis"))
    latest = sorted(((e, g["name"]) for g in groups for e in g["events"]), key=lambda x: x[0]["time_ns"])[-8:]
    if latest:
        parts.append(Text("latest events", style="bold"))
        parts.extend(Text(f"  {name}: {st.event_text(e)}", no_wrap=True, overflow="ellipsis") for e, name in latest)
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


def run(group: str | None = None, region_path: Path | str | None = None, interval: float = 1.0, once: bool = False,
        console: Console | None = None) -> None:
    console = console or Console()
    before = take(group, region_path)
    if once:  # one frame, with rates over one interval: for scripts and captures
        time.sleep(interval)
        console.print(render(take(group, region_path), before))
        return
    if not console.is_terminal:  # piped or logged: a frame per interval, one after the other (as `top -b`)
        try:
            while True:
                time.sleep(interval)
                now = take(group, region_path)
                console.print(render(now, before))
                console.file.flush()
                before = now
        except (KeyboardInterrupt, BrokenPipeError):
            return
    try:
        with _keys() as keys, Live(render(before, None), console=console, screen=False, auto_refresh=False) as live:
            while not _wait_for_q(interval, keys):
                now = take(group, region_path)
                live.update(render(now, before), refresh=True)
                before = now
    except KeyboardInterrupt:
        pass
