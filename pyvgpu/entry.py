"""The `pyvgpu` console entry: a plain `pyvgpu wrap` is parsed without typer (pyvgpu/fastwrap.py), everything
else goes to the typer command line (pyvgpu/cli/), imported only then."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pyvgpu import fastwrap


def main(argv: Sequence[str] | None = None) -> None:
    """`pyvgpu`: a plain wrap here, everything else through the typer command line (pyvgpu/cli/)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = fastwrap.parse(args[1:]) if args[:1] == ["wrap"] else None
        if parsed is not None:
            sys.exit(fastwrap.wrap(*parsed))
        from pyvgpu.cli import main as typer_main

        typer_main()
    except KeyboardInterrupt:  # Ctrl-C before the program started (or in a command): no traceback
        print("pyvgpu: interrupted", file=sys.stderr)
        sys.exit(130)
