"""Build the native parts of pyvgpu with gcc (no CUDA toolkit needed).

    python scripts/build_native.py [OUT_PACKAGE_DIR]

Writes OUT/libpyvgpu.so (the LD_PRELOAD shim) and OUT/bin/pv_bench (the
benchmark and startup probe). OUT defaults to ./pyvgpu, for working in
the source tree; setup.py calls build() with the wheel's package dir.

The shim records the Python it was built with (libpython, sys.base_prefix,
sys.executable) so that a non-Python program can embed that interpreter
when it runs under LD_PRELOAD without `pyvgpu wrap`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pyvgpu.pyinfo import libpython  # noqa: E402

SHIM_SOURCES = sorted((ROOT / "shim" / "src").glob("*.c")) + [ROOT / "shim" / "generated" / "pv_hooks.c"]
BENCH_SOURCE = ROOT / "pyvgpu" / "bench" / "pv_bench.c"


def _c_string(value: str, what: str) -> str:
    if any(c in value for c in '"\\\n'):
        raise SystemExit(f"build_native: {what} {value!r} contains a quote, backslash or newline; "
                         "install pyvgpu from a path without them")
    return f'"{value}"'


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SystemExit("build_native: no C compiler found; install gcc (the shim is C) and retry")
    return cc


def build(out: Path) -> list[Path]:
    out = Path(out)
    (out / "bin").mkdir(parents=True, exist_ok=True)
    cc = _cc()
    shim = out / "libpyvgpu.so"
    defines = [
        f"-DPV_BUILD_LIBPYTHON={_c_string(libpython(), 'libpython path')}",
        f"-DPV_BUILD_PYTHON_HOME={_c_string(sys.base_prefix, 'sys.base_prefix')}",
        f"-DPV_BUILD_PYTHON={_c_string(sys.executable, 'sys.executable')}",
    ]
    common = ["-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"]
    cmd = [cc, *common, "-fPIC", "-fexceptions", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic-functions",
           *defines, "-o", str(shim), *map(str, SHIM_SOURCES), "-ldl", "-lpthread"]
    subprocess.run(cmd, check=True)
    bench = out / "bin" / "pv_bench"
    subprocess.run([cc, *common, "-o", str(bench), str(BENCH_SOURCE), "-ldl", "-lpthread"], check=True)
    return [shim, bench]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "pyvgpu"
    for p in build(target):
        print(f"built {p}")
