"""Build the fake driver and the test hosts with gcc.

    python tests/fakecuda/build.py OUT_DIR

OUT_DIR gets libcuda.so.1, libnvidia-ml.so.1 (and .so links, for -l),
host_linked, host_devices, host_procaddr and the RTLD_NEXT probe.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
FACTS = ROOT / "docs" / "facts" / "procaddr-h100-driver580.tsv"


def _cc(*args: str) -> None:
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-std=gnu11", *args], check=True)


def build(out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(HERE / "gen_procaddr_table.py"), str(FACTS),
                    str(out / "procaddr_table.h")], check=True)
    # -Bsymbolic: the fake's references to its own functions bind to itself, as the real driver's do.
    so = ["-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-Bsymbolic"]
    _cc(*so, f"-I{out}", "-Wl,-soname,libcuda.so.1", "-o", str(out / "libcuda.so.1"),
        str(HERE / "fakecuda.c"), "-lpthread")
    _cc(*so, "-Wl,-soname,libnvidia-ml.so.1", "-o", str(out / "libnvidia-ml.so.1"), str(HERE / "fakenvml.c"), "-ldl")
    for name in ("libcuda", "libnvidia-ml"):
        link = out / f"{name}.so"
        if not link.exists():
            os.symlink(f"{name}.so.1", link)
    hosts = TESTS / "hosts"
    _cc(f"-I{hosts}", "-o", str(out / "host_linked"), str(hosts / "host_linked.c"), f"-L{out}", "-lcuda",
        "-lnvidia-ml")
    _cc(f"-I{hosts}", "-o", str(out / "host_devices"), str(hosts / "host_devices.c"), f"-L{out}", "-lcuda",
        "-lnvidia-ml")
    _cc(f"-I{hosts}", "-o", str(out / "host_procaddr"), str(hosts / "host_procaddr.c"), "-ldl")
    _cc(f"-I{hosts}", "-DLINKED", "-o", str(out / "host_mem_linked"), str(hosts / "host_mem.c"), f"-L{out}",
        "-lcuda", "-lpthread")
    _cc(f"-I{hosts}", "-o", str(out / "host_mem_procaddr"), str(hosts / "host_mem.c"), "-ldl", "-lpthread")
    _cc("-shared", "-fPIC", "-o", str(out / "libexit_free.so"), str(hosts / "exit_free.c"), "-ldl")
    _cc("-shared", "-fPIC", "-o", str(out / "libclock_count.so"), str(hosts / "clock_count.c"), "-ldl")
    _cc("-shared", "-fPIC", "-o", str(out / "librtld_next_a.so"), str(hosts / "rtld_next_a.c"), "-ldl")
    _cc("-shared", "-fPIC", "-o", str(out / "librtld_next_b.so"), str(hosts / "rtld_next_b.c"))
    _cc("-o", str(out / "rtld_next"), str(hosts / "rtld_next_main.c"), f"-L{out}", "-Wl,--no-as-needed",
        "-lrtld_next_a", "-lrtld_next_b", f"-Wl,-rpath,{out}")
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
