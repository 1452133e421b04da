"""Build the native parts of pyvgpu with gcc (no CUDA toolkit needed).

    python scripts/build_native.py [OUT_PACKAGE_DIR]

Writes into OUT (default ./pyvgpu, for working in the source tree; setup.py
calls build() with the wheel's package dir), after regenerating shim/generated/
(scripts/gen_shim.py) if the hook table or the layouts changed since:

* libpyvgpu.so, the LD_PRELOAD shim;
* libpyvgpu_group.so, the group core alone (GROUP_SOURCES, which the shim is built from too), that Python
  loads through ctypes (pyvgpu/native/grouplib.py) with none of the shim's interposition;
* libpyvgpu_callbacks.so (+ .so.sha256, its hash; + .json, its build facts), the callbacks compiled
  by numba for the baseline CPU of this architecture (pyvgpu/native/cblib.py), which
  the shim loads with no interpreter;
* bin/pv_bench, the benchmark and startup probe.

Nothing of this machine goes into them: sources are compiled by relative
name with debug paths mapped to ".", and no interpreter path is recorded.

A compile of the callbacks takes minutes on a small machine. When the user's
cache (pyvgpu.native.cache.cache_dir()/build) holds a library compiled from the same
sources by the same numba and llvmlite, it is copied instead; PYVGPU_BUILD_CACHE=0
turns that off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHIM_SOURCES = sorted((ROOT / "shim" / "src").glob("*.c")) + [ROOT / "shim" / "generated" / "pv_hooks.c"]
GROUP_SOURCES = [ROOT / "shim" / "src" / f for f in ("pv_grammar.c", "pv_env.c", "pv_group_files.c",
                                                   "pv_group_region.c", "pv_group_checks.c", "pv_group_turns.c",
                                                   "pv_group_api.c")]
BENCH_SOURCE = ROOT / "pyvgpu" / "bench" / "pv_bench.c"


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def build_shim(out: Path, cc: str) -> list[Path]:
    (out / "bin").mkdir(parents=True, exist_ok=True)
    shim = out / "libpyvgpu.so"
    # relative source names and the prefix map keep the build directory out of __FILE__ and debug info
    common = ["-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11", f"-ffile-prefix-map={ROOT}=."]
    cmd = [cc, *common, "-fPIC", "-fexceptions", "-shared", "-fvisibility=hidden",
           "-Wl,-Bsymbolic-functions", "-Wl,-z,noexecstack", "-o", str(shim), *map(_rel, SHIM_SOURCES), "-ldl",
           "-lpthread"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    group = out / "libpyvgpu_group.so"
    subprocess.run([cc, *common, "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-z,noexecstack", "-o", str(group),
                    *map(_rel, GROUP_SOURCES)], check=True, cwd=ROOT)
    bench = out / "bin" / "pv_bench"
    subprocess.run([cc, *common, "-o", str(bench), _rel(BENCH_SOURCE), "-ldl", "-lpthread"], check=True, cwd=ROOT)
    return [shim, group, bench]


def _build_cache_path(key: str) -> Path | None:
    if os.environ.get("PYVGPU_BUILD_CACHE", "1") == "0":
        return None
    import llvmlite
    import numba

    from pyvgpu.native import cache

    versions = f"numba{numba.__version__}-llvmlite{llvmlite.__version__}"
    return cache.cache_dir() / "build" / f"callbacks-{key}-portable-{versions}.so"


def build_callbacks(out: Path) -> Path:
    """The callbacks for this architecture's baseline CPU, as out/libpyvgpu_callbacks.so."""
    from pyvgpu.errors import PyvgpuError
    from pyvgpu.native import cache, cblib

    lib = out / cblib.FILE_NAME
    key = cache.cache_key()
    saved = _build_cache_path(key)
    if saved is not None and saved.exists() and cblib.info_path(saved).exists():
        try:
            got = cblib.load(saved)
            if got.key == key and not got.tuned:
                for src, dst, mode in ((saved, lib, 0o755), (cblib.info_path(saved), cblib.info_path(lib), 0o644),
                                       (cblib.hash_path(saved), cblib.hash_path(lib), 0o644)):
                    shutil.copyfile(src, dst)
                    os.chmod(dst, mode)
                print(f"build_native: callbacks {key} from the build cache {saved}", file=sys.stderr)
                return lib
        except PyvgpuError as e:
            print(f"build_native: not using {saved}: {e}", file=sys.stderr)
    workers = cache.cli_workers()
    print(f"build_native: compiling the callbacks {key} for any {os.uname().machine} CPU "
          f"({workers} processes; minutes on a small machine)", file=sys.stderr, flush=True)

    def progress(done: int, total: int) -> None:
        print(f"build_native: {done}/{total} callbacks compiled", file=sys.stderr, flush=True)

    facts = cblib.build(lib, key=key, tuned=False, workers=workers, progress=progress)
    print(f"build_native: callbacks compiled in {facts['build_seconds']:.1f} s", file=sys.stderr)
    if saved is not None:
        try:  # best effort: a later build of the same sources copies it
            saved.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            for src, dst, mode in ((cblib.info_path(lib), cblib.info_path(saved), 0o600),
                                   (cblib.hash_path(lib), cblib.hash_path(saved), 0o600), (lib, saved, 0o700)):
                part = dst.with_name(f".{dst.name}.{os.getpid()}")
                shutil.copyfile(src, part)
                os.chmod(part, mode)
                os.replace(part, dst)
        except OSError as e:
            print(f"build_native: cannot keep the callbacks in {saved.parent} ({e.strerror})", file=sys.stderr)
    return lib


def generate() -> None:
    """The generated C (shim/generated/) from the hook table and the layouts, first: the code generator and the
    build are one step, so a table edited without regenerating never builds a shim that disagrees with it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_shim
    finally:
        sys.path.pop(0)
    if gen_shim.main(["--check"]) != 0:
        print("build_native: regenerating shim/generated/ from pyvgpu/contract/hooks.py and pyvgpu/contract/layout.py",
              file=sys.stderr)
        gen_shim.main([])


def build(out: Path) -> list[Path]:
    from pyvgpu.native import cblib

    out = Path(out)
    generate()
    cc = cblib.compiler()
    return [*build_shim(out, cc), build_callbacks(out)]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "pyvgpu"
    for p in build(target):
        print(f"built {p}")
