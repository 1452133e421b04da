#!/bin/bash
# Session 4: groups take turns on the GPU (pyvgpu/jit/turn.py). Part 1: the compute GPU tests and
# `bench sm` spin (singles + the 30/70 pair), the pair time-slicing (PYVGPU_SM_TURN=0) for comparison,
# graph replay. Part 2: matmul and the launch overheads. Everything lands in $OUT/turns-N.tgz.
set -u
PART=${1:-1}
R=$PWD
W=$(mktemp -d)
source scripts/gpu_setup.sh >"$W/setup.log" 2>&1; tail -2 "$W/setup.log"
nvidia-smi -L > "$W/machine.txt"
PNG=1; python3 -c "import matplotlib" 2>/dev/null || PNG=0
png() { if [ $PNG = 1 ]; then echo "$W/$1"; else echo ""; fi; }
pack() { tar czf "$OUT/turns-$PART.tgz" -C "$W" .; }
cd "$W"  # the installed pyvgpu, not the tree's
if [ "$PART" = 1 ]; then
  (cd "$R/tests" && timeout 200 python3 -m pytest -p no:cacheprovider -m gpu gpu/test_gpu_compute.py -v -s > "$W/gpu-tests.log" 2>&1)
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$W/gpu-tests.log" | tail -5; pack
  python3 -m pyvgpu bench sm --workload spin --png "$(png sm-spin.png)" --output "$W/sm-spin.json" 2>&1 | tail -10; pack
  PYVGPU_SM_TURN=0 python3 -m pyvgpu bench sm --workload spin --targets "" --png "" --output "$W/sm-spin-pair-timesliced.json" 2>&1 | tail -5; pack
  python3 -m pyvgpu bench sm --workload graph --targets 30,70 --png "$(png sm-graph.png)" --output "$W/sm-graph.json" 2>&1 | tail -8; pack
else
  python3 -m pyvgpu bench sm --workload matmul --png "$(png sm-matmul.png)" --output "$W/sm-matmul.json" 2>&1 | tail -10; pack
  python3 -m pyvgpu bench overhead --rounds 5 --output "$W/overhead.json" 2>&1 | tail -3; pack
  python3 -m pyvgpu bench overhead --rounds 5 --sm 99 --output "$W/overhead-sm99.json" 2>&1 | tail -3; pack
fi
