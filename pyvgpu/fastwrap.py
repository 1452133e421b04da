"""`pyvgpu wrap` without typer: its parser, and the wrap both command lines run.

`pyvgpu wrap` is on the path of every wrapped program's start, and many
start at once (job arrays, `xargs -P`, launchers). Importing typer (and the
pydantic and rich it pulls in) costs several times what the wrap itself
does, so a plain wrap is parsed here, by hand, and never imports them. What it does import stays small
for the same reason: its records are made without dataclasses (pyvgpu/contract/record.py), the layouts
the hook table sizes are made at first use (pyvgpu/contract/layout.py), and the callback library is
chosen without loading one or hashing at every wrap (pyvgpu/native/choice.py), and its paths are text
(os.path: pathlib with what it imports, re among them, would cost a wrap more than its own work).
tests/test_fastwrap.py and tests/test_wrap_start.py check what a plain wrap imports; `pyvgpu bench startup
--concurrent N` measures it.

The hand parser reads only what it is sure of: wrap's own options, in the
forms click accepts (`--memory 4G`, `--memory=4G`, `-m 4G`, `-m4G`, a
repeated option's last value), then PROGRAM and its arguments untouched.
Anything else (`--help`, an unknown or misspelt option, a missing value, a
value that looks like an option, no PROGRAM, another command) goes to the
typer command line, which gives its usual message. Both paths then run
:func:`run` with one :class:`pyvgpu.ops.wrap.WrapRequest`, so every check and message after parsing is
the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # not `typing`'s: importing typing is a noticeable part of a plain wrap's start
if TYPE_CHECKING:
    from pyvgpu.ops.wrap import WrapRequest

# wrap's options: flag -> (parameter, value); option taking a value -> parameter (the names of
# pyvgpu.ops.wrap.WrapRequest.from_options, as in pyvgpu/cli/wrap.py)
FLAGS = {"--stats": ("stats", True), "--sm-borrow": ("sm_borrow", True), "--sm-cap": ("sm_borrow", False)}
VALUED = {"--stats-file": "stats_file", "--memory": "memory", "-m": "memory", "--sm": "sm", "--devices": "devices",
          "-d": "devices", "--allocator": "allocator", "--group": "group", "-g": "group", "--region": "region_path",
          "--on-error": "on_error", "--mode": "mode", "--priority": "priority"}
ON_ERROR = ("closed", "open")  # typer's choice, case-insensitive (pyvgpu.cli.common.OnError)
DEFAULTS = {"stats": False, "sm_borrow": None, **dict.fromkeys(VALUED.values())}


def parse(args: Sequence[str]) -> tuple[dict, list[str]] | None:
    """wrap's options and the command, from the arguments after `wrap`; None: leave it to typer."""
    opts = dict(DEFAULTS)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg[:1] != "-" or arg == "-":  # PROGRAM: options stop here, as with `docker run`
            break
        if arg in FLAGS:
            name, flag = FLAGS[arg]
            opts[name] = flag
            i += 1
            continue
        if arg.startswith("--"):
            opt, eq, value = arg.partition("=")
            attached = bool(eq)
        else:
            opt, value = arg[:2], arg[2:]
            attached = bool(value)
        if opt not in VALUED:
            return None
        if not attached:
            if i + 1 >= len(args) or args[i + 1][:1] == "-":
                return None
            value = args[i + 1]
            i += 1
        i += 1
        if opt == "--on-error":
            if value.lower() not in ON_ERROR:
                return None
            value = value.lower()
        opts[VALUED[opt]] = value
    command = list(args[i:])
    return (opts, command) if command else None


def fail(msg: str, code: int = 2) -> int:
    print(f"pyvgpu: {msg}", file=sys.stderr)
    return code


def wrap(opts: dict, command: list[str]) -> int:
    """A wrap parsed here: its request made from ``opts`` (as :func:`parse` gives them), then :func:`run`."""
    from pyvgpu.errors import PyvgpuError
    from pyvgpu.ops.wrap import WrapRequest

    try:
        request = WrapRequest.from_options(**opts)
    except PyvgpuError as e:
        return fail(str(e))
    return run(command, request)


def run(command: list[str], request: WrapRequest) -> int:
    """Prepare the vGPU ``request`` asks for and exec ``command`` in it; returns an exit code only when it
    could not."""
    import os

    from pyvgpu.errors import PyvgpuError
    from pyvgpu.ops import wrap as w

    try:
        env = w.build_env(os.environ, request)
    except PyvgpuError as e:
        return fail(str(e))
    except OSError as e:  # preparing the vGPU, not running the program: say which file
        return fail(f"cannot prepare the vGPU: {e.filename or ''}: {e.strerror}".replace(": :", ":"))
    try:
        w.exec_wrapped(command, env)
    except PyvgpuError as e:
        return fail(str(e), 127 if str(e).startswith("program not found") else 2)
    except OSError as e:
        return fail(f"cannot run {command[0]!r}: {e.strerror}", 126)
    return 0  # not reached: exec_wrapped replaces this process
