"""Render deploy/grafana/pyvgpu-dashboard.json with matplotlib, from recorded scrapes (no Grafana needed).

    python deploy/grafana/render.py SCRAPES.jsonl.gz OUT.png [DASHBOARD.json]

SCRAPES is what record_fake_run.py writes: one {"t", "text"} per scrape. Each
panel's queries are evaluated at every scrape by a small evaluator of the PromQL
the dashboard uses (selectors with =, !=, =~, !~; rate and increase over a range;
sum and count, optionally by labels; a number times an expression; `and on(labels)`), laid out on
Grafana's 24-column grid. It is a rendering of the dashboard's panels from the
same data Prometheus would hold, not a Grafana screenshot: styling differs.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset  # of (name, value)
Vector = dict  # Labels -> float

# --- the data: one {sample name: {labels: value}} per scrape ------------------------------------------


def load(path: Path) -> tuple[list[float], list[dict[str, Vector]]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    times, snaps = [], []
    with opener(path, "rt") as f:
        for line in f:
            s = json.loads(line)
            snap: dict[str, Vector] = defaultdict(dict)
            for fam in text_string_to_metric_families(s["text"]):
                for smp in fam.samples:
                    snap[smp.name][Labels(smp.labels.items())] = smp.value
            times.append(s["t"])
            snaps.append(snap)
    return times, snaps


# --- a small PromQL ------------------------------------------------------------------------------------

TOKEN = re.compile(r'\s*(?:(?P<num>\d+(?:\.\d+)?)(?![a-zA-Z_])|(?P<dur>\[\s*[^\]]+\])|(?P<str>"(?:[^"\\]|\\.)*")'
                   r'|(?P<op>=~|!~|!=|=|[(){},*])|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*))')


def tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot read {text[pos:]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class Parser:
    """expr := product ('and' 'on' labels product)?; product := term ('*' term)?;
    term := NUMBER | agg | func | selector | '(' expr ')'."""

    def __init__(self, text: str, variables: dict[str, str]):
        for k, v in variables.items():
            text = text.replace(f"${k}", v)
        self.t = tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.t[self.i]
        if value is not None and tok[1] != value:
            raise ValueError(f"expected {value!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def expr(self):
        left = self.product()
        if self.peek() == ("name", "and"):
            self.take()
            self.take("on")
            on = self.labels()
            return ("and", on, left, self.product())
        return left

    def product(self):
        left = self.term()
        if self.peek() == ("op", "*"):
            self.take("*")
            right = self.term()
            return ("mul", left, right)
        return left

    def term(self):
        kind, value = self.peek()
        if kind == "num":
            self.take()
            return ("num", float(value))
        if value == "(":
            self.take("(")
            e = self.expr()
            self.take(")")
            return e
        if value in ("sum", "count"):
            self.take()
            by = None
            if self.peek() == ("name", "by"):
                self.take()
                by = self.labels()
            self.take("(")
            e = self.expr()
            self.take(")")
            if self.peek() == ("name", "by"):
                self.take()
                by = self.labels()
            return ("agg", value, by, e)
        if value in ("rate", "increase"):
            self.take()
            self.take("(")
            sel = self.selector()
            dur = self.take()[1]
            self.take(")")
            return ("range", value, sel, seconds(dur.strip("[] ")))
        return self.selector()

    def labels(self) -> list[str]:
        self.take("(")
        out = []
        while self.peek()[1] != ")":
            out.append(self.take()[1])
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return out

    def selector(self):
        name = self.take()[1]
        matchers = []
        if self.peek() and self.peek()[1] == "{":
            self.take("{")
            while self.peek()[1] != "}":
                label, op, value = self.take()[1], self.take()[1], json.loads(self.take()[1])
                matchers.append((label, op, value))
                if self.peek()[1] == ",":
                    self.take(",")
            self.take("}")
        return ("sel", name, matchers)


def seconds(d: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", d)
    if not m:
        raise ValueError(f"duration {d!r}")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def matches(labels: Labels, matchers) -> bool:
    d = dict(labels)
    for label, op, value in matchers:
        have = d.get(label, "")
        ok = {"=": have == value, "!=": have != value, "=~": re.fullmatch(value, have) is not None,
              "!~": re.fullmatch(value, have) is None}[op]
        if not ok:
            return False
    return True


def select(snap: dict[str, Vector], sel) -> Vector:
    _, name, matchers = sel
    return {lab: v for lab, v in snap.get(name, {}).items() if matches(lab, matchers)}


def evaluate(node, i: int, times: list[float], snaps: list[dict[str, Vector]]) -> Vector | float:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "sel":
        return {lab: v for lab, v in select(snaps[i], node).items()}
    if kind == "mul":
        a, b = evaluate(node[1], i, times, snaps), evaluate(node[2], i, times, snaps)
        if isinstance(a, float):
            a, b = b, a
        return {lab: v * b for lab, v in a.items()} if isinstance(a, dict) else a * b
    if kind == "and":  # the left's elements whose `on` labels some element of the right has
        _, on, left, right = node
        a, b = evaluate(left, i, times, snaps), evaluate(right, i, times, snaps)
        have = {Labels(x for x in lab if x[0] in on) for lab in b}
        return {lab: v for lab, v in a.items() if Labels(x for x in lab if x[0] in on) in have}
    if kind == "range":
        _, fn, sel, window = node
        points: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        for j in range(i, -1, -1):
            if times[i] - times[j] > window:
                break
            for lab, v in select(snaps[j], sel).items():
                points[lab].append((times[j], v))
        out = {}
        for lab, pts in points.items():
            if len(pts) < 2:
                continue
            pts.reverse()
            inc = sum(b - a if b >= a else b for (_, a), (_, b) in zip(pts, pts[1:], strict=False))  # a reset restarts
            span = pts[-1][0] - pts[0][0]
            if span <= 0:
                continue
            # as Prometheus: extrapolate to the window's edges, but at most half an interval past the samples
            half = span / (len(pts) - 1) / 2
            covered = span + min(pts[0][0] - (times[i] - window), half) + min(times[i] - pts[-1][0], half)
            increase = inc * covered / span
            out[_drop_name(lab)] = increase / window if fn == "rate" else increase
        return out
    if kind == "agg":
        _, op, by, e = node
        vec = evaluate(e, i, times, snaps)
        groups: dict[Labels, list[float]] = defaultdict(list)
        for lab, v in vec.items():
            key = Labels((k, val) for k, val in lab if by is not None and k in by)
            groups[key].append(v)
        return {k: (sum(vs) if op == "sum" else float(len(vs))) for k, vs in groups.items()}
    raise ValueError(kind)


def _drop_name(lab: Labels) -> Labels:
    return Labels(x for x in lab if x[0] != "__name__")


def series(expr: str, times, snaps, variables) -> dict[Labels, list[float | None]]:
    node = Parser(expr, variables).expr()
    out: dict[Labels, list[float | None]] = {}
    for i in range(len(times)):
        vec = evaluate(node, i, times, snaps)
        for lab, v in (vec.items() if isinstance(vec, dict) else [(Labels(), vec)]):
            out.setdefault(lab, [None] * len(times))[i] = v
    return out


def legend(fmt: str, lab: Labels) -> str:
    d = dict(lab)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt) if fmt else (
        "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(d.items())) + "}")


# --- drawing --------------------------------------------------------------------------------------------

BG, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d",
          "#fade2a", "#c4162a", "#1f60c4"]


def fmt_value(v: float, unit: str) -> str:
    if unit == "bytes":
        for name, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if abs(v) >= 1 << shift:
                return f"{v / (1 << shift):.3g} {name}"
        return f"{v:.0f} B"
    if unit == "percent":
        return f"{v:.0f}%"
    if unit == "percentunit":
        return f"{100 * v:.0f}%"
    if unit == "ops":
        return f"{v:.3g} ops/s"
    return f"{v:.4g}"


def render(dashboard: dict, times: list[float], snaps: list[dict[str, Vector]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    variables = {"node": ".*", "instance": ".*", "group": ".*", "__rate_interval": "4s", "datasource": "prometheus"}
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    unit_px, row_px = 1600 / 24, 30
    fig = plt.figure(figsize=(16, (rows * row_px + 60) / 100), dpi=100, facecolor=BG)
    when = [datetime.fromtimestamp(t) for t in times]
    fig.text(0.01, 1 - 14 / (rows * row_px + 60), f"{dashboard['title']}  ·  rendered from "
             "deploy/grafana/pyvgpu-dashboard.json with matplotlib, not a Grafana screenshot  ·  "
             f"{when[0]:%Y-%m-%d %H:%M:%S} to {when[-1]:%H:%M:%S}, {len(times)} scrapes of a run on the fake driver",
             color=TEXT, fontsize=10, va="center")
    H = rows * row_px + 60
    for p in dashboard["panels"]:
        g = p["gridPos"]
        left, width = g["x"] * unit_px / 1600 + 0.004, g["w"] * unit_px / 1600 - 0.008
        top = 1 - (40 + g["y"] * row_px) / H
        height = g["h"] * row_px / H - 0.012
        unit = p["fieldConfig"]["defaults"].get("unit", "none")
        frame = fig.add_axes((left, top - height, width, height), facecolor=PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for s in frame.spines.values():
            s.set_color(GRID)
        frame.set_title(p["title"], color=TEXT, fontsize=9, loc="left", pad=3)
        drawn = [(t, series(t["expr"], times, snaps, variables)) for t in p["targets"]]
        if p["type"] == "stat":
            t, ser = drawn[0]
            last = [(lab, next((v for v in reversed(vals) if v is not None), None)) for lab, vals in ser.items()]
            if p["options"].get("textMode") == "name":
                text = ", ".join(legend(t.get("legendFormat", ""), lab) for lab, _ in last) or "No data"
            else:
                decimals = p["fieldConfig"]["defaults"].get("decimals")
                text = ", ".join(f"{v:.{decimals}f}" if decimals is not None and unit in ("none", "short")
                                 else fmt_value(v, unit) for _, v in last if v is not None) or "No data"
            frame.text(0.5, 0.45, text, color="#5794f2", fontsize=22, ha="center", va="center",
                       transform=frame.transAxes, fontweight="bold")
            continue
        n_series = sum(len(ser) for _, ser in drawn)
        cols = max(1, int(g["w"] * unit_px // 230))
        legend_px = 12 * -(-n_series // cols) + 10 if n_series else 0
        pw, ph = g["w"] * unit_px, g["h"] * row_px  # the panel, in pixels; the plot leaves room for the
        ax = fig.add_axes((left + 64 / 1600, top - height + (24 + legend_px) / H,  # ticks, title and legend
                           width - 74 / 1600, height - (24 + legend_px + 26) / H), facecolor=PANEL)
        del pw, ph
        ax.tick_params(colors=TEXT, labelsize=7)
        for s in ax.spines.values():
            s.set_color(GRID)
        ax.grid(color=GRID, linewidth=0.5)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, u=unit: fmt_value(v, u)))
        if unit == "bytes":
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 4, 8, 10]))  # set again below in MiB
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        stack = p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        k = 0
        base = [0.0] * len(times)
        any_data = False
        for t, ser in drawn:
            for lab, vals in sorted(ser.items(), key=lambda x: legend(t.get("legendFormat", ""), x[0])):
                color = COLORS[k % len(COLORS)]
                k += 1
                ys = [float("nan") if v is None else v for v in vals]
                any_data = any_data or any(v is not None for v in vals)
                name = legend(t.get("legendFormat", ""), lab)
                dashed = "cap" in name or "share" in name
                if stack:
                    top_ = [b + (0 if y != y else y) for b, y in zip(base, ys, strict=True)]
                    ax.fill_between(when, base, top_, color=color, alpha=0.4, linewidth=0)
                    ax.plot(when, top_, color=color, linewidth=1.2, label=name)
                    base = top_
                else:
                    ax.plot(when, ys, color=color, linewidth=1.2 if dashed else 1.8, label=name,
                            linestyle="--" if dashed else "-")
        if not any_data:
            ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes, fontsize=9)
        empty = [t["expr"] for t, ser in drawn if not ser]
        if empty and any_data:  # Grafana shows nothing for a query without data; say so here
            ax.text(0.99, 0.97, "no data: " + ", ".join(e.split("{")[0].split(" ")[0] for e in empty),
                    color=TEXT, ha="right", va="top", transform=ax.transAxes, fontsize=7, alpha=0.8)
        ax.set_ylim(bottom=0)
        if unit == "bytes":
            top_v = ax.get_ylim()[1]
            step = 1 << 20
            while top_v / step > 5:
                step *= 2
            ax.yaxis.set_major_locator(MultipleLocator(step))
        if any_data:
            leg = ax.legend(loc="upper left", bbox_to_anchor=(-64 / (g["w"] * unit_px), -26 / (g["h"] * row_px)),
                            fontsize=6.5, frameon=False, labelcolor=TEXT, ncol=cols, handlelength=1.5,
                            columnspacing=1.0, borderaxespad=0)
            for line in leg.get_lines():
                line.set_linewidth(2)
    fig.savefig(out, facecolor=BG)
    print(f"wrote {out}")


def main() -> None:
    scrapes, out = Path(sys.argv[1]), Path(sys.argv[2])
    dash = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).with_name("pyvgpu-dashboard.json")
    times, snaps = load(scrapes)
    render(json.loads(dash.read_text()), times, snaps, out)


if __name__ == "__main__":
    main()
