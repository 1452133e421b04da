#!/bin/bash
# Issue 4 on the GPU machine, in one command: install, GPU tests, `bench sm` for
# each load, launch overhead with and without a share. Results land in $OUT.
set -u
OUT=${OUT:-/tmp/pyvgpu-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
PART=${1:-all}
if true; then  # always: a warm machine keeps stale build outputs
  $PY -m pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v -i warning | tail -3
  $PY scripts/build_native.py
  /usr/bin/time -f "warmup (cold compile) %e s" $PY -m pyvgpu warmup
fi
PNG=1; $PY -c "import matplotlib" 2>/dev/null || PNG=0
echo "matplotlib: $PNG"
png() { if [ $PNG = 1 ]; then echo "$OUT/$1"; else echo ""; fi; }
if [ "$PART" = "all" ] || [ "$PART" = "1" ]; then
  $PY -m pytest -p no:cacheprovider -m gpu tests/gpu -v -s ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " | head -40
  $PY -m pyvgpu bench sm --workload spin --png "$(png sm-spin.png)" --output "$OUT/sm-spin.json" 2>&1 | tail -12
  $PY -m pyvgpu bench sm --workload graph --targets 30,70 --pair "" --png "$(png sm-graph.png)" --output "$OUT/sm-graph.json" 2>&1 | tail -8
fi
if [ "$PART" = "all" ] || [ "$PART" = "2" ]; then
  $PY -m pyvgpu bench sm --workload spin --targets 30 --png "$(png sm-spin-pair.png)" --output "$OUT/sm-spin-pair.json" 2>&1 | tail -8
  $PY -m pyvgpu bench sm --workload matmul --png "$(png sm-matmul.png)" --output "$OUT/sm-matmul.json" 2>&1 | tail -12
  $PY -m pyvgpu bench overhead --rounds 3 --output "$OUT/overhead.json" 2>&1 | tail -5
  $PY -m pyvgpu bench overhead --rounds 3 --sm 90 --output "$OUT/overhead-sm.json" 2>&1 | tail -5
fi
