#!/bin/bash
# Everything the GPU machine is needed for, in one command (device time is scarce):
# install, GPU tests, benchmarks. Results land in $OUT.
set -u
OUT=${OUT:-/tmp/pyvgpu-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
$PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
$PY scripts/build_native.py   # also in place: commands run from the repo root import ./pyvgpu
gcc -O2 -o /tmp/probe_pa scripts/probe/procaddr_probe.c -ldl && /tmp/probe_pa < scripts/probe/names.txt > "$OUT/procaddr.tsv"
echo "probe: $(wc -l < "$OUT/procaddr.tsv") lines"
$PY -m pyvgpu --version
$PY -m pyvgpu doctor
/usr/bin/time -f "warmup (cold compile) %e s" $PY -m pyvgpu warmup
$PY -m pytest -p no:cacheprovider -m gpu tests/gpu -v -s ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " | head -80
[ -n "${SKIP_BENCH:-}" ] && exit 0
$PY -m pyvgpu bench overhead --output "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.txt"
$PY -m pyvgpu bench overhead --memory 70G --rounds 3 --output "$OUT/overhead-capped.json" 2>&1 | tee "$OUT/overhead-capped.txt"
$PY -m pyvgpu bench startup --runs 5 --output "$OUT/startup.json" 2>&1 | tee "$OUT/startup.txt"
