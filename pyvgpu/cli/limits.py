"""`pyvgpu limits set`: change a running group's limits; its processes follow at their next call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pyvgpu.cli.common import Priority, SmBorrow, check_of, choice

limits_app = typer.Typer(help="Change a running group's limits.", no_args_is_help=True, rich_markup_mode=None)


def group_path(group: str | None, region: Path | None) -> Path:
    """The region of the group named by exactly one of --group and --region, which must exist."""
    from pyvgpu.errors import PyvgpuError
    from pyvgpu.group import region as R
    from pyvgpu.ops import status as st

    if bool(group) == bool(region):
        raise PyvgpuError("name the group: give --group NAME or --region PATH (one of them)")
    path = Path(region) if region else R.group_path(group)
    st.check_exists(path, group, region)
    return path


@limits_app.command("set")
def limits_set(
    group: Annotated[str | None, typer.Option("--group", "-g", metavar="NAME",
                                              help="The named group to change.")] = None,
    region: Annotated[Path | None, typer.Option("--region", metavar="PATH",
                                                help="The group region file to change.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", "-m", metavar="SIZE|DEV=SIZE,...|none",
                                               help="New memory cap, on every device (4G), per device (0=2G,1=6G) "
                                                    "or none.")] = None,
    sm: Annotated[str | None, typer.Option("--sm", metavar="PCT|DEV=PCT,...|none",
                                           help="New compute share, on every device (30), per device (0=30,1=50) "
                                                "or none.")] = None,
    priority: Annotated[Priority | None, choice(Priority, "--priority", check=check_of("pyvgpu.ops.wrap",
                                                                                       "check_priority"),
                                                help="New priority of the group on the GPU (HAMi's 0 and "
                                                     "1).")] = None,
    sm_borrow: SmBorrow = None,
) -> None:
    """Change the limits of a running group; its processes follow at their next call.

    A cap below what the group holds refuses new allocations until it frees enough; it never kills.

    Example: pyvgpu limits set --group team-a --memory 8G --sm 50 --priority high
    """
    from pyvgpu.group import live

    change = live.set_limits(group_path(group, region), memory, sm, priority.value if priority else None,
                             None if sm_borrow is None else "on" if sm_borrow else "off")
    for line in change.text():
        typer.echo(line)
