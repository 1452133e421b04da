"""`pyvgpu bench ...`: benchmarks that print figures, raw against wrapped, measured in one run (a sub-app).

Each command imports its benchmark (pyvgpu/bench/) when it runs. What each load and figure is: docs/manual.md
("Benchmarks") and docs/compute.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pyvgpu.cli.common import AsJson, Choice, Mode, Output, PriorityPair, check_of, choice, emit, fail, priority_pair

bench_app = typer.Typer(help="Benchmarks that print figures, raw against wrapped, measured in one run.",
                        no_args_is_help=True, rich_markup_mode=None)


class SmWorkload(Choice):
    """`bench sm`'s loads (pyvgpu.bench.sm.WORKLOADS, in its order)."""

    spin = "spin"
    graph = "graph"
    matmul = "matmul"
    mlp = "mlp"
    decode = "decode"
    allreduce = "allreduce"
    tp_decode = "tp-decode"


class Neighbour(Choice):
    """What runs beside a wrapped group in `bench sm` (pyvgpu.bench.sm.NEIGHBOURS)."""

    none = "none"
    unlimited = "unlimited"


class VpmmWorkload(Choice):
    """`bench vpmm`'s runs: the trace, real loops (pyvgpu.bench.vpmm_workloads.WORKLOADS), or all of them."""

    trace = "trace"
    decode = "decode"
    train = "train"
    all = "all"


N = "N"  # the placeholder of a count


@bench_app.command("overhead")
def bench_overhead(
    rounds: Annotated[int, typer.Option("--rounds", min=1, metavar=N, help="Alternating raw/wrapped rounds.")] = 5,
    samples: Annotated[int, typer.Option("--samples", min=10, metavar=N,
                                         help="Timed batches per side per round.")] = 1000,
    size: Annotated[int, typer.Option("--size", min=1, metavar="BYTES", help="Bytes per cuMemAlloc.")] = 2 << 20,
    memory: Annotated[str | None, typer.Option("--memory", metavar="SIZE",
                                               help="Run the wrapped side under this cap.")] = None,
    sm: Annotated[str | None, typer.Option("--sm", metavar="PCT",
                                           help="Run the wrapped side under this compute share.")] = None,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """Host time of an empty-kernel cuLaunchKernel and a cuMemAlloc+cuMemFree, raw and wrapped."""
    from pyvgpu.bench import overhead

    result = overhead.run(rounds=rounds, samples=samples, size=size, memory=memory, sm=sm)
    emit(result, overhead.table(result), as_json, output)


@bench_app.command("startup")
def bench_startup(
    runs: Annotated[int, typer.Option("--runs", min=1, metavar=N, help="Runs per case.")] = 5,
    python: Annotated[list[Path] | None, typer.Option("--python", metavar="PATH",
                                                      help="Another interpreter to time as a host "
                                                           "(repeatable).")] = None,
    concurrent: Annotated[int, typer.Option("--concurrent", min=0, metavar=N,
                                            help="Instead, start N `pyvgpu wrap --group` at once and time "
                                                 "them.")] = 0,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """Time to the first CUDA call per host kind: raw, wrapped, started as a container, with an empty cache
    (or, with --concurrent N, N wraps at once in one group)."""
    if concurrent:
        from pyvgpu.bench import wraps

        result = wraps.run(concurrent=concurrent, runs=runs)
        emit(result, wraps.table(result), as_json, output)
        return
    from pyvgpu.bench import startup

    result = startup.run(runs=runs, pythons=[str(p) for p in python or []])
    emit(result, startup.table(result), as_json, output)


@bench_app.command("sm")
def bench_sm(
    targets: Annotated[str, typer.Option("--targets", metavar="PCT,...",
                                         help="Compute shares to run alone, comma-separated ('' for "
                                              "none).")] = "10,30,50,70,90",
    seconds: Annotated[float, typer.Option("--seconds", min=2.0, metavar="SECONDS",
                                           help="Length of each run; the first third is warm-up.")] = 8.0,
    workload: Annotated[SmWorkload, choice(SmWorkload, "--workload",
                                           help="The load (docs/compute.md; allreduce and tp-decode need 2 "
                                                "GPUs).")] = SmWorkload.spin,
    pair: Annotated[str, typer.Option("--pair", metavar="PCT,PCT",
                                      help="Shares of the two groups run at once ('' to skip).")] = "30,70",
    sliced: Annotated[bool, typer.Option("--sliced", help="Run the pair and the neighbour once more "
                                                          "time-sliced, to compare.")] = False,
    priorities: Annotated[PriorityPair | None, typer.Option("--priorities", metavar="PRIO,PRIO",
                                                            parser=priority_pair,
                                                            help="Priorities of the pair's two groups, e.g. "
                                                                 "high,low.")] = None,
    neighbour: Annotated[Neighbour, choice(Neighbour, "--neighbour",
                                           help="Also run a group beside an unlimited wrapped "
                                                "neighbour.")] = Neighbour.none,
    neighbour_share: Annotated[int, typer.Option("--neighbour-share", min=1, max=99, metavar="PCT",
                                                 help="The share of the group beside the unlimited "
                                                      "neighbour.")] = 50,
    burst: Annotated[bool, typer.Option("--burst", help="Also run a borrowing group alone, then beside a "
                                                        "neighbour.")] = False,
    burst_share: Annotated[int, typer.Option("--burst-share", min=1, max=99, metavar="PCT",
                                             help="The share of the borrowing group in --burst.")] = 30,
    png: Annotated[str, typer.Option("--png", metavar="PATH",
                                     help="Where to write the plot ('' for none).")] = "bench-sm.png",
    mode: Annotated[Mode, choice(Mode, "--mode", check=check_of("pyvgpu.ops.wrap", "check_mode"),
                                 help="Who enforces the shares: pyvgpu or NVIDIA MPS.")] = Mode.hami_core,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """Achieved compute share at each target, alone and as two groups: throughput share (throughput /
    unlimited throughput) and time share (NVML, and the turns' own accounting).

    Also plots achieved against target and the controller's time series (needs matplotlib:
    pip install 'pyvgpu[bench]').
    """
    from pyvgpu.bench import sm as bench

    result = bench.run(targets=targets, seconds=seconds, workload=workload.value, pair=pair,
                       png=Path(png) if png else None, neighbour=neighbour.value, neighbour_share=neighbour_share,
                       sliced=sliced, priorities=None if priorities is None else str(priorities), burst=burst,
                       burst_share=burst_share, mode=mode.value)
    emit(result, bench.table(result), as_json, output)


@bench_app.command("matrix")
def bench_matrix(
    workloads: Annotated[str | None, typer.Option("--workloads", metavar="NAME,...",
                                                  help="Workloads of bench sm to run (default spin,matmul,mlp,"
                                                       "decode, plus allreduce,tp-decode on 2+ GPUs).")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", metavar="DIR",
                                                    help="Where each scenario's JSON and the matrix go.")] = None,
    seconds: Annotated[float, typer.Option("--seconds", min=2.0, metavar="SECONDS",
                                           help="Length of each run; the first third is warm-up.")] = 8.0,
    mps: Annotated[bool, typer.Option("--mps", help="Also run the 50/50 pair under NVIDIA MPS.")] = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, max=10, metavar="N",
                                        help="Run every scenario N times; a cell shows its median run and the "
                                             "spread.")] = 1,
    skip_done: Annotated[bool, typer.Option("--skip-done", help="Skip scenarios whose JSON is already in "
                                                                "DIR.")] = False,
    render_only: Annotated[bool, typer.Option("--render-only", help="Run nothing: render the JSONs in "
                                                                    "--output-dir.")] = False,
    from_dir: Annotated[Path | None, typer.Option("--from", metavar="DIR",
                                                  help="Run nothing: render the JSONs in DIR.")] = None,
    png: Annotated[str, typer.Option("--png", metavar="PATH",
                                     help="Where to write the plot (default DIR/matrix.png; '' for none).")]
    = "matrix.png",
    commit: Annotated[str | None, typer.Option("--commit", metavar="REV",
                                               help="The commit in the header (default: .commit in DIR or here).")]
    = None,
    as_json: AsJson = False,
) -> None:
    """The workload matrix (issue 27): each workload alone at 30/50/70, as 50/50 and 30/70 pairs taking turns
    and time-sliced, and beside an unlimited neighbour, as one markdown table (DIR/matrix.md) and one PNG
    (needs matplotlib: pip install 'pyvgpu[bench]')."""
    from pyvgpu.bench import sm_matrix as matrix
    from pyvgpu.errors import PyvgpuError

    dir_ = from_dir or output_dir
    if dir_ is None:
        raise fail("give --output-dir DIR (where the runs go) or --from DIR (to render earlier runs)")
    png_path = None if not png else Path(png) if "/" in png else dir_ / png
    if png_path is not None:
        matrix.need_matplotlib()
    failed = None
    if from_dir is None and not render_only:
        names = matrix.pick_workloads(workloads, matrix.gpu_count())
        try:
            matrix.run(names, dir_, seconds=seconds, mps=mps, skip_done=skip_done, repeat=repeat,
                       say=lambda line: typer.echo(line, err=True))
        except PyvgpuError as e:  # render what the other scenarios measured, then fail
            failed = e
    try:
        result = matrix.render_dir(dir_, commit or matrix.read_commit(dir_, Path.cwd()), png_path)
    except PyvgpuError:
        if failed is not None:  # nothing ran at all: the runs' failure is the one to tell
            raise failed from None
        raise
    emit(result, result["table"], as_json, None)
    if failed is not None:
        raise failed


@bench_app.command("latency")
def bench_latency(
    seconds: Annotated[float, typer.Option("--seconds", min=5.0, metavar="SECONDS",
                                           help="How long requests arrive in each scenario.")] = 30.0,
    rate: Annotated[float, typer.Option("--rate", min=0.01, metavar="PER_S",
                                        help="Requests a second, arriving at random.")] = 4.0,
    tokens: Annotated[int, typer.Option("--tokens", min=1, metavar=N,
                                        help="New tokens a request generates.")] = 16,
    train_sm: Annotated[int, typer.Option("--train-sm", min=1, max=99, metavar="PCT",
                                          help="The training loop's share in the pyvgpu scenario.")] = 50,
    service_sm: Annotated[int, typer.Option("--service-sm", min=1, max=99, metavar="PCT",
                                            help="The service's share in the pyvgpu scenario.")] = 50,
    borrow: Annotated[bool, typer.Option("--sm-borrow/--sm-cap",
                                         help="Let the training loop use idle GPU time beyond its share, or "
                                              "cap it there.")] = True,
    scenarios: Annotated[str, typer.Option("--scenarios", metavar="NAME,...",
                                           help="Stacked scenarios to run: sliced, pyvgpu, mps.")]
    = "sliced,pyvgpu,mps",
    seed: Annotated[int, typer.Option("--seed", metavar=N, help="Seed of the arrival times.")] = 0,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """A decode service (--priority high) beside a training loop: the service's p50/p99 latency alone and
    stacked, under pyvgpu, time slicing and MPS, and what the training loop keeps (needs PyTorch,
    transformers and a GPU)."""
    from pyvgpu.bench import latency as bench

    names = tuple(n.strip() for n in scenarios.split(",") if n.strip())
    result = bench.run(seconds=seconds, rate=rate, tokens=tokens, train_sm=train_sm, borrow=borrow,
                       scenarios=names, seed=seed, service_sm=service_sm)
    emit(result, bench.table(result), as_json, output)


@bench_app.command("vpmm")
def bench_vpmm(
    steps: Annotated[int, typer.Option("--steps", min=10, metavar=N,
                                       help="Decoding steps of the trace (4 interleaved requests).")] = 600,
    cap: Annotated[str | None, typer.Option("--cap", metavar="SIZE", help="Run every allocator under `--memory "
                                                                          "SIZE`, to count refusals.")] = None,
    page_size: Annotated[str | None, typer.Option("--page-size", metavar="SIZE",
                                                  help="VPMM's page (VPMM_PAGE_SIZE; default 2M).")] = None,
    direct: Annotated[bool, typer.Option("--direct", help="Replay the trace on a VPMM pool in this process, "
                                                          "without PyTorch.")] = False,
    workload: Annotated[VpmmWorkload, choice(VpmmWorkload, "--workload",
                                             check=check_of("pyvgpu.bench.vpmm_workloads", "check_workload"),
                                             help="The trace, or real decode or train loops (all: "
                                                  "each).")] = VpmmWorkload.trace,
    seconds: Annotated[float, typer.Option("--seconds", min=1.0, metavar="SECONDS",
                                           help="Length of each decode/train run.")] = 16.0,
    rounds: Annotated[int, typer.Option("--rounds", min=1, metavar=N,
                                        help="Runs per allocator for decode/train, taking turns.")] = 2,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """A fragmenting trace (inference with growing sequences) under PyTorch's caching allocator,
    expandable_segments and VPMM: peak live, peak reserved, refused requests, ops/s, VPMM's driver calls per
    operation (needs PyTorch and a GPU; --direct needs neither). --workload decode|train runs real loops
    instead: throughput and peak reserved per allocator."""
    from pyvgpu.bench import vpmm as bench

    if direct and cap is not None:
        raise fail(f"--cap {cap}: --direct replays the trace in this process, under no cap; leave --cap out, or "
                   "drop --direct to run each allocator under `--memory SIZE`")
    if workload is not VpmmWorkload.trace and not direct:
        from pyvgpu.bench import vpmm_workloads as loops

        result = loops.run(workload.value, seconds=seconds, rounds=rounds, cap=cap, page_size=page_size)
        emit(result, loops.table(result), as_json, output)
        return
    if direct:
        result = bench.run_direct(steps=steps, page_size=page_size)
    else:
        result = bench.run(steps=steps, cap=cap, page_size=page_size)
    emit(result, bench.table(result), as_json, output)


@bench_app.command("schedule")
def bench_schedule(
    sizes: Annotated[str, typer.Option("--sizes", metavar="N,...",
                                       help="Cluster sizes (nodes of 8 GPUs) to time one decision "
                                            "at.")] = "100,1000,5000",
    repeats: Annotated[int, typer.Option("--repeats", min=1, metavar=N,
                                         help="Decisions timed per size and case (the median is "
                                              "reported).")] = 20,
    arrivals: Annotated[int, typer.Option("--arrivals", min=0, metavar=N,
                                          help="Pod arrivals in the packing run (0 skips it).")] = 10_000,
    pack_nodes: Annotated[int, typer.Option("--pack-nodes", min=1, metavar=N,
                                            help="Nodes of 8 GPUs in the packing run.")] = 50,
    loads: Annotated[str, typer.Option("--loads", metavar="LOAD,...",
                                       help="Offered loads of the packing run (1: as many pods as fit on "
                                            "average).")] = "0.8,1.0",
    seed: Annotated[int, typer.Option("--seed", metavar=N, help="Seed of the random cluster and pods.")] = 1,
    live_sizes: Annotated[str, typer.Option("--live-sizes", metavar="N,...",
                                            help="Also drive the extender against the test API server at these "
                                                 "node counts (from a checkout).")] = "",
    live_pods: Annotated[int, typer.Option("--live-pods", min=1, metavar=N,
                                           help="Pending pods scheduled in each live run.")] = 1000,
    inflight: Annotated[int, typer.Option("--inflight", min=1, max=64, metavar=N,
                                          help="Binds in flight in the live run.")] = 8,
    as_json: AsJson = False,
    output: Output = None,
) -> None:
    """The scheduling core on a simulated cluster: time to decide one pod at each size (with and without
    topology, 4 of 8 GPUs), and a packing run of arrivals and departures, binpack against spread."""
    from pyvgpu.bench import schedule as bench

    try:
        live = [int(x) for x in live_sizes.split(",") if x.strip()] if live_sizes.strip() else []
    except ValueError:
        raise fail(f"--live-sizes {live_sizes!r}: give node counts separated by commas, e.g. 1000,5000") from None
    result = bench.run(sizes=sizes, repeats=repeats, arrivals=arrivals, pack_nodes=pack_nodes, seed=seed,
                       loads=loads)
    if live:
        from pyvgpu.bench import schedule_live

        result["live"] = schedule_live.run(live, live_pods, inflight, seed)
    if output:
        output.write_text(json.dumps(result, indent=1))
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        typer.echo(bench.table(result))
        if "live" in result:
            from pyvgpu.bench import schedule_live

            typer.echo("\n" + schedule_live.table(result["live"]))
        if output:
            typer.echo(f"wrote {output}")
