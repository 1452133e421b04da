"""`pyvgpu bench matrix`: the workload matrix rendered from bench sm JSONs (CPU only: no run needs a GPU).

The fixtures in tests/data/matrix are real `bench sm` results (two H100s), with their long curve and
controller arrays dropped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyvgpu.bench import sm_matrix as matrix
from pyvgpu.bench import sm_run
from pyvgpu.errors import PyvgpuError

DATA = Path(__file__).parent / "data" / "matrix"
PYVGPU = [sys.executable, "-m", "pyvgpu"]


def rows(md: str) -> dict[str, dict[str, str]]:
    """The table's cells by workload and column name."""
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[0]] = dict(zip(head, cells, strict=True))
    return out


@pytest.fixture
def results() -> list[dict]:
    return matrix.load(DATA)


def test_cells_come_from_the_runs_they_name(results):
    t = rows(matrix.render(results, "abc123"))
    ar = t["allreduce"]
    assert ar["alone 30"] == "31.2 (67.8/30.2)"  # throughput (t NVML / charged)
    assert ar["alone 50"] == "51.8 (70.9/49.9)"
    assert ar["50/50 taking turns"] == "27.7 / 25.1 (c 26.4/25.1)"
    assert ar["50 beside an unlimited neighbour"] == "28.1, neighbour 16.8"
    d = t["decode"]
    assert d["30/70 taking turns"] == "52.8 / 39.8 (c 21.5/10.6)"
    assert d["30/70 time-sliced"] == "81.0 / 50.0"
    assert t["tp-decode"]["50/50 time-sliced"] == "22.9 / 1.5"


def test_what_no_run_measured_is_a_dash(results):
    t = rows(matrix.render(results))
    assert t["allreduce"]["alone 70"] == "-"  # its alone run went to 90, not 70
    assert t["allreduce"]["30/70 taking turns"] == "-"
    assert t["decode"]["alone 30"] == "-" and t["decode"]["50 beside an unlimited neighbour"] == "-"
    assert t["decode"]["MPS 50/50"] == "-"  # no MPS run: the column stays, dashed
    assert "MPS 30/70" not in t["decode"]  # 30/70 under MPS only where a run measured it


def test_the_header_names_machine_seconds_and_commit(results):
    head = matrix.render(results, "abc123").splitlines()[0]
    assert "NVIDIA H100 80GB HBM3, 580.159.04 (allreduce and tp-decode on two of them)" in head
    assert "8 s a run" in head and "commit abc123" in head
    assert "two of them" not in matrix.render(matrix.load(H200)).splitlines()[0]  # one GPU's workloads only


def test_notes_flag_a_miss_and_where_time_slicing_does_better(results):
    t = rows(matrix.render(results))
    notes = t["decode"]["notes"]
    assert "time slicing does better at 30/70 (sum 130.9 against 92.6 taking turns)" in notes
    assert "misses" not in notes  # a pair's miss is in its cells; the notes flag misses alone
    # tp-decode alone at 50: 76.3% throughput charged 51.8% of the GPU's time: its demand at full throughput is
    # 67.9%, so a 50% share allows 73.6%: held at its share, not a miss (76.3 against 50 was noted before)
    assert "misses" not in t["tp-decode"]["notes"]
    short = json.loads((DATA / "tp-decode-main.json").read_text())
    for r in short["runs"]:
        if r["kind"] == "single":
            r["time_share_charged"] = 30.0  # held at 30% of the GPU's time under a 50% share
    assert ("alone, throughput misses what its share allows (min(100, share / 39.3): its runs were charged 39.3% "
            "of the GPU's time at full throughput) by > 5 points: 50 76.3 against 100.0"
            in rows(matrix.render([short]))["tp-decode"]["notes"])
    # allreduce: alone within 5 points, and no time-sliced 50/50 run to compare with
    ar = t["allreduce"]["notes"]
    assert "alone" not in ar and "does better" not in ar


def test_a_pair_within_its_target_and_ahead_of_time_slicing_has_no_note():
    res = json.loads((DATA / "decode-3070.json").read_text())
    res["unlimited_time_share_nvml"], res["baseline_drift"] = 90.0, 0.01  # busy, steady: those notes neither
    for r in res["runs"]:
        r["achieved"] = {("pair", 30): 31.0, ("pair", 70): 68.0, ("pair-sliced", 30): 30.0,
                         ("pair-sliced", 70): 69.0}[(r["kind"], r["target"])]
    assert rows(matrix.render([res]))["decode"]["notes"] == "-"


def test_mps_pairs_get_columns_and_a_note_where_mps_does_better():
    base = json.loads((DATA / "decode-3070.json").read_text())
    mps = json.loads(json.dumps(base))
    mps["mode"] = "mps"
    mps["runs"] = [dict(r, achieved=r["achieved"] + 20) for r in mps["runs"] if r["kind"] == "pair"]
    t = rows(matrix.render([base, mps]))
    assert t["decode"]["MPS 30/70"] == "72.8 / 59.8"
    assert t["decode"]["MPS 50/50"] == "-"
    assert "MPS does better at 30/70 (sum 132.6 against 92.6 taking turns)" in t["decode"]["notes"]


def test_run_writes_each_scenario_as_it_finishes_and_skip_done_skips_it(tmp_path):
    calls, cut = [], [3]  # the third call runs out of time

    def fake_bench(**kw):
        calls.append(kw)
        if len(calls) == cut[0]:
            raise PyvgpuError("out of time")
        return {"bench": "sm", "workload": kw["workload"], "runs": [], "machine": {"gpu": "x"}, "seconds": 8}

    with pytest.raises(PyvgpuError, match=r"1 scenario\(s\) failed: mlp-main \(out of time\).*--skip-done"):
        matrix.run(["spin", "mlp"], tmp_path, mps=False, bench=fake_bench, say=lambda s: None)
    # the failed one leaves no file; the scenarios after it still ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp-3070.json", "spin-3070.json", "spin-main.json"]
    assert calls[0] == {"workload": "spin", "seconds": 8.0, "png": None, **dict(matrix.SCENARIOS)["main"]}
    calls.clear()
    cut[0] = 0
    matrix.run(["spin", "mlp"], tmp_path, skip_done=True, mps=True, bench=fake_bench, say=lambda s: None)
    assert [(c["workload"], c.get("mode", "hami-core"), c["pair"]) for c in calls] == [
        ("spin", "mps", "50,50"), ("mlp", "hami-core", "50,50"), ("mlp", "mps", "50,50")]
    assert not any(c.get("sliced") for c in calls if c.get("mode") == "mps")  # bench sm refuses that mix


def test_workloads_default_by_gpu_count_and_refuse_bad_names():
    assert matrix.pick_workloads(None, 1) == ["spin", "matmul", "mlp", "decode"]
    assert matrix.pick_workloads(None, 2)[-2:] == ["allreduce", "tp-decode"]
    assert matrix.pick_workloads("decode, allreduce", 2) == ["decode", "allreduce"]
    with pytest.raises(PyvgpuError, match=r"--workloads: 'dekode' is not one of spin, graph"):
        matrix.pick_workloads("dekode", 2)
    with pytest.raises(PyvgpuError, match=r"'allreduce' needs 2 GPUs and this machine has 1: leave it out"):
        matrix.pick_workloads("mlp,allreduce", 1)


def test_commit_comes_from_a_commit_file_never_git(tmp_path):
    assert matrix.read_commit(tmp_path) == "unknown"
    (tmp_path / ".commit").write_text("53b6aee\n")
    assert matrix.read_commit(tmp_path) == "53b6aee"


def test_the_png_without_matplotlib_names_the_fix(results, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PyvgpuError, match=r"pip install 'pyvgpu\[bench\]' \(or pass --png ''"):
        matrix.plot(results, tmp_path / "m.png")


def test_the_png_is_drawn(results, tmp_path):
    pytest.importorskip("matplotlib")
    matrix.plot(results, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*PYVGPU, "bench", "matrix", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_renders_a_folder_into_matrix_md(tmp_path):
    d = tmp_path / "runs"
    shutil.copytree(DATA, d)
    (tmp_path / ".commit").write_text("feed123\n")
    p = cli("--from", str(d), "--png", "", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    md = (d / "matrix.md").read_text()
    assert "commit feed123" in md and md.strip() == p.stdout.strip()
    assert rows(md)["allreduce"]["alone 30"] == "31.2 (67.8/30.2)"
    assert not (d / "matrix.png").exists()


@pytest.mark.parametrize("args,message", [
    (["--from", "EMPTY", "--png", ""], "holds no `bench sm` JSON; run `pyvgpu bench matrix --output-dir"),
    (["--png", ""], "give --output-dir DIR (where the runs go) or --from DIR"),
    (["--output-dir", "EMPTY", "--workloads", "dekode", "--png", ""], "--workloads: 'dekode' is not one of"),
])
def test_cli_errors_name_the_input_and_the_fix(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    p = cli(*[str(tmp_path / "empty") if a == "EMPTY" else a for a in args], cwd=tmp_path)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_every_scenario_binds_to_bench_sm_run():
    """The arguments each scenario passes are bench sm's own (a renamed one would fail on the GPU only)."""
    import inspect

    from pyvgpu.bench import sm

    sig = inspect.signature(sm.run)
    for _, kw in matrix.SCENARIOS + matrix.MPS_SCENARIOS:
        sig.bind(workload="spin", seconds=8.0, png=None, **kw)
        assert not (kw.get("mode") == "mps" and kw.get("sliced"))  # sm.run refuses --sliced with --mode mps


H200 = Path(__file__).parent / "data" / "matrix-h200"  # real runs on one H200 (6 s a run), trimmed likewise


def test_h200_runs_fill_the_brief_columns_and_mps_50_50():
    t = rows(matrix.render(matrix.load(H200), "bc64d46"))
    mlp, dec = t["mlp"], t["decode"]
    assert mlp["alone 30"] == "75.0 (21.8/29.9)"
    assert mlp["50/50 taking turns"] == "108.3 / 107.3 (c 38.7/38.0)"
    assert mlp["30/70 time-sliced"] == "75.2 / 103.2"
    assert mlp["MPS 50/50"] == "89.6 / 84.1"
    assert mlp["50 beside an unlimited neighbour"] == "132.1, neighbour 94.0"
    assert dec["MPS 50/50"] == "109.3 / 103.1"
    assert dec["30/70 taking turns"] == "-"  # decode-3070.json is not among these fixtures


def test_h200_notes_launch_bound_drift_and_mps_ahead():
    t = rows(matrix.render(matrix.load(H200)))
    dec = t["decode"]["notes"]
    assert "launch-bound (unlimited NVML busy 16%)" in dec  # unlimited_time_share_nvml 16.07
    assert "raw rate drifted -8% (MPS), +14% (alone/neighbour runs)" in dec  # baseline_drift -0.084, 0.144
    assert "MPS does better at 50/50 (sum 212.3 against 134.7 taking turns)" in dec
    mlp = t["mlp"]["notes"]
    assert "launch-bound (unlimited NVML busy 33%)" in mlp  # the larger of 29.2 (main) and 3070's
    assert "drifted" not in mlp  # mlp's drifts are within 5%
    assert "MPS does better" not in mlp  # 173.7 under MPS against 215.6 taking turns


def test_a_busy_workload_is_not_called_launch_bound():
    res = json.loads((H200 / "mlp-main.json").read_text())
    res["unlimited_time_share_nvml"] = 97.0
    assert "launch-bound" not in rows(matrix.render([res]))["mlp"]["notes"]


def test_commit_from_the_folder_first(tmp_path):
    d = tmp_path / "runs"
    shutil.copytree(H200, d)
    (d / ".commit").write_text("aaa111\n")
    (tmp_path / ".commit").write_text("bbb222\n")
    p = cli("--from", str(d), "--png", "", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].endswith("commit aaa111.")


def test_the_neighbour_is_judged_against_the_same_two_time_sliced():
    """`bench sm --sliced --neighbour unlimited` runs the neighbour pair once more time-sliced; the cell then
    says what the two made together against it (issue 27 item 4: 0.90 or more)."""
    res = [r for r in matrix.load(H200) if r["workload"] == "mlp"]
    main = next(r for r in res if any(x["kind"] == "neighbour" for x in r["runs"]))
    for kind, achieved in (("neighbour-sliced", 90.0), ("neighbour-sliced-unlimited", 110.0)):
        base = next(x for x in main["runs"] if x["kind"] == kind.replace("-sliced", ""))
        main["runs"].append({**base, "kind": kind, "achieved": achieved})
    cell = rows(matrix.render(res))["mlp"]["50 beside an unlimited neighbour"]
    assert cell == "132.1, neighbour 94.0 (1.13 x time-sliced: 90.0, 110.0)"  # (132.1 + 94.0) / 200


def test_a_later_neighbour_run_is_not_judged_against_an_earlier_time_sliced_one():
    """Each result's neighbour pair is judged against its own time-sliced run: the median run here has none,
    so the cell gives no ratio, never one run's pair over another run's time-sliced one."""
    res = [r for r in matrix.load(H200) if r["workload"] == "mlp"]
    main = next(r for r in res if any(x["kind"] == "neighbour" for x in r["runs"]))
    later = json.loads(json.dumps(main))
    for kind, achieved in (("neighbour-sliced", 90.0), ("neighbour-sliced-unlimited", 110.0)):
        base = next(x for x in main["runs"] if x["kind"] == kind.replace("-sliced", ""))
        main["runs"].append({**base, "kind": kind, "achieved": achieved})
    next(x for x in later["runs"] if x["kind"] == "neighbour")["achieved"] = 50.0
    cell = rows(matrix.render([*res, later]))["mlp"]["50 beside an unlimited neighbour"]
    assert cell == "50.0, neighbour 94.0 [2 runs, together: 144.0-226.1]", cell


def _scaled(res: dict, by: float) -> dict:
    """A copy of a result whose runs made ``by`` times the throughput (charged figures kept)."""
    out = json.loads(json.dumps(res))
    for r in out["runs"]:
        r["achieved"] = round(r["achieved"] * by, 3)
    return out


def test_a_cell_measured_several_times_shows_its_median_run_and_the_spread():
    """A launch-bound load's neighbour cell read 0.71 and 1.27 x time-sliced in two runs of one tree: repeats
    show the median run whole (its own charged figures) and the spread of what the pair made together."""
    base = json.loads((DATA / "decode-3070.json").read_text())
    low, high = _scaled(base, 0.5), _scaled(base, 1.5)
    for r in high["runs"]:
        r["time_share_charged"] = 99.0  # the highest run's own figure must not leak into the median's cell
    t = rows(matrix.render([high, base, low]))["decode"]
    assert t["30/70 taking turns"] == "52.8 / 39.8 (c 21.5/10.6) [3 runs, together: 46.3-138.9]"
    assert t["30/70 time-sliced"] == "81.0 / 50.0 [3 runs, together: 65.5-196.4]"
    assert rows(matrix.render([base]))["decode"]["30/70 taking turns"] == "52.8 / 39.8 (c 21.5/10.6)"  # once: as before
    # an even count gives the lower middle: a share is never reported above what half its runs got
    assert rows(matrix.render([high, low]))["decode"]["30/70 time-sliced"].startswith("40.5 / 25.0 [2 runs")


def test_repeated_alone_runs_and_neighbour_ratios_show_their_spread():
    res = [r for r in matrix.load(H200) if r["workload"] == "mlp"]
    main = next(r for r in res if any(x["kind"] == "neighbour" for x in r["runs"]))
    for kind, achieved in (("neighbour-sliced", 90.0), ("neighbour-sliced-unlimited", 110.0)):
        base = next(x for x in main["runs"] if x["kind"] == kind.replace("-sliced", ""))
        main["runs"].append({**base, "kind": kind, "achieved": achieved})
    again = _scaled(main, 0.5)
    for r in again["runs"]:  # its time-sliced pair made less than half: a ratio of its own
        if r["kind"].startswith("neighbour-sliced"):
            r["achieved"] = r["achieved"] * 0.8
    t = rows(matrix.render([main, again]))["mlp"]
    # the lower middle of two: the second run, judged against its own time-sliced pair (36 + 44)
    assert t["50 beside an unlimited neighbour"] == ("66.0, neighbour 47.0 (1.41 x time-sliced: 36.0, 44.0) "
                                                     "[2 runs, together: 113.0-226.1] [2 ratios: 1.13-1.41 x]")
    first = next(r["achieved"] for r in main["runs"] if r["kind"] == "single" and r["target"] == 50)
    second = next(r["achieved"] for r in again["runs"] if r["kind"] == "single" and r["target"] == 50)
    assert t["alone 50"].startswith(f"{min(first, second):.1f} (")
    assert t["alone 50"].endswith(f"[2 runs: {min(first, second):.1f}-{max(first, second):.1f}]")


def test_notes_read_the_median_run():
    """A miss alone is noted from the median run, not from whichever file came last."""
    base = json.loads((DATA / "tp-decode-main.json").read_text())
    for r in base["runs"]:
        if r["kind"] == "single":
            r["time_share_charged"] = 30.0  # held at 30% of the GPU's time under a 50% share (76.3%): a miss
    near = json.loads(json.dumps(base))
    for r in near["runs"]:
        if r["kind"] == "single":
            r["achieved"] = 50.0  # charged its share, at a throughput in proportion: demand 100%
            r["time_share_charged"] = 50.0
    # the odd one last: the last file decided before, the median decides now
    notes = rows(matrix.render([near, json.loads(json.dumps(near)), base]))["tp-decode"]["notes"]
    assert "misses" not in notes, notes
    assert "misses what its share allows" in rows(matrix.render([base, json.loads(json.dumps(base)), near])
                                                  )["tp-decode"]["notes"]


def test_run_repeats_every_scenario_round_by_round(tmp_path):
    calls = []

    def fake_bench(**kw):
        calls.append((kw["workload"], kw["pair"]))
        return {"bench": "sm", "workload": kw["workload"], "runs": [], "machine": {"gpu": "x"}, "seconds": 8}

    matrix.run(["spin", "mlp"], tmp_path, repeat=2, bench=fake_bench, say=lambda s: None)
    # every scenario once before any twice: a call cut short keeps a whole first round
    assert calls == [("spin", "50,50"), ("spin", "30,70"), ("mlp", "50,50"), ("mlp", "30,70")] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mlp-3070-r2.json", "mlp-3070.json", "mlp-main-r2.json", "mlp-main.json",
        "spin-3070-r2.json", "spin-3070.json", "spin-main-r2.json", "spin-main.json"]
    calls.clear()
    (tmp_path / "mlp-main-r2.json").unlink()
    matrix.run(["spin", "mlp"], tmp_path, repeat=2, skip_done=True, bench=fake_bench, say=lambda s: None)
    assert calls == [("mlp", "50,50")]
    with pytest.raises(PyvgpuError, match=r"--repeat 0: give 1 to 10"):
        matrix.run(["spin"], tmp_path, repeat=0, bench=fake_bench)


def test_a_scenario_that_cannot_run_is_not_tried_again_each_round(tmp_path):
    calls = []

    def fake_bench(**kw):
        calls.append((kw["workload"], kw.get("mode", "hami-core")))
        if kw.get("mode") == "mps":
            raise PyvgpuError("no MPS here")
        return {"bench": "sm", "workload": kw["workload"], "runs": [], "machine": {"gpu": "x"}, "seconds": 8}

    with pytest.raises(PyvgpuError, match=r"1 scenario\(s\) failed: spin-mps \(no MPS here\)"):
        matrix.run(["spin"], tmp_path, repeat=3, mps=True, bench=fake_bench, say=lambda s: None)
    assert calls.count(("spin", "mps")) == 1 and calls.count(("spin", "hami-core")) == 6


def test_cli_refuses_a_repeat_out_of_range(tmp_path):
    """The option's bound is the runner's (MAX_REPEAT): the highest passes to the runner, one more does not."""
    over = subprocess.run([*PYVGPU, "bench", "matrix", "--output-dir", str(tmp_path), "--repeat",
                           str(matrix.MAX_REPEAT + 1)], capture_output=True, text=True)
    assert over.returncode == 2 and "--repeat" in over.stderr and str(matrix.MAX_REPEAT) in over.stderr, over.stderr
    top = subprocess.run([*PYVGPU, "bench", "matrix", "--output-dir", str(tmp_path), "--render-only", "--png", "",
                          "--repeat", str(matrix.MAX_REPEAT)], capture_output=True, text=True)
    assert "--repeat" not in top.stderr and "holds no `bench sm` JSON" in top.stderr, top.stderr


def test_alone_runs_whose_timings_went_ungated_are_noted():
    """A run's launch timings by how they were taken (the group's sm_timed): mostly ungated, its charges hold
    the launch path, which the notes say; runs from before the count (no "timed") and gated ones say nothing."""
    base = json.loads((H200 / "decode-main.json").read_text())
    assert "gated" not in rows(matrix.render([base]))["decode"]["notes"]
    for r in base["runs"]:
        if r["kind"] == "single":
            g = 30 if r["target"] == 30 else 95
            r["timed"] = {"gated": g, "first_in_context": 5, "gate_off": 95 - g, "watcher_late": 0, "no_gate": 0,
                          "wait_refused": 0}
    notes = rows(matrix.render([base]))["decode"]["notes"]
    assert "launch timings gated in 30-95% of the alone runs" in notes, notes
    for r in base["runs"]:
        if r["kind"] == "single":
            r["timed"]["gated"] = 1000
    assert "gated" not in rows(matrix.render([base]))["decode"]["notes"]


def test_alone_runs_charged_above_the_gpus_busy_time_say_why():
    """A run's cost figures (sm_run.cost_figures, from the group's region between two samples): what a launch
    was charged raw, what its gated timings read, the GPU's busy time a launch, and the launches charged the
    mean. An alone run charged far above NVML is noted with them (decode on two H200s: charged ~30 x its busy
    time with every timing gated, and no figure said whether timings or estimates ran long)."""
    # 10 000 launches in 1 s: 300 ms raw (30 us a launch), 9 000 us of gated timings over 3 000 (3 us),
    # 2 000 launches at the mean (100 us each), the GPU 5% busy (5 us a launch)
    a = (1000, 10**8, 100, 10**6, 10**6, 100, 2 * 10**6, 150)
    b = (11000, 4 * 10**8, 2100, 2 * 10**8 + 10**6, 10**7, 3100, 1.2 * 10**7, 3150)
    c = sm_run.cost_figures(a, b, 1e9, 5.0)
    assert c["launches_per_s"] == 10000 and c["raw_us"] == 30.0 and c["gated_timing_us"] == 3.0, c
    assert c["at_mean"] == 0.2 and c["at_mean_us"] == 100.0 and c["nvml_us"] == 5.0 and c["timings"] == 3000, c
    assert sm_run.cost_figures(a, a, 1e9, None)["raw_us"] is None  # no launch in the window: no figure
    base = json.loads((H200 / "decode-main.json").read_text())
    for r in base["runs"]:
        if r["kind"] == "single":
            r["cost"] = dict(c) if r["target"] == 30 else dict(c, raw_us=6.0)
    notes = rows(matrix.render([base]))["decode"]["notes"]
    assert "alone, charged more than the GPU was busy (us a launch: raw estimate / gated timing / NVML busy; " \
           "launches at the mean timing): 30 30.0 / 3.0 / 5.0; 20% at 100.0" in notes, notes
    assert "50 6.0" not in notes and "70 6.0" not in notes  # 1.2 x NVML: not noted
