"""`pyvgpu group ls|rm`: named groups, when each was made and last used, and removing them."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from typer.core import TyperCommand

group_app = typer.Typer(help="Named groups: when each was made and last used, and removing them.",
                        no_args_is_help=True, rich_markup_mode=None)


@group_app.command("ls")
def group_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List this user's named groups: when each was made, last used, its live members and limits.

    A group with no live member unused for PYVGPU_GROUP_IDLE_HOURS (default 12; 0: never) expires: this
    removes it, and the next `pyvgpu wrap --group NAME` starts it afresh.
    """
    from pyvgpu.ops import groups

    found = groups.list_groups()
    typer.echo(json.dumps({"groups": found}, indent=1) if as_json else groups.render(found))


class NameCommand(TyperCommand):
    """A usage line with NAME, and no typer type placeholder for it (its help says what it is)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return ["[OPTIONS]", "NAME"]


@group_app.command("rm", cls=NameCommand)
def group_rm(name: Annotated[str, typer.Argument(metavar="NAME", hidden=True)]) -> None:
    """Remove the named group NAME, which must have no live member (its limits go with it)."""
    from pyvgpu.ops import groups

    path = groups.remove(name)
    typer.echo(f"removed group {name!r} ({path})")
