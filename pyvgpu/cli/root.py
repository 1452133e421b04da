"""The `pyvgpu` typer application: the root command, its sub-apps, and :func:`main`.

Every command imports what it needs when it runs, so `pyvgpu --help` and the other commands start fast
(a plain `pyvgpu wrap` does not come here at all: pyvgpu/entry.py).

One grammar for every command: `--json` prints JSON on stdout (and nothing
else there); a file is written with `--output PATH`; every option that takes
a value names it with an upper-case placeholder (SIZE, PCT, PATH, N); flags
take none. Errors are one line, `pyvgpu: ...`, naming the option the user gave:
a PyvgpuError raised anywhere in a command, or by a choice's check while the
options are parsed, is printed so (exit 2) by the root group.
"""

from __future__ import annotations

from typing import Annotated

import typer
from typer.core import TyperGroup

from pyvgpu import __version__
from pyvgpu.cli import bench, groups, limits, machine, monitor
from pyvgpu.cli import wrap as wrap_cmd
from pyvgpu.cli.common import fail
from pyvgpu.cluster.cli import cluster_app


class PyvgpuGroup(TyperGroup):
    """The root group: a PyvgpuError from a sub-command (its options' checks or its body) is one line,
    `pyvgpu: ...`, and exit 2, also under typer's test runner."""

    def invoke(self, ctx: typer.Context):
        from pyvgpu.errors import PyvgpuError

        try:
            return super().invoke(ctx)
        except PyvgpuError as e:
            raise fail(str(e)) from None


# Plain (click) help: flags show no placeholder, `[bench]` stays visible, and it reads the same on every typer.
app = typer.Typer(
    cls=PyvgpuGroup,
    help="Share one NVIDIA GPU between programs: each runs in a vGPU with its own limits, unmodified.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
)
app.command(cls=wrap_cmd.WrapCommand, context_settings={"allow_interspersed_args": False})(wrap_cmd.wrap)
for command in (monitor.status, monitor.top, monitor.exporter, machine.warmup, machine.setup, machine.devices,
                machine.doctor):
    app.command()(command)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(limits.limits_app, name="limits")
app.add_typer(cluster_app, name="cluster")
app.add_typer(groups.group_app, name="group")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pyvgpu {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """pyvgpu: hard memory caps, compute shares and device sets for unmodified CUDA programs."""


def main() -> None:
    """`pyvgpu` on the typer command line."""
    app(prog_name="pyvgpu")
