"""Watching the groups: `pyvgpu status`, `pyvgpu top` and `pyvgpu exporter` (Prometheus)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pyvgpu.cli.common import OnlyGroup, OnlyRegion, fail

DEFAULT_EXPORTER_PORT = 9433  # not 9400: that is dcgm-exporter's, which runs beside us (docs/monitoring.md)


def status(
    group: OnlyGroup = None,
    region: OnlyRegion = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (schema: docs/status.md).")] = False,
) -> None:
    """Show each group's devices (limit, used, free) and processes (pid, bytes by kind).

    Dead members' quota is reclaimed first, so what is shown is what is live.
    """
    from pyvgpu.ops import status as st

    skipped: list[tuple[Path, str]] = []
    groups = st.collect(group=group, region_path=region, skipped=skipped)
    for path, why in skipped:
        typer.echo(f"pyvgpu: skipped {path}: {why}", err=True)
    typer.echo(json.dumps({"groups": groups}, indent=1) if as_json else st.render(groups))


def top(
    group: OnlyGroup = None,
    region: OnlyRegion = None,
    interval: Annotated[float, typer.Option("--interval", min=0.1, metavar="SECONDS",
                                            help="Seconds between refreshes.")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame (rates over one interval) and exit.")] = False,
) -> None:
    """A live table of every group, device and process: memory used vs limit, SM share vs target,
    launches/s, OOM refusals, and the latest events. Quits on q or Ctrl-C."""
    from pyvgpu.ops import top as t

    t.run(group=group, region_path=region, interval=interval, once=once)


def exporter(
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, metavar="PORT",
                                      help="TCP port to serve /metrics on (0: any free one, printed at "
                                           "start).")] = DEFAULT_EXPORTER_PORT,
    address: Annotated[str, typer.Option("--address", metavar="ADDRESS",
                                         help="An address of this host to listen on (0.0.0.0 or :: for "
                                              "all).")] = "0.0.0.0",
    group: OnlyGroup = None,
    region: OnlyRegion = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", metavar="DIR",
                                                   help="Export the containers' regions of a Kubernetes node's "
                                                        "state directory instead.")] = None,
    cache: Annotated[float, typer.Option("--cache-seconds", min=0.0, max=60.0, metavar="SECONDS",
                                         help="Scrapes within this long of a read share it (0: read at every "
                                              "scrape).")] = 1.0,
) -> None:
    """Serve Prometheus metrics for every group under the runtime dir, read afresh (at most once a second).

    Every per-device series carries the GPU's UUID and the machine's index (labels UUID and gpu, as
    dcgm-exporter's), so the two join. Metrics: pyvgpu_memory_limit_bytes, pyvgpu_memory_used_bytes,
    pyvgpu_group_memory_used_bytes, pyvgpu_sm_limit_percent, pyvgpu_sm_utilization_percent,
    pyvgpu_oom_refusals_total, pyvgpu_throttle_seconds_total, pyvgpu_launches_total, pyvgpu_build_info
    (docs/monitoring.md; a Grafana dashboard and a scrape config are in deploy/).
    """
    from pyvgpu.ops import exporter as ex

    if state_dir is not None and not state_dir.is_dir():
        raise fail(f"--state-dir {state_dir}: no such directory; give the node state directory the device plugin "
                   "was given (--state-dir, default /run/pyvgpu)")
    try:
        srv = ex.server(port, address, group, region, state_dir, cache)
    except OSError as e:
        raise fail(ex.listen_error(address, port, e)) from None
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
