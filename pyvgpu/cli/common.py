"""What the command modules share: the one-line error, JSON output, options that several commands take,
and choices as Enums whose bad values get pyvgpu's own one-line message.

A choice's message is the library's (the same function checks it on every path: pyvgpu/fastwrap.py, the
benches, this command line), so a choice is an Enum with a typer ``parser`` that calls that check rather
than typer's generic choice message. The check raises PyvgpuError; pyvgpu.cli.root's group prints it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from pyvgpu.errors import PyvgpuError

E = TypeVar("E", bound=enum.Enum)


def fail(msg: str, code: int = 2) -> typer.Exit:
    """Print ``pyvgpu: msg`` on stderr; the caller raises the returned Exit."""
    typer.echo(f"pyvgpu: {msg}", err=True)
    return typer.Exit(code)


def check_of(module: str, name: str) -> Callable[[str], str]:
    """The check ``module.name``, imported only when a value is given (registering a command imports
    nothing of the library)."""

    def check(text: str) -> str:
        import importlib

        return getattr(importlib.import_module(module), name)(text)

    return check


def choice(kind: type[E], *names: str, check: Callable[[str], str] | None = None, **option: Any) -> Any:
    """``typer.Option(*names, ...)`` for the Enum ``kind``: the usage shows its values, the shell completes
    them, and a bad value gets ``check``'s message (else "OPTION 'x' is not one of a, b")."""
    values = [m.value for m in kind]

    def parse(text: Any) -> E:
        if isinstance(text, kind):  # a default
            return text
        if check is not None:
            text = check(text)  # the domain's spelling (e.g. HAMi's 0 for high), or its message
        try:
            return kind(text)
        except ValueError:
            raise PyvgpuError(f"{names[0]} {text!r} is not one of {', '.join(values)}") from None

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return typer.Option(*names, parser=parse, autocompletion=complete, metavar="|".join(values), **option)


def emit(result: dict, table: str, as_json: bool, output: Path | None) -> None:
    """--json: JSON on stdout, nothing else there; else the table. --output PATH: the JSON in PATH too."""
    if output:
        output.write_text(json.dumps(result, indent=1))
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        typer.echo(table)
    if output:
        typer.echo(f"wrote {output}", err=True)


# Options several commands take, written once.
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of the table.")]
Output = Annotated[Path | None, typer.Option("--output", "-o", metavar="PATH",
                                                help="Also write the full result as JSON to PATH.")]
OnlyGroup = Annotated[str | None, typer.Option("--group", "-g", metavar="NAME", help="Only this named group.")]
OnlyRegion = Annotated[Path | None, typer.Option("--region", metavar="PATH",
                                                    help="Only the group region at PATH.")]
SmBorrow = Annotated[bool | None, typer.Option("--sm-borrow/--sm-cap",
                                                  help="Let the group use idle GPU time beyond its share, or cap it "
                                                       "there.")]


class Choice(str, enum.Enum):
    """The values of an option. ``str()`` of a member is its value: typer before 0.29 converts an Enum
    option's parsed value once more, looking it up by ``str(value)``, and gets None for "Kind.member"."""

    def __str__(self) -> str:
        return str(self.value)


class OnError(Choice):
    """PYVGPU_ON_ERROR: refuse CUDA calls, or run unlimited, when the limits cannot be enforced."""

    closed = "closed"
    open = "open"


class Mode(Choice):
    """Who enforces a group's limits (pyvgpu.group.mps.MODES)."""

    hami_core = "hami-core"
    mps = "mps"


class Priority(Choice):
    """A group's priority on the GPU (pyvgpu.group.limits.PRIORITIES; HAMi's 0 and 1)."""

    high = "high"
    low = "low"


class PriorityPair(str):
    """Two priorities, one per group of a pair ("high,low"; HAMi's 0 and 1 too), checked by the library's own
    check; the text as given, and ``priorities`` its Priority members."""

    priorities: tuple[Priority, Priority]

    def __new__(cls, text: str) -> PriorityPair:
        from pyvgpu.group import limits

        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 2:
            raise PyvgpuError(f"--priorities {text!r}: give two, one per group of the pair, e.g. high,low")
        got = super().__new__(cls, text)
        got.priorities = tuple(Priority(limits.PRIORITIES[limits.parse_priority(p, "--priorities")]) for p in parts)
        return got


def priority_pair(text: str | PriorityPair) -> PriorityPair:
    return text if isinstance(text, PriorityPair) else PriorityPair(text)


class Allocator(Choice):
    """PyTorch's allocator in the wrapped program (pyvgpu.vpmm.torch_startup.ALLOCATORS)."""

    default = "default"
    vpmm = "vpmm"
