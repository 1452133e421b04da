"""`pyvgpu wrap` on the typer command line: its options, its help and its usage line.

A plain wrap never comes here: pyvgpu/entry.py parses it without typer (pyvgpu/fastwrap.py). Both make one
pyvgpu.ops.wrap.WrapRequest and run pyvgpu.fastwrap.run, so the checks and messages after parsing are the same
code. Each option's details are in docs/manual.md ("wrap's options").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from pyvgpu.cli.common import Allocator, Mode, OnError, Priority, SmBorrow, check_of, choice


class WrapCommand(TyperCommand):
    """`wrap`'s usage line: PROGRAM and its arguments come last, after an optional `--`."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return ["[OPTIONS]", "[--]", "PROGRAM", "[ARGS]..."]


# Parsed like `docker run`: options stop at PROGRAM, and everything after it is the program's, untouched
# (`pyvgpu wrap python -c ... -m 2G` gives python `-m 2G`). An unknown option before PROGRAM is a usage error.
def wrap(
    command: Annotated[list[str], typer.Argument(metavar="PROGRAM", hidden=True)],
    stats: Annotated[bool, typer.Option("--stats", help="Print each process's CUDA/NVML call counts to stderr "
                                                        "at exit.")] = False,
    stats_file: Annotated[Path | None, typer.Option("--stats-file", metavar="PATH",
                                                    help="Append the call counts as JSON to PATH (%p: the pid) "
                                                         "instead.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", "-m", metavar="SIZE|DEV=SIZE,...",
                                               help="The group's memory cap, on every device (4G) or per device "
                                                    "(0=2G,1=6G).")] = None,
    sm: Annotated[str | None, typer.Option("--sm", metavar="PCT|DEV=PCT,...",
                                           help="The group's compute share in percent, on every device (30) or "
                                                "per device (0=30,1=50).")] = None,
    devices: Annotated[str | None, typer.Option("--devices", "-d", metavar="IDX|UUID,...",
                                                help="The devices the program sees, in this order (indices, GPU "
                                                     "or MIG UUIDs; `pyvgpu devices` lists them).")] = None,
    allocator: Annotated[Allocator | None, choice(Allocator, "--allocator",
                                                  check=check_of("pyvgpu.ops.wrap", "check_allocator"),
                                                  help="PyTorch's allocator: vpmm is the defragmenting pool of "
                                                       "docs/vpmm.md.")] = None,
    group: Annotated[str | None, typer.Option("--group", "-g", metavar="NAME",
                                              help="Join or start the named group, whose processes share one "
                                                   "quota.")] = None,
    region: Annotated[Path | None, typer.Option("--region", metavar="PATH",
                                                help="Use the group region file at PATH instead of a named "
                                                     "group.")] = None,
    on_error: Annotated[OnError | None, typer.Option("--on-error", case_sensitive=False, metavar="closed|open",
                                                     help="When the limits cannot be enforced: refuse CUDA calls "
                                                          "(closed) or run unlimited (open).")] = None,
    mode: Annotated[Mode | None, choice(Mode, "--mode", check=check_of("pyvgpu.ops.wrap", "check_mode"),
                                        help="Who enforces a new group's limits: pyvgpu (hami-core) or NVIDIA "
                                             "MPS.")] = None,
    priority: Annotated[Priority | None, choice(Priority, "--priority", check=check_of("pyvgpu.ops.wrap",
                                                                                       "check_priority"),
                                                help="The group's priority on the GPU (HAMi's 0 and 1).")] = None,
    sm_borrow: SmBorrow = None,
) -> None:
    """Run PROGRAM in a vGPU. It keeps this process's pid, exit code and signals.

    Options come before PROGRAM; everything after PROGRAM is passed to it as
    given, as with `docker run`. A `--` before PROGRAM is allowed.

    Example: pyvgpu wrap --memory 4G --sm 30 --devices 1 python train.py --lr 0.1
    """
    from pyvgpu import fastwrap
    from pyvgpu.ops.wrap import WrapRequest

    request = WrapRequest.from_options(
        stats=stats, stats_file=None if stats_file is None else str(stats_file), memory=memory, sm=sm,
        devices=devices, group=group, region_path=None if region is None else str(region),
        allocator=allocator.value if allocator else None, on_error=on_error.value if on_error else None,
        mode=mode.value if mode else None, priority=priority.value if priority else None, sm_borrow=sm_borrow)
    raise typer.Exit(fastwrap.run(command, request))
