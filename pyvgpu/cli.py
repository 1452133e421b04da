"""The `pyvgpu` command line.

Every command imports what it needs when it runs, so `pyvgpu wrap` starts
fast: it is on the path of every wrapped program's startup.

One grammar for every command: `--json` prints JSON on stdout (and nothing
else there); a file is written with `--output PATH`; every option that takes
a value names it with an upper-case placeholder (SIZE, PCT, PATH, N); flags
take none. Errors are one line, `pyvgpu: ...`, naming the option the user gave.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path

import typer
from typer.core import TyperCommand

from pyvgpu import __version__
from pyvgpu.cluster.cli import cluster_app

DEFAULT_EXPORTER_PORT = 9433  # not 9400: that is dcgm-exporter's, which runs beside us (docs/monitoring.md)

# Plain (click) help: flags show no placeholder, `[bench]` stays visible, and it reads the same on every typer.
app = typer.Typer(
    help="Share one NVIDIA GPU between programs: each runs in a vGPU with its own limits, unmodified.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
)
bench_app = typer.Typer(help="Benchmarks that print figures, raw against wrapped, measured in one run.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(bench_app, name="bench")
limits_app = typer.Typer(help="Change a running group's limits.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(limits_app, name="limits")
app.add_typer(cluster_app, name="cluster")
group_app = typer.Typer(help="Named groups: when each was made and last used, and removing them.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(group_app, name="group")


class OnError(str, enum.Enum):
    closed = "closed"
    open = "open"


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(f"pyvgpu: {msg}", err=True)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pyvgpu {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """pyvgpu: hard memory caps, compute shares and device sets for unmodified CUDA programs."""


class _WrapCommand(TyperCommand):
    """`wrap`'s usage line: PROGRAM and its arguments come last, after an optional `--`."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return ["[OPTIONS]", "[--]", "PROGRAM", "[ARGS]..."]


# Parsed like `docker run`: options stop at PROGRAM, and everything after it is the program's, untouched
# (`pyvgpu wrap python -c ... -m 2G` gives python `-m 2G`). An unknown option before PROGRAM is a usage error.
@app.command(cls=_WrapCommand, context_settings={"allow_interspersed_args": False})
def wrap(
    command: list[str] = typer.Argument(..., metavar="PROGRAM", hidden=True),
    stats: bool = typer.Option(False, "--stats",
                               help="At exit, each wrapped process prints its CUDA/NVML call counts per symbol "
                                    "to stderr (PYVGPU_STATS=1)."),
    stats_file: str = typer.Option(None, "--stats-file", metavar="PATH",
                                   help="Append the call counts as JSON to PATH instead; %p in PATH becomes the "
                                        "pid."),
    memory: str = typer.Option(None, "--memory", "-m", metavar="SIZE|DEV=SIZE,...",
                               help="Memory cap of the group: 4G on every device, or 0=2G,1=6G per device. "
                                    "K/M/G/T and Ki/Mi/Gi/Ti are binary, decimals are allowed (4.5G), a bare "
                                    "number is bytes, GB is refused as ambiguous, and the least is 64M. Default: "
                                    "CUDA_DEVICE_MEMORY_LIMIT[_i], else none."),
    sm: str = typer.Option(None, "--sm", metavar="PCT|DEV=PCT,...",
                           help="Compute share of the group, in percent of the device's time: 30 on every "
                                "device, or 0=30,1=50 per device (1-100). Default: CUDA_DEVICE_SM_LIMIT[_i], "
                                "else none. GPU_CORE_UTILIZATION_POLICY=force|disable overrides the group's "
                                "switch (README)."),
    devices: str = typer.Option(None, "--devices", "-d", metavar="IDX|UUID,...",
                                help="The devices the program sees, in this order: indices as nvidia-smi shows "
                                     "them, or GPU UUIDs (0,2 or GPU-8e1f...). CUDA and NVML both see only these, "
                                     "numbered from 0; --memory and --sm device indices count in this list. "
                                     "A MIG instance: its UUID (MIG-..., or MIG-GPU-.../gi/ci) alone; "
                                     "`pyvgpu devices` lists them. Default: the group's devices, else all."),
    allocator: str = typer.Option(None, "--allocator", metavar="default|vpmm",
                                  help="vpmm: PyTorch allocates through VPMM, the defragmenting pool on the CUDA "
                                       "virtual-memory API (docs/vpmm.md), installed right after `import torch`."),
    group: str = typer.Option(None, "--group", "-g", metavar="NAME",
                              help="Join (or start) the named group: every process in it shares one quota. "
                                   "Default: a private group for this program and its children."),
    region: str = typer.Option(None, "--region", metavar="PATH",
                               help="Use the group region file at PATH instead of a named group."),
    on_error: OnError = typer.Option(None, "--on-error", case_sensitive=False, metavar="closed|open",
                                     help="What happens when the limits cannot be enforced: 'closed' refuses "
                                          "CUDA calls (the default when limits are set), 'open' runs the "
                                          "program unlimited with a warning."),
    mode: str = typer.Option(None, "--mode", metavar="hami-core|mps",
                             help="Who enforces the limits of a new group: 'hami-core' (default) pyvgpu's own "
                                  "limiter; 'mps' NVIDIA's Multi-Process Service (a per-user control daemon is "
                                  "started or joined; --sm becomes the clients' active-thread percentage, "
                                  "--memory their pinned-memory limit, and pyvgpu still caps and shows memory). "
                                  "Members joining a group follow its mode. MIG: give a MIG instance's UUID to "
                                  "--devices."),
    priority: str = typer.Option(None, "--priority", metavar="high|low",
                                 help="The group's priority on the GPU: a high-priority group takes the turn "
                                      "first and is never held below its share by low-priority ones. high or "
                                      "low (HAMi's 0 and 1). Default: CUDA_TASK_PRIORITY, else low."),
    sm_borrow: bool = typer.Option(None, "--sm-borrow/--sm-cap",
                                   help="--sm-borrow: the group may use idle GPU time beyond its --sm share "
                                        "while nobody with a share waits, and gives it back within 100 ms of "
                                        "a neighbour asking (work-conserving). --sm-cap (the default): the "
                                        "share is a hard cap. Default: PYVGPU_SM_BORROW=1|0, else a cap; "
                                        "GPU_CORE_UTILIZATION_POLICY=force always caps."),
) -> None:
    """Run PROGRAM in a vGPU. It keeps this process's pid, exit code and signals.

    Options come before PROGRAM; everything after PROGRAM is passed to it as
    given, as with `docker run`. A `--` before PROGRAM is allowed.

    Example: pyvgpu wrap --memory 4G --sm 30 --devices 1 python train.py --lr 0.1
    """
    from pyvgpu import fastwrap  # the same checks and messages as a plain wrap parsed without typer

    raise typer.Exit(fastwrap.run(command, stats=stats, stats_file=stats_file, memory=memory, sm=sm,
                                  devices=devices, allocator=allocator, group=group, region=region,
                                  on_error=on_error.value if on_error else None, mode=mode, priority=priority,
                                  sm_borrow=sm_borrow))


@app.command()
def status(
    group: str = typer.Option(None, "--group", "-g", metavar="NAME", help="Show only this named group."),
    region: str = typer.Option(None, "--region", metavar="PATH", help="Show only the group region at PATH."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (schema: docs/status.md)."),
) -> None:
    """Show each group's devices (limit, used, free) and processes (pid, bytes by kind).

    Dead members' quota is reclaimed first, so what is shown is what is live.
    """
    from pyvgpu import status as st
    from pyvgpu.errors import PyvgpuError

    skipped: list[tuple[Path, str]] = []
    try:
        groups = st.collect(group=group, region_path=region, skipped=skipped)
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    for path, why in skipped:
        typer.echo(f"pyvgpu: skipped {path}: {why}", err=True)
    typer.echo(json.dumps({"groups": groups}, indent=1) if as_json else st.render(groups))


def _group_path(group: str | None, region: str | None) -> Path:
    from pyvgpu import region as R
    from pyvgpu.errors import PyvgpuError

    if bool(group) == bool(region):
        raise PyvgpuError("name the group: give --group NAME or --region PATH (one of them)")
    from pyvgpu import status as st

    path = Path(region) if region else R.group_path(group)
    st.check_exists(path, group, region)
    return path


@limits_app.command("set")
def limits_set(
    group: str = typer.Option(None, "--group", "-g", metavar="NAME", help="The named group to change."),
    region: str = typer.Option(None, "--region", metavar="PATH", help="The group region file to change."),
    memory: str = typer.Option(None, "--memory", "-m", metavar="SIZE|DEV=SIZE,...|none",
                               help="New memory cap: 4G on every device, 0=2G,1=6G per device, or none. A cap "
                                    "below what the group holds refuses new allocations until it frees enough; "
                                    "it never kills."),
    sm: str = typer.Option(None, "--sm", metavar="PCT|DEV=PCT,...|none",
                           help="New compute share: 30 on every device, 0=30,1=50 per device, or none. A group "
                                "that had none takes turns with its share from its next launch."),
    priority: str = typer.Option(None, "--priority", metavar="high|low",
                                 help="New priority of the group on the GPU: high or low (HAMi's 0 and 1)."),
    sm_borrow: bool = typer.Option(None, "--sm-borrow/--sm-cap",
                                   help="--sm-borrow: the group may use idle GPU time beyond its share "
                                        "(work-conserving); --sm-cap: the share is a hard cap. The same flags as "
                                        "`pyvgpu wrap`'s."),
) -> None:
    """Change the limits of a running group; its processes follow at their next call.

    Example: pyvgpu limits set --group team-a --memory 8G --sm 50 --priority high
    """
    from pyvgpu import live
    from pyvgpu.errors import PyvgpuError

    try:
        change = live.set_limits(_group_path(group, region), memory, sm, priority,
                                 None if sm_borrow is None else "on" if sm_borrow else "off")
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    for line in change.text():
        typer.echo(line)


@group_app.command("ls")
def group_ls(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List this user's named groups: when each was made, last used, its live members and limits.

    A group with no live member unused for PYVGPU_GROUP_IDLE_HOURS (default 12; 0: never) expires: this
    removes it, and the next `pyvgpu wrap --group NAME` starts it afresh.
    """
    from pyvgpu import groups
    from pyvgpu.errors import PyvgpuError

    try:
        found = groups.list_groups()
        typer.echo(json.dumps({"groups": found}, indent=1) if as_json else groups.render(found))
    except PyvgpuError as e:
        raise _fail(str(e)) from None


class _NameCommand(TyperCommand):
    """A usage line with NAME, and no typer type placeholder for it (its help says what it is)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return ["[OPTIONS]", "NAME"]


@group_app.command("rm", cls=_NameCommand)
def group_rm(name: str = typer.Argument(..., metavar="NAME", hidden=True)) -> None:
    """Remove the named group NAME, which must have no live member (its limits go with it)."""
    from pyvgpu import groups
    from pyvgpu.errors import PyvgpuError

    try:
        path = groups.remove(name)
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    typer.echo(f"removed group {name!r} ({path})")


@app.command()
def top(
    group: str = typer.Option(None, "--group", "-g", metavar="NAME", help="Show only this named group."),
    region: str = typer.Option(None, "--region", metavar="PATH", help="Show only the group region at PATH."),
    interval: float = typer.Option(1.0, "--interval", min=0.1, metavar="SECONDS", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one frame (rates over one interval) and exit."),
) -> None:
    """A live table of every group, device and process: memory used vs limit, SM share vs target,
    launches/s, OOM refusals, and the latest events. Quits on q or Ctrl-C."""
    from pyvgpu import top as t
    from pyvgpu.errors import PyvgpuError

    try:
        t.run(group=group, region_path=region, interval=interval, once=once)
    except PyvgpuError as e:
        raise _fail(str(e)) from None


@app.command()
def exporter(
    port: int = typer.Option(DEFAULT_EXPORTER_PORT, "--port", "-p", min=0, max=65535, metavar="PORT",
                             help="TCP port to serve /metrics on (0: any free one, printed at start). The default is "
                                  "not dcgm-exporter's 9400, so both run on one host."),
    address: str = typer.Option("0.0.0.0", "--address", metavar="ADDRESS",
                                help="Address to listen on: 0.0.0.0 (every IPv4 address), :: (IPv6 too), 127.0.0.1 "
                                     "or ::1 (this host only)."),
    group: str = typer.Option(None, "--group", "-g", metavar="NAME", help="Export only this named group."),
    region: str = typer.Option(None, "--region", metavar="PATH", help="Export only the group region at PATH."),
    state_dir: str = typer.Option(None, "--state-dir", metavar="DIR",
                                  help="Export the containers' regions of a Kubernetes node's state directory "
                                       "(pyvgpu cluster device-plugin --state-dir, e.g. /run/pyvgpu) instead of "
                                       "the runtime dir's groups."),
    cache: float = typer.Option(1.0, "--cache-seconds", min=0.0, max=60.0, metavar="SECONDS",
                                help="Scrapes within this long of a read share it (0: read at every scrape)."),
) -> None:
    """Serve Prometheus metrics for every group under the runtime dir, read afresh (at most once a second).

    Every per-device series carries the GPU's UUID and the machine's index (labels UUID and gpu, as
    dcgm-exporter's), so the two join. Metrics: pyvgpu_memory_limit_bytes, pyvgpu_memory_used_bytes,
    pyvgpu_group_memory_used_bytes, pyvgpu_sm_limit_percent, pyvgpu_sm_utilization_percent,
    pyvgpu_oom_refusals_total, pyvgpu_throttle_seconds_total, pyvgpu_launches_total, pyvgpu_build_info
    (docs/monitoring.md; a Grafana dashboard and a scrape config are in deploy/).
    """
    from pyvgpu import exporter as ex

    if state_dir is not None and not Path(state_dir).is_dir():
        raise _fail(f"--state-dir {state_dir}: no such directory; give the node state directory the device plugin "
                    "was given (--state-dir, default /run/pyvgpu)")
    try:
        srv = ex.server(port, address, group, region, state_dir, cache)
    except OSError as e:
        raise _fail(ex.listen_error(address, port, e)) from None
    import signal
    import threading

    done = threading.Event()

    # Ctrl-C and SIGTERM stop it, also where the shell started it with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, lambda signum, frame: done.set())
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    host = f"[{address}]" if ":" in address else address
    typer.echo(f"pyvgpu exporter: serving http://{host}:{srv.server_port}/metrics (Ctrl-C stops)", err=True)
    thread = threading.Thread(target=srv.serve_forever, name="pyvgpu-exporter", daemon=True)
    thread.start()
    while not done.wait(1.0):
        pass
    srv.shutdown()
    srv.server_close()


@app.command()
def warmup(
    force: bool = typer.Option(False, "--force", help="Compile again even if the cache holds a library."),
    as_json: bool = typer.Option(False, "--json", help="Print what was compiled as JSON."),
    vpmm: bool = typer.Option(False, "--vpmm", help="Also load VPMM's allocator (compiled with the callbacks)."),
) -> None:
    """Compile the callbacks tuned for this CPU into the cache (PYVGPU_CACHE_DIR, else ~/.cache/pyvgpu).

    Optional: the package carries callbacks compiled for every CPU of the architecture. A tuned library
    is used instead when present, by every process on a CPU like this one.
    """
    import time

    from pyvgpu import cache
    from pyvgpu.errors import PyvgpuError

    t0 = time.perf_counter()
    try:
        m = cache.warmup(force=force, workers=cache.cli_workers())
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(m, indent=1, sort_keys=True))
    else:
        took = time.perf_counter() - t0
        typer.echo(f"callbacks ready: {m['library']} ({m['callbacks']} entries, for {m['cpu']}, {took:.2f} s)")
    if vpmm:
        from pyvgpu import services

        t0 = time.perf_counter()
        services.functions()  # VPMM's entry points are services of the callback library
        if not as_json:
            typer.echo(f"VPMM allocator ready ({time.perf_counter() - t0:.2f} s)")


@app.command()
def setup(
    group: str = typer.Option("pyvgpu", "--group", "-g", metavar="NAME",
                              help="The Unix group whose members share the machine's GPUs (it must exist)."),
) -> None:
    """Make the machine's turn file (root only): /dev/shm/pyvgpu-turns-v1, root:GROUP, mode 0660.

    Groups with a compute share take turns on a GPU only with groups that use the same turn file. Without
    this, each user has a turn file of their own (docs/security.md says why).
    """
    from pyvgpu import sched
    from pyvgpu.errors import PyvgpuError

    try:
        typer.echo(sched.setup(group))
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or sched.SHM_PATH}: {e.strerror}") from None


@app.command("devices")
def devices_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List this machine's GPUs and their MIG instances (what --devices accepts), as NVML sees them.

    Read only: MIG mode and instances are an administrator's (nvidia-smi mig); pyvgpu never changes them.
    """
    from pyvgpu import devices as dv

    inv = dv.inventory()
    if inv is None:
        raise _fail("NVML (libnvidia-ml.so.1) cannot list this machine's devices; check the driver with "
                    "`pyvgpu doctor`")
    gpus, migs = inv
    if as_json:
        def one(g: dv.Gpu) -> dict:
            return {"index": g.index, "uuid": g.uuid, "name": g.name, "memory": g.total}
        typer.echo(json.dumps({"gpus": [{**one(g), "mig_mode": g.mig_mode,
                                         "mig": [{**one(m), "gpu_instance": m.gi, "compute_instance": m.ci,
                                                  "legacy_name": m.legacy_name}
                                                 for m in migs if m.index == g.index]} for g in gpus]}, indent=1))
        return
    from pyvgpu.limits import human

    for g in gpus:
        typer.echo(f"GPU {g.index}: {g.name} ({g.uuid}) {human(g.total)}" + ("  MIG mode on" if g.mig_mode else ""))
        mine = [m for m in migs if m.index == g.index]
        for m in mine:
            typer.echo(f"  MIG {m.name}: {m.uuid} ({m.legacy_name}) {human(m.total)}")
        if g.mig_mode and not mine:
            typer.echo(f"  no MIG instance ({dv.MIG_FIX})")


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON.")) -> None:
    """Check that this machine can run vGPUs, with a fix for each problem. Exits 1 if a required check fails."""
    from pyvgpu import doctor as d

    checks = d.run_checks()
    if as_json:
        typer.echo(json.dumps(d.as_json(checks), indent=1))
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
            typer.echo(f"[{mark}] {c.name}: {c.detail}")
            if not c.ok:
                typer.echo(f"       fix: {c.fix}")
    if any(c.required and not c.ok for c in checks):
        raise typer.Exit(1)


JSON_HELP = "Print the full result as JSON on stdout, instead of the table."
OUTPUT_HELP = "Also write the full result as JSON to PATH."


def _emit(result: dict, table: str, as_json: bool, output: Path | None) -> None:
    """--json: JSON on stdout, nothing else there; else the table. --output PATH: the JSON in PATH too."""
    if output:
        output.write_text(json.dumps(result, indent=1))
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        typer.echo(table)
    if output:
        typer.echo(f"wrote {output}", err=True)


@bench_app.command("overhead")
def bench_overhead(
    rounds: int = typer.Option(5, min=1, metavar="N", help="Alternating raw/wrapped rounds."),
    samples: int = typer.Option(1000, min=10, metavar="N", help="Timed batches per side per round."),
    size: int = typer.Option(2 << 20, min=1, metavar="BYTES", help="Bytes per cuMemAlloc."),
    memory: str = typer.Option(None, "--memory", metavar="SIZE", help="Run the wrapped side under this cap."),
    sm: str = typer.Option(None, "--sm", metavar="PCT",
                           help="Run the wrapped side under this compute share (the empty kernels leave its "
                                "budget unspent, so this times the limiter's path while tokens are there)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(None, "--output", "-o", metavar="PATH", help=OUTPUT_HELP),
) -> None:
    """Host time of an empty-kernel cuLaunchKernel and a cuMemAlloc+cuMemFree, raw and wrapped."""
    from pyvgpu.bench import overhead
    from pyvgpu.errors import PyvgpuError

    try:
        result = overhead.run(rounds=rounds, samples=samples, size=size, memory=memory, sm=sm)
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    _emit(result, overhead.table(result), as_json, output)


@bench_app.command("startup")
def bench_startup(
    runs: int = typer.Option(5, min=1, metavar="N", help="Runs per case."),
    python: list[str] = typer.Option(None, "--python", metavar="PATH",
                                     help="Another interpreter to time as a host (repeat the option for more)."),
    concurrent: int = typer.Option(0, "--concurrent", min=0, metavar="N",
                                   help="Instead: start N `pyvgpu wrap --group` at once (and N bare programs), "
                                        "seconds until all exit and the CPU each wrap spent."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(None, "--output", "-o", metavar="PATH", help=OUTPUT_HELP),
) -> None:
    """Time to the first CUDA call per host kind: raw, wrapped, started as a container, with an empty cache
    (or, with --concurrent N, N wraps at once in one group)."""
    from pyvgpu.errors import PyvgpuError

    if concurrent:
        from pyvgpu.bench import wraps

        try:
            result = wraps.run(concurrent=concurrent, runs=runs)
        except PyvgpuError as e:
            raise _fail(str(e)) from None
        _emit(result, wraps.table(result), as_json, output)
        return
    from pyvgpu.bench import startup

    try:
        result = startup.run(runs=runs, pythons=python or [])
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    _emit(result, startup.table(result), as_json, output)


@bench_app.command("sm")
def bench_sm(
    targets: str = typer.Option("10,30,50,70,90", metavar="PCT,...",
                                help="Compute shares to run alone, in percent, comma-separated ('' for none)."),
    seconds: float = typer.Option(8.0, min=2.0, metavar="SECONDS",
                                  help="Length of each run; the first third is left out as warm-up."),
    workload: str = typer.Option("spin", metavar="spin|matmul|graph|mlp|decode|allreduce|tp-decode",
                                 help="The load; docs/compute.md describes each (allreduce and tp-decode "
                                      "need 2 GPUs)."),
    pair: str = typer.Option("30,70", metavar="PCT,PCT", help="Shares of the two groups run at once ('' to skip)."),
    sliced: bool = typer.Option(False, "--sliced",
                                help="Run the pair once more time-sliced (PYVGPU_SM_TURN=0), to compare."),
    priorities: str = typer.Option(None, "--priorities", metavar="PRIO,PRIO",
                                   help="Priorities of the pair's two groups, e.g. high,low."),
    neighbour: str = typer.Option("none", "--neighbour", metavar="none|unlimited",
                                  help="'unlimited': also run a group with --neighbour-share beside a wrapped "
                                       "group without a share."),
    neighbour_share: int = typer.Option(50, "--neighbour-share", min=1, max=99, metavar="PCT",
                                        help="The share of the group beside the unlimited neighbour."),
    burst: bool = typer.Option(False, "--burst",
                               help="Also run a group with --burst-share and --sm-borrow alone for half the run, "
                                    "then beside a neighbour with --sm 50: what it borrows, and how soon the "
                                    "neighbour gets the turn."),
    burst_share: int = typer.Option(30, "--burst-share", min=1, max=99, metavar="PCT",
                                    help="The share of the borrowing group in --burst."),
    png: str = typer.Option("bench-sm.png", "--png", metavar="PATH", help="Where to write the plot ('' for none)."),
    mode: str = typer.Option("hami-core", "--mode", metavar="hami-core|mps",
                             help="Who enforces the shares: pyvgpu (hami-core) or NVIDIA MPS (wrap --mode mps)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(None, "--output", "-o", metavar="PATH", help=OUTPUT_HELP),
) -> None:
    """Achieved compute share at each target, alone and as two groups: throughput share (throughput /
    unlimited throughput) and time share (NVML, and the turns' own accounting).

    Also plots achieved against target and the controller's time series (needs matplotlib:
    pip install 'pyvgpu[bench]').
    """
    from pyvgpu.bench import sm as bench
    from pyvgpu.errors import PyvgpuError

    try:
        result = bench.run(targets=targets, seconds=seconds, workload=workload, pair=pair,
                           png=Path(png) if png else None, neighbour=neighbour, neighbour_share=neighbour_share,
                           sliced=sliced, priorities=priorities, burst=burst, burst_share=burst_share, mode=mode)
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    _emit(result, bench.table(result), as_json, output)


@bench_app.command("vpmm")
def bench_vpmm(
    steps: int = typer.Option(600, min=10, metavar="N", help="Decoding steps of the trace (4 interleaved requests)."),
    cap: str = typer.Option(None, "--cap", metavar="SIZE", help="Run every allocator under `--memory SIZE`, to count "
                                                                 "refused requests."),
    page_size: str = typer.Option(None, "--page-size", metavar="SIZE", help="VPMM's page (VPMM_PAGE_SIZE; "
                                  "default 2M): larger pages defragment less often, round up more."),
    direct: bool = typer.Option(False, "--direct", help="Replay the trace on a VPMM pool in this process, "
                                "without PyTorch (also on a fake driver): the allocator's own ops/s and calls."),
    workload: str = typer.Option("trace", "--workload", metavar="trace|decode|train|all",
                                 help="'decode': transformers' generate (GPT-2 architecture, 8 x 1024, fp16, random "
                                      "weights; batch 1-32, prompt 16-512, 16-64 new tokens), tokens/s; 'train': "
                                      "8 x Linear 2048 with Adam, steps/s; 'all': both and the trace (a diagnostic)."),
    seconds: float = typer.Option(16.0, "--seconds", min=1.0, metavar="S", help="Length of each decode/train run."),
    rounds: int = typer.Option(2, "--rounds", min=1, metavar="N",
                               help="Runs per allocator for decode/train, the allocators taking turns."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(None, "--output", "-o", metavar="PATH", help=OUTPUT_HELP),
) -> None:
    """A fragmenting trace (inference with growing sequences) under PyTorch's caching allocator,
    expandable_segments and VPMM: peak live, peak reserved, refused requests, ops/s, VPMM's driver calls per
    operation (needs PyTorch and a GPU; --direct needs neither). --workload decode|train runs real loops
    instead: throughput and peak reserved per allocator."""
    from pyvgpu.bench import vpmm as bench
    from pyvgpu.errors import PyvgpuError

    if direct and cap is not None:
        raise _fail(f"--cap {cap}: --direct replays the trace in this process, under no cap; leave --cap out, or "
                    "drop --direct to run each allocator under `--memory SIZE`")
    if workload != "trace" and not direct:
        from pyvgpu.bench import vpmm_workloads as loops

        try:
            result = loops.run(workload, seconds=seconds, rounds=rounds, cap=cap, page_size=page_size)
        except PyvgpuError as e:
            raise _fail(str(e)) from None
        _emit(result, loops.table(result), as_json, output)
        return
    try:
        if direct:
            result = bench.run_direct(steps=steps, page_size=page_size)
        else:
            result = bench.run(steps=steps, cap=cap, page_size=page_size)
    except PyvgpuError as e:
        raise _fail(str(e)) from None
    _emit(result, bench.table(result), as_json, output)


@bench_app.command("schedule")
def bench_schedule(
    sizes: str = typer.Option("100,1000,5000", metavar="N,...",
                              help="Cluster sizes (nodes of 8 GPUs) to time one decision at."),
    repeats: int = typer.Option(20, min=1, metavar="N",
                                help="Decisions timed per size and case (the median is reported)."),
    arrivals: int = typer.Option(10_000, min=0, metavar="N", help="Pod arrivals in the packing run (0 skips it)."),
    pack_nodes: int = typer.Option(50, min=1, metavar="N", help="Nodes of 8 GPUs in the packing run."),
    loads: str = typer.Option("0.8,1.0", metavar="LOAD,...",
                              help="Offered loads of the packing run (1 = as many pods as fit on average), "
                                   "comma-separated."),
    seed: int = typer.Option(1, metavar="N", help="Seed of the random cluster and pods: one seed, one result."),
    live_sizes: str = typer.Option("", "--live-sizes", metavar="N,...",
                                   help="Also drive the extender as kube-scheduler does (filter, prioritize, binds "
                                        "in flight) against the test API server at these node counts, e.g. "
                                        "1000,5000 (from a checkout; empty skips it)."),
    live_pods: int = typer.Option(1000, "--live-pods", min=1, metavar="N",
                                  help="Pending pods scheduled in each live run."),
    inflight: int = typer.Option(8, "--inflight", min=1, max=64, metavar="N", help="Binds in flight in the live run."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout instead of the table."),
    output: Path = typer.Option(None, "--output", metavar="PATH", help="Also write the result as JSON to PATH."),
) -> None:
    """The scheduling core on a simulated cluster: time to decide one pod at each size (with and without
    topology, 4 of 8 GPUs), and a packing run of arrivals and departures, binpack against spread."""
    from pyvgpu.bench import schedule as bench
    from pyvgpu.errors import PyvgpuError

    try:
        live = [int(x) for x in live_sizes.split(",") if x.strip()] if live_sizes.strip() else []
    except ValueError:
        raise _fail(f"--live-sizes {live_sizes!r}: give node counts separated by commas, e.g. 1000,5000") from None
    try:
        result = bench.run(sizes=sizes, repeats=repeats, arrivals=arrivals, pack_nodes=pack_nodes, seed=seed,
                           loads=loads)
        if live:
            from pyvgpu.bench import schedule_live

            result["live"] = schedule_live.run(live, live_pods, inflight, seed)
    except PyvgpuError as e:
        raise _fail(str(e)) from None
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


def main() -> None:
    app(prog_name="pyvgpu")


if __name__ == "__main__":
    sys.exit(main())
