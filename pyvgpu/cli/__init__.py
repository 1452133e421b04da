"""The `pyvgpu` command line in typer's style, one module per command group.

- ``app``: the root application and :func:`main` (the sub-apps registered there);
- ``wrap``: `pyvgpu wrap` (a plain wrap is parsed without typer: pyvgpu/entry.py, pyvgpu/fastwrap.py);
- ``monitor``: `status`, `top`, `exporter`; ``limits``: `limits set`; ``groups``: `group ls|rm`;
- ``machine``: `doctor`, `devices`, `warmup` (the callback cache), `setup` (the turn file);
- ``bench``: the `bench` sub-app; `cluster` is pyvgpu/cluster/cli.py's sub-app;
- ``common``: the one-line error, JSON output, shared options, choices as Enums.

May import typer and any pyvgpu module (inside its commands); nothing in pyvgpu imports this package except
pyvgpu/entry.py, for everything but a plain wrap.
"""

from pyvgpu.cli.app import app, main

__all__ = ["app", "main"]
