#!/bin/bash
# Facts about the GPU machine that the hook table and fake driver rely on.
set -x
OUT=${OUT:-/tmp/probe}; mkdir -p $OUT
nvidia-smi; nvidia-smi -L
python3 -c "import sys,sysconfig;print(sys.version, sys.executable, sys.prefix, sys.base_prefix);print(sysconfig.get_config_var('LIBDIR'),sysconfig.get_config_var('LDLIBRARY'),sysconfig.get_config_var('Py_ENABLE_SHARED'))"
python3 -m pip list 2>/dev/null | grep -i -E "^(numba|llvmlite|typer|rich|torch|jax|jaxlib|cupy|triton|numpy|pytest|prometheus|hypothesis) "
for i in 1 2 3; do /usr/bin/time -f "import numba %e s" python3 -c "import numba"; done
for i in 1 2 3; do /usr/bin/time -f "import llvmlite.binding %e s" python3 -c "import llvmlite.binding"; done
for i in 1 2 3; do /usr/bin/time -f "python3 -c pass %e s" python3 -c "pass"; done
for i in 1 2 3; do /usr/bin/time -f "import typer %e s" python3 -c "import typer"; done
gcc --version | head -1; ldconfig -p | grep -E "libcuda.so|libnvidia-ml|libpython"
gcc -O2 -o /tmp/probe_pa scripts/probe/procaddr_probe.c -ldl && /tmp/probe_pa < scripts/probe/names.txt > $OUT/procaddr.tsv; echo rc=$?
head -3 $OUT/procaddr.tsv; wc -l $OUT/procaddr.tsv
lscpu | head -20
