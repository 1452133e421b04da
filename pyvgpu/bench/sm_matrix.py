"""`pyvgpu bench matrix`: the workload matrix of issue 27 (item 7) as one markdown table and one PNG.

Each workload runs through `bench sm` (pyvgpu.bench.sm.run, in this process) in a few scenarios; each
scenario's full result goes to ``DIR/<workload>-<scenario>.json`` as soon as it finishes, so a run cut short
keeps what it did and ``--skip-done`` goes on from there; ``--repeat N`` runs every scenario N times
(``DIR/<workload>-<scenario>-r<k>.json`` from the second on). Rendering reads the JSONs back and places each
run by what it is (its kind, target and mode), not by its file name: any `bench sm` JSON in the folder
fills the cells it measured, and a cell nothing measured stays '-'. A cell measured several times shows its
median run (by throughput; the lower middle of an even count), whole, and the spread of all: a launch-bound
load's neighbour cell read 0.71 and 1.27 x time-sliced in two 6 s runs of one tree (docs/compute.md), which
one run cannot show.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pyvgpu.bench.sm import DRIFT_WARN, GOAL_POINTS
from pyvgpu.errors import PyvgpuError

DEFAULT_WORKLOADS = ("spin", "matmul", "mlp", "decode")
TWO_GPU_WORKLOADS = ("allreduce", "tp-decode")
ALONE = (30, 50, 70)
MISS_POINTS = GOAL_POINTS  # a share this far from its target is flagged in the notes (bench sm's goal)
DRIFT_NOTE = DRIFT_WARN  # the raw rate's change between the first and the last baseline worth a note (bench sm's)
LAUNCH_BOUND_NVML = 50.0  # unlimited, a workload keeping the GPU busy less than this is bound by its launches
BETTER_POINTS = 2.0  # a pair's summed throughput shares this much higher elsewhere is "better" (not noise)
GATED_NOTE = 90.0  # alone, a run whose launch timings were gated less often than this (%) is noted
OVERCHARGE_NOTE = 1.5  # alone, a run whose raw estimate a launch is this many times NVML's busy time is noted
MAX_REPEAT = 10
# (file name part, bench sm arguments)
SCENARIOS: tuple[tuple[str, dict], ...] = (
    ("main", {"targets": "30,50,70", "pair": "50,50", "sliced": True, "neighbour": "unlimited",
              "neighbour_share": 50}),
    ("3070", {"targets": "", "pair": "30,70", "sliced": True}),
)
MPS_SCENARIOS: tuple[tuple[str, dict], ...] = (
    ("mps", {"targets": "", "pair": "50,50", "mode": "mps"}),
)
PAIRS = ("50/50", "30/70")
WAYS = ("turns", "sliced", "mps")


def gpu_count() -> int:
    """GPUs NVML sees (0 without NVML)."""
    from pyvgpu.host import devices

    gpus = devices.machine()
    return 0 if gpus is None else len(gpus)


def pick_workloads(text: str | None, gpus: int) -> list[str]:
    """The workloads to run: ``text`` (comma-separated), or the default for a machine of ``gpus`` GPUs."""
    from pyvgpu.bench.sm import WORKLOADS

    if text is None:
        return list(DEFAULT_WORKLOADS) + (list(TWO_GPU_WORKLOADS) if gpus >= 2 else [])
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise PyvgpuError(f"--workloads {text!r} names no workload: give some of {', '.join(WORKLOADS)}")
    for n in names:
        if n not in WORKLOADS:
            raise PyvgpuError(f"--workloads: {n!r} is not one of {', '.join(WORKLOADS)}")
        if n in TWO_GPU_WORKLOADS and gpus < 2:
            raise PyvgpuError(f"--workloads: {n!r} needs 2 GPUs and this machine has {gpus}: leave it out or "
                              "run on a machine with two")
    return names


def run(workloads: list[str], out_dir: Path, seconds: float = 8.0, mps: bool = False, skip_done: bool = False,
        bench: Callable[..., dict] | None = None, say: Callable[[str], None] = print, repeat: int = 1) -> list[Path]:
    """Run every workload's scenarios ``repeat`` times (each round whole before the next, so a call cut short
    has every scenario once before any twice), each written to ``out_dir`` when it finishes; the files
    written."""
    if not 1 <= repeat <= MAX_REPEAT:
        raise PyvgpuError(f"--repeat {repeat}: give 1 to {MAX_REPEAT} runs a scenario")
    if bench is None:
        from pyvgpu.bench import sm

        bench = sm.run
    out_dir.mkdir(parents=True, exist_ok=True)
    written, failed, gave_up = [], [], set()
    rounds = [(k, w, name, kw) for k in range(1, repeat + 1) for w in workloads
              for name, kw in SCENARIOS + (MPS_SCENARIOS if mps else ())]
    for k, w, name, kw in rounds:
        path = out_dir / (f"{w}-{name}.json" if k == 1 else f"{w}-{name}-r{k}.json")
        if (w, name) in gave_up:
            continue  # it failed in an earlier round: its cause (no PyTorch, no MPS) has not gone away
        if skip_done and path.exists():
            say(f"{path}: done before, skipped")
            continue
        say(f"bench sm --workload {w} ({name}{f', run {k} of {repeat}' if repeat > 1 else ''}) ...")
        try:
            result = bench(workload=w, seconds=seconds, png=None, **kw)
        except PyvgpuError as e:  # one load that cannot run (no PyTorch, no MPS) leaves the others their turn
            say(f"{path.name}: failed: {e}")
            failed.append(f"{path.stem} ({e})")
            gave_up.add((w, name))
            continue
        tmp = path.with_suffix(".part")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(path)  # whole or absent: a cut-off write leaves no half file for --skip-done
        written.append(path)
        say(f"{path}: written")
    if failed:
        raise PyvgpuError(f"{len(failed)} scenario(s) failed: {'; '.join(failed)}; the others are in {out_dir} "
                          "(fix the cause, then run again with --skip-done)")
    return written


def load(dir_: Path) -> list[dict]:
    """Every `bench sm` result in ``dir_`` (name order)."""
    if not dir_.is_dir():
        raise PyvgpuError(f"--from {dir_}: not a folder; give the --output-dir of `pyvgpu bench matrix`")
    out = []
    for p in sorted(dir_.glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise PyvgpuError(f"{p}: not readable JSON ({e}); remove it or run that scenario again") from None
        if isinstance(d, dict) and d.get("bench") == "sm" and isinstance(d.get("runs"), list):
            out.append(d)
    if not out:
        raise PyvgpuError(f"--from {dir_}: holds no `bench sm` JSON; run `pyvgpu bench matrix --output-dir "
                          f"{dir_}` first")
    return out


def _pair_key(runs: list[dict]) -> str | None:
    ts = sorted(r["target"] for r in runs)
    key = f"{ts[0]}/{ts[1]}" if len(ts) == 2 else None
    return key if key in PAIRS else None


def _scenario_name(res: dict) -> str:
    """A short name of what a result ran, for the notes (its file name is not kept)."""
    if res.get("mode") == "mps":
        return "MPS"
    kinds = {r["kind"] for r in res["runs"]}
    if "single" in kinds or "neighbour" in kinds:
        return "alone/neighbour runs"
    return "pair runs"


def collect(results: list[dict]) -> dict:
    """The matrix's cells by workload, each the list of what every result measured there (in file order)."""
    m: dict[str, dict] = {}
    for res in results:
        cells = m.setdefault(res["workload"], {"alone": {}, "pairs": {}, "neighbours": [], "drift": {},
                                               "unlimited_nvml": None})
        mps = res.get("mode") == "mps"
        if isinstance(res.get("baseline_drift"), int | float):  # the largest of a scenario's repeats
            name, d = _scenario_name(res), res["baseline_drift"]
            if abs(d) >= abs(cells["drift"].get(name, 0.0)):
                cells["drift"][name] = d
        nvml = res.get("unlimited_time_share_nvml")
        if isinstance(nvml, int | float) and not mps:  # MPS's own server changes what NVML sees
            cells["unlimited_nvml"] = nvml if cells["unlimited_nvml"] is None else max(cells["unlimited_nvml"], nvml)
        runs = res["runs"]
        if not mps:
            for r in runs:
                if r["kind"] == "single" and r["target"] is not None:
                    cells["alone"].setdefault(r["target"], []).append(r)
        for kind, way in (("pair", "mps" if mps else "turns"), ("pair-sliced", "sliced")):
            rs = sorted((r for r in runs if r["kind"] == kind), key=lambda r: r["target"])
            key = _pair_key(rs) if len(rs) == 2 else None
            if key and not (mps and kind == "pair-sliced"):
                cells["pairs"].setdefault((key, way), []).append(rs)
        pairs = {}
        for kind in ("neighbour", "neighbour-sliced"):
            a = [r for r in runs if r["kind"] == kind]
            b = [r for r in runs if r["kind"] == f"{kind}-unlimited"]
            pairs[kind] = (a[0], b[0]) if a and b else None
        if pairs["neighbour"] and not mps:  # both from one result: one run's pair never meets another's
            cells["neighbours"].append((pairs["neighbour"], pairs["neighbour-sliced"]))
    return m


def _middle(items: list, key: Callable) -> tuple:
    """The median item by ``key`` (the lower middle of an even count), and the lowest and highest key."""
    s = sorted(items, key=key)
    return s[(len(s) - 1) // 2], key(s[0]), key(s[-1])


def _together(rs) -> float:
    return sum(r["achieved"] for r in rs)


def _ratio(item: tuple) -> float | None:
    """What a neighbour pair made together against the same two time-sliced (None without that run)."""
    n, sliced = item
    base = _together(sliced) if sliced else 0.0
    return _together(n) / base if base > 0 else None


def medians(cells: dict) -> dict:
    """A workload's cells with one run each: the median run of a cell measured several times, whole (its
    charged and NVML figures are that run's own), so the notes and the plot read one run per cell."""
    out = dict(cells)
    out["alone"] = {t: _middle(rs, lambda r: r["achieved"])[0] for t, rs in cells["alone"].items()}
    out["pairs"] = {k: _middle(v, _together)[0] for k, v in cells["pairs"].items()}
    out["neighbour"], out["neighbour_sliced"] = (
        _middle(cells["neighbours"], lambda x: _together(x[0]))[0] if cells["neighbours"] else (None, None))
    return out


def _spread(n: int, lo: float, hi: float, what: str = "") -> str:
    return f" [{n} runs{what}: {lo:.1f}-{hi:.1f}]" if n > 1 else ""


def _f(x: float | None) -> str:
    return f"{x:.1f}" if isinstance(x, int | float) else "-"


def _alone_cell(runs: list[dict] | None) -> str:
    if not runs:
        return "-"
    r, lo, hi = _middle(runs, lambda r: r["achieved"])
    return f"{_f(r['achieved'])} ({_f(r.get('time_share_nvml'))}/{_f(r.get('time_share_charged'))})" + \
        _spread(len(runs), lo, hi)


def _pair_cell(runs: list[list[dict]] | None, way: str) -> str:
    if not runs:
        return "-"
    rs, lo, hi = _middle(runs, _together)
    cell = " / ".join(_f(r["achieved"]) for r in rs)
    if way == "turns":  # charged time per group; NVML sees only the device as a whole
        cell += " (c " + "/".join(_f(r.get("time_share_charged")) for r in rs) + ")"
    return cell + _spread(len(runs), lo, hi, ", together")


def _neighbour_cell(items: list[tuple]) -> str:
    """`share, neighbour`, and with a time-sliced run of the same two, what they made together against it
    (issue 27 item 4 asks 0.90 or more); measured several times, the median run by what the two made, and
    the spread of that and of the ratio."""
    if not items:
        return "-"
    (n, sliced), lo, hi = _middle(items, lambda x: _together(x[0]))
    cell = f"{_f(n[0]['achieved'])}, neighbour {_f(n[1]['achieved'])}"
    ratio = _ratio((n, sliced))
    if ratio is not None:
        cell += f" ({ratio:.2f} x time-sliced: {_f(sliced[0]['achieved'])}, {_f(sliced[1]['achieved'])})"
    cell += _spread(len(items), lo, hi, ", together")
    ratios = sorted(r for r in map(_ratio, items) if r is not None)
    if len(ratios) > 1:
        cell += f" [{len(ratios)} ratios: {ratios[0]:.2f}-{ratios[-1]:.2f} x]"
    return cell


def _gated(run: dict) -> float | None:
    """The share of a run's launch timings taken behind the timing gate (%), None if it timed none."""
    timed = run.get("timed") or {}
    n = sum(timed.values())
    return 100 * timed["gated"] / n if n else None


def _demand(alone: dict) -> float | None:
    """The GPU time (%) a workload's alone runs were charged per 100% of its unlimited throughput, their median:
    a time share below it slows the workload to share / demand; one above it is a cap its demand stays under."""
    ds = sorted(100 * r["time_share_charged"] / r["achieved"] for r in alone.values()
                if r.get("time_share_charged") and r.get("achieved"))
    return ds[(len(ds) - 1) // 2] if ds else None


def _allowed(target: float, demand: float | None) -> float:
    """The throughput (% of unlimited) a time share of target allows a workload of that demand."""
    return target if not demand else min(100.0, 100 * target / demand)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _notes(cells: dict) -> list[str]:
    """A workload's notes, from its cells' median runs (``medians``); the drift note gives the largest drift
    of a scenario's repeats (a warning is about the worst run)."""
    notes = []
    nvml = cells["unlimited_nvml"]
    if nvml is not None and nvml < LAUNCH_BOUND_NVML:
        notes.append(f"launch-bound (unlimited NVML busy {nvml:.0f}%): the shares are caps its demand stays "
                     "under, so throughput near 100 is expected")
    demand = _demand(cells["alone"])
    misses = [f"{t} {r['achieved']:.1f} against {_allowed(t, demand):.1f}" for t, r in sorted(cells["alone"].items())
              if abs(r["achieved"] - _allowed(t, demand)) > MISS_POINTS]
    if misses:
        why = (f" (min(100, share / {demand:.1f}): its runs were charged {demand:.1f}% of the GPU's time at full "
               "throughput)" if demand is not None else "")
        notes.append(f"alone, throughput misses what its share allows{why} by > {MISS_POINTS:g} points: "
                     f"{', '.join(misses)}")
    gated = [t for t in (_gated(r) for r in cells["alone"].values()) if t is not None]
    if gated and min(gated) < GATED_NOTE:
        notes.append(f"launch timings gated in {min(gated):.0f}-{max(gated):.0f}% of the alone runs (ungated "
                     "timings of small kernels hold the launch path: the controller's scale then corrects them)")
    over = [(t, c) for t, c in ((t, r.get("cost") or {}) for t, r in sorted(cells["alone"].items()))
            if c.get("raw_us") and c.get("nvml_us") and c["raw_us"] > OVERCHARGE_NOTE * c["nvml_us"]]
    if over:  # the figures that tell why (sm_run.cost_figures)
        notes.append("alone, charged more than the GPU was busy (us a launch: raw estimate / gated timing / NVML "
                     "busy; launches at the mean timing): " + ", ".join(
                         f"{t} {c['raw_us']:.1f} / {_us(c.get('gated_timing_us'))} / {c['nvml_us']:.1f}; "
                         f"{100 * (c.get('at_mean') or 0):.0f}% at {_us(c.get('at_mean_us'))}" for t, c in over))
    drifts = [f"{d * 100:+.0f}% ({name})" for name, d in sorted(cells["drift"].items()) if abs(d) > DRIFT_NOTE]
    if drifts:
        notes.append(f"raw rate drifted {', '.join(drifts)}")
    for key in PAIRS:
        turns = cells["pairs"].get((key, "turns"))
        if turns is None:
            continue
        base = sum(r["achieved"] for r in turns)
        for way, name in (("sliced", "time slicing"), ("mps", "MPS")):
            other = cells["pairs"].get((key, way))
            if other is not None and sum(r["achieved"] for r in other) > base + BETTER_POINTS:
                notes.append(f"{name} does better at {key} (sum {sum(r['achieved'] for r in other):.1f} against "
                             f"{base:.1f} taking turns)")
    return notes


def _title(results: list[dict]) -> str:
    machines = sorted({r["machine"].get("gpu", "?") for r in results})
    secs = sorted({r["seconds"] for r in results})
    two = [w for w in TWO_GPU_WORKLOADS if any(r["workload"] == w for r in results)]
    where = f" ({' and '.join(two)} on two of them)" if two else ""  # the JSON names one GPU, not how many
    return f"Workload matrix on {'; '.join(machines)}{where}, {' / '.join(f'{s:g}' for s in secs)} s a run"


def _header(results: list[dict], commit: str) -> str:
    return f"{_title(results)}, commit {commit}."


LEGEND = ("Cells: throughput in % of the workload's unlimited throughput. Alone: `share (NVML/charged)`, the "
          "time share NVML saw and the turns' charged GPU time. Pairs: `group 1 / group 2`, taking turns with "
          "`(c a/b)` each group's charged time share. Neighbour: `share, neighbour` (together against the same two "
          "time-sliced). A cell measured several times: its median run, then `[n runs: lowest-highest]` (pairs "
          "and neighbours: of the two together). '-': not measured.")


def _ordered(m: dict) -> list[str]:
    """The workloads in bench sm's order (unknown names last)."""
    from pyvgpu.bench.sm import WORKLOADS

    return sorted(m, key=lambda w: WORKLOADS.index(w) if w in WORKLOADS else len(WORKLOADS))


def render(results: list[dict], commit: str = "unknown", mps: bool | None = None) -> str:
    """The matrix as one markdown table (a header line, then the table)."""
    m = collect(results)
    if mps is None:  # the MPS 50/50 column always; 30/70 under MPS only where a run measured it
        mps = any(key == "30/70" and way == "mps" for c in m.values() for (key, way) in c["pairs"])
    cells_ = [(key, way) for key in PAIRS for way in WAYS[:2]] + [("50/50", "mps")]
    if mps:
        cells_.append(("30/70", "mps"))
    cols = [f"alone {t}" for t in ALONE]
    cols += [f"{key} {'taking turns' if w == 'turns' else 'time-sliced'}" for key, w in cells_ if w != "mps"]
    cols += [f"MPS {key}" for key, w in cells_ if w == "mps"]
    cols += ["50 beside an unlimited neighbour", "notes"]
    lines = [_header(results, commit), "", LEGEND, "", "| workload | " + " | ".join(cols) + " |",
             "| --- " * (len(cols) + 1) + "|"]
    for w in _ordered(m):
        c = m[w]
        row = [_alone_cell(c["alone"].get(t)) for t in ALONE]
        row += [_pair_cell(c["pairs"].get((key, way)), way) for key, way in cells_]
        row.append(_neighbour_cell(c["neighbours"]))
        row.append("; ".join(_notes(medians(c))) or "-")
        lines.append(f"| {w} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def need_matplotlib() -> None:
    """Fail before any run when the PNG cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PyvgpuError("the matrix PNG needs matplotlib: pip install 'pyvgpu[bench]' (or pass --png '' to "
                          "skip it)") from None


def plot(results: list[dict], png: Path, commit: str = "unknown") -> None:
    """One figure, a panel per workload: achieved share per run (bars) against its target (black ticks)."""
    need_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = collect(results)
    colours = {"alone": "tab:blue", "turns": "tab:orange", "sliced": "tab:green", "mps": "tab:purple",
               "neighbour": "tab:red"}
    n = len(m)
    ncols = min(n, 3)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4 * nrows), squeeze=False)
    for ax, w in zip(axes.flat, _ordered(m), strict=False):
        c = medians(m[w])  # a cell measured several times: its median run
        bars: list[tuple[str, float, float | None, str]] = []  # label, achieved, target, colour
        bars += [(f"A{t}", r["achieved"], t, colours["alone"]) for t, r in sorted(c["alone"].items())]
        for key in PAIRS:
            for way in WAYS:
                bars += [(f"{way[0].upper()}{r['target']}", r["achieved"], r["target"], colours[way])
                         for r in c["pairs"].get((key, way)) or []]
        if c["neighbour"]:
            a, b = c["neighbour"]
            bars += [("N50", a["achieved"], 50, colours["neighbour"]),
                     ("Nu", b["achieved"], None, colours["neighbour"])]
        xs = range(len(bars))
        ax.bar(xs, [b[1] for b in bars], color=[b[3] for b in bars])
        ax.plot([x for x, b in zip(xs, bars, strict=True) if b[2] is not None],
                [b[2] for b in bars if b[2] is not None], "k_", ms=14, mew=2)
        ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=7)
        ax.set_ylim(0, max([110.0] + [b[1] * 1.08 for b in bars]))  # a launch-bound load passes 100
        ax.set_title(w)
        ax.set_ylabel("% of unlimited throughput")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=v) for v in colours.values()]
    fig.legend(handles + [plt.Line2D([], [], color="k", marker="_", ls="", ms=14, mew=2)],
               ["alone (A)", "pair taking turns (T)", "pair time-sliced (S)", "pair under MPS (M)",
                "50 beside unlimited (N50, Nu)", "target"], loc="lower center", ncol=6, fontsize=8)
    fig.suptitle(f"{_title(results)}, commit {commit}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(png, dpi=100)
    plt.close(fig)


def read_commit(*dirs: Path) -> str:
    """The tree's commit from a ``.commit`` file in the first of ``dirs`` that has one (never git: a tarball
    has none), or 'unknown'."""
    for d in dirs:
        try:
            text = (d / ".commit").read_text().strip()
        except OSError:
            continue
        if text:
            return text.split()[0][:40]
    return "unknown"


def render_dir(dir_: Path, commit: str, png: Path | None) -> dict:
    """Write DIR/matrix.md (and the PNG) from the JSONs in ``dir_``; the matrix as a dict."""
    results = load(dir_)
    if png is not None:
        plot(results, png, commit)
    md = render(results, commit)
    (dir_ / "matrix.md").write_text(md + "\n")
    return {"bench": "matrix", "commit": commit, "table": md, "markdown": str(dir_ / "matrix.md"),
            "png": None if png is None else str(png), "files": len(results)}
