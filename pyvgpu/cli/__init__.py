"""The `pyvgpu` command line in typer's style, one module per command group.

- ``root``: the root application ``app``, its sub-apps registered, and :func:`main`;
- ``wrap``: `pyvgpu wrap` (a plain wrap is parsed without typer: pyvgpu/entry.py, pyvgpu/fastwrap.py);
- ``monitor``: `status`, `top`, `exporter`; ``limits``: `limits set`; ``groups``: `group ls|rm`;
- ``machine``: `doctor`, `devices`, `warmup` (the callback cache), `setup` (the turn file);
- ``bench``: the `bench` sub-app; `cluster` is pyvgpu/cluster/cli.py's sub-app;
- ``common``: the one-line error, JSON output, shared options, choices as Enums.

May import typer and any pyvgpu module (inside its commands); nothing in pyvgpu imports this package except
pyvgpu/entry.py, for everything but a plain wrap, and pyvgpu/cluster/cli.py, for ``common``. ``app`` and
``main`` are imported when first asked for, so that importing ``common`` alone builds no application.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pyvgpu.cli import root

        return getattr(root, name)
    raise AttributeError(f"module 'pyvgpu.cli' has no attribute {name!r}")
