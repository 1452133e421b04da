"""The machine's side: `pyvgpu doctor`, `pyvgpu devices`, `pyvgpu warmup` (the callback cache) and
`pyvgpu setup` (the shared turn file)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pyvgpu.cli.common import fail


def warmup(
    force: Annotated[bool, typer.Option("--force", help="Compile again even if the cache holds a library.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was compiled as JSON.")] = False,
    vpmm: Annotated[bool, typer.Option("--vpmm", help="Also load VPMM's allocator (compiled with the "
                                                      "callbacks).")] = False,
) -> None:
    """Compile the callbacks tuned for this CPU into the cache (PYVGPU_CACHE_DIR, else ~/.cache/pyvgpu).

    Optional: the package carries callbacks compiled for every CPU of the architecture. A tuned library
    is used instead when present, by every process on a CPU like this one.
    """
    import time

    from pyvgpu.native import cache

    t0 = time.perf_counter()
    m = cache.warmup(force=force, workers=cache.cli_workers())
    if as_json:
        typer.echo(json.dumps(m, indent=1, sort_keys=True))
    else:
        took = time.perf_counter() - t0
        typer.echo(f"callbacks ready: {m['library']} ({m['callbacks']} entries, for {m['cpu']}, {took:.2f} s)")
    if vpmm:
        from pyvgpu.native import services

        t0 = time.perf_counter()
        services.functions()  # VPMM's entry points are services of the callback library
        if not as_json:
            typer.echo(f"VPMM allocator ready ({time.perf_counter() - t0:.2f} s)")


def setup(
    group: Annotated[str, typer.Option("--group", "-g", metavar="NAME",
                                       help="The Unix group whose members share the machine's GPUs (it must "
                                            "exist).")] = "pyvgpu",
) -> None:
    """Make the machine's turn file (root only): /dev/shm/pyvgpu-turns-v1, root:GROUP, mode 0660.

    Groups with a compute share take turns on a GPU only with groups that use the same turn file. Without
    this, each user has a turn file of their own (docs/security.md says why).
    """
    from pyvgpu.group import turnfile as sched

    try:
        typer.echo(sched.setup(group))
    except OSError as e:
        raise fail(f"{e.filename or sched.SHM_PATH}: {e.strerror}") from None


def devices(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List this machine's GPUs and their MIG instances (what --devices accepts), as NVML sees them.

    Read only: MIG mode and instances are an administrator's (nvidia-smi mig); pyvgpu never changes them.
    """
    from pyvgpu.host import devices as dv

    inv = dv.inventory()
    if inv is None:
        raise fail("NVML (libnvidia-ml.so.1) cannot list this machine's devices; check the driver with "
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
    from pyvgpu.group.limits import human

    for g in gpus:
        typer.echo(f"GPU {g.index}: {g.name} ({g.uuid}) {human(g.total)}" + ("  MIG mode on" if g.mig_mode else ""))
        mine = [m for m in migs if m.index == g.index]
        for m in mine:
            typer.echo(f"  MIG {m.name}: {m.uuid} ({m.legacy_name}) {human(m.total)}")
        if g.mig_mode and not mine:
            typer.echo(f"  no MIG instance ({dv.MIG_FIX})")


def doctor(as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False) -> None:
    """Check that this machine can run vGPUs, with a fix for each problem. Exits 1 if a required check fails."""
    from pyvgpu.ops import doctor as d

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
